//===- DeviceCommon.cuh - Device helpers of the step kernels ---*- CUDA -*-===//
#ifndef KILN_BACKENDS_CUDA_DEVICECOMMON_CUH
#define KILN_BACKENDS_CUDA_DEVICECOMMON_CUH

#include "Launch.cuh"
#include "MatVec.h"
#include "StepKernels.h"
#include "Warp.cuh"

#include <climits>
#include <cstdint>
#include <optional>
#include <type_traits>

namespace kiln::cuda {

/// Whether p is 16-byte aligned (the float4 and bulk-copy kernels' need).
inline bool aligned16(const void *p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

/// The bytes of one row of `w` when the kernels can read it: the Blocks
/// layout, a type the
/// generic decoder knows, a row length of whole blocks that fits 32 bits,
/// and data behind any rows. nullopt otherwise.
inline std::optional<uint64_t> usableRowBytes(const DeviceWeight &w) {
  if (w.layout != WeightLayout::Blocks || !canRunGeneric(w.type) ||
      w.rows < 0 || w.cols <= 0 || w.cols > INT32_MAX ||
      (w.rows > 0 && !w.data))
    return std::nullopt;
  return rowBytes(w.type, uint64_t(w.cols));
}

/// F32 mat-vec rows whose first loads are held in registers across the
/// predecessor wait: a warp takes float4 [begin, end) of one row, lane l
/// the float4s begin + l, begin + l + 32, ...; holdF32Part loads its first
/// kHeldF32Loads of them (weights are never written during a step, so
/// these loads cross no hazard and stream in while the predecessor
/// finishes), heldF32Dot then dots them, and any beyond, with x: the
/// lane's partial sum, in a fixed order, for warpSum.
constexpr int kHeldF32Loads = 8;

/// A held F32 mat-vec's shape compiled in: rows of cols4 float4 in `splits`
/// parts, blocks of `warps` warps; all zero: taken at run time.
struct F32Shape {
  int cols4 = 0, splits = 0, warps = 0;
  /// The float4 a lane holds of its part: 0 at run-time shapes. (A
  /// function, so that the run-time shape's zero splits divide nothing
  /// where the compiler looks at both sides of a condition.)
  __host__ __device__ constexpr int perLane() const {
    return cols4 > 0 ? cols4 / (splits * kWarp) : 0;
  }
  __host__ __device__ constexpr bool fits() const {
    return cols4 == 0 ||
           (splits > 0 && cols4 % (splits * kWarp) == 0 &&
            perLane() <= kHeldF32Loads);
  }
};

/// sum + u . v, x to w in order, by fused multiply-adds.
__device__ __forceinline__ float dotAdd4(float4 u, float4 v, float sum) {
  sum = fmaf(u.x, v.x, sum);
  sum = fmaf(u.y, v.y, sum);
  sum = fmaf(u.z, v.z, sum);
  return fmaf(u.w, v.w, sum);
}

/// kPer > 0: every lane's part is exactly kPer float4 (a compiled shape,
/// F32Shape), so no load needs a bound.
template <int kPer = 0>
__device__ inline void holdF32Part(const float4 *row, int64_t begin,
                                   int64_t end, bool valid,
                                   float4 (&held)[kHeldF32Loads]) {
  static_assert(kPer <= kHeldF32Loads);
  const int lane = int(threadIdx.x) % kWarp;
#pragma unroll
  for (int k = 0; k < (kPer > 0 ? kPer : kHeldF32Loads); ++k) {
    const int64_t c = begin + lane + int64_t(k) * kWarp;
    held[k] = valid && (kPer > 0 || c < end) ? __ldg(row + c)
                                             : make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

/// xAt(c): float4 c of the input vector (loaded after the wait). kPer as
/// holdF32Part's: the same products in the same order, without bounds.
template <int kPer = 0, typename XAt>
__device__ inline float heldF32Dot(const float4 *row, XAt &&xAt,
                                   int64_t begin, int64_t end, bool valid,
                                   const float4 (&held)[kHeldF32Loads]) {
  const int lane = int(threadIdx.x) % kWarp;
  float sum = 0.f;
  auto add = [&](float4 u, float4 v) { sum = dotAdd4(u, v, sum); };
#pragma unroll
  for (int k = 0; k < (kPer > 0 ? kPer : kHeldF32Loads); ++k) {
    const int64_t c = begin + lane + int64_t(k) * kWarp;
    if (valid && (kPer > 0 || c < end))
      add(held[k], xAt(c));
  }
  if constexpr (kPer == 0)
    for (int64_t c = begin + lane + int64_t(kHeldF32Loads) * kWarp; c < end;
         c += kWarp)
      if (valid)
        add(__ldg(row + c), xAt(c));
  return sum;
}

__device__ inline float heldF32Dot(const float4 *row, const float4 *x,
                                   int64_t begin, int64_t end, bool valid,
                                   const float4 (&held)[kHeldF32Loads]) {
  return heldF32Dot(
      row, [x](int64_t c) { return x[c]; }, begin, end, valid, held);
}

/// Where a held F32 mat-vec's row sums go (heldF32Block's `y`): y[row] for a
/// pointer (none for a null one or nullptr), or a callable's y(row, sum).
template <typename Out> __device__ inline bool rowsOut(const Out &y) {
  if constexpr (std::is_same_v<Out, std::nullptr_t>)
    return false;
  else if constexpr (std::is_pointer_v<Out>)
    return y != nullptr;
  else
    return true;
}
template <typename Out>
__device__ inline void rowOut(Out &y, int64_t row, float sum) {
  if constexpr (std::is_pointer_v<Out>)
    y[row] = sum;
  else if constexpr (!std::is_same_v<Out, std::nullptr_t>)
    y(row, sum);
}

/// One block of a held F32 mat-vec: warp w takes part w % splits of row
/// blockIdx.x * (warps / splits) + w / splits of `w` (rows of cols4 float4;
/// rows past `rows` take none), holds its first loads across the
/// predecessor wait (the step prologue runs here), and the block adds each
/// row's parts in order into y (rowOut; a null y: the parts stay in
/// partials[warp], for the caller to finish). Every thread of the block
/// calls it.
/// xAt(c): float4 c of the input vector (loaded after the wait).
/// kShape (F32Shape): the row width, the parts and the block's warps
/// compiled in (the router's for GLM-5), the same products in the same order.
template <F32Shape kShape = F32Shape{}, typename XAt, typename Out>
__device__ inline void heldF32Block(const float4 *w, XAt &&xAt, int64_t rows,
                                    int64_t cols4Arg, int splitsArg,
                                    float *partials, Out y) {
  constexpr bool kShaped = kShape.cols4 > 0;
  static_assert(kShape.fits(), "whole parts of at most kHeldF32Loads");
  constexpr int kPer = kShape.perLane();
  const int64_t cols4 = kShaped ? kShape.cols4 : cols4Arg;
  const int splits = kShaped ? kShape.splits : splitsArg;
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
  const int warps = kShaped ? kShape.warps : int(blockDim.x) / kWarp;
  const int64_t row = int64_t(blockIdx.x) * (warps / splits) + warp / splits;
  const int part = warp % splits;
  const bool valid = row < rows; // the same for the whole warp
  const int64_t begin = cols4 * part / splits,
                end = cols4 * (part + 1) / splits;
  const float4 *r = w + (valid ? row : 0) * cols4;
  float4 held[kHeldF32Loads];
  holdF32Part<kPer>(r, begin, end, valid, held);
  stepKernelPrologue();
  const float sum =
      warpSum(heldF32Dot<kPer>(r, xAt, begin, end, valid, held));
  if (lane == 0)
    partials[warp] = sum;
  __syncthreads();
  if (rowsOut(y) && valid && part == 0 && lane == 0) {
    float total = partials[warp];
    for (int p = 1; p < splits; ++p)
      total += partials[warp + p];
    rowOut(y, row, total);
  }
}

__device__ inline void heldF32Block(const float4 *w, const float4 *x,
                                    int64_t rows, int64_t cols4, int splits,
                                    float *partials, float *y) {
  heldF32Block(
      w, [x](int64_t c) { return x[c]; }, rows, cols4, splits, partials, y);
}

/// heldF32Block over x RMS-normalised with g (epsilon eps): each row dotted
/// with x * g and its sum divided by the rms of x, whose squares the row's
/// warps take from the x values they read (no norm kernel, no normalised
/// vector), into y (rowOut). `squares`: a float a warp of shared memory;
/// *blockRms (shared) gets the rms of the block's first row, the same bits
/// as every row's (each row's squares are summed in one order). Every
/// thread of the block calls it.
/// kShape as heldF32Block's.
template <F32Shape kShape = F32Shape{}, typename Out>
__device__ inline void heldF32NormedBlock(const float4 *w, const float4 *x,
                                          const float4 *g, int64_t rows,
                                          int64_t cols4Arg, int splitsArg,
                                          float eps, float *partials,
                                          float *squares, float *blockRms,
                                          Out y) {
  constexpr bool kShaped = kShape.cols4 > 0;
  const int64_t cols4 = kShaped ? kShape.cols4 : cols4Arg;
  const int splits = kShaped ? kShape.splits : splitsArg;
  float sq = 0.f;
  heldF32Block<kShape>(
      w,
      [&](int64_t c) {
        const float4 v = x[c], s = g[c];
        sq = dotAdd4(v, v, sq);
        return make_float4(v.x * s.x, v.y * s.y, v.z * s.z, v.w * s.w);
      },
      rows, cols4, splits, partials, nullptr);
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
  const float total = warpSum(sq);
  if (lane == 0)
    squares[warp] = total;
  __syncthreads();
  const int warps = kShaped ? kShape.warps : int(blockDim.x) / kWarp;
  const int64_t row = int64_t(blockIdx.x) * (warps / splits) + warp / splits;
  if (row < rows && warp % splits == 0 && lane == 0) {
    float sum = partials[warp], ss = squares[warp];
    for (int p = 1; p < splits; ++p) {
      sum += partials[warp + p];
      ss += squares[warp + p];
    }
    const float rms = sqrtf(ss / float(cols4 * 4) + eps);
    rowOut(y, row, sum / rms);
    if (warp == 0)
      *blockRms = rms;
  }
  __syncthreads();
}

/// Parts per row of a held F32 mat-vec with `warps` warps a block (whole
/// rows a block): the most, a power of two up to `warps`, that leave every
/// lane a float4 of each part.
inline int heldF32Splits(int64_t cols4, int warps) {
  int splits = warps;
  while (splits > 1 && cols4 / splits < kWarp)
    splits /= 2;
  return splits;
}

/// Claims the op's fault record (its first claimer wins), fills in the
/// rest, then offers the op's index to the step's first-fault word.
__device__ inline void recordFault(FaultSink sink, FaultCode code,
                                   int64_t value, int64_t limit) {
  if (!sink.fault)
    return;
  if (atomicCAS(&sink.fault->code, 0, int32_t(code)) == 0) {
    sink.fault->op = sink.op;
    sink.fault->value = value;
    sink.fault->limit = limit;
    __threadfence();
    if (sink.first)
      atomicMin(sink.first, uint32_t(sink.op));
  }
}

/// How long a kernel waits for other blocks (a grid barrier: the grid is one
/// wave, so every block is resident unless something else holds the
/// multiprocessors) or other GPUs (the one-shot all-reduce) before it
/// reports the wait as a step fault instead of hanging.
constexpr uint64_t kDeviceWaitNs = 10'000'000'000ull;

__device__ inline uint64_t globalNanos() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// The words of a grid barrier (gridBarrier), at the start of zeroed
/// scratch: two arrival counts, then the parity saying which of them the
/// next call's blocks count on.
constexpr int kGridBarrierWords = 3;

/// The count a call's blocks arrive on: read after the kernel's wait (the
/// previous call's block 0 wrote it before that call ended), by each
/// block's thread 0, from the L2.
__device__ inline uint32_t gridBarrierParity(const uint32_t *words) {
  return __ldcg(words + 2) & 1u;
}

/// Blocks 0 .. blocks - 1 of a grid that is all resident (one wave) have
/// all arrived, and their writes before the call are visible to the
/// caller's block. Thread 0 of each block adds one to words[parity]
/// (`red.release`: one way, no reply awaited) and reads it (`ld.acquire`)
/// until it is `blocks`; then block 0 zeroes the other count and flips the
/// parity for the next call. No block of this call reads either again (each
/// read the parity before arriving, and block 0 writes after every block
/// arrived), and the next call reads them after its wait. (An arrival that
/// returns the generation to wait for, `atom.acq_rel`, cost the last block
/// a round trip to the L2 before its release could go out: docs/perf.md,
/// fifty-third pass.) A wait past kDeviceWaitNs is reported to `fault`
/// (GridWaitTimeout) and ends; the next call counts on the other word,
/// which that call's block 0 zeroed, so one lost arrival does not hang every
/// call after it. Writes of other blocks are read after it from the L2
/// (__ldcg): this block's L1 may hold older lines.
__device__ inline void gridBarrier(uint32_t *words, uint32_t parity,
                                   unsigned blocks, FaultSink fault) {
  __syncthreads();
  if (threadIdx.x == 0) {
    // The arrival releases the block's writes (ordered before it by the
    // block barrier); the read that sees every arrival acquires theirs.
    uint32_t *count = words + parity;
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count)
                 : "memory");
    const uint64_t start = globalNanos();
    for (;;) {
      uint32_t now;
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                   : "=r"(now)
                   : "l"(count)
                   : "memory");
      if (now >= blocks)
        break;
      if (globalNanos() - start > kDeviceWaitNs) {
        recordFault(fault, FaultCode::GridWaitTimeout, blocks, 0);
        break;
      }
      __nanosleep(32);
    }
    if (blockIdx.x == 0) {
      __stcg(words + (parity ^ 1u), 0u);
      __stcg(words + 2, parity ^ 1u);
    }
  }
  __syncthreads();
}

/// A 64-bit word that is its own flag: `tag` above a 32-bit value, one
/// relaxed store (aligned 64-bit accesses are single-copy atomic, so a
/// reader that sees the tag sees the value with it; no fence, no atomic).
__device__ inline void publishTaggedWord(uint64_t *word, uint32_t tag,
                                         uint32_t value) {
  const uint64_t v = uint64_t(tag) << 32 | value;
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(word), "l"(v)
               : "memory");
}

