//===- Artifact.cpp - Reading, checking and writing .kiln files ------------===//
//
// Untrusted input: a .kiln file may be truncated, corrupted or from another
// version. The header is checked first (size, magic, version, checksum),
// then the FlatBuffer with flatbuffers::Verifier, then every cross-reference
// with checked arithmetic. Nothing is returned half-checked.
//
//===----------------------------------------------------------------------===//
#include "artifact/Artifact.h"

#include "artifact/Artifact_generated.h"
#include "support/AtomicFile.h"
#include "support/CheckedMath.h"
#include "support/Random.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <set>
#include <type_traits>

namespace kiln::artifact {

namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'A', 'R', 'T', '\0'};

void putU32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    p[i] = uint8_t(v >> (8 * i));
}
void putU64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    p[i] = uint8_t(v >> (8 * i));
}
uint32_t getU32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}
uint64_t getU64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}

std::string str(const flatbuffers::String *s) {
  return s ? std::string(s->string_view()) : std::string();
}

/// A vector of scalars, element by element through memcpy: the verifier
/// checks the alignment of a vector's length field, not of its 8-byte
/// elements, so a damaged file may misalign an int64 vector (found by the
/// artifact fuzzer; test/fuzz/artifact-regressions).
template <typename T>
std::vector<T> vec(const flatbuffers::Vector<T> *v) {
  static_assert(std::is_scalar_v<T>, "vec reads vectors of scalars");
  std::vector<T> out;
  if (!v)
    return out;
  if constexpr (sizeof(T) == 1)
    return std::vector<T>(v->begin(), v->end());
  out.resize(v->size());
  const uint8_t *p = v->Data();
  for (size_t i = 0; i < out.size(); ++i) {
    T value;
    std::memcpy(&value, p + i * sizeof(T), sizeof(T));
    out[i] = flatbuffers::EndianScalar(value);
  }
  return out;
}

} // namespace

std::string_view nameOf(DType type) {
  switch (type) {
  case DType::F32: return "f32";
  case DType::F16: return "f16";
  case DType::BF16: return "bf16";
  case DType::I32: return "i32";
  }
  return "?";
}

std::string_view nameOf(BufferKind kind) {
  switch (kind) {
  case BufferKind::Arena: return "arena";
  case BufferKind::View: return "view";
  case BufferKind::Weight: return "weight";
  case BufferKind::State: return "state";
  case BufferKind::Input: return "input";
  case BufferKind::Output: return "output";
  }
  return "?";
}

uint64_t elementBytes(DType type) {
  return type == DType::F16 || type == DType::BF16 ? 2 : 4;
}

uint64_t Buffer::elements() const {
  uint64_t n = 1;
  for (int64_t d : shape)
    n *= static_cast<uint64_t>(d);
  return n;
}

const Attr *Op::attr(std::string_view name) const {
  for (const Attr &a : attrs)
    if (a.name == name)
      return &a;
  return nullptr;
}

std::optional<int32_t> Step::slot(BufferKind kind, std::string_view name) const {
  for (size_t i = 0; i < buffers.size(); ++i)
    if (buffers[i].kind == kind && buffers[i].name == name)
      return static_cast<int32_t>(i);
  return std::nullopt;
}

const Step *RankPlan::step(std::string_view name) const {
  for (const Step &s : steps)
    if (s.name == name)
      return &s;
  return nullptr;
}

const ConfigEntry *Artifact::configEntry(std::string_view key) const {
  for (const ConfigEntry &e : config)
    if (e.key == key)
      return &e;
  return nullptr;
}

uint64_t checksum(std::span<const uint8_t> bytes) {
  return fnv1a(std::string_view(reinterpret_cast<const char *>(bytes.data()),
                                bytes.size()));
}

//===----------------------------------------------------------------------===//
// Validation
//===----------------------------------------------------------------------===//

