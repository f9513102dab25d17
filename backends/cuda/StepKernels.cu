//===- StepKernels.cu - GPU kernels for every step op ---------------------===//
//
// Correctness first, in the CPU reference's arithmetic: every float sum is
// computed by a fixed tree (a lane's strided partial, then warpSum, then the
// warps' partials in warp order), never with float atomics, so results are
// the same bits on every run. Where the CPU's order can be kept cheaply it
// is (the attention's weighted sum over positions, the MoE sum over chosen
// experts, the router's weight normalisation). Weights are decoded per value
// by GenericQuant.cuh, from the file's blocks or, for a weight in a split
// layout (SplitLayout.h), from its planes with the same operations; this
// file is compiled with --fmad=false so that decoding (embed, dequant) is
// bit-exact with gguf-py and a*b + c rounds twice, as the reference does.
//
// Every launch validates its host-side geometry (returning
// cudaErrorInvalidValue), launches, and returns cudaGetLastError(): no
// allocation, no synchronisation, no host read of device memory, so all of
// them can be captured in a CUDA graph. Device-side scalars (token,
// position, count, ids, selection) are checked on the device; a bad one is
// recorded in the StepFault (first claimer wins) and the work it would have
// indexed is skipped.
//
//===----------------------------------------------------------------------===//
#include "StepKernels.h"

#include "DeviceCommon.cuh"
#include "GenericQuant.cuh"
#include "Launch.cuh"
#include "MatVec.h"
#include "ModelShapes.h"
#include "QuantDot.cuh"
#include "SplitLayout.h"
#include "Warp.cuh"
#include "support/DrawKey.h"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>

namespace kiln::cuda {

namespace {

//===----------------------------------------------------------------------===//
// Launch geometry
//===----------------------------------------------------------------------===//

/// Threads of an element-wise kernel's block, and the most blocks one is
/// given (larger sizes loop grid-stride).
constexpr int kElementThreads = 256;
constexpr int64_t kMaxElementBlocks = 1 << 20;
/// Warps per block of the one-warp-per-item kernels (indexer scores), as
/// GenericMatVec.cu.
constexpr int kWarpsPerBlock = 4;
constexpr int kWarpThreads = kWarpsPerBlock * kWarp;
/// Most blocks a grid-stride warp kernel over cache positions is given.
constexpr int64_t kMaxPositionBlocks = 4096;
/// The single block of the argmax, the router's choice and the indexer's
/// compaction.
constexpr int kSingleBlockThreads = 1024;
/// Normalisations: one row per block, a full block so one row (the decode
/// step's case) has enough loads in flight.
constexpr int kNormThreads = 1024;

constexpr unsigned kFullMask = 0xffffffffu;

/// The smallest normal fp16, the router's floor on its normaliser (as
/// CpuKernels.cpp and ggml).
constexpr float kRouterSumFloor = 6.1035e-5f;

unsigned elementBlocks(int64_t n) {
  int64_t blocks = (n + kElementThreads - 1) / kElementThreads;
  return unsigned(blocks < kMaxElementBlocks ? blocks : kMaxElementBlocks);
}

//===----------------------------------------------------------------------===//
// Device helpers
//===----------------------------------------------------------------------===//

__device__ inline float warpMax(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

/// The sum of `v` over the block, in every thread: each warp's butterfly,
/// then the warps' sums in warp order. `shared` holds kWarp floats.
/// Deterministic for a given blockDim (a multiple of kWarp).
__device__ float blockSum(float v, float *shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = warpSum(v);
  __syncthreads(); // an earlier call may still be reading `shared`
  if (lane == 0)
    shared[warp] = v;
  __syncthreads();
  // Every warp sums the partials itself, so every thread gets the total.
  v = lane < int(blockDim.x / kWarp) ? shared[lane] : 0.f;
  return warpSum(v);
}

/// The largest `v` over the block (NaNs ignored, as fmaxf and std::max with
/// a non-NaN first argument do), in every thread.
__device__ float blockMax(float v, float *shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = warpMax(v);
  __syncthreads();
  if (lane == 0)
    shared[warp] = v;
  __syncthreads();
  v = lane < int(blockDim.x / kWarp) ? shared[lane] : -INFINITY;
  return warpMax(v);
}

/// A candidate of an arg-max: the larger key wins, equal keys go to the
/// lower index. Keys are never NaN (callers map NaN first).
struct Best {
  float key;
  int32_t index;
};

__device__ inline Best better(Best a, Best b) {
  if (b.key > a.key || (b.key == a.key && b.index < a.index))
    return b;
  return a;
}

/// `better` is associative and commutative, so any reduction tree gives the
/// same winner.
__device__ Best blockBest(Best v, Best *shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    Best other{__shfl_xor_sync(kFullMask, v.key, offset),
               __shfl_xor_sync(kFullMask, v.index, offset)};
    v = better(v, other);
  }
  __syncthreads();
  if (lane == 0)
    shared[warp] = v;
  __syncthreads();
  Best result = shared[0];
  for (int w = 1; w < int(blockDim.x / kWarp); ++w)
    result = better(result, shared[w]);
  return result;
}

/// fp16 bits to float, exact: the hardware conversion for numbers, and for
/// NaN the reference's rule (payload moved to the top of the mantissa).
__device__ inline float halfBitsToFloat(uint16_t h) {
  if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu))
    return __uint_as_float(uint32_t(h & 0x8000u) << 16 | 0x7f800000u |
                           uint32_t(h & 0x3ffu) << 13);
  return __half2float(__ushort_as_half(h));
}

/// fp16 bits to float for values that only feed arithmetic (cache rows
/// into scores and sums): halfBitsToFloat's result but for a NaN's payload,
/// which no result keeps (arithmetic on a NaN gives the GPU's one NaN), at
/// a fifth of its instructions (docs/perf.md, twenty-fifth pass).
__device__ inline float halfBitsToOperand(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}

/// float to fp16 bits, round to nearest even; a NaN keeps its sign and top
/// payload bits (never becoming infinity), as FloatFormats.cpp.
__device__ inline uint16_t floatToHalfBits(float f) {
  uint32_t bits = __float_as_uint(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    uint16_t payload = uint16_t((bits & 0x7fffffu) >> 13);
    return uint16_t((bits >> 16) & 0x8000u) | 0x7c00u |
           (payload ? payload : uint16_t(1));
  }
  return __half_as_ushort(__float2half_rn(f));
}

/// float to bf16 bits, round to nearest even; a NaN is made quiet keeping
/// its top bits, as FloatFormats.cpp.
__device__ inline uint16_t floatToBf16Bits(float f) {
  uint32_t bits = __float_as_uint(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u)
    return uint16_t(((bits & 0xffff0000u) | 0x00400000u) >> 16);
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

/// Value `index` of a cache becomes v, converted (round to nearest even).
__device__ inline void storeCache(const DeviceCache &c, int64_t index,
                                  float v) {
  switch (c.type) {
  case CacheType::F32:
    static_cast<float *>(c.data)[index] = v;
    break;
  case CacheType::F16:
    static_cast<uint16_t *>(c.data)[index] = floatToHalfBits(v);
    break;
  case CacheType::BF16:
    static_cast<uint16_t *>(c.data)[index] = floatToBf16Bits(v);
    break;
  }
}

/// The values rope pair i turns: (offset + 2i, offset + 2i + 1)
/// interleaved, (offset + i, offset + i + dims / 2) NeoX.
__device__ inline void ropePair(RopeStyle style, int64_t offset, int64_t dims,
                                int64_t i, int64_t &first, int64_t &second) {
  first = style == RopeStyle::Interleaved ? offset + 2 * i : offset + i;
  second = style == RopeStyle::Interleaved ? first + 1 : first + dims / 2;
}

/// The pair (x0, x1) rotated by the angle whose cosine and sine are c and
/// s, in place: the rope kernels' and the CPU's products, in their order.
__device__ __forceinline__ void rotatePair(float &x0, float &x1, float c,
                                           float s) {
  const float a = x0, b = x1;
  x0 = a * c - b * s;
  x1 = a * s + b * c;
}

/// The larger of a and b, NaN if either is (fmaxf drops a NaN).
__device__ __forceinline__ float maxKeepingNaN(float a, float b) {
  return isnan(a) || isnan(b) ? a + b : fmaxf(a, b);
}

/// Two floats as f16x2 (round to nearest even), `lo` in the low half.
__device__ __forceinline__ uint32_t halfPair(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t *>(&h);
}

/// D = A B + D, m16n8k16, f16 A (row) and B (col), f32 sums.
__device__ __forceinline__ void mmaHalf(float (&d)[4], const uint32_t (&a)[4],
                                        uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0),
                 "r"(b1));
}

/// The exponent e that brings a head's largest |value| into [2^14, 2^15)
/// (0 for 0, Inf or NaN, whose parts then carry them; clamped so that 2^e
/// and 2^-e are normal floats).
__device__ inline int mmaQueryExponent(float largest) {
  if (!(largest > 0.f) || isinf(largest))
    return 0;
  int x;
  frexpf(largest, &x); // largest in [2^(x-1), 2^x)
  const int e = 15 - x;
  return e < -100 ? -100 : (e > 100 ? 100 : e);
}

/// 2^e for |e| <= 126, exactly.
__device__ __forceinline__ float powerOfTwo(int e) {
  return __int_as_float((127 + e) << 23);
}

__device__ __forceinline__ uint32_t sharedAddress(const void *p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

/// Four 8x8 f16 matrices from shared memory as mma fragments (lanes 8 i ..
/// 8 i + 7 give matrix i's row addresses); `kTransposed` delivers each
/// transposed.
template <bool kTransposed>
__device__ __forceinline__ void loadMatrices(uint32_t (&r)[4], const void *p) {
  const uint32_t at = sharedAddress(p);
  if constexpr (kTransposed)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 "
                 "{%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at)
                 : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 "
                 "{%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at)
                 : "memory");
}

/// f16 bits of f (round to nearest even) and of what that leaves of f
/// (exact: hi is f rounded to 11 bits; an infinite hi carries f alone).
__device__ __forceinline__ void splitHalves(float f, uint16_t &hi,
                                            uint16_t &lo) {
  const __half h = __float2half_rn(f);
  const float hf = __half2float(h);
  hi = __half_as_ushort(h);
  lo = __half_as_ushort(__float2half_rn(isinf(hf) ? 0.f : f - hf));
}

__device__ inline float readCache(const void *data, CacheType type,
                                  int64_t index) {
  switch (type) {
  case CacheType::F32:
    return static_cast<const float *>(data)[index];
  case CacheType::F16:
    return halfBitsToFloat(static_cast<const uint16_t *>(data)[index]);
  case CacheType::BF16:
    return __uint_as_float(uint32_t(static_cast<const uint16_t *>(data)[index])
                           << 16);
  }
  return 0.f;
}

/// Where a weight's values live: `rows` rows of `cols` values, rowBytes
/// each, in blocks of blockValues values / blockBytes bytes.
struct Geometry {
  GGMLType type;
  int64_t rows;
  int32_t cols;
  uint64_t rowBytes;
  int32_t blockValues, blockBytes;
};

__device__ inline float weightValue(const Geometry &g, const uint8_t *data,
                                    int64_t row, int32_t col) {
  const uint8_t *block = data + uint64_t(row) * g.rowBytes +
                         uint64_t(col / g.blockValues) * g.blockBytes;
  return generic::value(g.type, block, col % g.blockValues);
}

/// splitmix64's finaliser: a counter-based hash, so value i of a filler
/// depends on (seed, i) only.
__device__ inline uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__device__ inline uint64_t randomAt(uint64_t seed, uint64_t index) {
  return mix64(mix64(seed) + index);
}

/// A float in [-1, 1) from 24 random bits (exact in f32).
__device__ inline float unitFloat(uint64_t r) {
  return float(r >> 40) * 0x1.0p-23f - 1.f;
}

//===----------------------------------------------------------------------===//
// Element-wise kernels: one thread per value, grid-stride.
//===----------------------------------------------------------------------===//

__global__ void addKernel(const float *a, const float *b, int64_t n, float *y) {
  stepKernelPrologue();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = a[i] + b[i];
}

/// y[i] = x[i mod n] for i < count: a simulated rank's collective traffic.
__global__ void ringTrafficKernel(const float *x, int64_t n, int64_t count,
                                  float *y) {
  stepKernelPrologue();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = x[i < n ? i : i % n];
}

__global__ void swigluKernel(const float *g, const float *u, int64_t n,
                             float *y) {
  stepKernelPrologue();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = silu(g[i]) * u[i];
}

//===----------------------------------------------------------------------===//
// Normalisations: one block of kRowThreads per row; thread t owns values
// t, t + kRowThreads, ... in every pass, so y (or sum) may alias the input.
//===----------------------------------------------------------------------===//

/// One row's RMS norm by the whole block (y may be x: each thread reads
/// and writes only its own values). `partials` holds kWarp floats.
__device__ void blockRmsNormRow(const float *x, int64_t n, const float *w,
                                float eps, float *y, float *partials) {
  float sumSq = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    sumSq += x[i] * x[i];
  sumSq = blockSum(sumSq, partials);
  const float rms = sqrtf(sumSq / float(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    y[i] = x[i] / rms * w[i];
}

/// One row's layer norm by the whole block, as blockRmsNormRow.
__device__ void blockLayerNormRow(const float *x, int64_t n, const float *w,
                                  const float *bias, float eps, float *y,
                                  float *partials) {
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    sum += x[i];
  const float mean = blockSum(sum, partials) / float(n);
  // Second pass over centred values: their squares do not cancel.
  float sumSq = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    sumSq += (x[i] - mean) * (x[i] - mean);
  sumSq = blockSum(sumSq, partials);
  const float sd = sqrtf(sumSq / float(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    y[i] = (x[i] - mean) / sd * w[i] + bias[i];
}

__global__ void rmsNormKernel(const float *x, int64_t n, const float *w,
                              float eps, float *y) {
  stepKernelPrologue();
  __shared__ float partials[kWarp];
  blockRmsNormRow(x + int64_t(blockIdx.x) * n, n, w, eps,
                  y + int64_t(blockIdx.x) * n, partials);
}

__global__ void addRmsNormKernel(const float *a, const float *b, int64_t n,
                                 const float *w, float eps, float *sum,
                                 float *y) {
  stepKernelPrologue();
  __shared__ float partials[kWarp];
  const int64_t base = int64_t(blockIdx.x) * n;
  float sumSq = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float s = a[base + i] + b[base + i];
    sum[base + i] = s;
    sumSq += s * s;
  }
  sumSq = blockSum(sumSq, partials);
  const float rms = sqrtf(sumSq / float(n) + eps);
  // Re-read this thread's own writes (y may alias a or b, not sum).
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    y[base + i] = sum[base + i] / rms * w[i];
}

/// The two norms with each thread's values held in registers (n <=
/// kPer * blockDim): every load of a row is issued before any is used, and
/// the normalisation reads no memory back. Thread t holds values t, t +
/// blockDim, ...; the same math as the kernels above.
template <int kPer>
__global__ void rmsNormRegsKernel(const float *x, int64_t n, const float *w,
                                  float eps, float *y) {
  stepKernelPrologue();
  __shared__ float partials[kWarp];
  const float *xr = x + int64_t(blockIdx.x) * n;
  float *yr = y + int64_t(blockIdx.x) * n;
  const int stride = int(blockDim.x), count = int(n);
  float v[kPer], g[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int i = int(threadIdx.x) + k * stride;
    v[k] = i < count ? xr[i] : 0.f;
    g[k] = i < count ? w[i] : 0.f;
  }
  float sumSq = 0.f;
#pragma unroll
  for (int k = 0; k < kPer; ++k)
    sumSq += v[k] * v[k];
  sumSq = blockSum(sumSq, partials);
  const float rms = sqrtf(sumSq / float(n) + eps);
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int i = int(threadIdx.x) + k * stride;
    if (i < count)
      yr[i] = v[k] / rms * g[k];
  }
}

/// A router tail (kiln-fold-router): `n` values divided by a row's rms
/// (rows = 1) into `out`. n = 0: none.
struct RmsTail {
  const float *in = nullptr;
  int64_t n = 0;
  float *out = nullptr;
};

template <int kPer>
__global__ void addRmsNormRegsKernel(const float *a, const float *b, int64_t n,
                                     const float *w, float eps, float *sum,
                                     float *y, RmsTail tail) {
  stepKernelPrologue();
  __shared__ float partials[kWarp];
  const int64_t base = int64_t(blockIdx.x) * n;
  const int stride = int(blockDim.x), count = int(n);
  float v[kPer], g[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int i = int(threadIdx.x) + k * stride;
    v[k] = i < count ? a[base + i] + b[base + i] : 0.f;
    g[k] = i < count ? w[i] : 0.f;
  }
  float sumSq = 0.f;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int i = int(threadIdx.x) + k * stride;
    if (i < count)
      sum[base + i] = v[k];
    sumSq += v[k] * v[k];
  }
  sumSq = blockSum(sumSq, partials);
  const float rms = sqrtf(sumSq / float(n) + eps);
  // y may alias a or b (each thread read its own values above), not sum.
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int i = int(threadIdx.x) + k * stride;
    if (i < count)
      y[base + i] = v[k] / rms * g[k];
  }
  for (int64_t i = threadIdx.x; i < tail.n; i += blockDim.x)
    tail.out[i] = tail.in[i] / rms;
}

__global__ void layerNormKernel(const float *x, int64_t n, const float *w,
                                const float *bias, float eps, float *y) {
  stepKernelPrologue();
  __shared__ float partials[kWarp];
  blockLayerNormRow(x + int64_t(blockIdx.x) * n, n, w, bias, eps,
                    y + int64_t(blockIdx.x) * n, partials);
}

//===----------------------------------------------------------------------===//
// Rope: one thread per value of the rows. The thread of a pair's first
// value turns the pair (reading both before writing, so y may be x); the
// second value's thread idles; values outside the pairs are copied.
//===----------------------------------------------------------------------===//

/// The most pairs whose inverse frequencies travel in the launch's
/// parameters (GLM-5 rotates 64 dims: 32 pairs); more are computed on the
/// device.
constexpr int kRopeTablePairs = 64;

/// theta^(-2i / dims) per pair i, computed on the host with std::pow, the
/// CPU reference's own call, so the angles are the CPU's bits.
struct RopeFrequencies {
  double inverse[kRopeTablePairs];
  int pairs; ///< valid entries; 0: compute on the device
};

/// The table for `dims` rotated values (theta^(-2i / dims) per pair, with
/// std::pow, as the CPU), or an empty one (pairs 0) when they are more than
/// kRopeTablePairs.
RopeFrequencies ropeFrequencies(float theta, int64_t dims) {
  RopeFrequencies freq{};
  if (dims / 2 <= kRopeTablePairs) {
    freq.pairs = int(dims / 2);
    for (int i = 0; i < freq.pairs; ++i)
      freq.inverse[i] =
          std::pow(double(theta), -2.0 * double(i) / double(dims));
  }
  return freq;
}

/// The cosines and sines of the host's table of rope pairs at `pos`, in
/// double as the CPU, into shared memory, the block's threads a pair each
/// in turn (the caller's barrier publishes them): the rope kernels' table.
__device__ inline void stageRopeTable(double pos, const RopeFrequencies &freq,
                                      float *cosines, float *sines) {
  for (int i = threadIdx.x; i < freq.pairs; i += blockDim.x) {
    double c, sn;
    sincos(pos * freq.inverse[i], &sn, &c);
    cosines[i] = float(c);
    sines[i] = float(sn);
  }
}

__global__ void ropeKernel(const float *x, int64_t rows, int64_t n,
                           const int32_t *position, RopeStyle style,
                           float theta, int64_t offset, int64_t dims,
                           RopeFrequencies freq, float *y) {
  // Each block turns the position's angles into cosines and sines once
  // (in double, as the CPU), then every row of the block uses them; the
  // position and the angles before the wait for x.
  __shared__ float cosines[kRopeTablePairs], sines[kRopeTablePairs];
  const int64_t pairs = dims / 2;
  const double pos = double(stepInputBeforeWait(position));
  const bool table = freq.pairs == pairs;
  if (table) {
    stageRopeTable(pos, freq, cosines, sines);
    __syncthreads();
  }
  stepKernelPrologue();
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
       idx < rows * n; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = idx / n, j = idx % n, rel = j - offset;
    if (rel < 0 || rel >= 2 * pairs) {
      if (y != x)
        y[idx] = x[idx];
      continue;
    }
    int64_t i, second;
    if (style == RopeStyle::Interleaved) {
      if (rel % 2)
        continue;
      i = rel / 2;
      second = j + 1;
    } else {
      if (rel >= pairs)
        continue;
      i = rel;
      second = j + dims / 2;
    }
    float c, s;
    if (table) {
      c = cosines[i];
      s = sines[i];
    } else {
      // The angle and its cosine/sine in double, as the CPU: position *
      // theta^(-2i/dims) reaches 1e5 rad in long contexts.
      const double angle =
          pos * pow(double(theta), -2.0 * double(i) / double(dims));
      c = float(cos(angle));
      s = float(sin(angle));
    }
    const int64_t base = row * n;
    const float a = x[base + j], b = x[base + second];
    y[base + j] = a * c - b * s;
    y[base + second] = a * s + b * c;
  }
}

//===----------------------------------------------------------------------===//
// Slice, gather reorder: one thread per output value.
//===----------------------------------------------------------------------===//

constexpr int kMaxSliceRank = 4;

struct SliceGeometry {
  int rank;
  int64_t src[kMaxSliceRank], dst[kMaxSliceRank], offsets[kMaxSliceRank];
  int64_t total;
};

__global__ void sliceKernel(const float *x,
                            const __grid_constant__ SliceGeometry g, float *y) {
  stepKernelPrologue();
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
       idx < g.total; idx += int64_t(gridDim.x) * blockDim.x) {
    // Row-major: the last dim is the fastest.
    int64_t rest = idx, srcIndex = 0, stride = 1;
    for (int d = g.rank - 1; d >= 0; --d) {
      const int64_t coord = rest % g.dst[d] + g.offsets[d];
      rest /= g.dst[d];
      srcIndex += coord * stride;
      stride *= g.src[d];
    }
    y[idx] = x[srcIndex];
  }
}

struct ConcatParts {
  const float *part[kMaxConcatParts];
  int64_t begin[kMaxConcatParts + 1]; ///< part p is [begin[p], begin[p + 1])
  int count;
};

__global__ void concatKernel(ConcatParts c, int64_t outer, int64_t total,
                             float *y) {
  stepKernelPrologue();
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
       idx < outer * total; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = idx / total, j = idx % total;
    int p = 0;
    while (p + 1 < c.count && j >= c.begin[p + 1])
      ++p;
    const int64_t run = c.begin[p + 1] - c.begin[p];
    y[idx] = c.part[p][o * run + (j - c.begin[p])];
  }
}

__global__ void gatherReorderKernel(const float *src, int64_t ranks,
                                    int64_t outer, int64_t inner, float *dst) {
  stepKernelPrologue();
  const int64_t total = ranks * outer * inner;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
       idx < total; idx += int64_t(gridDim.x) * blockDim.x) {
    // dst[o][q][i] = src[q][o][i].
    const int64_t i = idx % inner, q = (idx / inner) % ranks,
                  o = idx / inner / ranks;
    dst[idx] = src[(q * outer + o) * inner + i];
  }
}

//===----------------------------------------------------------------------===//
// Weights: embed, dequant (linear, the mat-vecs: StepMatVec.cu).
//===----------------------------------------------------------------------===//

/// One thread per value of the row; a bad token is reported by thread 0 of
/// block 0 and no thread reads the table.
__global__ void embedKernel(Geometry g, const uint8_t *data,
                            const int32_t *token, float *y, FaultSink fault) {
  stepKernelPrologue();
  const int32_t t = *token;
  if (t < 0 || t >= g.rows) {
    if (blockIdx.x == 0 && threadIdx.x == 0)
      recordFault(fault, FaultCode::TokenOutOfRange, t, g.rows);
    return;
  }
  for (int64_t col = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
       col < g.cols; col += int64_t(gridDim.x) * blockDim.x)
    y[col] = weightValue(g, data, t, int32_t(col));
}

__global__ void dequantKernel(Geometry g, const uint8_t *data, float *out) {
  stepKernelPrologue();
  const int64_t total = g.rows * g.cols;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
       idx < total; idx += int64_t(gridDim.x) * blockDim.x)
    out[idx] = weightValue(g, data, idx / g.cols, int32_t(idx % g.cols));
}

/// A split layout's planes (SplitLayout.h) for the repack and dequant
/// kernels: plane p, at at[p], takes bytes [offset[p], offset[p] +
/// bytes[p]) of every block. Written by the repack only.
struct SplitPlanes {
  int count;
  uint32_t offset[kMaxSplitPlanes], bytes[kMaxSplitPlanes];
  uint8_t *at[kMaxSplitPlanes];
};

/// Split layouts: one thread per byte of the blocks (coalesced reads; each
/// plane's writes are runs of its piece), every byte copied unchanged.
__global__ void repackSplitKernel(const uint8_t *blocks, uint64_t total,
                                  uint32_t blockBytes, SplitPlanes planes) {
  stepKernelPrologue();
  for (uint64_t idx = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
       idx < total; idx += uint64_t(gridDim.x) * blockDim.x) {
    const uint64_t b = idx / blockBytes;
    const uint32_t k = uint32_t(idx % blockBytes);
    for (int p = 0; p < planes.count; ++p)
      if (k - planes.offset[p] < planes.bytes[p]) // unsigned: below wraps
        planes.at[p][b * planes.bytes[p] + k - planes.offset[p]] = blocks[idx];
  }
}

/// Split layouts' values as gguf-py, with GenericQuant.cuh's operations on
/// the planes' pieces of each block: rows are back to back in every plane,
/// so value idx is value idx % blockValues of block idx / blockValues.
__global__ void dequantSplitKernel(GGMLType type, int32_t values, int64_t total,
                                   SplitPlanes planes, float *out) {
  stepKernelPrologue();
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
       idx < total; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = idx / values;
    const int i = int(idx % values);
    const uint8_t *p0 = planes.at[0] + b * planes.bytes[0],
                  *p1 = planes.at[1] + b * planes.bytes[1];
    switch (type) {
    case GGMLType::Q8_0: // quants, scales
      out[idx] = float(int8_t(p0[i])) * generic::f16(p1);
      break;
    case GGMLType::Q4_K: // qs, heads
      out[idx] = generic::valueQ4K(p1, p0, i);
      break;
    case GGMLType::Q5_K: // qs, heads, qh
      out[idx] =
          generic::valueQ5K(p1, planes.at[2] + b * planes.bytes[2], p0, i);
      break;
    case GGMLType::Q6_K: // ql, scales, qh, d
      out[idx] = generic::valueQ6K(p0, planes.at[2] + b * planes.bytes[2], p1,
                                   planes.at[3] + b * planes.bytes[3], i);
      break;
    case GGMLType::IQ4_XS: // qs, heads
      out[idx] = generic::valueIQ4XS(p1, p0, i);
      break;
    case GGMLType::IQ4_NL: // qs, d
      out[idx] = generic::valueIQ4NL(p1, p0, i);
      break;
    case GGMLType::Q5_0: // qs, d, qh
      out[idx] =
          generic::valueQ5_0(p1, planes.at[2] + b * planes.bytes[2], p0, i);
      break;
    case GGMLType::Q5_1: // qs, heads (d, m, qh)
      out[idx] = generic::valueQ5_1(p1, p1 + 4, p0, i);
      break;
    default: // never reached: checked on the host
      out[idx] = __int_as_float(0x7fc00000);
      break;
    }
  }
}

//===----------------------------------------------------------------------===//
// Cache append: one thread per value of the row.
//===----------------------------------------------------------------------===//

__global__ void cacheAppendKernel(const float *entry, const int32_t *position,
                                  DeviceCache cache, FaultSink fault) {
  const int32_t p = stepInputBeforeWait(position);
  stepKernelPrologue();
  if (p < 0 || p >= cache.positions) {
    if (blockIdx.x == 0 && threadIdx.x == 0)
      recordFault(fault, FaultCode::PositionOutOfRange, p, cache.positions);
    return;
  }
  const int64_t base = int64_t(p) * cache.width;
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
       j < cache.width; j += int64_t(gridDim.x) * blockDim.x)
    storeCache(cache, base + j, entry[j]);
}

//===----------------------------------------------------------------------===//
// Norm, rope and cache append in one block (step.norm_rope_append): the row,
// the norm's weight and bias staged in shared memory by loads issued
// together with the position's, the norm by block sums, the rotation by one
// thread per pair, then the converted row stored.
//===----------------------------------------------------------------------===//

__global__ void
normRopeAppendKernel(const float *entry, int64_t normDims, const float *w,
                     const float *bias, float eps, const int32_t *position,
                     RopeStyle style, float theta, int64_t offset, int64_t dims,
                     RopeFrequencies freq, DeviceCache cache, FaultSink fault) {
  extern __shared__ float y[]; // [width], then w and bias [normDims] each
  __shared__ float partials[kWarp];
  __shared__ float cosines[kRopeTablePairs], sines[kRopeTablePairs];
  const int64_t width = cache.width;
  float *g = y + width, *b = g + normDims;
  // The position and its angles before the wait for the entry (the barrier
  // after the norm publishes them).
  const int32_t p = stepInputBeforeWait(position);
  const bool inCache = p >= 0 && p < cache.positions;
  const int64_t pairs = dims / 2;
  const bool table = freq.pairs == pairs;
  if (inCache && table)
    stageRopeTable(double(p), freq, cosines, sines);
  stepKernelPrologue();
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    const float v = entry[i];
    if (i < normDims) {
      g[i] = w[i];
      if (bias)
        b[i] = bias[i];
    }
    y[i] = v;
  }
  if (!inCache) { // uniform over the block
    if (threadIdx.x == 0)
      recordFault(fault, FaultCode::PositionOutOfRange, p, cache.positions);
    return;
  }
  // Each thread normalises the values it staged itself (the same indices
  // as its loads), so the row needs no barrier before the norm.
  if (bias)
    blockLayerNormRow(y, normDims, g, b, eps, y, partials);
  else
    blockRmsNormRow(y, normDims, g, eps, y, partials);
  __syncthreads(); // the normalised row and the angles are in place
  for (int64_t i = threadIdx.x; i < pairs; i += blockDim.x) {
    int64_t first, second;
    ropePair(style, offset, dims, i, first, second);
    float c, s;
    if (table) {
      c = cosines[i];
      s = sines[i];
    } else {
      const double angle =
          double(p) * pow(double(theta), -2.0 * double(i) / double(dims));
      c = float(cos(angle));
      s = float(sin(angle));
    }
    rotatePair(y[first], y[second], c, s);
  }
  __syncthreads();
  const int64_t base = int64_t(p) * width;
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x)
    storeCache(cache, base + j, y[j]);
}

//===----------------------------------------------------------------------===//
// MLA attention, split over positions (flash decoding), every head at once:
//   1. block b takes chunks c = b, b + grid, ... of kMlaChunk attended
//      entries (at most one block per multiprocessor: a grid sized by the
//      cache's capacity would run in waves of blocks with nothing to do):
//      it reads those cache rows once into shared memory (as f32) and, for
//      every head, computes the chunk's scores, their max m, p = exp(s -
//      m), l = sum p, and the partial output o[j] = sum_t p[t] row[t][j],
//      into scratch;
//   2. after a grid barrier, combine task (h, slice) takes head h's output
//      values [32 slice, 32 slice + 32), chunks ascending: M = max m_c, L =
//      sum_c l_c exp(m_c - M), out = sum_c o_c exp(m_c - M) / L; the
//      grid's last block checks the inputs and reports the first fault
//      (the lowest bad entry, as the CPU); bad work is skipped.
// Each cache row is read once per step for all local heads. The same math
// as the CPU's global softmax, rounded in another order, which depends
// only on the shapes, never on which block took which chunk. The kernel
// is compiled for GLM-5's shape (512 + 64, each cache type: MlaShape) and
// for any shape.
//===----------------------------------------------------------------------===//

constexpr int kMlaChunk = 8;
static_assert(kMlaChunk % 4 == 0 && kMlaChunk <= 32,
              "whole float4s of weights; a lane per entry");
/// Threads of a block: its serial work per thread is what bounds a decode
/// step's attention (every chunk runs at once), so it is kept short: few
/// rows per chunk, many threads per chunk.
constexpr int kMlaThreads = 512;
/// The widest cache row the per-lane query registers hold (GLM-5: 512 +
/// 64).
constexpr int kMlaMaxWidth = 24 * kWarp;
/// A combine task's output values (of one head) in mlaKernel
/// (MlaShape::kCombineColumns: the tensor cores' kernel takes twice as
/// many).
constexpr int kMlaCombineColumns = 32;
/// The scratch's first floats, which hold the grid barrier's words (four:
/// the partial results after them stay 16-byte aligned).
constexpr int64_t kMlaArrivalFloats = 4;
static_assert(kGridBarrierWords <= kMlaArrivalFloats);
/// MlaShape::kMma's chunk of kChunk entries in shared memory
/// (MlaMmaLayout): its rows as f16 (padded by 16 bytes, so that
/// ldmatrix's 8 rows of 16 bytes fall in 8 bank groups), the scores
/// [8][kChunk] f32, the warps' partial scores [16][8][kChunk] f32, the
/// weights' f16 parts [16][kChunk] (hi of heads 0..7, then lo), the
/// query's f16 parts [16][kMlaMmaStride] and 2^-e of each head.
constexpr int kMlaMmaHeads = 8, kMlaMmaWidth = 512 + 64;
/// Its entries a chunk: 16 took GLM-5's step at 16k 0.10-0.14 ms below the
/// scalar kernel's 8 on an H100 (at 1k ~0.03, within the spread), 32
/// (spilling on sm_90) 0.19 ms above at 1k (docs/perf.md, forty-ninth
/// pass).
constexpr int kMlaMmaChunk = 16;
constexpr int kMlaMmaStride = kMlaMmaWidth + 8;
constexpr int kMlaMmaWarps = kMlaThreads / kWarp;
template <int kChunk> struct MlaMmaLayout {
  static constexpr size_t kScoresAt = size_t(kChunk) * kMlaMmaStride * 2;
  static constexpr size_t kPartsAt =
      kScoresAt + size_t(kMlaMmaHeads) * kChunk * 4;
  static constexpr size_t kWeightsAt =
      kPartsAt + size_t(kMlaMmaWarps) * kMlaMmaHeads * kChunk * 4;
  static constexpr size_t kQueryAt =
      kWeightsAt + size_t(2 * kMlaMmaHeads) * kChunk * 2;
  static constexpr size_t kBackAt =
      kQueryAt + size_t(2 * kMlaMmaHeads) * kMlaMmaStride * 2;
  /// (2^-e of each head, then the warps' largest |value| while the query
  /// is staged.)
  static constexpr size_t kBytes =
      kBackAt + (kMlaMmaHeads + kMlaMmaWarps) * 4;
  static_assert(kQueryAt % 16 == 0 && kWeightsAt % 16 == 0,
                "ldmatrix rows 16-byte aligned");
};
static_assert(kMlaMmaWarps == 2 * kMlaMmaHeads &&
                  kMlaMmaWidth / 16 <= 3 * kMlaMmaWarps &&
                  512 == 32 * kMlaMmaWarps,
              "the tensor cores' chunk: 16 warps");

