//===- CpuBackend.cpp - The CPU backend plugin (libkiln-backend-cpu.so) ----===//
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
#include "cpu/CpuKernels.h"
#include "support/CheckedMath.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <barrier>
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
      acc[i] = sum ? acc[i] + c.inputs[q][i]
                   : std::max(acc[i], c.inputs[q][i]);
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

void setError(char *error, uint64_t errorBytes, const std::string &message) {
  if (!error || errorBytes == 0)
    return;
  size_t n = std::min<size_t>(message.size(), errorBytes - 1);
  std::memcpy(error, message.data(), n);
  error[n] = '\0';
}

cpu::CacheType cacheTypeOf(DType t) {
  return t == DType::F16    ? cpu::CacheType::F16
         : t == DType::BF16 ? cpu::CacheType::BF16
                            : cpu::CacheType::F32;
}

/// Checks one op's operands and builds the closure that runs it.
class OpBuilder {
public:
  OpBuilder(CpuRank &rank, PreparedStep &step, const Op &op, size_t index)
      : rank_(rank), step_(step), op_(op),
        where_(fmt::format("step '{}' op {} ({})", step.step->name, index,
                           op.kind)) {}

  Expected<std::function<Status()>> build();

private:
  Error fail(const std::string &problem) const {
    return Error(where_, "", problem);
  }
  const Resolved &in(size_t i) const { return step_.buffers[op_.ins()[i]]; }
  const Resolved &out(size_t i) const {
    return step_.buffers[op_.outs()[i]];
  }
  Status counts(size_t ins, size_t outs) const;
  Status floats(const Resolved &r, const char *what) const;
  Status ints(const Resolved &r, const char *what, uint64_t elements) const;
  Status weight(const Resolved &r, const char *what) const;
  Status same(const Resolved &a, const Resolved &b, const char *what) const;
  /// Operands of an add + norm op: two f32 addends, then the weight; the
  /// f32 sum and output, all of one shape.
  Status addNormOperands() const;
  Expected<const float *> param(const Resolved &r, uint64_t n,
                                const char *what);
  Expected<int64_t> intAttr(const char *name) const;
  Expected<double> floatAttr(const char *name) const;
  Expected<std::string> stringAttr(const char *name) const;

  CpuRank &rank_;
  PreparedStep &step_;
  const Op &op_;
  std::string where_;
};

#define KILN_TRY_STATUS(expr)                                                  \
  do {                                                                         \
    if (Status st_ = (expr); !st_)                                             \
      return st_;                                                              \
  } while (0)

#define KILN_TRY(expr)                                                         \
  do {                                                                         \
    if (Status st_ = (expr); !st_)                                             \
      return st_.error();                                                      \
  } while (0)