static Status validateStep(const Step &step, const Artifact &artifact,
                           const std::string &where, const std::string &at) {
  auto fail = [&](const std::string &field, const std::string &problem) {
    return Status(Error(where, at + field, problem));
  };
  if (step.name.empty())
    return fail("name", "is empty");
  if (step.alignment == 0 || (step.alignment & (step.alignment - 1)) != 0)
    return fail("alignment", fmt::format("{} is not a power of two",
                                         step.alignment));
  std::set<std::pair<int, std::string>> slots;
  for (size_t i = 0; i < step.buffers.size(); ++i) {
    const Buffer &b = step.buffers[i];
    std::string field = fmt::format("buffers[{}] ({})", i, b.name);
    if (b.name.empty())
      return fail(field, "has no name");
    if (static_cast<uint8_t>(b.kind) > 5 || static_cast<uint8_t>(b.dtype) > 3)
      return fail(field, "has an unknown kind or element type");
    if (b.kind == BufferKind::Weight) {
      if (b.binding < 0 ||
          static_cast<size_t>(b.binding) >= artifact.weights.size())
        return fail(field, fmt::format("binding {} is not one of the {} "
                                       "weight bindings",
                                       b.binding, artifact.weights.size()));
      continue;
    }
    if (b.shape.size() > 8)
      return fail(field, "has more than 8 dimensions");
    uint64_t elements = 1;
    for (int64_t d : b.shape) {
      std::optional<uint64_t> n =
          d > 0 ? checkedMul(elements, static_cast<uint64_t>(d)) : std::nullopt;
      if (!n || *n > (uint64_t(1) << 40))
        return fail(field, "has a non-positive or too large dimension");
      elements = *n;
    }
    uint64_t bytes = elements * elementBytes(b.dtype);
    switch (b.kind) {
    case BufferKind::Arena: {
      std::optional<uint64_t> end =
          b.offset >= 0 ? checkedAdd(uint64_t(b.offset), bytes) : std::nullopt;
      if (!end || *end > step.arenaBytes)
        return fail(field, fmt::format("bytes [{}, +{}) are not inside the "
                                       "arena of {} bytes",
                                       b.offset, bytes, step.arenaBytes));
      if (uint64_t(b.offset) % step.alignment != 0)
        return fail(field, fmt::format("offset {} is not aligned to {}",
                                       b.offset, step.alignment));
      break;
    }
    case BufferKind::View: {
      if (b.base < 0 || static_cast<size_t>(b.base) >= i)
        return fail(field, fmt::format("views buffer {}, which is not an "
                                       "earlier buffer",
                                       b.base));
      const Buffer &base = step.buffers[b.base];
      if (base.kind == BufferKind::Weight || base.dtype != b.dtype)
        return fail(field, "views a weight or a buffer of another type");
      std::optional<uint64_t> end =
          b.offset >= 0 ? checkedAdd(uint64_t(b.offset), elements)
                        : std::nullopt;
      if (!end || *end > base.elements())
        return fail(field, fmt::format("elements [{}, +{}) are not inside "
                                       "its base's {}",
                                       b.offset, elements, base.elements()));
      break;
    }
    case BufferKind::State:
      if (b.shape.size() != 2 || b.dtype == DType::I32)
        return fail(field, "a state is a [positions x width] float buffer");
      if (uint64_t(b.shape[0]) != artifact.contextLength)
        return fail(field, fmt::format("holds {} positions but the context "
                                       "length is {}",
                                       b.shape[0], artifact.contextLength));
      break;
    case BufferKind::Input:
    case BufferKind::Output:
      if (!slots.insert({int(b.kind), b.name}).second)
        return fail(field, "names a slot twice");
      break;
    case BufferKind::Weight:
      break;
    }
  }
  for (size_t i = 0; i < step.ops.size(); ++i) {
    const Op &op = step.ops[i];
    std::string field = fmt::format("ops[{}] ({})", i, op.kind);
    if (op.kind.empty())
      return fail(field, "has no kind");
    if (op.numOuts > op.operands.size())
      return fail(field, "has more outputs than operands");
    for (int32_t v : op.operands)
      if (v < 0 || static_cast<size_t>(v) >= step.buffers.size())
        return fail(field, fmt::format("operand {} is not one of the {} "
                                       "buffers",
                                       v, step.buffers.size()));
    for (int32_t v : op.outs()) {
      BufferKind k = step.buffers[v].kind;
      if (k == BufferKind::Weight || k == BufferKind::Input)
        return fail(field, fmt::format("writes {} buffer '{}'",
                                       nameOf(k), step.buffers[v].name));
    }
  }
  return Status::ok();
}

/// A binding's dims with the sliced dim cut to (sliceEnd - sliceBegin) *
/// sliceGroups, before any row cut.
static std::vector<int64_t> slicedDims(const WeightBinding &b) {
  std::vector<int64_t> dims = b.dims;
  if (b.sliceDim >= 0 && size_t(b.sliceDim) < dims.size())
    dims[size_t(b.sliceDim)] = (b.sliceEnd - b.sliceBegin) * b.sliceGroups;
  return dims;
}

