//===- Warp.cuh - Warp-level helpers shared by Kiln's kernels --*- CUDA -*-===//
#ifndef KILN_BACKENDS_CUDA_WARP_CUH
#define KILN_BACKENDS_CUDA_WARP_CUH

namespace kiln::cuda {

constexpr int kWarp = 32;

/// The sum of `v` over the 32 lanes, in every lane (butterfly order: the
/// same bits on every run).
__device__ inline float warpSum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

} // namespace kiln::cuda

#endif // KILN_BACKENDS_CUDA_WARP_CUH
