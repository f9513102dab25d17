//===- StepTraffic.cpp - The bytes one decode step reads ------------------===//
#include "artifact/StepTraffic.h"

#include "quant/QuantTypes.h"

#include <algorithm>

namespace kiln::artifact {

namespace {

/// The bytes of a binding's rank-local part.
uint64_t localBytes(const WeightBinding &b) {
  std::vector<int64_t> dims = localDims(b);
  uint64_t rows = 1;
  for (size_t d = 1; d < dims.size(); ++d)
    rows *= uint64_t(dims[d]);
  return rowBytes(b.type, uint64_t(dims[0])).value_or(0) * rows;
}

} // namespace

StepTraffic stepTraffic(const Artifact &a, uint32_t rank, uint64_t context) {
  StepTraffic t;
  if (rank >= a.rankPlans.size())
    return t;
  const Step *step = a.rankPlans[rank].step("decode_step");
  if (!step)
    return t;
  std::vector<double> share(a.weights.size(), 1.0);
  // Bound by the step, read at this context, and read only at a later one.
  std::vector<bool> used(a.weights.size(), false),
      read(a.weights.size(), false), later(a.weights.size(), false);
  for (const Op &op : step->ops) {
    auto bindingOf = [&](int32_t operand) {
      const Buffer &b = step->buffers[size_t(operand)];
      return b.kind == BufferKind::Weight ? b.binding : -1;
    };
    std::span<const int32_t> ins = op.ins();
    // A linear_router's gate and norm (ins 3 and 4) are read at load, into
    // the composed matrix the op reads instead: E rows of K + N / R f32.
    const bool composed = op.kind == "linear_router" && ins.size() == 5;
    if (composed) {
      const int32_t w = bindingOf(ins[1]), gate = bindingOf(ins[3]);
      const Attr *ranks = op.attr("ranks");
      if (w >= 0 && gate >= 0 && ranks && ranks->kind == AttrKind::Int &&
          ranks->intValue > 0) {
        const std::vector<int64_t> dims = localDims(a.weights[size_t(w)]);
        const std::vector<int64_t> &g = a.weights[size_t(gate)].dims;
        if (dims.size() == 2 && g.size() == 2) {
          const uint64_t derived =
              uint64_t(g[1]) * uint64_t(dims[0] + dims[1] / ranks->intValue) *
              sizeof(float);
          t.weightBytes += derived;
          t.boundBytes += derived;
        }
      }
    }
    if (op.kind == "moe_experts") {
      // The routed experts' [K, N, experts] weights are read for the
      // chosen ones only; a shared expert's 2-D weights whole.
      const uint64_t chosen = step->buffers[size_t(ins[2])].elements();
      for (size_t i = 3; i < ins.size(); ++i)
        if (int32_t w = bindingOf(ins[i]);
            w >= 0 && a.weights[size_t(w)].dims.size() == 3)
          share[size_t(w)] =
              double(chosen) / double(a.weights[size_t(w)].dims.back());
    } else if (op.kind == "embed") {
      if (int32_t w = bindingOf(ins[0]); w >= 0)
        share[size_t(w)] = 1.0 / double(a.weights[size_t(w)].dims.back());
    } else if (op.kind == "mla_attention" || op.kind == "dsa_indexer") {
      const Buffer &cache = step->buffers[size_t(ins[2])];
      const uint64_t row = uint64_t(cache.shape[1]) * elementBytes(cache.dtype);
      uint64_t rows = std::min<uint64_t>(context + 1, uint64_t(cache.shape[0]));
      t.cacheBytesPerPosition += row;
      // Attention given the indexer's selection (inputs 4 and 5) reads the
      // selected rows, at most the selection's length, not every position.
      if (op.kind == "mla_attention" && ins.size() >= 6) {
        const uint64_t selectable = step->buffers[size_t(ins[4])].elements();
        rows = std::min(rows, selectable);
        t.selectedPositions = t.selectedPositions
                                  ? std::min(t.selectedPositions, selectable)
                                  : selectable;
      } else {
        t.cacheBytesPerPositionPast += row;
      }
      t.cacheBytes += rows * row;
    }
    // A projection's weights follow its input (and an rms_norm_linear's
    // norm); live_from gives each the first position it is read at.
    const size_t first = op.kind == "rms_norm_linear" ? 2
                         : op.kind == "fused_linear"  ? 1
                                                      : ins.size();
    const Attr *live = first < ins.size() ? op.attr("live_from") : nullptr;
    for (size_t i = 0; i < ins.size(); ++i)
      if (int32_t w = bindingOf(ins[i]); w >= 0) {
        used[size_t(w)] = true;
        if (composed && i >= 3)
          continue;
        const bool notYet = live && live->kind == AttrKind::Ints &&
                            i >= first && i - first < live->ints.size() &&
                            live->ints[i - first] > 0 &&
                            uint64_t(live->ints[i - first]) > context;
        (notYet ? later : read)[size_t(w)] = true;
      }
  }
  // A weight only a linear_router composes (neither read nor later) is
  // bound but read by no step.
  for (size_t w = 0; w < a.weights.size(); ++w)
    if (used[w]) {
      const uint64_t bytes = localBytes(a.weights[w]);
      const uint64_t shared = uint64_t(double(bytes) * share[w]);
      t.boundBytes += bytes;
      if (read[w])
        t.weightBytes += shared;
      else if (later[w])
        t.notLiveBytes += shared;
    }
  return t;
}

} // namespace kiln::artifact
