//===- GLM5Config.cpp - Reading GLM-5 hyper-parameters ---------------------===//
#include "glm5/GLM5Config.h"

#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"

#include <fmt/core.h>

#include <cmath>

namespace kiln::glm5 {
namespace {

/// Reads `glm-dsa.*` keys of one model, remembering the first error.
class MetadataReader {
public:
  explicit MetadataReader(const gguf::GGUFModel &model)
      : model_(model), file_(model.parts().front().path()) {}

  uint64_t count(std::string_view key) {
    std::string full = fmt::format("glm-dsa.{}", key);
    const gguf::Value *v = model_.find(full);
    if (!v)
      return fail(full, "missing"), 0;
    std::optional<uint64_t> n = v->asUInt();
    if (!n || v->type() == gguf::ValueType::Bool)
      return fail(full, fmt::format("expected a non-negative integer, got {}",
                                    gguf::valueTypeName(v->type()))),
             0;
    return *n;
  }

  /// An optional count: empty when the file lacks it.
  std::optional<uint64_t> optionalCount(std::string_view key) {
    if (!model_.find(fmt::format("glm-dsa.{}", key)))
      return std::nullopt;
    return count(key);
  }

  /// An optional string key: empty when the file lacks it.
  std::optional<std::string> optionalString(std::string_view key) {
    std::string full = fmt::format("glm-dsa.{}", key);
    const gguf::Value *v = model_.find(full);
    if (!v)
      return std::nullopt;
    if (const std::string *text = v->asString())
      return *text;
    fail(full, fmt::format("expected a string, got {}",
                           gguf::valueTypeName(v->type())));
    return std::nullopt;
  }

  /// An optional boolean key: `absent` when the file lacks it.
  bool flag(std::string_view key, bool absent) {
    std::string full = fmt::format("glm-dsa.{}", key);
    const gguf::Value *v = model_.find(full);
    if (!v)
      return absent;
    std::optional<bool> b = v->asBool();
    if (!b)
      return fail(full, fmt::format("expected a bool, got {}",
                                    gguf::valueTypeName(v->type()))),
             absent;
    return *b;
  }

  double real(std::string_view key) {
    std::string full = fmt::format("glm-dsa.{}", key);
    const gguf::Value *v = model_.find(full);
    std::optional<double> x = v ? v->asFloat() : std::nullopt;
    if (!x || !std::isfinite(*x))
      return fail(full, v ? "expected a finite number" : "missing"), 0.0;
    return *x;
  }

