//===- GLM5Metadata.cpp - glm-dsa metadata keys ----------------------------===//
#include "synth/GLM5Metadata.h"

#include <fmt/core.h>

namespace kiln::synth {

gguf::Metadata glm5Metadata(const GLM5Dims &d, const SynthTokenizer &tok,
                            std::string_view description) {
  using gguf::Value;
  gguf::Metadata md;
  auto put = [&](std::string key, Value v) {
    md.emplace_back(std::move(key), std::move(v));
  };
  auto arch = [&](std::string_view key, Value v) {
    put(fmt::format("glm-dsa.{}", key), std::move(v));
  };
  auto u32 = [](uint64_t v) { return Value::u32(uint32_t(v)); };

  put("general.architecture", Value::string("glm-dsa"));
  put("general.name", Value::string(std::string(description)));
  put("general.quantization_version", Value::u32(2));

  arch("context_length", u32(d.contextLength));
  arch("embedding_length", u32(d.hidden));
  arch("feed_forward_length", u32(d.denseFF));
  arch("expert_feed_forward_length", u32(d.expertFF));
  arch("block_count", u32(d.layers + d.mtpLayers));
  arch("nextn_predict_layers", u32(d.mtpLayers));
  arch("leading_dense_block_count", u32(d.leadingDense));
  arch("vocab_size", u32(d.vocab));
  arch("attention.head_count", u32(d.heads));
  arch("attention.head_count_kv", u32(1));
  // MLA as llama.cpp sees it: one shared latent "head" of kv_lora + rope.
  arch("attention.key_length", u32(d.kvLoraRank + d.qkRopeDim));
  arch("attention.value_length", u32(d.kvLoraRank));
  arch("attention.key_length_mla", u32(d.qkNopeDim + d.qkRopeDim));
  arch("attention.value_length_mla", u32(d.vHeadDim));
  arch("attention.q_lora_rank", u32(d.qLoraRank));
  arch("attention.kv_lora_rank", u32(d.kvLoraRank));
  arch("attention.layer_norm_rms_epsilon", Value::f32(float(d.rmsEps)));
  arch("attention.indexer.head_count", u32(d.indexerHeads));
  arch("attention.indexer.key_length", u32(d.indexerDim));
  arch("attention.indexer.top_k", u32(d.indexerTopK));
  arch("rope.freq_base", Value::f32(float(d.ropeTheta)));
  arch("rope.dimension_count", u32(d.qkRopeDim));
  arch("expert_count", u32(d.experts));
  arch("expert_used_count", u32(d.expertsUsed));
  arch("expert_shared_count", u32(d.sharedExperts));
  arch("expert_group_count", u32(1));
  arch("expert_group_used_count", u32(1));
  arch("expert_weights_scale", Value::f32(float(d.routedScale)));
  arch("expert_weights_norm", Value::boolean(d.weightsNorm));
  arch("expert_gating_func", u32(2)); // sigmoid

  put("tokenizer.ggml.model", Value::string("gpt2"));
  put("tokenizer.ggml.pre", Value::string("glm4"));
  put("tokenizer.ggml.tokens", Value::stringArray(tok.tokens));
  std::vector<Value> types;
  types.reserve(tok.types.size());
  for (TokenType t : tok.types)
    types.push_back(Value::i32(int32_t(t)));
  put("tokenizer.ggml.token_type",
      Value::array(gguf::ValueType::Int32, std::move(types)));
  put("tokenizer.ggml.merges", Value::stringArray(tok.merges));
  put("tokenizer.ggml.eos_token_id", Value::u32(tok.eosId));
  put("tokenizer.ggml.eot_token_id", Value::u32(tok.eotId));
  put("tokenizer.ggml.padding_token_id", Value::u32(tok.padId));
  put("tokenizer.ggml.bos_token_id", Value::u32(tok.gmaskId));
  put("tokenizer.ggml.add_bos_token", Value::boolean(false));
  put("tokenizer.chat_template", Value::string(tok.chatTemplate));
  return md;
}

} // namespace kiln::synth