/// One relaxed read of a tagged word (its tag above its value).
__device__ inline uint64_t loadTaggedWord(const uint64_t *word) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];"
               : "=l"(v)
               : "l"(word)
               : "memory");
  return v;
}

/// Reads `word` until it carries `tag` (sleeping sleepNs between reads,
/// none for 0), its value into *value; false after kDeviceWaitNs.
__device__ inline bool awaitTaggedWord(const uint64_t *word, uint32_t tag,
                                       unsigned sleepNs, uint32_t *value) {
  const uint64_t start = globalNanos();
  for (;;) {
    const uint64_t v = loadTaggedWord(word);
    if (uint32_t(v >> 32) == tag) {
      *value = uint32_t(v);
      return true;
    }
    if (globalNanos() - start > kDeviceWaitNs)
      return false;
    if (sleepNs)
      __nanosleep(sleepNs);
  }
}

/// awaitTaggedWord for a whole warp, lane l reading its own `word`: the warp
/// polls together until every lane's word carries `tag` (or kDeviceWaitNs
/// has passed for a lane: false there), so that no lane waits at a warp
/// collective after it while others spin on their own (a warp split so, one
/// part spinning with sleeps and one blocked at a shuffle, took GLM-5's
/// router ~4.5 us longer to see its last logit: docs/perf.md, fifty-eighth
/// pass). Every lane of the warp must call it.
__device__ inline bool awaitTaggedWordWarp(const uint64_t *word, uint32_t tag,
                                           unsigned sleepNs, uint32_t *value) {
  const uint64_t start = globalNanos();
  bool have = false, late = false;
  for (;;) {
    if (!have && !late) {
      const uint64_t v = loadTaggedWord(word);
      if (uint32_t(v >> 32) == tag) {
        have = true;
        *value = uint32_t(v);
      } else {
        late = globalNanos() - start > kDeviceWaitNs;
      }
    }
    if (__all_sync(0xffffffffu, have || late))
      return have;
    if (sleepNs)
      __nanosleep(sleepNs);
  }
}