  void fail(std::string key, std::string problem) {
    if (!error_)
      error_ = Error(file_, std::move(key), std::move(problem));
  }
  const std::optional<Error> &error() const { return error_; }
  const std::string &file() const { return file_; }

private:
  const gguf::GGUFModel &model_;
  std::string file_;
  std::optional<Error> error_;
};

} // namespace

Expected<GLM5Dims> dimsFromGGUF(const gguf::GGUFModel &model) {
  MetadataReader r(model);
  const gguf::Value *arch = model.find("general.architecture");
  const std::string *archName = arch ? arch->asString() : nullptr;
  if (!archName)
    return Error(r.file(), "general.architecture", "missing");
  if (*archName != "glm-dsa")
    return Error(r.file(), "general.architecture",
                 fmt::format("'{}' is not glm-dsa (GLM-5)", *archName));
  GLM5Dims d;
  d.hidden = r.count("embedding_length");
  uint64_t blocks = r.count("block_count");
  d.mtpLayers = model.find("glm-dsa.nextn_predict_layers")
                    ? r.count("nextn_predict_layers")
                    : 0;
  d.leadingDense = r.count("leading_dense_block_count");
  d.vocab = r.count("vocab_size");
  d.denseFF = r.count("feed_forward_length");
  d.expertFF = r.count("expert_feed_forward_length");
  d.experts = r.count("expert_count");
  d.expertsUsed = r.count("expert_used_count");
  d.sharedExperts = r.count("expert_shared_count");
  d.heads = r.count("attention.head_count");
  d.qLoraRank = r.count("attention.q_lora_rank");
  d.kvLoraRank = r.count("attention.kv_lora_rank");
  d.qkRopeDim = r.count("rope.dimension_count");
  uint64_t qkHead = r.count("attention.key_length_mla");
  d.vHeadDim = r.count("attention.value_length_mla");
  d.indexerHeads = r.count("attention.indexer.head_count");
  d.indexerDim = r.count("attention.indexer.key_length");
  d.indexerTopK = r.count("attention.indexer.top_k");
  d.contextLength = r.count("context_length");
  d.ropeTheta = r.real("rope.freq_base");
  d.rmsEps = r.real("attention.layer_norm_rms_epsilon");
  d.routedScale = r.real("expert_weights_scale");
  // Absent, llama.cpp leaves the weights unnormalised; GLM-5's files say
  // true.
  d.weightsNorm = r.flag("expert_weights_norm", false);
  uint64_t gating = r.count("expert_gating_func");
  // Group-limited routing (DeepSeek-V3's) is not GLM-5's: one group.
  const std::optional<uint64_t> groups = r.optionalCount("expert_group_count"),
                                groupsUsed =
                                    r.optionalCount("expert_group_used_count");
  // MLA keeps one latent key/value head; Kiln ropes without scaling.
  const std::optional<uint64_t> kvHeads =
      r.optionalCount("attention.head_count_kv");
  const std::optional<std::string> scaling = r.optionalString("rope.scaling.type");
  // The redundant MLA keys, where present, must agree (GLM5.md section 3).
  const std::optional<uint64_t> keyLength =
                                    r.optionalCount("attention.key_length"),
                                valueLength =
                                    r.optionalCount("attention.value_length");
  if (r.error())
    return *r.error();
  for (const auto &[key, n] :
       {std::pair{"glm-dsa.expert_group_count", groups},
        std::pair{"glm-dsa.expert_group_used_count", groupsUsed}})
    if (n && *n != 1)
      return Error(r.file(), key,
                   fmt::format("{} groups are not supported (GLM-5 routes "
                               "over one group)",
                               *n));
  if (kvHeads && *kvHeads != 1)
    return Error(r.file(), "glm-dsa.attention.head_count_kv",
                 fmt::format("{} is not 1 (MLA's one latent head)", *kvHeads));
  if (scaling && *scaling != "none")
    return Error(r.file(), "glm-dsa.rope.scaling.type",
                 fmt::format("'{}' rope scaling is not supported (GLM-5 uses "
                             "none)",
                             *scaling));
  if (keyLength && *keyLength != d.kvLoraRank + d.qkRopeDim)
    return Error(r.file(), "glm-dsa.attention.key_length",
                 fmt::format("{} is not kv_lora_rank {} + rope dims {}",
                             *keyLength, d.kvLoraRank, d.qkRopeDim));
  if (valueLength && *valueLength != d.kvLoraRank)
    return Error(r.file(), "glm-dsa.attention.value_length",
                 fmt::format("{} is not kv_lora_rank {}", *valueLength,
                             d.kvLoraRank));
  if (gating != 2)
    return Error(r.file(), "glm-dsa.expert_gating_func",
                 fmt::format("{} is not 2 (sigmoid), the only gating GLM-5 "
                             "uses",
                             gating));
  if (blocks <= d.mtpLayers)
    return Error(r.file(), "glm-dsa.block_count",
                 fmt::format("{} blocks leave no trunk layer after {} MTP "
                             "layers",
                             blocks, d.mtpLayers));
  d.layers = blocks - d.mtpLayers;
  if (qkHead <= d.qkRopeDim)
    return Error(r.file(), "glm-dsa.attention.key_length_mla",
                 fmt::format("{} leaves no non-rope part beside {} rope dims",
                             qkHead, d.qkRopeDim));
  d.qkNopeDim = qkHead - d.qkRopeDim;
  if (Status s = synth::validateDims(d); !s)
    return s.error().withWhere(r.file());
  return d;
}

Expected<GLM5Dims> dimsFromConfigJson(const std::string &path) {
  auto buffer = llvm::MemoryBuffer::getFile(path);
  if (!buffer)
    return Error(path, "", fmt::format("cannot read: {}",
                                       buffer.getError().message()));
  llvm::Expected<llvm::json::Value> parsed =
      llvm::json::parse((*buffer)->getBuffer());
  if (!parsed)
    return Error(path, "", fmt::format("not valid JSON: {}",
                                       llvm::toString(parsed.takeError())));
  const llvm::json::Object *root = parsed->getAsObject();
  if (!root)
    return Error(path, "", "the top level is not a JSON object");

  std::optional<Error> error;
  auto fail = [&](std::string key, std::string problem) {
    if (!error)
      error = Error(path, std::move(key), std::move(problem));
  };
  auto count = [&](llvm::StringRef key) -> uint64_t {
    std::optional<int64_t> v = root->getInteger(key);
    if (!v || *v < 0)
      return fail(key.str(), root->get(key) ? "expected a non-negative integer"
                                            : "missing"),
             0;
    return uint64_t(*v);
  };
  auto real = [&](const llvm::json::Object &obj, llvm::StringRef key,
                  std::string where) -> double {
    std::optional<double> v = obj.getNumber(key);
    if (!v)
      return fail(where, obj.get(key) ? "expected a number" : "missing"), 0.0;
    return *v;
  };

  std::optional<llvm::StringRef> modelType = root->getString("model_type");
  if (!modelType || *modelType != "glm_moe_dsa")
    return Error(path, "model_type",
                 modelType ? fmt::format("'{}' is not glm_moe_dsa (GLM-5)",
                                         modelType->str())
                           : std::string("missing"));
  GLM5Dims d;
  d.hidden = count("hidden_size");
  d.layers = count("num_hidden_layers");
  d.mtpLayers = root->get("num_nextn_predict_layers")
                    ? count("num_nextn_predict_layers")
                    : 0;
  d.leadingDense = count("first_k_dense_replace");
  d.vocab = count("vocab_size");
  d.denseFF = count("intermediate_size");
  d.expertFF = count("moe_intermediate_size");
  d.experts = count("n_routed_experts");
  d.expertsUsed = count("num_experts_per_tok");
  d.sharedExperts = count("n_shared_experts");
  d.heads = count("num_attention_heads");
  d.qLoraRank = count("q_lora_rank");
  d.kvLoraRank = count("kv_lora_rank");
  d.qkNopeDim = count("qk_nope_head_dim");
  d.qkRopeDim = count("qk_rope_head_dim");
  d.vHeadDim = count("v_head_dim");
  d.indexerHeads = count("index_n_heads");
  d.indexerDim = count("index_head_dim");
  d.indexerTopK = count("index_topk");
  d.contextLength = count("max_position_embeddings");
  d.rmsEps = real(*root, "rms_norm_eps", "rms_norm_eps");
  d.routedScale = real(*root, "routed_scaling_factor", "routed_scaling_factor");
  // Newer configs nest rope settings in rope_parameters; older ones have
  // rope_theta at the top.
  if (const llvm::json::Object *rope = root->getObject("rope_parameters"))
    d.ropeTheta = real(*rope, "rope_theta", "rope_parameters.rope_theta");
  else
    d.ropeTheta = real(*root, "rope_theta", "rope_theta");
  if (std::optional<llvm::StringRef> scoring = root->getString("scoring_func");
      scoring && *scoring != "sigmoid")
    fail("scoring_func", fmt::format("'{}' is not sigmoid", scoring->str()));
  // norm_topk_prob (GLM-5: true, the default of its configuration class).
  d.weightsNorm = root->getBoolean("norm_topk_prob").value_or(true);
  for (llvm::StringRef key : {"n_group", "topk_group"})
    if (std::optional<int64_t> g = root->getInteger(key); g && *g != 1)
      fail(key.str(), fmt::format("{} groups are not supported (GLM-5 uses 1)",
                                  *g));
  // Kiln ropes interleaved pairs with no scaling (GLM5.md section 1).
  for (llvm::StringRef key : {"rope_interleave", "indexer_rope_interleave"})
    if (std::optional<bool> b = root->getBoolean(key); b && !*b)
      fail(key.str(), "false (half-split rope) is not supported (GLM-5 ropes "
                      "interleaved pairs)");
  for (const llvm::json::Object *o :
       {root, root->getObject("rope_parameters")}) {
    if (!o)
      continue;
    if (std::optional<llvm::StringRef> t = o->getString("rope_type");
        t && *t != "default")
      fail("rope_type", fmt::format("'{}' rope scaling is not supported "
                                    "(GLM-5 uses none)",
                                    t->str()));
  }
  if (const llvm::json::Value *scaling = root->get("rope_scaling");
      scaling && scaling->kind() != llvm::json::Value::Null)
    fail("rope_scaling", "rope scaling is not supported (GLM-5 uses none)");
  if (error)
    return *error;
  if (Status s = synth::validateDims(d); !s)
    return s.error().withWhere(path);
  return d;
}

} // namespace kiln::glm5
