//===- GLM5Config.h - GLM-5 hyper-parameters from GGUF or config.json -*- C++ -*-===//
//
// Reads a GLM-5-shaped model's hyper-parameters from `glm-dsa` GGUF metadata
// or from a HuggingFace `config.json`, into the same GLM5Dims the
// synthesiser writes from. Every missing or ill-typed key is an error naming
// the file and the key.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_MODELS_GLM5_GLM5CONFIG_H
#define KILN_MODELS_GLM5_GLM5CONFIG_H

#include "gguf/GGUFFile.h"
#include "support/Error.h"
#include "synth/GLM5Spec.h"

#include <string>

namespace kiln::glm5 {

using synth::GLM5Dims;

/// Hyper-parameters from the metadata of `model` (architecture `glm-dsa`).
Expected<GLM5Dims> dimsFromGGUF(const gguf::GGUFModel &model);

/// Hyper-parameters from the HuggingFace config.json at `path`
/// (architecture GlmMoeDsaForCausalLM, model_type glm_moe_dsa).
Expected<GLM5Dims> dimsFromConfigJson(const std::string &path);

} // namespace kiln::glm5

#endif // KILN_MODELS_GLM5_GLM5CONFIG_H