struct MlaArgs {
  const float *qLatent, *qRope;
  int64_t heads, latent, rope;
  DeviceCache cache;
  const int32_t *position, *selected, *count;
  int64_t capacity;
  float scale;
  float *partM, *partL, *partO; ///< [chunks][heads], [chunks][heads][latent]
  /// The grid barrier's words (kGridBarrierWords: its two counts and
  /// parity, zero before the first call; gridBarrier keeps them fit for the
  /// next).
  uint32_t *arrivals;
  float *out;
  FaultSink fault;
  /// The output projection (launchMlaAttention's `proj`, q8_0-split: quants
  /// [heads * projRows][latent], scales [heads * projRows][latent / 32]),
  /// or projQuants null. With it mlaKernel only writes the chunks' partial
  /// results, and mlaProjectKernel combines them and projects each head's
  /// output into `out` [heads][projRows].
  const int8_t *projQuants = nullptr;
  const uint16_t *projScales = nullptr;
  int64_t projRows = 0;
  /// MlaLaunch::lateDependents at launch: the kernel lets its dependents
  /// be scheduled after its chunks, not at once after its wait.
  bool lateDependents = false;
  /// MlaLaunch::earlyRows at launch (mlaLoadEarlyRows).
  bool earlyRows = false;
};

/// mlaMostEntries, on both sides: every position of the cache, or with a
/// capacity above 0 the fewer of the two.
__host__ __device__ inline int64_t mlaEntryLimit(int64_t positions,
                                                 int64_t capacity) {
  return capacity > 0 && capacity < positions ? capacity : positions;
}

/// The attended entry count, or -1 when the inputs fault (uniform over the
/// grid: every thread reads the same scalars).
__device__ int64_t mlaAttended(const MlaArgs &a) {
  // Both scalars loaded before either is tested: one memory round trip.
  const int32_t position = *a.position;
  const int32_t count = a.selected ? *a.count : 0;
  if (position < 0 || position >= a.cache.positions)
    return -1;
  const int64_t limit = mlaEntryLimit(a.cache.positions, a.capacity);
  if (!a.selected) // positions 0 .. position, at most `limit` of them
    return int64_t(position) + 1 > limit ? -1 : int64_t(position) + 1;
  return count < 0 || count > limit ? -1 : count;
}

/// Reports the first fault of the inputs (block-uniform: every thread reads
/// the same scalars, so the barriers inside are reached by all or none).
__device__ void mlaReportFault(const MlaArgs &a) {
  __shared__ int firstBad;
  const int64_t positions = a.cache.positions;
  const int32_t position = *a.position;
  if (position < 0 || position >= positions) {
    if (threadIdx.x == 0)
      recordFault(a.fault, FaultCode::PositionOutOfRange, position, positions);
    return;
  }
  const int64_t limit = mlaEntryLimit(positions, a.capacity);
  const int32_t count = a.selected ? *a.count : position + 1;
  if (count < 0 || count > limit) {
    if (threadIdx.x == 0)
      recordFault(a.fault, FaultCode::CountOutOfRange, count, limit);
    return;
  }
  if (!a.selected)
    return;
  if (threadIdx.x == 0)
    firstBad = INT_MAX;
  __syncthreads();
  for (int i = threadIdx.x; i < count; i += blockDim.x)
    if (a.selected[i] < 0 || a.selected[i] >= positions) {
      atomicMin(&firstBad, i);
      break;
    }
  __syncthreads();
  if (threadIdx.x == 0 && firstBad != INT_MAX)
    recordFault(a.fault, FaultCode::SelectionOutOfRange, a.selected[firstBad],
                positions);
}

/// What an MLA kernel is compiled for: kLatent > 0 fixes the latent and
/// rope widths and kCacheType the cache's element type (GLM-5: 512, 64, f16),
/// so every loop over a row has a fixed trip count and every branch on a
/// width or a type is decided at compile time; kLatent = 0 reads them
/// from the arguments (any model). kHeads > 0 also fixes the rank's heads
/// (ModelShapes.h: GLM-5's at tp = 8, 4, 2, 1; family mla),
/// so the loops over heads have fixed trip counts too. kTensorCores (8
/// heads of 512 + 64, an f16 cache: GLM-5's rank at tp = 8) has a chunk's
/// scores and partial outputs made on the tensor cores (mlaChunk), in
/// chunks of kTensorChunk entries.
constexpr int kAnyCache = -1;
template <int kLatent, int kRope, int kCacheType, int kHeads = 0,
          int kTensorChunk = 0>
struct MlaShape {
  static constexpr bool kFixed = kLatent > 0;
  static_assert(kHeads == 0 || kFixed);
  static constexpr bool kMma = kTensorChunk > 0;
  /// Attended entries a chunk (a block's unit of work).
  static constexpr int kChunk = kMma ? kTensorChunk : kMlaChunk;
  /// A combine task's output values in mlaKernel. The tensor cores'
  /// chunks of 16 entries: 64, eight tasks a head (measured 1.8 us a layer
  /// faster at 16k, level at 1k; docs/perf.md, sixty-first pass). At
  /// GLM-5's 2,048 selected entries (128 chunks, one a block) half the
  /// blocks then have no task, so the grid's last block checks the
  /// selection beside the others' combines rather than after its own; 8
  /// groups of 16 loads a thread still take the 128 chunks in one round
  /// trip. The other kernels' chunks of kMlaChunk: 32, 16 groups, so that
  /// 1,025 entries (129 chunks) take one round trip too.
  static constexpr int kCombineColumns = kMma ? 64 : kMlaCombineColumns;
  static_assert(!kMma || (kChunk % 16 == 0 && kChunk <= 32),
                "the tensor cores' chunk: whole k16 steps, a lane an entry");
  static_assert(!kMma || (kHeads == 8 && kLatent == 512 && kRope == 64 &&
                          kCacheType == int(CacheType::F16)),
                "the tensor cores' chunk is GLM-5's rank at tp = 8");
  /// Whether the rank's heads are fixed too (the kernels GLM-5 runs).
  static constexpr bool kFixedHeads = kHeads > 0;
  __device__ static int heads(const MlaArgs &a) {
    return kHeads > 0 ? kHeads : int(a.heads);
  }
  static constexpr int kCache = kCacheType;
  /// A fixed shape's latent and row widths (0 for any shape).
  static constexpr int kLatentWidth = kLatent;
  static constexpr int kWidth = kLatent + kRope;
  /// Query registers per lane: the row's values j = lane + 32 r.
  static constexpr int kQueryRegs =
      kFixed ? (kLatent + kRope + kWarp - 1) / kWarp : kMlaMaxWidth / kWarp;
  __device__ static int latent(const MlaArgs &a) {
    return kFixed ? kLatent : int(a.latent);
  }
  __device__ static int width(const MlaArgs &a) {
    return kFixed ? kWidth : int(a.cache.width);
  }
  __device__ static float read(const MlaArgs &a, int64_t index) {
    if constexpr (kCache == int(CacheType::F16))
      return halfBitsToFloat(
          static_cast<const uint16_t *>(a.cache.data)[index]);
    else if constexpr (kCache == int(CacheType::BF16))
      return __uint_as_float(
          uint32_t(static_cast<const uint16_t *>(a.cache.data)[index]) << 16);
    else if constexpr (kCache == int(CacheType::F32))
      return static_cast<const float *>(a.cache.data)[index];
    else
      return readCache(a.cache.data, a.cache.type, index);
  }
};

/// Loads the chunk's n rows (cache indices in rowIndex, -1 for a bad
/// selected row, which reads as zeros) into `rows` as f32, [kChunk]
/// [width]. Every load is unconditional (a bad row's index is clamped to
/// row 0) and issued before any is used, so the chunk costs one memory round
/// trip: a load under a branch, or converted as soon as it is loaded, waits
/// for the one before it.
/// With Shape::kMma the rows are kept as f16, kMlaMmaStride apart, and a
/// `whole` load also zeroes slots n .. kChunk - 1, so that their zero
/// weights meet finite values (not `whole`: the position's row alone, into
/// its slot, the others loaded before the wait).
template <class Shape>
__device__ void mlaLoadRows(const MlaArgs &a, int n, const int64_t *rowIndex,
                            float *rows, bool whole = true) {
  constexpr int kChunk = Shape::kChunk;
  if constexpr (Shape::kMma) {
    static_assert(Shape::kCache == int(CacheType::F16));
    constexpr int kPieces = kMlaMmaWidth / 8; // 16-byte pieces a row
    constexpr int kMaxLoads =
        (kChunk * kPieces + kMlaThreads - 1) / kMlaThreads;
    const uint4 *base = static_cast<const uint4 *>(a.cache.data);
    uint16_t *to = reinterpret_cast<uint16_t *>(rows);
    uint4 raw[kMaxLoads];
#pragma unroll
    for (int k = 0; k < kMaxLoads; ++k) {
      const int i = int(threadIdx.x) + k * kMlaThreads;
      const int at = i < n * kPieces ? i : 0;
      const int64_t row =
          rowIndex[at / kPieces] >= 0 ? rowIndex[at / kPieces] : 0;
      raw[k] = base[row * kPieces + at % kPieces];
    }
    const int slots = whole ? kChunk : n;
#pragma unroll
    for (int k = 0; k < kMaxLoads; ++k) {
      const int i = int(threadIdx.x) + k * kMlaThreads;
      if (i >= slots * kPieces)
        continue;
      const int t = i / kPieces, piece = i % kPieces;
      const bool good = t < n && rowIndex[t] >= 0;
      *reinterpret_cast<uint4 *>(to + t * kMlaMmaStride + piece * 8) =
          good ? raw[k] : make_uint4(0, 0, 0, 0);
    }
  } else if constexpr (Shape::kFixed) {
    // 16 bytes a thread (launchMlaAttention chooses a fixed shape only for
    // a 16-byte aligned cache).
    constexpr int kCache = Shape::kCache;
    constexpr int kBytes = kCache == int(CacheType::F32) ? 4 : 2;
    constexpr int kPerPiece = 16 / kBytes;
    constexpr int kWidth = Shape::kWidth;
    static_assert(kWidth * kBytes % 16 == 0, "rows of whole 16-byte pieces");
    constexpr int kPieces = kWidth / kPerPiece; // a row's 16-byte pieces
    constexpr int kMaxLoads =
        (kChunk * kPieces + kMlaThreads - 1) / kMlaThreads;
    const int total = n * kPieces;
    const uint4 *base = static_cast<const uint4 *>(a.cache.data);
    uint4 raw[kMaxLoads];
#pragma unroll
    for (int k = 0; k < kMaxLoads; ++k) {
      const int i = int(threadIdx.x) + k * kMlaThreads;
      const int at = i < total ? i : 0;
      const int64_t row =
          rowIndex[at / kPieces] >= 0 ? rowIndex[at / kPieces] : 0;
      raw[k] = base[row * kPieces + at % kPieces];
    }
#pragma unroll
    for (int k = 0; k < kMaxLoads; ++k) {
      const int i = int(threadIdx.x) + k * kMlaThreads;
      if (i >= total)
        continue;
      const int t = i / kPieces, piece = i % kPieces;
      const bool good = rowIndex[t] >= 0;
      const uint32_t word[4] = {raw[k].x, raw[k].y, raw[k].z, raw[k].w};
      float v[kPerPiece];
#pragma unroll
      for (int e = 0; e < kPerPiece; ++e) {
        float f;
        if constexpr (kBytes == 4)
          f = __uint_as_float(word[e]);
        else {
          const uint16_t h = uint16_t(word[e / 2] >> (16 * (e % 2)));
          f = kCache == int(CacheType::F16)
                  ? halfBitsToOperand(h)
                  : __uint_as_float(uint32_t(h) << 16);
        }
        v[e] = good ? f : 0.f;
      }
      float4 *out =
          reinterpret_cast<float4 *>(rows + t * kWidth + piece * kPerPiece);
#pragma unroll
      for (int e = 0; e < kPerPiece; e += 4)
        out[e / 4] = make_float4(v[e], v[e + 1], v[e + 2], v[e + 3]);
    }
  } else {
    // Any shape: thread c takes columns c, c + blockDim, ... of every row,
    // a column's loads of all rows in flight at once.
    const int width = Shape::width(a);
    for (int c = threadIdx.x; c < width; c += int(blockDim.x)) {
      float v[kChunk];
#pragma unroll
      for (int t = 0; t < kChunk; ++t) {
        const int64_t row = t < n && rowIndex[t] >= 0 ? rowIndex[t] : 0;
        v[t] = Shape::read(a, row * width + c);
      }
#pragma unroll
      for (int t = 0; t < kChunk; ++t)
        if (t < n)
          rows[t * width + c] = rowIndex[t] >= 0 ? v[t] : 0.f;
    }
  }
}

/// Before the kernel's wait, without a selection: the attended entries are
/// the cache rows 0 .. position, and all but the position's own were
/// written by earlier steps (whose replays have ended), so block b loads
/// its first chunk's (chunk b) into `rows` as mlaChunk does, the position's
/// row as zeros, and sets *newest to the position: mlaChunk then loads only
/// that row after the wait. `position` is the step's, read before the wait
/// (stepInputBeforeWait). False, with nothing loaded, where the position is
/// out of range or the block has no chunk: mlaAttended then decides after
/// the wait, as it would have. Block-uniform (every thread has the same
/// position), so the barrier inside is reached by all or none.
template <class Shape>
__device__ bool mlaLoadEarlyRows(const MlaArgs &a, int32_t position,
                                 float *rows, int64_t *newest) {
  constexpr int kChunk = Shape::kChunk;
  __shared__ int64_t rowIndex[kChunk];
  if (position < 0 || position >= a.cache.positions ||
      int64_t(position) + 1 > mlaEntryLimit(a.cache.positions, a.capacity))
    return false;
  const int64_t attended = int64_t(position) + 1;
  const int64_t first = int64_t(blockIdx.x) * kChunk;
  if (first >= attended)
    return false;
  const int n =
      int(attended - first < kChunk ? attended - first : kChunk);
  if (threadIdx.x < n) {
    const int64_t row = first + threadIdx.x;
    rowIndex[threadIdx.x] = row < position ? row : -1;
  }
  if (threadIdx.x == 0)
    *newest = position;
  __syncthreads();
  mlaLoadRows<Shape>(a, n, rowIndex, rows);
  return true;
}

/// Chunk `chunk` of `attended` entries (the whole block; `shared` holds
/// kChunk * (width + heads) floats). `preloaded`: thread t < kChunk's
/// selection entry of this chunk, already loaded, when `hasPreloaded`.
/// `newest`: non-null where mlaLoadEarlyRows loaded this chunk's rows
/// before the wait but the position's, whose index it holds.
template <class Shape>
__device__ void mlaChunk(const MlaArgs &a, int64_t chunk, int64_t attended,
                         float *shared, int32_t preloaded, bool hasPreloaded,
                         const int64_t *newest) {
  constexpr int kChunk = Shape::kChunk;
  using Layout = MlaMmaLayout<kChunk>;
  const int64_t first = chunk * kChunk;
  const int n =
      int(attended - first < kChunk ? attended - first : kChunk);
  const int width = Shape::width(a), latent = Shape::latent(a);
  const int heads = Shape::heads(a);
  float *rows = shared; // [kChunk][width] (kMma: f16, kMlaMmaStride)
  // [heads][kChunk]
  float *p = Shape::kMma ? reinterpret_cast<float *>(
                               reinterpret_cast<unsigned char *>(shared) +
                               Layout::kScoresAt)
                         : shared + kChunk * width;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  // kMma's regions (MlaShape): the query's parts, staged by the block's
  // first chunk and kept for the others, 2^-e of each head, the warps'
  // partial scores and the weights' parts.
  unsigned char *bytes = reinterpret_cast<unsigned char *>(shared);
  uint16_t *rowHalves = reinterpret_cast<uint16_t *>(shared);
  uint16_t *queryParts = reinterpret_cast<uint16_t *>(bytes + Layout::kQueryAt);
  float *headBack = reinterpret_cast<float *>(bytes + Layout::kBackAt);
  float *scoreParts = reinterpret_cast<float *>(bytes + Layout::kPartsAt);
  uint16_t *weightParts =
      reinterpret_cast<uint16_t *>(bytes + Layout::kWeightsAt);
  const bool stageQuery = Shape::kMma && chunk == int64_t(blockIdx.x);

  // The chunk's rows, once, as f32 in shared memory (kMma: as the cache
  // holds them, f16). Their cache indices
  // first (one load each, not one per value). A bad selected row (reported
  // by the combine kernel) reads as zeros, never out of bounds.
  __shared__ int64_t rowIndex[kChunk];
  if (!newest && threadIdx.x < n) {
    const int64_t entry = first + threadIdx.x;
    const int64_t row =
        a.selected ? (hasPreloaded ? preloaded : a.selected[entry]) : entry;
    rowIndex[threadIdx.x] = row >= 0 && row < a.cache.positions ? row : -1;
  }
  // The warp's first query (below) is loaded here, in flight with the rows.
  constexpr int kQueryRegs = Shape::kQueryRegs;
  const int groups = warps > heads ? warps / heads : 1;
  float q[kQueryRegs];
  auto loadQuery = [&](int h) {
    const float *ql = a.qLatent + int64_t(h) * latent,
                *qr = a.qRope + int64_t(h) * (width - latent);
#pragma unroll
    for (int r = 0; r < kQueryRegs; ++r) {
      const int j = lane + r * kWarp;
      q[r] = j < latent ? ql[j] : j < width ? qr[j - latent] : 0.f;
    }
  };
  // kMma: warp w loads half of head w / 2's query, 9 values a lane (18
  // held across the rows' loads spilled on sm_90).
  constexpr int kHalfQuery = kMlaMmaWidth / 2 / kWarp;
  float qHalf[kHalfQuery];
  if constexpr (Shape::kMma) {
    if (stageQuery)
#pragma unroll
      for (int r = 0; r < kHalfQuery; ++r) {
        const int h = warp / 2,
                  j = (warp % 2) * (kMlaMmaWidth / 2) + lane + r * kWarp;
        qHalf[r] = j < glm5::kLatent
                       ? a.qLatent[h * glm5::kLatent + j]
                       : a.qRope[h * (kMlaMmaWidth - glm5::kLatent) + j -
                                 glm5::kLatent];
      }
  } else if (warp < heads * groups) {
    loadQuery(warp / groups);
  }
  // With the other rows in (newest), only the position's row (the last
  // entry) where it falls in this chunk, in flight with the query.
  int loadRows = n;
  const int64_t *loadIndex = rowIndex;
  float *loadTo = rows;
  if (newest) {
    const int64_t at = *newest - first;
    loadRows = at >= 0 && at < n ? 1 : 0;
    loadIndex = newest;
    loadTo = Shape::kMma
                 ? reinterpret_cast<float *>(rowHalves +
                                             (loadRows ? at : 0) *
                                                 kMlaMmaStride)
                 : rows + (loadRows ? at : 0) * width;
  } else {
    __syncthreads(); // rowIndex
  }
  mlaLoadRows<Shape>(a, loadRows, loadIndex, loadTo, !newest);
  if constexpr (Shape::kMma) {
    // The query's parts (the block's first chunk; warps 2 h and 2 h + 1
    // the two halves of head h): the head's values scaled by 2^e (its
    // largest |value| into [2^14, 2^15)) and split into hi = f16(x) and lo
    // = f16(x - hi), as the indexer's (indexerScoresMmaKernel): the two
    // hold the f32 query to ~2^-22 of its largest value, and 2^-e scales
    // the dot back exactly. The two warps of a head exchange their largest
    // |value| through shared memory, across the barrier below, then split
    // their halves.
    if (stageQuery) {
      float largest = 0.f;
#pragma unroll
      for (int r = 0; r < kHalfQuery; ++r)
        largest = maxKeepingNaN(largest, fabsf(qHalf[r]));
      for (int o = kWarp / 2; o > 0; o /= 2)
        largest =
            maxKeepingNaN(largest, __shfl_xor_sync(kFullMask, largest, o));
      if (lane == 0)
        headBack[kMlaMmaHeads + warp] = largest;
    }
  }
  __syncthreads();
  if constexpr (Shape::kMma) {
    if (stageQuery) {
      const int h = warp / 2;
      const int e = mmaQueryExponent(
          maxKeepingNaN(headBack[kMlaMmaHeads + 2 * h],
                        headBack[kMlaMmaHeads + 2 * h + 1]));
      const float up = powerOfTwo(e);
#pragma unroll
      for (int r = 0; r < kHalfQuery; ++r) {
        const int j = (warp % 2) * (kMlaMmaWidth / 2) + lane + r * kWarp;
        splitHalves(qHalf[r] * up, queryParts[h * kMlaMmaStride + j],
                    queryParts[(kMlaMmaHeads + h) * kMlaMmaStride + j]);
      }
      if (warp % 2 == 0 && lane == 0) // beside the largest values
        headBack[h] = powerOfTwo(-e);
      __syncthreads(); // the parts and the scales back
    }
  }

  if constexpr (Shape::kMma) {
    // Scores on the tensor cores: S = Q R^T by mma m16n8k16, the query's
    // 16 parts (hi of heads 0..7, then lo) as A and the chunk's rows as B
    // (kChunk / 8 tiles of 8); warp w takes the K steps (16 values) w, w +
    // 16, w + 32, and adds hi's product and lo's for each (head, row); the
    // 16 warps' sums are then added in warp order. Rows past n are zeros
    // (dropped below).
    constexpr int kTiles = kChunk / 8;
    const int g = lane / 4, c = 2 * (lane % 4);
    const uint16_t *aAt =
        queryParts + (lane % 16) * kMlaMmaStride + 8 * (lane / 16);
    // ldmatrix x4 over two tiles: rows 16 u + l % 8 + 8 (l / 16), values
    // k0 + 8 ((l / 8) % 2).
    const uint16_t *bAt = rowHalves +
                          (lane % 8 + 8 * (lane / 16)) * kMlaMmaStride +
                          8 * ((lane / 8) % 2);
    float d[kTiles][4] = {};
    for (int k0 = 16 * warp; k0 < kMlaMmaWidth; k0 += 16 * kMlaMmaWarps) {
      uint32_t af[4];
      loadMatrices<false>(af, aAt + k0);
#pragma unroll
      for (int u = 0; u < kTiles / 2; ++u) {
        uint32_t bf[4];
        loadMatrices<false>(bf, bAt + 16 * u * kMlaMmaStride + k0);
        mmaHalf(d[2 * u], af, bf[0], bf[1]);
        mmaHalf(d[2 * u + 1], af, bf[2], bf[3]);
      }
    }
    float *mine = scoreParts + warp * (kMlaMmaHeads * kChunk);
#pragma unroll
    for (int u = 0; u < kTiles; ++u) {
      mine[g * kChunk + 8 * u + c] = d[u][0] + d[u][2];
      mine[g * kChunk + 8 * u + c + 1] = d[u][1] + d[u][3];
    }
    __syncthreads();
    if (threadIdx.x < kMlaMmaHeads * kChunk) {
      float sum = 0.f;
#pragma unroll
      for (int w = 0; w < kMlaMmaWarps; ++w)
        sum += scoreParts[w * (kMlaMmaHeads * kChunk) + threadIdx.x];
      const int h = int(threadIdx.x) / kChunk;
      p[threadIdx.x] = sum * headBack[h] * a.scale; // p[h][t]
    }
  } else {

  // Scores: warp per (head, group of rows). The lane's share of the head's
  // query (every 32nd value) is loaded once into registers, then dotted
  // with the group's rows in shared memory; the latent and rope dots as
  // the CPU. With 8 heads and 16 warps each warp takes half a head's rows,
  // kMlaScoreRows at once: their dots and their sums across the warp are
  // independent, so their latencies overlap.
  constexpr int kMlaScoreRows = 4;
  for (int item = warp; item < heads * groups; item += warps) {
    const int h = item / groups;
    const int group = item % groups;
    if (item != warp) // the first item's query is already loaded
      loadQuery(h);
    for (int t0 = group; t0 < n; t0 += kMlaScoreRows * groups) {
      float dotLatent[kMlaScoreRows], dotRope[kMlaScoreRows];
#pragma unroll
      for (int k = 0; k < kMlaScoreRows; ++k) {
        // A row past the chunk's end reads row 0 (loaded) and is dropped.
        const int t = t0 + k * groups;
        const float *row = rows + (t < n ? t : 0) * width;
        dotLatent[k] = 0.f;
        dotRope[k] = 0.f;
#pragma unroll
        for (int r = 0; r < kQueryRegs; ++r) {
          const int j = lane + r * kWarp;
          if (j < latent)
            dotLatent[k] += q[r] * row[j];
          else if (j < width)
            dotRope[k] += q[r] * row[j];
        }
      }
      // warpSum's butterfly, the rows' steps interleaved.
#pragma unroll
      for (int offset = kWarp / 2; offset > 0; offset /= 2) {
#pragma unroll
        for (int k = 0; k < kMlaScoreRows; ++k) {
          dotLatent[k] += __shfl_xor_sync(0xffffffffu, dotLatent[k], offset);
          dotRope[k] += __shfl_xor_sync(0xffffffffu, dotRope[k], offset);
        }
      }
#pragma unroll
      for (int k = 0; k < kMlaScoreRows; ++k) {
        const int t = t0 + k * groups;
        if (lane == 0 && t < n)
          p[h * kChunk + t] = (dotLatent[k] + dotRope[k]) * a.scale;
      }
    }
  }
  }
  __syncthreads();

  // Per head, a warp: the chunk's max and sum; scores become exp(s - m)
  // (lane t takes entry t); the sum is lane 0's, entries ascending.
  const int64_t chunkHeads = chunk * heads;
  for (int h = warp; h < heads; h += warps) {
    float *ph = p + h * kChunk;
    // Lanes past the chunk's end repeat entry 0: fmaxf then gives the
    // serial max's result, NaN rules included.
    const float s0 = ph[0];
    const float s = lane < n ? ph[lane] : s0;
    float m = s;
    for (int offset = kChunk / 2; offset > 0; offset /= 2)
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    const float e = lane < n ? expf(s - m) : 0.f;
    if (lane < kChunk) // zeros past the chunk's end (read below)
      ph[lane] = e;
    if (Shape::kMma && lane < kChunk) // hi and lo, as the query's
      splitHalves(e, weightParts[h * kChunk + lane],
                  weightParts[(kMlaMmaHeads + h) * kChunk + lane]);
    if constexpr (Shape::kMma) {
      // The sum by butterflies (every lane the same bits).
      float l = e;
      for (int offset = kWarp / 2; offset > 0; offset /= 2)
        l += __shfl_xor_sync(0xffffffffu, l, offset);
      if (lane == 0) {
        a.partM[chunkHeads + h] = m;
        a.partL[chunkHeads + h] = l;
      }
    } else {
      float terms[kChunk];
#pragma unroll
      for (int t = 0; t < kChunk; ++t)
        terms[t] = __shfl_sync(0xffffffffu, e, t);
      if (lane == 0) {
        float l = 0.f;
#pragma unroll
        for (int t = 0; t < kChunk; ++t)
          if (t < n)
            l += terms[t];
        a.partM[chunkHeads + h] = m;
        a.partL[chunkHeads + h] = l;
      }
    }
  }
  __syncthreads();

  if constexpr (Shape::kMma) {
    // Partial outputs on the tensor cores: O = P R by mma m16n8k16, the
    // weights' 16 parts (hi of heads 0..7, then lo) as A and the rows
    // (transposed by ldmatrix) as B, kChunk / 16 K steps; warp w takes
    // values 32 w .. 32 w + 31 (four tiles of 8) and adds hi's product and
    // lo's.
    const int g = lane / 4, c = 2 * (lane % 4);
    const int j0 = 32 * warp;
    float d[4][4] = {};
#pragma unroll
    for (int k0 = 0; k0 < kChunk; k0 += 16) {
      const uint16_t *w = weightParts + k0 + c;
      const uint32_t af[4] = {
          *reinterpret_cast<const uint32_t *>(w + g * kChunk),
          *reinterpret_cast<const uint32_t *>(w + (kMlaMmaHeads + g) * kChunk),
          *reinterpret_cast<const uint32_t *>(w + g * kChunk + 8),
          *reinterpret_cast<const uint32_t *>(w + (kMlaMmaHeads + g) * kChunk +
                                              8)};
      // ldmatrix x4 .trans over two tiles: rows k0 + l % 8 + 8 ((l / 8) %
      // 2), values j + 8 (l / 16).
      const uint16_t *bAt = rowHalves +
                            (k0 + lane % 8 + 8 * ((lane / 8) % 2)) *
                                kMlaMmaStride +
                            j0 + 8 * (lane / 16);
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        uint32_t bf[4];
        loadMatrices<true>(bf, bAt + 16 * u);
        mmaHalf(d[2 * u], af, bf[0], bf[1]);
        mmaHalf(d[2 * u + 1], af, bf[2], bf[3]);
      }
    }
    float *o = a.partO + (chunkHeads + g) * latent;
#pragma unroll
    for (int i = 0; i < 4; ++i)
      *reinterpret_cast<float2 *>(o + j0 + 8 * i + c) =
          make_float2(d[i][0] + d[i][2], d[i][1] + d[i][3]);
  } else {
  // Partial outputs, entries ascending: thread j reads value j of the
  // chunk's rows once and serves every head with it.
  for (int j = threadIdx.x; j < latent; j += blockDim.x) {
    float column[kChunk];
#pragma unroll
    for (int t = 0; t < kChunk; ++t)
      column[t] = t < n ? rows[t * width + j] : 0.f;
    float *o = a.partO + chunkHeads * latent + j;
    // A few heads at a time: with a fixed head count the loop was unrolled
    // whole, and its weights' loads, hoisted ahead, spilled at the kernel's
    // 64 registers (8 heads on sm_100, 16 on sm_90; four at a time still
    // spilled on sm_120 with an f32 cache; test_kernel_resources.py).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
    constexpr int kHeadsUnrolled = 2;
#else
    constexpr int kHeadsUnrolled = 4;
#endif
#pragma unroll kHeadsUnrolled
    for (int h = 0; h < heads; ++h) {
      // The head's weights four at a time (zero past the chunk's end, as
      // the column is, so those terms add zeros).
      const float4 *ph = reinterpret_cast<const float4 *>(p + h * kChunk);
      float acc = 0.f;
#pragma unroll
      for (int t = 0; t < kChunk; t += 4) {
        const float4 w = ph[t / 4];
        acc += w.x * column[t];
        acc += w.y * column[t + 1];
        acc += w.z * column[t + 2];
        acc += w.w * column[t + 3];
      }
      o[int64_t(h) * latent] = acc;
    }
  }
  }
}

