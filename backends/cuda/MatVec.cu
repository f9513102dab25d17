//===- MatVec.cu - Quantised mat-vec on the GPU ----------------------------===//
#include "GenericQuant.cuh"
#include "MatVec.h"
#include "Warp.cuh"

#include <cuda_fp16.h>

#include <cstring>

namespace kiln::cuda {

namespace {

/// Warps per CTA, and rows per warp: a warp computes kRowsPerWarp rows at
/// once, so each input value it loads serves that many rows.
constexpr int kWarpsPerBlock = 4;
/// Rows per warp trade input reuse against parallelism: measured on an H200
/// (docs/perf.md), 2 was best or near it up to 16384 rows and 4 for the
/// 65536-row matrix, where there are warps to spare.
constexpr int64_t kManyRows = 32768;
/// Values each lane takes per load: 16 bytes of Q8_0 quants, or 16 bytes
/// (32 values) of Q4_K quants.
constexpr int kQ8ValuesPerLoad = 16;
constexpr int kQ4BytesPerLoad = 16;
constexpr int kQ4BlockValues = 256;
constexpr int kQ4BlockQuantBytes = 128;
constexpr int kQ4BlockScaleBytes = 16;

// Q8_0 mat-vec. Grid: ceil(rows / 16) CTAs of 4 warps; warp w of CTA b
// computes rows 16b + 4w .. 16b + 4w + 3. Each lane loads 16 quant bytes
// (one int4) of each of its warp's rows per step, stepping by 32 lanes: a
// warp reads 512 contiguous bytes of every row per step, every byte once,
// coalesced; the 16 input values of a step (64 bytes, read-only cache) are
// loaded once and used for all 4 rows.
template <int kRowsPerWarp>
__global__ void matVecQ8_0(const int8_t *__restrict__ quants,
                           const __half *__restrict__ scales,
                           const float *__restrict__ x,
                           float *__restrict__ y, int64_t rows,
                           int64_t cols) {
  int64_t row0 = (int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp) *
                 kRowsPerWarp;
  int lane = threadIdx.x % kWarp;
  if (row0 >= rows)
    return;
  int nrows = rows - row0 < kRowsPerWarp ? int(rows - row0) : kRowsPerWarp;
  const float4 *xv = reinterpret_cast<const float4 *>(x);
  float acc[kRowsPerWarp] = {};
  for (int64_t c = lane; c < cols / kQ8ValuesPerLoad; c += kWarp) {
    float4 xx[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      xx[i] = __ldg(xv + c * 4 + i);
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      if (r >= nrows)
        break;
      int64_t row = row0 + r;
      int4 packed =
          __ldg(reinterpret_cast<const int4 *>(quants + row * cols) + c);
      const int8_t *b = reinterpret_cast<const int8_t *>(&packed);
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < 4; ++i)
        s += b[4 * i] * xx[i].x + b[4 * i + 1] * xx[i].y +
             b[4 * i + 2] * xx[i].z + b[4 * i + 3] * xx[i].w;
      acc[r] += __half2float(scales[row * (cols / 32) + c / 2]) * s;
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    float v = warpSum(acc[r]);
    if (lane == 0 && r < nrows)
      y[row0 + r] = v;
  }
}

// Q4_K mat-vec. Same geometry. A lane's 16 quant bytes are half of one
// 32-byte chunk c of a block: their low nibbles are 16 values of sub-block
// 2c, their high nibbles 16 values of sub-block 2c + 1 (ggml's order), so a
// lane needs two scale/min pairs per row, decoded from the block's 16 scale
// bytes (shared by the 8 lanes of the block through the cache). The 32
// input values of a step are loaded once for the warp's 4 rows, with their
// two sums (for the min terms).
template <int kRowsPerWarp>
__global__ void matVecQ4_K(const uint8_t *__restrict__ quants,
                           const uint8_t *__restrict__ scales,
                           const float *__restrict__ x,
                           float *__restrict__ y, int64_t rows,
                           int64_t cols) {
  int64_t row0 = (int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp) *
                 kRowsPerWarp;
  int lane = threadIdx.x % kWarp;
  if (row0 >= rows)
    return;
  int nrows = rows - row0 < kRowsPerWarp ? int(rows - row0) : kRowsPerWarp;
  int64_t blocksPerRow = cols / kQ4BlockValues;
  float acc[kRowsPerWarp] = {};
  int64_t loads = cols / 2 / kQ4BytesPerLoad;
  for (int64_t c = lane; c < loads; c += kWarp) {
    int64_t block = c / (kQ4BlockQuantBytes / kQ4BytesPerLoad);
    int offset = int(c % (kQ4BlockQuantBytes / kQ4BytesPerLoad)) *
                 kQ4BytesPerLoad; // byte within the block's quants
    int chunk = offset / 32, l0 = offset % 32;
    const float *xlo = x + block * kQ4BlockValues + 64 * chunk + l0;
    float4 lo[4], hi[4];
    float slo = 0.f, shi = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      lo[i] = __ldg(reinterpret_cast<const float4 *>(xlo) + i);
      hi[i] = __ldg(reinterpret_cast<const float4 *>(xlo + 32) + i);
      slo += lo[i].x + lo[i].y + lo[i].z + lo[i].w;
      shi += hi[i].x + hi[i].y + hi[i].z + hi[i].w;
    }
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      if (r >= nrows)
        break;
      int64_t row = row0 + r;
      int4 packed = __ldg(
          reinterpret_cast<const int4 *>(quants + row * (cols / 2)) + c);
      uint4 m = __ldg(reinterpret_cast<const uint4 *>(scales) +
                      row * blocksPerRow + block);
      __half2 dm = *reinterpret_cast<const __half2 *>(&m.x);
      const uint8_t *s = reinterpret_cast<const uint8_t *>(&m.y);
      int sc1, mn1, sc2, mn2;
      generic::scaleMinK4(s, 2 * chunk, sc1, mn1);
      generic::scaleMinK4(s, 2 * chunk + 1, sc2, mn2);
      const uint8_t *b = reinterpret_cast<const uint8_t *>(&packed);
      float qlo = 0.f, qhi = 0.f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        qlo += (b[4 * i] & 0xF) * lo[i].x + (b[4 * i + 1] & 0xF) * lo[i].y +
               (b[4 * i + 2] & 0xF) * lo[i].z + (b[4 * i + 3] & 0xF) * lo[i].w;
        qhi += (b[4 * i] >> 4) * hi[i].x + (b[4 * i + 1] >> 4) * hi[i].y +
               (b[4 * i + 2] >> 4) * hi[i].z + (b[4 * i + 3] >> 4) * hi[i].w;
      }
      float d = __low2float(dm), dmin = __high2float(dm);
      acc[r] += d * (sc1 * qlo + sc2 * qhi) - dmin * (mn1 * slo + mn2 * shi);
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    float v = warpSum(acc[r]);
    if (lane == 0 && r < nrows)
      y[row0 + r] = v;
  }
}

