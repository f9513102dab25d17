//===- GLM5Spec.cpp - Presets, mixes and the tensor list of GLM-5 ----------===//
#include "synth/GLM5Spec.h"

#include "support/CheckedMath.h"

#include <fmt/core.h>

#include <charconv>
#include <limits>

namespace kiln::synth {
namespace {

/// Dimension fields addressable by name from the command line.
struct DimField {
  std::string_view name;
  uint64_t GLM5Dims::*field;
};

constexpr DimField kDimFields[] = {
    {"hidden", &GLM5Dims::hidden},
    {"layers", &GLM5Dims::layers},
    {"mtp-layers", &GLM5Dims::mtpLayers},
    {"dense-layers", &GLM5Dims::leadingDense},
    {"vocab", &GLM5Dims::vocab},
    {"dense-ff", &GLM5Dims::denseFF},
    {"expert-ff", &GLM5Dims::expertFF},
    {"experts", &GLM5Dims::experts},
    {"experts-used", &GLM5Dims::expertsUsed},
    {"shared-experts", &GLM5Dims::sharedExperts},
    {"heads", &GLM5Dims::heads},
    {"q-lora-rank", &GLM5Dims::qLoraRank},
    {"kv-lora-rank", &GLM5Dims::kvLoraRank},
    {"qk-nope-dim", &GLM5Dims::qkNopeDim},
    {"qk-rope-dim", &GLM5Dims::qkRopeDim},
    {"v-head-dim", &GLM5Dims::vHeadDim},
    {"indexer-heads", &GLM5Dims::indexerHeads},
    {"indexer-dim", &GLM5Dims::indexerDim},
    {"indexer-top-k", &GLM5Dims::indexerTopK},
    {"context", &GLM5Dims::contextLength},
};

// A dimension larger than this is a typo, not a model (GLM-5's largest is
// the vocabulary, 154880; the context is 202752).
constexpr uint64_t kMaxDim = uint64_t(1) << 24;

} // namespace

Expected<GLM5Dims> presetDims(std::string_view name) {
  GLM5Dims d; // The real GLM-5.
  if (name == "glm5")
    return d;
  if (name == "tiny") {
    // Every dimension small; widths chosen so that at tp = 1, 2, 4, 8 each
    // row-parallel slice (ne[0] / tp) is a whole number of 32-value blocks.
    d.hidden = 256;
    d.layers = 4;
    d.mtpLayers = 1;
    d.leadingDense = 1;
    d.vocab = 1024;
    d.denseFF = 512;
    d.expertFF = 256;
    d.experts = 16;
    d.expertsUsed = 4;
    d.sharedExperts = 1;
    d.heads = 8;
    d.qLoraRank = 128;
    d.kvLoraRank = 64;
    d.qkNopeDim = 32;
    d.qkRopeDim = 16;
    d.vHeadDim = 32;
    d.indexerHeads = 4;
    d.indexerDim = 32;
    d.indexerTopK = 32;
    d.contextLength = 4096;
    return d;
  }
  if (name == "small") {
    // GLM-5's head geometry with fewer heads, layers and experts; FFN widths
    // are multiples of 8 x 256, so K-quant slices stay aligned at tp = 8.
    d.hidden = 1024;
    d.layers = 4;
    d.mtpLayers = 1;
    d.leadingDense = 1;
    d.vocab = 4096;
    d.denseFF = 2048;
    d.expertFF = 2048;
    d.experts = 32;
    d.expertsUsed = 8;
    d.sharedExperts = 1;
    d.heads = 16;
    d.qLoraRank = 512;
    d.kvLoraRank = 512;
    d.indexerHeads = 8;
    d.indexerTopK = 256;
    d.contextLength = 16384;
    return d;
  }
  return Error("", "--preset",
               fmt::format("unknown preset '{}' (tiny, small, glm5)", name));
}

std::vector<std::string_view> dimNames() {
  std::vector<std::string_view> names;
  for (const DimField &f : kDimFields)
    names.push_back(f.name);
  return names;
}

Status overrideDim(GLM5Dims &dims, std::string_view name,
                   std::string_view value) {
  for (const DimField &f : kDimFields) {
    if (f.name != name)
      continue;
    uint64_t v = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || end != value.data() + value.size())
      return Error("", fmt::format("--{}", name),
                   fmt::format("not a non-negative integer: '{}'", value));
    if (v > kMaxDim)
      return Error("", fmt::format("--{}", name),
                   fmt::format("{} is larger than {}", v, kMaxDim));
    dims.*f.field = v;
    return Status::ok();
  }
  return Error("", fmt::format("--{}", name), "unknown dimension");
}

