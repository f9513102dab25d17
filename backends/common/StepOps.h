//===- StepOps.h - Step ops decoded and checked, for every backend -*- C++ -*-===//
//
// An artifact's ops are strings, operand indices and attributes. Before a
// backend binds memory to them, each op is decoded here into one checked
// record: its kind, its operands, and every size and parameter its kernel
// needs, derived from the buffers' shapes and the weights' local dims (a
// rank's slice). A malformed op (wrong operand count, a buffer of the wrong
// type or shape, a missing attribute) is refused here, naming the step, the
// op and the problem, so no backend kernel is ever launched on sizes that
// do not fit its buffers. The CPU and CUDA backends both build on it.
//
// Weight bytes are placed here too: sliceWeight copies a rank's part of a
// split weight out of the file's tensor into contiguous rows.
//
// No LLVM/MLIR here: this library is part of the runtime's plugins.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_BACKENDS_COMMON_STEPOPS_H
#define KILN_BACKENDS_COMMON_STEPOPS_H

#include "artifact/Artifact.h"
#include "backend/KilnBackend.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::backend {

enum class OpKind {
  Copy,
  Slice,
  Concat,
  Add,
  Swiglu,
  RmsNorm,
  LayerNorm,
  AddRmsNorm,
  AllReduceAddRmsNorm,
  AllReduceAdd,
  Rope,
  Dequant,
  Embed,
  Linear,
  FusedLinear,
  RmsNormLinear,
  SwigluLinear,
  CacheAppend,
  NormRopeAppend,
  MlaAttention,
  DsaIndexer,
  MoeRouter,
  RmsNormRouter,
  MoeExperts,
  RouterPartial,
  LinearRouter,
  MoeChoose,
  Argmax,
  AllReduce,
  AllGather,
  DistributedArgmax,
};

using artifact::localDims;

/// A weight as a rank holds it: contiguous rows of the file's blocks.
struct HostWeight {
  const uint8_t *data = nullptr;
  uint64_t bytes = 0;
  GGMLType type = GGMLType::F32;
  std::vector<int64_t> dims; ///< local dims, GGUF order
  std::string name;
  /// Rows (product of dims after the first) and values per row (dims[0]).
  int64_t rows() const;
  int64_t cols() const { return dims.empty() ? 0 : dims[0]; }
};

/// Rank's part of binding `b` from the file's tensor bytes: the tensor
/// itself when unsliced, else the slice copied into `store` row by row (a
/// slice of ne[0] takes whole blocks). Checks the byte count against the
/// binding's type and dims and refuses a cut through a block. The bytes
/// are the file's blocks whatever the binding's device layout: a backend
/// that reads another layout repacks them.
Expected<HostWeight> sliceWeight(const artifact::WeightBinding &b,
                                 const kiln_weight_bytes &bytes,
                                 std::vector<std::vector<uint8_t>> &store);

/// One op, checked. Which fields an op uses is listed per kind; operands
/// are buffer indices of the op's step.
struct StepOp {
  OpKind kind = OpKind::Copy;
  std::string where; ///< "step 'decode_step' op 12 (linear)", for errors
  std::vector<int32_t> ins, outs;

  /// Copy, Add, Swiglu, AllReduce: n values (rows = 1).
  /// RmsNorm, LayerNorm, AddRmsNorm, AllReduceAdd, AllReduceAddRmsNorm,
  /// Rope: rows of n.
  /// Linear: rows = batch, n = output rows per batch, k = K. LinearRouter:
  /// rows = 1, n = N, k = K (below).
  /// Embed: n = hidden, k = vocab. Dequant: n = values.
  /// Argmax, DistributedArgmax: n values; with `drawn`, ins[1] are the
  /// sampling words and ins[2] the position (DrawKey.h).
  int64_t rows = 1, n = 0, k = 0;
  /// Linear: a 3-D weight, one matrix per batch row.
  bool stacked = false;
  /// MlaAttention: the output projection is fused in (see heads below).
  bool projected = false;

  /// RmsNorm, LayerNorm, AddRmsNorm, AllReduceAddRmsNorm, NormRopeAppend.
  double epsilon = 0;
  /// Rope, NormRopeAppend (n = the row's width, k = the normalised
  /// values, a layer norm when hasBias), DsaIndexer (the query's rope when
  /// ropeDims > 0).
  bool neox = false;
  double theta = 0;
  int64_t ropeOffset = 0, ropeDims = 0;

  /// Slice: the box (same rank as the input).
  std::vector<int64_t> srcShape, dstShape, offsets;
  /// Concat: outer runs; each input contributes `runs[i]` values per outer
  /// index. FusedLinear, RmsNormLinear: segments[i] is weight i's first
  /// output row; the weights follow the input (RmsNormLinear: ins[1]
  /// is the norm's weight, epsilon its epsilon).
  int64_t outer = 1;
  std::vector<int64_t> runs, segments;
  /// FusedLinear, RmsNormLinear (optional, one per weight): weight i's rows
  /// are read only at steps whose position input is >= liveFrom[i]; below,
  /// a backend may leave them unwritten (step.fused_linear live_from).
  std::vector<int64_t> liveFrom;

