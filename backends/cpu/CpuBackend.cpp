//===- CpuBackend.cpp - The CPU backend plugin (libkiln-backend-cpu.so) ---===//
//
// Interprets a rank's step plans with the reference kernels. open_rank
// resolves every buffer to memory (one arena, the caches shared by name
// across steps, slot storage, the runtime's weight bytes) and checks every
// op's operands against what its kernel will read and write, so a
// malformed artifact is refused before any compute, never read out of
// bounds. run_step then executes the prepared ops in order.
//
//===----------------------------------------------------------------------===//
#include "artifact/Artifact.h"
#include "backend/KilnBackend.h"
#include "common/PluginSupport.h"
#include "common/StepOps.h"
#include "cpu/CpuKernels.h"
#include "support/CheckedMath.h"
#include "support/DrawKey.h"

#include <fmt/format.h>

#include <algorithm>
#include <barrier>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <thread>

using namespace kiln;
using namespace kiln::artifact;

namespace {

/// A buffer resolved to memory.
struct Resolved {
  uint8_t *data = nullptr;
  const Buffer *buffer = nullptr;
  const cpu::WeightView *weight = nullptr;

  float *f32() const { return reinterpret_cast<float *>(data); }
  int32_t *i32() const { return reinterpret_cast<int32_t *>(data); }
  uint64_t elements() const { return buffer->elements(); }
  int64_t inner() const {
    return buffer->shape.empty() ? 1 : buffer->shape.back();
  }
};

struct PreparedStep {
  const Step *step = nullptr;
  std::vector<Resolved> buffers;
  std::vector<std::vector<uint8_t>> slotStorage;
  /// Small weights (norm weights, biases) dequantised once at load.
  std::vector<std::unique_ptr<std::vector<float>>> constants;
  std::vector<std::function<Status()>> ops;
};

/// The in-process collectives of one step run: every rank publishes its
/// input, waits for all, computes the result from the inputs in rank order
/// (so every rank gets the same bits), waits again, then writes its output
/// (the second wait lets an in-place collective overwrite its input only
/// after every rank has read it). A rank that fails drops out of the
/// barrier, so the others finish the step instead of waiting forever.
struct Communicator {
  explicit Communicator(std::ptrdiff_t ranks)
      : barrier(ranks), inputs(ranks), scratch(ranks) {}
  std::barrier<> barrier;
  std::vector<const float *> inputs;
  std::vector<std::vector<float>> scratch;
  /// distributed_argmax: each rank's best value and its index in the whole
  /// vector.
  std::vector<std::pair<float, int64_t>> best =
      std::vector<std::pair<float, int64_t>>(inputs.size());
};

/// Every rank's `input` (n values), combined in rank order (sum or max) into
/// this rank's scratch, which it returns once every rank has read every
/// input (so an in-place caller may then overwrite its input).
const std::vector<float> &combineInRankOrder(Communicator &c, uint32_t rank,
                                             const float *input, uint64_t n,
                                             bool sum) {
  c.inputs[rank] = input;
  c.barrier.arrive_and_wait();
  std::vector<float> &acc = c.scratch[rank];
  acc.assign(c.inputs[0], c.inputs[0] + n);
  for (size_t q = 1; q < c.inputs.size(); ++q)
    for (uint64_t i = 0; i < n; ++i)
      acc[i] = sum ? acc[i] + c.inputs[q][i] : std::max(acc[i], c.inputs[q][i]);
  c.barrier.arrive_and_wait();
  return acc;
}

struct CpuRank {
  const Artifact *artifact = nullptr;
  uint32_t index = 0;
  uint32_t ranks = 1;
  const RankPlan *plan = nullptr;
  std::unique_ptr<cpu::ThreadPool> pool;
  /// By binding index; only the bindings this rank's plan uses are set.
  std::vector<cpu::WeightView> weights;
  /// This rank's slices of split weights, repacked contiguously at load.
  std::vector<std::vector<uint8_t>> sliceStorage;
  std::map<std::string, std::vector<uint8_t>> states;
  std::vector<uint8_t> arena;
  std::map<std::string, PreparedStep> steps;
  Communicator *comm = nullptr; ///< set for the duration of a step run
};

/// Every rank of an artifact, run together.
struct CpuGroup {
  Artifact artifact;
  std::vector<std::unique_ptr<CpuRank>> ranks;
};

cpu::CacheType cacheTypeOf(DType t) {
  return t == DType::F16    ? cpu::CacheType::F16
         : t == DType::BF16 ? cpu::CacheType::BF16
                            : cpu::CacheType::F32;
}

/// Builds the closure that runs one op, checked by backend::decodeOp, on
/// this rank's memory.
class OpBinder {
public:
  OpBinder(CpuRank &rank, PreparedStep &step, backend::StepOp op)
      : rank_(rank), step_(step), d_(std::move(op)) {}