Status validateDims(const GLM5Dims &d) {
  auto bad = [](std::string_view dim, std::string problem) {
    return Status(Error("", fmt::format("--{}", dim), std::move(problem)));
  };
  for (const DimField &f : kDimFields) {
    if (f.name == "mtp-layers" || f.name == "dense-layers")
      continue; // May be zero.
    if (d.*f.field == 0)
      return bad(f.name, "must be positive");
  }
  if (d.expertsUsed > d.experts)
    return bad("experts-used", fmt::format("{} is more than the {} experts",
                                           d.expertsUsed, d.experts));
  if (d.leadingDense > d.layers)
    return bad("dense-layers", fmt::format("{} is more than the {} layers",
                                           d.leadingDense, d.layers));
  if (d.qkRopeDim % 2)
    return bad("qk-rope-dim", "must be even (rope rotates pairs)");
  if (d.qkRopeDim > d.indexerDim)
    return bad("indexer-dim",
               fmt::format("{} is smaller than the {} rope dims it carries",
                           d.indexerDim, d.qkRopeDim));
  // The synthetic tokenizer needs the 256 byte tokens and its special tokens.
  if (d.vocab < 512)
    return bad("vocab", fmt::format("{} is below 512, too small for the "
                                    "byte-level tokenizer",
                                    d.vocab));
  // Every product that becomes a tensor dim must fit comfortably.
  if (!checkedMul(d.heads, d.qkNopeDim + d.qkRopeDim) ||
      !checkedMul(d.heads, d.vHeadDim) ||
      !checkedMul(d.indexerHeads, d.indexerDim) ||
      !checkedMul(d.expertFF, d.sharedExperts))
    return bad("heads", "dimension products overflow");
  return Status::ok();
}

//===----------------------------------------------------------------------===//
// Mixes
//===----------------------------------------------------------------------===//

std::vector<std::string_view> mixNames() {
  return {"f32", "f16", "q8_0", "tiny", "ud-q4_k_xl", "ud-q2_k_xl"};
}

Expected<Mix> namedMix(std::string_view name) {
  Mix mix;
  mix.name = std::string(name);
  if (name == "f32") {
    mix.defaultMatrix = GGMLType::F32;
    return mix;
  }
  if (name == "f16") {
    mix.defaultMatrix = GGMLType::F16;
    return mix;
  }
  if (name == "q8_0") {
    mix.defaultMatrix = GGMLType::Q8_0;
    return mix;
  }
  if (name == "tiny") {
    // Many formats in one small model, and every row-parallel tensor
    // (attn_output, *down*) block-32 so tp = 8 slices of the tiny preset
    // stay whole blocks.
    mix.defaultMatrix = GGMLType::Q8_0;
    mix.byRole = {{"output", GGMLType::Q6_K},
                  {"ffn_gate", GGMLType::Q4_K},
                  {"ffn_up", GGMLType::Q4_K},
                  {"ffn_gate_exps", GGMLType::Q4_K},
                  {"ffn_up_exps", GGMLType::Q4_K},
                  {"ffn_gate_up_exps", GGMLType::Q4_K},
                  {"ffn_gate_shexp", GGMLType::Q5_K},
                  {"ffn_up_shexp", GGMLType::Q5_K},
                  {"indexer.attn_q_b", GGMLType::F16},
                  {"indexer.attn_k", GGMLType::F16},
                  {"indexer.proj", GGMLType::F32},
                  {"nextn.eh_proj", GGMLType::BF16}};
    return mix;
  }
  if (name == "ud-q4_k_xl") {
    // Like the dynamic 4-bit mixes published for GLM-5: 4-bit routed
    // experts, higher precision for down projections and the output head,
    // Q8_0 for attention and the other small matrices.
    mix.defaultMatrix = GGMLType::Q8_0;
    mix.byRole = {{"token_embd", GGMLType::Q4_K},
                  {"output", GGMLType::Q6_K},
                  {"ffn_gate", GGMLType::Q5_K},
                  {"ffn_up", GGMLType::Q5_K},
                  {"ffn_down", GGMLType::Q6_K},
                  {"ffn_gate_exps", GGMLType::Q4_K},
                  {"ffn_up_exps", GGMLType::Q4_K},
                  {"ffn_gate_up_exps", GGMLType::Q4_K},
                  {"ffn_down_exps", GGMLType::Q5_K},
                  {"indexer.proj", GGMLType::F32}};
    return mix;
  }
  if (name == "ud-q2_k_xl") {
    // The low-bit twin of ud-q4_k_xl, as the dynamic 2-bit mixes published
    // for GLM-5 lower only the routed experts (nearly all of the bytes):
    // Q2_K gate/up, Q3_K down; everything else as in ud-q4_k_xl.
    Expected<Mix> base = namedMix("ud-q4_k_xl");
    if (!base)
      return base.error();
    mix.defaultMatrix = base->defaultMatrix;
    mix.byRole = base->byRole;
    mix.byRole["ffn_gate_exps"] = GGMLType::Q2_K;
    mix.byRole["ffn_up_exps"] = GGMLType::Q2_K;
    mix.byRole["ffn_gate_up_exps"] = GGMLType::Q2_K;
    mix.byRole["ffn_down_exps"] = GGMLType::Q3_K;
    return mix;
  }
  return Error(
      "", "--mix",
      fmt::format("unknown mix '{}' (f32, f16, q8_0, tiny, ud-q4_k_xl, "
                  "ud-q2_k_xl)",
                  name));
}

