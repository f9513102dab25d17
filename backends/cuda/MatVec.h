//===- MatVec.h - Quantised mat-vec on the GPU ------------------*- C++ -*-===//
//
// GGUF blocks (34 bytes for Q8_0, 144 for Q4_K) do not allow wide aligned
// loads. At load a matrix is repacked into a device layout: the quants of
// each row contiguous and 16-byte aligned, the per-block scales in a second
// array. The mat-vec then reads every quant byte once, 16 bytes per lane per
// load, and dequantises in registers. A plain dequantise kernel reproduces
// the GGUF values bit for bit from the repacked layout, so the layout is
// checked against the file's own format, not against the mat-vec.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_BACKENDS_CUDA_MATVEC_H
#define KILN_BACKENDS_CUDA_MATVEC_H

#include "quant/QuantTypes.h"
#include "support/Error.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <vector>

namespace kiln::cuda {

/// A [rows x cols] matrix (cols = ne[0], the quantised dim) in the device
/// layout, on the host.
///   Q8_0: quants int8 [rows][cols];   scales f16 [rows][cols / 32]
///   Q4_K: quants u8 [rows][cols / 2] (the GGUF nibble order kept);
///         scales 16 bytes per block [rows][cols / 256]: d, dmin (f16),
///         then the 12 packed 6-bit scale/min bytes.
struct PackedMatrix {
  GGMLType type = GGMLType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> quants;
  std::vector<uint8_t> scales;
};

/// Whether packMatrix and the kernels support `type` (Q8_0 and Q4_K so far).
bool canPack(GGMLType type);

/// Repacks `gguf` (rows x rowBytes(type, cols) bytes, the file's blocks).
Expected<PackedMatrix> packMatrix(GGMLType type, int64_t rows, int64_t cols,
                                  std::span<const uint8_t> gguf);

/// The same matrix in device memory.
struct DeviceMatrix {
  GGMLType type = GGMLType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  const uint8_t *quants = nullptr;
  const uint8_t *scales = nullptr;
};

/// y[rows] = W x, x[cols] in device memory (16-byte aligned).
cudaError_t launchMatVec(const DeviceMatrix &w, const float *x, float *y,
                         cudaStream_t stream);

/// The same with `rowsPerWarp` rows per warp (1, 2, 4 or 8), for
/// measuring the choice; launchMatVec picks 2, or 4 from 32768 rows.
cudaError_t launchMatVecRows(const DeviceMatrix &w, const float *x, float *y,
                             int rowsPerWarp, cudaStream_t stream);

/// out[rows][cols] = the matrix's values, computed exactly as ggml and
/// gguf-py do (no fused multiply-add), for bit-exact checks.
cudaError_t launchDequant(const DeviceMatrix &w, float *out,
                          cudaStream_t stream);

/// A matrix left in the file's block layout (any type canRunGeneric
/// accepts: all 15 that Kiln dequantises), in device memory.
struct GenericMatrix {
  GGMLType type = GGMLType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  const uint8_t *data = nullptr; ///< rows x rowBytes(type, cols) bytes
};

bool canRunGeneric(GGMLType type);

/// y = W x, decoding each value where it is used (GenericMatVec.cu).
cudaError_t launchMatVecGeneric(const GenericMatrix &w, const float *x,
                                float *y, cudaStream_t stream);

/// out = every value of W, bit for bit as kiln::dequantize.
cudaError_t launchDequantGeneric(const GenericMatrix &w, float *out,
                                 cudaStream_t stream);

} // namespace kiln::cuda

#endif // KILN_BACKENDS_CUDA_MATVEC_H
