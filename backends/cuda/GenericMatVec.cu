//===- GenericMatVec.cu - Mat-vec and dequantise for any GGUF type ---------===//
//
// Correctness first: the weights stay in the file's block layout, and each
// value is decoded where it is used. Slower than the specialised layouts of
// MatVec.cu (blocks of 18 to 210 bytes allow no wide aligned loads), but it
// covers every type Kiln reads, bit for bit, so every op has a GPU path
// before it has a fast one. Compiled with --fmad=false (see GenericQuant.cuh).
//
//===----------------------------------------------------------------------===//
#include "GenericQuant.cuh"
#include "MatVec.h"
#include "Warp.cuh"

namespace kiln::cuda {

namespace {

constexpr int kWarpsPerBlock = 4;

struct Geometry {
  GGMLType type;
  int64_t rows, cols;
  uint64_t rowBytes;
  int blockValues, blockBytes;
};

// One thread per value.
__global__ void dequantGeneric(Geometry g, const uint8_t *data, float *out) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= g.rows * g.cols)
    return;
  int64_t row = i / g.cols, col = i % g.cols;
  const uint8_t *block = data + row * g.rowBytes +
                         (col / g.blockValues) * g.blockBytes;
  out[i] = generic::value(g.type, block, int(col % g.blockValues));
}

// One warp per row; lane l takes values l, l + 32, ... of the row, so the
// warp's decodes of one block share its bytes through the cache.
__global__ void matVecGeneric(Geometry g, const uint8_t *data, const float *x,
                              float *y) {
  int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  int lane = threadIdx.x % kWarp;
  if (row >= g.rows)
    return;
  const uint8_t *base = data + row * g.rowBytes;
  float acc = 0.f;
  for (int64_t col = lane; col < g.cols; col += kWarp) {
    const uint8_t *block = base + (col / g.blockValues) * g.blockBytes;
    acc += generic::value(g.type, block, int(col % g.blockValues)) * x[col];
  }
  acc = warpSum(acc);
  if (lane == 0)
    y[row] = acc;
}

Geometry geometry(const GenericMatrix &w) {
  const GGMLTypeTraits &t = traitsOf(w.type);
  return {w.type, w.rows, w.cols, *rowBytes(w.type, uint64_t(w.cols)),
          int(t.blockSize), int(t.blockBytes)};
}

} // namespace

bool canRunGeneric(GGMLType type) {
  switch (type) {
  case GGMLType::F32: case GGMLType::F16: case GGMLType::BF16:
  case GGMLType::Q4_0: case GGMLType::Q4_1: case GGMLType::Q5_0:
  case GGMLType::Q5_1: case GGMLType::Q8_0: case GGMLType::Q2_K:
  case GGMLType::Q3_K: case GGMLType::Q4_K: case GGMLType::Q5_K:
  case GGMLType::Q6_K: case GGMLType::IQ4_NL: case GGMLType::IQ4_XS:
    return true;
  default:
    return false;
  }
}

cudaError_t launchMatVecGeneric(const GenericMatrix &w, const float *x,
                                float *y, cudaStream_t stream) {
  if (!canRunGeneric(w.type) || !rowBytes(w.type, uint64_t(w.cols)))
    return cudaErrorInvalidValue;
  unsigned blocks = unsigned((w.rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  matVecGeneric<<<blocks, kWarpsPerBlock * kWarp, 0, stream>>>(geometry(w),
                                                              w.data, x, y);
  return cudaGetLastError();
}

cudaError_t launchDequantGeneric(const GenericMatrix &w, float *out,
                                 cudaStream_t stream) {
  if (!canRunGeneric(w.type) || !rowBytes(w.type, uint64_t(w.cols)))
    return cudaErrorInvalidValue;
  int64_t n = w.rows * w.cols;
  dequantGeneric<<<unsigned((n + 255) / 256), 256, 0, stream>>>(geometry(w),
                                                               w.data, out);
  return cudaGetLastError();
}

} // namespace kiln::cuda
