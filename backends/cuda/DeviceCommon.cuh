//===- DeviceCommon.cuh - Device helpers of the step kernels ---*- CUDA -*-===//
#ifndef KILN_BACKENDS_CUDA_DEVICECOMMON_CUH
#define KILN_BACKENDS_CUDA_DEVICECOMMON_CUH

#include "MatVec.h"
#include "StepKernels.h"

#include <climits>
#include <cstdint>
#include <optional>

namespace kiln::cuda {

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