Status overrideMixRole(Mix &mix, std::string_view assignment) {
  size_t eq = assignment.find('=');
  if (eq == std::string_view::npos || eq == 0 || eq + 1 == assignment.size())
    return Error("", "--type",
                 fmt::format("expected ROLE=TYPE, got '{}'", assignment));
  std::string_view role = assignment.substr(0, eq);
  std::string_view typeName = assignment.substr(eq + 1);
  std::optional<GGMLType> type = parseGGMLType(typeName);
  if (!type)
    return Error("", "--type", fmt::format("unknown type '{}'", typeName));
  mix.byRole[std::string(role)] = *type;
  return Status::ok();
}

Expected<TensorSize> sizeOf(const SynthTensor &t) {
  TensorSize size{1, 0};
  for (uint64_t d : t.dims) {
    auto e = checkedMul(size.elements, d);
    if (!e)
      return Error("", t.name, "element count overflows");
    size.elements = *e;
  }
  auto bytes = rowBytes(t.type, size.elements);
  if (!bytes)
    return Error("", t.name, "size is not a whole number of blocks");
  size.bytes = *bytes;
  return size;
}

std::string roleOf(std::string_view name) {
  if (name.starts_with("blk.")) {
    size_t dot = name.find('.', 4);
    if (dot != std::string_view::npos)
      name = name.substr(dot + 1);
  }
  for (std::string_view suffix : {".weight", ".bias"})
    if (name.ends_with(suffix)) {
      name.remove_suffix(suffix.size());
      break;
    }
  return std::string(name);
}

//===----------------------------------------------------------------------===//
// The tensor list
//===----------------------------------------------------------------------===//

namespace {

/// Collects tensors, giving each weight its mix type and checking that the
/// type's block divides ne[0].
class TensorListBuilder {
public:
  explicit TensorListBuilder(const Mix &mix) : mix_(mix) {}

  /// A weight matrix (or stack of them) whose type comes from the mix.
  void matrix(std::string name, std::vector<uint64_t> dims,
              InitKind init = InitKind::Projection) {
    auto it = mix_.byRole.find(roleOf(name));
    GGMLType type = it != mix_.byRole.end() ? it->second : mix_.defaultMatrix;
    add(std::move(name), type, std::move(dims), init);
  }

  /// Always-F32 tensors: norms, biases, the router.
  void f32(std::string name, std::vector<uint64_t> dims, InitKind init) {
    add(std::move(name), GGMLType::F32, std::move(dims), init);
  }

  Expected<std::vector<SynthTensor>> take() {
    if (error_)
      return *error_;
    return std::move(tensors_);
  }

private:
  void add(std::string name, GGMLType type, std::vector<uint64_t> dims,
           InitKind init) {
    if (error_)
      return;
    const GGMLTypeTraits &t = traitsOf(type);
    if (dims[0] % t.blockSize != 0) {
      error_ = Error("", name,
                     fmt::format("ne[0] = {} is not a multiple of {}'s block of "
                                 "{} values; choose another type with --type {}=TYPE",
                                 dims[0], t.name, t.blockSize, roleOf(name)));
      return;
    }
    tensors_.push_back({std::move(name), type, std::move(dims), init});
  }