/// Head h's output values [first, first + kColumns) (those below `end`
/// and the latent width) of `attended` entries, by the whole block, into
/// dst[0 .. kColumns). Its kMlaThreads / kColumns groups of kColumns
/// threads split the chunks: thread (g, j) sums chunks g, g + groups, ...
/// ascending for value j, and the groups' sums are added in group order, so
/// each thread has only a few dependent rounds of loads (kLoads at a time).
/// M and L are formed by every block of the head alike. `weights` (shared)
/// holds a float a chunk.
template <class Shape, int kColumns, int kLoads>
__device__ void mlaCombine(const MlaArgs &a, int h, int first, int end,
                           int64_t attended, float *weights, float *dst) {
  constexpr int kChunk = Shape::kChunk;
  constexpr int kGroups = kMlaThreads / kColumns;
  static_assert(kGroups * kColumns == kMlaThreads, "whole groups");
  __shared__ float partials[kWarp];
  __shared__ float sums[kGroups][kColumns];
  const int column = int(threadIdx.x) % kColumns,
            group = int(threadIdx.x) / kColumns;
  const int heads = Shape::heads(a), latent = Shape::latent(a);
  const int j = first + column;
  const bool mine = j < latent && j < end;
  const int chunks = int((attended + kChunk - 1) / kChunk);
  if (chunks == 0) { // nothing attended: the CPU's zeros
    if (group == 0 && mine)
      dst[column] = 0.f;
    return;
  }
  // Partial outputs are loaded kLoads at a time; the first batch, and
  // this thread's first chunk's m and l, are issued together, before the
  // reductions that need them. With 16 groups, 16 a thread cover 256
  // chunks (GLM-5's 2,048 selected entries) in one batch: with 8, a step
  // at 1,025 entries (129 chunks) waited for a second round trip for its
  // last chunk.
  const float *partO = a.partO + int64_t(h) * latent + j;
  const int64_t chunkStride = int64_t(heads) * latent;
  auto loadBatch = [&](int c0, float(&v)[kLoads]) {
#pragma unroll
    for (int b = 0; b < kLoads; ++b) {
      const int c = c0 + b * kGroups;
      v[b] = mine && c < chunks ? partO[c * chunkStride] : 0.f;
    }
  };
  const int t = threadIdx.x;
  const float firstM = t < chunks ? a.partM[t * heads + h] : -INFINITY;
  const float firstL = t < chunks ? a.partL[t * heads + h] : 0.f;
  float v[kLoads];
  loadBatch(group, v);
  // M and L by block reductions (each thread's chunks in ascending order,
  // then a fixed tree); the chunk weights exp(m_c - M) into shared.
  float m = firstM;
  for (int c = t + blockDim.x; c < chunks; c += blockDim.x)
    m = fmaxf(m, a.partM[c * heads + h]);
  m = blockMax(m, partials);
  float l = 0.f;
  if (t < chunks) {
    weights[t] = expf(firstM - m);
    l += firstL * weights[t];
  }
  for (int c = t + blockDim.x; c < chunks; c += blockDim.x) {
    weights[c] = expf(a.partM[c * heads + h] - m);
    l += a.partL[c * heads + h] * weights[c];
  }
  l = blockSum(l, partials); // its barriers also publish the weights
  // Each group's sum in chunk order.
  float acc = 0.f;
  for (int c0 = group; c0 < chunks; c0 += kLoads * kGroups) {
    if (c0 != group)
      loadBatch(c0, v);
#pragma unroll
    for (int b = 0; b < kLoads; ++b) {
      const int c = c0 + b * kGroups;
      if (mine && c < chunks)
        acc += v[b] * weights[c];
    }
  }
  sums[group][column] = acc;
  __syncthreads();
  if (group == 0 && mine) {
    float total = sums[0][column];
    for (int g = 1; g < kGroups; ++g)
      total += sums[g][column];
    dst[column] = total / l;
  }
}

/// MLA's grid barrier (DeviceCommon.cuh gridBarrier) on its arrival words;
/// `parity` is gridBarrierParity's (thread 0's; the others' unused).
__device__ void mlaGridBarrier(const MlaArgs &a, uint32_t parity,
                               unsigned blocks) {
  gridBarrier(a.arrivals, parity, blocks, a.fault);
}

/// The whole of MLA in one kernel of at most one wave (the blocks that fit
/// on the GPU at once), so that every block is resident and they can wait
/// for each other:
///   1. block b takes chunks b, b + grid, ... (mlaChunk);
///   2. the blocks with work wait for every chunk (mlaGridBarrier);
///   3. block b takes combine tasks b, b + grid, ... (mlaCombine).
/// The grid is sized by the most entries a call attends (mlaMostEntries)
/// when the step is captured, so at short contexts most blocks have neither
/// a chunk nor a task: they leave at once and are not waited for. The last
/// block reports the first fault of the inputs (at once when it has no work).
/// One kernel, not a chunk kernel and a combine kernel: the second's launch
/// and wait were most of its 6 us on a GLM-5 layer's critical path.
/// With a projection (a.projQuants) only step 1: mlaProjectKernel, the next
/// kernel, combines and projects, and reports the faults.
/// a.lateDependents: the next kernels are let be scheduled after step 1,
/// not at the start, so that their weights' early prefetch (attn_v_b's,
/// attn_output's 13 MB at GLM-5's tp=8) runs beside the barrier and the
/// combine rather than the chunks' row loads (docs/perf.md, thirty-sixth
/// pass). A block without work lets them at its exit.
template <class Shape>
__global__ void __launch_bounds__(kMlaThreads) mlaKernel(MlaArgs a) {
  constexpr int kChunk = Shape::kChunk;
  extern __shared__ __align__(16) float shared[];
  // a.earlyRows, without a selection: the first chunk's rows but the
  // position's loaded before the wait, under the predecessors
  // (mlaLoadEarlyRows). Compiled into the kernels for fixed heads only:
  // in the others its code took registers enough to spill on sm_100.
  __shared__ int64_t newestRow;
  bool rowsEarly = false;
  if constexpr (Shape::kFixedHeads)
    rowsEarly = !a.selected && a.earlyRows &&
                mlaLoadEarlyRows<Shape>(a, stepInputBeforeWait(a.position),
                                        shared, &newestRow);
  waitForPredecessor();
  if (!a.lateDependents)
    allowDependents();
  const bool chunksOnly = a.projQuants != nullptr;
  // The barrier's count, in flight under the chunks (only thread 0 arrives).
  const uint32_t parity =
      !chunksOnly && threadIdx.x == 0 ? gridBarrierParity(a.arrivals) : 0u;
  // The first chunk's selection entries (within the selection's capacity,
  // so always readable) in flight with the position and the count.
  const int64_t first = int64_t(blockIdx.x) * kChunk;
  int32_t selectedRow = 0;
  if (a.selected && threadIdx.x < kChunk && first + threadIdx.x < a.capacity)
    selectedRow = a.selected[first + threadIdx.x];
  const int64_t attended = mlaAttended(a);
  const int64_t chunks =
      attended > 0 ? (attended + kChunk - 1) / kChunk : 0;
  constexpr int kColumns = Shape::kCombineColumns;
  const int slices = (Shape::latent(a) + kColumns - 1) / kColumns;
  const int tasks = chunksOnly ? 0 : Shape::heads(a) * slices;
  // The same for every block (the same scalars).
  const int64_t wanted =
      attended >= 0 ? (chunks > tasks ? chunks : int64_t(tasks)) : 1;
  const unsigned blocks =
      unsigned(wanted < int64_t(gridDim.x) ? (wanted > 0 ? wanted : 1)
                                           : int64_t(gridDim.x));
  if (blockIdx.x >= blocks) {
    if (!chunksOnly && blockIdx.x == gridDim.x - 1)
      mlaReportFault(a);
    return;
  }
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    if (c != blockIdx.x)
      __syncthreads(); // the previous chunk's rows and scores are read
    mlaChunk<Shape>(a, c, attended, shared, selectedRow, c == blockIdx.x,
                    rowsEarly && c == blockIdx.x ? &newestRow : nullptr);
  }
  if (a.lateDependents)
    allowDependents();
  if (chunksOnly)
    return;
  mlaGridBarrier(a, parity, blocks);
  if (attended >= 0)
    for (int task = blockIdx.x; task < tasks; task += gridDim.x) {
      if (task != int(blockIdx.x))
        __syncthreads(); // the previous task's weights and sums are read
      const int h = task / slices, first = task % slices * kColumns;
      mlaCombine<Shape, kColumns, 16>(
          a, h, first, first + kColumns, attended, shared,
          a.out + int64_t(h) * Shape::latent(a) + first);
    }
  if (blocks == gridDim.x && blockIdx.x == gridDim.x - 1) {
    __syncthreads();
    mlaReportFault(a);
  }
}

/// A head's blocks in mlaProjectKernel: a cluster.
constexpr int kMlaProjectBlocks = 8;

/// MLA's combine and output projection, after mlaKernel's chunks (instead
/// of its grid barrier and combine, which were 4.3 us of its 10 on a GLM-5
/// layer at 1k, then a mat-vec kernel's start): a cluster of
/// kMlaProjectBlocks blocks a head h.
///   1. Block r of the cluster combines the head's output values [r C,
///      r C + C), C = latent / kMlaProjectBlocks, from every chunk's partial
///      results (mlaCombine), into its shared memory.
///   2. After a cluster barrier each block copies the other blocks' values
///      from their shared memory: it holds the head's whole output.
///   3. Block r dots rows r P .. r P + P - 1 of the head's projRows (P their
///      share, rounded up) with it, a thread a Q8_0 block of a row, the
///      row's threads summed by a butterfly within the warp. The first rows'
///      weights are loaded before the wait (weights: never written in a
///      step), so their round trip passes under mlaKernel.
/// At 64 registers a thread (two blocks a multiprocessor) one block fits
/// beside one of mlaKernel's, so the kernel's blocks can start early and
/// load their weights while mlaKernel runs. The grid's last block reports
/// the inputs' first fault (before its wait); with a fault nothing is
/// written.
template <class Shape>
__global__ void __cluster_dims__(kMlaProjectBlocks, 1, 1)
    __launch_bounds__(kMlaThreads, 2) mlaProjectKernel(MlaArgs a) {
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int h = int(blockIdx.x) / kMlaProjectBlocks;
  const int part = int(cluster.block_rank());
  const int latent = Shape::latent(a);
  // mlaProjectionFits: latent / 32 is a power of two up to 32, so a row's
  // threads are lanes of one warp, aligned.
  const int rowThreads = latent / 32;
  const int rowsAtOnce = kMlaThreads / rowThreads;
  const int64_t per =
      (a.projRows + kMlaProjectBlocks - 1) / kMlaProjectBlocks;
  const int64_t rowBegin =
      part * per < a.projRows ? part * per : a.projRows;
  const int64_t rowEnd =
      rowBegin + per < a.projRows ? rowBegin + per : a.projRows;
  const int piece = int(threadIdx.x) % rowThreads;
  auto loadRow = [&](int64_t row, int4 &q0, int4 &q1, uint16_t &d) {
    if (row < rowEnd) {
      const int64_t at = int64_t(h) * a.projRows + row;
      const int4 *q =
          reinterpret_cast<const int4 *>(a.projQuants + at * latent) +
          2 * piece;
      q0 = q[0];
      q1 = q[1];
      d = a.projScales[at * rowThreads + piece];
    }
  };
  // The next kernel (GLM-5: attn_output) may start now, so that its early
  // prefetch of 13 MB runs beside mlaKernel, as it would beside a mat-vec.
  allowDependents();
  int4 q0 = {0, 0, 0, 0}, q1 = {0, 0, 0, 0};
  uint16_t d = 0;
  loadRow(rowBegin + int(threadIdx.x) / rowThreads, q0, q1, d);
  // MLA's inputs are complete before the wait: this kernel starts only once
  // mlaKernel's blocks have passed their own wait (mlaKernel lets its
  // dependents start after it). So the count is read, and the last block
  // checks the inputs, while mlaKernel runs (the check reads the whole
  // selection: ~3 us, which after the combine would end the kernel late).
  const int64_t attended = mlaAttended(a);
  if (blockIdx.x == gridDim.x - 1)
    mlaReportFault(a);
  waitForPredecessor();
  extern __shared__ __align__(16) float shared[];
  float *x = shared;                              // [latent]
  float *weights = shared + (latent + 3) / 4 * 4; // [chunks]
  if (attended >= 0) {
    const int columns = latent / kMlaProjectBlocks;
    const int first = part * columns;
    constexpr int kColumns = Shape::kLatentWidth / kMlaProjectBlocks;
    if constexpr (kColumns > 0 &&
                  kMlaThreads % (kColumns > 0 ? kColumns : 1) == 0)
      // GLM-5: 64 values a block, 8 groups of 64 threads; 32 loads a thread
      // take 256 chunks (2,048 entries) in one round trip.
      mlaCombine<Shape, kColumns, 32>(a, h, first, first + columns, attended,
                                      weights, x + first);
    else
      for (int c0 = first; c0 < first + columns; c0 += kMlaCombineColumns) {
        if (c0 != first)
          __syncthreads(); // the previous slice's weights and sums are read
        mlaCombine<Shape, kMlaCombineColumns, 16>(
            a, h, c0, first + columns, attended, weights, x + c0);
      }
    cluster.sync(); // every block's values are in its shared memory
    for (int j = threadIdx.x; j < latent; j += blockDim.x) {
      const int owner = j / columns;
      if (owner != part)
        x[j] = cluster.map_shared_rank(x, owner)[j];
    }
    cluster.sync(); // the copies are done: no block's values are read again
    for (int64_t r0 = rowBegin; r0 < rowEnd; r0 += rowsAtOnce) {
      const int64_t row = r0 + int(threadIdx.x) / rowThreads;
      if (r0 != rowBegin)
        loadRow(row, q0, q1, d);
      // The piece's 32 values, four at a time, starting at a rotation by
      // the piece so that a warp's lanes read different banks.
      const float4 *xs = reinterpret_cast<const float4 *>(x + 32 * piece);
      const uint32_t words[8] = {uint32_t(q0.x), uint32_t(q0.y),
                                 uint32_t(q0.z), uint32_t(q0.w),
                                 uint32_t(q1.x), uint32_t(q1.y),
                                 uint32_t(q1.z), uint32_t(q1.w)};
      float sum = 0.f;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const int at = (k + piece) % 8;
        const float4 v = xs[at];
        uint32_t w = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i)
          w = i == at ? words[i] : w;
        sum += float(int8_t(w)) * v.x;
        sum += float(int8_t(w >> 8)) * v.y;
        sum += float(int8_t(w >> 16)) * v.z;
        sum += float(int8_t(w >> 24)) * v.w;
      }
      float y = halfBitsToFloat(d) * sum;
      for (int offset = rowThreads / 2; offset > 0; offset /= 2)
        y += __shfl_xor_sync(0xffffffffu, y, offset);
      if (piece == 0 && row < rowEnd)
        a.out[int64_t(h) * a.projRows + row] = y;
    }
  }
}

//===----------------------------------------------------------------------===//
// DSA indexer: scores (one warp per position), then the selection (one
// block: a radix select of the topK-th score, then the chosen positions in
// order). When every attended position is selected (position + 1 <= topK:
// GLM-5 below 2,048 positions) no score is needed: the score kernel returns
// at once and the selection writes 0 .. position.
//===----------------------------------------------------------------------===//

struct IndexerArgs {
  const float *q;
  int64_t heads, dim;
  const float *headWeights;
  DeviceCache cache;
  const int32_t *position;
  int64_t topK;
  float scale;
  float *scores;
  int32_t *selected, *count;
  FaultSink fault;
  /// The query's rotation (ropeDims 0: none) and its host frequencies.
  RopeStyle ropeStyle;
  float ropeTheta;
  int64_t ropeOffset, ropeDims;
  RopeFrequencies ropeFreq;
  /// The selection by one block up to this many attended positions (its
  /// keys in the launch's dynamic shared memory); 0: always the cluster's.
  int64_t oneBlockPositions = 0;
  /// The radix passes stop once T is known by its top bits.
  bool earlyStop = true;
};

/// The cosines and sines of the query's rope pairs at `position`, into
/// shared memory when the host tabled the frequencies (the whole block
/// calls it; the caller's next barrier publishes them); false when each
/// use computes its own (more pairs than the table holds).
/// The cosine and sine of one rope angle for the indexer's query, out of
/// line: the angle (up to the context's length in radians) is reduced to
/// [-pi, pi] in double, then sincosf (a few float ulp from the rounded
/// double cos and sin of the CPU and of the rope kernels; the indexer's
/// checks compare with the CPU's rope). Every score block computes its
/// query's angles,
/// and double sincos there cost GLM-5's indexer 3.4 us at 16k positions
/// (26.9 -> 30.4 us; this way 28.7 us).
__device__ __noinline__ void ropeAngle(double angle, float *c, float *s) {
  constexpr double kTwoPi = 6.283185307179586;
  const float r = float(angle - kTwoPi * rint(angle / kTwoPi));
  sincosf(r, s, c);
}

__device__ bool queryRopeTable(const IndexerArgs &a, int32_t position,
                               float *cosines, float *sines) {
  const int pairs = int(a.ropeDims / 2);
  if (a.ropeFreq.pairs != pairs)
    return false;
  for (int i = threadIdx.x; i < pairs; i += blockDim.x)
    ropeAngle(double(position) * a.ropeFreq.inverse[i], cosines + i, sines + i);
  return true;
}

/// Pair i's cosine and sine, from the table or computed as ropeKernel does.
__device__ inline void queryRopeAngle(const IndexerArgs &a, int64_t i,
                                      int32_t position, bool table,
                                      const float *cosines, const float *sines,
                                      float &c, float &s) {
  if (table) {
    c = cosines[i];
    s = sines[i];
    return;
  }
  ropeAngle(double(position) *
                pow(double(a.ropeTheta), -2.0 * double(i) / double(a.ropeDims)),
            &c, &s);
}

/// Query value j of a head row `qh`, rotated as launchRope would write it.
__device__ inline float ropedQuery(const IndexerArgs &a, const float *qh,
                                   int64_t j, int32_t position, bool table,
                                   const float *cosines, const float *sines) {
  const int64_t rel = j - a.ropeOffset;
  if (a.ropeDims == 0 || rel < 0 || rel >= a.ropeDims)
    return qh[j];
  const int64_t half = a.ropeDims / 2;
  const bool interleaved = a.ropeStyle == RopeStyle::Interleaved;
  const int64_t i = interleaved ? rel / 2 : rel < half ? rel : rel - half;
  const bool isFirst = interleaved ? rel % 2 == 0 : rel < half;
  int64_t first, second;
  ropePair(a.ropeStyle, a.ropeOffset, a.ropeDims, i, first, second);
  float c, s;
  queryRopeAngle(a, i, position, table, cosines, sines, c, s);
  const float x0 = qh[first], x1 = qh[second];
  return isFirst ? x0 * c - x1 * s : x0 * s + x1 * c;
}

/// NaN ranks below everything (the CPU's rankable()).
__device__ inline float rankable(float v) { return isnan(v) ? -INFINITY : v; }

/// Whether a score kernel has anything to do at the step's position (read
/// before its wait: stepInputBeforeWait); false for a position outside the
/// cache (block 0 reports it: PositionOutOfRange) or every attended
/// position selected (position + 1 <= topK: the selection writes them in
/// order and reads no score).
__device__ inline bool positionToScore(const IndexerArgs &a,
                                       int32_t position) {
  if (position < 0 || position >= a.cache.positions) {
    if (blockIdx.x == 0 && threadIdx.x == 0)
      recordFault(a.fault, FaultCode::PositionOutOfRange, position,
                  a.cache.positions);
    return false;
  }
  return int64_t(position) + 1 > a.topK;
}

/// score[t] = scale * sum_h w[h] * relu(q[h] . key[t]), heads ascending;
/// warps grid-stride over t <= position. Each warp reads one key row per
/// head (cached after the first) and q.
__global__ void indexerScoresKernel(IndexerArgs a) {
  const int32_t position = stepInputBeforeWait(a.position);
  stepKernelPrologue();
  if (!positionToScore(a, position))
    return;
  __shared__ float cosines[kRopeTablePairs], sines[kRopeTablePairs];
  const bool table =
      a.ropeDims > 0 && queryRopeTable(a, position, cosines, sines);
  __syncthreads(); // the table is written
  const int lane = threadIdx.x % kWarp;
  for (int64_t t = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
       t <= position; t += int64_t(gridDim.x) * kWarpsPerBlock) {
    const int64_t row = t * a.dim;
    float sum = 0.f;
    for (int64_t h = 0; h < a.heads; ++h) {
      const float *qh = a.q + h * a.dim;
      float dot = 0.f;
      for (int64_t j = lane; j < a.dim; j += kWarp)
        dot += ropedQuery(a, qh, j, position, table, cosines, sines) *
               readCache(a.cache.data, a.cache.type, row + j);
      dot = warpSum(dot);
      // std::max(dot, 0.f): a NaN dot stays NaN.
      sum += a.headWeights[h] * (dot < 0.f ? 0.f : dot);
    }
    if (lane == 0)
      a.scores[t] = a.scale * sum;
  }
}

/// Positions a warp of indexerScoresByHeadKernel scores together.
constexpr int kScorePositions = 4;

/// Up to kStageLoads 16-byte loads a lane of cache values, in registers
/// between loadCacheRows and storeCacheRows, so a warp can load the next
/// rows while it works on the current ones.
constexpr int kStageLoads = 4;
struct StagedRows {
  uint4 v[kStageLoads];
};

/// Values a 16-byte load of a cache holds (8 f16 / bf16, 4 f32).
__device__ inline int valuesPerLoad(CacheType type) {
  return type == CacheType::F32 ? 4 : 8;
}

/// The calling warp's loads of cache values [first, first + count) (first
/// and count multiples of valuesPerLoad, count at most kStageLoads * 32
/// loads' worth), all issued before any is used.
__device__ inline void loadCacheRows(const DeviceCache &c, int64_t first,
                                     int count, StagedRows &r) {
  const int lane = threadIdx.x % kWarp, per = valuesPerLoad(c.type);
  const uint4 *src = c.type == CacheType::F32
                         ? reinterpret_cast<const uint4 *>(
                               static_cast<const float *>(c.data) + first)
                         : reinterpret_cast<const uint4 *>(
                               static_cast<const uint16_t *>(c.data) + first);
#pragma unroll
  for (int i = 0; i < kStageLoads; ++i) {
    const int g = lane + i * kWarp;
    if (g < count / per)
      r.v[i] = src[g];
  }
}

/// loadCacheRows' values as floats into dst (16-byte aligned); f16 as
/// halfBitsToOperand. With a pitch, the values are rows of `dim` (a multiple
/// of 8) and row i goes to dst + i * pitch.
__device__ inline void storeCacheRows(CacheType type, int count,
                                      const StagedRows &r, float *dst,
                                      int dim = 0, int pitch = 0) {
  const int lane = threadIdx.x % kWarp, per = valuesPerLoad(type);
#pragma unroll
  for (int i = 0; i < kStageLoads; ++i) {
    const int g = lane + i * kWarp;
    if (g >= count / per)
      continue;
    const int at = pitch > 0 ? per * g / dim * pitch + per * g % dim : per * g;
    if (type == CacheType::F32) {
      *reinterpret_cast<uint4 *>(dst + at) = r.v[i];
      continue;
    }
    const uint32_t w[4] = {r.v[i].x, r.v[i].y, r.v[i].z, r.v[i].w};
    float out[8];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t lo = w[k] & 0xFFFFu, hi = w[k] >> 16;
      out[2 * k] = type == CacheType::F16 ? halfBitsToOperand(uint16_t(lo))
                                          : __uint_as_float(lo << 16);
      out[2 * k + 1] = type == CacheType::F16
                           ? halfBitsToOperand(uint16_t(hi))
                           : __uint_as_float(hi << 16);
    }
    float4 *d = reinterpret_cast<float4 *>(dst + at);
    d[0] = make_float4(out[0], out[1], out[2], out[3]);
    d[1] = make_float4(out[4], out[5], out[6], out[7]);
  }
}

/// Stages the indexer's query for the score kernels that read it from
/// shared memory: q as heads rows of `pitch` floats (rotated in place by
/// the step's rope) and the head weights. The whole block calls it; its
/// last barrier publishes them.
__device__ void stageIndexerQuery(const IndexerArgs &a, int32_t position,
                                  float *q, float *w, int pitch) {
  const int heads = int(a.heads), dim = int(a.dim);
  // The rotation's angles (double sines and cosines) while q arrives.
  __shared__ float cosines[kRopeTablePairs], sines[kRopeTablePairs];
  const bool table =
      a.ropeDims > 0 && queryRopeTable(a, position, cosines, sines);
  // q by 16-byte loads, four a thread in flight together.
  {
    const int quads = heads * dim / 4, rowQuads = dim / 4;
    const float4 *q4 = reinterpret_cast<const float4 *>(a.q);
    for (int i0 = 0; i0 < quads; i0 += 4 * int(blockDim.x)) {
      float4 v[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int i = i0 + int(threadIdx.x) + k * int(blockDim.x);
        if (i < quads)
          v[k] = q4[i];
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int i = i0 + int(threadIdx.x) + k * int(blockDim.x);
        if (i < quads)
          *reinterpret_cast<float4 *>(q + (i / rowQuads) * pitch +
                                      4 * (i % rowQuads)) = v[k];
      }
    }
  }
  if (a.ropeDims > 0) {
    // The staged rows rotated in place, one thread a pair.
    __syncthreads(); // q and the angles are staged
    const int pairs = int(a.ropeDims / 2);
    for (int idx = threadIdx.x; idx < heads * pairs; idx += blockDim.x) {
      const int h = idx / pairs, i = idx % pairs;
      int64_t first, second;
      ropePair(a.ropeStyle, a.ropeOffset, a.ropeDims, i, first, second);
      float c, sn;
      queryRopeAngle(a, i, position, table, cosines, sines, c, sn);
      float *row = q + h * pitch;
      rotatePair(row[first], row[second], c, sn);
    }
  }
  for (int h = threadIdx.x; h < heads; h += blockDim.x)
    w[h] = a.headWeights[h];
  __syncthreads();
}

/// The same scores with the heads across the lanes: a block stages q (rows
/// padded by four floats, so the lanes' 16-byte reads of their rows hit
/// distinct banks) and the head weights in shared memory; a warp stages
/// kScorePositions key rows at a time, then lane l sums w[h] * relu(q[h] .
/// key) over its heads h = l, l + 32, ... for each of them (each q load
/// serves every staged row; the key reads are broadcasts) and one
/// butterfly a position adds the lanes. Per position and head the dot is
/// a one-row loop's (dims ascending), each product and sum one fused
/// multiply-add: the dots are most of the kernel's instructions, and this
/// file is built without contraction (--fmad=false), so a product and its
/// sum would be two (GLM-5 at 16k: 8.4 M warp instructions, 512 a
/// position). Scores differ from the CPU's by rounding, as the head sums'
/// order already makes them; the selection is exact where the scores'
/// gaps exceed it (GLM5.md section 7). Needs dim % 8 == 0 and q and the
/// cache 16-byte aligned. Dynamic shared memory: heads *
/// (dim + 4) + heads rounded up to 4 + warps * kScorePositions * dim
/// floats.
__global__ void indexerScoresByHeadKernel(IndexerArgs a) {
  extern __shared__ __align__(16) float staged[];
  const int32_t position = stepInputBeforeWait(a.position);
  stepKernelPrologue();
  if (!positionToScore(a, position))
    return;
  constexpr int P = kScorePositions;
  const int heads = int(a.heads), dim = int(a.dim), pitch = dim + 4;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  float *q = staged, *w = staged + heads * pitch;
  float *keys = w + (heads + 3) / 4 * 4 + warp * P * dim;
  const int64_t attended = int64_t(position) + 1;
  const int64_t stride = int64_t(gridDim.x) * warps * P;
  // Rows t0 .. t0 + n - 1 are back to back in the cache (the rows past n
  // keep stale values: their sums are never written). The first group's
  // rows are asked for before anything else, so their memory round trip
  // passes under q's staging and the query's rotation; each next group's
  // while this one's are scored.
  auto rowsOf = [&](int64_t t) {
    return int(attended - t < P ? attended - t : P);
  };
  StagedRows next;
  int64_t t0 = (int64_t(blockIdx.x) * warps + warp) * P;
  if (t0 < attended)
    loadCacheRows(a.cache, t0 * dim, rowsOf(t0) * dim, next);
  stageIndexerQuery(a, position, q, w, pitch);
  for (; t0 < attended; t0 += stride) {
    const int n = rowsOf(t0);
    storeCacheRows(a.cache.type, n * dim, next, keys);
    if (t0 + stride < attended)
      loadCacheRows(a.cache, (t0 + stride) * dim, rowsOf(t0 + stride) * dim,
                    next);
    __syncwarp();
    float sum[P];
#pragma unroll
    for (int p = 0; p < P; ++p)
      sum[p] = 0.f;
    for (int h = lane; h < heads; h += kWarp) {
      const float4 *qh = reinterpret_cast<const float4 *>(q + h * pitch);
      float dot[P];
#pragma unroll
      for (int p = 0; p < P; ++p)
        dot[p] = 0.f;
#pragma unroll 4
      for (int j = 0; j < dim / 4; ++j) {
        const float4 qv = qh[j];
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const float4 kv = reinterpret_cast<const float4 *>(keys + p * dim)[j];
          dot[p] = fmaf(qv.x, kv.x, dot[p]);
          dot[p] = fmaf(qv.y, kv.y, dot[p]);
          dot[p] = fmaf(qv.z, kv.z, dot[p]);
          dot[p] = fmaf(qv.w, kv.w, dot[p]);
        }
      }
      const float wh = w[h];
#pragma unroll
      for (int p = 0; p < P; ++p) // std::max(dot, 0.f): NaN stays NaN
        sum[p] += wh * (dot[p] < 0.f ? 0.f : dot[p]);
    }
#pragma unroll
    for (int p = 0; p < P; ++p)
      sum[p] = warpSum(sum[p]);
    if (lane < n)
#pragma unroll
      for (int p = 0; p < P; ++p)
        if (p == lane)
          a.scores[t0 + p] = a.scale * sum[p];
    __syncwarp(); // the key rows are rewritten next
  }
}

/// Lanes of a group, heads a lane and positions a group of
/// indexerScoresByGroupKernel: 4 groups of 8 lanes, 4 heads a lane (32
/// heads: GLM-5's), 2 positions a group, so 8 positions a warp at a time.
constexpr int kGroupLanes = 8, kGroupHeads = 4, kGroupPositions = 2;
constexpr int kGroups = kWarp / kGroupLanes;
constexpr int kGroupRows = kGroups * kGroupPositions;
constexpr int kGroupedHeads = kGroupLanes * kGroupHeads;

/// indexerScoresByHeadKernel with each shared-memory read serving more
/// products: lane l of group g = l / 8 takes heads h = l % 8 + 8 s (s < 4)
/// and the group's rows g and g + 4 of the warp's 8 staged key rows (rows
/// padded by four floats, so that the groups' reads of four consecutive
/// rows, like the lanes' reads of eight q rows 8 apart, hit distinct
/// banks). A step of four dims is four q reads and two key reads for 32
/// fused multiply-adds (the kernel by head: five reads for 16, and those
/// reads its bound). Each lane adds w[h] * relu(dot) over its heads in s
/// order, then the group's 8 lanes by butterflies: the scores differ from
/// the by-head kernel's by the order of the head sums (rounding). For heads
/// == 32, dim % 8 == 0, a warp's 8 rows in kStageLoads loads a lane (f16 /
/// bf16 rows of up to 128 values), q and the cache 16-byte aligned. Dynamic
/// shared memory: (heads + warps * 8) * (dim + 4) + heads floats. kDim > 0:
/// compiled for that dim (ModelShapes.h: GLM-5's 128; family indexer), the
/// same products in the same order.
template <int kDim = 0>
__global__ void indexerScoresByGroupKernel(IndexerArgs a) {
  extern __shared__ __align__(16) float staged[];
  const int32_t position = stepInputBeforeWait(a.position);
  stepKernelPrologue();
  if (!positionToScore(a, position))
    return;
  const int dim = kDim > 0 ? kDim : int(a.dim), pitch = dim + 4;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  const int group = lane / kGroupLanes, hq = lane % kGroupLanes;
  float *q = staged, *w = staged + kGroupedHeads * pitch;
  float *keys = w + kGroupedHeads + warp * kGroupRows * pitch;
  const int64_t attended = int64_t(position) + 1;
  const int64_t stride = int64_t(gridDim.x) * warps * kGroupRows;
  auto rowsOf = [&](int64_t t) {
    return int(attended - t < kGroupRows ? attended - t : kGroupRows);
  };
  // The warp's rows (kStageLoads loads a lane at most): the first group's
  // before q is staged, each next group's while this one's are scored.
  StagedRows next;
  auto load = [&](int64_t t) {
    loadCacheRows(a.cache, t * dim, rowsOf(t) * dim, next);
  };
  // Warp w of block b takes group w G + b (G blocks) first: the grid is
  // sized for the cache's capacity, and this order spreads a shorter
  // context's groups over every block, not over the first few.
  int64_t t0 = (int64_t(warp) * gridDim.x + blockIdx.x) * kGroupRows;
  if (t0 < attended)
    load(t0);
  stageIndexerQuery(a, position, q, w, pitch);
  float wh[kGroupHeads];
#pragma unroll
  for (int s = 0; s < kGroupHeads; ++s)
    wh[s] = w[hq + kGroupLanes * s];
  for (; t0 < attended; t0 += stride) {
    const int n = rowsOf(t0);
    storeCacheRows(a.cache.type, n * dim, next, keys, dim, pitch);
    if (t0 + stride < attended)
      load(t0 + stride);
    __syncwarp();
    float dot[kGroupHeads][kGroupPositions];
#pragma unroll
    for (int s = 0; s < kGroupHeads; ++s)
#pragma unroll
      for (int p = 0; p < kGroupPositions; ++p)
        dot[s][p] = 0.f;
#pragma unroll 2
    for (int j = 0; j < dim / 4; ++j) {
      float4 qv[kGroupHeads], kv[kGroupPositions];
#pragma unroll
      for (int s = 0; s < kGroupHeads; ++s)
        qv[s] = reinterpret_cast<const float4 *>(q + (hq + kGroupLanes * s) *
                                                         pitch)[j];
#pragma unroll
      for (int p = 0; p < kGroupPositions; ++p)
        kv[p] = reinterpret_cast<const float4 *>(keys + (group + kGroups * p) *
                                                            pitch)[j];
#pragma unroll
      for (int s = 0; s < kGroupHeads; ++s)
#pragma unroll
        for (int p = 0; p < kGroupPositions; ++p) {
          dot[s][p] = fmaf(qv[s].x, kv[p].x, dot[s][p]);
          dot[s][p] = fmaf(qv[s].y, kv[p].y, dot[s][p]);
          dot[s][p] = fmaf(qv[s].z, kv[p].z, dot[s][p]);
          dot[s][p] = fmaf(qv[s].w, kv[p].w, dot[s][p]);
        }
    }
    float sum[kGroupPositions];
#pragma unroll
    for (int p = 0; p < kGroupPositions; ++p) {
      sum[p] = 0.f;
#pragma unroll
      for (int s = 0; s < kGroupHeads; ++s) // std::max(dot, 0.f): NaN stays
        sum[p] += wh[s] * (dot[s][p] < 0.f ? 0.f : dot[s][p]);
    }
    // Lanes kSpread p .. kSpread (p + 1) - 1 of the group hold row group +
    // 4 p's sum.
    constexpr int kSpread = kGroupLanes / kGroupPositions;
    const float total =
        quantdot::spreadSums<kGroupPositions, kGroupLanes / 2>(sum, lane);
    const int row = group + kGroups * (hq / kSpread);
    if (hq % kSpread == 0 && row < n)
      a.scores[t0 + row] = a.scale * total;
    __syncwarp(); // the key rows are rewritten next
  }
}