// Reference dequantisers over the device layout, one thread per value, with
// ggml's operation order and no contraction (__fmul_rn / __fsub_rn), so
// they match the file's values bit for bit.
__global__ void dequantQ8_0(const int8_t *quants, const __half *scales,
                            float *out, int64_t rows, int64_t cols) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols)
    return;
  int64_t row = i / cols, col = i % cols;
  out[i] = __fmul_rn(float(quants[i]),
                     __half2float(scales[row * (cols / 32) + col / 32]));
}

__global__ void dequantQ4_K(const uint8_t *quants, const uint8_t *scales,
                            float *out, int64_t rows, int64_t cols) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols)
    return;
  int64_t row = i / cols, col = i % cols;
  int64_t block = col / kQ4BlockValues;
  int v = int(col % kQ4BlockValues);
  int chunk = v / 64, within = v % 64;
  int j = 2 * chunk + (within >= 32);
  const uint8_t *m =
      scales + (row * (cols / kQ4BlockValues) + block) * kQ4BlockScaleBytes;
  float d = __half2float(*reinterpret_cast<const __half *>(m));
  float dmin = __half2float(*reinterpret_cast<const __half *>(m + 2));
  int sc, mn;
  generic::scaleMinK4(m + 4, j, sc, mn);
  uint8_t byte = quants[row * (cols / 2) + block * kQ4BlockQuantBytes +
                        chunk * 32 + within % 32];
  int q = within < 32 ? (byte & 0xF) : (byte >> 4);
  float d1 = __fmul_rn(d, float(sc)), m1 = __fmul_rn(dmin, float(mn));
  out[i] = __fsub_rn(__fmul_rn(d1, float(q)), m1);
}

} // namespace

