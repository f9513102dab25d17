//===- DeviceCommon.cuh - Device helpers shared by the step kernels -*- CUDA
//-*-===//
#ifndef KILN_BACKENDS_CUDA_DEVICECOMMON_CUH
#define KILN_BACKENDS_CUDA_DEVICECOMMON_CUH

#include "MatVec.h"
#include "StepKernels.h"

#include <climits>
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

} // namespace kiln::cuda

#endif // KILN_BACKENDS_CUDA_DEVICECOMMON_CUH