std::vector<int64_t> localDims(const WeightBinding &b) {
  std::vector<int64_t> dims = slicedDims(b);
  if (b.rowPeriod > 0 && dims.size() >= 2)
    dims[1] = dims[1] / b.rowPeriod * (b.rowEnd - b.rowBegin);
  return dims;
}

int64_t fileIndex(const WeightBinding &b, size_t d, int64_t i) {
  if (d == 1 && b.rowPeriod > 0) {
    const int64_t cut = b.rowEnd - b.rowBegin;
    i = i / cut * b.rowPeriod + b.rowBegin + i % cut;
  }
  if (b.sliceDim >= 0 && d == size_t(b.sliceDim)) {
    const int64_t cut = b.sliceEnd - b.sliceBegin;
    i = i / cut * (b.dims[d] / b.sliceGroups) + b.sliceBegin + i % cut;
  }
  return i;
}

Status validate(const Artifact &a, const std::string &where) {
  if (a.target.empty())
    return Error(where, "target", "is empty");
  if (a.ranks == 0 || a.ranks > 1024 || a.rankPlans.size() != a.ranks)
    return Error(where, "rank_plans",
                 fmt::format("{} plans for {} ranks", a.rankPlans.size(),
                             a.ranks));
  for (size_t i = 0; i < a.weights.size(); ++i) {
    const WeightBinding &w = a.weights[i];
    std::string field = fmt::format("weights[{}] ({})", i, w.tensor);
    if (w.tensor.empty())
      return Error(where, field, "has no tensor name");
    if (!lookupGGMLType(static_cast<uint32_t>(w.type)))
      return Error(where, field, "has an unknown ggml type");
    if (w.dims.empty() || w.dims.size() > 4 ||
        std::any_of(w.dims.begin(), w.dims.end(),
                    [](int64_t d) { return d <= 0; }))
      return Error(where, field, "needs 1 to 4 positive dims");
    if (w.sliceGroups < 1 || (w.sliceGroups > 1 && w.sliceDim < 0))
      return Error(where, field, "has a bad slice group count");
    if (w.sliceDim >= 0 &&
        (static_cast<size_t>(w.sliceDim) >= w.dims.size() ||
         w.dims[w.sliceDim] % w.sliceGroups != 0 || w.sliceBegin < 0 ||
         w.sliceEnd <= w.sliceBegin ||
         w.sliceEnd > w.dims[w.sliceDim] / w.sliceGroups))
      return Error(where, field, "has a slice outside its dims");
    if (w.rowPeriod != 0) {
      // Dim 1 after the slice: whole periods, each cut inside itself.
      const int64_t rows = w.dims.size() < 2 ? 0 : slicedDims(w)[1];
      if (rows == 0 || w.rowPeriod < 0 || rows % w.rowPeriod != 0 ||
          w.rowBegin < 0 || w.rowEnd <= w.rowBegin || w.rowEnd > w.rowPeriod)
        return Error(where, field,
                     fmt::format("has rows {} to {} of every {}, not a cut "
                                 "of whole periods of its {} rows",
                                 w.rowBegin, w.rowEnd, w.rowPeriod, rows));
    }
  }
  for (size_t r = 0; r < a.rankPlans.size(); ++r) {
    const RankPlan &plan = a.rankPlans[r];
    if (plan.rank != r)
      return Error(where, fmt::format("rank_plans[{}]", r),
                   fmt::format("is for rank {}", plan.rank));
    std::set<std::string> names;
    for (size_t s = 0; s < plan.steps.size(); ++s) {
      if (!names.insert(plan.steps[s].name).second)
        return Error(where, fmt::format("rank_plans[{}].steps[{}]", r, s),
                     "repeats a step name");
      if (Status st = validateStep(
              plan.steps[s], a, where,
              fmt::format("rank_plans[{}].steps[{}].", r, s));
          !st)
        return st;
    }
  }
  return Status::ok();
}

//===----------------------------------------------------------------------===//
// Serialisation
//===----------------------------------------------------------------------===//

