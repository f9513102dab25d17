//===- StepOps.cpp - Step ops decoded and checked, for every backend ------===//
#include "common/StepOps.h"
#include "common/PluginSupport.h"

#include "support/CheckedMath.h"
#include "support/DrawKey.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>

using namespace kiln;
using namespace kiln::artifact;

namespace kiln::backend {

int64_t HostWeight::rows() const {
  int64_t rows = 1;
  for (size_t d = 1; d < dims.size(); ++d)
    rows *= dims[d];
  return rows;
}

Expected<HostWeight> sliceWeight(const WeightBinding &b,
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
  const uint8_t *data = static_cast<const uint8_t *>(bytes.data);
  if (b.sliceDim < 0 && b.rowPeriod == 0)
    return HostWeight{data, bytes.bytes, b.type, b.dims, b.tensor};

  // The sliced dim is `groups` equal groups; the part is each group's cut
  // [sliceBegin, sliceEnd), in group order; then of every rowPeriod rows
  // of dim 1, [rowBegin, rowEnd) (artifact::fileIndex).
  std::vector<int64_t> local = localDims(b);
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
      const int64_t i = fileIndex(b, d, idx[d]);
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
  return HostWeight{store.back().data(), store.back().size(), b.type, local,
                    b.tensor};
}

void setError(char *error, uint64_t errorBytes, const std::string &message) {
  if (!error || errorBytes == 0)
    return;
  size_t n = std::min<size_t>(message.size(), errorBytes - 1);
  std::memcpy(error, message.data(), n);
  error[n] = '\0';
}

namespace {

const std::map<std::string, OpKind, std::less<>> &kinds() {
  static const std::map<std::string, OpKind, std::less<>> table = {
      {"copy", OpKind::Copy},
      {"slice", OpKind::Slice},
      {"concat", OpKind::Concat},
      {"add", OpKind::Add},
      {"swiglu", OpKind::Swiglu},
      {"rms_norm", OpKind::RmsNorm},
      {"layer_norm", OpKind::LayerNorm},
      {"add_rms_norm", OpKind::AddRmsNorm},
      {"all_reduce_add_rms_norm", OpKind::AllReduceAddRmsNorm},
      {"all_reduce_add", OpKind::AllReduceAdd},
      {"rope", OpKind::Rope},
      {"dequant", OpKind::Dequant},
      {"embed", OpKind::Embed},
      {"linear", OpKind::Linear},
      {"fused_linear", OpKind::FusedLinear},
      {"rms_norm_linear", OpKind::RmsNormLinear},
      {"swiglu_linear", OpKind::SwigluLinear},
      {"cache_append", OpKind::CacheAppend},
      {"norm_rope_append", OpKind::NormRopeAppend},
      {"mla_attention", OpKind::MlaAttention},
      {"dsa_indexer", OpKind::DsaIndexer},
      {"moe_router", OpKind::MoeRouter},
      {"rms_norm_router", OpKind::RmsNormRouter},
      {"moe_experts", OpKind::MoeExperts},
      {"router_partial", OpKind::RouterPartial},
      {"linear_router", OpKind::LinearRouter},
      {"moe_choose", OpKind::MoeChoose},
      {"argmax", OpKind::Argmax},
      {"all_reduce", OpKind::AllReduce},
      {"all_gather", OpKind::AllGather},
      {"distributed_argmax", OpKind::DistributedArgmax},
  };
  return table;
}


/// One operand: its buffer, and for a weight the binding's local dims.
struct Operand {
  const Buffer *buffer = nullptr;
  const WeightBinding *binding = nullptr;
  std::vector<int64_t> dims; ///< a weight's local dims

  bool isWeight() const { return binding != nullptr; }
  uint64_t elements() const { return buffer->elements(); }
  int64_t inner() const {
    return buffer->shape.empty() ? 1 : buffer->shape.back();
  }
  const std::string &name() const {
    return binding ? binding->tensor : buffer->name;
  }
};

class Decoder {
public:
  Decoder(const Artifact &artifact, const Step &step, const Op &op,
          size_t index, uint32_t ranks)
      : artifact_(artifact), step_(step), op_(op), ranks_(ranks) {
    d_.where = fmt::format("step '{}' op {} ({})", step.name, index, op.kind);
    d_.ins.assign(op.ins().begin(), op.ins().end());
    d_.outs.assign(op.outs().begin(), op.outs().end());
  }

  Expected<StepOp> decode();

private:
  Error fail(const std::string &problem) const {
    return Error(d_.where, "", problem);
  }
  Operand operand(int32_t index) const {
    Operand o;
    o.buffer = &step_.buffers[index];
    if (o.buffer->kind == BufferKind::Weight) {
      o.binding = &artifact_.weights[o.buffer->binding];
      o.dims = localDims(*o.binding);
    }
    return o;
  }
  Operand in(size_t i) const { return operand(d_.ins[i]); }
  Operand out(size_t i) const { return operand(d_.outs[i]); }
  Status counts(size_t ins, size_t outs) const;
  /// Argmax, DistributedArgmax: the input alone, or with the sampling
  /// words and the position (drawn).
  Status drawOperands();
  Status floats(const Operand &r, const char *what) const;
  Status ints(const Operand &r, const char *what, uint64_t elements) const;
  Status weight(const Operand &r, const char *what) const;
  Status same(const Operand &a, const Operand &b) const;
  Status param(const Operand &r, uint64_t n, const char *what) const;
  Status cache(const Operand &r, int64_t width, const char *what) const;
  Status addNormOperands();
  Status routerTail();
  Status choice(int64_t experts, const Operand *bias, size_t idsOut = 0);
  Status rotation(const std::string &prefix, int64_t width,
                  const char *outside);
  Expected<int64_t> intAttr(const char *name) const;
  Expected<double> floatAttr(const char *name) const;
  Expected<std::string> stringAttr(const char *name) const;