/// GLM-5's indexer scores on the tensor cores: 32 heads of 128 values, f16
/// keys. The dots S[t][h] = key[t] . q[h] are one mma.sync m16n8k16 (f16
/// in, f32 sums) per 16 positions, 8 heads and 16 values; keys are f16
/// already, and each head's query, rotated (mmaIndexerQuery), is scaled by
/// a power of two (2^e_h: its largest |value| into [2^14, 2^15)) and split
/// into two f16 parts, hi = f16(q 2^e_h) and lo = f16(q 2^e_h - hi), which
/// hold it to about 2^-23 of that largest value: both parts go through the
/// same sums, and 2^-e_h scales the dot back exactly. The result is the
/// f32 dot but for rounding, which the tensor cores' sums do in their own
/// order: the selection is exact where the scores' gaps exceed it (GLM5.md
/// section 7), as for the other score kernels, whose head order already
/// differs from the CPU's.
///
/// A warp takes tiles of 16 positions: lane (g, t) (g = lane / 4, t = lane
/// % 4) loads values [32 t, 32 t + 32) of key rows g and g + 8 (four
/// 16-byte loads a row, issued before the query is staged) and feeds them
/// as the A operand, K step s taking values 32 t + 4 s .. + 3: the dot's
/// 128 values in a permuted order, which the query's B operand follows
/// (mmaIndexerQuery). The C operand's lane (g, t) holds heads 8 n + 2 t and
/// + 1 of positions g and g + 8 (n < 4); the lane sums w[h] relu(dot) over
/// its 8 heads in n order, and two butterflies add the 4 lanes of a
/// position (the same bits in each). Dynamic shared memory:
/// kIndexerMmaShared bytes.
constexpr int kMmaHeads = 32, kMmaDim = 128, kMmaTile = 16;
constexpr int kMmaSteps = kMmaDim / 16, kMmaHeadTiles = kMmaHeads / 8;
/// Its threads: 8 warps, 4 heads each while the query is staged.
constexpr int kMmaThreads = 256;
static_assert(kMmaHeads % (kMmaThreads / kWarp) == 0 && kMmaDim == 4 * kWarp,
              "a warp stages whole heads, 4 values a lane");
/// The head weights, the heads' scales back, then the B fragments as uint4
/// [n][s][lane].
constexpr size_t kIndexerMmaShared =
    sizeof(float) * 2 * kMmaHeads +
    sizeof(uint4) * kMmaHeadTiles * kMmaSteps * kWarp;

/// The cosines and sines of the two rope pairs of a lane's four query
/// values (lane / 4 and lane % 4 as mmaIndexerQuery's staging), or none
/// (roped false) where its values are past the rope's dims.
struct MmaAngles {
  bool roped;
  float c0, s0, c1, s1;
};

__device__ MmaAngles mmaQueryAngles(const IndexerArgs &a, int32_t position) {
  const int lane = threadIdx.x % kWarp;
  const int j = 32 * (lane % 4) + 4 * (lane / 4);
  const int64_t rel = int64_t(j) - a.ropeOffset;
  MmaAngles r{a.ropeDims > 0 && rel >= 0 && rel < a.ropeDims, 1.f, 0.f, 1.f,
              0.f};
  if (r.roped) {
    const int i = int(rel / 2);
    ropeAngle(double(position) * a.ropeFreq.inverse[i], &r.c0, &r.s0);
    ropeAngle(double(position) * a.ropeFreq.inverse[i + 1], &r.c1, &r.s1);
  }
  return r;
}

/// The query as the mma's B fragments, by warp w for heads 4 w .. 4 w + 3:
/// lane (s, t) = (lane / 4, lane % 4) loads values j = 32 t + 4 s .. + 3 of
/// head h (a 16-byte load; the warp reads the head's row whole), rotates
/// its two pairs when they are in the rope's span (interleaved pairs, by
/// the lane's angles r from mmaQueryAngles: the same call and products as
/// stageIndexerQuery's), finds the head's largest |value| by butterflies
/// (so every lane holds it and its exponent e), and writes hi and lo of x
/// 2^e as frags[n][s][4 g + t] (head h = 8 n + g; uint4: hi b0, hi b1, lo
/// b0, lo b1), w[h] and 2^-e into back[h]. No block barrier inside; the
/// caller's follows. Needs the rope, if any, interleaved, its offset and
/// width multiples of 4, and the host's table of frequencies.
__device__ void mmaIndexerQuery(const IndexerArgs &a, const MmaAngles &r,
                                uint4 *frags, float *w, float *back) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int s = lane / 4, t = lane % 4, j = 32 * t + 4 * s;
  constexpr int kPerWarp = kMmaHeads / (kMmaThreads / kWarp);
  // Every head's values in flight together.
  float4 v[kPerWarp];
  float wv[kPerWarp];
#pragma unroll
  for (int k = 0; k < kPerWarp; ++k) {
    const int h = warp * kPerWarp + k;
    v[k] = *reinterpret_cast<const float4 *>(a.q + h * kMmaDim + j);
    wv[k] = lane == 0 ? a.headWeights[h] : 0.f;
  }
#pragma unroll
  for (int k = 0; k < kPerWarp; ++k) {
    const int h = warp * kPerWarp + k;
    float x[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
    if (r.roped) {
      rotatePair(x[0], x[1], r.c0, r.s0);
      rotatePair(x[2], x[3], r.c1, r.s1);
    }
    // The head's largest |value|; a NaN anywhere makes it NaN.
    float m = 0.f;
#pragma unroll
    for (int q = 0; q < 4; ++q)
      m = maxKeepingNaN(m, fabsf(x[q]));
    for (int o = kWarp / 2; o > 0; o /= 2)
      m = maxKeepingNaN(m, __shfl_xor_sync(kFullMask, m, o));
    const int e = mmaQueryExponent(m);
    const float up = powerOfTwo(e);
    float hi[4], lo[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float y = x[q] * up; // exact: a power of two in range
      hi[q] = __half2float(__float2half_rn(y));
      // Exact: hi is y rounded to 11 bits (an infinite hi carries y alone).
      lo[q] = isinf(hi[q]) ? 0.f : y - hi[q];
    }
    const int n = h / 8, g = h % 8;
    frags[(n * kMmaSteps + s) * kWarp + 4 * g + t] =
        make_uint4(halfPair(hi[0], hi[1]), halfPair(hi[2], hi[3]),
                   halfPair(lo[0], lo[1]), halfPair(lo[2], lo[3]));
    if (lane == 0) {
      w[h] = wv[k];
      back[h] = powerOfTwo(-e);
    }
  }
}

/// Key rows g and g + 8 of the tile at t0, values [32 t, 32 t + 32) of each
/// (zeros past the attended positions).
struct MmaKeys {
  uint4 row[2][4];
};

__device__ __forceinline__ void loadMmaKeys(const IndexerArgs &a, int64_t t0,
                                            int64_t attended, MmaKeys &k) {
  const int lane = threadIdx.x % kWarp;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = t0 + g + 8 * r;
    const uint4 *src = reinterpret_cast<const uint4 *>(
        static_cast<const uint16_t *>(a.cache.data) + row * kMmaDim +
        32 * t);
#pragma unroll
    for (int m = 0; m < 4; ++m)
      k.row[r][m] = row < attended ? src[m] : make_uint4(0, 0, 0, 0);
  }
}

__global__ void __launch_bounds__(kMmaThreads)
    indexerScoresMmaKernel(IndexerArgs a) {
  extern __shared__ __align__(16) float staged[];
  // The position and the query's rope angles before the wait for the
  // query. Nothing leaves before the wait, even with nothing to score: a
  // kernel that completes without waiting would let its successor on the
  // branch pass its own wait while this one's predecessor still runs.
  const int32_t position = stepInputBeforeWait(a.position);
  const MmaAngles angles = mmaQueryAngles(a, position);
  stepKernelPrologue();
  if (!positionToScore(a, position))
    return;
  float *w = staged, *back = w + kMmaHeads;
  uint4 *frags = reinterpret_cast<uint4 *>(back + kMmaHeads);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  const int g = lane / 4, t = lane % 4;
  const int64_t attended = int64_t(position) + 1;
  const int64_t tiles = (attended + kMmaTile - 1) / kMmaTile;
  // Warp w of block b takes tile w G + b first (as the kernel by groups).
  int64_t tile = int64_t(warp) * gridDim.x + blockIdx.x;
  const int64_t stride = int64_t(gridDim.x) * warps;
  MmaKeys keys;
  if (tile < tiles)
    loadMmaKeys(a, tile * kMmaTile, attended, keys);
  mmaIndexerQuery(a, angles, frags, w, back);
  __syncthreads();
  float wh[kMmaHeadTiles][2], bh[kMmaHeadTiles][2];
#pragma unroll
  for (int n = 0; n < kMmaHeadTiles; ++n)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      wh[n][c] = w[8 * n + 2 * t + c];
      bh[n][c] = back[8 * n + 2 * t + c];
    }
  for (; tile < tiles; tile += stride) {
    const int64_t t0 = tile * kMmaTile;
    float d[kMmaHeadTiles][4];
#pragma unroll
    for (int n = 0; n < kMmaHeadTiles; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        d[n][c] = 0.f;
#pragma unroll
    for (int s = 0; s < kMmaSteps; ++s) {
      const int m = s / 2, o = 2 * (s % 2);
      const auto word = [&](const uint4 &v, int i) {
        return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
      };
      const uint32_t af[4] = {word(keys.row[0][m], o), word(keys.row[1][m], o),
                              word(keys.row[0][m], o + 1),
                              word(keys.row[1][m], o + 1)};
#pragma unroll
      for (int n = 0; n < kMmaHeadTiles; ++n) {
        const uint4 b = frags[(n * kMmaSteps + s) * kWarp + lane];
        mmaHalf(d[n], af, b.x, b.y);
        mmaHalf(d[n], af, b.z, b.w);
      }
    }
    if (tile + stride < tiles)
      loadMmaKeys(a, (tile + stride) * kMmaTile, attended, keys);
    // Positions g (d[.][0..1]) and g + 8 (d[.][2..3]).
    float sum[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < kMmaHeadTiles; ++n)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float dot = d[n][2 * r + c] * bh[n][c];
          // std::max(dot, 0.f): a NaN dot stays NaN.
          sum[r] += wh[n][c] * (dot < 0.f ? 0.f : dot);
        }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      sum[r] += __shfl_xor_sync(kFullMask, sum[r], 1);
      sum[r] += __shfl_xor_sync(kFullMask, sum[r], 2);
      const int64_t row = t0 + g + 8 * r;
      if (t == 0 && row < attended)
        a.scores[row] = a.scale * sum[r];
    }
  }
}

/// A score as an unsigned key in the order the ranking uses: a larger score
/// has a larger key; NaN ranks lowest (as -inf, rankable); -0 equals +0, as
/// the CPU's comparisons have it.
__device__ inline uint32_t rankKey(float v) {
  v = rankable(v);
  if (v == 0.f)
    v = 0.f;
  const uint32_t bits = __float_as_uint(v);
  return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

/// A radix select's place between passes, the same in every thread of a
/// block: the top bits of T found so far (prefix, under mask), the number
/// of keys still needed among those that have them, and how many keys have
/// them (after the last pass: the keys equal to T).
struct RadixState {
  uint32_t prefix, mask;
  int64_t need, equal;
};

/// Ends a pass of a radix select whose counts of the digit at `shift` are
/// in counts[256] once the block reaches the barrier: warp 0 finds the
/// digit where the count of keys from the top reaches `need` (lane l holds
/// digits 255 - 8 l down to 248 - 8 l; the lanes below it hold the higher
/// ones) into `found` (shared memory), and after another barrier every
/// thread takes it into its state.
__device__ inline void takeDigit(const unsigned *counts, int shift,
                                 RadixState &found, RadixState &state) {
  __syncthreads();
  if (threadIdx.x < kWarp) {
    const int lane = threadIdx.x;
    unsigned c[8], sum = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      c[j] = counts[255 - 8 * lane - j];
      sum += c[j];
    }
    unsigned inclusive = sum;
    for (int d = 1; d < kWarp; d *= 2) {
      const unsigned below = __shfl_up_sync(kFullMask, inclusive, d);
      if (lane >= d)
        inclusive += below;
    }
    const int64_t above = int64_t(inclusive - sum);
    if (above < state.need && state.need <= above + int64_t(sum)) {
      int64_t acc = above;
      for (int j = 0; j < 8; ++j) {
        if (acc + int64_t(c[j]) >= state.need) {
          found.prefix =
              state.prefix | uint32_t(255 - 8 * lane - j) << shift;
          found.need = state.need - acc;
          found.equal = int64_t(c[j]);
          break;
        }
        acc += c[j];
      }
    }
  }
  __syncthreads();
  state.prefix = found.prefix;
  state.need = found.need;
  state.equal = found.equal;
  state.mask |= 255u << shift;
}

/// Copies of the one-block selection's histogram (warp w counts into copy
/// w % kSelectCopies), so that the 32 warps' counts of the digits most keys
/// share do not all land on one shared-memory word.
constexpr int kSelectCopies = 8;
/// Each copy's bins a bank over from the last.
constexpr int kSelectStride = 257;
/// Keys a thread takes a round of the one-block selection's sweeps, their
/// loads issued together.
constexpr int kSweepUnroll = 4;

/// Calls fn(key, valid, index) for the `n` keys load(0 .. n - 1),
/// kSweepUnroll a thread a round (invalid: past n, valid false).
template <typename Load, typename Fn>
__device__ __forceinline__ void sweepKeys(int n, Load load, Fn fn) {
  const int threads = int(blockDim.x);
  for (int start = 0; start < n; start += kSweepUnroll * threads) {
    uint32_t k[kSweepUnroll];
#pragma unroll
    for (int j = 0; j < kSweepUnroll; ++j) {
      const int t = start + j * threads + int(threadIdx.x);
      k[j] = t < n ? load(t) : 0u;
    }
#pragma unroll
    for (int j = 0; j < kSweepUnroll; ++j) {
      const int t = start + j * threads + int(threadIdx.x);
      fn(k[j], t < n, t);
    }
  }
}

/// A selection's cut, known once its radix passes end: a key is above T
/// where its bits under `mask` exceed `prefix`, equal to T where they match
/// it; of the keys equal to T the first `need` by position are chosen.
struct Cut {
  uint32_t prefix, mask;
  int64_t need;
};

/// Where a block's slice of n keys (keyAt(t), t < n, position base + t)
/// sends its chosen positions, by warps, without a block barrier a key:
/// warp w takes the keys [begin, end) = [w S, w S + S) (S a multiple of
/// 32) and counts those above and equal to the cut (ballots) into
/// warpAbove / warpEqual (shared, a warp each), which every thread may read
/// on return.
struct WarpSpan {
  int begin, end;
};

template <typename KeyAt>
__device__ WarpSpan countInWarpSpans(int n, KeyAt keyAt, const Cut &cut,
                                     int *warpAbove, int *warpEqual) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp,
            warps = int(blockDim.x) / kWarp;
  const int span = (n + kWarp * warps - 1) / (kWarp * warps) * kWarp;
  WarpSpan w;
  w.begin = warp * span < n ? warp * span : n;
  w.end = w.begin + span < n ? w.begin + span : n;
  int above = 0, equal = 0;
  for (int t0 = w.begin; t0 < w.end; t0 += kWarp) {
    const int t = t0 + lane;
    const uint32_t k = t < w.end ? keyAt(t) & cut.mask : 0u;
    above += __popc(__ballot_sync(kFullMask, t < w.end && k > cut.prefix));
    equal += __popc(__ballot_sync(kFullMask, t < w.end && k == cut.prefix));
  }
  if (lane == 0) {
    warpAbove[warp] = above;
    warpEqual[warp] = equal;
  }
  __syncthreads();
  return w;
}

/// The sum over the calling warp's lanes of counts[lane] for lanes below
/// `upTo` (at most kWarp), in every lane: one load a lane and a butterfly,
/// not a serial loop over the warps.
__device__ inline int warpSumBelow(const int *counts, int upTo) {
  const int lane = threadIdx.x % kWarp;
  int v = lane < upTo ? counts[lane] : 0;
  for (int d = kWarp / 2; d > 0; d /= 2)
    v += __shfl_xor_sync(kFullMask, v, d);
  return v;
}

/// The chosen positions of countInWarpSpans' slice into selected[], in
/// position order, after `aboveBefore` keys above the cut and `equalBefore`
/// keys equal to it in the slices before (0 for the first); slots at
/// topK and past are not written. Counts fit an int: positions are int32.
template <typename KeyAt>
__device__ void placeInWarpSpans(const WarpSpan &w, int base, KeyAt keyAt,
                                 const Cut &cut, int aboveBefore,
                                 int equalBefore, const int *warpAbove,
                                 const int *warpEqual, int32_t *selected,
                                 int topK) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const unsigned lower = (1u << lane) - 1u; // the lanes below this one
  const int need = int(cut.need);
  int equalSeen = equalBefore + warpSumBelow(warpEqual, warp);
  int written = aboveBefore + warpSumBelow(warpAbove, warp) +
                (equalSeen < need ? equalSeen : need);
  for (int t0 = w.begin; t0 < w.end; t0 += kWarp) {
    const int t = t0 + lane;
    const uint32_t k = t < w.end ? keyAt(t) & cut.mask : 0u;
    const bool isEqual = t < w.end && k == cut.prefix;
    const unsigned equalBallot = __ballot_sync(kFullMask, isEqual);
    const bool chosen =
        t < w.end &&
        (k > cut.prefix ||
         (isEqual && equalSeen + __popc(equalBallot & lower) < need));
    const unsigned chosenBallot = __ballot_sync(kFullMask, chosen);
    const int slot = written + __popc(chosenBallot & lower);
    if (chosen && slot < topK)
      selected[slot] = int32_t(base + t);
    written += __popc(chosenBallot);
    equalSeen += __popc(equalBallot);
  }
}

/// The selection by one block of 1024 threads (indexerSelectKernel's first
/// block alone, for at most IndexerArgs::oneBlockPositions attended
/// positions): the cluster's result without its cluster barriers and reads
/// of other blocks' shared memory, which are most of what a pass costs
/// there. One block counts every key on its own multiprocessor, though (a
/// shared-memory atomic each, ~4 a cycle), so above a few thousand
/// positions the cluster is the faster (docs/perf.md, seventeenth pass).
/// `keys` (dynamic shared memory) takes the attended positions' keys,
/// `hist` (shared) the kSelectCopies copies of the histogram.
///   1. Radix select, 8 bits a pass from the top, as the cluster's, each
///      warp counting into its copy of the histogram; the first pass
///      counts as the keys are staged. It stops once the digit's keys are
///      exactly the number still needed (T then known by its top bits).
///   2. Warp w takes positions [w S, w S + S) (S a multiple of 32), counts
///      its keys above T and equal to T (ballots), every warp sums the
///      counts of the warps before it, and each warp writes its chosen
///      positions in order, 32 a round (a ballot's prefix places a lane).
__device__ void selectInOneBlock(const IndexerArgs &a, int attended,
                                 uint32_t *keys, unsigned *hist) {
  __shared__ int warpAbove[kWarp], warpEqual[kWarp];
  __shared__ RadixState found;
  const int warp = threadIdx.x / kWarp, threads = int(blockDim.x);
  unsigned *mineHist = hist + warp % kSelectCopies * kSelectStride;
  const auto clearCounts = [&] {
    for (int i = threadIdx.x; i < kSelectCopies * kSelectStride; i += threads)
      hist[i] = 0;
  };
  // A key's digit at `shift`, counted where its bits above are `prefix`.
  const auto count = [&](uint32_t k, bool valid, uint32_t mask,
                         uint32_t prefix, int shift) {
    if (valid && (k & mask) == prefix)
      atomicAdd(&mineHist[(k >> shift) & 255u], 1u);
  };
  clearCounts();
  __syncthreads();
  // Staged, and the first digit counted.
  sweepKeys(
      attended, [&](int t) { return rankKey(a.scores[t]); },
      [&](uint32_t k, bool valid, int t) {
        if (valid)
          keys[t] = k;
        count(k, valid, 0u, 0u, 24);
      });
  RadixState st{0u, 0u, a.topK, 0};
  for (int pass = 0;; ++pass) {
    const int shift = 24 - 8 * pass;
    __syncthreads(); // this pass's counts are in
    for (int i = threadIdx.x; i < 256; i += threads) {
      unsigned sum = 0;
#pragma unroll
      for (int c = 0; c < kSelectCopies; ++c)
        sum += hist[c * kSelectStride + i];
      hist[i] = sum;
    }
    takeDigit(hist, shift, found, st);
    if (pass == 3 || (a.earlyStop && st.need == st.equal)) // uniform
      break;
    clearCounts();
    __syncthreads();
    sweepKeys(
        attended, [&](int t) { return keys[t]; },
        [&](uint32_t k, bool valid, int) {
          count(k, valid, st.mask, st.prefix, shift - 8);
        });
  }
  // Keys above T by their top bits (mask), and keys equal to T there; of
  // the equal ones the first `need` by position are chosen.
  const Cut cut{st.prefix, st.mask, st.need};
  const auto staged = [&](int t) { return keys[t]; };
  const WarpSpan w =
      countInWarpSpans(attended, staged, cut, warpAbove, warpEqual);
  placeInWarpSpans(w, 0, staged, cut, 0, 0, warpAbove, warpEqual, a.selected,
                   int(a.topK));
  // Exactly topK are chosen (attended > topK).
  if (threadIdx.x == 0)
    *a.count = int32_t(a.topK);
}

/// Blocks of the selection: one cluster (of kSelectBlocks, or of
/// kWideSelectBlocks where asked), each block a slice of the positions
/// (its keys staged in its own shared memory), the histograms and the
/// slices' counts read across the cluster's shared memory.
constexpr int kSelectBlocks = 8, kWideSelectBlocks = 16;

/// One cluster (the launch's cluster size): the topK positions of the CPU's
/// stable descending sort (a higher score first, an equal one at a lower
/// position first), ascending, into selected, zeros after them, and the
/// count. A bad position selects nothing (count 0). Block r takes the
/// positions [r S, r S + S) (S = attended / B rounded up, B the blocks).
///   1. Radix select, 8 bits a pass from the top: each block counts the
///      keys of its slice that share the bits found so far, by their next 8
///      bits (each warp into its copy of the histogram, as the one block
///      does, the copies then summed); after a cluster barrier every block
///      sums the blocks' counts and its warp 0 finds the digit where the
///      count from the top reaches the number still needed (takeDigit;
///      every block alike). After 4 passes T is the topK-th largest key and
///      `need` the number of keys equal to T that are selected; sooner,
///      where a digit holds exactly the keys still needed, T is known by
///      the bits found so far, and the keys are compared by those (the
///      bench's random scores: after two passes at 4k positions, three at
///      16k). The first pass stages the keys as it counts them.
///   2. Each block counts its keys above T and equal to T, warp by warp
///      (countInWarpSpans); after a barrier it sums the counts of the
///      blocks before it, which place its slice: its keys above T, and
///      those equal to T among the first `need` of them overall, go to the
///      next slots, positions ascending (placeInWarpSpans: each warp after
///      the warps before it, ballots placing its lanes).
/// Exact: the same positions as the CPU's sort, in O(positions) a pass. Up
/// to a.oneBlockPositions attended positions the first block selects alone
/// (selectInOneBlock) and the others leave at once.
/// kStaged: each block's keys are computed once into dynamic shared memory
/// (one uint32 a position of its slice, launchDsaIndexer's choice when they
/// fit) and every pass reads them there instead of the scores in the L2.
/// kWide: the instance that clusters of kWideSelectBlocks run, the same
/// code, so that its attributes (shared memory, carveout) are its own: set
/// for clusters of 8 on one function, they cost the clusters of 16 that a
/// step's second graph runs ~0.12 ms a GLM-5 step at 128k positions
/// (docs/perf.md, thirty-second pass).
template <bool kStaged, bool kWide = false>
__global__ void indexerSelectKernel(IndexerArgs a) {
  const int32_t position = stepInputBeforeWait(a.position);
  stepKernelPrologue();
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ uint32_t stagedKeys[];
  __shared__ int warpAbove[kWarp], warpEqual[kWarp];
  __shared__ unsigned copies[kSelectCopies * kSelectStride];
  __shared__ unsigned hist[2][256], merged[256];
  __shared__ int64_t sliceCounts[2]; // keys above T, keys equal to T
  __shared__ RadixState found;
  const bool valid = position >= 0 && position < a.cache.positions;
  const int64_t attended = valid ? int64_t(position) + 1 : 0;
  if (attended <= a.topK) { // every position is selected: no scan needed
    if (cluster.block_rank() == 0) {
      for (int64_t i = threadIdx.x; i < a.topK; i += blockDim.x)
        a.selected[i] = i < attended ? int32_t(i) : 0;
      if (threadIdx.x == 0)
        *a.count = int32_t(attended);
    }
    return; // uniform over the cluster: no block waits at a barrier
  }
  if (attended <= a.oneBlockPositions) { // uniform over the cluster
    if (cluster.block_rank() == 0)
      selectInOneBlock(a, int(attended), stagedKeys, copies);
    return;
  }
  unsigned *mineCopy =
      copies + threadIdx.x / kWarp % kSelectCopies * kSelectStride;
  const int rank = int(cluster.block_rank());
  const int blocks = int(cluster.num_blocks());
  const int64_t per = (attended + blocks - 1) / blocks;
  const int64_t begin = per * rank < attended ? per * rank : attended;
  const int64_t end = begin + per < attended ? begin + per : attended;
  const int64_t mine = end - begin;
  const float *sliceScores = a.scores + begin;
  auto keyAt = [&](int64_t t) { // t: an index into the slice
    if constexpr (kStaged)
      return stagedKeys[t];
    else
      return rankKey(sliceScores[t]);
  };
  // The warps count into copies of a histogram, zero from here on: each
  // pass's sums clear them for the next.
  for (int i = threadIdx.x; i < kSelectCopies * kSelectStride; i += blockDim.x)
    copies[i] = 0;
  __syncthreads();
  // Sweep indices as int (positions are int32).
  const int n = int(mine), threads = int(blockDim.x);
  RadixState st{0u, 0u, a.topK, 0};
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    // The first pass stages the keys as it counts them (kStaged), its
    // loads kSweepUnroll a thread in flight together.
    for (int start = 0; start < n; start += kSweepUnroll * threads) {
      uint32_t k[kSweepUnroll];
#pragma unroll
      for (int j = 0; j < kSweepUnroll; ++j) {
        const int t = start + j * threads + int(threadIdx.x);
        k[j] = t >= n       ? 0u
               : pass == 0 ? rankKey(sliceScores[t])
                           : keyAt(t);
      }
#pragma unroll
      for (int j = 0; j < kSweepUnroll; ++j) {
        const int t = start + j * threads + int(threadIdx.x);
        if constexpr (kStaged)
          if (pass == 0 && t < n)
            stagedKeys[t] = k[j];
        // An increment by one, which the hardware adds for a warp's lanes
        // with the same digit at once: __match_any_sync, which did that
        // before, has a low throughput (most of this kernel's time at
        // 16,384 keys a block; docs/perf.md, thirty-first pass).
        if (t < n && (k[j] & st.mask) == st.prefix)
          atomicAdd(&mineCopy[(k[j] >> shift) & 255u], 1u);
      }
    }
    __syncthreads(); // the copies are counted
    // Their sums into one of two histograms in turn (another block may
    // still be reading the one of the pass before until the barrier
    // below), the copies cleared as they are read.
    unsigned *mineHist = hist[pass % 2];
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
      unsigned sum = 0;
#pragma unroll
      for (int c = 0; c < kSelectCopies; ++c) {
        sum += copies[c * kSelectStride + i];
        copies[c * kSelectStride + i] = 0;
      }
      mineHist[i] = sum;
    }
    cluster.sync(); // every block's counts of this pass are in place
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
      unsigned sum = 0;
      for (int r = 0; r < blocks; ++r)
        sum += cluster.map_shared_rank(mineHist, r)[i];
      merged[i] = sum;
    }
    takeDigit(merged, shift, found, st);
    // The digit's keys are exactly the number still needed: T is known by
    // its top bits (uniform over the cluster: every block merged the same
    // counts).
    if (a.earlyStop && st.need == st.equal)
      break;
  }
  // This slice's keys above T and equal to T (by the bits found), by warps
  // over spans of it; then the slices before it.
  const Cut cut{st.prefix, st.mask, st.need};
  const WarpSpan w =
      countInWarpSpans(int(mine), keyAt, cut, warpAbove, warpEqual);
  if (threadIdx.x < kWarp) { // the slice's totals, by warp 0
    const int warps = int(blockDim.x) / kWarp;
    const int above = warpSumBelow(warpAbove, warps),
              equal = warpSumBelow(warpEqual, warps);
    if (threadIdx.x == 0) {
      sliceCounts[0] = above;
      sliceCounts[1] = equal;
    }
  }
  cluster.sync(); // every slice's counts are in place
  int64_t aboveBefore = 0, equalBefore = 0;
  for (int r = 0; r < rank; ++r) {
    const int64_t *other = cluster.map_shared_rank(sliceCounts, r);
    aboveBefore += other[0];
    equalBefore += other[1];
  }
  placeInWarpSpans(w, int(begin), keyAt, cut, int(aboveBefore),
                   int(equalBefore), warpAbove, warpEqual, a.selected,
                   int(a.topK));
  const int64_t equalThrough = equalBefore + sliceCounts[1];
  const int64_t written = aboveBefore + sliceCounts[0] +
                          (equalThrough < cut.need ? equalThrough : cut.need);
  // Exactly topK are chosen over the cluster; the last block writes the
  // count (the zeros after the chosen slots are for fewer, never here).
  if (rank == blocks - 1) {
    for (int64_t i = written + threadIdx.x; i < a.topK; i += blockDim.x)
      a.selected[i] = 0;
    if (threadIdx.x == 0)
      *a.count = int32_t(written < a.topK ? written : a.topK);
  }
  cluster.sync(); // no block leaves while another reads its shared memory
}

//===----------------------------------------------------------------------===//
// MoE router: logits by launchLinear, then one block for the gating and
// the top-k choice.
//===----------------------------------------------------------------------===//

/// A choice's shape compiled in (routerKernel's GLM-5 form: its 256
/// experts, top 8, on the router's 256 threads, sigmoid gating), or taken
/// at run time (experts 0).
struct RouterFixed {
  int threads = 0, experts = 0, topK = 0;
};

/// p of a logit under sigmoid gating, by every router form's expression (the
/// forms' choices are the same bits).
__device__ inline float sigmoidP(float logit) {
  return 1.f / (1.f + expf(-logit));
}

/// An expert's choice score from its p and bias (b read where hasBias): the
/// bias only steers the choice; the weights come from p alone. NaN lowest.
__device__ inline float choiceKey(float p, float b, bool hasBias) {
  return rankable(hasBias ? p + b : p);
}

/// p from the logits (sigmoid, or a softmax over the experts) into
/// prob[], and each expert's choice score, p + bias (NaN lowest), into
/// choice[]; each thread's logit and bias loads issued together.
/// kSigmoidOnly: the caller has checked the gating is a sigmoid, and the
/// softmax is not compiled. kHeldLogit (with kSigmoidOnly): thread e has
/// expert e's logit in `held` (every expert a thread), and `logits` is not
/// read.
template <bool kSigmoidOnly = false, bool kHeldLogit = false>
__device__ void routerScores(const float *logits, int64_t experts,
                             const float *bias, Gating gating, float *prob,
                             float *choice, float *partials, float held = 0.f) {
  static_assert(kSigmoidOnly || !kHeldLogit);
  // Logits are read from the L2 (ld.global.cg): routerKernel's choosing
  // block reads what other blocks wrote.
  if (kSigmoidOnly || gating == Gating::Sigmoid) {
    for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) {
      const float logit = kHeldLogit ? held : __ldcg(logits + e),
                  b = bias ? bias[e] : 0.f;
      const float p = sigmoidP(logit);
      prob[e] = p;
      choice[e] = choiceKey(p, b, bias != nullptr);
    }
  } else if constexpr (!kSigmoidOnly) {
    float maxLogit = -INFINITY;
    for (int64_t e = threadIdx.x; e < experts; e += blockDim.x)
      maxLogit = fmaxf(maxLogit, __ldcg(logits + e));
    maxLogit = blockMax(maxLogit, partials);
    float sum = 0.f;
    for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) {
      prob[e] = expf(__ldcg(logits + e) - maxLogit);
      sum += prob[e];
    }
    sum = blockSum(sum, partials);
    for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) {
      prob[e] /= sum;
      choice[e] = rankable(bias ? prob[e] + bias[e] : prob[e]);
    }
  }
  __syncthreads();
}

/// The router's weights from the chosen ids in k order, exactly as the
/// CPU: the chosen p summed in k order, floored, divided, scaled.
__device__ inline float routerWeight(float p, float sum, bool normalize,
                                     float routedScale) {
  // The floor keeps a router whose chosen probabilities all vanish from
  // dividing by zero.
  const float denominator = fmaxf(sum, kRouterSumFloor);
  return (normalize ? p / denominator : p) * routedScale;
}