bool canPack(GGMLType type) {
  return type == GGMLType::Q8_0 || type == GGMLType::Q4_K;
}

Expected<PackedMatrix> packMatrix(GGMLType type, int64_t rows, int64_t cols,
                                  std::span<const uint8_t> gguf) {
  if (!canPack(type))
    return Error("pack", std::string(nameOf(type)),
                 "has no GPU mat-vec layout yet");
  std::optional<uint64_t> rowBytes = kiln::rowBytes(type, uint64_t(cols));
  if (rows <= 0 || !rowBytes || gguf.size() != *rowBytes * uint64_t(rows) ||
      cols % (type == GGMLType::Q8_0 ? 32 : kQ4BlockValues) != 0)
    return Error("pack", std::string(nameOf(type)),
                 "sizes do not match the matrix");
  PackedMatrix p;
  p.type = type;
  p.rows = rows;
  p.cols = cols;
  if (type == GGMLType::Q8_0) {
    int64_t blocks = cols / 32;
    p.quants.resize(size_t(rows * cols));
    p.scales.resize(size_t(rows * blocks * 2));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t *src = gguf.data() + r * *rowBytes + b * 34;
        std::memcpy(&p.scales[size_t((r * blocks + b) * 2)], src, 2);
        std::memcpy(&p.quants[size_t(r * cols + b * 32)], src + 2, 32);
      }
    return p;
  }
  // Q4_K: d, dmin, scales[12], qs[128] per block in the file.
  int64_t blocks = cols / kQ4BlockValues;
  p.quants.resize(size_t(rows * cols / 2));
  p.scales.resize(size_t(rows * blocks * kQ4BlockScaleBytes));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t *src = gguf.data() + r * *rowBytes + b * 144;
      std::memcpy(&p.scales[size_t((r * blocks + b) * kQ4BlockScaleBytes)],
                  src, kQ4BlockScaleBytes);
      std::memcpy(&p.quants[size_t(r * cols / 2 + b * kQ4BlockQuantBytes)],
                  src + kQ4BlockScaleBytes, kQ4BlockQuantBytes);
    }
  return p;
}

template <int R>
cudaError_t launchRows(const DeviceMatrix &w, const float *x, float *y,
                       cudaStream_t stream) {
  constexpr int rowsPerBlock = kWarpsPerBlock * R;
  dim3 grid(unsigned((w.rows + rowsPerBlock - 1) / rowsPerBlock));
  dim3 block(kWarpsPerBlock * kWarp);
  if (w.type == GGMLType::Q8_0)
    matVecQ8_0<R><<<grid, block, 0, stream>>>(
        reinterpret_cast<const int8_t *>(w.quants),
        reinterpret_cast<const __half *>(w.scales), x, y, w.rows, w.cols);
  else if (w.type == GGMLType::Q4_K)
    matVecQ4_K<R><<<grid, block, 0, stream>>>(w.quants, w.scales, x, y,
                                              w.rows, w.cols);
  else
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t launchMatVecRows(const DeviceMatrix &w, const float *x, float *y,
                             int rowsPerWarp, cudaStream_t stream) {
  switch (rowsPerWarp) {
  case 1: return launchRows<1>(w, x, y, stream);
  case 2: return launchRows<2>(w, x, y, stream);
  case 4: return launchRows<4>(w, x, y, stream);
  case 8: return launchRows<8>(w, x, y, stream);
  default: return cudaErrorInvalidValue;
  }
}

cudaError_t launchMatVec(const DeviceMatrix &w, const float *x, float *y,
                         cudaStream_t stream) {
  return launchMatVecRows(w, x, y, w.rows >= kManyRows ? 4 : 2, stream);
}

cudaError_t launchDequant(const DeviceMatrix &w, float *out,
                          cudaStream_t stream) {
  int64_t n = w.rows * w.cols;
  unsigned blocks = unsigned((n + 255) / 256);
  if (w.type == GGMLType::Q8_0)
    dequantQ8_0<<<blocks, 256, 0, stream>>>(
        reinterpret_cast<const int8_t *>(w.quants),
        reinterpret_cast<const __half *>(w.scales), out, w.rows, w.cols);
  else if (w.type == GGMLType::Q4_K)
    dequantQ4_K<<<blocks, 256, 0, stream>>>(w.quants, w.scales, out, w.rows,
                                            w.cols);
  else
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}

} // namespace kiln::cuda