  Expected<std::function<Status()>> bind();

private:
  const Resolved &in(size_t i) const { return step_.buffers[d_.ins[i]]; }
  const Resolved &out(size_t i) const { return step_.buffers[d_.outs[i]]; }
  float *f32In(size_t i) const { return in(i).f32(); }
  float *f32Out(size_t i) const { return out(i).f32(); }
  /// A per-channel parameter: an f32 buffer as it is, or a one-dimensional
  /// weight dequantised once, here at load (the CPU's layout for small
  /// weights), so a step never dequantises it again.
  Expected<const float *> param(size_t i);
  cpu::CacheView cache(const Resolved &r) const {
    return {r.data, cacheTypeOf(r.buffer->dtype), r.buffer->shape[0],
            r.buffer->shape[1]};
  }

  CpuRank &rank_;
  PreparedStep &step_;
  backend::StepOp d_;
};

Expected<const float *> OpBinder::param(size_t i) {
  const Resolved &r = in(i);
  if (!r.weight)
    return static_cast<const float *>(r.f32());
  auto values =
      std::make_unique<std::vector<float>>(uint64_t(r.weight->dims[0]));
  if (Status st = cpu::dequant(*r.weight, values->data()); !st)
    return st.error();
  step_.constants.push_back(std::move(values));
  return static_cast<const float *>(step_.constants.back()->data());
}

Expected<std::function<Status()>> OpBinder::bind() {
  using backend::OpKind;
  using Fn = std::function<Status()>;
  cpu::ThreadPool &pool = *rank_.pool;
  CpuRank *rank = &rank_;
  const backend::StepOp &d = d_;
  int64_t n = d.n, rows = d.rows;

  switch (d.kind) {
  case OpKind::Copy: {
    float *x = f32In(0), *y = f32Out(0);
    return Fn([=] {
      if (x != y)
        std::memmove(y, x, uint64_t(n) * sizeof(float));
      return Status::ok();
    });
  }
  case OpKind::AllReduce: {
    const float *x = f32In(0);
    float *y = f32Out(0);
    bool sum = d.sum;
    return Fn([=] {
      const std::vector<float> &acc =
          combineInRankOrder(*rank->comm, rank->index, x, uint64_t(n), sum);
      std::memcpy(y, acc.data(), uint64_t(n) * sizeof(float));
      return Status::ok();
    });
  }
  case OpKind::AllReduceAdd: {
    const float *partial = f32In(0), *residual = f32In(1);
    float *sum = f32Out(0);
    return Fn([=] {
      // The same rank-order sum as all_reduce, then the same add: the
      // same bits as the two ops.
      const std::vector<float> &acc = combineInRankOrder(
          *rank->comm, rank->index, partial, uint64_t(rows * n), true);
      cpu::add(residual, acc.data(), rows * n, sum);
      return Status::ok();
    });
  }
  case OpKind::AllReduceAddRmsNorm: {
    KILN_ASSIGN(w, param(2));
    const float *partial = f32In(0), *residual = f32In(1);
    float *sum = f32Out(0), *y = f32Out(1);
    // A router tail (kiln-fold-router; rows = 1): the partial's last `tail`
    // values are reduced with the rest and divided by the norm's rms.
    const int64_t tail = d.tail;
    float *logits = tail > 0 ? f32Out(2) : nullptr;
    float e = float(d.epsilon);
    // The router's choice from those logits (kiln-fuse-router-choice):
    // moe_choose's kernel after the rest, on every rank.
    const float *bias = nullptr;
    if (d.hasChoice && d.hasBias) {
      KILN_ASSIGN(values, param(3));
      bias = values;
    }
    const bool choose = d.hasChoice;
    int32_t *ids = choose ? out(3).i32() : nullptr;
    float *weights = choose ? f32Out(4) : nullptr;
    cpu::Gating g = d.softmax ? cpu::Gating::Softmax : cpu::Gating::Sigmoid;
    const int64_t topK = d.topK;
    const bool normalize = d.normalize;
    const float rs = float(d.routedScale);
    return Fn([=] {
      // The same rank-order sum as all_reduce, then the same add and norm
      // as add_rms_norm: bit-identical to the three ops unfused.
      const std::vector<float> &acc = combineInRankOrder(
          *rank->comm, rank->index, partial, uint64_t(rows * n + tail), true);
      cpu::add(residual, acc.data(), rows * n, sum);
      // Before the norm, which may write over the sum.
      const float rms = tail > 0 ? cpu::rms(sum, n, e) : 0.0f;
      cpu::rmsNorm(sum, rows, n, w, e, y);
      for (int64_t i = 0; i < tail; ++i)
        logits[i] = acc[size_t(n + i)] / rms;
      if (!choose)
        return Status::ok();
      return cpu::moeChoose(logits, tail, bias, topK, g, normalize, rs, ids,
                            weights);
    });
  }
  case OpKind::DistributedArgmax: {
    const float *x = f32In(0);
    int32_t *y = out(0).i32();
    const int32_t *words = d.drawn ? in(1).i32() : nullptr;
    const int32_t *position = d.drawn ? in(2).i32() : nullptr;
    const int count = d.drawWords;
    const bool adjusting = draw::adjustCapacity(count) > 0;
    auto adjusted = std::make_shared<std::vector<float>>();
    return Fn([=, input = x]() -> Status {
      Communicator &c = *rank->comm;
      const int64_t base = int64_t(rank->index) * n;
      const float *x = input;
      if (adjusting) {
        // Every rank checks the same words, so all fail or none does.
        adjusted->resize(uint64_t(n));
        KILN_TRY(cpu::adjustLogits(words, count, n * int64_t(c.inputs.size()),
                                   x, n, base, adjusted->data()));
        x = adjusted->data();
      }
      float key = 0;
      int32_t local;
      draw::DrawParams params;
      int bad = 0;
      if (words && draw::readWords(words, count, params, bad) &&
          params.cuts()) {
        // A nucleus or min-p: its cut needs the whole vocabulary, gathered
        // on every rank, which then draws the same token as every other.
        c.inputs[rank->index] = x;
        c.barrier.arrive_and_wait();
        std::vector<float> whole(uint64_t(n) * c.inputs.size());
        for (size_t q = 0; q < c.inputs.size(); ++q)
          std::memcpy(whole.data() + q * uint64_t(n), c.inputs[q],
                      uint64_t(n) * sizeof(float));
        c.barrier.arrive_and_wait();
        KILN_ASSIGN(drawn, cpu::drawArgmax(whole.data(), int64_t(whole.size()),
                                           0, words, count, *position, key));
        *y = drawn;
        return Status::ok();
      }
      if (words) {
        // Every rank checks the same words, so all fail or none does (and
        // none is left at the barrier).
        KILN_ASSIGN(drawn,
                    cpu::drawArgmax(x, n, base, words, count, *position, key));
        local = drawn;
      } else {
        local = cpu::argmax(x, n);
        key = x[local];
      }
      c.best[rank->index] = {key, base + local};
      c.barrier.arrive_and_wait();
      // Rank order holds the vector's order: a later rank wins only when
      // strictly larger, so ties go to the lowest index, as in argmax.
      std::pair<float, int64_t> top = c.best[0];
      for (size_t q = 1; q < c.best.size(); ++q)
        if (c.best[q].first > top.first)
          top = c.best[q];
      c.barrier.arrive_and_wait();
      *y = int32_t(top.second);
      return Status::ok();
    });
  }
  case OpKind::AllGather: {
    const float *x = f32In(0);
    float *y = f32Out(0);
    uint64_t outer = uint64_t(d.outer), inner = uint64_t(d.inner);
    return Fn([=] {
      Communicator &c = *rank->comm;
      c.inputs[rank->index] = x;
      c.barrier.arrive_and_wait();
      size_t parts = c.inputs.size();
      for (uint64_t o = 0; o < outer; ++o)
        for (size_t q = 0; q < parts; ++q)
          std::memcpy(y + (o * parts + q) * inner, c.inputs[q] + o * inner,
                      inner * sizeof(float));
      c.barrier.arrive_and_wait();
      return Status::ok();
    });
  }
  case OpKind::Slice: {
    const float *x = f32In(0);
    float *y = f32Out(0);
    std::vector<int64_t> src = d.srcShape, dst = d.dstShape, off = d.offsets;
    return Fn([=] {
      // Row-major walk over the output's index space.
      size_t rank = dst.size();
      std::vector<int64_t> idx(rank, 0);
      uint64_t total = 1;
      for (int64_t v : dst)
        total *= uint64_t(v);
      int64_t inner = dst.back();
      for (uint64_t o = 0; o < total; o += inner) {
        int64_t srcIndex = 0;
        for (size_t i = 0; i < rank; ++i)
          srcIndex = srcIndex * src[i] + idx[i] + off[i];
        std::memcpy(y + o, x + srcIndex, inner * sizeof(float));
        for (int64_t i = int64_t(rank) - 2; i >= 0; --i) {
          if (++idx[i] < dst[i])
            break;
          idx[i] = 0;
        }
      }
      return Status::ok();
    });
  }
  case OpKind::Concat: {
    std::vector<std::pair<const float *, int64_t>> parts;
    for (size_t i = 0; i < d.ins.size(); ++i)
      parts.push_back({f32In(i), d.runs[i]});
    float *y = f32Out(0);
    int64_t outer = d.outer;
    return Fn([=] {
      float *p = y;
      for (int64_t o = 0; o < outer; ++o)
        for (auto [x, run] : parts) {
          std::memcpy(p, x + o * run, uint64_t(run) * sizeof(float));
          p += run;
        }
      return Status::ok();
    });
  }
  case OpKind::Add:
  case OpKind::Swiglu: {
    const float *a = f32In(0), *b = f32In(1);
    float *y = f32Out(0);
    bool isAdd = d.kind == OpKind::Add;
    return Fn([=] {
      if (isAdd)
        cpu::add(a, b, n, y);
      else
        cpu::swiglu(a, b, n, y);
      return Status::ok();
    });
  }
  case OpKind::RmsNorm:
  case OpKind::LayerNorm: {
    KILN_ASSIGN(w, param(1));
    const float *b = nullptr;
    if (d.kind == OpKind::LayerNorm) {
      KILN_ASSIGN(bias, param(2));
      b = bias;
    }
    const float *x = f32In(0);
    float *y = f32Out(0);
    float e = float(d.epsilon);
    return Fn([=] {
      if (b)
        cpu::layerNorm(x, rows, n, w, b, e, y);
      else
        cpu::rmsNorm(x, rows, n, w, e, y);
      return Status::ok();
    });
  }
  case OpKind::AddRmsNorm: {
    KILN_ASSIGN(w, param(2));
    const float *a = f32In(0), *b = f32In(1);
    float *sum = f32Out(0), *y = f32Out(1);
    float e = float(d.epsilon);
    return Fn([=] {
      cpu::add(a, b, rows * n, sum);
      cpu::rmsNorm(sum, rows, n, w, e, y);
      return Status::ok();
    });
  }
  case OpKind::Rope: {
    const float *x = f32In(0);
    const int32_t *pos = in(1).i32();
    float *y = f32Out(0);
    cpu::RopeStyle s =
        d.neox ? cpu::RopeStyle::NeoX : cpu::RopeStyle::Interleaved;
    float t = float(d.theta);
    int64_t offset = d.ropeOffset, dims = d.ropeDims;
    return Fn([=] {
      cpu::rope(x, rows, n, *pos, s, t, offset, dims, y);
      return Status::ok();
    });
  }
  case OpKind::Dequant: {
    const cpu::WeightView *w = in(0).weight;
    float *y = f32Out(0);
    return Fn([=] { return cpu::dequant(*w, y); });
  }
  case OpKind::Embed: {
    const cpu::WeightView *w = in(0).weight;
    const int32_t *token = in(1).i32();
    float *y = f32Out(0);
    return Fn([=] { return cpu::embed(*w, *token, y); });
  }
  case OpKind::Linear: {
    const cpu::WeightView *w = in(1).weight;
    const float *x = f32In(0);
    float *y = f32Out(0);
    return Fn([=, &pool] { return cpu::linear(x, rows, *w, y, pool); });
  }
  case OpKind::SwigluLinear: {
    const cpu::WeightView *w = in(2).weight;
    const float *gate = f32In(0), *up = f32In(1);
    float *y = f32Out(0);
    // The product, as swiglu would write it: the same bits as the two ops
    // unfused.
    auto product = std::make_shared<std::vector<float>>(size_t(d.k));
    int64_t k = d.k;
    return Fn([=, &pool] {
      return cpu::swigluLinear(gate, up, k, *w, product->data(), y, pool);
    });
  }
  case OpKind::FusedLinear:
  case OpKind::RmsNormLinear: {
    const bool normed = d.kind == OpKind::RmsNormLinear;
    const size_t first = normed ? 2 : 1;
    std::vector<std::pair<const cpu::WeightView *, int64_t>> parts;
    for (size_t i = first; i < d.ins.size(); ++i)
      parts.push_back({in(i).weight, d.segments[i - first]});
    const float *norm = nullptr;
    if (normed) {
      KILN_ASSIGN(w, param(1));
      norm = w;
    }
    const float *x = f32In(0);
    float *y = f32Out(0);
    // The normalised input, as rms_norm would write it: the same bits as
    // the two ops unfused.
    auto normalised =
        std::make_shared<std::vector<float>>(normed ? size_t(d.k) : size_t(0));
    int64_t k = d.k;
    float eps = float(d.epsilon);
    return Fn([=, &pool]() -> Status {
      const float *input = x;
      if (norm) {
        cpu::rmsNorm(x, 1, k, norm, eps, normalised->data());
        input = normalised->data();
      }
      for (auto [w, at] : parts)
        if (Status st = cpu::linear(input, 1, *w, y + at, pool); !st)
          return st;
      return Status::ok();
    });
  }
  case OpKind::CacheAppend: {
    cpu::CacheView view = cache(out(0));
    const float *x = f32In(0);
    const int32_t *pos = in(1).i32();
    return Fn([=] { return cpu::cacheAppend(x, *pos, view); });
  }
  case OpKind::NormRopeAppend: {
    cpu::CacheView view = cache(out(0));
    KILN_ASSIGN(w, param(1));
    const float *b = nullptr;
    if (d.hasBias) {
      KILN_ASSIGN(bias, param(2));
      b = bias;
    }
    const float *x = f32In(0);
    const int32_t *pos = in(d.hasBias ? 3 : 2).i32();
    cpu::RopeStyle s =
        d.neox ? cpu::RopeStyle::NeoX : cpu::RopeStyle::Interleaved;
    int64_t normDims = d.k, offset = d.ropeOffset, dims = d.ropeDims;
    float e = float(d.epsilon), t = float(d.theta);
    return Fn([=] {
      return cpu::normRopeAppend(x, normDims, w, b, e, *pos, s, t, offset, dims,
                                 view);
    });
  }
  case OpKind::MlaAttention: {
    cpu::CacheView view = cache(in(2));
    const float *a = f32In(0), *b = f32In(1);
    const int32_t *pos = in(3).i32();
    const int32_t *sel = d.capacity ? in(4).i32() : nullptr;
    const int32_t *count = d.capacity ? in(5).i32() : nullptr;
    float *y = f32Out(0);
    int64_t heads = d.heads, latent = d.k, rope = d.rope, capacity = d.capacity;
    float s = float(d.scale);
    std::string where = d.where;
    // With the output projection (kiln-fuse-mla-projection): the heads'
    // latent outputs into a buffer of this op's, then the stacked linear,
    // the same bits as the two ops unfused.
    const cpu::WeightView *proj =
        d.projected ? in(d.ins.size() - 1).weight : nullptr;
    auto latentOut = std::make_shared<std::vector<float>>(
        proj ? size_t(heads * latent) : size_t(0));
    return Fn([=, &pool]() -> Status {
      if (count && (*count < 0 || *count > capacity))
        return Error(where, "selected_count",
                     fmt::format("{} is outside 0..{}", *count, capacity));
      float *o = proj ? latentOut->data() : y;
      KILN_TRY(cpu::mlaAttention(a, b, heads, latent, rope, view, *pos, sel,
                                 count, s, o, pool));
      if (!proj)
        return Status::ok();
      return cpu::linear(o, heads, *proj, y, pool);
    });
  }
  case OpKind::DsaIndexer: {
    cpu::CacheView view = cache(in(2));
    const float *q = f32In(0), *w = f32In(1);
    const int32_t *pos = in(3).i32();
    int32_t *sel = out(0).i32(), *count = out(1).i32();
    int64_t heads = d.heads, dim = d.k, topK = d.topK;
    float s = float(d.scale);
    // The query's rope (kiln-fuse-indexer-rope), as the rope op would have
    // written it, into a buffer of this op's.
    int64_t ropeOffset = d.ropeOffset, ropeDims = d.ropeDims;
    cpu::RopeStyle style =
        d.neox ? cpu::RopeStyle::NeoX : cpu::RopeStyle::Interleaved;
    float theta = float(d.theta);
    auto rotated = std::make_shared<std::vector<float>>(
        ropeDims > 0 ? size_t(heads * dim) : size_t(0));
    return Fn([=] {
      const float *query = q;
      if (ropeDims > 0) {
        cpu::rope(q, heads, dim, *pos, style, theta, ropeOffset, ropeDims,
                  rotated->data());
        query = rotated->data();
      }
      return cpu::dsaIndexer(query, heads, dim, w, view, *pos, topK, s, sel,
                             count);
    });
  }
  case OpKind::MoeRouter:
  case OpKind::RmsNormRouter: {
    // rms_norm_router: input, norm, gate[, bias] -> output, ids, weights;
    // moe_router: input, gate[, bias] -> ids, weights.
    const bool normed = d.kind == OpKind::RmsNormRouter;
    const size_t in0 = normed ? 1 : 0, out0 = normed ? 1 : 0;
    const float *normWeight = nullptr, *bias = nullptr;
    if (normed) {
      KILN_ASSIGN(values, param(1));
      normWeight = values;
    }
    if (d.hasBias) {
      KILN_ASSIGN(values, param(in0 + 2));
      bias = values;
    }
    const cpu::WeightView *gate = in(in0 + 1).weight;
    const float *x = f32In(0);
    float *y = normed ? f32Out(0) : nullptr;
    int32_t *ids = out(out0).i32();
    float *w = f32Out(out0 + 1);
    cpu::Gating g = d.softmax ? cpu::Gating::Softmax : cpu::Gating::Sigmoid;
    int64_t hidden = d.k, topK = d.topK;
    bool norm = d.normalize;
    float rs = float(d.routedScale), e = float(d.epsilon);
    return Fn([=] {
      // rms_norm_router: the norm's and the router's own functions in
      // turn, the same bits as the two ops.
      if (normWeight)
        cpu::rmsNorm(x, 1, hidden, normWeight, e, y);
      return cpu::moeRouter(normWeight ? y : x, hidden, *gate, bias, topK, g,
                            norm, rs, ids, w);
    });
  }
  case OpKind::MoeChoose: {
    const float *bias = nullptr;
    if (d.hasBias) {
      KILN_ASSIGN(values, param(1));
      bias = values;
    }
    const float *logits = f32In(0);
    int32_t *ids = out(0).i32();
    float *w = f32Out(1);
    cpu::Gating g = d.softmax ? cpu::Gating::Softmax : cpu::Gating::Sigmoid;
    int64_t experts = d.experts, topK = d.topK;
    bool norm = d.normalize;
    float rs = float(d.routedScale);
    return Fn([=] {
      return cpu::moeChoose(logits, experts, bias, topK, g, norm, rs, ids, w);
    });
  }
  case OpKind::RouterPartial: {
    KILN_ASSIGN(norm, param(3));
    const cpu::WeightView *gate = in(2).weight;
    const float *partial = f32In(0), *residual = f32In(1);
    float *y = f32Out(0);
    float scale = float(d.residualScale);
    return Fn([=] {
      return cpu::routerPartial(partial, residual, n, *gate, norm, scale, y);
    });
  }
  case OpKind::LinearRouter: {
    // The composed matrix D_r, made here once (not per step) from the
    // rank's part of the weight, the gate and the norm (StepOps.h).
    KILN_ASSIGN(norm, param(4));
    const cpu::WeightView *w = in(1).weight;
    auto matrix = std::make_shared<std::vector<float>>();
    if (Status st = cpu::composeRouter(*w, *in(3).weight, norm, rank_.index,
                                       d.ranks, *matrix, pool);
        !st)
      return Error(d.where, "", st.error().message());
    const float *x = f32In(0);
    const float *share = f32In(2) + rank_.index * (n / d.ranks);
    float *y = f32Out(0);
    const int64_t k = d.k, experts = d.experts, shareCols = n / d.ranks;
    return Fn([=, &pool]() -> Status {
      // The linear as step.linear writes it, then the tail after its rows.
      KILN_TRY(cpu::linear(x, 1, *w, y, pool));
      cpu::routerTail(matrix->data(), experts, k, shareCols, x, share, y + n);
      return Status::ok();
    });
  }
  case OpKind::MoeExperts: {
    const size_t first = d.hasAddend ? 4 : 3;
    const size_t end = d.hasShared ? d.sharedIndex : d.ins.size();
    std::vector<const cpu::WeightView *> experts;
    for (size_t i = first; i < end; ++i)
      experts.push_back(in(i).weight);
    const float *x = f32In(0), *w = f32In(2);
    const float *addend = d.hasAddend ? f32In(3) : nullptr;
    const int32_t *ids = in(1).i32();
    float *y = f32Out(0);
    int64_t chosen = d.topK;
    const cpu::WeightView *sharedGate = nullptr, *sharedUp = nullptr,
                          *sharedDown = nullptr;
    if (d.hasShared) {
      sharedGate = in(d.sharedIndex).weight;
      sharedUp = in(d.sharedIndex + 1).weight;
      sharedDown = in(d.sharedIndex + 2).weight;
    }
    // The experts' sum into a buffer of this op's (the output may be the
    // addend's bytes), then the add as step.add would do it. A shared
    // expert's output is computed into buffers of this op's as the
    // fused_linear and swiglu_linear it replaces computed it, then added
    // as that addend was: the same bits as the ops unfused.
    const bool adds = addend || d.hasShared;
    auto sum = std::make_shared<std::vector<float>>(adds ? size_t(n) : 0);
    const bool shared = d.hasShared;
    const int64_t sharedFfn = d.sharedFfn;
    auto sharedScratch = std::make_shared<std::vector<float>>(
        d.hasShared ? size_t(3 * sharedFfn + n) : 0);
    return Fn([=, &pool]() -> Status {
      const float *extra = addend;
      if (shared) {
        float *gateUp = sharedScratch->data();
        float *product = gateUp + 2 * sharedFfn;
        float *out = product + sharedFfn;
        if (Status st = cpu::swigluFfn(x, *sharedGate, *sharedUp, *sharedDown,
                                       gateUp, product, out, pool);
            !st)
          return st;
        extra = out;
      }
      float *into = adds ? sum->data() : y;
      if (Status st =
              cpu::moeExperts(x, n, ids, w, chosen, experts, into, pool);
          !st)
        return st;
      if (extra)
        cpu::add(into, extra, n, y);
      return Status::ok();
    });
  }
  case OpKind::Argmax: {
    const float *x = f32In(0);
    int32_t *y = out(0).i32();
    const int32_t *words = d.drawn ? in(1).i32() : nullptr;
    const int32_t *position = d.drawn ? in(2).i32() : nullptr;
    const int count = d.drawWords;
    const bool adjusting = draw::adjustCapacity(count) > 0;
    auto adjusted = std::make_shared<std::vector<float>>();
    return Fn([=, input = x]() -> Status {
      const float *x = input;
      if (!words) {
        *y = cpu::argmax(x, n);
        return Status::ok();
      }
      if (adjusting) {
        adjusted->resize(uint64_t(n));
        KILN_TRY(cpu::adjustLogits(words, count, n, x, n, 0, adjusted->data()));
        x = adjusted->data();
      }
      float key;
      KILN_ASSIGN(drawn,
                  cpu::drawArgmax(x, n, 0, words, count, *position, key));
      *y = drawn;
      return Status::ok();
    });
  }
  }
  return Error(d.where, "", "the CPU backend has no kernel for this op");
}

Status prepareStep(CpuRank &rank, const Step &step) {
  PreparedStep prepared;
  prepared.step = &step;
  prepared.buffers.resize(step.buffers.size());
  prepared.slotStorage.reserve(step.buffers.size());
  for (size_t i = 0; i < step.buffers.size(); ++i) {
    const Buffer &b = step.buffers[i];
    Resolved &r = prepared.buffers[i];
    r.buffer = &b;
    switch (b.kind) {
    case BufferKind::Arena:
      r.data = rank.arena.data() + b.offset;
      break;
    case BufferKind::View:
      r.data = prepared.buffers[b.base].data + b.offset * elementBytes(b.dtype);
      break;
    case BufferKind::Weight:
      r.weight = &rank.weights[b.binding];
      break;
    case BufferKind::State: {
      auto [it, inserted] = rank.states.try_emplace(b.name);
      if (inserted)
        it->second.assign(b.bytes(), 0);
      else if (it->second.size() != b.bytes())
        return Error(step.name, b.name,
                     "the same state has different sizes in two steps");
      r.data = it->second.data();
      break;
    }
    case BufferKind::Input:
    case BufferKind::Output:
      prepared.slotStorage.emplace_back(b.bytes(), 0);
      r.data = prepared.slotStorage.back().data();
      break;
    }
  }
  auto [it, inserted] = rank.steps.emplace(step.name, std::move(prepared));
  PreparedStep &stored = it->second;
  Expected<std::vector<backend::StepOp>> ops =
      backend::decodeStep(*rank.artifact, step, rank.ranks);
  if (!ops)
    return ops.error();
  for (backend::StepOp &op : *ops) {
    Expected<std::function<Status()>> fn =
        OpBinder(rank, stored, std::move(op)).bind();
    if (!fn)
      return fn.error();
    stored.ops.push_back(std::move(*fn));
  }
  return Status::ok();
}

/// Rank's part of a binding, as the reference kernels read it.
Expected<cpu::WeightView>
placeWeight(const WeightBinding &b, const kiln_weight_bytes &bytes,
            std::vector<std::vector<uint8_t>> &store) {
  if (b.layout != "gguf")
    return Error(b.tensor, "layout",
                 fmt::format("'{}' is not a layout the cpu backend reads "
                             "(it reads the file's blocks: 'gguf')",
                             b.layout));
  Expected<backend::HostWeight> w = backend::sliceWeight(b, bytes, store);
  if (!w)
    return w.error();
  return cpu::WeightView{w->data, w->bytes, w->type, w->dims, w->name};
}

Expected<std::unique_ptr<CpuGroup>>
openGroup(std::span<const uint8_t> bytes, const kiln_weight_bytes *weights,
          uint32_t weightCount, const kiln_rank_options *options) {
  Expected<Artifact> artifact = parseArtifact(bytes, "artifact");
  if (!artifact)
    return artifact.error();
  // The CPU always runs op by op (KILN_RUN_EAGER changes nothing); it
  // reads real weights only.
  if (options &&
      options->flags & (KILN_RUN_RANDOM_WEIGHTS | KILN_RUN_SIMULATE_RANK))
    return Error("cpu backend", "options",
                 "random weights and simulated ranks (kiln-run --bench) need "
                 "a GPU backend");
  if (options && options->flags & KILN_RUN_PROFILE)
    return Error("cpu backend", "options",
                 "--profile times GPU kernels; the CPU backend has none");
  if (options && options->flags & KILN_RUN_ONE_GPU)
    return Error("cpu backend", "options",
                 "--one-gpu places a GPU backend's ranks; the CPU backend "
                 "runs every rank on the CPU already");
  if (options && options->flags & ~uint32_t(KILN_RUN_EAGER))
    return Error("cpu backend", "options",
                 fmt::format("unknown flags {:#x}", options->flags));
  auto group = std::make_unique<CpuGroup>();
  group->artifact = std::move(*artifact);
  const Artifact &a = group->artifact;
  if (weightCount != a.weights.size())
    return Error("artifact", "weights",
                 fmt::format("{} weight buffers given for {} bindings",
                             weightCount, a.weights.size()));
  unsigned threads = options && options->threads
                         ? options->threads
                         : std::max(1u, std::thread::hardware_concurrency());
  unsigned perRank = std::max(1u, threads / a.ranks);
  for (uint32_t r = 0; r < a.ranks; ++r) {
    auto rank = std::make_unique<CpuRank>();
    rank->artifact = &a;
    rank->index = r;
    rank->ranks = a.ranks;
    rank->plan = &a.rankPlans[r];
    rank->weights.resize(a.weights.size());
    for (const Step &s : rank->plan->steps)
      for (const Buffer &b : s.buffers)
        if (b.kind == BufferKind::Weight && !rank->weights[b.binding].data) {
          Expected<cpu::WeightView> view = placeWeight(
              a.weights[b.binding], weights[b.binding], rank->sliceStorage);
          if (!view)
            return view.error();
          rank->weights[b.binding] = std::move(*view);
        }
    rank->pool = std::make_unique<cpu::ThreadPool>(perRank);
    uint64_t arena = 0;
    for (const Step &s : rank->plan->steps)
      arena = std::max(arena, s.arenaBytes);
    rank->arena.assign(arena + 64, 0);
    for (const Step &s : rank->plan->steps)
      if (Status st = prepareStep(*rank, s); !st)
        return st.error();
    group->ranks.push_back(std::move(rank));
  }
  return group;
}

Expected<PreparedStep *> findStep(CpuRank &rank, const char *name) {
  return backend::findStep(rank.steps, name);
}

/// Runs one rank's ops; on failure it leaves the collectives' barrier so
/// the other ranks do not wait for it.
Status runRank(CpuRank &rank, PreparedStep &step) {
  for (const std::function<Status()> &op : step.ops)
    if (Status st = op(); !st) {
      rank.comm->barrier.arrive_and_drop();
      return st;
    }
  return Status::ok();
}

/// The plugin's operations (backend::PluginEntryPoints makes the C ABI).
struct CpuPlugin {
  using Group = CpuGroup;
  static constexpr const char *kName = "cpu backend";