/// One compare-exchange stage of a bitonic network over a warp's 32
/// candidates (one a lane, partner lane ^ j), in blocks of k lanes: the
/// lower lane of a pair keeps the better one where the block sorts best
/// first ((lane & k) == 0), the worse one elsewhere.
__device__ inline Best bitonicStage(Best v, int j, int k) {
  const int lane = threadIdx.x % kWarp;
  const Best o{__shfl_xor_sync(kFullMask, v.key, j),
               __shfl_xor_sync(kFullMask, v.index, j)};
  const bool otherBetter =
      o.key > v.key || (o.key == v.key && o.index < v.index);
  const bool keepBetter = ((lane & j) == 0) == ((lane & k) == 0);
  return otherBetter == keepBetter ? o : v;
}

/// A warp's 32 candidates sorted best first across its lanes (`better`'s
/// order: the larger key, then the lower index).
__device__ inline Best warpSortBest(Best v) {
  for (int k = 2; k <= kWarp; k <<= 1)
    for (int j = k >> 1; j > 0; j >>= 1)
      v = bitonicStage(v, j, k);
  return v;
}

/// The best 32 of two best-first sorted lists, sorted best first: the
/// better of r[i] and s[31 - i] is the top 32 as a bitonic sequence, which
/// five stages sort.
__device__ inline Best warpMergeBest(Best r, Best s) {
  const int lane = threadIdx.x % kWarp;
  const Best reversed{__shfl_sync(kFullMask, s.key, kWarp - 1 - lane),
                      __shfl_sync(kFullMask, s.index, kWarp - 1 - lane)};
  Best v = better(r, reversed);
  for (int j = kWarp / 2; j > 0; j >>= 1)
    v = bitonicStage(v, j, kWarp);
  return v;
}

/// The best 32 of `count` candidates keyOf(i), i < count, sorted best first
/// across the warp's lanes, taking chunks first, first + stride, ... of 32
/// (fewer than 32 real candidates leave (-inf, INT_MAX) at the end, below
/// every real one, NaN mapped to -inf included, by its lower index).
template <typename Candidate>
__device__ Best warpTop32(int64_t count, int64_t first, int64_t stride,
                          Candidate candidateOf) {
  const int lane = threadIdx.x % kWarp;
  Best top{-INFINITY, INT_MAX};
  bool any = false;
  for (int64_t c = first; c * kWarp < count; c += stride) {
    const int64_t i = c * kWarp + lane;
    Best v = i < count ? candidateOf(i) : Best{-INFINITY, INT_MAX};
    v = warpSortBest(v);
    top = any ? warpMergeBest(top, v) : v;
    any = true;
  }
  return top;
}

/// The chosen ids' tagged copies (TaggedIds) by one warp, its lanes a copy
/// in turn: lane l stores id (lane l mod kTopK's choice, passed by every
/// lane) into copies l / kTopK, l / kTopK + 32 / kTopK, ...
template <int kTopK>
__device__ inline void publishTaggedIds(uint64_t *taggedIds, uint32_t tag,
                                        int32_t id) {
  static_assert(kWarp % kTopK == 0);
  const int lane = int(threadIdx.x) % kWarp;
  for (int c = lane / kTopK; c < kTaggedIdCopies; c += kWarp / kTopK)
    publishTaggedWord(taggedIds + c * kTaggedIdStride + lane % kTopK, tag,
                      uint32_t(id));
}

/// Whether a is `better` than b (the larger key, then the lower index; an
/// entry never beats itself), without branches (bitwise, not
/// short-circuit), so that a loop of these over shared memory issues its
/// reads ahead of the compares.
__device__ inline int beats(Best a, Best b) {
  return int(a.key > b.key) | (int(a.key == b.key) & int(a.index < b.index));
}

/// The choice for topK <= 32: the CPU's, topK rounds each taking the best
/// expert not yet chosen by p + bias (NaN lowest, ties to the lower id), in
/// that order; then the weights in k order. Dynamic shared memory: 2 *
/// experts floats, then (blockDim / 32) * topK candidates, then topK
/// (routerChoiceShared).
///
/// Where every expert has a thread (experts <= blockDim; GLM-5's 256 on the
/// router's 256 threads), by ranks, with no sorting network: lane l of
/// warp w counts the lanes of its warp whose expert beats its own (`beats`
/// is a total order: lanes past the last expert are -inf with ids past it,
/// below every real one), so the warp's ranks are 0 .. 31 and the experts
/// ranked below topK are its candidates, in rank order. The best topK
/// overall are all candidates, and whatever beats one of them is one too,
/// so a candidate's rank among the warps' candidates is its rank among all
/// the experts wherever that is below topK: those fill the result in rank
/// order. Independent compares (shared-memory reads: the warp's keys, then
/// a few threads a candidate) instead of a bitonic network's dependent
/// stages: the same ids, in the same order. In GLM-5's step it measured
/// 0.012-0.016 ms faster at 1k; the choice in the router's last block
/// still takes ~2-3 us either way, its phases (the logits' L2 round trip,
/// each compare pass, the weights) ~0.5 us each whatever their
/// instructions (docs/perf.md, fiftieth pass).
///
/// Otherwise each warp takes the best 32 of its chunks of 32 experts (a
/// bitonic sort and merge in registers, no barrier), its best topK to
/// shared memory; then warp 0 the best of those.
///
/// kRankedOnly: the caller has checked experts <= blockDim.x, and the
/// warps' sort is not compiled. kFixed (RouterFixed): the shape and a
/// sigmoid gating checked by the caller, and compiled in. kHeldLogit (with
/// kFixed of as many experts as threads): thread e holds expert e's logit
/// in `held` (routerScores).
template <bool kRankedOnly = false, RouterFixed kFixed = RouterFixed{},
          bool kHeldLogit = false>
__device__ void routerChooseSorted(const float *logits, int64_t expertsArg,
                                   const float *bias, int64_t topKArg,
                                   Gating gating, bool normalize,
                                   float routedScale, int32_t *ids,
                                   float *weights, float *prob,
                                   float held = 0.f,
                                   uint64_t *taggedIds = nullptr,
                                   uint32_t idTag = 0) {
  constexpr bool kShaped = kFixed.experts > 0;
  static_assert(!kShaped || (kRankedOnly && kFixed.experts <= kFixed.threads &&
                             kFixed.topK <= kWarp));
  static_assert(!kHeldLogit || (kShaped && kFixed.experts == kFixed.threads));
  const int64_t experts = kShaped ? kFixed.experts : expertsArg,
                topK = kShaped ? kFixed.topK : topKArg;
  const int threads = kShaped ? kFixed.threads : int(blockDim.x);
  __shared__ float partials[kWarp];
  float *choice = prob + experts;
  Best *candidates = reinterpret_cast<Best *>(choice + experts);
  routerScores<kShaped, kHeldLogit>(logits, experts, bias, gating, prob,
                                    choice, partials, held);

  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = threads / kWarp;
  if (kRankedOnly || experts <= int64_t(threads)) { // the same for the block
    Best *top = candidates + warps * topK;
    // Lane l's rank in its warp from the warp's keys in shared memory (one
    // broadcast read each; key j past the last expert is -inf, below every
    // real one). The reads are of clamped indices and their values
    // selected, not branched around, so that they issue ahead of the
    // compares.
    const int e = int(threadIdx.x), first = warp * kWarp, n = int(experts);
    const float key = e < n ? choice[e] : -INFINITY;
    int rank = 0;
#pragma unroll
    for (int j = 0; j < kWarp; ++j) {
      const int at = first + j;
      const float read = choice[at < n ? at : n - 1];
      const float other = at < n ? read : -INFINITY;
      rank += int(other > key) | (int(other == key) & int(j < lane));
    }
    if (rank < topK)
      candidates[warp * topK + rank] = Best{key, e};
    __syncthreads();
    // `share` consecutive lanes a candidate (a power of two: the sum below
    // stays within a warp), each counting every share-th candidate.
    const int count = warps * int(topK);
    int share = 1;
    while (share < kWarp && 2 * share * count <= threads)
      share *= 2;
    const int c = int(threadIdx.x) / share, part = int(threadIdx.x) % share;
    const Best me = c < count ? candidates[c] : Best{-INFINITY, INT_MAX};
    int beaten = 0;
    if (c < count)
#pragma unroll 4
      for (int j = part; j < count; j += share)
        beaten += beats(candidates[j], me);
    for (int o = share / 2; o > 0; o /= 2)
      beaten += __shfl_xor_sync(kFullMask, beaten, o);
    // The chosen in rank order, each with its p (its key no longer needed).
    if (c < count && part == 0 && beaten < topK)
      top[beaten] = Best{prob[me.index], me.index};
    __syncthreads();
    if (warp != 0)
      return;
    // Every lane the sum of the chosen p in k order, from shared memory (no
    // chain of shuffles).
    float sum = 0.f;
    for (int k = 0; k < topK; ++k)
      sum += top[k].key;
    if (lane < topK) {
      const Best chosen = top[lane];
      ids[lane] = chosen.index;
      weights[lane] = routerWeight(chosen.key, sum, normalize, routedScale);
    }
    if constexpr (kShaped)
      if (taggedIds)
        publishTaggedIds<kFixed.topK>(taggedIds, idTag,
                                      top[lane % kFixed.topK].index);
    return;
  }
  if constexpr (!kRankedOnly) {
    const Best mine = warpTop32(experts, warp, warps, [&](int64_t e) {
      return Best{choice[e], int32_t(e)};
    });
    if (lane < topK)
      candidates[warp * topK + lane] = mine;
    __syncthreads();
    if (warp != 0)
      return;
    const Best best = warpTop32(int64_t(warps) * topK, 0, 1,
                                [&](int64_t i) { return candidates[i]; });
    const float p = lane < topK ? prob[best.index] : 0.f;
    float sum = 0.f;
    for (int k = 0; k < topK; ++k)
      sum += __shfl_sync(kFullMask, p, k);
    if (lane < topK) {
      ids[lane] = best.index;
      weights[lane] = routerWeight(p, sum, normalize, routedScale);
    }
  }
}

/// The choice for any topK: topK rounds of a warp arg-max over the experts
/// not yet chosen (routerSelectKernel's result, one expert a round).
/// Dynamic shared memory: 2 * experts floats, topK ints, experts bytes.
__device__ void routerChooseRounds(const float *logits, int64_t experts,
                                   const float *bias, int64_t topK,
                                   Gating gating, bool normalize,
                                   float routedScale, int32_t *ids,
                                   float *weights, float *prob) {
  __shared__ float partials[kWarp];
  float *choice = prob + experts;
  int32_t *picked = reinterpret_cast<int32_t *>(choice + experts);
  unsigned char *chosen = reinterpret_cast<unsigned char *>(picked + topK);
  for (int64_t e = threadIdx.x; e < experts; e += blockDim.x)
    chosen[e] = 0;
  routerScores(logits, experts, bias, gating, prob, choice, partials);

  // Warp 0 alone: each round a lane's best unchosen expert, then a
  // butterfly arg-max (every lane learns the winner).
  if (threadIdx.x >= kWarp)
    return;
  for (int64_t k = 0; k < topK; ++k) {
    Best best{-INFINITY, INT_MAX};
    for (int64_t e = threadIdx.x; e < experts; e += kWarp)
      if (!chosen[e])
        best = better(best, Best{choice[e], int32_t(e)});
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      Best other{__shfl_xor_sync(kFullMask, best.key, offset),
                 __shfl_xor_sync(kFullMask, best.index, offset)};
      best = better(best, other);
    }
    // Every expert scanned is a candidate, so the winner is a real id
    // whenever topK <= experts (checked at launch).
    if (threadIdx.x == best.index % kWarp) {
      picked[k] = best.index;
      chosen[best.index] = 1;
    }
    __syncwarp();
  }
  if (threadIdx.x != 0)
    return;
  float sum = 0.f;
  for (int64_t k = 0; k < topK; ++k)
    sum += prob[picked[k]];
  for (int64_t k = 0; k < topK; ++k) {
    ids[k] = picked[k];
    weights[k] = routerWeight(prob[picked[k]], sum, normalize, routedScale);
  }
}

/// The choice by the calling block: by sorting for topK <= 32, else in
/// rounds (dynamic shared memory: routerChoiceShared).
__device__ void routerChoose(const float *logits, int64_t experts,
                             const float *bias, int64_t topK, Gating gating,
                             bool normalize, float routedScale, int32_t *ids,
                             float *weights, float *shared) {
  if (topK <= kWarp)
    routerChooseSorted(logits, experts, bias, topK, gating, normalize,
                       routedScale, ids, weights, shared);
  else
    routerChooseRounds(logits, experts, bias, topK, gating, normalize,
                       routedScale, ids, weights, shared);
}

/// The choice alone, after the logits' mat-vec (gates other than
/// routerKernel's).
__global__ void routerSelectKernel(const float *logits, int64_t experts,
                                   const float *bias, int64_t topK,
                                   Gating gating, bool normalize,
                                   float routedScale, int32_t *ids,
                                   float *weights) {
  stepKernelPrologue();
  extern __shared__ float shared[];
  routerChoose(logits, experts, bias, topK, gating, normalize, routedScale, ids,
               weights, shared);
}

/// The whole router for an F32 gate of 16-byte aligned rows (GLM-5's) in
/// one kernel: a warp takes part `part` of `splits` of one expert's row
/// (blocks of kRouterThreads hold whole rows) and holds its first weights
/// in registers across the predecessor wait (holdF32Part), then dots them
/// with x; the block adds its parts in order into logits[row]. The last
/// block to finish (an arrival count, which atomicInc brings back to zero
/// for the next call) then makes the choice, as the separate choice
/// kernels do. One kernel, not a mat-vec and a one-block choice: the
/// second's launch and wait were most of the ~6 us it added to a GLM-5
/// layer's critical path.
///
/// GLM-5's form (a block a row) publishes instead: thread 0 stores its
/// block's logit and the call's tag in one 64-bit word (tagged[row]: the
/// word is its own flag, so no fence and no atomic), and block 0 makes the
/// choice, thread e reading word e until it carries the tag. The last
/// logit reaches the choice in one way to the L2 and one read back, where
/// the ticket took the last block an atomic's round trip and then a read of
/// every logit (docs/perf.md, fifty-third pass). The tag is the generation
/// word (arrivals[1]) plus one, read before the wait (only this op's
/// previous call, in an earlier step, wrote it: see stepInputBeforeWait
/// on why that call has ended) and advanced by block 0 once every word
/// carried it. Block 0 also stores the logits (the scratch's contract). A
/// word that never comes (kDeviceWaitNs) leaves every chosen id -1, which
/// the experts' kernel reports as a fault.
constexpr int kRouterThreads = 256;

struct RouterArgs {
  const float *x;
  const float4 *gate; ///< rows of cols4 float4
  int64_t experts, cols4;
  int splits;
  const float *bias;
  int64_t topK;
  Gating gating;
  bool normalize;
  float routedScale;
  /// The last-block ticket (atomicInc's count), then GLM-5's form's
  /// generation (routerKernel).
  uint32_t *arrivals;
  float *logits;
  /// GLM-5's form: each block's logit with its call's tag (routerKernel).
  uint64_t *tagged;
  /// GLM-5's form, or null: the chosen ids published with the step's tag
  /// (TaggedIds: the words, and the step's epoch word).
  uint64_t *taggedIds;
  const uint32_t *stepWord;
  int32_t *ids;
  float *weights;
  /// kNorm (step.rms_norm_router): x RMS-normalised with these, written
  /// to `normalised`.
  const float4 *normWeight;
  float normEps;
  float *normalised;
};

/// kNorm: x normalised as it is read (linearF32Kernel<true>'s way: each
/// row dotted with x * g and divided by the rms, whose squares the row's
/// warps take from the x values they read), and each block writes its
/// share of the normalised vector, x / rms * g as the norm kernels do,
/// with the rms of its first row (every row's squares are summed in the
/// same order, so every block's rms is the same bits). Its registers are
/// left to ptxas (minimum blocks 1): at the default kernel's bound sm_90's
/// build spilled 12 bytes.
///
/// kForm (RouterForm), checked at launch: Ranked where topK <= kWarp and
/// experts <= kRouterThreads, and only the ranked choice is compiled, not
/// the sort nor the rounds; Glm5 where the shape is also GLM-5's (256
/// experts of 6,144 values, each row in 8 parts, top 8, sigmoid gating),
/// compiled in, the dots' too; Glm5Warps the same with block 0's choice by
/// its warps (routerChooseGlm5Warps), where routerWarps() is on.
enum class RouterForm { General, Ranked, Glm5, Glm5Warps };
/// GLM-5's gate rows as routerKernel holds them: 6,144 values, a warp for
/// each of 8 parts, so a block a row.
constexpr F32Shape kGlm5RouterRows{glm5::kHidden / 4, kRouterThreads / kWarp,
                                   kRouterThreads / kWarp};
static_assert(kGlm5RouterRows.warps == kGlm5RouterRows.splits,
              "a block a row: GLM-5's router grid is its experts");
/// GLM-5's router form's row output: thread 0's register (routerKernel).
struct HeldLogit {
  float *to;
  __device__ void operator()(int64_t, float sum) const { *to = sum; }
};

/// GLM-5's router, block 0 after awaiting every block's logit (`arrived`
/// this thread's): a block barrier, which also says whether any logit was
/// lost; thread 0 then advances the generation (every block has read it).
/// Where one was lost, block 0 writes -1 ids and publishes them by tags too
/// (the experts polling them report them at once, not after their own
/// wait's timeout), and the caller returns: true.
__device__ inline bool routerLogitsLost(const RouterArgs &a, bool arrived,
                                        uint32_t tag, uint32_t idTag) {
  const bool lost = __syncthreads_or(!arrived);
  if (threadIdx.x == 0)
    __stcg(a.arrivals + 1, tag);
  if (lost) {
    const int e = int(threadIdx.x);
    if (e < glm5::kTopK)
      a.ids[e] = -1;
    if (a.taggedIds && e < kWarp)
      publishTaggedIds<glm5::kTopK>(a.taggedIds, idTag, -1);
  }
  return lost;
}

/// GLM-5's choice in block 0 with one block barrier (RouterForm::Glm5Warps):
/// thread e holds expert e's logit (`mine`, `arrived` whether it came; each
/// warp polled its 32 words as one, awaitTaggedWordWarp, so that its lanes
/// meet the shuffles below together) and its bias (`bias`, loaded before
/// the wait). Each warp ranks its 32 experts by shuffles (lane l counts
/// the lanes whose expert `beats` its own), so no scores go through shared
/// memory; the warp's best 8 are its candidates. After the one barrier (which also tells every thread whether
/// a logit was lost), warp 0 ranks the 64 candidates, lane l candidates l
/// and l + 32: whatever beats a candidate ranked below 8 overall is a
/// candidate too, so its rank among them is its rank among all. The chosen
/// go to shared memory in rank order with their p; after a warp barrier the
/// warp publishes the ids by tags and writes ids and weights, the p summed
/// in rank order. The same ids, order and weights as routerChooseSorted's
/// ranks (the same keys, the same total order, the same sum), bit for bit;
/// its phases were the scores through shared memory and two more block
/// barriers: -0.056 ms a step at 1k on an H100 (docs/perf.md, fifty-eighth
/// pass).
__device__ void routerChooseGlm5Warps(const RouterArgs &a, float mine,
                                      bool arrived, float bias,
                                      uint32_t tag, uint32_t idTag) {
  constexpr int kTopK = glm5::kTopK, kWarps = kRouterThreads / kWarp;
  constexpr int kCandidates = kWarps * kTopK;
  static_assert(glm5::kExperts == kRouterThreads && kCandidates == 2 * kWarp,
                "every expert a thread; two candidates a lane of warp 0");
  __shared__ Best candidates[kCandidates];
  __shared__ float candidateP[kCandidates];
  __shared__ Best top[kTopK];
  const int e = int(threadIdx.x), lane = e % kWarp, warp = e / kWarp;
  const float p = sigmoidP(mine);
  const Best me{choiceKey(p, bias, a.bias != nullptr), e};
  int rank = 0;
#pragma unroll
  for (int j = 0; j < kWarp; ++j) {
    const Best other{__shfl_sync(kFullMask, me.key, j), warp * kWarp + j};
    rank += beats(other, me);
  }
  if (rank < kTopK) {
    candidates[warp * kTopK + rank] = me;
    candidateP[warp * kTopK + rank] = p;
  }
  if (routerLogitsLost(a, arrived, tag, idTag))
    return;
  if (warp != 0)
    return;
  const Best c0 = candidates[lane], c1 = candidates[lane + kWarp];
  int r0 = 0, r1 = 0;
#pragma unroll 8
  for (int j = 0; j < kCandidates; ++j) {
    const Best other = candidates[j];
    r0 += beats(other, c0);
    r1 += beats(other, c1);
  }
  if (r0 < kTopK)
    top[r0] = Best{candidateP[lane], c0.index};
  if (r1 < kTopK)
    top[r1] = Best{candidateP[lane + kWarp], c1.index};
  __syncwarp();
  if (a.taggedIds)
    publishTaggedIds<kTopK>(a.taggedIds, idTag, top[lane % kTopK].index);
  float sum = 0.f;
  for (int k = 0; k < kTopK; ++k)
    sum += top[k].key;
  if (lane < kTopK) {
    const Best chosen = top[lane];
    a.ids[lane] = chosen.index;
    a.weights[lane] = routerWeight(chosen.key, sum, a.normalize,
                                   a.routedScale);
  }
}

template <bool kNorm, RouterForm kForm>
__global__ void __launch_bounds__(kRouterThreads, kNorm ? 1 : 0)
    routerKernel(RouterArgs a) {
  constexpr bool kWarps = kForm == RouterForm::Glm5Warps;
  constexpr bool kGlm5 = kForm == RouterForm::Glm5 || kWarps;
  constexpr F32Shape kRows = kGlm5 ? kGlm5RouterRows : F32Shape{};
  extern __shared__ float shared[];
  __shared__ float partials[kRouterThreads / kWarp];
  __shared__ bool last;
  const float4 *x4 = reinterpret_cast<const float4 *>(a.x);
  // GLM-5's form: this call's tag, before the wait (block 0's threads each
  // read it to await their words; thread 0 of the others to publish).
  uint32_t tag = 0, idTag = 0;
  if constexpr (kGlm5)
    if (blockIdx.x == 0 || threadIdx.x == 0) {
      tag = __ldcg(a.arrivals + 1) + 1u;
      // The ids' tag: the step's epoch word plus one (TaggedIds; only the
      // step's last kernel writes that word).
      if (blockIdx.x == 0 && a.taggedIds)
        idTag = __ldcg(a.stepWord) + 1u;
    }
  // Block 0's bias for the warps' choice: a weight, no predecessor writes
  // it.
  float bias = 0.f;
  if constexpr (kWarps)
    if (blockIdx.x == 0 && a.bias)
      bias = a.bias[threadIdx.x];
  float logit = 0.f; // GLM-5's form: thread 0's, its block's row
  const auto rows = [&] {
    if constexpr (kGlm5)
      return HeldLogit{&logit};
    else
      return a.logits;
  }();
  if constexpr (!kNorm) {
    heldF32Block<kRows>(
        a.gate, [x4](int64_t c) { return x4[c]; }, a.experts, a.cols4,
        a.splits, partials, rows);
    if constexpr (kGlm5)
      if (threadIdx.x == 0)
        publishTaggedWord(a.tagged + blockIdx.x, tag, __float_as_uint(logit));
  } else {
    __shared__ float squares[kRouterThreads / kWarp], blockRms;
    heldF32NormedBlock<kRows>(a.gate, x4, a.normWeight, a.experts, a.cols4,
                              a.splits, a.normEps, partials, squares,
                              &blockRms, rows);
    if constexpr (kGlm5)
      if (threadIdx.x == 0) // ahead of the normalised share
        publishTaggedWord(a.tagged + blockIdx.x, tag, __float_as_uint(logit));
    // This block's share of the normalised vector (compiled in: a block a
    // row, so 24 values a block, no division).
    const int64_t values = kGlm5 ? int64_t(glm5::kHidden) : a.cols4 * 4;
    const int64_t blocks = kGlm5 ? int64_t(glm5::kExperts) : gridDim.x;
    const int64_t begin = values * blockIdx.x / blocks,
                  end = values * (blockIdx.x + 1) / blocks;
    const float rms = blockRms;
    const float *g = reinterpret_cast<const float *>(a.normWeight);
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
      a.normalised[i] = a.x[i] / rms * g[i];
  }
  if constexpr (kGlm5) {
    if (blockIdx.x != 0)
      return;
    const int e = int(threadIdx.x); // every expert a thread
    uint32_t bits = 0;
    // The warps' choice shuffles right after its wait: the warp polls as
    // one (awaitTaggedWordWarp).
    const bool arrived =
        kWarps ? awaitTaggedWordWarp(a.tagged + e, tag, 20, &bits)
               : awaitTaggedWord(a.tagged + e, tag, 20, &bits);
    const float mine = __uint_as_float(bits);
    a.logits[e] = mine;
    if constexpr (kWarps) {
      routerChooseGlm5Warps(a, mine, arrived, bias, tag, idTag);
      return;
    }
    if (routerLogitsLost(a, arrived, tag, idTag))
      return;
    routerChooseSorted<true,
                       RouterFixed{kRouterThreads, glm5::kExperts,
                                   glm5::kTopK},
                       true>(a.logits, a.experts, a.bias, a.topK, a.gating,
                             a.normalize, a.routedScale, a.ids, a.weights,
                             shared, mine, a.taggedIds, idTag);
    return;
  }
  __syncthreads(); // this block's logits are written
  if (threadIdx.x == 0) {
    // The arrival releases the block's logits (ordered before it by the
    // block barrier) and acquires those of the blocks before it, so the
    // last block, after the barrier below, reads them all (from the L2:
    // routerScores). One acquire-release atomic, not a sequentially
    // consistent fence (membar.gl) before a relaxed one and another in
    // every thread of the last block.
    unsigned ticket;
    asm volatile("atom.acq_rel.gpu.global.inc.u32 %0, [%1], %2;"
                 : "=r"(ticket)
                 : "l"(a.arrivals), "r"(gridDim.x - 1)
                 : "memory");
    last = ticket == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) // the same for the whole block
    return;
  if constexpr (kForm == RouterForm::Ranked)
    routerChooseSorted<true>(a.logits, a.experts, a.bias, a.topK, a.gating,
                             a.normalize, a.routedScale, a.ids, a.weights,
                             shared);
  else
    routerChoose(a.logits, a.experts, a.bias, a.topK, a.gating, a.normalize,
                 a.routedScale, a.ids, a.weights, shared);
}

//===----------------------------------------------------------------------===//
// Arg-max: one block.
//===----------------------------------------------------------------------===//

/// The CPU's sequential scan (`x[i] > x[best]` from best = 0) as a total
/// order: a NaN at index 0 wins (nothing is greater than it), a NaN
/// elsewhere never does.
__device__ inline Best argmaxKey(float v, int64_t i) {
  if (isnan(v))
    return Best{i == 0 ? INFINITY : -INFINITY, int32_t(i)};
  return Best{v, int32_t(i)};
}

/// A draw as every thread of a kernel reads it: scale = 1 / T (0: the
/// plain argmax), the seed, the position, the nucleus's share (0: none),
/// min-p's floor and top-k's count, then its cut (weight bits; 0: every
/// token) at `top`.
struct DrawState {
  float scale = 0;
  uint64_t seed = 0;
  uint32_t position = 0;
  float topP = 0;
  uint32_t floor = 0; ///< min-p's weight bits (0: none)
  int32_t topK = 0;   ///< 0: none
  float top = 0;
  uint32_t cut = 0;
  __device__ bool cuts() const {
    return topP != 0.0f || floor != 0 || topK != 0;
  }
};

/// Reads the draw's words; false (thread 0 having reported the first bad
/// word) when they are invalid, or name a nucleus where the kernel sees
/// only a part of the vocabulary (`whole` false).
__device__ bool readDraw(const DrawInputs &d, DrawState &state,
                         bool whole = true, bool report = true) {
  if (!d.words)
    return true;
  // Every index fixed (unrolled), so the words stay in registers. The
  // adjusting form's first eight are the eight's (its count bounds word
  // 6).
  const int count =
      d.count >= draw::kDrawWords ? d.count : draw::kTemperatureWords;
  int32_t words[draw::kDrawWords];
#pragma unroll
  for (int i = 0; i < draw::kDrawWords; ++i)
    words[i] = i < count ? d.words[i] : 0;
  const int32_t position = *d.position;
  draw::DrawParams params;
  int bad = 0;
  bool valid = draw::readWords(words, count, params, bad);
  if (valid && params.cuts() && !whole) {
    valid = false;
    bad = params.cutWord();
  }
  if (!valid) {
    uint32_t bits = 0;
#pragma unroll
    for (int i = 0; i < draw::kDrawWords; ++i)
      bits = i == bad ? uint32_t(words[i]) : bits;
    if (threadIdx.x == 0 && report)
      recordFault(d.fault, FaultCode::SamplingOutOfRange, bad, int64_t(bits));
    return false;
  }
  state.scale = params.temperature == 0.0f ? 0.0f : 1.0f / params.temperature;
  state.seed = params.seed;
  state.position = uint32_t(position);
  state.topP = params.topP;
  state.floor = draw::floatBits(params.minP);
  state.topK = params.topK;
  return true;
}

/// Value i's key: x[i] itself, or its draw key for index base + i
/// (-infinity outside a nucleus's cut).
__device__ inline float drawnValue(const float *x, int64_t i, int32_t base,
                                   const DrawState &d) {
  if (d.scale == 0.0f)
    return x[i];
  const float key = draw::drawKey(x[i], d.scale, d.seed, d.position,
                                  uint32_t(int64_t(base) + i));
  if (d.cut != 0 && draw::weightBits(x[i], d.top, d.scale) < d.cut)
    return -INFINITY;
  return key;
}

__device__ Best blockArgmax(const float *x, int64_t n, int32_t base,
                            const DrawState &d, Best *shared) {
  Best best{-INFINITY, INT_MAX};
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    best = better(best, argmaxKey(drawnValue(x, i, base, d), i));
  return blockBest(best, shared);
}

/// The nucleus's shared state in one block.
struct NucleusShared {
  unsigned long long bins[draw::kNucleusBins];
  unsigned long long warpSums[kSingleBlockThreads / kWarp];
  draw::NucleusCut cut;
  float warpTops[kSingleBlockThreads / kWarp];
  int digit;
};

/// Sums `v` from lane l up to the warp's last lane (a suffix sum).
__device__ inline unsigned long long warpSuffix(unsigned long long v) {
  const int lane = threadIdx.x % kWarp;
  for (int offset = 1; offset < kWarp; offset *= 2) {
    const unsigned long long u = __shfl_down_sync(kFullMask, v, offset);
    if (lane + offset < kWarp)
      v += u;
  }
  return v;
}

/// draw::nucleusStep by the whole block: the highest digit d at which
/// before + the bins of the digits >= d reach want (a share p of the
/// masses, or with p = 0 a count k), each thread taking its own digits
/// (suffix sums over the block). The same digit and state as the
/// sequential step.
__device__ void blockNucleusStep(NucleusShared &s, int pass, float p,
                                 int32_t k) {
  const int count = 1 << draw::digitWidth(pass);
  const int per = (count + int(blockDim.x) - 1) / int(blockDim.x);
  const int lo = int(threadIdx.x) * per,
            hi = lo + per < count ? lo + per : count;
  unsigned long long mine = 0;
  for (int d = lo; d < hi; ++d)
    mine += s.bins[d];
  // This thread's digits and every later thread's.
  const unsigned long long inWarp = warpSuffix(mine);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = int(blockDim.x) / kWarp;
  if (lane == 0)
    s.warpSums[warp] = inWarp;
  if (threadIdx.x == 0)
    s.digit = -1;
  __syncthreads();
  unsigned long long later = 0; // the warps after this one
  for (int w = warp + 1; w < warps; ++w)
    later += s.warpSums[w];
  if (pass == 0) {
    unsigned long long total = 0;
    for (int w = 0; w < warps; ++w)
      total += s.warpSums[w];
    if (threadIdx.x == 0) {
      s.cut.want = draw::firstWant(total, p, k);
      s.cut.before = 0;
      s.cut.prefix = 0;
    }
    __syncthreads();
  }
  const uint64_t want = s.cut.want, before = s.cut.before;
  if (want != 0) {
    unsigned long long above = inWarp - mine + later; // digits >= hi
    for (int d = hi - 1; d >= lo; --d) {
      above += s.bins[d];
      if (before + above >= want) {
        atomicMax(&s.digit, d); // the highest thread's own highest
        break;
      }
    }
  }
  __syncthreads();
  const int d = s.digit;
  if (want != 0 && d >= lo && d < hi && d >= 0) {
    unsigned long long above = inWarp - mine + later;
    for (int e = hi - 1; e > d; --e)
      above += s.bins[e];
    s.cut.before = before + above;
    s.cut.prefix |= uint32_t(d) << draw::digitShift(pass);
  }
  if (want != 0 && d < 0 && threadIdx.x == 0)
    s.cut.want = 0;
  __syncthreads();
}

/// One selection over x[0, n)'s weights at `top` by one block, into s.cut:
/// by masses at or above `floor` for a share p, or by counts for k tokens
/// (p 0; DrawKey.h's radixCutOfBits).
__device__ void blockRadix(const float *x, int64_t n, float top, float scale,
                           float p, int32_t k, uint32_t floor,
                           NucleusShared &s) {
  const bool counting = p == 0.0f;
  for (int pass = 0; pass < draw::kNucleusPasses; ++pass) {
    for (int b = threadIdx.x; b < draw::kNucleusBins; b += blockDim.x)
      s.bins[b] = 0;
    __syncthreads();
    const uint32_t prefix = s.cut.prefix;
    if (pass == 0 || s.cut.want != 0)
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const uint32_t bits = draw::weightBits(x[i], top, scale);
        const uint64_t unit = draw::passUnit(bits, floor, counting);
        if (unit != 0 && (pass == 0 || draw::nucleusCandidate(bits, prefix,
                                                              pass)))
          atomicAdd(&s.bins[draw::nucleusDigit(bits, pass)],
                    (unsigned long long)unit);
      }
    __syncthreads();
    blockNucleusStep(s, pass, p, k);
  }
}

