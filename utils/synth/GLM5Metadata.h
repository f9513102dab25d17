//===- GLM5Metadata.h - glm-dsa metadata of a synthetic model ---*- C++ -*-===//
#ifndef KILN_SYNTH_GLM5METADATA_H
#define KILN_SYNTH_GLM5METADATA_H

#include "gguf/GGUFValue.h"
#include "synth/GLM5Spec.h"
#include "synth/SynthTokenizer.h"

#include <string_view>

namespace kiln::synth {

/// The metadata of a synthetic GLM-5 file with llama.cpp's `glm-dsa` keys
/// and value types (GLM5.md section 3), and the tokenizer section.
/// `description` goes into general.name.
gguf::Metadata glm5Metadata(const GLM5Dims &dims, const SynthTokenizer &tok,
                            std::string_view description);

} // namespace kiln::synth

#endif // KILN_SYNTH_GLM5METADATA_H