  const Mix &mix_;
  std::vector<SynthTensor> tensors_;
  std::optional<Error> error_;
};

void addBlock(TensorListBuilder &b, const GLM5Dims &d,
              const LayoutOptions &layout, uint64_t layer, bool isMtp) {
  auto n = [&](std::string_view what) {
    return fmt::format("blk.{}.{}", layer, what);
  };
  const uint64_t qHead = d.qkNopeDim + d.qkRopeDim;
  b.f32(n("attn_norm.weight"), {d.hidden}, InitKind::NormWeight);
  b.matrix(n("attn_q_a.weight"), {d.hidden, d.qLoraRank});
  b.f32(n("attn_q_a_norm.weight"), {d.qLoraRank}, InitKind::NormWeight);
  b.matrix(n("attn_q_b.weight"), {d.qLoraRank, d.heads * qHead});
  b.matrix(n("attn_kv_a_mqa.weight"), {d.hidden, d.kvLoraRank + d.qkRopeDim});
  b.f32(n("attn_kv_a_norm.weight"), {d.kvLoraRank}, InitKind::NormWeight);
  b.matrix(n("attn_k_b.weight"), {d.qkNopeDim, d.kvLoraRank, d.heads});
  b.matrix(n("attn_v_b.weight"), {d.kvLoraRank, d.vHeadDim, d.heads});
  b.matrix(n("attn_output.weight"), {d.heads * d.vHeadDim, d.hidden});
  b.f32(n("indexer.k_norm.weight"), {d.indexerDim}, InitKind::NormWeight);
  b.f32(n("indexer.k_norm.bias"), {d.indexerDim}, InitKind::SmallBias);
  b.matrix(n("indexer.attn_q_b.weight"),
           {d.qLoraRank, d.indexerHeads * d.indexerDim});
  b.matrix(n("indexer.attn_k.weight"), {d.hidden, d.indexerDim});
  b.matrix(n("indexer.proj.weight"), {d.hidden, d.indexerHeads});
  b.f32(n("ffn_norm.weight"), {d.hidden}, InitKind::NormWeight);
  if (layer < d.leadingDense) {
    b.matrix(n("ffn_gate.weight"), {d.hidden, d.denseFF});
    b.matrix(n("ffn_up.weight"), {d.hidden, d.denseFF});
    b.matrix(n("ffn_down.weight"), {d.denseFF, d.hidden});
  } else {
    b.f32(n("ffn_gate_inp.weight"), {d.hidden, d.experts},
          InitKind::Projection);
    b.f32(n("exp_probs_b.bias"), {d.experts}, InitKind::SmallBias);
    if (layout.fusedGateUpExperts) {
      b.matrix(n("ffn_gate_up_exps.weight"),
               {d.hidden, 2 * d.expertFF, d.experts});
    } else {
      b.matrix(n("ffn_gate_exps.weight"), {d.hidden, d.expertFF, d.experts});
      b.matrix(n("ffn_up_exps.weight"), {d.hidden, d.expertFF, d.experts});
    }
    b.matrix(n("ffn_down_exps.weight"), {d.expertFF, d.hidden, d.experts});
    uint64_t sharedFF = d.expertFF * d.sharedExperts;
    b.matrix(n("ffn_gate_shexp.weight"), {d.hidden, sharedFF});
    b.matrix(n("ffn_up_shexp.weight"), {d.hidden, sharedFF});
    b.matrix(n("ffn_down_shexp.weight"), {sharedFF, d.hidden});
  }
  if (isMtp) {
    b.matrix(n("nextn.eh_proj.weight"), {2 * d.hidden, d.hidden});
    b.f32(n("nextn.enorm.weight"), {d.hidden}, InitKind::NormWeight);
    b.f32(n("nextn.hnorm.weight"), {d.hidden}, InitKind::NormWeight);
    b.f32(n("nextn.shared_head_norm.weight"), {d.hidden},
          InitKind::NormWeight);
  }
}

} // namespace

Expected<std::vector<SynthTensor>>
glm5Tensors(const GLM5Dims &d, const Mix &mix, const LayoutOptions &layout) {
  if (Status s = validateDims(d); !s)
    return s.error();
  TensorListBuilder b(mix);
  b.matrix("token_embd.weight", {d.hidden, d.vocab}, InitKind::Embedding);
  for (uint64_t l = 0; l < d.layers + d.mtpLayers; ++l)
    addBlock(b, d, layout, l, /*isMtp=*/l >= d.layers);
  b.f32("output_norm.weight", {d.hidden}, InitKind::NormWeight);
  b.matrix("output.weight", {d.hidden, d.vocab});
  return b.take();
}

} // namespace kiln::synth