Expected<std::vector<uint8_t>> serialize(const Artifact &a) {
  if (Status st = validate(a, "artifact"); !st)
    return st.error();
  flatbuffers::FlatBufferBuilder fbb(1 << 16);
  auto s = [&](const std::string &v) { return fbb.CreateString(v); };

  std::vector<flatbuffers::Offset<fb::ConfigEntry>> config;
  for (const ConfigEntry &e : a.config)
    config.push_back(fb::CreateConfigEntry(fbb, s(e.key), e.isFloat,
                                           e.intValue, e.floatValue));
  std::vector<flatbuffers::Offset<fb::WeightBinding>> weights;
  for (const WeightBinding &w : a.weights)
    weights.push_back(fb::CreateWeightBinding(
        fbb, s(w.tensor), static_cast<uint32_t>(w.type),
        fbb.CreateVector(w.dims), w.sliceDim, w.sliceBegin, w.sliceEnd,
        s(w.layout), w.sliceGroups, w.rowPeriod, w.rowBegin, w.rowEnd));
  std::vector<flatbuffers::Offset<fb::RankPlan>> plans;
  for (const RankPlan &plan : a.rankPlans) {
    std::vector<flatbuffers::Offset<fb::Step>> steps;
    for (const Step &step : plan.steps) {
      std::vector<flatbuffers::Offset<fb::Buffer>> buffers;
      for (const Buffer &b : step.buffers)
        buffers.push_back(fb::CreateBuffer(
            fbb, s(b.name), static_cast<fb::BufferKind>(b.kind),
            static_cast<fb::DType>(b.dtype), fbb.CreateVector(b.shape),
            b.offset, b.base, b.binding));
      std::vector<flatbuffers::Offset<fb::Op>> ops;
      for (const Op &op : step.ops) {
        std::vector<flatbuffers::Offset<fb::Attr>> attrs;
        for (const Attr &at : op.attrs)
          attrs.push_back(fb::CreateAttr(
              fbb, s(at.name), static_cast<fb::AttrKind>(at.kind),
              at.intValue, at.floatValue, s(at.stringValue),
              fbb.CreateVector(at.ints)));
        ops.push_back(fb::CreateOp(fbb, s(op.kind),
                                   fbb.CreateVector(op.operands), op.numOuts,
                                   fbb.CreateVector(attrs)));
      }
      steps.push_back(fb::CreateStep(
          fbb, s(step.name), step.arenaBytes, step.alignment,
          step.peakLiveBytes, fbb.CreateVector(buffers),
          fbb.CreateVector(ops)));
    }
    plans.push_back(
        fb::CreateRankPlan(fbb, plan.rank, fbb.CreateVector(steps)));
  }
  std::vector<flatbuffers::Offset<fb::Payload>> payloads;
  for (const Payload &p : a.payloads)
    payloads.push_back(fb::CreatePayload(fbb, s(p.backend), s(p.name),
                                         fbb.CreateVector(p.data)));
  auto root = fb::CreateArtifact(
      fbb, s(a.producer), s(a.target), s(a.modelArch),
      fbb.CreateVector(config), a.contextLength, a.ranks,
      fbb.CreateVector(plans), fbb.CreateVector(weights),
      fbb.CreateVector(payloads));
  fb::FinishArtifactBuffer(fbb, root);

  std::span<const uint8_t> payload(fbb.GetBufferPointer(), fbb.GetSize());
  std::vector<uint8_t> out(kHeaderBytes + payload.size());
  std::memcpy(out.data(), kMagic, 8);
  putU32(out.data() + 8, kFormatVersion);
  putU32(out.data() + 12, static_cast<uint32_t>(kHeaderBytes));
  putU64(out.data() + 16, payload.size());
  putU64(out.data() + 24, checksum(payload));
  std::memcpy(out.data() + kHeaderBytes, payload.data(), payload.size());
  return out;
}

Status writeArtifact(const Artifact &artifact, const std::string &path) {
  Expected<std::vector<uint8_t>> bytes = serialize(artifact);
  if (!bytes)
    return bytes.error().withWhere(path);
  AtomicFile file;
  if (Status st = file.create(path); !st)
    return st;
  if (Status st = file.writeAt(bytes->data(), bytes->size(), 0); !st)
    return st;
  return file.commit();
}

//===----------------------------------------------------------------------===//
// Deserialisation
//===----------------------------------------------------------------------===//