/// The cut of a draw over x[0, n) by one block, into d.top and d.cut
/// (DrawKey.h: the same as nucleusCutOf): top-k's floor, then the nucleus
/// over what it and min-p's keep.
__device__ void blockNucleus(const float *x, int64_t n, DrawState &d,
                             NucleusShared &s) {
  float top = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    top = x[i] > top ? x[i] : top; // NaN ignored, as nucleusTop
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(kFullMask, top, offset);
    top = other > top ? other : top;
  }
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0)
    s.warpTops[warp] = top;
  __syncthreads();
  top = s.warpTops[0];
  for (int w = 1; w < int(blockDim.x) / kWarp; ++w)
    top = s.warpTops[w] > top ? s.warpTops[w] : top;
  d.top = top;
  uint32_t floor = d.floor;
  if (d.topK != 0) {
    blockRadix(x, n, top, d.scale, 0.0f, d.topK, 0, s);
    const uint32_t kept = draw::nucleusBits(s.cut);
    floor = kept > floor ? kept : floor;
  }
  if (d.topP == 0.0f) { // a floor alone
    d.cut = draw::floorCut(top, floor);
    return;
  }
  blockRadix(x, n, top, d.scale, d.topP, 0, floor, s);
  d.cut = draw::nucleusBits(s.cut);
}

__global__ void argmaxKernel(const float *x, int64_t n, int32_t *out,
                             DrawInputs draw) {
  stepKernelPrologue();
  __shared__ Best bests[kWarp];
  __shared__ NucleusShared nucleus;
  DrawState d;
  if (!readDraw(draw, d)) { // uniform over the block
    if (threadIdx.x == 0)
      *out = -1;
    return;
  }
  if (d.cuts() && n > 0)
    blockNucleus(x, n, d, nucleus);
  const Best best = blockArgmax(x, n, 0, d, bests);
  if (threadIdx.x == 0)
    *out = n > 0 ? best.index : -1;
}

__global__ void argmaxCandidateKernel(const float *x, int64_t n, int32_t base,
                                      ArgmaxCandidate *out, DrawInputs draw) {
  stepKernelPrologue();
  __shared__ Best bests[kWarp];
  DrawState d;
  if (!readDraw(draw, d, /*whole=*/false)) {
    if (threadIdx.x == 0)
      *out = ArgmaxCandidate{-INFINITY, -1};
    return;
  }
  const Best best = blockArgmax(x, n, base, d, bests);
  if (threadIdx.x == 0)
    *out = ArgmaxCandidate{drawnValue(x, best.index, base, d),
                           base + best.index};
}

__global__ void argmaxSlotsKernel(const float *x, int64_t n, int32_t base,
                                  int ranks, int me, float *slots,
                                  DrawInputs draw) {
  stepKernelPrologue();
  __shared__ Best bests[kWarp];
  DrawState d;
  if (!readDraw(draw, d, /*whole=*/false)) {
    if (threadIdx.x == 0) {
      slots[me] = -INFINITY;
      slots[ranks + me] = -1.0f;
    }
    return;
  }
  const Best best = blockArgmax(x, n, base, d, bests);
  if (threadIdx.x == 0) {
    slots[me] = drawnValue(x, best.index, base, d);
    slots[ranks + me] = float(base + best.index);
  }
}

//===----------------------------------------------------------------------===//
// The nucleus by a grid of blocks (launchNucleusArgmax): eight kernels,
// each block over its own chunk of the vocabulary and the last block to
// arrive (an acquire-release ticket) combining: the largest logit; top-k's
// three passes of counts (the first keeping the weights' bits); the
// nucleus's three of masses (the first keeping the bits where top-k did
// not); the keys of the kept tokens and their best. The kernels a draw does
// not need return at once. The same cuts, sums and index as blockNucleus
// and blockArgmax.
//===----------------------------------------------------------------------===//

constexpr int kNucleusThreads = 256;
constexpr int kNucleusMaxBlocks = 128;

/// The state the kernels share (in the launch's scratch, after it the
/// weights' bits). Zero before the first launch; each launch leaves the
/// bins zero and the ticket wrapped to zero.
struct NucleusState {
  unsigned long long bins[draw::kNucleusBins];
  draw::NucleusCut cut;
  uint32_t floor; ///< after top-k's passes: its floor and min-p's, higher
  float top;
  unsigned arrivals;
  float blockTops[kNucleusMaxBlocks];
  Best blockBests[kNucleusMaxBlocks];
};

/// Whether this block arrived last at the kernel's ticket (after its writes
/// are ordered before the arrival; the last block's reads after it).
__device__ bool lastToArrive(unsigned *arrivals) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned ticket;
    asm volatile("atom.acq_rel.gpu.global.inc.u32 %0, [%1], %2;"
                 : "=r"(ticket)
                 : "l"(arrivals), "r"(gridDim.x - 1)
                 : "memory");
    last = ticket == gridDim.x - 1;
  }
  __syncthreads();
  return last;
}

/// This block's chunk of n values.
__device__ inline void nucleusChunk(int64_t n, int64_t &begin, int64_t &end) {
  begin = n * blockIdx.x / gridDim.x;
  end = n * (blockIdx.x + 1) / gridDim.x;
}

__global__ void __launch_bounds__(kNucleusThreads)
    nucleusTopKernel(const float *x, int64_t n, NucleusState *state,
                     DrawInputs draw) {
  stepKernelPrologue();
  DrawState d;
  if (!readDraw(draw, d, true, false) || !d.cuts())
    return; // the same for every block: no cut (keysKernel)
  int64_t begin, end;
  nucleusChunk(n, begin, end);
  float top = -INFINITY;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    top = x[i] > top ? x[i] : top; // NaN ignored, as nucleusTop
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(kFullMask, top, offset);
    top = other > top ? other : top;
  }
  __shared__ float warpTops[kNucleusThreads / kWarp];
  if (threadIdx.x % kWarp == 0)
    warpTops[threadIdx.x / kWarp] = top;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < int(blockDim.x) / kWarp; ++w)
      top = warpTops[w] > top ? warpTops[w] : top;
    state->blockTops[blockIdx.x] = top;
  }
  if (!lastToArrive(&state->arrivals))
    return;
  if (threadIdx.x == 0) {
    float all = state->blockTops[0];
    for (unsigned b = 1; b < gridDim.x; ++b)
      all = state->blockTops[b] > all ? state->blockTops[b] : all;
    state->top = all;
  }
}

/// Pass `pass` of a selection: top-k's counts (`counting`) or the
/// nucleus's masses. The first pass to run makes each weight's bits (kept
/// in `bits`) and sums every token by digit; the later passes the
/// candidates' from the kept bits. The last block takes the digit, and
/// after top-k's passes the floor.
__global__ void __launch_bounds__(kNucleusThreads)
    nucleusPassKernel(const float *x, int64_t n, NucleusState *state,
                      uint32_t *bits, int pass, bool counting,
                      DrawInputs draw) {
  stepKernelPrologue();
  DrawState d;
  if (!readDraw(draw, d, true, false) ||
      (counting ? d.topK == 0 : d.topP == 0.0f))
    return;
  __shared__ NucleusShared shared;
  const uint64_t wanted = state->cut.want;
  if (pass > 0 && wanted == 0)
    return; // no cut (the first pass found none): every block alike
  const bool making = pass == 0 && (counting || d.topK == 0);
  // The masses' floor: min-p's, or with top-k the higher of the two.
  const uint32_t floor = counting ? 0 : d.topK != 0 ? state->floor : d.floor;
  for (int b = threadIdx.x; b < draw::kNucleusBins; b += blockDim.x)
    shared.bins[b] = 0;
  __syncthreads();
  int64_t begin, end;
  nucleusChunk(n, begin, end);
  const float top = state->top;
  const uint32_t prefix = state->cut.prefix;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    uint32_t w;
    if (making) {
      w = draw::weightBits(x[i], top, d.scale);
      bits[i] = w;
    } else {
      w = bits[i];
      if (pass > 0 && !draw::nucleusCandidate(w, prefix, pass))
        continue;
    }
    const uint64_t unit = draw::passUnit(w, floor, counting);
    if (unit != 0)
      atomicAdd(&shared.bins[draw::nucleusDigit(w, pass)],
                (unsigned long long)unit);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < draw::kNucleusBins; b += blockDim.x)
    if (shared.bins[b] != 0)
      atomicAdd(&state->bins[b], shared.bins[b]);
  if (!lastToArrive(&state->arrivals))
    return;
  // The sums of every block, read once and left zero for the next pass.
  for (int b = threadIdx.x; b < draw::kNucleusBins; b += blockDim.x) {
    shared.bins[b] = state->bins[b];
    state->bins[b] = 0;
  }
  if (threadIdx.x == 0)
    shared.cut = state->cut;
  __syncthreads();
  blockNucleusStep(shared, pass, counting ? 0.0f : d.topP,
                   counting ? d.topK : 0);
  if (threadIdx.x == 0) {
    state->cut = shared.cut;
    // Each of top-k's passes leaves the floor so far; the last one run
    // leaves its own.
    if (counting) {
      const uint32_t kept = draw::nucleusBits(shared.cut);
      state->floor = kept > d.floor ? kept : d.floor;
    }
  }
}

/// The best key among the nucleus's tokens (every token where there is no
/// cut; the values themselves at temperature 0): each block's, then the
/// last block's pick into *out (-1 for bad words, reported here).
__global__ void __launch_bounds__(kNucleusThreads)
    nucleusKeysKernel(const float *x, int64_t n, NucleusState *state,
                      const uint32_t *bits, int32_t *out, DrawInputs draw) {
  stepKernelPrologue();
  DrawState d;
  if (!readDraw(draw, d, true, blockIdx.x == 0)) {
    if (blockIdx.x == 0 && threadIdx.x == 0)
      *out = -1;
    return;
  }
  // The cut: the nucleus's, a floor alone (top-k's or min-p's), or none.
  // The passes kept each weight's bits; min-p alone makes them here.
  const float top = d.cuts() ? state->top : 0.0f;
  const bool kept = d.topP != 0.0f || d.topK != 0;
  const uint32_t cut =
      d.topP != 0.0f ? draw::nucleusBits(state->cut)
      : d.cuts()     ? draw::floorCut(top, d.topK != 0 ? state->floor : d.floor)
                     : 0;
  int64_t begin, end;
  nucleusChunk(n, begin, end);
  Best best{-INFINITY, INT_MAX};
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    if (cut != 0 &&
        (kept ? bits[i] : draw::weightBits(x[i], top, d.scale)) < cut)
      continue; // outside the cut: -infinity, never the best
    const float v =
        d.scale == 0.0f
            ? x[i]
            : draw::drawKey(x[i], d.scale, d.seed, d.position, uint32_t(i));
    best = better(best, argmaxKey(v, i));
  }
  __shared__ Best bests[kWarp];
  best = blockBest(best, bests);
  if (threadIdx.x == 0)
    state->blockBests[blockIdx.x] = best;
  if (!lastToArrive(&state->arrivals))
    return;
  if (threadIdx.x == 0) {
    Best all = state->blockBests[0];
    for (unsigned b = 1; b < gridDim.x; ++b)
      all = better(all, state->blockBests[b]);
    *out = n > 0 ? all.index : -1;
  }
}

/// The logits' adjustments (DrawKey.h's adjusting form): y = x, then the
/// entries within this part (x holds tokens base .. base + n) adjusted,
/// each block over its own chunk. Bad words (any of them, every entry
/// checked) leave y = x and are reported once, by block 0; the draw's
/// kernels then fault too where word 6 is bad, and the step reports the
/// first fault either way.
constexpr int kAdjustThreads = 256;
/// One block a multiprocessor is enough (GLM-5's whole vocabulary is 76
/// blocks): without that bound ptxas held it to 32 registers on sm_100 and
/// spilled.
__global__ void __launch_bounds__(kAdjustThreads, 1)
    adjustLogitsKernel(const float *x, int64_t n, int64_t base, int64_t vocab,
                       float *y, DrawInputs draw) {
  stepKernelPrologue();
  int64_t begin, end;
  nucleusChunk(n, begin, end);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    y[i] = x[i];
  const int32_t *words = draw.words;
  const int capacity = draw::adjustCapacity(draw.count);
  const int32_t entries = words[6];
  // The words as readWords (the eight), readPenalties and readEntry check
  // them: the first bad one's index over the block, by the lowest thread
  // that saw one.
  __shared__ int firstBad;
  if (threadIdx.x == 0)
    firstBad = INT_MAX;
  __syncthreads();
  draw::Penalties penalties;
  int bad = 0;
  if (threadIdx.x == 0) {
    draw::DrawParams params;
    if (!draw::readWords(words, draw.count, params, bad) ||
        !draw::readPenalties(words, penalties, bad))
      atomicMin(&firstBad, bad);
  }
  const bool counted = entries >= 0 && entries <= capacity;
  draw::Adjustment entry;
  if (counted)
    for (int e = threadIdx.x; e < entries; e += blockDim.x)
      if (!draw::readEntry(words, e, vocab, entry, bad))
        atomicMin(&firstBad, bad);
  __syncthreads();
  if (firstBad != INT_MAX) {
    if (blockIdx.x == 0 && threadIdx.x == 0)
      recordFault(draw.fault, FaultCode::SamplingOutOfRange, firstBad,
                  int64_t(uint32_t(words[firstBad])));
    return;
  }
  draw::readPenalties(words, penalties, bad);
  for (int e = threadIdx.x; e < entries; e += blockDim.x) {
    draw::readEntry(words, e, vocab, entry, bad);
    const int64_t i = int64_t(entry.id) - base;
    if (i >= begin && i < end)
      y[i] = draw::adjustLogit(x[i], entry.bias, entry.count, penalties);
  }
}

__global__ void pickSlotsKernel(const float *slots, int ranks, int32_t *out) {
  stepKernelPrologue();
  int top = 0;
  for (int q = 1; q < ranks; ++q)
    if (slots[q] > slots[top])
      top = q;
  *out = int32_t(slots[ranks + top]);
}

__global__ void pickCandidateKernel(const ArgmaxCandidate *candidates,
                                    int ranks, int32_t *out) {
  stepKernelPrologue();
  ArgmaxCandidate top = candidates[0];
  for (int q = 1; q < ranks; ++q)
    if (candidates[q].value > top.value)
      top = candidates[q];
  *out = top.index;
}

//===----------------------------------------------------------------------===//
// Random fillers: one thread per byte (quantised blocks) or per value
// (float types), each a hash of (seed, its index), so the bytes depend on
// the seed alone.
//===----------------------------------------------------------------------===//

/// Up to two f16 fields per block that must hold finite values (d, and dmin
/// or m), at these byte offsets; -1 for none.
struct ScaleFields {
  int32_t blockBytes;
  int32_t first, second;
};

/// f16 bits 0x1400 .. 0x2400 are 2^-10 .. 2^-6: small, positive, normal.
constexpr uint16_t kScaleLow = 0x1400, kScaleSpan = 0x1000;

__global__ void fillBlocksKernel(ScaleFields f, uint8_t *data, uint64_t bytes,
                                 uint64_t seed) {
  stepKernelPrologue();
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes;
       i += uint64_t(gridDim.x) * blockDim.x) {
    const uint64_t block = i / f.blockBytes;
    const int32_t at = int32_t(i % f.blockBytes);
    int field = -1, byte = 0;
    if (f.first >= 0 && at >= f.first && at < f.first + 2) {
      field = 0;
      byte = at - f.first;
    } else if (f.second >= 0 && at >= f.second && at < f.second + 2) {
      field = 1;
      byte = at - f.second;
    }
    if (field < 0) {
      data[i] = uint8_t(randomAt(seed, i));
      continue;
    }
    // Both bytes of a field hash the same (block, field) counter, offset
    // past every byte index so the streams do not overlap.
    const uint64_t r = randomAt(~seed, 2 * block + uint64_t(field));
    const uint16_t h = uint16_t(kScaleLow + r % (kScaleSpan + 1));
    data[i] = uint8_t(byte == 0 ? h & 0xff : h >> 8);
  }
}

/// `elementBytes` 4 (f32), or 2 with `bf16` choosing bf16 over f16. Values
/// in [-1, 1): converted toward zero so none rounds up to 1.
__global__ void fillFloatsKernel(uint8_t *data, uint64_t count,
                                 int elementBytes, bool bf16, uint64_t seed) {
  stepKernelPrologue();
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += uint64_t(gridDim.x) * blockDim.x) {
    const float v = unitFloat(randomAt(seed, i));
    uint8_t *p = data + i * elementBytes;
    if (elementBytes == 4) {
      const uint32_t bits = __float_as_uint(v);
      for (int b = 0; b < 4; ++b)
        p[b] = uint8_t(bits >> (8 * b));
      continue;
    }
    const uint16_t bits = bf16 ? __bfloat16_as_ushort(__float2bfloat16_rz(v))
                               : __half_as_ushort(__float2half_rz(v));
    p[0] = uint8_t(bits & 0xff);
    p[1] = uint8_t(bits >> 8);
  }
}

//===----------------------------------------------------------------------===//
// Host-side checks
//===----------------------------------------------------------------------===//

/// Fills `g` for a weight the generic decoder can read; false when the
/// type, the row length or the sizes are unusable.
bool geometryOf(const DeviceWeight &w, Geometry &g) {
  std::optional<uint64_t> bytes = usableRowBytes(w);
  if (!bytes)
    return false;
  const GGMLTypeTraits &t = traitsOf(w.type);
  g = Geometry{w.type,
               w.rows,
               int32_t(w.cols),
               *bytes,
               int32_t(t.blockSize),
               int32_t(t.blockBytes)};
  return true;
}

bool validCache(const DeviceCache &c) {
  return c.data && c.positions > 0 && c.width > 0 &&
         (c.type == CacheType::F32 || c.type == CacheType::F16 ||
          c.type == CacheType::BF16);
}

unsigned positionBlocks(int64_t positions) {
  int64_t blocks = (positions + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return unsigned(blocks < kMaxPositionBlocks ? blocks : kMaxPositionBlocks);
}

} // namespace

//===----------------------------------------------------------------------===//
// Launches
//===----------------------------------------------------------------------===//

cudaError_t launchAdd(const float *a, const float *b, int64_t n, float *y,
                      cudaStream_t s) {
  if (n < 0)
    return cudaErrorInvalidValue;
  if (n > 0)
    if (cudaError_t e = launchStep(addKernel, elementBlocks(n), kElementThreads,
                                   0, s, a, b, n, y);
        e != cudaSuccess)
      return e;
  return cudaGetLastError();
}

cudaError_t launchRingTraffic(const float *x, int64_t n, int64_t count,
                              float *y, cudaStream_t s) {
  if (n <= 0 || count < 0 || !x || !y)
    return cudaErrorInvalidValue;
  if (count > 0)
    if (cudaError_t e = launchStep(ringTrafficKernel, elementBlocks(count),
                                   kElementThreads, 0, s, x, n, count, y);
        e != cudaSuccess)
      return e;
  return cudaGetLastError();
}

cudaError_t launchSwiglu(const float *g, const float *u, int64_t n, float *y,
                         cudaStream_t s) {
  if (n < 0)
    return cudaErrorInvalidValue;
  if (n > 0)
    if (cudaError_t e = launchStep(swigluKernel, elementBlocks(n),
                                   kElementThreads, 0, s, g, u, n, y);
        e != cudaSuccess)
      return e;
  return cudaGetLastError();
}

namespace {

/// Values a thread of the register-resident norms holds.
constexpr int kNormRegs = 8;

/// Threads of a register-resident norm of n values: whole warps, at most
/// kNormThreads, and few enough that each holds several values (n = 6144:
/// 1024 threads of 6; n = 512: 128 of 4).
unsigned normThreads(int64_t n) {
  int64_t warps = (n + 4 * kWarp - 1) / (4 * kWarp);
  warps = warps < 1 ? 1 : warps;
  const int64_t threads = warps * kWarp;
  return unsigned(threads < kNormThreads ? threads : kNormThreads);
}

} // namespace

cudaError_t launchRmsNorm(const float *x, int64_t rows, int64_t n,
                          const float *w, float eps, float *y, cudaStream_t s) {
  if (rows < 0 || n <= 0 || rows > INT_MAX || !w)
    return cudaErrorInvalidValue;
  if (rows > 0) {
    // A row of up to kNormRegs values a thread stays in registers.
    const cudaError_t e =
        n <= kNormRegs * kNormThreads
            ? launchStep(rmsNormRegsKernel<kNormRegs>, unsigned(rows),
                         normThreads(n), 0, s, x, n, w, eps, y)
            : launchStep(rmsNormKernel, unsigned(rows), kNormThreads, 0, s, x,
                         n, w, eps, y);
    if (e != cudaSuccess)
      return e;
  }
  return cudaGetLastError();
}

cudaError_t launchAddRmsNorm(const float *a, const float *b, int64_t rows,
                             int64_t n, const float *w, float eps, float *sum,
                             float *y, cudaStream_t s, const float *tailIn,
                             int64_t tailN, float *tailOut) {
  if (rows < 0 || n <= 0 || rows > INT_MAX || !w || tailN < 0 ||
      (tailN > 0 &&
       (rows != 1 || !tailIn || !tailOut || n > kNormRegs * kNormThreads)))
    return cudaErrorInvalidValue;
  if (rows > 0) {
    const RmsTail tail{tailIn, tailN, tailOut};
    const cudaError_t e =
        n <= kNormRegs * kNormThreads
            ? launchStep(addRmsNormRegsKernel<kNormRegs>, unsigned(rows),
                         normThreads(n), 0, s, a, b, n, w, eps, sum, y, tail)
            : launchStep(addRmsNormKernel, unsigned(rows), kNormThreads, 0, s,
                         a, b, n, w, eps, sum, y);
    if (e != cudaSuccess)
      return e;
  }
  return cudaGetLastError();
}

//===----------------------------------------------------------------------===//
// One-shot all-reduce over peers (StepKernels.h PeerExchange).
//===----------------------------------------------------------------------===//

namespace {

constexpr int kPeerThreads = 256;
constexpr int kPeerPer = 4; ///< values a thread

__device__ inline void storeRelease(uint32_t *p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v)
               : "memory");
}

__device__ inline uint32_t loadAcquire(const uint32_t *p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];"
               : "=r"(v)
               : "l"(p)
               : "memory");
  return v;
}

/// The part at `p` once it carries `tag`; a block that has not stored it
/// within kDeviceWaitNs is reported (the kernel's `blocks` did not all run)
/// and read as 0.
__device__ inline float waitTagged(const uint64_t *p, uint32_t tag,
                                   FaultSink fault, int64_t blocks) {
  uint32_t bits = 0;
  if (!awaitTaggedWord(p, tag, 0, &bits)) {
    recordFault(fault, FaultCode::GridWaitTimeout, blocks, 0);
    return 0.f;
  }
  return __uint_as_float(bits);
}

/// Waits until *word has reached `target` (modulo 2^32), or reports the
/// timeout as rank `who` and gives up.
__device__ inline void waitFor(const uint32_t *word, uint32_t target,
                               FaultSink fault, int64_t who) {
  const uint64_t start = globalNanos();
  while (int32_t(loadAcquire(word) - target) < 0) {
    if (globalNanos() - start > kDeviceWaitNs) {
      recordFault(fault, FaultCode::PeerTimeout, who, target);
      return;
    }
    __nanosleep(64);
  }
}

size_t routerChoiceShared(int64_t experts, int64_t topK,
                          unsigned blockThreads);

struct PeerArgs {
  PeerExchange p;
  const float *x;
  int64_t rows, n;
  bool sum;
  const float *residual, *w;
  float eps;
  float *out, *y;
  FaultSink fault;
  /// The router tail (kiln-fold-router; rows = 1): x's `tail` values after
  /// its n, reduced with them, then divided by the rms into `logits`.
  int64_t tail;
  float *logits;
  /// The router's choice from the logits (choice.topK > 0), by the block
  /// holding the tail's last value (dynamic shared memory:
  /// routerChoiceShared).
  RouterChoice choice;
  /// Direct slots: x is this rank's slots + site, already where the peers
  /// read it; -1: x is copied into the call's parity.
  int64_t site;
  /// The step's epochs (beginStepEpochs): the call's epoch is *epochBase +
  /// call + 1; null: each block's last epoch + 1, from the exchange.
  const uint32_t *epochBase;
  int32_t call;
};

/// One cluster of kPeerBlocks blocks; block b takes values [b * chunk,
/// (b + 1) * chunk) of the rows x n (flat), thread t those at t + k *
/// kPeerThreads.
/// kChoice: the router's choice after the tail (a.choice); its own
/// instantiation, so that the all-reduces without one keep their
/// registers (with the choice's code inlined into the one kernel every
/// all-reduce of a GLM-5 step took ~0.7 us longer).
/// kCluster: the blocks are one cluster (allReducePeersKernel); without
/// (allReducePeersFlatKernel, neither the fused norm nor the choice) the
/// same blocks need not be placed together.
/// kN > 0 (with kRanks): one row of kN values over kRanks ranks, no tail,
/// compiled in (the flat kernel's GLM-5 form; checked at launch): a
/// thread's values are whole and need no bounds, its row 0.
template <bool kChoice, bool kCluster, int kN = 0, int kRanks = 0>
__device__ __forceinline__ void allReducePeersBody(const PeerArgs &a) {
  static_assert(kCluster || !kChoice);
  constexpr bool kShaped = kN > 0;
  static_assert(!kShaped ||
                (!kChoice && kN % (kPeerBlocks * kPeerThreads) == 0 &&
                 kN / (kPeerBlocks * kPeerThreads) <= kPeerPer &&
                 kRanks > 0 && kRanks <= kMaxPeers));
  // The values a thread holds.
  constexpr int kPer = kShaped ? kN / (kPeerBlocks * kPeerThreads) : kPeerPer;
  const int64_t rows = kShaped ? 1 : a.rows, n = kShaped ? kN : a.n,
                tail = kShaped ? 0 : a.tail;
  const int ranks = kShaped ? kRanks : int(a.p.ranks);
  // The step's epoch before the wait: its word is written only by the last
  // kernel of the step before (launchAdvanceEpochs), which has ended. From
  // the L2: this kernel's L1 is not trusted before its wait.
  const bool stepEpoch = a.epochBase != nullptr;
  const uint32_t known =
      stepEpoch ? __ldcg(a.epochBase) + uint32_t(a.call) + 1u : 0u;
  __shared__ uint32_t epochShared;
  __shared__ float partials[kWarp];
  __shared__ float rowParts[kMaxPeerRows][kPeerBlocks], rms[kMaxPeerRows];
  namespace cg = cooperative_groups;
  // fused: the residual add and the norm (all_reduce_add_rms_norm); added:
  // the add alone (all_reduce_add).
  const bool fused = a.w != nullptr, added = a.residual != nullptr;
  const int b = int(blockIdx.x);
  const int64_t body = rows * n, total = body + tail;
  const int64_t chunk = (total + kPeerBlocks - 1) / kPeerBlocks;
  const int64_t first = int64_t(b) * chunk;
  const int64_t last = first + chunk < total ? first + chunk : total;
  // Whether value f is this block's (always, where the shape is compiled
  // in: the blocks' chunks are whole).
  auto ours = [&](int64_t f) { return kShaped || f < last; };
  // This rank's part into its slots of the call's parity (not with direct
  // slots: its producer wrote it there; pushed, into its slot in every
  // rank's exchange, so that flags and reads are local, a direct slot then
  // only where x is); the residual loaded with it, in flight together.
  const bool push = a.p.push >= 0, direct = a.site >= 0 && !push;
  // A value's row and column, without a 64-bit division where there is one
  // row (a decode step's: the division is a long instruction sequence on
  // the path, three times a value).
  const bool oneRow = rows == 1;
  auto rowOf = [&](int64_t f) { return oneRow ? 0 : int(f / n); };
  auto columnOf = [&](int64_t f) { return oneRow ? f : f % n; };
  // The norm's weights before the wait: no kernel of a step writes a
  // weight, so their loads cross no hazard and are in flight across it.
  float v[kPeerPer], r[kPeerPer], g[kPeerPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t f = first + threadIdx.x + k * kPeerThreads;
    g[k] = fused && f < body ? a.w[columnOf(f)] : 0.f;
  }
  stepKernelPrologue();
  // A block may store into another's shared memory only once that one has
  // started: the fused op's blocks arrive at a cluster barrier here and
  // wait before those stores, so its latency passes under the loads.
  if constexpr (kCluster)
    if (fused)
      cg::this_cluster().barrier_arrive();
  if (threadIdx.x == 0 && !stepEpoch)
    epochShared = a.p.epochs[b] + 1;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t f = first + threadIdx.x + k * kPeerThreads;
    const bool in = ours(f) && !direct;
    v[k] = in ? a.x[f] : 0.f;
    r[k] = added && f < body ? a.residual[f] : 0.f;
  }
  __syncthreads();
  const uint32_t e = stepEpoch ? known : epochShared;
  // Pulled: rank q's part at slots[q] + at. Pushed: at slots[me] + at +
  // q * capacity, its flags after both parities (PeerExchange::push).
  const int64_t cap = a.p.capacity;
  const int64_t at = push     ? a.p.push + int64_t(e & 1u) * ranks * cap
                     : direct ? a.site
                              : int64_t(e & 1u) * cap;
  auto pushFlag = [&](int q, int from) {
    return reinterpret_cast<uint32_t *>(a.p.slots[q] + a.p.push +
                                        2 * ranks * cap) +
           from * kPeerBlocks + b;
  };
  if (!direct) {
    // Pulled: into this rank's own slots; pushed: into its slot in every
    // rank's exchange.
    const int from = push ? 0 : a.p.me, to = push ? ranks : a.p.me + 1;
    const int64_t mine = at + (push ? a.p.me * cap : 0);
    for (int q = from; q < to; ++q) {
      float *there = a.p.slots[q] + mine;
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int64_t f = first + threadIdx.x + k * kPeerThreads;
        if (ours(f))
          there[f] = v[k];
      }
    }
  }
  // The block's writes, then one system-scope fence and release by thread
  // 0 (the barrier orders the other threads' writes before them, as a
  // cooperative grid barrier does): peers read the slots over NVLink, or
  // (pushed) find this rank's part and flag already in their memory.
  __syncthreads();
  if (threadIdx.x == 0) {
    a.p.epochs[b] = e;
    if (!a.p.local) {
      __threadfence_system();
      if (push) {
        for (int q = 0; q < ranks; ++q)
          if (q != a.p.me)
            storeRelease(pushFlag(q, a.p.me), e);
      } else {
        storeRelease(a.p.flags[a.p.me] + b, e);
      }
    }
  }
  const int peer = int(threadIdx.x);
  if (!a.p.local && peer < ranks && peer != a.p.me)
    waitFor(push ? pushFlag(a.p.me, peer) : a.p.flags[peer] + b, e, a.fault,
            peer);
  __syncthreads();
  // Every rank's part, combined in rank order (rank 0's first). The slots
  // are read past the L1 (__ldcg: peers wrote them), every rank's values
  // at once, all in flight together (one round trip over NVLink, not one a
  // value).
  constexpr int kPeerGroup = kMaxPeers;
#pragma unroll
  for (int q0 = 0; q0 < kMaxPeers; q0 += kPeerGroup) {
    if (q0 >= ranks)
      break;
    float t[kPeerGroup][kPeerPer];
#pragma unroll
    for (int j = 0; j < kPeerGroup; ++j) {
      const bool real = q0 + j < ranks;
      const float *slot =
          push ? a.p.slots[a.p.me] + at + (q0 + j) * cap : a.p.slots[q0 + j] + at;
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int64_t f = first + threadIdx.x + k * kPeerThreads;
        t[j][k] = real && ours(f) ? __ldcg(slot + f) : 0.f;
      }
    }
#pragma unroll
    for (int j = 0; j < kPeerGroup; ++j)
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        if (q0 + j >= ranks)
          continue;
        const float x = t[j][k];
        v[k] = q0 + j == 0 ? x : a.sum ? v[k] + x : (v[k] < x ? x : v[k]);
      }
  }
  if (!fused) {
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t f = first + threadIdx.x + k * kPeerThreads;
      if (ours(f))
        a.out[f] = added ? r[k] + v[k] : v[k];
    }
    return;
  }
  // The add, then each row's sum of squares: this block's part of it (its
  // threads' values in k order, then a fixed tree), the blocks' parts
  // shared (through the cluster's shared memory, or without a cluster
  // through this rank's exchange) and added in block order by every block
  // alike: the same bits either way.
  float sq[kMaxPeerRows] = {};
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t f = first + threadIdx.x + k * kPeerThreads;
    if (!ours(f) || f >= body) // the tail is neither added nor squared
      continue;
    v[k] = r[k] + v[k];
    a.out[f] = v[k];
    const int row = rowOf(f);