  static Expected<std::unique_ptr<CpuGroup>>
  open(std::span<const uint8_t> artifact, const kiln_weight_bytes *weights,
       uint32_t weightCount, const kiln_rank_options *options) {
    return openGroup(artifact, weights, weightCount, options);
  }

  /// Into the input slot of every rank, or out of rank 0's output slot.
  static Status copySlot(CpuGroup &group, const char *step, BufferKind kind,
                         const char *slot, void *data, uint64_t bytes) {
    for (std::unique_ptr<CpuRank> &rank : group.ranks) {
      KILN_ASSIGN(s, findStep(*rank, step));
      KILN_ASSIGN(index, backend::findSlot(*s->step, kind, slot, bytes));
      uint8_t *p = s->buffers[index].data;
      if (kind == BufferKind::Output) {
        std::memcpy(data, p, bytes);
        break;
      }
      std::memcpy(p, data, bytes);
    }
    return Status::ok();
  }

  /// Every rank on a thread of its own (rank 0 on the caller's).
  static Status run(CpuGroup &group, const char *step) {
    std::vector<std::unique_ptr<CpuRank>> &ranks = group.ranks;
    std::vector<PreparedStep *> steps;
    for (std::unique_ptr<CpuRank> &rank : ranks) {
      Expected<PreparedStep *> s = findStep(*rank, step);
      if (!s)
        return s.error();
      steps.push_back(*s);
    }
    Communicator comm(std::ptrdiff_t(ranks.size()));
    for (std::unique_ptr<CpuRank> &rank : ranks)
      rank->comm = &comm;
    std::vector<Status> results(ranks.size(), Status::ok());
    std::vector<std::thread> threads;
    for (size_t r = 1; r < ranks.size(); ++r)
      threads.emplace_back(
          [&, r] { results[r] = runRank(*ranks[r], *steps[r]); });
    results[0] = runRank(*ranks[0], *steps[0]);
    for (std::thread &t : threads)
      t.join();
    for (std::unique_ptr<CpuRank> &rank : ranks)
      rank->comm = nullptr;
    for (size_t r = 0; r < results.size(); ++r)
      if (!results[r])
        return ranks.size() == 1
                   ? results[r].error()
                   : results[r].error().withWhere(fmt::format(
                         "rank {}: {}", r, results[r].error().where()));
    return Status::ok();
  }

  static Status reset(CpuGroup &group) {
    for (std::unique_ptr<CpuRank> &rank : group.ranks)
      for (auto &[name, bytes] : rank->states)
        std::fill(bytes.begin(), bytes.end(), 0);
    return Status::ok();
  }

  static void close(std::unique_ptr<CpuGroup>) {}
};

constexpr kiln_backend_v1 kCpuBackend =
    backend::PluginEntryPoints<CpuPlugin>::table(
        "cpu", "Kiln reference CPU backend (float32, deterministic)");

} // namespace

extern "C" __attribute__((visibility("default"))) const kiln_backend_v1 *
kiln_backend_entry(uint32_t abiVersion) {
  return abiVersion == KILN_BACKEND_ABI_VERSION ? &kCpuBackend : nullptr;
}
