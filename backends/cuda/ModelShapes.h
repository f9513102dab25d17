//===- ModelShapes.h - The shapes the kernels are compiled for --*- C++ -*-===//
//
// Kiln's kernels take a model's shapes as launch arguments, and some are
// also compiled for fixed shapes: GLM-5's, at the tensor-parallel degrees
// its deployments use (docs/cuda.md, "Kernels compiled for GLM-5's shapes").
// A launch whose shape is in these lists runs the fixed-shape kernel where
// its family is switched on (ShapeFamily below), whose offsets are constants
// and whose rows need no bounds checks; any other launch runs the general
// kernel. Both add the same products in the same
// order, so the two give the same bits (kiln-cuda-ops checks it).
//
// The values are GLM-5's configuration (GLM5.md section 1). Host and
// device code include this header; it has no CUDA dependency.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_BACKENDS_CUDA_MODELSHAPES_H
#define KILN_BACKENDS_CUDA_MODELSHAPES_H

#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>

namespace kiln::cuda {

/// The families of kernels compiled for GLM-5's shapes, as bits of one
/// mask (setShapeSpecialised, StepKernels.h): the q8_0 mat-vecs of its
/// widths (plain, normalised, swiglu), its routed experts' Q4_K / Q5_K
/// gate/up and down, MLA for a rank's heads, the indexer's scores for its
/// 128 values a head, the F32 router of its 256 experts of kHidden values
/// (the dots and the choice of the top 8, sigmoid gating), the one-shot all-reduce of one row of its hidden width
/// over 8, 4 or 2 ranks. Each gives the general kernels' bits but MLA for 8
/// heads, which by default runs on the tensor cores (StepKernels.h
/// MlaLaunch::tensorCores); which of them run by default is a measured
/// choice (docs/cuda.md).
enum class ShapeFamily : unsigned {
  Q8 = 1,
  Experts = 2,
  Mla = 4,
  Indexer = 8,
  Router = 16,
  AllReduce = 32
};
constexpr unsigned kAllShapeFamilies =
    unsigned(ShapeFamily::Q8) | unsigned(ShapeFamily::Experts) |
    unsigned(ShapeFamily::Mla) | unsigned(ShapeFamily::Indexer) |
    unsigned(ShapeFamily::Router) | unsigned(ShapeFamily::AllReduce);

/// The families KILN_CUDA_SPECIALISED names: "1" all, "0" none, or a comma
/// list of q8, experts, mla, indexer, router and allreduce. nullopt for
/// anything else (an unknown or empty name).
inline std::optional<unsigned> parseShapeFamilies(std::string_view text) {
  if (text == "1")
    return kAllShapeFamilies;
  if (text == "0")
    return 0u;
  constexpr std::pair<std::string_view, ShapeFamily> kNames[] = {
      {"q8", ShapeFamily::Q8},         {"experts", ShapeFamily::Experts},
      {"mla", ShapeFamily::Mla},       {"indexer", ShapeFamily::Indexer},
      {"router", ShapeFamily::Router}, {"allreduce", ShapeFamily::AllReduce}};
  unsigned families = 0;
  for (;;) {
    const size_t comma = text.find(',');
    const std::string_view name = text.substr(0, comma);
    unsigned bit = 0;
    for (const auto &[known, family] : kNames)
      if (name == known)
        bit = unsigned(family);
    if (bit == 0)
      return std::nullopt;
    families |= bit;
    if (comma == std::string_view::npos)
      return families;
    text = text.substr(comma + 1);
  }
}

} // namespace kiln::cuda

namespace kiln::cuda::glm5 {

inline constexpr int kHidden = 6144;
inline constexpr int kQLoraRank = 2048;
inline constexpr int kLatent = 512; ///< kv_lora_rank
inline constexpr int kRope = 64;    ///< qk_rope_head_dim
inline constexpr int kNope = 192;   ///< qk_nope_head_dim
inline constexpr int kHeads = 64;
inline constexpr int kVHead = 256;
inline constexpr int kSharedFfn = 2048; ///< the shared expert's width
inline constexpr int kExpertFfn = 2048; ///< a routed expert's width
inline constexpr int kExperts = 256;    ///< routed experts
inline constexpr int kTopK = 8;         ///< routed experts a token
inline constexpr int kIndexDim = 128;   ///< the DSA indexer's head dim

/// attn_output's input at tensor-parallel degree `tp`: the rank's heads'
/// values.
constexpr int attnOutputWidth(int tp) { return kHeads * kVHead / tp; }
/// The shared expert's down projection's input at degree `tp`.
constexpr int sharedDownWidth(int tp) { return kSharedFfn / tp; }

/// The widths (values a row) of GLM-5's q8_0 mat-vecs at tp = 1, 2, 4 and
/// 8, by what the kernel dots the rows with (StepMatVec.cu's Q8Input):
/// - the input as it is: attn_k_b (a head's nope values), attn_v_b (a
///   head's latent values, after MLA), the q_a run and the shared expert's
///   gate/up (hidden), attn_output (every degree);
using Q8PlainWidths =
    std::integer_sequence<int, kNope, kLatent, attnOutputWidth(8),
                          attnOutputWidth(4), kHidden, attnOutputWidth(2),
                          attnOutputWidth(1)>;
/// - the input RMS-normalised on the fly: q_b and the indexer's q_b (after
///   q_a's norm), and the first layer's q_a run (after the embedding);
using Q8NormWidths = std::integer_sequence<int, kQLoraRank, kHidden>;
/// - silu(gate) * up: the shared expert's down projection.
using Q8SwigluWidths =
    std::integer_sequence<int, sharedDownWidth(8), sharedDownWidth(4),
                          sharedDownWidth(2), sharedDownWidth(1)>;

/// A routed expert's width at tp = 8, 4, 2 and 1 (each expert split on
/// it): the routed gate/up kernel for Q4_K and Q5_K rows of kHidden values.
/// (The routed down kernel for Q4_K / Q5_K rows is compiled for kHidden
/// and kTopK; it runs only where the width is 256, tp = 8.)
using ExpertFfnWidths =
    std::integer_sequence<int, kExpertFfn / 8, kExpertFfn / 4, kExpertFfn / 2,
                          kExpertFfn>;

/// A rank's attention heads at tp = 8, 4, 2 and 1: the MLA kernel for
/// kLatent and kRope over an f16 cache.
using MlaHeadCounts =
    std::integer_sequence<int, kHeads / 8, kHeads / 4, kHeads / 2, kHeads>;

/// The ranks of a tensor-parallel group GLM-5 deploys on (tp = 8, 4, 2):
/// the one-shot all-reduce of one row of kHidden values over them.
using PeerRankCounts = std::integer_sequence<int, 8, 4, 2>;

/// What `make` returns for the value of `values` equal to `v`, `none` where
/// none is: make(std::integral_constant<int, value>{}) names the kernel or
/// launch compiled for that value (a width, a head count).
template <typename R, int... kValues, typename Make>
R pickShape(int64_t v, std::integer_sequence<int, kValues...>, R none,
            Make make) {
  R out = none;
  ((v == kValues ? (out = make(std::integral_constant<int, kValues>{}), 0) : 0),
   ...);
  return out;
}

} // namespace kiln::cuda::glm5

#endif // KILN_BACKENDS_CUDA_MODELSHAPES_H