#pragma unroll
    for (int q = 0; q < kMaxPeerRows; ++q)
      if (q == row)
        sq[q] += v[k] * v[k];
  }
  if constexpr (kCluster) {
    // Each block stores its part into every block's shared memory, so
    // after one more cluster barrier every block reads only its own (and
    // may leave).
    cg::cluster_group cluster = cg::this_cluster();
    cluster.barrier_wait();
    // Unrolled, so that sq stays in registers (indexed by a variable it
    // was a local-memory array).
#pragma unroll
    for (int q = 0; q < kMaxPeerRows; ++q) {
      if (q >= int(rows)) // uniform: the blocks' barriers below
        break;
      const float part = blockSum(sq[q], partials);
      if (threadIdx.x < kPeerBlocks)
        cluster.map_shared_rank(&rowParts[q][0], int(threadIdx.x))[b] = part;
    }
    cluster.sync(); // every block's parts are in every block's memory
  } else {
    // Each block stores its parts, tagged with the call's epoch, into this
    // rank's exchange (its parity's words: PeerExchange::norms), then
    // waits for every block's. The 8 blocks are all resident: nothing
    // they wait for waits for them, and the next kernel starts only once
    // each has let it.
    uint64_t *norms = a.p.norms + (e & 1u) * kMaxPeerRows * kPeerBlocks;
#pragma unroll
    for (int q = 0; q < kMaxPeerRows; ++q) {
      if (q >= int(rows)) // uniform: blockSum's barriers
        break;
      const float part = blockSum(sq[q], partials);
      if (threadIdx.x == 0) // the part and its arrival: one tagged word
        publishTaggedWord(norms + q * kPeerBlocks + b, e,
                          __float_as_uint(part));
    }
    if (int(threadIdx.x) < rows * kPeerBlocks)
      rowParts[threadIdx.x / kPeerBlocks][threadIdx.x % kPeerBlocks] =
          waitTagged(norms + threadIdx.x, e, a.fault, kPeerBlocks);
    __syncthreads();
  }
  if (int(threadIdx.x) < rows) {
    float ss = 0.f;
    for (int c = 0; c < kPeerBlocks; ++c)
      ss += rowParts[threadIdx.x][c];
    rms[threadIdx.x] = sqrtf(ss / float(n) + a.eps);
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t f = first + threadIdx.x + k * kPeerThreads;
    if (ours(f) && f < body)
      a.y[f] = v[k] / rms[rowOf(f)] * g[k];
    else if (ours(f))
      a.logits[f - body] = v[k] / rms[0];
  }
  if constexpr (kChoice) {
    // The choice by the block of the tail's last value, from the logits
    // its threads (and, where the tail spans blocks, the cluster's) just
    // wrote.
    const int chooser = int((total - 1) / chunk);
    if (int(body / chunk) != chooser)
      cg::this_cluster().sync(); // the other blocks' logits, released
    if (b != chooser)
      return;
    __syncthreads();
    extern __shared__ float choiceShared[];
    routerChoose(a.logits, a.tail, a.choice.bias, a.choice.topK,
                 a.choice.gating, a.choice.normalize, a.choice.routedScale,
                 a.choice.ids, a.choice.weights, choiceShared);
  }
}

/// The choosing instantiation's registers are left to ptxas (minimum
/// blocks 1), as routerKernel's: at the default bound the ranked choice
/// (routerChooseSorted) spilled 16-36 bytes on sm_90 and sm_100.
template <bool kChoice>
__global__ void __cluster_dims__(kPeerBlocks, 1, 1)
    __launch_bounds__(kPeerThreads, kChoice ? 1 : 0)
        allReducePeersKernel(const __grid_constant__ PeerArgs a) {
  allReducePeersBody<kChoice, true>(a);
}

/// The all-reduce without the choice by kPeerBlocks blocks that are not a
/// cluster: each may start wherever a multiprocessor has room, not only
/// where eight of one processing cluster do; the fused norm's parts go
/// through the exchange (the backend's default; setPeerClusters).
/// kN > 0: one row of kN values over kRanks ranks, no tail (GLM-5's
/// hidden width at tp = 8, ShapeFamily::AllReduce).
template <int kN = 0, int kRanks = 0>
__global__ void __launch_bounds__(kPeerThreads)
    allReducePeersFlatKernel(const __grid_constant__ PeerArgs a) {
  allReducePeersBody<false, false, kN, kRanks>(a);
}

} // namespace

/// The norm parts' words (PeerExchange::norms), in floats: two parities
/// of kMaxPeerRows x kPeerBlocks 8-byte words.
constexpr int64_t kPeerNormFloats = 2 * 2 * kMaxPeerRows * kPeerBlocks;

int64_t peerSitesStart(int64_t capacity) {
  constexpr int64_t kAlign = 128 / sizeof(float);
  // Flags and epochs (4 bytes each), then the norm parts (8-byte aligned:
  // 2 * capacity + 2 * kPeerBlocks floats is even).
  const int64_t end = 2 * capacity + 2 * kPeerBlocks + kPeerNormFloats;
  return (end + kAlign - 1) / kAlign * kAlign;
}
int64_t peerPushFloats(int64_t capacity, int32_t ranks) {
  return 2 * int64_t(ranks) * capacity + int64_t(ranks) * kPeerBlocks;
}
uint64_t peerExchangeBytes(int64_t capacity, int64_t sites,
                           int32_t pushRanks) {
  // The parities, flags and epochs up to peerSitesStart, then the sites,
  // then the push region.
  const int64_t pushed =
      pushRanks > 0 ? peerPushFloats(capacity, pushRanks) : 0;
  return uint64_t(peerSitesStart(capacity) + sites + pushed) * sizeof(float);
}
static_assert(sizeof(float) == sizeof(uint32_t));
PeerExchange peerExchangeView(const std::vector<uint8_t *> &bases,
                              int32_t ranks, int32_t me, int64_t capacity,
                              bool local, int64_t push) {
  // Slots (two parities of `capacity` floats), then the flags, then the
  // epochs: peerExchangeBytes's layout.
  auto flagsOf = [&](uint8_t *base) {
    return reinterpret_cast<uint32_t *>(base +
                                        uint64_t(2 * capacity) * sizeof(float));
  };
  PeerExchange p;
  p.ranks = ranks;
  p.me = me;
  p.capacity = capacity;
  p.local = local;
  p.push = local ? -1 : push;
  uint8_t *mine = bases[local ? 0 : size_t(me)];
  p.epochs = flagsOf(mine) + kPeerBlocks;
  p.norms = reinterpret_cast<uint64_t *>(flagsOf(mine) + 2 * kPeerBlocks);
  for (int32_t q = 0; q < ranks && q < kMaxPeers; ++q) {
    uint8_t *of = local ? mine : bases[size_t(q)];
    p.slots[q] = reinterpret_cast<float *>(of);
    p.flags[q] = flagsOf(of);
  }
  return p;
}

cudaError_t enablePeerAccess(int peer) {
  const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
  if (e != cudaErrorPeerAccessAlreadyEnabled)
    return e;
  cudaGetLastError(); // taken off the thread's last-error slot
  return cudaSuccess;
}
static_assert(kPeerMaxValues == int64_t(kPeerBlocks) * kPeerThreads * kPeerPer);

bool allReducePeersShape(int64_t rows, int64_t n, int64_t tail,
                         int64_t capacity) {
  if (rows <= 0 || rows > kMaxPeerRows || n <= 0 || tail < 0 ||
      tail > kPeerMaxValues || (tail > 0 && rows != 1))
    return false;
  const int64_t total = rows * n + tail; // rows <= 4: n and tail bound it
  return n <= kPeerMaxValues && total <= kPeerMaxValues && total <= capacity;
}

namespace {
/// beginStepEpochs's base and the step's calls so far (the calling host
/// thread's).
thread_local uint32_t *stepEpochBase = nullptr;
thread_local int32_t stepEpochCalls = 0;
} // namespace

bool allReducePeersFits(const PeerExchange &p, int64_t rows, int64_t n,
                        int64_t tail) {
  return allReducePeersShape(rows, n, tail, p.capacity) && p.ranks >= 1 &&
         p.ranks <= kMaxPeers && p.me >= 0 && p.me < p.ranks && p.epochs;
}

cudaError_t launchAllReducePeers(const PeerExchange &p, const float *x,
                                 int64_t rows, int64_t n, bool sum,
                                 const float *residual, const float *w,
                                 float eps, float *out, float *y,
                                 FaultSink fault, cudaStream_t s, int64_t tail,
                                 float *logits, const RouterChoice *choice,
                                 int64_t site) {
  if (!allReducePeersFits(p, rows, n, tail) || !x || !out ||
      (w && (!residual || !y)) || (tail > 0 && (!w || !logits)) ||
      (residual && !sum) ||
      (site >= 0 &&
       (site < peerSitesStart(p.capacity) || x != p.slots[p.me] + site)) ||
      (p.push >= 0 && (p.local || p.push < peerSitesStart(p.capacity))))
    return cudaErrorInvalidValue;
  for (int q = 0; q < p.ranks; ++q)
    if (!p.slots[q] || (!p.local && !p.flags[q]))
      return cudaErrorInvalidValue;
  PeerArgs args{p,   x,   rows, n,     sum,  residual, w,
                eps, out, y,    fault, tail, logits,   {}, site,
                stepEpochBase, stepEpochBase ? stepEpochCalls : -1};
  size_t shared = 0;
  if (choice && choice->topK > 0) {
    shared = routerChoiceShared(tail, choice->topK, kPeerThreads);
    if (tail <= 0 || choice->topK > tail || !choice->ids ||
        !choice->weights || shared > 48 * 1024)
      return cudaErrorInvalidValue;
    args.choice = *choice;
  }
  // Only the choice needs the cluster; without one where asked. GLM-5's
  // shape (one row of its hidden width, at tp = 2, 4 or 8) compiled in
  // where its family is on (ModelShapes.h).
  const bool flat = !peerClusters() && args.choice.topK == 0;
  using Kernel = void (*)(PeerArgs);
  const Kernel shaped =
      flat && shapeSpecialised(ShapeFamily::AllReduce) && rows == 1 &&
              n == glm5::kHidden && tail == 0
          ? glm5::pickShape(p.ranks, glm5::PeerRankCounts{}, Kernel(nullptr),
                            [](auto ranks) -> Kernel {
                              return allReducePeersFlatKernel<glm5::kHidden,
                                                              ranks.value>;
                            })
          : nullptr;
  const bool glm5Shape = shaped != nullptr;
  if (cudaError_t e = launchStep(
          shaped ? shaped
          : flat ? allReducePeersFlatKernel<>
          : args.choice.topK > 0 ? allReducePeersKernel<true>
                                 : allReducePeersKernel<false>,
          kPeerBlocks, kPeerThreads, shared, s, args);
      e != cudaSuccess)
    return e;
  if (glm5Shape)
    noteShapeSpecialised();
  if (stepEpochBase)
    ++stepEpochCalls;
  return cudaGetLastError();
}

namespace {
__global__ void advanceEpochsKernel(uint32_t *base, int32_t calls) {
  stepKernelPrologue();
  if (threadIdx.x == 0)
    *base += uint32_t(calls);
}
} // namespace

void beginStepEpochs(uint32_t *base) {
  stepEpochBase = base;
  stepEpochCalls = 0;
}

int32_t endStepEpochs() {
  stepEpochBase = nullptr;
  return std::exchange(stepEpochCalls, 0);
}

cudaError_t launchAdvanceEpochs(uint32_t *base, int32_t calls,
                                cudaStream_t s) {
  if (!base || calls < 0)
    return cudaErrorInvalidValue;
  if (calls > 0)
    if (cudaError_t e = launchStep(advanceEpochsKernel, 1, kWarp, 0, s, base,
                                   calls);
        e != cudaSuccess)
      return e;
  return cudaGetLastError();
}

cudaError_t launchLayerNorm(const float *x, int64_t rows, int64_t n,
                            const float *w, const float *bias, float eps,
                            float *y, cudaStream_t s) {
  if (rows < 0 || n <= 0 || rows > INT_MAX || !w || !bias)
    return cudaErrorInvalidValue;
  if (rows > 0)
    if (cudaError_t e = launchStep(layerNormKernel, unsigned(rows),
                                   kNormThreads, 0, s, x, n, w, bias, eps, y);
        e != cudaSuccess)
      return e;
  return cudaGetLastError();
}

cudaError_t launchRope(const float *x, int64_t rows, int64_t n,
                       const int32_t *position, RopeStyle style, float theta,
                       int64_t offset, int64_t dims, float *y, cudaStream_t s) {
  // The CPU asserts the same range (and only copies in release builds).
  if (rows < 0 || n <= 0 || offset < 0 || dims < 0 || offset + dims > n ||
      !position ||
      (style != RopeStyle::Interleaved && style != RopeStyle::NeoX))
    return cudaErrorInvalidValue;
  const RopeFrequencies freq = ropeFrequencies(theta, dims);
  if (rows > 0)
    if (cudaError_t e = launchStep(ropeKernel, elementBlocks(rows * n),
                                   kElementThreads, 0, s, x, rows, n, position,
                                   style, theta, offset, dims, freq, y);
        e != cudaSuccess)
      return e;
  return cudaGetLastError();
}

cudaError_t launchSlice(const float *x, const int64_t *src, const int64_t *dst,
                        const int64_t *offsets, int rank, float *y,
                        cudaStream_t s) {
  if (rank < 1 || rank > kMaxSliceRank || !src || !dst || !offsets)
    return cudaErrorInvalidValue;
  SliceGeometry g{};
  g.rank = rank;
  g.total = 1;
  for (int d = 0; d < rank; ++d) {
    if (dst[d] < 0 || src[d] < 0 || offsets[d] < 0 ||
        offsets[d] + dst[d] > src[d])
      return cudaErrorInvalidValue;
    g.src[d] = src[d];
    g.dst[d] = dst[d];
    g.offsets[d] = offsets[d];
    g.total *= dst[d];
  }
  if (g.total > 0)
    if (cudaError_t e = launchStep(sliceKernel, elementBlocks(g.total),
                                   kElementThreads, 0, s, x, g, y);
        e != cudaSuccess)
      return e;
  return cudaGetLastError();
}

cudaError_t launchConcat(const float *const *parts, const int64_t *runs,
                         int count, int64_t outer, int64_t total, float *y,
                         cudaStream_t s) {
  if (count < 1 || count > kMaxConcatParts || outer < 0 || !y)
    return cudaErrorInvalidValue;
  ConcatParts c{};
  c.count = count;
  for (int p = 0; p < count; ++p) {
    if (!parts[p] || runs[p] < 0)
      return cudaErrorInvalidValue;
    c.part[p] = parts[p];
    c.begin[p + 1] = c.begin[p] + runs[p];
  }
  if (c.begin[count] != total)
    return cudaErrorInvalidValue;
  if (outer * total > 0)
    if (cudaError_t e = launchStep(concatKernel, elementBlocks(outer * total),
                                   kElementThreads, 0, s, c, outer, total, y);
        e != cudaSuccess)
      return e;
  return cudaGetLastError();
}

cudaError_t launchEmbed(const DeviceWeight &table, const int32_t *token,
                        float *y, FaultSink fault, cudaStream_t s) {
  Geometry g;
  if (!geometryOf(table, g) || !token)
    return cudaErrorInvalidValue;
  if (cudaError_t e =
          launchStep(embedKernel, elementBlocks(g.cols), kElementThreads, 0, s,
                     g, table.data, token, y, fault);
      e != cudaSuccess)
    return e;
  return cudaGetLastError();
}

WeightLayout splitLayoutOf(GGMLType type) {
  switch (type) {
  case GGMLType::Q8_0:
    return WeightLayout::Q8Split;
  case GGMLType::Q4_K:
    return WeightLayout::Q4KSplit;
  case GGMLType::Q5_K:
    return WeightLayout::Q5KSplit;
  case GGMLType::Q6_K:
    return WeightLayout::Q6KSplit;
  case GGMLType::IQ4_XS:
    return WeightLayout::IQ4XSSplit;
  case GGMLType::IQ4_NL:
    return WeightLayout::IQ4NLSplit;
  case GGMLType::Q5_0:
    return WeightLayout::Q50Split;
  case GGMLType::Q5_1:
    return WeightLayout::Q51Split;
  default:
    return WeightLayout::Blocks;
  }
}

GGMLType splitTypeOf(WeightLayout layout) {
  // The inverse of splitLayoutOf, over the layouts SplitLayout.h lists.
  for (const SplitFormat &f : kSplitFormats)
    if (layout != WeightLayout::Blocks && splitLayoutOf(f.type) == layout)
      return f.type;
  return GGMLType::F32;
}

namespace {

/// The planes of w, a split-layout weight, with their pieces; false when w
/// is not one (another layout, a type not its own, a width of part
/// blocks, a missing plane).
bool splitPlanesOf(const DeviceWeight &w, const SplitFormat *&format,
                   SplitPlanes &planes) {
  format = splitFormatOf(w.type);
  if (w.layout == WeightLayout::Blocks || !format ||
      splitTypeOf(w.layout) != w.type || w.rows < 0 || w.cols <= 0 ||
      w.cols % format->blockValues)
    return false;
  planes = SplitPlanes{};
  planes.count = format->planes;
  for (int p = 0; p < format->planes; ++p) {
    planes.offset[p] = format->plane[p].offset;
    planes.bytes[p] = format->plane[p].bytes;
    // Written only by launchRepackSplit, whose caller lets it.
    planes.at[p] = const_cast<uint8_t *>(w.plane(p));
    if (!planes.at[p])
      return false;
  }
  return true;
}

} // namespace

cudaError_t launchRepackSplit(const uint8_t *blocks, const DeviceWeight &w,
                              cudaStream_t s) {
  const SplitFormat *format = nullptr;
  SplitPlanes planes;
  if (!blocks || !splitPlanesOf(w, format, planes))
    return cudaErrorInvalidValue;
  const int64_t count = w.cols / format->blockValues;
  if (w.rows > 0 && count > INT64_MAX / format->blockBytes / w.rows)
    return cudaErrorInvalidValue;
  const int64_t total = w.rows * count * format->blockBytes;
  if (total > 0)
    if (cudaError_t e = launchStep(repackSplitKernel, elementBlocks(total),
                                   kElementThreads, 0, s, blocks,
                                   uint64_t(total), format->blockBytes, planes);
        e != cudaSuccess)
      return e;
  return cudaGetLastError();
}

cudaError_t launchRepackQ8Split(const uint8_t *blocks, int64_t rows,
                                int64_t cols, uint8_t *quants, uint8_t *scales,
                                cudaStream_t s) {
  if (!quants || !scales)
    return cudaErrorInvalidValue;
  DeviceWeight w{GGMLType::Q8_0,        rows,  cols, quants,
                 WeightLayout::Q8Split, scales};
  return launchRepackSplit(blocks, w, s);
}

cudaError_t launchDequant(const DeviceWeight &w, float *out, cudaStream_t s) {
  if (w.layout != WeightLayout::Blocks) {
    const SplitFormat *format = nullptr;
    SplitPlanes planes;
    if (!splitPlanesOf(w, format, planes))
      return cudaErrorInvalidValue;
    const int64_t total = w.rows * w.cols;
    if (total > 0)
      if (cudaError_t e = launchStep(
              dequantSplitKernel, elementBlocks(total), kElementThreads, 0, s,
              w.type, int32_t(format->blockValues), total, planes, out);
          e != cudaSuccess)
        return e;
    return cudaGetLastError();
  }
  Geometry g;
  if (!geometryOf(w, g))
    return cudaErrorInvalidValue;
  const int64_t total = g.rows * g.cols;
  if (total > 0)
    if (cudaError_t e = launchStep(dequantKernel, elementBlocks(total),
                                   kElementThreads, 0, s, g, w.data, out);
        e != cudaSuccess)
      return e;
  return cudaGetLastError();
}

cudaError_t launchCacheAppend(const float *entry, const int32_t *position,
                              DeviceCache cache, FaultSink fault,
                              cudaStream_t s) {
  if (!validCache(cache) || !position)
    return cudaErrorInvalidValue;
  if (cudaError_t e =
          launchStep(cacheAppendKernel, elementBlocks(cache.width),
                     kElementThreads, 0, s, entry, position, cache, fault);
      e != cudaSuccess)
    return e;
  return cudaGetLastError();
}

cudaError_t launchNormRopeAppend(const float *entry, int64_t normDims,
                                 const float *w, const float *bias, float eps,
                                 const int32_t *position, RopeStyle style,
                                 float theta, int64_t offset, int64_t dims,
                                 DeviceCache cache, FaultSink fault,
                                 cudaStream_t s) {
  const int64_t width = cache.width;
  if (!validCache(cache) || !entry || !w || !position || normDims <= 0 ||
      normDims > width || offset < 0 || dims <= 0 || dims % 2 ||
      offset + dims > width ||
      (style != RopeStyle::Interleaved && style != RopeStyle::NeoX))
    return cudaErrorInvalidValue;
  const RopeFrequencies freq = ropeFrequencies(theta, dims);
  const size_t shared = sizeof(float) * size_t(width + 2 * normDims);
  if (shared > 48 * 1024)
    if (cudaError_t e = allowDynamicShared(normRopeAppendKernel, shared);
        e != cudaSuccess)
      return e;
  const int64_t threads64 = (width + kWarp - 1) / kWarp * kWarp;
  const unsigned threads = unsigned(
      threads64 < kSingleBlockThreads ? threads64 : kSingleBlockThreads);
  if (cudaError_t e = launchStep(normRopeAppendKernel, 1, threads, shared, s,
                                 entry, normDims, w, bias, eps, position, style,
                                 theta, offset, dims, freq, cache, fault);
      e != cudaSuccess)
    return e;
  return cudaGetLastError();
}

namespace {
thread_local bool useIndexerMma = true;
thread_local bool useRouterWarps = true;
thread_local uint64_t warpChoiceLaunches = 0;
thread_local bool usePeerClusters = true;
} // namespace

bool peerClusters() { return usePeerClusters; }
void setPeerClusters(bool on) { usePeerClusters = on; }

cudaError_t setPeerClusterPolicy(cudaClusterSchedulingPolicy policy) {
  for (auto kernel : {allReducePeersKernel<false>, allReducePeersKernel<true>})
    if (cudaError_t e = setKernelAttribute(
            kernel, cudaFuncAttributeClusterSchedulingPolicyPreference,
            int(policy));
        e != cudaSuccess)
      return e;
  return cudaSuccess;
}

bool indexerMma() { return useIndexerMma; }
void setIndexerMma(bool on) { useIndexerMma = on; }

bool routerWarps() { return useRouterWarps; }
void setRouterWarps(bool on) { useRouterWarps = on; }
uint64_t routerWarpChoiceLaunches() { return warpChoiceLaunches; }

namespace {
thread_local MlaLaunch useMlaLaunch;
thread_local uint64_t mlaMmaCount = 0;
} // namespace

uint64_t mlaTensorCoreLaunches() { return mlaMmaCount; }

MlaLaunch mlaLaunch() { return useMlaLaunch; }
void setMlaLaunch(const MlaLaunch &m) { useMlaLaunch = m; }

int64_t mlaMostEntries(int64_t positions, int64_t capacity) {
  return mlaEntryLimit(positions, capacity);
}

namespace {
/// The floats a projecting call's per-head task counts take (whole 16
/// bytes).
} // namespace

int64_t mlaScratchFloats(int64_t heads, int64_t latent, int64_t entries) {
  const int64_t chunks = (entries + kMlaChunk - 1) / kMlaChunk;
  // The grid's arrival word (first, in 16 bytes, so that any shape called
  // on the same scratch finds it where the last call left it, its count
  // zero), then the partial results.
  return kMlaArrivalFloats + chunks * heads * (latent + 2);
}

namespace {

/// launchMlaAttention's kernel for one MlaShape.
template <class Shape>
cudaError_t launchMla(const MlaArgs &a, cudaStream_t s) {
  // The chunks of the shape's own length the most attended entries fill
  // (the scratch, laid out for chunks of kMlaChunk, holds at least as many).
  const int64_t chunks =
      (mlaMostEntries(a.cache.positions, a.capacity) + Shape::kChunk - 1) /
      Shape::kChunk;
  // The chunks' rows and scores, or the combine's chunk weights, whichever
  // is larger (with a projection mlaProjectKernel combines).
  const size_t rowFloats =
      Shape::kMma ? (MlaMmaLayout<Shape::kChunk>::kBytes + 3) / 4
                  : size_t(Shape::kChunk * (a.cache.width + a.heads));
  size_t shared =
      sizeof(float) *
      (a.projQuants ? rowFloats : std::max(rowFloats, size_t(chunks)));
  // mlaLaunch().alone: more than half a multiprocessor's shared memory, so
  // that two of the kernel's blocks never share one, however busy the GPU
  // is when they are placed: launched early, beside its predecessors, the
  // grid found some multiprocessors taken and put two blocks on others,
  // which then ran its chunks at half speed (docs/perf.md, thirty-sixth
  // pass).
  // A multiprocessor's shared memory is asked once per host thread and
  // device, as the wave below.
  if (mlaLaunch().alone) {
    static thread_local int knownDevice = -1, perSm = 0;
    int device = 0;
    if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess)
      return e;
    if (device != knownDevice) {
      if (cudaError_t e = cudaDeviceGetAttribute(
              &perSm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
          e != cudaSuccess)
        return e;
      knownDevice = device;
    }
    shared = std::max(shared, size_t(perSm) / 2);
  }
  // At most one block a multiprocessor, each taking every grid-th chunk:
  // the blocks wait for each other, so all must be resident, which the
  // runtime is asked once per host thread, device and shared size (not at
  // every launch: an eager step launches this a layer). One, not as many
  // as fit (GLM-5's kernel takes 64 registers a thread, so two of 512
  // threads would): two blocks on a multiprocessor share its shared-memory
  // bandwidth, which bounds a chunk's scores and partial sums (the MLA
  // bench at 1,025 entries: 8.1 us with one a multiprocessor, 10.3 with
  // two), and the one leaves room for the next kernel's early blocks.
  // Beyond the default 48 KiB a kernel must opt in (wide rows, many heads,
  // long contexts); the H200 allows 227 KiB.
  if (shared > 48 * 1024)
    if (cudaError_t e = allowDynamicShared(mlaKernel<Shape>, shared);
        e != cudaSuccess)
      return e;
  static thread_local WaveCache waveCache;
  int processors = 0, resident = 0;
  if (cudaError_t e = residentWave(
          waveCache, reinterpret_cast<const void *>(mlaKernel<Shape>),
          kMlaThreads, shared, processors, resident);
      e != cudaSuccess)
    return e;
  if (resident < 1)
    return cudaErrorInvalidConfiguration;
  const int64_t wave = processors;
  const int64_t grid = chunks < wave ? (chunks > 0 ? chunks : 1) : wave;
  if (cudaError_t e = launchStep(mlaKernel<Shape>, unsigned(grid),
                                 kMlaThreads, shared, s, a);
      e != cudaSuccess || !a.projQuants)
    return e;
  // The head's output values, then the combine's chunk weights.
  const size_t projectShared =
      sizeof(float) * (size_t(a.latent + 3) / 4 * 4 + size_t(chunks));
  if (projectShared > 48 * 1024)
    if (cudaError_t e =
            allowDynamicShared(mlaProjectKernel<Shape>, projectShared);
        e != cudaSuccess)
      return e;
  return launchStep(mlaProjectKernel<Shape>,
                    unsigned(a.heads * kMlaProjectBlocks), kMlaThreads,
                    projectShared, s, a);
}

/// GLM-5's latent and rope widths, which the specialised kernels fix.
constexpr int kGlmLatent = glm5::kLatent, kGlmRope = glm5::kRope;

/// launchMla for GLM-5's widths, an f16 cache and the kernel compiled for
/// the call's heads (glm5::MlaHeadCounts); cudaErrorNotSupported where
/// there is none.
cudaError_t launchMlaHeads(const MlaArgs &a, cudaStream_t s) {
  if (a.heads == kMlaMmaHeads && mlaLaunch().tensorCores) {
    const cudaError_t e =
        launchMla<MlaShape<kGlmLatent, kGlmRope, int(CacheType::F16),
                           kMlaMmaHeads, kMlaMmaChunk>>(a, s);
    mlaMmaCount += e == cudaSuccess;
    return e;
  }
  return glm5::pickShape(
      a.heads, glm5::MlaHeadCounts{}, cudaErrorNotSupported, [&](auto heads) {
        return launchMla<MlaShape<kGlmLatent, kGlmRope, int(CacheType::F16),
                                  heads.value>>(a, s);
      });
}

} // namespace

bool mlaProjectionFits(const DeviceWeight &proj, int64_t heads,
                       int64_t latent) {
  // q8_0-split rows of `latent` values, the quants 16-byte aligned (a thread
  // loads a Q8_0 block's 32 at a time), the same count for every head; a
  // row's blocks are a power of two up to a warp's lanes (mlaProjectKernel
  // sums them by a butterfly), which also splits the latent evenly over a
  // head's cluster of blocks.
  const bool powerOfTwo = latent >= 32 && latent <= 32 * kWarp &&
                          (latent & (latent - 1)) == 0;
  return proj.type == GGMLType::Q8_0 && proj.layout == WeightLayout::Q8Split &&
         proj.data && proj.scales && proj.cols == latent && powerOfTwo &&
         heads > 0 && heads <= INT_MAX / kMlaProjectBlocks && proj.rows > 0 &&
         proj.rows % heads == 0 &&
         reinterpret_cast<uintptr_t>(proj.data) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(proj.scales) % 2 == 0;
}

cudaError_t launchMlaAttention(const float *qLatent, const float *qRope,
                               int64_t heads, int64_t latent, int64_t rope,
                               DeviceCache cache, const int32_t *position,
                               const int32_t *selected, const int32_t *count,
                               int64_t capacity, float scale, float *scratch,
                               float *out, FaultSink fault, cudaStream_t s,
                               const DeviceWeight *proj) {
  if (heads < 0 || heads > INT_MAX || latent < 0 || rope < 0 ||
      !validCache(cache) || cache.width != latent + rope ||
      cache.width > kMlaMaxWidth || !position || !scratch || capacity < 0 || (selected && (!count || capacity == 0)))
    return cudaErrorInvalidValue;
  if (proj && !mlaProjectionFits(*proj, heads, latent))
    return cudaErrorInvalidValue;
  if (heads == 0)
    return cudaSuccess;
  // The scratch's layout: chunks of kMlaChunk for the most attended entries
  // (mlaAttended never exceeds them), as mlaScratchFloats sized it; a
  // shape's own chunks may be longer, and so fewer (launchMla).
  const int64_t chunks =
      (mlaMostEntries(cache.positions, capacity) +
       kMlaChunk - 1) /
      kMlaChunk;
  MlaArgs a{qLatent,
            qRope,
            heads,
            latent,
            rope,
            cache,
            position,
            selected,
            count,
            capacity,
            scale,
            scratch + kMlaArrivalFloats,
            scratch + kMlaArrivalFloats + chunks * heads,
            scratch + kMlaArrivalFloats + 2 * chunks * heads,
            reinterpret_cast<uint32_t *>(scratch),
            out,
            fault};
  a.lateDependents = mlaLaunch().lateDependents;
  a.earlyRows = mlaLaunch().earlyRows;
  if (proj) {
    a.projQuants = reinterpret_cast<const int8_t *>(proj->data);
    a.projScales = reinterpret_cast<const uint16_t *>(proj->scales);
    a.projRows = proj->rows / heads;
  }
  cudaError_t e = cudaSuccess;
  // The specialised kernels load rows 16 bytes at a time.
  if (latent == kGlmLatent && rope == kGlmRope &&
      reinterpret_cast<uintptr_t>(cache.data) % 16 == 0) {
    switch (cache.type) {
    case CacheType::F16:
      // The rank's heads fixed too where the kernel is compiled for them.
      e = shapeSpecialised(ShapeFamily::Mla)
              ? launchMlaHeads(a, s)
              : cudaErrorNotSupported;
      if (e == cudaErrorNotSupported)
        e = launchMla<MlaShape<kGlmLatent, kGlmRope, int(CacheType::F16)>>(a, s);
      else if (e == cudaSuccess)
        noteShapeSpecialised();
      break;
    case CacheType::BF16:
      e = launchMla<MlaShape<kGlmLatent, kGlmRope, int(CacheType::BF16)>>(
          a, s);
      break;
    case CacheType::F32:
      e = launchMla<MlaShape<kGlmLatent, kGlmRope, int(CacheType::F32)>>(
          a, s);
      break;
    }
  } else {
    e = launchMla<MlaShape<0, 0, kAnyCache>>(a, s);
  }
  if (e != cudaSuccess)
    return e;
  return cudaGetLastError();
}

namespace {

/// The selection's launch: its kernel, dynamic shared memory and cluster
/// size.
struct SelectPlan {
  void (*kernel)(IndexerArgs) = nullptr;
  size_t bytes = 0;
  int blocks = 0;
};

/// Plans the selection over a cache of `positions` by a cluster of
/// `clusterBlocks` (0: kSelectBlocks), its first block alone up to
/// `oneBlockPositions`, and lets the kernel take its shared memory. A
/// cluster of kWideSelectBlocks where the GPU cannot run one is planned as
/// kSelectBlocks.
cudaError_t planSelection(int64_t positions, int64_t oneBlockPositions,
                          size_t maxStagedBytes, int clusterBlocks,
                          SelectPlan &out) {
  const auto plan = [&](int blocks) {
    const int64_t slice = (positions + blocks - 1) / blocks;
    const size_t keyBytes = sizeof(uint32_t) * size_t(slice);
    const bool staged =
        keyBytes <= maxStagedBytes && keyBytes <= kMaxStagedKeyBytes;
    const bool wide = blocks == kWideSelectBlocks;
    return SelectPlan{staged ? (wide ? &indexerSelectKernel<true, true>
                                     : &indexerSelectKernel<true>)
                             : (wide ? &indexerSelectKernel<false, true>
                                     : &indexerSelectKernel<false>),
                      std::max(staged ? keyBytes : size_t(0),
                               sizeof(uint32_t) * size_t(oneBlockPositions)),
                      blocks};
  };
  // Beyond the default 48 KiB with the kernel's own histograms (about 12
  // KiB) it must opt in; below, no attribute is set at each launch.
  const auto allow = [](const SelectPlan &p) {
    return p.bytes > 32 * 1024 ? allowDynamicShared(p.kernel, p.bytes)
                               : cudaSuccess;
  };
  out = plan(clusterBlocks != 0 ? clusterBlocks : kSelectBlocks);
  if (cudaError_t e = allow(out); e != cudaSuccess)
    return e;
  if (out.blocks != kWideSelectBlocks)
    return cudaSuccess;
  // Whether the GPU runs such clusters, asked once per host thread,
  // device, kernel and size; where it does not, 8 blocks.
  static thread_local struct {
    int device = -1;
    void (*kernel)(IndexerArgs) = nullptr;
    size_t bytes = 0;
    bool fits = false;
  } wide;
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess)
    return e;
  if (wide.device != device || wide.kernel != out.kernel ||
      wide.bytes != out.bytes) {
    wide.device = device;
    wide.kernel = out.kernel;
    wide.bytes = out.bytes;
    wide.fits = clustersFit(out.kernel, unsigned(kWideSelectBlocks),
                            unsigned(kSingleBlockThreads), out.bytes);
  }
  if (wide.fits)
    return cudaSuccess;
  out = plan(kSelectBlocks);
  return allow(out);
}

} // namespace

