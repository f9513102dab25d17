//===- SynthTokenizer.h - A small valid byte-level BPE vocabulary -*- C++ -*-===//
//
// The tokenizer section of a synthetic GLM-5 file: GPT-2-style byte-level
// BPE ("gpt2" model, "glm4" pre-tokenizer) with the 256 byte symbols, merges
// learned from a short built-in English text, GLM's special tokens at GLM's
// offsets from the end of the vocabulary, and reserved tokens filling the
// rest. Every merge joins two existing tokens into an existing token.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_SYNTH_SYNTHTOKENIZER_H
#define KILN_SYNTH_SYNTHTOKENIZER_H

#include "tokenizer/Tokenizer.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::synth {

/// llama.cpp token types: the reader's own enum, so writer and reader agree.
using TokenType = tokenizer::TokenType;

struct SynthTokenizer {
  std::vector<std::string> tokens; ///< Byte-level strings, id order.
  std::vector<TokenType> types;
  std::vector<std::string> merges; ///< "left right", rank order.
  uint32_t eosId = 0;              ///< <|endoftext|>
  uint32_t eotId = 0;              ///< <|user|>: a turn ends when it appears.
  uint32_t padId = 0;
  uint32_t gmaskId = 0; ///< [gMASK], which starts every prompt.
  std::string chatTemplate;
};

/// The tokenizer of a `vocab`-token model (vocab >= 512).
SynthTokenizer makeTokenizer(uint64_t vocab);

/// The byte-level (GPT-2) spelling of raw bytes: printable bytes stand for
/// themselves, the others for code points from U+0100 on.
std::string byteLevelEncode(std::string_view raw);

} // namespace kiln::synth

#endif // KILN_SYNTH_SYNTHTOKENIZER_H