  /// MlaAttention: heads, latent (= k), rope; selection capacity (0: none);
  /// with `projected`, the last input is a stack [latent, n, heads] that
  /// projects each head's output (the output is [heads, n]).
  /// DsaIndexer: heads, dim (= k), topK. MoeRouter: hidden (= k), experts,
  /// topK. MoeExperts: hidden (= n), ffn, experts, chosen (= topK), fused
  /// gate_up (= fusedGateUp).
  int64_t heads = 0, rope = 0, capacity = 0, topK = 0, ffn = 0, experts = 0;
  double scale = 0, routedScale = 0;
  bool softmax = false, normalize = false, hasBias = false,
       fusedGateUp = false;
  /// MoeExperts: ins[3] is an addend (the output is the experts' sum plus
  /// it) and the expert weights follow it.
  bool hasAddend = false;
  /// Argmax, DistributedArgmax: a draw (ins[1], ins[2]), of drawWords
  /// words (DrawKey.h: kDrawWords, kTemperatureWords in the first form, or
  /// the adjusting form's: adjustCapacity(drawWords) > 0).
  bool drawn = false;
  int drawWords = 0;
  /// MoeExperts: the shared expert is inside the op
  /// (kiln-fuse-shared-expert): ins[sharedIndex], [sharedIndex + 1] and
  /// [sharedIndex + 2] are its gate [hidden, sharedFfn], up [hidden,
  /// sharedFfn] and down [sharedFfn, hidden] (2-D, after the routed
  /// experts' 3-D weights), and the output is the routed experts' sum plus
  /// its output, added last.
  bool hasShared = false;
  size_t sharedIndex = 0;
  int64_t sharedFfn = 0;

  /// AllReduceAddRmsNorm with a router tail (kiln-fold-router): the
  /// partial holds n + tail values; all are summed over the ranks, the
  /// first n added to the residual and normalised as without it, and the
  /// last `tail` divided by that norm's rms into outs[2] (the router's
  /// logits). 0: no tail.
  int64_t tail = 0;
  /// AllReduceAddRmsNorm with the router's choice (only with a tail;
  /// kiln-fuse-router-choice): after the all-reduce above, exactly
  /// MoeChoose's choice from its logits outs[2] (experts = tail values,
  /// still written): topK, softmax, normalize, routedScale and hasBias as
  /// MoeChoose's, ins[3] the bias when hasBias (ins[0] the partial, ins[1]
  /// the residual, ins[2] the norm's weight, as without it), outs[3] the
  /// ids (topK i32) and outs[4] the weights (topK f32). Every rank makes
  /// the choice; the bits are those of the two ops.
  bool hasChoice = false;
  /// RouterPartial (kiln-fold-router): outs[0][e] = sum over h of gate[e][h]
  /// * norm[h] * (ins[0][h] + residualScale * ins[1][h]); ins: this rank's
  /// partial (n = hidden), the residual (n), the F32 gate [hidden, experts]
  /// and the norm's weight [hidden]; experts = E.
  /// LinearRouter (kiln-fold-router composed, step.linear_router): ins[0]
  /// the input (k = K values, this rank's), ins[1] the weight W (local dims
  /// [K, N], n = N, a 2-D weight as Linear's ins[1]), ins[2] the residual
  /// x (N values), ins[3] the router's gate (an F32 weight [N, E], whole;
  /// experts = E), ins[4] the next norm's weight (F32, N values); outs[0]
  /// holds N + E values; ranks = R (the op's attribute, the group's rank
  /// count), rows = 1. outs[0][0, N) = W . in, the same bits as Linear;
  /// outs[0][N + e] = sum over c < K + N/R of D_r[e][c] * [in ; x[r N/R,
  /// (r + 1) N/R)][c], r the executing rank, with D_r (E rows of K + N/R)
  /// made once at load:
  ///   D_r[e][k] = M_r[e][k] = float(sum over n = 0 .. N-1, in increasing
  ///     order, of (double(gate[e][n]) * double(norm[n])) * double(W[n][k]))
  ///     for k < K, every product and sum in double, no fused multiply-add,
  ///     W's values the CPU backend's dequantisation of the rank's part;
  ///   D_r[e][K + j] = C_r[e][j] = gate[e][r N/R + j] * norm[r N/R + j] in
  ///     float, for j < N/R.
  /// The CPU backend takes the dot in f32 from 0, c ascending; another
  /// backend makes the same D_r bit for bit and may sum in its own order.
  /// MoeChoose: the router's choice from its logits ins[0] (experts
  /// values) and an optional bias ins[1] (hasBias): topK, softmax,
  /// normalize and routedScale as MoeRouter.
  double residualScale = 0;

  /// AllReduce: sum (else max). AllGather: outer runs of `inner` values
  /// per rank, gathered on `dim`. DistributedArgmax, AllGather,
  /// LinearRouter: ranks.
  bool sum = true;
  int64_t dim = 0, inner = 0, ranks = 1;
};

/// Decodes and checks op `index` of `step` for a group of `ranks` ranks of
/// `artifact` (weights take their local dims).
Expected<StepOp> decodeOp(const artifact::Artifact &artifact,
                          const artifact::Step &step, size_t index,
                          uint32_t ranks);

/// Every op of `step`, in order.
Expected<std::vector<StepOp>> decodeStep(const artifact::Artifact &artifact,
                                         const artifact::Step &step,
                                         uint32_t ranks);

/// Per op index in `calls`: whether that op's first input belongs to it
/// and its producer alone: an arena buffer that no view aliases, written
/// by exactly one earlier op that does not read it, and read by no op but
/// the call, which does not write it. Such a buffer may live anywhere the
/// two can reach (the CUDA backend places all-reduce inputs so in the
/// exchange the peers read: KILN_CUDA_DIRECT_SLOTS).
std::vector<bool> firstInputsOwned(const artifact::Step &step,
                                   const std::vector<StepOp> &ops,
                                   const std::vector<int32_t> &calls);

/// Whether `name` is an op kind of the artifact's step ops ("rms_norm").
bool isOpKindName(std::string_view name);

/// Copies `message` (truncated) into a plugin's error buffer.
void setError(char *error, uint64_t errorBytes, const std::string &message);

} // namespace kiln::backend

#endif // KILN_BACKENDS_COMMON_STEPOPS_H
