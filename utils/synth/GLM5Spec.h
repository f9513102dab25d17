//===- GLM5Spec.h - The shape of a synthetic GLM-5 GGUF file ----*- C++ -*-===//
//
// Everything `kiln-gguf synth` writes except the tensor bytes: the model's
// dimensions (presets tiny / small / glm5 with overrides), the per-tensor
// quantisation mix, the list of tensors with llama.cpp's `glm-dsa` names and
// GGUF dims, and the metadata with llama.cpp's exact keys.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_SYNTH_GLM5SPEC_H
#define KILN_SYNTH_GLM5SPEC_H

#include "gguf/GGUFValue.h"
#include "quant/QuantTypes.h"
#include "support/Error.h"

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::synth {

/// Hyper-parameters of a GLM-5-shaped model (GLM5.md section 1 names).
struct GLM5Dims {
  uint64_t hidden = 6144;
  uint64_t layers = 78;        ///< Trunk layers (block_count minus MTP).
  uint64_t mtpLayers = 1;      ///< nextn_predict_layers, stored after the trunk.
  uint64_t leadingDense = 3;   ///< first_k_dense_replace.
  uint64_t vocab = 154880;
  uint64_t denseFF = 12288;
  uint64_t expertFF = 2048;
  uint64_t experts = 256;
  uint64_t expertsUsed = 8;
  uint64_t sharedExperts = 1;
  uint64_t heads = 64;
  uint64_t qLoraRank = 2048;
  uint64_t kvLoraRank = 512;
  uint64_t qkNopeDim = 192;
  uint64_t qkRopeDim = 64;
  uint64_t vHeadDim = 256;
  uint64_t indexerHeads = 32;
  uint64_t indexerDim = 128;
  uint64_t indexerTopK = 2048;
  uint64_t contextLength = 202752;
  double ropeTheta = 1e6;
  double rmsEps = 1e-5;
  double routedScale = 2.5;
  /// Whether the router divides the chosen experts' weights by their sum
  /// (`expert_weights_norm`; GLM-5: true).
  bool weightsNorm = true;
};

/// The named presets: "tiny", "small", "glm5".
Expected<GLM5Dims> presetDims(std::string_view name);

/// Applies one "--NAME VALUE" dimension override (names as the CLI spells
/// them, e.g. "hidden", "layers", "experts"); errors name the flag.
Status overrideDim(GLM5Dims &dims, std::string_view name, std::string_view value);

/// The dimension names overrideDim accepts, for --help.
std::vector<std::string_view> dimNames();

/// Checks the dims are a model the builder can use (positive, consistent:
/// expertsUsed <= experts, leadingDense <= layers, rope dims within heads,
/// vocab large enough for the tokenizer...). Errors name the dimension.
Status validateDims(const GLM5Dims &dims);

/// How tensor values are drawn (see TensorSynth.h).
enum class InitKind {
  Projection, ///< N(0, 1/fan_in): fan_in = ne[0].
  Embedding,  ///< N(0, 1).
  NormWeight, ///< 1 + N(0, 0.05^2).
  SmallBias,  ///< N(0, 0.05^2).
};

/// One tensor of the file.
struct SynthTensor {
  std::string name;
  GGMLType type;
  std::vector<uint64_t> dims; ///< GGUF order, ne[0] first.
  InitKind init;
};

/// A quantisation mix: the type of each tensor by role. Roles are the
/// tensor names without "blk.N." and ".weight"/".bias" (e.g.
/// "ffn_down_exps", "attn_k_b", "token_embd", "indexer.attn_q_b").
struct Mix {
  std::string name;
  GGMLType defaultMatrix = GGMLType::Q8_0; ///< Any 2-D/3-D weight not listed.
  std::map<std::string, GGMLType, std::less<>> byRole;
};

/// The named mixes: "f32", "f16", "q8_0", "tiny" (block-32 row-parallel
/// tensors, many types, aligned at tp = 1, 2, 4, 8 for the tiny preset),
/// "ud-q4_k_xl" (a UD-Q4_K_XL-like mix). Norms, biases and the router are
/// always F32.
Expected<Mix> namedMix(std::string_view name);

/// The names namedMix accepts.
std::vector<std::string_view> mixNames();

/// Applies "ROLE=TYPE" (e.g. "ffn_down_exps=q6_k") to `mix`.
Status overrideMixRole(Mix &mix, std::string_view assignment);

/// Options that change which tensors exist.
struct LayoutOptions {
  bool fusedGateUpExperts = false; ///< One ffn_gate_up_exps (gate rows first).
};

/// Every tensor of the model in canonical order, or an error naming a tensor
/// whose ne[0] is not a whole number of its type's blocks.
Expected<std::vector<SynthTensor>>
glm5Tensors(const GLM5Dims &dims, const Mix &mix, const LayoutOptions &layout);

/// Elements and bytes of a tensor, or an error naming it (overflow, or a
/// size that is not a whole number of its type's blocks).
struct TensorSize {
  uint64_t elements = 0;
  uint64_t bytes = 0;
};
Expected<TensorSize> sizeOf(const SynthTensor &tensor);

/// The role of a tensor name (see Mix).
std::string roleOf(std::string_view tensorName);

} // namespace kiln::synth

#endif // KILN_SYNTH_GLM5SPEC_H