Expected<Artifact> parseArtifact(std::span<const uint8_t> bytes,
                                 const std::string &where) {
  if (bytes.size() < kHeaderBytes)
    return Error(where, "header",
                 fmt::format("the file has {} bytes, fewer than the {}-byte "
                             "header: truncated or not an artifact",
                             bytes.size(), kHeaderBytes));
  if (std::memcmp(bytes.data(), kMagic, 8) != 0)
    return Error(where, "magic", "not a Kiln artifact (.kiln)");
  uint32_t version = getU32(bytes.data() + 8);
  if (version != kFormatVersion)
    return Error(where, "format version",
                 fmt::format("the file is format version {}; this build "
                             "reads version {} (recompile the model with "
                             "this kiln-compile)",
                             version, kFormatVersion));
  if (getU32(bytes.data() + 12) != kHeaderBytes)
    return Error(where, "header size", "is not 32 bytes");
  uint64_t payloadBytes = getU64(bytes.data() + 16);
  if (payloadBytes != bytes.size() - kHeaderBytes)
    return Error(where, "payload size",
                 fmt::format("the header announces {} bytes of payload but "
                             "the file holds {}: {}",
                             payloadBytes, bytes.size() - kHeaderBytes,
                             payloadBytes > bytes.size() - kHeaderBytes
                                 ? "truncated"
                                 : "trailing bytes"));
  std::span<const uint8_t> payload = bytes.subspan(kHeaderBytes);
  uint64_t expected = getU64(bytes.data() + 24);
  if (checksum(payload) != expected)
    return Error(where, "checksum",
                 "does not match the contents: the artifact is corrupt");

  flatbuffers::Verifier verifier(payload.data(), payload.size());
  if (!fb::VerifyArtifactBuffer(verifier))
    return Error(where, "contents",
                 "the FlatBuffer does not verify (malformed artifact)");
  const fb::Artifact *root = fb::GetArtifact(payload.data());

  Artifact a;
  a.producer = str(root->producer());
  a.target = str(root->target());
  a.modelArch = str(root->model_arch());
  a.contextLength = root->context_length();
  a.ranks = root->ranks();
  if (root->config())
    for (const fb::ConfigEntry *e : *root->config())
      a.config.push_back({str(e->key()), e->is_float(), e->int_value(),
                          e->float_value()});
  if (root->weights())
    for (const fb::WeightBinding *w : *root->weights()) {
      WeightBinding b;
      b.tensor = str(w->tensor());
      b.type = static_cast<GGMLType>(w->ggml_type());
      b.dims = vec(w->dims());
      b.sliceDim = w->slice_dim();
      b.sliceBegin = w->slice_begin();
      b.sliceEnd = w->slice_end();
      b.layout = str(w->layout());
      b.sliceGroups = w->slice_groups();
      b.rowPeriod = w->row_period();
      b.rowBegin = w->row_begin();
      b.rowEnd = w->row_end();
      a.weights.push_back(std::move(b));
    }
  if (root->rank_plans())
    for (const fb::RankPlan *p : *root->rank_plans()) {
      RankPlan plan;
      plan.rank = p->rank();
      if (p->steps())
        for (const fb::Step *st : *p->steps()) {
          Step step;
          step.name = str(st->name());
          step.arenaBytes = st->arena_bytes();
          step.alignment = st->alignment();
          step.peakLiveBytes = st->peak_live_bytes();
          if (st->buffers())
            for (const fb::Buffer *b : *st->buffers())
              step.buffers.push_back(
                  {str(b->name()), static_cast<BufferKind>(b->kind()),
                   static_cast<DType>(b->dtype()), vec(b->shape()),
                   b->offset(), b->base(), b->binding()});
          if (st->ops())
            for (const fb::Op *o : *st->ops()) {
              Op op;
              op.kind = str(o->kind());
              op.operands = vec(o->operands());
              op.numOuts = o->num_outs();
              if (o->attrs())
                for (const fb::Attr *at : *o->attrs())
                  op.attrs.push_back({str(at->name()),
                                      static_cast<AttrKind>(at->kind()),
                                      at->int_value(), at->float_value(),
                                      str(at->string_value()),
                                      vec(at->ints())});
              step.ops.push_back(std::move(op));
            }
          plan.steps.push_back(std::move(step));
        }
      a.rankPlans.push_back(std::move(plan));
    }
  if (root->payloads())
    for (const fb::Payload *p : *root->payloads())
      a.payloads.push_back(
          {str(p->backend()), str(p->name()), vec(p->data())});
  if (Status st = validate(a, where); !st)
    return st.error();
  return a;
}

Expected<Artifact> readArtifact(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return Error(path, "", "cannot open the artifact");
  in.seekg(0, std::ios::end);
  std::streamoff size = in.tellg();
  if (size < 0 || uint64_t(size) > (uint64_t(1) << 34))
    return Error(path, "", "cannot read its size, or it exceeds 16 GiB");
  in.seekg(0);
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  if (!in.read(reinterpret_cast<char *>(bytes.data()), size))
    return Error(path, "", "read failed");
  return parseArtifact(bytes, path);
}

} // namespace kiln::artifact