  const Artifact &artifact_;
  const Step &step_;
  const Op &op_;
  uint32_t ranks_;
  StepOp d_;
};

/// A rotation's attributes (`prefix` style, theta, offset and dims) over
/// rows of `width` values into d_: the rope op's, a cache row's, the
/// indexer query's; `outside` is the error when the range leaves the row.
Status Decoder::rotation(const std::string &prefix, int64_t width,
                         const char *outside) {
  KILN_ASSIGN(style, stringAttr((prefix + "style").c_str()));
  KILN_ASSIGN(theta, floatAttr((prefix + "theta").c_str()));
  KILN_ASSIGN(offset, intAttr((prefix + "offset").c_str()));
  KILN_ASSIGN(dims, intAttr((prefix + "dims").c_str()));
  if (style != "interleaved" && style != "neox")
    return fail(prefix + "style must be 'interleaved' or 'neox'");
  if (dims <= 0 || dims % 2 || offset < 0 || offset + dims > width)
    return fail(outside);
  d_.neox = style == "neox";
  d_.theta = theta;
  d_.ropeOffset = offset;
  d_.ropeDims = dims;
  return Status::ok();
}

Status Decoder::counts(size_t ins, size_t outs) const {
  if (d_.ins.size() != ins || d_.outs.size() != outs)
    return fail(fmt::format("expects {} inputs and {} outputs, has {} and {}",
                            ins, outs, d_.ins.size(), d_.outs.size()));
  return Status::ok();
}

Status Decoder::drawOperands() {
  if (d_.ins.size() == 3) {
    KILN_TRY(counts(3, 1));
    // The first form's four words (a temperature only), eight, or the
    // adjusting form's (DrawKey.h).
    const Operand words = in(1);
    const uint64_t count = words.elements();
    const bool adjusting =
        count <= INT32_MAX && draw::adjustCapacity(int(count)) > 0;
    d_.drawWords = count == draw::kTemperatureWords || adjusting
                       ? int(count)
                       : draw::kDrawWords;
    KILN_TRY(ints(words, "sampling", uint64_t(d_.drawWords)));
    KILN_TRY(ints(in(2), "position", 1));
    d_.drawn = true;
    return Status::ok();
  }
  return counts(1, 1);
}

Status Decoder::floats(const Operand &r, const char *what) const {
  if (r.isWeight() || r.buffer->dtype != DType::F32)
    return fail(fmt::format("{} '{}' must be an f32 buffer", what, r.name()));
  return Status::ok();
}

Status Decoder::ints(const Operand &r, const char *what,
                     uint64_t elements) const {
  if (r.isWeight() || r.buffer->dtype != DType::I32 ||
      r.elements() != elements)
    return fail(fmt::format("{} '{}' must be {} i32 values", what, r.name(),
                            elements));
  return Status::ok();
}

Status Decoder::weight(const Operand &r, const char *what) const {
  if (!r.isWeight())
    return fail(fmt::format("{} '{}' must be a weight", what, r.name()));
  return Status::ok();
}

Status Decoder::same(const Operand &a, const Operand &b) const {
  if (a.elements() != b.elements() || a.inner() != b.inner())
    return fail(fmt::format("'{}' and '{}' differ in shape", a.name(),
                            b.name()));
  return Status::ok();
}

/// A per-channel parameter: n f32 values, or a one-dimensional weight of n.
Status Decoder::param(const Operand &r, uint64_t n, const char *what) const {
  if (!r.isWeight()) {
    KILN_TRY(floats(r, what));
    if (r.elements() != n)
      return fail(fmt::format("{} '{}' must have {} values", what, r.name(),
                              n));
    return Status::ok();
  }
  if (r.dims.size() != 1 || uint64_t(r.dims[0]) != n)
    return fail(fmt::format("{} '{}' must be a weight of {} values", what,
                            r.name(), n));
  return Status::ok();
}

/// A cache: a state of [positions, width].
Status Decoder::cache(const Operand &r, int64_t width, const char *what) const {
  if (r.isWeight() || r.buffer->kind != BufferKind::State ||
      r.buffer->dtype == DType::I32 || r.buffer->shape.size() != 2 ||
      r.buffer->shape[1] != width)
    return fail(fmt::format("{} '{}' must be a [positions, {}] cache state",
                            what, r.name(), width));
  return Status::ok();
}

Status Decoder::addNormOperands() {
  KILN_TRY(counts(3, 2));
  for (size_t i = 0; i < 2; ++i)
    KILN_TRY(floats(in(i), "input"));
  KILN_TRY(floats(out(0), "sum"));
  KILN_TRY(floats(out(1), "output"));
  KILN_TRY(same(in(0), out(0)));
  KILN_TRY(same(in(1), out(0)));
  KILN_TRY(same(out(0), out(1)));
  d_.n = out(0).inner();
  d_.rows = int64_t(out(0).elements()) / d_.n;
  KILN_TRY(param(in(2), uint64_t(d_.n), "weight"));
  KILN_ASSIGN(eps, floatAttr("epsilon"));
  d_.epsilon = eps;
  return Status::ok();
}

/// An all_reduce_add_rms_norm with a router tail (kiln-fold-router):
/// partial [n + tail], residual, weight; sum and output [n], logits [tail].
/// With the router's choice (kiln-fuse-router-choice; its top_k attribute)
/// also the choice's bias (an optional fourth input) and its ids and
/// weights (outputs 3 and 4).
Status Decoder::routerTail() {
  KILN_ASSIGN(tail, intAttr("tail"));
  if (tail <= 0)
    return fail(fmt::format("tail must be positive, got {}", tail));
  d_.hasChoice = op_.attr("top_k") != nullptr;
  if (d_.hasChoice)
    KILN_TRY(counts(d_.ins.size() == 4 ? 4 : 3, 5));
  else
    KILN_TRY(counts(3, 3));
  KILN_TRY(floats(in(0), "partial"));
  KILN_TRY(floats(in(1), "residual"));
  KILN_TRY(floats(out(0), "sum"));
  KILN_TRY(floats(out(1), "output"));
  KILN_TRY(floats(out(2), "logits"));
  KILN_TRY(same(in(1), out(0)));
  KILN_TRY(same(out(0), out(1)));
  if (out(0).buffer->shape.size() != 1)
    return fail("with a tail the sum must be one vector");
  d_.n = int64_t(out(0).elements());
  d_.rows = 1;
  d_.tail = tail;
  if (in(0).elements() != uint64_t(d_.n + tail))
    return fail(fmt::format("partial '{}' must hold the sum's {} values and "
                            "the tail's {}, has {}",
                            in(0).name(), d_.n, tail, in(0).elements()));
  if (out(2).elements() != uint64_t(tail))
    return fail(fmt::format("logits '{}' must have the tail's {} values",
                            out(2).name(), tail));
  KILN_TRY(param(in(2), uint64_t(d_.n), "weight"));
  KILN_ASSIGN(eps, floatAttr("epsilon"));
  d_.epsilon = eps;
  if (d_.hasChoice) {
    const bool hasBias = d_.ins.size() == 4;
    const Operand bias = hasBias ? in(3) : Operand();
    KILN_TRY(choice(tail, hasBias ? &bias : nullptr, 3));
  }
  return Status::ok();
}

/// The router's choice from `experts` logits (moe_router, moe_choose,
/// all_reduce_add_rms_norm's choose): top_k, gating, normalize,
/// routed_scale, the bias when there is one, ids and weights
/// out(idsOut) and out(idsOut + 1).
Status Decoder::choice(int64_t experts, const Operand *bias, size_t idsOut) {
  KILN_ASSIGN(topK, intAttr("top_k"));
  KILN_ASSIGN(gating, stringAttr("gating"));
  KILN_ASSIGN(normalize, intAttr("normalize"));
  KILN_ASSIGN(routedScale, floatAttr("routed_scale"));
  if (topK <= 0 || topK > experts)
    return fail(
        fmt::format("top_k {} is outside 1..{} experts", topK, experts));
  if (gating != "sigmoid" && gating != "softmax")
    return fail("gating must be 'sigmoid' or 'softmax'");
  d_.hasBias = bias != nullptr;
  if (bias)
    KILN_TRY(param(*bias, uint64_t(experts), "bias"));
  KILN_TRY(ints(out(idsOut), "ids", uint64_t(topK)));
  KILN_TRY(floats(out(idsOut + 1), "weights"));
  if (out(idsOut + 1).elements() != uint64_t(topK))
    return fail("weights must have top_k values");
  d_.experts = experts;
  d_.topK = topK;
  d_.softmax = gating == "softmax";
  d_.normalize = normalize != 0;
  d_.routedScale = routedScale;
  return Status::ok();
}

Expected<int64_t> Decoder::intAttr(const char *name) const {
  const Attr *a = op_.attr(name);
  if (!a || (a->kind != AttrKind::Int && a->kind != AttrKind::Bool))
    return fail(fmt::format("attribute '{}' is missing or not an integer",
                            name));
  return a->intValue;
}

Expected<double> Decoder::floatAttr(const char *name) const {
  const Attr *a = op_.attr(name);
  if (!a || a->kind != AttrKind::Float)
    return fail(fmt::format("attribute '{}' is missing or not a float", name));
  return a->floatValue;
}

Expected<std::string> Decoder::stringAttr(const char *name) const {
  const Attr *a = op_.attr(name);
  if (!a || a->kind != AttrKind::String)
    return fail(fmt::format("attribute '{}' is missing or not a string",
                            name));
  return a->stringValue;
}

Expected<StepOp> Decoder::decode() {
  auto it = kinds().find(op_.kind);
  if (it == kinds().end())
    return fail("no backend has a kernel for this op");
  d_.kind = it->second;

  switch (d_.kind) {
  case OpKind::Copy:
  case OpKind::AllReduce: {
    KILN_TRY(counts(1, 1));
    KILN_TRY(floats(in(0), "input"));
    KILN_TRY(floats(out(0), "output"));
    KILN_TRY(same(in(0), out(0)));
    d_.n = int64_t(in(0).elements());
    if (d_.kind == OpKind::AllReduce) {
      KILN_ASSIGN(reduction, stringAttr("reduction"));
      if (reduction != "sum" && reduction != "max")
        return fail("reduction must be 'sum' or 'max'");
      d_.sum = reduction == "sum";
    }
    break;
  }
  case OpKind::AllReduceAddRmsNorm: {
    if (op_.attr("tail"))
      KILN_TRY(routerTail());
    else if (op_.attr("top_k"))
      return fail("a choice (top_k) needs a tail: it chooses from the "
                  "tail's logits");
    else
      KILN_TRY(addNormOperands());
    KILN_ASSIGN(reduction, stringAttr("reduction"));
    if (reduction != "sum")
      return fail("reduction must be 'sum'");
    break;
  }
  case OpKind::AllReduceAdd: {
    // partial and residual [rows, n] -> sum [rows, n].
    KILN_TRY(counts(2, 1));
    KILN_TRY(floats(in(0), "partial"));
    KILN_TRY(floats(in(1), "residual"));
    KILN_TRY(floats(out(0), "sum"));
    KILN_TRY(same(in(0), out(0)));
    KILN_TRY(same(in(1), out(0)));
    d_.n = out(0).inner();
    d_.rows = int64_t(out(0).elements()) / d_.n;
    KILN_ASSIGN(reduction, stringAttr("reduction"));
    if (reduction != "sum")
      return fail("reduction must be 'sum'");
    break;
  }
  case OpKind::AddRmsNorm:
    KILN_TRY(addNormOperands());
    break;
  case OpKind::DistributedArgmax: {
    KILN_TRY(drawOperands());
    KILN_TRY(floats(in(0), "input"));
    KILN_TRY(ints(out(0), "output", 1));
    KILN_ASSIGN(ranks, intAttr("ranks"));
    if (ranks != int64_t(ranks_) || in(0).buffer->shape.size() != 1)
      return fail("needs a vector part and the group's rank count");
    d_.ranks = ranks;
    d_.n = int64_t(in(0).elements());
    break;
  }
  case OpKind::AllGather: {
    KILN_TRY(counts(1, 1));
    KILN_TRY(floats(in(0), "input"));
    KILN_TRY(floats(out(0), "output"));
    KILN_ASSIGN(dim, intAttr("dim"));
    KILN_ASSIGN(ranks, intAttr("ranks"));
    const std::vector<int64_t> &shape = in(0).buffer->shape;
    if (ranks != int64_t(ranks_) || dim < 0 || size_t(dim) >= shape.size() ||
        out(0).elements() != in(0).elements() * uint64_t(ranks))
      return fail(fmt::format("gathers {} parts on dim {}, but the group has "
                              "{} ranks or the output does not fit",
                              ranks, dim, ranks_));
    // Each part is `outer` runs of `inner` contiguous values; the output
    // holds, per run, every rank's run in rank order.
    d_.outer = 1;
    for (int64_t i = 0; i < dim; ++i)
      d_.outer *= shape[i];
    d_.inner = int64_t(in(0).elements()) / d_.outer;
    d_.dim = dim;
    d_.ranks = ranks;
    break;
  }
  case OpKind::Slice: {
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
    for (size_t i = 0; i < src.size(); ++i)
      if (offsets->ints[i] < 0 || offsets->ints[i] + dst[i] > src[i])
        return fail(fmt::format("dimension {} of the box leaves the input",
                                i));
    d_.srcShape = src;
    d_.dstShape = dst;
    d_.offsets = offsets->ints;
    break;
  }
  case OpKind::Concat: {
    if (d_.outs.size() != 1 || d_.ins.empty())
      return fail("expects inputs and one output");
    KILN_TRY(floats(out(0), "output"));
    KILN_ASSIGN(dim, intAttr("dim"));
    const std::vector<int64_t> &shape = out(0).buffer->shape;
    if (dim < 0 || size_t(dim) >= shape.size())
      return fail("dim is not a dimension of the output");
    // outer = product of dims before `dim`; each input contributes a
    // contiguous run of its dims from `dim` on, per outer index.
    int64_t total = 0;
    d_.outer = 1;
    for (int64_t i = 0; i < dim; ++i)
      d_.outer *= shape[i];
    for (size_t i = 0; i < d_.ins.size(); ++i) {
      Operand r = in(i);
      KILN_TRY(floats(r, "input"));
      const std::vector<int64_t> &s = r.buffer->shape;
      if (s.size() != shape.size())
        return fail("inputs and output differ in rank");
      int64_t run = 1;
      for (size_t j = 0; j < s.size(); ++j) {
        if (int64_t(j) != dim && s[j] != shape[j])
          return fail("an input differs from the output outside dim");
        if (int64_t(j) >= dim)
          run *= s[j];
      }
      d_.runs.push_back(run);
      total += run;
    }
    if (uint64_t(d_.outer * total) != out(0).elements())
      return fail("the inputs do not fill the output");
    d_.n = total;
    d_.dim = dim;
    break;
  }
  case OpKind::Add:
  case OpKind::Swiglu: {
    KILN_TRY(counts(2, 1));
    for (size_t i = 0; i < 2; ++i)
      KILN_TRY(floats(in(i), "input"));
    KILN_TRY(floats(out(0), "output"));
    KILN_TRY(same(in(0), out(0)));
    KILN_TRY(same(in(1), out(0)));
    d_.n = int64_t(out(0).elements());
    break;
  }
  case OpKind::RmsNorm:
  case OpKind::LayerNorm: {
    bool layer = d_.kind == OpKind::LayerNorm;
    KILN_TRY(counts(layer ? 3 : 2, 1));
    KILN_TRY(floats(in(0), "input"));
    KILN_TRY(floats(out(0), "output"));
    KILN_TRY(same(in(0), out(0)));
    d_.n = in(0).inner();
    d_.rows = int64_t(in(0).elements()) / d_.n;
    KILN_TRY(param(in(1), uint64_t(d_.n), "weight"));
    if (layer)
      KILN_TRY(param(in(2), uint64_t(d_.n), "bias"));
    KILN_ASSIGN(eps, floatAttr("epsilon"));
    d_.epsilon = eps;
    break;
  }
  case OpKind::Rope: {
    KILN_TRY(counts(2, 1));
    KILN_TRY(floats(in(0), "input"));
    KILN_TRY(ints(in(1), "position", 1));
    KILN_TRY(floats(out(0), "output"));
    KILN_TRY(same(in(0), out(0)));
    d_.n = in(0).inner();
    KILN_TRY(
        rotation("", d_.n, "the rotated range leaves the innermost dimension"));
    d_.rows = int64_t(in(0).elements()) / d_.n;
    break;
  }
  case OpKind::Dequant: {
    KILN_TRY(counts(1, 1));
    Operand w = in(0);
    KILN_TRY(weight(w, "weight"));
    KILN_TRY(floats(out(0), "output"));
    uint64_t values = 1;
    for (int64_t v : w.dims)
      values *= uint64_t(v);
    if (values != out(0).elements())
      return fail("the output does not hold the weight's values");
    d_.n = int64_t(values);
    break;
  }
  case OpKind::Embed: {
    KILN_TRY(counts(2, 1));
    Operand w = in(0);
    KILN_TRY(weight(w, "table"));
    KILN_TRY(ints(in(1), "token", 1));
    KILN_TRY(floats(out(0), "output"));
    if (w.dims.size() != 2 || out(0).elements() != uint64_t(w.dims[0]))
      return fail("the table must be [hidden, vocab] and the output hidden");
    d_.n = w.dims[0];
    d_.k = w.dims[1];
    break;
  }
  case OpKind::Linear: {
    KILN_TRY(counts(2, 1));
    KILN_TRY(floats(in(0), "input"));
    Operand w = in(1);
    KILN_TRY(weight(w, "weight"));
    KILN_TRY(floats(out(0), "output"));
    if (w.dims.size() != 2 && w.dims.size() != 3)
      return fail("the weight must have 2 or 3 dims");
    int64_t kDim = w.dims[0];
    if (in(0).inner() != kDim || in(0).elements() % uint64_t(kDim) != 0)
      return fail("the input's innermost dimension is not the weight's ne[0]");
    int64_t batch = int64_t(in(0).elements()) / kDim;
    d_.stacked = w.dims.size() == 3;
    if (d_.stacked && batch != w.dims[2])
      return fail("a stacked weight needs one input row per matrix");
    if (out(0).elements() != uint64_t(batch * w.dims[1]))
      return fail("the output is not [batch, N]");
    d_.rows = batch;
    d_.n = w.dims[1];
    d_.k = kDim;
    break;
  }
  case OpKind::SwigluLinear: {
    KILN_TRY(counts(3, 1));
    KILN_TRY(floats(in(0), "gate"));
    KILN_TRY(floats(in(1), "up"));
    KILN_TRY(same(in(0), in(1)));
    Operand w = in(2);
    KILN_TRY(weight(w, "weight"));
    KILN_TRY(floats(out(0), "output"));
    if (in(0).buffer->shape.size() != 1 || w.dims.size() != 2 ||
        in(0).elements() != uint64_t(w.dims[0]))
      return fail("needs vectors gate and up of the weight's ne[0] values "
                  "and a 2-D weight");
    if (out(0).elements() != uint64_t(w.dims[1]))
      return fail("the output is not the weight's ne[1] values");
    d_.rows = 1;
    d_.n = w.dims[1];
    d_.k = w.dims[0];
    break;
  }
  case OpKind::FusedLinear:
  case OpKind::RmsNormLinear: {
    const bool normed = d_.kind == OpKind::RmsNormLinear;
    const size_t first = normed ? 2 : 1;
    if (d_.outs.size() != 1 || d_.ins.size() < first + (normed ? 1 : 2))
      return fail(normed ? "expects an input, a norm weight, weights and one "
                           "output"
                         : "expects an input, two or more weights and one "
                           "output");
    KILN_TRY(floats(in(0), "input"));
    KILN_TRY(floats(out(0), "output"));
    const Attr *segments = op_.attr("segments");
    size_t n = d_.ins.size() - first;
    if (!segments || segments->kind != AttrKind::Ints ||
        segments->ints.size() != n || in(0).buffer->shape.size() != 1)
      return fail("needs a vector input and one segment offset per weight");
    int64_t kDim = in(0).buffer->shape[0], offset = 0;
    if (normed) {
      KILN_TRY(param(in(1), uint64_t(kDim), "norm"));
      KILN_ASSIGN(eps, floatAttr("epsilon"));
      d_.epsilon = eps;
    }
    for (size_t i = 0; i < n; ++i) {
      Operand w = in(i + first);
      KILN_TRY(weight(w, "weight"));
      if (w.dims.size() != 2 || w.dims[0] != kDim)
        return fail(fmt::format("weight '{}' is not [{}, N]", w.name(), kDim));
      if (segments->ints[i] != offset)
        return fail(fmt::format("segment {} starts at {}, not {}", i,
                                segments->ints[i], offset));
      d_.segments.push_back(offset);
      offset += w.dims[1];
    }
    if (out(0).elements() != uint64_t(offset))
      return fail("the output does not hold the segments");
    if (const Attr *live = op_.attr("live_from")) {
      if (live->kind != AttrKind::Ints || live->ints.size() != n)
        return fail("live_from needs one position per weight");
      for (int64_t p : live->ints)
        if (p < 0 || p > INT32_MAX)
          return fail(fmt::format("live_from position {} is out of range", p));
      d_.liveFrom = live->ints;
    }
    d_.k = kDim;
    d_.n = offset;
    break;
  }
  case OpKind::CacheAppend: {
    KILN_TRY(counts(2, 1));
    KILN_TRY(floats(in(0), "entry"));
    KILN_TRY(ints(in(1), "position", 1));
    KILN_TRY(cache(out(0), int64_t(in(0).elements()), "cache"));
    d_.n = int64_t(in(0).elements());
    break;
  }
  case OpKind::NormRopeAppend: {
    // entry, weight, [bias,] position; the bias comes with a layer norm.
    KILN_ASSIGN(norm, stringAttr("norm"));
    if (norm != "rms" && norm != "layer")
      return fail("norm must be 'rms' or 'layer'");
    const bool layer = norm == "layer";
    KILN_TRY(counts(layer ? 4 : 3, 1));
    const size_t positionIn = layer ? 3 : 2;
    KILN_TRY(floats(in(0), "entry"));
    KILN_TRY(ints(in(positionIn), "position", 1));
    const int64_t width = int64_t(in(0).elements());
    KILN_TRY(cache(out(0), width, "cache"));
    KILN_ASSIGN(normDims, intAttr("norm_dims"));
    if (normDims <= 0 || normDims > width)
      return fail("norm_dims leaves the row");
    KILN_TRY(param(in(1), uint64_t(normDims), "weight"));
    if (layer)
      KILN_TRY(param(in(2), uint64_t(normDims), "bias"));
    KILN_ASSIGN(eps, floatAttr("epsilon"));
    KILN_TRY(rotation("", width, "the rotated range leaves the row"));
    d_.n = width;
    d_.k = normDims;
    d_.hasBias = layer;
    d_.epsilon = eps;
    break;
  }
  case OpKind::MlaAttention: {
    // The optional selection is a pair of operands, the optional output
    // projection a weight after them: 4 to 7 inputs.
    d_.projected = !d_.ins.empty() && in(d_.ins.size() - 1).isWeight();
    bool hasSelection = d_.ins.size() == (d_.projected ? 7u : 6u);
    KILN_TRY(counts((hasSelection ? 6 : 4) + (d_.projected ? 1 : 0), 1));
    KILN_TRY(floats(in(0), "q_latent"));
    KILN_TRY(floats(in(1), "q_rope"));
    KILN_TRY(ints(in(3), "position", 1));
    KILN_TRY(floats(out(0), "output"));
    KILN_ASSIGN(scale, floatAttr("scale"));
    const std::vector<int64_t> &ql = in(0).buffer->shape;
    const std::vector<int64_t> &qr = in(1).buffer->shape;
    if (ql.size() != 2 || qr.size() != 2 || ql[0] != qr[0])
      return fail("q_latent [H, L] and q_rope [H, R] are needed");
    if (d_.projected) {
      Operand w = in(d_.ins.size() - 1);
      KILN_TRY(weight(w, "projection"));
      if (w.dims.size() != 3 || w.dims[0] != ql[1] || w.dims[2] != ql[0])
        return fail("the projection must be a stack [L, N, H] of the "
                    "heads' output matrices");
      if (out(0).elements() != uint64_t(ql[0] * w.dims[1]))
        return fail("the output is not [H, N]");
      d_.n = w.dims[1];
    } else if (out(0).elements() != in(0).elements()) {
      return fail("the output is not [H, L]");
    }
    KILN_TRY(cache(in(2), ql[1] + qr[1], "cache"));
    if (hasSelection) {
      Operand sel = in(4);
      if (sel.isWeight() || sel.buffer->dtype != DType::I32)
        return fail("selected must be i32");
      KILN_TRY(ints(in(5), "selected_count", 1));
      d_.capacity = int64_t(sel.elements());
    }
    d_.heads = ql[0];
    d_.k = ql[1];
    d_.rope = qr[1];
    d_.scale = scale;
    break;
  }
  case OpKind::DsaIndexer: {
    KILN_TRY(counts(4, 2));
    KILN_TRY(floats(in(0), "query"));
    KILN_TRY(floats(in(1), "head_weights"));
    KILN_TRY(ints(in(3), "position", 1));
    KILN_ASSIGN(topK, intAttr("top_k"));
    KILN_ASSIGN(scale, floatAttr("scale"));
    const std::vector<int64_t> &q = in(0).buffer->shape;
    if (q.size() != 2 || in(1).elements() != uint64_t(q[0]) || topK <= 0)
      return fail("query [H, D], head weights [H] and top_k > 0 are needed");
    KILN_TRY(cache(in(2), q[1], "keys"));
    KILN_TRY(ints(out(0), "selected", uint64_t(topK)));
    KILN_TRY(ints(out(1), "count", 1));
    d_.heads = q[0];
    d_.k = q[1];
    d_.topK = topK;
    d_.scale = scale;
    // The query's rope (kiln-fuse-indexer-rope): all four or none.
    if (op_.attr("rope_dims") || op_.attr("rope_offset") ||
        op_.attr("rope_style") || op_.attr("rope_theta"))
      KILN_TRY(rotation("rope_", q[1],
                        "the query's rotated range leaves its rows"));
    break;
  }
  case OpKind::MoeRouter: {
    const bool hasBias = d_.ins.size() == 3; // the optional selection bias
    KILN_TRY(counts(hasBias ? 3 : 2, 2));
    KILN_TRY(floats(in(0), "input"));
    Operand gate = in(1);
    KILN_TRY(weight(gate, "gate"));
    KILN_ASSIGN(topK, intAttr("top_k"));
    if (gate.dims.size() != 2 ||
        in(0).elements() != uint64_t(gate.dims[0]) || topK <= 0 ||
        topK > gate.dims[1])
      return fail("gate must be [hidden, experts] with 1 <= top_k <= experts");
    const Operand bias = hasBias ? in(2) : Operand();
    KILN_TRY(choice(gate.dims[1], hasBias ? &bias : nullptr));
    d_.k = gate.dims[0];
    break;
  }
  case OpKind::RmsNormRouter: {
    // input [n], norm [n], gate [n, E], the optional bias [E]; output [n],
    // ids and weights [top_k].
    const bool hasBias = d_.ins.size() == 4;
    KILN_TRY(counts(hasBias ? 4 : 3, 3));
    KILN_TRY(floats(in(0), "input"));
    KILN_TRY(floats(out(0), "output"));
    KILN_TRY(same(in(0), out(0)));
    Operand gate = in(2);
    KILN_TRY(weight(gate, "gate"));
    if (gate.dims.size() != 2 || in(0).elements() != uint64_t(gate.dims[0]))
      return fail("gate must be [hidden, experts] matching the input");
    KILN_TRY(param(in(1), uint64_t(gate.dims[0]), "norm"));
    const Operand bias = hasBias ? in(3) : Operand();
    KILN_TRY(choice(gate.dims[1], hasBias ? &bias : nullptr, 1));
    KILN_ASSIGN(eps, floatAttr("epsilon"));
    d_.epsilon = eps;
    d_.k = gate.dims[0];
    d_.n = gate.dims[0];
    d_.rows = 1;
    break;
  }
  case OpKind::RouterPartial: {
    // partial, residual [n]; gate F32 [n, E]; norm [n]; output [E].
    KILN_TRY(counts(4, 1));
    KILN_TRY(floats(in(0), "partial"));
    KILN_TRY(floats(in(1), "residual"));
    KILN_TRY(same(in(0), in(1)));
    if (in(0).buffer->shape.size() != 1)
      return fail("partial and residual must be vectors");
    const int64_t hidden = int64_t(in(0).elements());
    Operand gate = in(2);
    KILN_TRY(weight(gate, "gate"));
    if (gate.binding->type != GGMLType::F32 || gate.dims.size() != 2 ||
        gate.dims[0] != hidden)
      return fail(fmt::format("gate '{}' must be an F32 [{}, experts] weight",
                              gate.name(), hidden));
    KILN_TRY(param(in(3), uint64_t(hidden), "norm"));
    KILN_TRY(floats(out(0), "output"));
    if (out(0).elements() != uint64_t(gate.dims[1]))
      return fail(fmt::format("output '{}' must have the gate's {} experts",
                              out(0).name(), gate.dims[1]));
    KILN_ASSIGN(residualScale, floatAttr("residual_scale"));
    d_.n = hidden;
    d_.experts = gate.dims[1];
    d_.residualScale = residualScale;
    break;
  }
  case OpKind::LinearRouter: {
    // input [K]; W [K, N]; residual [N]; gate F32 [N, E]; norm F32 [N]
    // weight; output [N + E].
    KILN_TRY(counts(5, 1));
    KILN_TRY(floats(in(0), "input"));
    Operand w = in(1);
    KILN_TRY(weight(w, "weight"));
    if (w.dims.size() != 2)
      return fail(
          fmt::format("weight '{}' must be a 2-D [K, N] matrix", w.name()));
    const int64_t k = w.dims[0], hidden = w.dims[1];
    if (in(0).buffer->shape.size() != 1 || in(0).elements() != uint64_t(k))
      return fail(fmt::format("input '{}' must be a vector of the weight's {} "
                              "values a row",
                              in(0).name(), k));
    KILN_TRY(floats(in(2), "residual"));
    if (in(2).buffer->shape.size() != 1 || in(2).elements() != uint64_t(hidden))
      return fail(fmt::format("residual '{}' must be a vector of the "
                              "weight's {} rows",
                              in(2).name(), hidden));
    Operand gate = in(3);
    KILN_TRY(weight(gate, "gate"));
    if (gate.binding->type != GGMLType::F32 || gate.dims.size() != 2 ||
        gate.dims[0] != hidden || gate.binding->sliceDim >= 0)
      return fail(fmt::format("gate '{}' must be a whole F32 [{}, experts] "
                              "weight",
                              gate.name(), hidden));
    // Its values go into the matrix made at load: a weight's, not a
    // buffer's.
    Operand norm = in(4);
    if (!norm.isWeight() || norm.binding->type != GGMLType::F32)
      return fail(fmt::format("norm '{}' must be an F32 weight (read at load)",
                              norm.name()));
    KILN_TRY(param(norm, uint64_t(hidden), "norm"));
    KILN_TRY(floats(out(0), "output"));
    if (out(0).elements() != uint64_t(hidden + gate.dims[1]))
      return fail(fmt::format("output '{}' must hold the {} rows and the "
                              "gate's {} experts",
                              out(0).name(), hidden, gate.dims[1]));
    KILN_ASSIGN(ranks, intAttr("ranks"));
    if (ranks != int64_t(ranks_) || hidden % ranks != 0)
      return fail(fmt::format("ranks {} must be the group's {} and divide the "
                              "{} rows",
                              ranks, ranks_, hidden));
    d_.rows = 1;
    d_.n = hidden;
    d_.k = k;
    d_.experts = gate.dims[1];
    d_.ranks = ranks;
    break;
  }
  case OpKind::MoeChoose: {
    const bool hasBias = d_.ins.size() == 2;
    KILN_TRY(counts(hasBias ? 2 : 1, 2));
    KILN_TRY(floats(in(0), "logits"));
    if (in(0).buffer->shape.size() != 1)
      return fail("logits must be a vector");
    const Operand bias = hasBias ? in(1) : Operand();
    KILN_TRY(choice(int64_t(in(0).elements()), hasBias ? &bias : nullptr));
    break;
  }
  case OpKind::MoeExperts: {
    // An addend, when there is one, is the buffer before the weights.
    d_.hasAddend = d_.ins.size() > 3 && !in(3).isWeight();
    const size_t first = d_.hasAddend ? 4 : 3;
    // The routed experts' weights are 3-D; 2-D weights after them are the
    // shared expert's (kiln-fuse-shared-expert).
    size_t end = first;
    while (end < d_.ins.size() && in(end).isWeight() &&
           in(end).dims.size() == 3)
      ++end;
    if (d_.outs.size() != 1 || (end - first != 2 && end - first != 3))
      return fail("expects input, ids, weights, an optional addend, 2 or 3 "
                  "expert weights [K, N, experts], an optional shared expert "
                  "and one output");
    d_.hasShared = end < d_.ins.size();
    if (d_.hasShared && d_.ins.size() - end != 3)
      return fail(fmt::format("the shared expert is (gate, up, down) 2-D "
                              "weights after the experts', got {} operands",
                              d_.ins.size() - end));
    if (d_.hasShared && d_.hasAddend)
      return fail("takes an addend or a shared expert, not both");
    KILN_TRY(floats(in(0), "input"));
    KILN_TRY(floats(in(2), "weights"));
    KILN_TRY(floats(out(0), "output"));
    if (d_.hasAddend) {
      KILN_TRY(floats(in(3), "addend"));
      KILN_TRY(same(in(3), out(0)));
    }
    uint64_t chosen = in(2).elements();
    KILN_TRY(ints(in(1), "ids", chosen));
    std::vector<Operand> experts;
    for (size_t i = first; i < end; ++i)
      experts.push_back(in(i));
    d_.fusedGateUp = experts.size() == 2;
    const Operand &down = experts.back();
    int64_t hidden = int64_t(in(0).elements());
    d_.ffn = down.dims[0];
    d_.experts = down.dims[2];
    if (out(0).elements() != uint64_t(hidden) || down.dims[1] != hidden)
      return fail(fmt::format("down '{}' is not [F, {}, E]", down.name(),
                              hidden));
    int64_t rows = d_.fusedGateUp ? 2 * d_.ffn : d_.ffn;
    for (size_t i = 0; i + 1 < experts.size(); ++i)
      if (experts[i].dims[0] != hidden || experts[i].dims[1] != rows ||
          experts[i].dims[2] != d_.experts)
        return fail(fmt::format("'{}' is not [{}, {}, {}]", experts[i].name(),
                                hidden, rows, d_.experts));
    if (d_.hasShared) {
      // Dims are ne[0] (a row's length) first: gate and up [hidden, F_s],
      // down [F_s, hidden], each this rank's part.
      d_.sharedIndex = end;
      Operand gate = in(end), up = in(end + 1), sharedDown = in(end + 2);
      for (const Operand &w : {gate, up, sharedDown})
        if (!w.isWeight() || w.dims.size() != 2)
          return fail(fmt::format("shared expert weight '{}' must be a 2-D "
                                  "weight",
                                  w.name()));
      d_.sharedFfn = gate.dims[1];
      for (const Operand &w : {gate, up})
        if (w.dims[0] != hidden || w.dims[1] != d_.sharedFfn)
          return fail(fmt::format("shared '{}' is not [{}, {}]", w.name(),
                                  hidden, d_.sharedFfn));
      if (sharedDown.dims[0] != d_.sharedFfn || sharedDown.dims[1] != hidden)
        return fail(fmt::format("shared down '{}' is not [{}, {}]",
                                sharedDown.name(), d_.sharedFfn, hidden));
    }
    d_.n = hidden;
    d_.topK = int64_t(chosen);
    break;
  }
  case OpKind::Argmax: {
    KILN_TRY(drawOperands());
    KILN_TRY(floats(in(0), "input"));
    KILN_TRY(ints(out(0), "output", 1));
    d_.n = int64_t(in(0).elements());
    break;
  }
  }
  return std::move(d_);
}

} // namespace

bool isOpKindName(std::string_view name) {
  return kinds().find(name) != kinds().end();
}

Expected<StepOp> decodeOp(const Artifact &artifact, const Step &step,
                          size_t index, uint32_t ranks) {
  return Decoder(artifact, step, step.ops[index], index, ranks).decode();
}

Expected<std::vector<StepOp>> decodeStep(const Artifact &artifact,
                                         const Step &step, uint32_t ranks) {
  std::vector<StepOp> ops;
  ops.reserve(step.ops.size());
  for (size_t i = 0; i < step.ops.size(); ++i) {
    Expected<StepOp> op = decodeOp(artifact, step, i, ranks);
    if (!op)
      return op.error();
    ops.push_back(std::move(*op));
  }
  return ops;
}

std::vector<bool> firstInputsOwned(const Step &step,
                                   const std::vector<StepOp> &ops,
                                   const std::vector<int32_t> &calls) {
  const size_t nb = step.buffers.size();
  auto known = [&](int32_t b) { return b >= 0 && size_t(b) < nb; };
  // Each buffer's writers, readers and last writer, and whether a view
  // (of it, or of a view of it) aliases it.
  std::vector<int32_t> writes(nb, 0), reads(nb, 0), producer(nb, -1);
  std::vector<bool> viewed(nb, false);
  for (size_t i = 0; i < nb; ++i) {
    const Buffer *v = &step.buffers[i];
    for (int hops = 0;
         v->kind == BufferKind::View && known(v->base) && hops < int(nb);
         ++hops) {
      viewed[size_t(v->base)] = true;
      v = &step.buffers[size_t(v->base)];
    }
  }
  for (size_t o = 0; o < ops.size(); ++o) {
    for (int32_t b : ops[o].ins)
      if (known(b))
        ++reads[size_t(b)];
    for (int32_t b : ops[o].outs)
      if (known(b)) {
        ++writes[size_t(b)];
        producer[size_t(b)] = int32_t(o);
      }
  }
  std::vector<bool> owned(calls.size(), false);
  for (size_t c = 0; c < calls.size(); ++c) {
    const int32_t o = calls[c];
    if (o < 0 || size_t(o) >= ops.size() || ops[size_t(o)].ins.empty())
      continue;
    const StepOp &call = ops[size_t(o)];
    const int32_t x = call.ins[0];
    if (!known(x))
      continue;
    const int32_t p = producer[size_t(x)];
    owned[c] = step.buffers[size_t(x)].kind == BufferKind::Arena &&
               !viewed[size_t(x)] && writes[size_t(x)] == 1 &&
               reads[size_t(x)] == 1 && p >= 0 && p < o &&
               std::count(ops[size_t(p)].ins.begin(), ops[size_t(p)].ins.end(),
                          x) == 0;
  }
  return owned;
}

} // namespace kiln::backend