/// silu(g) = g / (1 + exp(-g)), as the CPU reference.
__device__ inline float silu(float g) { return g / (1.f + expf(-g)); }

//===----------------------------------------------------------------------===//
// Bulk copies into shared memory (sm_90+). One thread starts a copy of a
// contiguous run of global bytes into the block's shared memory with
// cp.async.bulk (the copy engine; no registers held while it is in
// flight) and names a shared-memory barrier; the barrier's phase completes
// when every byte announced to it with barrierArriveExpect has landed, and
// threads that waited on it then read the bytes with ordinary loads.
// Addresses and sizes must be multiples of 16 bytes. The routed experts'
// kernels (StepMatVec.cu) use these to have all of a block's weight rows
// in flight at once.
//===----------------------------------------------------------------------===//

/// The shared-memory address of p, for the instructions below.
__device__ __forceinline__ uint32_t sharedAddress(const void *p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

/// Makes *bar a barrier that one arrival (with its expected bytes)
/// completes; barrierInitFence() then makes it visible to the copy engine.
__device__ __forceinline__ void barrierInit(uint64_t *bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sharedAddress(bar))
      : "memory");
#endif
}

__device__ __forceinline__ void barrierInitFence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

/// Arrives on *bar, announcing `bytes` of copies that complete its phase.
__device__ __forceinline__ void barrierArriveExpect(uint64_t *bar,
                                                    uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(
                   sharedAddress(bar)),
               "r"(bytes)
               : "memory");
#endif
}

/// Waits until phase `parity` (0 for a barrier's first) of *bar completes.
__device__ __forceinline__ void barrierWait(uint64_t *bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t done = 0;
  while (!done)
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n"
                 "}"
                 : "=r"(done)
                 : "r"(sharedAddress(bar)), "r"(parity)
                 : "memory");
#endif
}

/// Copies `bytes` global bytes at src to shared memory at dst, completing
/// that many of *bar's expected bytes.
__device__ __forceinline__ void bulkCopy(void *dst, const void *src,
                                         uint32_t bytes, uint64_t *bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::"
               "bytes [%0], [%1], %2, [%3];" ::"r"(sharedAddress(dst)),
               "l"(src), "r"(bytes), "r"(sharedAddress(bar))
               : "memory");
#endif
}

} // namespace kiln::cuda

#endif // KILN_BACKENDS_CUDA_DEVICECOMMON_CUH
