//===- PreTokenizer.h - The glm4 split pattern as a scanner -----*- C++ -*-===//
//
// GLM's pre-tokenizer cuts text into pieces with one regular expression
// (GLM5.md section 3):
//
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//    ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// matched leftmost-first, alternatives in order, as Oniguruma does for
// HuggingFace `tokenizers`. Every character is matched by some alternative,
// so the pieces cover the text. This file implements that pattern by hand:
// std::regex knows no \p{L}.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_TOKENIZER_PRETOKENIZER_H
#define KILN_TOKENIZER_PRETOKENIZER_H

#include <string_view>
#include <vector>

namespace kiln::tokenizer {

/// The glm4 split pattern, exactly as in GLM's tokenizer.json.
inline constexpr std::string_view kGlm4SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

/// Splits `text` into the pieces the glm4 pattern matches, in order; they
/// are views into `text` and concatenate to it. Bytes that are not valid
/// UTF-8 are taken one at a time as characters of no class (like
/// punctuation), so any input splits and no byte is lost or changed.
std::vector<std::string_view> splitGlm4(std::string_view text);

} // namespace kiln::tokenizer

#endif // KILN_TOKENIZER_PRETOKENIZER_H