cudaError_t dsaSelectBlocks(int64_t cachePositions, IndexerSelect select,
                            size_t maxStagedBytes, int &blocks) {
  if (cachePositions < 0 || select.oneBlockPositions < 0 ||
      (select.clusterBlocks != 0 && select.clusterBlocks != kSelectBlocks &&
       select.clusterBlocks != kWideSelectBlocks))
    return cudaErrorInvalidValue;
  SelectPlan p;
  if (cudaError_t e = planSelection(
          cachePositions,
          std::min({select.oneBlockPositions, cachePositions,
                    kMaxOneBlockPositions}),
          maxStagedBytes, select.clusterBlocks, p);
      e != cudaSuccess)
    return e;
  blocks = p.blocks;
  return cudaSuccess;
}

cudaError_t launchDsaIndexer(const float *q, int64_t heads, int64_t dim,
                             const float *headWeights, DeviceCache cache,
                             const int32_t *position, int64_t topK, float scale,
                             float *scores, int32_t *selected, int32_t *count,
                             FaultSink fault, cudaStream_t s,
                             const QueryRope &rope, size_t maxStagedBytes,
                             IndexerSelect select) {
  if (heads < 0 || dim <= 0 || (heads > 0 && (!q || !headWeights)) ||
      !validCache(cache) || cache.width != dim || !position || topK < 0 ||
      topK > INT32_MAX || !scores || (topK > 0 && !selected) || !count ||
      rope.dims < 0 || rope.dims % 2 || rope.offset < 0 ||
      rope.offset + rope.dims > dim ||
      (rope.style != RopeStyle::Interleaved && rope.style != RopeStyle::NeoX))
    return cudaErrorInvalidValue;
  IndexerArgs a{q,
                heads,
                dim,
                headWeights,
                cache,
                position,
                topK,
                scale,
                scores,
                selected,
                count,
                fault,
                rope.style,
                rope.theta,
                rope.offset,
                rope.dims,
                RopeFrequencies{}};
  if (rope.dims > 0)
    a.ropeFreq = ropeFrequencies(rope.theta, rope.dims);
  const unsigned blocks = positionBlocks(cache.positions);
  // Heads across groups of lanes for 32 heads (GLM-5: 32 x 128), across
  // lanes when q fits in shared memory; one warp per position and head
  // otherwise. The first two read q and the key rows 16 bytes at a time, a
  // warp's rows in at most kStageLoads loads a lane.
  constexpr int kScoreWarps = 8;
  const size_t staged =
      sizeof(float) * size_t(heads * (dim + 4) + (heads + 3) / 4 * 4 +
                             kScoreWarps * kScorePositions * dim);
  const size_t grouped =
      sizeof(float) *
      size_t((heads + kScoreWarps * kGroupRows) * (dim + 4) + heads);
  const bool aligned = reinterpret_cast<uintptr_t>(q) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(cache.data) % 16 == 0;
  // At most one wave of blocks of `perBlock` positions (the blocks the GPU
  // holds at once; each warp loops over its groups of rows, the next
  // group's loads in flight): GLM-5's by-head kernel takes 86 registers a
  // thread, so two blocks a multiprocessor, and 16,384 positions in 512
  // blocks ran as a wave and a half (Nsight Compute: 24.6 us at base
  // clocks). The runtime is asked once per host thread, device and size.
  auto launchScores = [&](void (*kernel)(IndexerArgs), int64_t perBlock,
                          size_t shared, WaveCache &waves) -> cudaError_t {
    if (shared > 48 * 1024)
      if (cudaError_t e = allowDynamicShared(kernel, shared); e != cudaSuccess)
        return e;
    int processors = 0, resident = 0;
    if (cudaError_t e =
            residentWave(waves, reinterpret_cast<const void *>(kernel),
                         kScoreWarps * kWarp, shared, processors, resident);
        e != cudaSuccess)
      return e;
    const int64_t wanted = (cache.positions + perBlock - 1) / perBlock;
    const int64_t wave = int64_t(processors) * (resident > 0 ? resident : 1);
    const int64_t most = wave < 1024 ? wave : 1024;
    return launchStep(kernel, unsigned(wanted < most ? wanted : most),
                      kScoreWarps * kWarp, shared, s, a);
  };
  // The tensor cores' staging rotates a lane's two pairs in place.
  const bool mmaRope =
      rope.dims == 0 ||
      (rope.style == RopeStyle::Interleaved && rope.offset % 4 == 0 &&
       rope.dims % 4 == 0 && a.ropeFreq.pairs == rope.dims / 2);
  // launchScores launches kScoreWarps warps, which mmaIndexerQuery and the
  // kernel's launch bounds take as kMmaThreads.
  static_assert(kMmaThreads == kScoreWarps * kWarp);
  if (indexerMma() && heads == kMmaHeads && dim == kMmaDim &&
      cache.type == CacheType::F16 && aligned && mmaRope) {
    static thread_local WaveCache mmaWaves;
    if (cudaError_t e =
            launchScores(indexerScoresMmaKernel,
                         kMmaThreads / kWarp * kMmaTile, kIndexerMmaShared,
                         mmaWaves);
        e != cudaSuccess)
      return e;
  } else if (heads == kGroupedHeads && dim % 8 == 0 && aligned &&
      int64_t(kGroupRows) * dim * (cache.type == CacheType::F32 ? 4 : 2) <=
          kStageLoads * kWarp * 16) {
    // Compiled for GLM-5's dim where asked (family indexer).
    const bool fixed =
        shapeSpecialised(ShapeFamily::Indexer) && dim == glm5::kIndexDim;
    static thread_local WaveCache groupWaves, fixedWaves;
    if (cudaError_t e =
            fixed ? launchScores(indexerScoresByGroupKernel<glm5::kIndexDim>,
                                 kScoreWarps * kGroupRows, grouped, fixedWaves)
                  : launchScores(indexerScoresByGroupKernel<>,
                                 kScoreWarps * kGroupRows, grouped, groupWaves);
        e != cudaSuccess)
      return e;
    if (fixed)
      noteShapeSpecialised();
  } else if (heads > 0 && dim % 8 == 0 && staged <= 48 * 1024 && aligned &&
             kScorePositions * dim * 4 <= kStageLoads * kWarp * 16) {
    static thread_local WaveCache headWaves;
    if (cudaError_t e =
            launchScores(indexerScoresByHeadKernel,
                         kScoreWarps * kScorePositions, staged, headWaves);
        e != cudaSuccess)
      return e;
  } else {
    if (cudaError_t e =
            launchStep(indexerScoresKernel, blocks, kWarpThreads, 0, s, a);
        e != cudaSuccess)
      return e;
  }
  // The selection: one cluster; each block's keys in its shared memory
  // when its slice of a cache's worth fits (GLM-5 at 16k positions and 8
  // blocks: 8 KiB). Up to oneBlockPositions attended positions the first
  // block selects alone, its keys in the same dynamic shared memory (24
  // KiB), so that takes the larger of the two.
  a.oneBlockPositions = std::min(
      {select.oneBlockPositions, cache.positions, kMaxOneBlockPositions});
  if (a.oneBlockPositions < 0 ||
      (select.clusterBlocks != 0 && select.clusterBlocks != kSelectBlocks &&
       select.clusterBlocks != kWideSelectBlocks))
    return cudaErrorInvalidValue;
  a.earlyStop = select.earlyStop;
  SelectPlan p;
  if (cudaError_t e = planSelection(cache.positions, a.oneBlockPositions,
                                    maxStagedBytes, select.clusterBlocks, p);
      e != cudaSuccess)
    return e;
  const int selectBlocks = p.blocks;
  if (cudaError_t e = launchStepClustered(unsigned(selectBlocks), p.kernel,
                                          selectBlocks,
                                          kSingleBlockThreads, p.bytes, s, a);
      e != cudaSuccess)
    return e;
  return cudaGetLastError();
}

namespace {

/// The router choice's shared memory for a block of `blockThreads`: p and
/// the choice scores, then the sorting warps' candidates or the rounds'
/// chosen ids and marks.
size_t routerChoiceShared(int64_t experts, int64_t topK,
                          unsigned blockThreads) {
  return size_t(experts) * 2 * sizeof(float) +
         (topK <= kWarp
              ? size_t(blockThreads / kWarp + 1) * size_t(topK) * sizeof(Best)
              : size_t(topK) * sizeof(int32_t) + size_t(experts));
}

/// One block of threads for the choice: one a expert, whole warps, up to a
/// full block (the sorting kernel's warps each take chunks of 32 experts).
unsigned routerChoiceThreads(int64_t experts) {
  const int64_t threads64 = (experts + kWarp - 1) / kWarp * kWarp;
  return unsigned(threads64 < kSingleBlockThreads ? threads64
                                                  : kSingleBlockThreads);
}

} // namespace

/// routerKernel's arrival count and generation, ahead of the logits in the
/// router's scratch (16 bytes, so the logits stay aligned).
constexpr int64_t kRouterArrivalFloats = 4;

/// Where the tagged logits (8 bytes each) start: after the logits, 8-byte
/// aligned.
int64_t routerTaggedFloat(int64_t experts) {
  return kRouterArrivalFloats + (experts + 1) / 2 * 2;
}

/// Then the tagged ids (TaggedIds), 8-byte aligned as the logits' words.
int64_t routerTaggedIdsFloat(int64_t experts) {
  return routerTaggedFloat(experts) + 2 * experts;
}

int64_t routerScratchFloats(int64_t experts) {
  return routerTaggedIdsFloat(experts) +
         2 * int64_t(kTaggedIdCopies) * kTaggedIdStride;
}

cudaError_t launchMoeRouter(const float *x, const DeviceWeight &gate,
                            const float *bias, int64_t topK, Gating gating,
                            bool normalize, float routedScale, float *scratch,
                            int32_t *ids, float *weights, cudaStream_t s,
                            const InputNorm *norm, float *normalised,
                            TaggedIds *tagged) {
  if (tagged)
    *tagged = TaggedIds{};
  Geometry g;
  const int64_t experts = gate.rows;
  float *logits = scratch ? scratch + kRouterArrivalFloats : nullptr;
  const size_t shared =
      routerChoiceShared(experts, topK, routerChoiceThreads(experts));
  if (!geometryOf(gate, g) || experts <= 0 || topK < 0 || topK > experts ||
      shared > 48 * 1024 || !logits ||
      (gating != Gating::Sigmoid && gating != Gating::Softmax))
    return cudaErrorInvalidValue;
  const int64_t cols = gate.cols;
  if (norm && (!norm->weight || !normalised))
    return cudaErrorInvalidValue;
  if (gate.type == GGMLType::F32 && gate.layout == WeightLayout::Blocks &&
      cols % 4 == 0 && aligned16(gate.data) && aligned16(x) &&
      (!norm || aligned16(norm->weight))) {
    RouterArgs a{};
    a.x = x;
    a.gate = reinterpret_cast<const float4 *>(gate.data);
    a.experts = experts;
    a.cols4 = cols / 4;
    // The most parts a row (whole rows a block) that leave every lane a
    // float4 of each: GLM-5's 6,144 values are 8 parts of 6 float4 a lane.
    a.splits = heldF32Splits(a.cols4, kRouterThreads / kWarp);
    a.bias = bias;
    a.topK = topK;
    a.gating = gating;
    a.normalize = normalize;
    a.routedScale = routedScale;
    a.arrivals = reinterpret_cast<uint32_t *>(scratch);
    a.logits = logits;
    a.tagged = reinterpret_cast<uint64_t *>(
        scratch + routerTaggedFloat(experts));
    a.ids = ids;
    a.weights = weights;
    if (norm) {
      a.normWeight = reinterpret_cast<const float4 *>(norm->weight);
      a.normEps = norm->eps;
      a.normalised = normalised;
    }
    const size_t routerShared =
        routerChoiceShared(experts, topK, kRouterThreads);
    if (routerShared > 48 * 1024)
      return cudaErrorInvalidValue;
    const int64_t rowsPerBlock = kRouterThreads / kWarp / a.splits;
    const int64_t blocks = (experts + rowsPerBlock - 1) / rowsPerBlock;
    if (blocks > INT_MAX)
      return cudaErrorInvalidValue;
    // GLM-5's shape compiled in where its family is on (ModelShapes.h),
    // else the ranked choice wherever every expert has a thread.
    const bool glm5Shape =
        shapeSpecialised(ShapeFamily::Router) && experts == glm5::kExperts &&
        topK == glm5::kTopK && gating == Gating::Sigmoid &&
        a.cols4 == kGlm5RouterRows.cols4 &&
        a.splits == kGlm5RouterRows.splits &&
        reinterpret_cast<uintptr_t>(a.tagged) % 8 == 0;
    const RouterForm form = glm5Shape ? (useRouterWarps ? RouterForm::Glm5Warps
                                                        : RouterForm::Glm5)
                            : topK <= kWarp && experts <= kRouterThreads
                                ? RouterForm::Ranked
                                : RouterForm::General;
    auto pick = [&](auto norm) {
      constexpr bool kNormed = decltype(norm)::value;
      return form == RouterForm::Glm5Warps
                 ? routerKernel<kNormed, RouterForm::Glm5Warps>
             : form == RouterForm::Glm5 ? routerKernel<kNormed, RouterForm::Glm5>
             : form == RouterForm::Ranked
                 ? routerKernel<kNormed, RouterForm::Ranked>
                 : routerKernel<kNormed, RouterForm::General>;
    };
    // The ids by tags (TaggedIds) where asked, GLM-5's form publishes, the
    // router has no norm (the experts' kernels then read only what this
    // kernel's predecessors wrote before they poll) and the step's epoch
    // word will advance (it has had an all-reduce).
    if (tagged && glm5Shape && !norm && stepEpochBase && stepEpochCalls > 0) {
      a.taggedIds = reinterpret_cast<uint64_t *>(
          scratch + routerTaggedIdsFloat(experts));
      a.stepWord = stepEpochBase;
      *tagged = TaggedIds{a.taggedIds, stepEpochBase, topK};
    }
    const auto kernel = norm ? pick(std::true_type{}) : pick(std::false_type{});
    // The warps' choice keeps its few candidates in static shared memory.
    if (cudaError_t e = launchStep(
            kernel, unsigned(blocks), kRouterThreads,
            form == RouterForm::Glm5Warps ? size_t(0) : routerShared, s, a);
        e != cudaSuccess)
      return e;
    if (glm5Shape)
      noteShapeSpecialised();
    if (form == RouterForm::Glm5Warps)
      ++warpChoiceLaunches;
    return cudaGetLastError();
  }
  if (norm) {
    // The norm's own kernel first; the router then reads its output.
    if (cudaError_t e =
            launchRmsNorm(x, 1, cols, norm->weight, norm->eps, normalised, s);
        e != cudaSuccess)
      return e;
    x = normalised;
  }
  if (cudaError_t e = launchLinear(x, 1, gate, experts, false, logits, s);
      e != cudaSuccess)
    return e;
  return launchMoeChoose(logits, experts, bias, topK, gating, normalize,
                         routedScale, ids, weights, s);
}

namespace {

/// kiln-fold-router: one rank's share of the router's logits, t[e] = gate
/// row e . (g * (p + scale * x)), with the gate's rows held in registers
/// across the wait as routerKernel's (heldF32Block); the input is formed
/// as it is read, p + scale * x by one fused multiply-add (scale = 1 / tp
/// is a power of two at tp = 2, 4, 8, so that is p + exact(scale * x)).
struct RouterPartialArgs {
  const float4 *gate, *p, *x, *g;
  float scale;
  int64_t experts, cols4;
  int splits;
  float *out;
};

__global__ void __launch_bounds__(kRouterThreads)
    routerPartialKernel(RouterPartialArgs a) {
  __shared__ float partials[kRouterThreads / kWarp];
  heldF32Block(
      a.gate,
      [&a](int64_t c) {
        const float4 p = a.p[c], x = a.x[c], g = a.g[c];
        return make_float4(g.x * fmaf(a.scale, x.x, p.x),
                           g.y * fmaf(a.scale, x.y, p.y),
                           g.z * fmaf(a.scale, x.z, p.z),
                           g.w * fmaf(a.scale, x.w, p.w));
      },
      a.experts, a.cols4, a.splits, partials, a.out);
}

} // namespace

cudaError_t launchRouterPartial(const float *p, const float *x,
                                const DeviceWeight &gate, const float *g,
                                float scale, float *out, cudaStream_t s) {
  const int64_t experts = gate.rows, cols = gate.cols;
  if (gate.type != GGMLType::F32 || gate.layout != WeightLayout::Blocks ||
      experts <= 0 || cols <= 0 || cols % 4 != 0 || !p || !x || !g || !out ||
      !aligned16(gate.data) || !aligned16(p) || !aligned16(x) ||
      !aligned16(g))
    return cudaErrorInvalidValue;
  RouterPartialArgs a{};
  a.gate = reinterpret_cast<const float4 *>(gate.data);
  a.p = reinterpret_cast<const float4 *>(p);
  a.x = reinterpret_cast<const float4 *>(x);
  a.g = reinterpret_cast<const float4 *>(g);
  a.scale = scale;
  a.experts = experts;
  a.cols4 = cols / 4;
  a.splits = heldF32Splits(a.cols4, kRouterThreads / kWarp);
  a.out = out;
  const int64_t rowsPerBlock = kRouterThreads / kWarp / a.splits;
  const int64_t blocks = (experts + rowsPerBlock - 1) / rowsPerBlock;
  if (blocks > INT_MAX)
    return cudaErrorInvalidValue;
  if (cudaError_t e = launchStep(routerPartialKernel, unsigned(blocks),
                                 kRouterThreads, 0, s, a);
      e != cudaSuccess)
    return e;
  return cudaGetLastError();
}

namespace {

/// launchComposeRouter's M: a block makes a tile of kComposeRows rows (e)
/// by kComposeCols columns (j), thread (j, e0) kComposeRows / 4 values of
/// column j, over chunks of kComposeChunk values of n staged in shared
/// memory: gate * norm in double (exact: two 24-bit significands) and w.
/// Each value's sum runs over n in increasing order, one rounding per
/// product and per sum (__dmul_rn, __dadd_rn: never fused), then one to
/// float: StepOps.h's contract, the CPU backend's bits.
constexpr int kComposeRows = 32, kComposeCols = 64, kComposeChunk = 32;
constexpr int kComposeThreads = 256;
constexpr int kComposePerThread =
    kComposeRows * kComposeCols / kComposeThreads;

struct ComposeArgs {
  const float *gate, *norm, *w;
  int64_t experts, hidden, k, shareBegin, shareCols, stride;
  float *out;
};

__global__ void __launch_bounds__(kComposeThreads)
    composeRouterKernel(ComposeArgs a) {
  __shared__ double gn[kComposeRows][kComposeChunk + 1];
  __shared__ float wt[kComposeChunk][kComposeCols];
  const int t = int(threadIdx.x);
  const int col = t % kComposeCols, row0 = t / kComposeCols * kComposePerThread;
  const int64_t e0 = int64_t(blockIdx.y) * kComposeRows,
                j0 = int64_t(blockIdx.x) * kComposeCols;
  double acc[kComposePerThread];
#pragma unroll
  for (int i = 0; i < kComposePerThread; ++i)
    acc[i] = 0.0;
  for (int64_t n0 = 0; n0 < a.hidden; n0 += kComposeChunk) {
    const int count = int(a.hidden - n0 < kComposeChunk ? a.hidden - n0
                                                        : kComposeChunk);
    for (int i = t; i < kComposeRows * kComposeChunk; i += kComposeThreads) {
      const int r = i / kComposeChunk, c = i % kComposeChunk;
      const int64_t e = e0 + r, n = n0 + c;
      gn[r][c] = e < a.experts && c < count
                     ? __dmul_rn(double(a.gate[e * a.hidden + n]),
                                 double(a.norm[n]))
                     : 0.0;
    }
    for (int i = t; i < kComposeChunk * kComposeCols; i += kComposeThreads) {
      const int r = i / kComposeCols, c = i % kComposeCols;
      const int64_t n = n0 + r, j = j0 + c;
      wt[r][c] = r < count && j < a.k ? a.w[n * a.k + j] : 0.f;
    }
    __syncthreads();
    for (int c = 0; c < count; ++c) {
      const double wv = double(wt[c][col]);
#pragma unroll
      for (int i = 0; i < kComposePerThread; ++i)
        acc[i] = __dadd_rn(acc[i], __dmul_rn(gn[row0 + i][c], wv));
    }
    __syncthreads();
  }
  const int64_t j = j0 + col;
#pragma unroll
  for (int i = 0; i < kComposePerThread; ++i) {
    const int64_t e = e0 + row0 + i;
    if (e < a.experts && j < a.k)
      a.out[e * a.stride + j] = __double2float_rn(acc[i]);
  }
}

/// launchComposeRouter's C: out[e][k + j] = gate[e][shareBegin + j] *
/// norm[shareBegin + j], one thread a value.
__global__ void composeShareKernel(ComposeArgs a) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.experts * a.shareCols)
    return;
  const int64_t e = i / a.shareCols, j = i % a.shareCols,
                n = a.shareBegin + j;
  a.out[e * a.stride + a.k + j] = a.gate[e * a.hidden + n] * a.norm[n];
}

} // namespace

cudaError_t launchComposeRouter(const float *gate, const float *norm,
                                const float *w, int64_t experts,
                                int64_t hidden, int64_t k, int64_t shareBegin,
                                int64_t shareCols, float *out,
                                cudaStream_t s) {
  if (!gate || !norm || !w || !out || experts <= 0 || hidden <= 0 || k <= 0 ||
      shareBegin < 0 || shareCols < 0 || shareBegin > hidden - shareCols)
    return cudaErrorInvalidValue;
  const ComposeArgs a{gate,       norm,      w,         experts, hidden, k,
                      shareBegin, shareCols, k + shareCols, out};
  const int64_t tilesJ = (k + kComposeCols - 1) / kComposeCols,
                tilesE = (experts + kComposeRows - 1) / kComposeRows;
  if (tilesJ > INT_MAX || tilesE > 65535)
    return cudaErrorInvalidValue;
  composeRouterKernel<<<dim3(unsigned(tilesJ), unsigned(tilesE)),
                        kComposeThreads, 0, s>>>(a);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    return e;
  const int64_t values = experts * shareCols;
  if (values > 0) {
    const int64_t blocks = (values + 255) / 256;
    if (blocks > INT_MAX)
      return cudaErrorInvalidValue;
    composeShareKernel<<<unsigned(blocks), 256, 0, s>>>(a);
  }
  return cudaGetLastError();
}

cudaError_t launchMoeChoose(const float *logits, int64_t experts,
                            const float *bias, int64_t topK, Gating gating,
                            bool normalize, float routedScale, int32_t *ids,
                            float *weights, cudaStream_t s) {
  const unsigned threads = routerChoiceThreads(experts);
  const size_t shared = routerChoiceShared(experts, topK, threads);
  if (!logits || experts <= 0 || topK < 0 || topK > experts ||
      shared > 48 * 1024 || (topK > 0 && (!ids || !weights)) ||
      (gating != Gating::Sigmoid && gating != Gating::Softmax))
    return cudaErrorInvalidValue;
  if (cudaError_t e =
          launchStep(routerSelectKernel, 1, threads, shared, s, logits, experts,
                     bias, topK, gating, normalize, routedScale, ids, weights);
      e != cudaSuccess)
    return e;
  return cudaGetLastError();
}

namespace {
thread_local bool overlapped = true;
} // namespace

void setOverlappedLaunches(bool on) { overlapped = on; }
bool overlappedLaunches() { return overlapped; }

namespace {
thread_local bool prefetchEarly = true;
} // namespace

void setEarlyPrefetch(bool on) { prefetchEarly = on; }
bool earlyPrefetch() { return prefetchEarly; }

namespace {
thread_local int quietPasses = 0;
} // namespace

void setQuietPrefetchPasses(int passes) { quietPasses = passes; }
int quietPrefetchPasses() { return quietPasses; }

namespace {
thread_local unsigned widthKernels = 0;
thread_local uint64_t widthLaunches = 0;
} // namespace

void setShapeSpecialised(unsigned families) { widthKernels = families; }
bool shapeSpecialised(ShapeFamily family) {
  return (widthKernels & unsigned(family)) != 0;
}
uint64_t shapeSpecialisedLaunches() { return widthLaunches; }
void noteShapeSpecialised() { ++widthLaunches; }

cudaError_t launchArgmax(const float *x, int64_t n, int32_t *out,
                         cudaStream_t s, DrawInputs draw) {
  if (n > INT32_MAX || !out || (draw.words && !draw.position))
    return cudaErrorInvalidValue;
  if (cudaError_t e = launchStep(argmaxKernel, 1, kSingleBlockThreads, 0, s, x,
                                 n, out, draw);
      e != cudaSuccess)
    return e;
  return cudaGetLastError();
}

cudaError_t launchArgmaxCandidate(const float *x, int64_t n, int32_t base,
                                  ArgmaxCandidate *best, cudaStream_t s,
                                  DrawInputs draw) {
  if (n <= 0 || n > INT32_MAX || int64_t(base) + n - 1 > INT32_MAX || !best ||
      (draw.words && !draw.position))
    return cudaErrorInvalidValue;
  if (cudaError_t e = launchStep(argmaxCandidateKernel, 1, kSingleBlockThreads,
                                 0, s, x, n, base, best, draw);
      e != cudaSuccess)
    return e;
  return cudaGetLastError();
}

cudaError_t launchArgmaxSlots(const float *x, int64_t n, int32_t base,
                              int ranks, int me, float *slots, cudaStream_t s,
                              DrawInputs draw) {
  // Every index the candidate may name is a float exactly.
  if (n <= 0 || base < 0 || base + n > (int64_t(1) << 24) || ranks <= 0 ||
      me < 0 || me >= ranks || !slots || (draw.words && !draw.position))
    return cudaErrorInvalidValue;
  if (cudaError_t e = launchStep(argmaxSlotsKernel, 1, kSingleBlockThreads, 0,
                                 s, x, n, base, ranks, me, slots, draw);
      e != cudaSuccess)
    return e;
  return cudaGetLastError();
}

uint64_t nucleusScratchBytes(int64_t n) {
  return (sizeof(NucleusState) + 255) / 256 * 256 +
         uint64_t(n > 0 ? n : 0) * sizeof(uint32_t);
}

cudaError_t launchNucleusArgmax(const float *x, int64_t n, int32_t *out,
                                void *scratch, cudaStream_t s,
                                DrawInputs draw) {
  if (n <= 0 || n > INT32_MAX || !out || !scratch ||
      (draw.words && !draw.position))
    return cudaErrorInvalidValue;
  auto *state = static_cast<NucleusState *>(scratch);
  auto *bits = reinterpret_cast<uint32_t *>(
      static_cast<uint8_t *>(scratch) +
      (sizeof(NucleusState) + 255) / 256 * 256);
  // Chunks of ~2,048 values (eight a thread), at most kNucleusMaxBlocks.
  const int64_t wanted = (n + 2047) / 2048;
  const unsigned blocks =
      unsigned(wanted < kNucleusMaxBlocks ? wanted : kNucleusMaxBlocks);
  if (cudaError_t e = launchStep(nucleusTopKernel, blocks, kNucleusThreads, 0,
                                 s, x, n, state, draw);
      e != cudaSuccess)
    return e;
  // Top-k's counts, then the nucleus's masses.
  for (bool counting : {true, false})
    for (int pass = 0; pass < draw::kNucleusPasses; ++pass)
      if (cudaError_t e =
              launchStep(nucleusPassKernel, blocks, kNucleusThreads, 0, s, x,
                         n, state, bits, pass, counting, draw);
          e != cudaSuccess)
        return e;
  if (cudaError_t e = launchStep(nucleusKeysKernel, blocks, kNucleusThreads, 0,
                                 s, x, n, state, bits, out, draw);
      e != cudaSuccess)
    return e;
  return cudaGetLastError();
}

cudaError_t launchAdjustLogits(const float *x, int64_t n, int64_t base,
                               int64_t vocab, float *y, cudaStream_t s,
                               DrawInputs draw) {
  if (n <= 0 || base < 0 || base > vocab - n || !x || !y || !draw.words ||
      draw::adjustCapacity(draw.count) == 0)
    return cudaErrorInvalidValue;
  // Chunks of ~2,048 values (eight a thread), as the nucleus's.
  const int64_t wanted = (n + 2047) / 2048;
  const unsigned blocks =
      unsigned(wanted < kNucleusMaxBlocks ? wanted : kNucleusMaxBlocks);
  if (cudaError_t e = launchStep(adjustLogitsKernel, blocks, kAdjustThreads, 0,
                                 s, x, n, base, vocab, y, draw);
      e != cudaSuccess)
    return e;
  return cudaGetLastError();
}

cudaError_t launchPickSlots(const float *slots, int ranks, int32_t *out,
                            cudaStream_t s) {
  if (ranks <= 0 || !slots || !out)
    return cudaErrorInvalidValue;
  if (cudaError_t e = launchStep(pickSlotsKernel, 1, 1, 0, s, slots, ranks, out);
      e != cudaSuccess)
    return e;
  return cudaGetLastError();
}

cudaError_t launchPickCandidate(const ArgmaxCandidate *candidates, int ranks,
                                int32_t *out, cudaStream_t s) {
  if (ranks <= 0 || !candidates || !out)
    return cudaErrorInvalidValue;
  if (cudaError_t e =
          launchStep(pickCandidateKernel, 1, 1, 0, s, candidates, ranks, out);
      e != cudaSuccess)
    return e;
  return cudaGetLastError();
}

cudaError_t launchGatherReorder(const float *src, int64_t ranks, int64_t outer,
                                int64_t inner, float *dst, cudaStream_t s) {
  if (ranks < 0 || outer < 0 || inner < 0)
    return cudaErrorInvalidValue;
  const int64_t total = ranks * outer * inner;
  if (total > 0)
    if (cudaError_t e =
            launchStep(gatherReorderKernel, elementBlocks(total),
                       kElementThreads, 0, s, src, ranks, outer, inner, dst);
        e != cudaSuccess)
      return e;
  return cudaGetLastError();
}

cudaError_t launchFillRandomBlocks(GGMLType type, uint8_t *data, uint64_t bytes,
                                   uint64_t seed, cudaStream_t s) {
  if (!canRunGeneric(type) || (bytes > 0 && !data))
    return cudaErrorInvalidValue;
  const GGMLTypeTraits &t = traitsOf(type);
  if (bytes % t.blockBytes != 0)
    return cudaErrorInvalidValue;
  if (bytes == 0)
    return cudaGetLastError();
  const auto blocks = [](uint64_t n) {
    return elementBlocks(int64_t(n < uint64_t(INT64_MAX) ? n : INT64_MAX));
  };
  if (type == GGMLType::F32 || type == GGMLType::F16 ||
      type == GGMLType::BF16) {
    const uint64_t count = bytes / t.blockBytes;
    if (cudaError_t e = launchStep(
            fillFloatsKernel, blocks(count), kElementThreads, 0, s, data, count,
            int(t.blockBytes), type == GGMLType::BF16, seed);
        e != cudaSuccess)
      return e;
    return cudaGetLastError();
  }
  // The f16 fields of each format (GLM5.md section 4, GenericQuant.cuh);
  // every other byte (quants, packed sub-block scales) is valid whatever
  // its value.
  ScaleFields f{int32_t(t.blockBytes), 0, -1};
  switch (type) {
  case GGMLType::Q4_1:
  case GGMLType::Q5_1:
  case GGMLType::Q4_K:
  case GGMLType::Q5_K:
    f.second = 2; // d at 0, m / dmin at 2
    break;
  case GGMLType::Q2_K:
    f.first = 80; // scales[16], qs[64], then d, dmin
    f.second = 82;
    break;
  case GGMLType::Q3_K:
    f.first = 108; // hmask[32], qs[64], scales[12], then d
    break;
  case GGMLType::Q6_K:
    f.first = 208; // ql[128], qh[64], scales[16], then d
    break;
  default: // Q4_0, Q5_0, Q8_0, IQ4_NL, IQ4_XS: d at 0
    break;
  }
  if (cudaError_t e = launchStep(fillBlocksKernel, blocks(bytes),
                                 kElementThreads, 0, s, f, data, bytes, seed);
      e != cudaSuccess)
    return e;
  return cudaGetLastError();
}

cudaError_t launchFillRandomCache(DeviceCache cache, uint64_t seed,
                                  cudaStream_t s) {
  if (!validCache(cache))
    return cudaErrorInvalidValue;
  const int64_t count = cache.positions * cache.width;
  if (cudaError_t e =
          launchStep(fillFloatsKernel, elementBlocks(count), kElementThreads, 0,
                     s, static_cast<uint8_t *>(cache.data), uint64_t(count),
                     cache.type == CacheType::F32 ? 4 : 2,
                     cache.type == CacheType::BF16, seed);
      e != cudaSuccess)
    return e;
  return cudaGetLastError();
}

} // namespace kiln::cuda
