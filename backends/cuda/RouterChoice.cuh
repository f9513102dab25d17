//===- RouterChoice.cuh - The MoE router's choice --------------*- CUDA -*-===//
//
// The router's scores from its logits and its top-k choice by ranks, shared
// by the router's kernels (StepKernels.cu) and the routed experts' kernels
// that make the choice themselves from the router's logits (StepMatVec.cu,
// ExpertArgs::route). One code for both, so that either gives the CPU's ids,
// order and weights bit for bit (CpuKernels.h moeRouter): p = sigmoid or
// softmax of the logits, the topK experts by p + bias (NaN lowest, ties to
// the lower id) in descending order, weights[k] = p[ids[k]] over the chosen
// p summed in k order (floored), times the routed scale.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_BACKENDS_CUDA_ROUTERCHOICE_CUH
#define KILN_BACKENDS_CUDA_ROUTERCHOICE_CUH

#include "StepKernels.h"
#include "Warp.cuh"

#include <climits>
#include <cstdint>

namespace kiln::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

/// The smallest normal fp16, the router's floor on its normaliser (as
/// CpuKernels.cpp and ggml).
constexpr float kRouterSumFloor = 6.1035e-5f;

__device__ inline float warpMax(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

/// The sum of `v` over the block, in every thread: each warp's butterfly,
/// then the warps' sums in warp order. `shared` holds kWarp floats.
/// Deterministic for a given blockDim (a multiple of kWarp).
__device__ inline float blockSum(float v, float *shared) {
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
__device__ inline float blockMax(float v, float *shared) {
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

/// NaN ranks below everything (the CPU's rankable()).
__device__ inline float rankable(float v) { return isnan(v) ? -INFINITY : v; }

/// p (into prob) and the ranking score p + bias (into choice) of each of
/// the `experts` logits, then a block barrier. Logits are read from the L2
/// (ld.global.cg): they were written by other blocks or another kernel.
/// `bias` may point into `choice` itself (a caller that loaded it there
/// early): each thread reads its experts' bias before it writes them.
/// `partials` holds kWarp floats (softmax's block reductions).
__device__ __forceinline__ void routerScores(const float *logits,
                                             int64_t experts, const float *bias,
                                             Gating gating, float *prob,
                                             float *choice, float *partials) {
  if (gating == Gating::Sigmoid) {
    for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) {
      const float logit = __ldcg(logits + e), b = bias ? bias[e] : 0.f;
      const float p = 1.f / (1.f + expf(-logit));
      prob[e] = p;
      // The bias only steers the choice; the weights come from p alone.
      choice[e] = rankable(bias ? p + b : p);
    }
  } else {
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
      const float b = bias ? bias[e] : 0.f;
      prob[e] /= sum;
      choice[e] = rankable(bias ? prob[e] + b : prob[e]);
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

/// Whether a is `better` than b (the larger key, then the lower index; an
/// entry never beats itself), without branches (bitwise, not
/// short-circuit), so that a loop of these over shared memory issues its
/// reads ahead of the compares.
__device__ inline int beats(Best a, Best b) {
  return int(a.key > b.key) | (int(a.key == b.key) & int(a.index < b.index));
}

/// The most experts the ranked choice takes (its shared memory: ~16 KiB).
constexpr int64_t kMaxRankedExperts = 1024;

/// Whether the ranked choice takes `experts` and topK (rankedChoose).
__host__ __device__ constexpr bool rankedChoiceTakes(int64_t experts,
                                                     int64_t topK) {
  return experts > 0 && experts <= kMaxRankedExperts && topK > 0 &&
         topK <= kWarp && topK <= experts;
}

/// The ranked choice's shared memory: prob and choice (experts floats
/// each), the groups' candidates, then the chosen (rankedChoose).
__host__ __device__ constexpr int64_t rankedChoiceBytes(int64_t experts,
                                                        int64_t topK) {
  return 8 * experts + int64_t(sizeof(Best)) * ((experts + 31) / 32 + 1) * topK;
}

/// The topK best of choice[0, experts) (rankedChoiceTakes) into top[0,
/// topK) in rank order, each as {prob[id], id}, by the whole block, ending
/// with a block barrier. Expert e is lane e % 32 of group e / 32: it counts
/// the experts of its group that beat its own (`beats` is a total order:
/// lanes past the last expert are -inf with ids past it, below every real
/// one), so a group's ranks are 0 .. 31 and those below topK are its
/// candidates, in rank order. The best topK overall are all candidates,
/// and whatever beats one of them is one too, so a candidate's rank among
/// the groups' candidates is its rank among all the experts wherever that
/// is below topK: those fill `top` in rank order. Independent compares
/// (shared-memory reads of clamped indices, their values selected rather
/// than branched around, so that they issue ahead of the compares)
/// instead of a sorting network's dependent stages, kReads of them in
/// flight at a time (a divisor of 32: fewer registers, more rounds; the
/// same ranks). `candidates` holds (experts + 31) / 32 * topK entries.
template <int kReads = kWarp>
__device__ __forceinline__ void
rankedChoose(const float *choice, const float *prob, int experts, int topK,
             Best *candidates, Best *top) {
  const int groups = (experts + kWarp - 1) / kWarp;
  for (int v = int(threadIdx.x); v < groups * kWarp; v += int(blockDim.x)) {
    const int lane = v % kWarp, first = v - lane;
    const float key = v < experts ? choice[v] : -INFINITY;
    static_assert(kWarp % kReads == 0);
    int rank = 0;
#pragma unroll 1
    for (int j0 = 0; j0 < kWarp; j0 += kReads)
#pragma unroll
      for (int j = j0; j < j0 + kReads; ++j) {
        const int at = first + j;
        const float read = choice[at < experts ? at : experts - 1];
        const float other = at < experts ? read : -INFINITY;
        rank += int(other > key) | (int(other == key) & int(j < lane));
      }
    if (rank < topK)
      candidates[(v / kWarp) * topK + rank] = Best{key, v};
  }
  __syncthreads();
  // `share` consecutive threads a candidate (a power of two: the sum below
  // stays within a warp), each counting every share-th candidate; as many
  // rounds of the block as that takes (uniform: the shuffles need every
  // lane).
  const int count = groups * topK;
  int shift = 0;
  while (shift < 5 && (2 << shift) * count <= int(blockDim.x))
    ++shift;
  const int share = 1 << shift;
  for (int slot0 = 0; slot0 < count * share; slot0 += int(blockDim.x)) {
    const int slot = slot0 + int(threadIdx.x);
    const int c = slot >> shift, part = slot & (share - 1);
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
  }
  __syncthreads();
}

/// The sum of the chosen p in k order (every thread alike, from shared
/// memory: no chain of shuffles).
__device__ inline float chosenSum(const Best *top, int topK) {
  float sum = 0.f;
  for (int k = 0; k < topK; ++k)
    sum += top[k].key;
  return sum;
}

} // namespace kiln::cuda

#endif // KILN_BACKENDS_CUDA_ROUTERCHOICE_CUH