#define KILN_ASSIGN(var, expr)                                                 \
  auto var##OrError = (expr);                                                  \
  if (!var##OrError)                                                           \
    return var##OrError.error();                                               \
  auto var = *var##OrError

Status OpBuilder::counts(size_t ins, size_t outs) const {
  if (op_.ins().size() != ins || op_.outs().size() != outs)
    return fail(fmt::format("expects {} inputs and {} outputs, has {} and {}",
                            ins, outs, op_.ins().size(), op_.outs().size()));
  return Status::ok();
}

Status OpBuilder::floats(const Resolved &r, const char *what) const {
  if (r.weight || r.buffer->dtype != DType::F32)
    return fail(fmt::format("{} '{}' must be an f32 buffer", what,
                            r.buffer->name));
  return Status::ok();
}

Status OpBuilder::ints(const Resolved &r, const char *what,
                       uint64_t elements) const {
  if (r.weight || r.buffer->dtype != DType::I32 ||
      r.elements() != elements)
    return fail(fmt::format("{} '{}' must be {} i32 values", what,
                            r.buffer->name, elements));
  return Status::ok();
}

Status OpBuilder::weight(const Resolved &r, const char *what) const {
  if (!r.weight)
    return fail(fmt::format("{} '{}' must be a weight", what,
                            r.buffer->name));
  return Status::ok();
}

Status OpBuilder::same(const Resolved &a, const Resolved &b,
                       const char *what) const {
  if (a.elements() != b.elements() || a.inner() != b.inner())
    return fail(fmt::format("{}: '{}' and '{}' differ in shape", what,
                            a.buffer->name, b.buffer->name));
  return Status::ok();
}

/// A per-channel parameter: an f32 buffer as it is, or a one-dimensional
/// weight dequantised once, here at load (the CPU's layout for small
/// weights), so a step never dequantises it again.
Expected<const float *> OpBuilder::param(const Resolved &r, uint64_t n,
                                         const char *what) {
  if (!r.weight) {
    if (Status st = floats(r, what); !st)
      return st.error();
    if (r.elements() != n)
      return fail(fmt::format("{} '{}' must have {} values", what,
                              r.buffer->name, n));
    return static_cast<const float *>(r.f32());
  }
  if (r.weight->dims.size() != 1 || uint64_t(r.weight->dims[0]) != n)
    return fail(fmt::format("{} '{}' must be a weight of {} values", what,
                            r.weight->name, n));
  auto values = std::make_unique<std::vector<float>>(n);
  if (Status st = cpu::dequant(*r.weight, values->data()); !st)
    return st.error();
  step_.constants.push_back(std::move(values));
  return static_cast<const float *>(step_.constants.back()->data());
}

Status OpBuilder::addNormOperands() const {
  KILN_TRY_STATUS(counts(3, 2));
  for (size_t i = 0; i < 2; ++i)
    KILN_TRY_STATUS(floats(in(i), "input"));
  KILN_TRY_STATUS(floats(out(0), "sum"));
  KILN_TRY_STATUS(floats(out(1), "output"));
  KILN_TRY_STATUS(same(in(0), out(0), op_.kind.c_str()));
  KILN_TRY_STATUS(same(in(1), out(0), op_.kind.c_str()));
  return same(out(0), out(1), op_.kind.c_str());
}

Expected<int64_t> OpBuilder::intAttr(const char *name) const {
  const Attr *a = op_.attr(name);
  if (!a || (a->kind != AttrKind::Int && a->kind != AttrKind::Bool))
    return fail(fmt::format("attribute '{}' is missing or not an integer",
                            name));
  return a->intValue;
}

Expected<double> OpBuilder::floatAttr(const char *name) const {
  const Attr *a = op_.attr(name);
  if (!a || a->kind != AttrKind::Float)
    return fail(fmt::format("attribute '{}' is missing or not a float", name));
  return a->floatValue;
}

Expected<std::string> OpBuilder::stringAttr(const char *name) const {
  const Attr *a = op_.attr(name);
  if (!a || a->kind != AttrKind::String)
    return fail(fmt::format("attribute '{}' is missing or not a string",
                            name));
  return a->stringValue;
}

Expected<std::function<Status()>> OpBuilder::build() {
  const std::string &k = op_.kind;
  cpu::ThreadPool &pool = *rank_.pool;

  if (k == "copy") {
    KILN_TRY(counts(1, 1));
    KILN_TRY(floats(in(0), "input"));
    KILN_TRY(floats(out(0), "output"));
    KILN_TRY(same(in(0), out(0), k.c_str()));
    float *x = in(0).f32(), *y = out(0).f32();
    uint64_t n = in(0).elements();
    return std::function<Status()>([=] {
      if (x != y)
        std::memmove(y, x, n * sizeof(float));
      return Status::ok();
    });
  }
  if (k == "all_reduce") {
    KILN_TRY(counts(1, 1));
    KILN_TRY(floats(in(0), "input"));
    KILN_TRY(floats(out(0), "output"));
    KILN_TRY(same(in(0), out(0), k.c_str()));
    KILN_ASSIGN(reduction, stringAttr("reduction"));
    if (reduction != "sum" && reduction != "max")
      return fail("reduction must be 'sum' or 'max'");
    const float *x = in(0).f32();
    float *y = out(0).f32();
    uint64_t n = in(0).elements();
    bool sum = reduction == "sum";
    CpuRank *rank = &rank_;
    return std::function<Status()>([=] {
      const std::vector<float> &acc =
          combineInRankOrder(*rank->comm, rank->index, x, n, sum);
      std::memcpy(y, acc.data(), n * sizeof(float));
      return Status::ok();
    });
  }
  if (k == "all_reduce_add_rms_norm") {
    KILN_TRY(addNormOperands());
    KILN_ASSIGN(reduction, stringAttr("reduction"));
    if (reduction != "sum")
      return fail("reduction must be 'sum'");
    int64_t n = out(0).inner();
    KILN_ASSIGN(w, param(in(2), uint64_t(n), "weight"));
    KILN_ASSIGN(eps, floatAttr("epsilon"));
    uint64_t total = out(0).elements();
    int64_t rows = int64_t(total) / n;
    const float *partial = in(0).f32(), *residual = in(1).f32();
    float *sum = out(0).f32(), *y = out(1).f32();
    float e = float(eps);
    CpuRank *rank = &rank_;
    return std::function<Status()>([=] {
      // The same rank-order sum as all_reduce, then the same add and norm
      // as add_rms_norm: bit-identical to the three ops unfused.
      const std::vector<float> &acc = combineInRankOrder(
          *rank->comm, rank->index, partial, total, /*sum=*/true);
      cpu::add(residual, acc.data(), int64_t(total), sum);
      cpu::rmsNorm(sum, rows, n, w, e, y);
      return Status::ok();
    });
  }
  if (k == "distributed_argmax") {
    KILN_TRY(counts(1, 1));
    KILN_TRY(floats(in(0), "input"));
    KILN_TRY(ints(out(0), "output", 1));
    KILN_ASSIGN(ranks, intAttr("ranks"));
    if (ranks != int64_t(rank_.ranks) || in(0).buffer->shape.size() != 1)
      return fail("needs a vector part and the group's rank count");
    const float *x = in(0).f32();
    int64_t n = int64_t(in(0).elements());
    int32_t *y = out(0).i32();
    CpuRank *rank = &rank_;
    return std::function<Status()>([=] {
      Communicator &c = *rank->comm;
      int32_t local = cpu::argmax(x, n);
      c.best[rank->index] = {x[local], int64_t(rank->index) * n + local};
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
  if (k == "all_gather") {
    KILN_TRY(counts(1, 1));
    KILN_TRY(floats(in(0), "input"));
    KILN_TRY(floats(out(0), "output"));
    KILN_ASSIGN(dim, intAttr("dim"));
    KILN_ASSIGN(ranks, intAttr("ranks"));
    const std::vector<int64_t> &shape = in(0).buffer->shape;
    if (ranks != int64_t(rank_.ranks) || dim < 0 ||
        size_t(dim) >= shape.size() ||
        out(0).elements() != in(0).elements() * uint64_t(ranks))
      return fail(fmt::format("gathers {} parts on dim {}, but the group has "
                              "{} ranks or the output does not fit",
                              ranks, dim, rank_.ranks));
    // Each part is `outer` runs of `inner` contiguous values; the output
    // holds, per run, every rank's run in rank order.
    uint64_t outer = 1;
    for (int64_t d = 0; d < dim; ++d)
      outer *= uint64_t(shape[d]);
    uint64_t inner = in(0).elements() / outer;
    const float *x = in(0).f32();
    float *y = out(0).f32();
    CpuRank *rank = &rank_;
    return std::function<Status()>([=] {
      Communicator &c = *rank->comm;
      c.inputs[rank->index] = x;
      c.barrier.arrive_and_wait();
      size_t n = c.inputs.size();
      for (uint64_t o = 0; o < outer; ++o)
        for (size_t q = 0; q < n; ++q)
          std::memcpy(y + (o * n + q) * inner, c.inputs[q] + o * inner,
                      inner * sizeof(float));
      c.barrier.arrive_and_wait();
      return Status::ok();
    });
  }
  if (k == "slice") {
    KILN_TRY(counts(1, 1));
    KILN_TRY(floats(in(0), "input"));
    KILN_TRY(floats(out(0), "output"));
    const Attr *offsets = op_.attr("offsets");
    const std::vector<int64_t> &src = in(0).buffer->shape;
    const std::vector<int64_t> &dst = out(0).buffer->shape;
    if (!offsets || offsets->kind != AttrKind::Ints ||
        offsets->ints.size() != src.size() || src.size() != dst.size() ||
        src.empty())
      return fail("offsets must give one entry per dimension of equal-rank "
                  "input and output");
    for (size_t d = 0; d < src.size(); ++d)
      if (offsets->ints[d] < 0 || offsets->ints[d] + dst[d] > src[d])
        return fail(fmt::format("dimension {} of the box leaves the input",
                                d));
    std::vector<int64_t> off = offsets->ints;
    const float *x = in(0).f32();
    float *y = out(0).f32();
    return std::function<Status()>([=] {
      // Row-major walk over the output's index space.
      size_t rank = dst.size();
      std::vector<int64_t> idx(rank, 0);
      uint64_t total = 1;
      for (int64_t d : dst)
        total *= uint64_t(d);
      int64_t inner = dst.back();
      for (uint64_t o = 0; o < total; o += inner) {
        int64_t srcIndex = 0;
        for (size_t d = 0; d < rank; ++d)
          srcIndex = srcIndex * src[d] + idx[d] + off[d];
        std::memcpy(y + o, x + srcIndex, inner * sizeof(float));
        for (int64_t d = int64_t(rank) - 2; d >= 0; --d) {
          if (++idx[d] < dst[d])
            break;
          idx[d] = 0;
        }
      }
      return Status::ok();
    });
  }
  if (k == "concat") {
    if (op_.outs().size() != 1 || op_.ins().empty())
      return fail("expects inputs and one output");
    KILN_TRY(floats(out(0), "output"));
    KILN_ASSIGN(dim, intAttr("dim"));
    const std::vector<int64_t> &shape = out(0).buffer->shape;
    if (dim < 0 || size_t(dim) >= shape.size())
      return fail("dim is not a dimension of the output");
    // outer = product of dims before `dim`; each input contributes a
    // contiguous run of its dims from `dim` on, per outer index.
    int64_t outer = 1, total = 0;
    for (int64_t d = 0; d < dim; ++d)
      outer *= shape[d];
    std::vector<std::pair<const float *, int64_t>> parts;
    for (size_t i = 0; i < op_.ins().size(); ++i) {
      const Resolved &r = in(i);
      KILN_TRY(floats(r, "input"));
      const std::vector<int64_t> &s = r.buffer->shape;
      if (s.size() != shape.size())
        return fail("inputs and output differ in rank");
      int64_t run = 1;
      for (size_t d = 0; d < s.size(); ++d) {
        if (int64_t(d) != dim && s[d] != shape[d])
          return fail("an input differs from the output outside dim");
        if (int64_t(d) >= dim)
          run *= s[d];
      }
      parts.push_back({r.f32(), run});
      total += run;
    }
    if (uint64_t(outer * total) != out(0).elements())
      return fail("the inputs do not fill the output");
    float *y = out(0).f32();
    return std::function<Status()>([=] {
      float *p = y;
      for (int64_t o = 0; o < outer; ++o)
        for (auto [x, run] : parts) {
          std::memcpy(p, x + o * run, run * sizeof(float));
          p += run;
        }
      return Status::ok();
    });
  }
  if (k == "add" || k == "swiglu") {
    KILN_TRY(counts(2, 1));
    for (size_t i = 0; i < 2; ++i)
      KILN_TRY(floats(in(i), "input"));
    KILN_TRY(floats(out(0), "output"));
    KILN_TRY(same(in(0), out(0), k.c_str()));
    KILN_TRY(same(in(1), out(0), k.c_str()));
    const float *a = in(0).f32(), *b = in(1).f32();
    float *y = out(0).f32();
    int64_t n = int64_t(out(0).elements());
    bool isAdd = k == "add";
    return std::function<Status()>([=] {
      if (isAdd)
        cpu::add(a, b, n, y);
      else
        cpu::swiglu(a, b, n, y);
      return Status::ok();
    });
  }
  if (k == "rms_norm" || k == "layer_norm") {
    bool layer = k == "layer_norm";
    KILN_TRY(counts(layer ? 3 : 2, 1));
    KILN_TRY(floats(in(0), "input"));
    KILN_TRY(floats(out(0), "output"));
    KILN_TRY(same(in(0), out(0), k.c_str()));
    int64_t n = in(0).inner();
    KILN_ASSIGN(w, param(in(1), uint64_t(n), "weight"));
    const float *b = nullptr;
    if (layer) {
      KILN_ASSIGN(bias, param(in(2), uint64_t(n), "bias"));
      b = bias;
    }
    KILN_ASSIGN(eps, floatAttr("epsilon"));
    int64_t rows = int64_t(in(0).elements()) / n;
    const float *x = in(0).f32();
    float *y = out(0).f32();
    float e = float(eps);
    return std::function<Status()>([=] {
      if (b)
        cpu::layerNorm(x, rows, n, w, b, e, y);
      else
        cpu::rmsNorm(x, rows, n, w, e, y);
      return Status::ok();
    });
  }
  if (k == "add_rms_norm") {
    KILN_TRY(addNormOperands());
    int64_t n = out(0).inner();
    KILN_ASSIGN(w, param(in(2), uint64_t(n), "weight"));
    KILN_ASSIGN(eps, floatAttr("epsilon"));
    int64_t total = int64_t(out(0).elements()), rows = total / n;
    const float *a = in(0).f32(), *b = in(1).f32();
    float *sum = out(0).f32(), *y = out(1).f32();
    float e = float(eps);
    return std::function<Status()>([=] {
      cpu::add(a, b, total, sum);
      cpu::rmsNorm(sum, rows, n, w, e, y);
      return Status::ok();
    });
  }
  if (k == "rope") {
    KILN_TRY(counts(2, 1));
    KILN_TRY(floats(in(0), "input"));
    KILN_TRY(ints(in(1), "position", 1));
    KILN_TRY(floats(out(0), "output"));
    KILN_TRY(same(in(0), out(0), "rope"));
    KILN_ASSIGN(style, stringAttr("style"));
    KILN_ASSIGN(theta, floatAttr("theta"));
    KILN_ASSIGN(offset, intAttr("offset"));
    KILN_ASSIGN(dims, intAttr("dims"));
    int64_t n = in(0).inner();
    if (style != "interleaved" && style != "neox")
      return fail("style must be 'interleaved' or 'neox'");
    if (dims <= 0 || dims % 2 || offset < 0 || offset + dims > n)
      return fail("the rotated range leaves the innermost dimension");
    int64_t rows = int64_t(in(0).elements()) / n;
    const float *x = in(0).f32();
    const int32_t *pos = in(1).i32();
    float *y = out(0).f32();
    cpu::RopeStyle s = style == "neox" ? cpu::RopeStyle::NeoX
                                       : cpu::RopeStyle::Interleaved;
    float t = float(theta);
    return std::function<Status()>([=] {
      cpu::rope(x, rows, n, *pos, s, t, offset, dims, y);
      return Status::ok();
    });
  }
  if (k == "dequant") {
    KILN_TRY(counts(1, 1));
    KILN_TRY(weight(in(0), "weight"));
    KILN_TRY(floats(out(0), "output"));
    const cpu::WeightView *w = in(0).weight;
    uint64_t values = 1;
    for (int64_t d : w->dims)
      values *= uint64_t(d);
    if (values != out(0).elements())
      return fail("the output does not hold the weight's values");
    float *y = out(0).f32();
    return std::function<Status()>([=] { return cpu::dequant(*w, y); });
  }
  if (k == "embed") {
    KILN_TRY(counts(2, 1));
    KILN_TRY(weight(in(0), "table"));
    KILN_TRY(ints(in(1), "token", 1));
    KILN_TRY(floats(out(0), "output"));
    const cpu::WeightView *w = in(0).weight;
    if (w->dims.size() != 2 || out(0).elements() != uint64_t(w->dims[0]))
      return fail("the table must be [hidden, vocab] and the output hidden");
    const int32_t *token = in(1).i32();
    float *y = out(0).f32();
    return std::function<Status()>(
        [=] { return cpu::embed(*w, *token, y); });
  }
  if (k == "linear") {
    KILN_TRY(counts(2, 1));
    KILN_TRY(floats(in(0), "input"));
    KILN_TRY(weight(in(1), "weight"));
    KILN_TRY(floats(out(0), "output"));
    const cpu::WeightView *w = in(1).weight;
    int64_t kDim = w->dims[0];
    if (w->dims.size() != 2 && w->dims.size() != 3)
      return fail("the weight must have 2 or 3 dims");
    if (in(0).inner() != kDim || in(0).elements() % uint64_t(kDim) != 0)
      return fail("the input's innermost dimension is not the weight's ne[0]");
    int64_t batch = int64_t(in(0).elements()) / kDim;
    if (w->dims.size() == 3 && batch != w->dims[2])
      return fail("a stacked weight needs one input row per matrix");
    if (out(0).elements() != uint64_t(batch * w->dims[1]))
      return fail("the output is not [batch, N]");
    const float *x = in(0).f32();
    float *y = out(0).f32();
    return std::function<Status()>(
        [=, &pool] { return cpu::linear(x, batch, *w, y, pool); });
  }
  if (k == "fused_linear") {
    if (op_.outs().size() != 1 || op_.ins().size() < 3)
      return fail("expects an input, two or more weights and one output");
    KILN_TRY(floats(in(0), "input"));
    KILN_TRY(floats(out(0), "output"));
    const Attr *segments = op_.attr("segments");
    size_t n = op_.ins().size() - 1;
    if (!segments || segments->kind != AttrKind::Ints ||
        segments->ints.size() != n || in(0).buffer->shape.size() != 1)
      return fail("needs a vector input and one segment offset per weight");
    int64_t kDim = in(0).buffer->shape[0], offset = 0;
    std::vector<std::pair<const cpu::WeightView *, int64_t>> parts;
    for (size_t i = 0; i < n; ++i) {
      KILN_TRY(weight(in(i + 1), "weight"));
      const cpu::WeightView *w = in(i + 1).weight;
      if (w->dims.size() != 2 || w->dims[0] != kDim)
        return fail(fmt::format("weight '{}' is not [{}, N]", w->name, kDim));
      if (segments->ints[i] != offset)
        return fail(fmt::format("segment {} starts at {}, not {}", i,
                                segments->ints[i], offset));
      parts.push_back({w, offset});
      offset += w->dims[1];
    }
    if (out(0).elements() != uint64_t(offset))
      return fail("the output does not hold the segments");
    const float *x = in(0).f32();
    float *y = out(0).f32();
    return std::function<Status()>([=, &pool]() -> Status {
      for (auto [w, at] : parts)
        if (Status st = cpu::linear(x, 1, *w, y + at, pool); !st)
          return st;
      return Status::ok();
    });
  }
  if (k == "cache_append") {
    KILN_TRY(counts(2, 1));
    KILN_TRY(floats(in(0), "entry"));
    KILN_TRY(ints(in(1), "position", 1));
    const Resolved &cache = out(0);
    if (cache.weight || cache.buffer->kind != BufferKind::State ||
        cache.buffer->shape.size() != 2 ||
        in(0).elements() != uint64_t(cache.buffer->shape[1]))
      return fail("the cache must be a state whose rows fit the entry");
    cpu::CacheView view{cache.data, cacheTypeOf(cache.buffer->dtype),
                        cache.buffer->shape[0], cache.buffer->shape[1]};
    const float *x = in(0).f32();
    const int32_t *pos = in(1).i32();
    return std::function<Status()>(
        [=] { return cpu::cacheAppend(x, *pos, view); });
  }
  if (k == "mla_attention") {
    // The optional selection is a pair of operands: 6 inputs with it, 4
    // without.
    bool hasSelection = op_.ins().size() == 6;
    KILN_TRY(counts(hasSelection ? 6 : 4, 1));
    KILN_TRY(floats(in(0), "q_latent"));
    KILN_TRY(floats(in(1), "q_rope"));
    KILN_TRY(ints(in(3), "position", 1));
    KILN_TRY(floats(out(0), "output"));
    KILN_ASSIGN(scale, floatAttr("scale"));
    const Resolved &cache = in(2);
    const std::vector<int64_t> &ql = in(0).buffer->shape;
    const std::vector<int64_t> &qr = in(1).buffer->shape;
    if (ql.size() != 2 || qr.size() != 2 || ql[0] != qr[0] ||
        cache.weight || cache.buffer->kind != BufferKind::State ||
        cache.buffer->shape.size() != 2 ||
        cache.buffer->shape[1] != ql[1] + qr[1] ||
        out(0).elements() != in(0).elements())
      return fail("q_latent [H, L], q_rope [H, R], a [P, L + R] cache and "
                  "an [H, L] output are needed");
    const int32_t *sel = nullptr, *count = nullptr;
    if (hasSelection) {
      if (in(4).weight || in(4).buffer->dtype != DType::I32)
        return fail("selected must be i32");
      KILN_TRY(ints(in(5), "selected_count", 1));
      sel = in(4).i32();
      count = in(5).i32();
      int64_t capacity = int64_t(in(4).elements());
      const int32_t *c = count;
      cpu::CacheView view{cache.data, cacheTypeOf(cache.buffer->dtype),
                          cache.buffer->shape[0], cache.buffer->shape[1]};
      const float *a = in(0).f32(), *b = in(1).f32();
      const int32_t *pos = in(3).i32();
      float *y = out(0).f32();
      int64_t heads = ql[0], latent = ql[1], rope = qr[1];
      float s = float(scale);
      std::string where = where_;
      return std::function<Status()>([=, &pool]() -> Status {
        if (*c < 0 || *c > capacity)
          return Error(where, "selected_count",
                       fmt::format("{} is outside 0..{}", *c, capacity));
        return cpu::mlaAttention(a, b, heads, latent, rope, view, *pos, sel,
                                 c, s, y, pool);
      });
    }
    cpu::CacheView view{cache.data, cacheTypeOf(cache.buffer->dtype),
                        cache.buffer->shape[0], cache.buffer->shape[1]};
    const float *a = in(0).f32(), *b = in(1).f32();
    const int32_t *pos = in(3).i32();
    float *y = out(0).f32();
    int64_t heads = ql[0], latent = ql[1], rope = qr[1];
    float s = float(scale);
    return std::function<Status()>([=, &pool] {
      return cpu::mlaAttention(a, b, heads, latent, rope, view, *pos, nullptr,
                               nullptr, s, y, pool);
    });
  }
  if (k == "dsa_indexer") {
    KILN_TRY(counts(4, 2));
    KILN_TRY(floats(in(0), "query"));
    KILN_TRY(floats(in(1), "head_weights"));
    KILN_TRY(ints(in(3), "position", 1));
    KILN_ASSIGN(topK, intAttr("top_k"));
    KILN_ASSIGN(scale, floatAttr("scale"));
    const std::vector<int64_t> &q = in(0).buffer->shape;
    const Resolved &cache = in(2);
    if (q.size() != 2 || in(1).elements() != uint64_t(q[0]) ||
        cache.weight || cache.buffer->kind != BufferKind::State ||
        cache.buffer->shape.size() != 2 || cache.buffer->shape[1] != q[1] ||
        topK <= 0)
      return fail("query [H, D], head weights [H] and a [P, D] cache are "
                  "needed");
    KILN_TRY(ints(out(0), "selected", uint64_t(topK)));
    KILN_TRY(ints(out(1), "count", 1));
    cpu::CacheView view{cache.data, cacheTypeOf(cache.buffer->dtype),
                        cache.buffer->shape[0], cache.buffer->shape[1]};
    const float *qp = in(0).f32(), *w = in(1).f32();
    const int32_t *pos = in(3).i32();
    int32_t *sel = out(0).i32(), *count = out(1).i32();
    int64_t heads = q[0], dim = q[1];
    float s = float(scale);
    return std::function<Status()>([=] {
      return cpu::dsaIndexer(qp, heads, dim, w, view, *pos, topK, s, sel,
                             count);
    });
  }
  if (k == "moe_router") {
    bool hasBias = op_.ins().size() == 3; // the optional selection bias
    KILN_TRY(counts(hasBias ? 3 : 2, 2));
    KILN_TRY(floats(in(0), "input"));
    KILN_TRY(weight(in(1), "gate"));
    KILN_ASSIGN(topK, intAttr("top_k"));
    KILN_ASSIGN(gating, stringAttr("gating"));
    KILN_ASSIGN(normalize, intAttr("normalize"));
    KILN_ASSIGN(routedScale, floatAttr("routed_scale"));
    const cpu::WeightView *gate = in(1).weight;
    if (gate->dims.size() != 2 ||
        in(0).elements() != uint64_t(gate->dims[0]) || topK <= 0 ||
        topK > gate->dims[1])
      return fail("gate must be [hidden, experts] with 1 <= top_k <= experts");
    if (gating != "sigmoid" && gating != "softmax")
      return fail("gating must be 'sigmoid' or 'softmax'");
    const float *bias = nullptr;
    if (hasBias) {
      KILN_ASSIGN(values, param(in(2), uint64_t(gate->dims[1]), "bias"));
      bias = values;
    }
    KILN_TRY(ints(out(0), "ids", uint64_t(topK)));
    KILN_TRY(floats(out(1), "weights"));
    if (out(1).elements() != uint64_t(topK))
      return fail("weights must have top_k values");
    const float *x = in(0).f32();
    int64_t hidden = gate->dims[0];
    int32_t *ids = out(0).i32();
    float *w = out(1).f32();
    cpu::Gating g =
        gating == "softmax" ? cpu::Gating::Softmax : cpu::Gating::Sigmoid;
    bool norm = normalize != 0;
    float rs = float(routedScale);
    return std::function<Status()>([=] {
      return cpu::moeRouter(x, hidden, *gate, bias, topK, g, norm, rs, ids,
                            w);
    });
  }
  if (k == "moe_experts") {
    if (op_.outs().size() != 1 ||
        (op_.ins().size() != 5 && op_.ins().size() != 6))
      return fail("expects input, ids, weights, 2 or 3 expert weights and "
                  "one output");
    KILN_TRY(floats(in(0), "input"));
    KILN_TRY(floats(in(2), "weights"));
    KILN_TRY(floats(out(0), "output"));
    uint64_t kChosen = in(2).elements();
    KILN_TRY(ints(in(1), "ids", kChosen));
    std::vector<const cpu::WeightView *> experts;
    for (size_t i = 3; i < op_.ins().size(); ++i) {
      KILN_TRY(weight(in(i), "expert weight"));
      if (in(i).weight->dims.size() != 3)
        return fail("expert weights must be [K, N, experts]");
      experts.push_back(in(i).weight);
    }
    int64_t hidden = int64_t(in(0).elements());
    if (out(0).elements() != uint64_t(hidden) ||
        experts.front()->dims[0] != hidden || experts.back()->dims[1] != hidden)
      return fail("expert shapes do not match the hidden size");
    const float *x = in(0).f32(), *w = in(2).f32();
    const int32_t *ids = in(1).i32();
    float *y = out(0).f32();
    return std::function<Status()>([=, &pool] {
      return cpu::moeExperts(x, hidden, ids, w, int64_t(kChosen), experts, y,
                             pool);
    });
  }
  if (k == "argmax") {
    KILN_TRY(counts(1, 1));
    KILN_TRY(floats(in(0), "input"));
    KILN_TRY(ints(out(0), "output", 1));
    const float *x = in(0).f32();
    int64_t n = int64_t(in(0).elements());
    int32_t *y = out(0).i32();
    return std::function<Status()>([=] {
      *y = cpu::argmax(x, n);
      return Status::ok();
    });
  }
  return fail("the CPU backend has no kernel for this op");
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
  for (size_t i = 0; i < step.ops.size(); ++i) {
    Expected<std::function<Status()>> fn =
        OpBuilder(rank, stored, step.ops[i], i).build();
    if (!fn)
      return fn.error();
    stored.ops.push_back(std::move(*fn));
  }
  return Status::ok();
}

/// Rank `rank`'s part of a binding, as a contiguous tensor of the local
/// dims: the whole tensor when the binding has no slice, else the slice
/// copied out row by row (a slice of ne[0] takes whole blocks of each row).
Expected<cpu::WeightView> placeWeight(const WeightBinding &b,
                                      const kiln_weight_bytes &bytes,
                                      std::vector<std::vector<uint8_t>> &store) {
  uint64_t rows = 1;
  for (size_t d = 1; d < b.dims.size(); ++d)
    rows *= uint64_t(b.dims[d]);
  std::optional<uint64_t> row = rowBytes(b.type, uint64_t(b.dims[0]));
  std::optional<uint64_t> expected =
      row ? checkedMul(*row, rows) : std::nullopt;
  if (!expected || *expected != bytes.bytes || !bytes.data)
    return Error(b.tensor, "bytes",
                 fmt::format("{} bytes given, the binding needs {}",
                             bytes.bytes, expected.value_or(0)));
  if (b.layout != "gguf")
    return Error(b.tensor, "layout",
                 fmt::format("'{}' is not a layout the CPU backend reads",
                             b.layout));
  const uint8_t *data = static_cast<const uint8_t *>(bytes.data);
  if (b.sliceDim < 0)
    return cpu::WeightView{data, bytes.bytes, b.type, b.dims, b.tensor};

  // The sliced dim is `groups` equal groups; the part is each group's cut
  // [sliceBegin, sliceEnd), in group order.
  int64_t cut = b.sliceEnd - b.sliceBegin;
  int64_t groupSize = b.dims[b.sliceDim] / b.sliceGroups;
  std::vector<int64_t> local = b.dims;
  local[b.sliceDim] = cut * b.sliceGroups;
  uint32_t block = traitsOf(b.type).blockSize;
  uint64_t blockBytes = traitsOf(b.type).blockBytes;
  if (b.sliceDim == 0 && b.sliceGroups != 1)
    return Error(b.tensor, "slice", "groups of ne[0] are not supported");
  if (b.sliceDim == 0 &&
      (b.sliceBegin % block != 0 || b.sliceEnd % block != 0))
    return Error(b.tensor, "slice",
                 fmt::format("[{}, {}) of ne[0] cuts its {}-value blocks",
                             b.sliceBegin, b.sliceEnd, block));
  uint64_t localRow = *rowBytes(b.type, uint64_t(local[0]));
  uint64_t localRows = 1;
  for (size_t d = 1; d < local.size(); ++d)
    localRows *= uint64_t(local[d]);
  std::vector<uint8_t> out(localRow * localRows);
  // Walk the local rows; map each to its row of the file's tensor.
  std::vector<int64_t> idx(local.size(), 0);
  for (uint64_t r = 0; r < localRows; ++r) {
    uint64_t fileRow = 0;
    for (size_t d = local.size() - 1; d >= 1; --d) {
      int64_t i = idx[d];
      if (int64_t(d) == b.sliceDim)
        i = i / cut * groupSize + b.sliceBegin + i % cut;
      fileRow = fileRow * uint64_t(b.dims[d]) + uint64_t(i);
      if (d == 1)
        break;
    }
    const uint8_t *src = data + fileRow * *row;
    if (b.sliceDim == 0)
      src += uint64_t(b.sliceBegin) / block * blockBytes;
    std::memcpy(out.data() + r * localRow, src, localRow);
    for (size_t d = 1; d < local.size(); ++d) {
      if (++idx[d] < local[d])
        break;
      idx[d] = 0;
    }
  }
  store.push_back(std::move(out));
  return cpu::WeightView{store.back().data(), store.back().size(), b.type,
                         local, b.tensor};
}

Expected<std::unique_ptr<CpuGroup>>
openGroup(std::span<const uint8_t> bytes, const kiln_weight_bytes *weights,
          uint32_t weightCount, const kiln_rank_options *options) {
  Expected<Artifact> artifact = parseArtifact(bytes, "artifact");
  if (!artifact)
    return artifact.error();
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
          Expected<cpu::WeightView> view =
              placeWeight(a.weights[b.binding], weights[b.binding],
                          rank->sliceStorage);
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

template <typename Fn>
int guarded(char *error, uint64_t errorBytes, Fn &&fn) {
  try {
    Status st = fn();
    if (!st) {
      setError(error, errorBytes, st.error().message());
      return 1;
    }
    return 0;
  } catch (const std::exception &e) {
    setError(error, errorBytes, std::string("cpu backend: ") + e.what());
    return 1;
  }
}

CpuGroup *cast(kiln_group *g) { return reinterpret_cast<CpuGroup *>(g); }

Expected<PreparedStep *> findStep(CpuRank &rank, const char *name) {
  auto it = rank.steps.find(name ? name : "");
  if (it == rank.steps.end())
    return Error("artifact", "step",
                 fmt::format("no step named '{}'", name ? name : ""));
  return &it->second;
}

Expected<uint8_t *> findSlot(PreparedStep &step, BufferKind kind,
                             const char *slot, uint64_t bytes) {
  std::optional<int32_t> i = step.step->slot(kind, slot ? slot : "");
  if (!i)
    return Error(step.step->name, slot ? slot : "",
                 fmt::format("no {} slot of that name", nameOf(kind)));
  const Resolved &r = step.buffers[*i];
  if (r.buffer->bytes() != bytes)
    return Error(step.step->name, slot,
                 fmt::format("the slot holds {} bytes, {} given",
                             r.buffer->bytes(), bytes));
  return r.data;
}

int cpuOpenGroup(const uint8_t *artifact, uint64_t artifactBytes,
                 const kiln_weight_bytes *weights, uint32_t weightCount,
                 const kiln_rank_options *options, kiln_group **out,
                 char *error, uint64_t errorBytes) {
  return guarded(error, errorBytes, [&]() -> Status {
    Expected<std::unique_ptr<CpuGroup>> g =
        openGroup(std::span<const uint8_t>(artifact, artifactBytes), weights,
                  weightCount, options);
    if (!g)
      return g.error();
    *out = reinterpret_cast<kiln_group *>(g->release());
    return Status::ok();
  });
}

/// Copies between the caller's bytes and a slot: into the input slot of
/// every rank, or out of rank 0's output slot.
int copySlot(kiln_group *group, const char *step, BufferKind kind,
             const char *slot, void *data, uint64_t bytes, char *error,
             uint64_t errorBytes) {
  return guarded(error, errorBytes, [&]() -> Status {
    for (std::unique_ptr<CpuRank> &rank : cast(group)->ranks) {
      Expected<PreparedStep *> s = findStep(*rank, step);
      if (!s)
        return s.error();
      Expected<uint8_t *> p = findSlot(**s, kind, slot, bytes);
      if (!p)
        return p.error();
      if (kind == BufferKind::Output) {
        std::memcpy(data, *p, bytes);
        break;
      }
      std::memcpy(*p, data, bytes);
    }
    return Status::ok();
  });
}

int cpuWriteSlot(kiln_group *group, const char *step, const char *slot,
                 const void *data, uint64_t bytes, char *error,
                 uint64_t errorBytes) {
  return copySlot(group, step, BufferKind::Input, slot,
                  const_cast<void *>(data), bytes, error, errorBytes);
}

int cpuReadSlot(kiln_group *group, const char *step, const char *slot,
                void *data, uint64_t bytes, char *error,
                uint64_t errorBytes) {
  return copySlot(group, step, BufferKind::Output, slot, data, bytes, error,
                  errorBytes);
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

int cpuRunStep(kiln_group *group, const char *step, char *error,
               uint64_t errorBytes) {
  return guarded(error, errorBytes, [&]() -> Status {
    std::vector<std::unique_ptr<CpuRank>> &ranks = cast(group)->ranks;
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
    // One thread per rank beyond the first, which runs here.
    std::vector<Status> results(ranks.size(), Status::ok());
    std::vector<std::thread> threads;
    for (size_t r = 1; r < ranks.size(); ++r)
      threads.emplace_back([&, r] { results[r] = runRank(*ranks[r], *steps[r]); });
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
  });
}

int cpuReset(kiln_group *group, char *error, uint64_t errorBytes) {
  return guarded(error, errorBytes, [&]() -> Status {
    for (std::unique_ptr<CpuRank> &rank : cast(group)->ranks)
      for (auto &[name, bytes] : rank->states)
        std::fill(bytes.begin(), bytes.end(), 0);
    return Status::ok();
  });
}

void cpuCloseGroup(kiln_group *group) { delete cast(group); }

const kiln_backend_v1 kCpuBackend = {
    KILN_BACKEND_ABI_VERSION,
    sizeof(kiln_backend_v1),
    "cpu",
    "Kiln reference CPU backend (float32, deterministic)",
    cpuOpenGroup,
    cpuWriteSlot,
    cpuRunStep,
    cpuReadSlot,
    cpuReset,
    cpuCloseGroup,
};

} // namespace

extern "C" __attribute__((visibility("default"))) const kiln_backend_v1 *
kiln_backend_entry(uint32_t abiVersion) {
  return abiVersion == KILN_BACKEND_ABI_VERSION ? &kCpuBackend : nullptr;
}
