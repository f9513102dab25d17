//===- SynthTokenizer.cpp - Learning a small BPE vocabulary ----------------===//
#include "synth/SynthTokenizer.h"
#include "tokenizer/Unicode.h"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cassert>
#include <map>
#include <string_view>

namespace kiln::synth {
namespace {

/// Training text for the merges (written for this purpose).
constexpr std::string_view kCorpus =
    "A compiler for language models reads the weights of a model, describes "
    "each step of decoding as a program, and turns that program into kernels "
    "that run on the graphics processor. The model is large, so the weights "
    "are stored in small blocks of numbers with a shared scale, and the "
    "kernels must read each block once and only once. The time of a step is "
    "the time it takes to read the weights, and the best program is the one "
    "that reads them at the speed of the memory. When the model is split "
    "over eight processors, each one reads its own part of the weights and "
    "the parts are added together at the end of every layer. The order in "
    "which the parts are added must be the same on every processor, so that "
    "every processor makes the same choice of experts and the same choice of "
    "tokens. A test of the compiler compares its answers with the answers of "
    "a simple program that is easy to read, on many random inputs, and the "
    "test must be able to fail. The first question is whether it is correct; "
    "the second is whether it is fast; the third is whether someone else can "
    "read it and change it without fear. Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 "
    "2048 6144 12288 154880. Punctuation, quotes \"like this\", and code: "
    "x = y + z; if (a < b) { return c; }\n";

/// GLM's special tokens, in order, starting 60 ids before the end of the
/// vocabulary (GLM-5: <|endoftext|> = 154820, <|user|> = 154827,
/// <|observation|> = 154829).
constexpr std::array<std::string_view, 16> kSpecials = {
    "<|endoftext|>", "[MASK]",        "[gMASK]",           "[sMASK]",
    "<sop>",         "<eop>",         "<|system|>",        "<|user|>",
    "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>",
    "<|begin_of_video|>", "<|end_of_video|>", "<think>",    "</think>"};
constexpr uint64_t kSpecialsFromEnd = 60;

/// Splits the corpus into words the way GPT-2-style pre-tokenizers roughly
/// do: a run of letters or digits with its leading space, or a run of other
/// non-space characters. Good enough for learning merges; encoding uses
/// the exact glm4 pattern in the runtime.
std::vector<std::string> words(std::string_view text) {
  std::vector<std::string> out;
  size_t i = 0;
  auto isAlnum = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9');
  };
  while (i < text.size()) {
    size_t start = i;
    if (text[i] == ' ' && i + 1 < text.size() && text[i + 1] != ' ')
      ++i;
    if (i < text.size() && isAlnum(text[i])) {
      while (i < text.size() && isAlnum(text[i]))
        ++i;
    } else {
      while (i < text.size() && !isAlnum(text[i]) && text[i] != ' ')
        ++i;
      if (i == start)
        ++i;
    }
    out.emplace_back(text.substr(start, i - start));
  }
  return out;
}

} // namespace

std::string byteLevelEncode(std::string_view raw) {
  // The tokenizer's alphabet: the file this writes is read with the same.
  return tokenizer::byteLevelSpelling(raw);
}

SynthTokenizer makeTokenizer(uint64_t vocab) {
  assert(vocab >= 512 && "validateDims keeps the vocabulary this large");
  SynthTokenizer tok;
  tok.tokens.reserve(vocab);
  for (int b = 0; b < 256; ++b) {
    tok.tokens.push_back(byteLevelEncode(std::string(1, char(b))));
    tok.types.push_back(TokenType::Normal);
  }

  // Ids from specialBase on are special or reserved; merges fill up to it.
  const uint64_t specialBase =
      vocab >= kSpecialsFromEnd + 512 ? vocab - kSpecialsFromEnd
                                      : vocab - kSpecials.size();

  // Byte-pair encoding training: each word a sequence of symbols; merge the
  // most frequent adjacent pair (ties: the lexicographically smallest) until
  // the budget is spent or no pair occurs twice.
  std::map<std::string, uint64_t> wordCounts;
  for (const std::string &w : words(kCorpus))
    ++wordCounts[w];
  std::vector<std::pair<std::vector<std::string>, uint64_t>> corpus;
  for (const auto &[w, count] : wordCounts) {
    std::vector<std::string> symbols;
    for (unsigned char b : w)
      symbols.push_back(byteLevelEncode(std::string(1, char(b))));
    corpus.emplace_back(std::move(symbols), count);
  }
  while (tok.tokens.size() < specialBase) {
    std::map<std::pair<std::string, std::string>, uint64_t> pairs;
    for (const auto &[symbols, count] : corpus)
      for (size_t i = 0; i + 1 < symbols.size(); ++i)
        pairs[{symbols[i], symbols[i + 1]}] += count;
    auto best = pairs.end();
    for (auto it = pairs.begin(); it != pairs.end(); ++it)
      if (it->second >= 2 && (best == pairs.end() || it->second > best->second))
        best = it;
    if (best == pairs.end())
      break;
    auto [left, right] = best->first;
    std::string joined = left + right;
    tok.merges.push_back(left + " " + right);
    tok.tokens.push_back(joined);
    tok.types.push_back(TokenType::Normal);
    for (auto &[symbols, count] : corpus) {
      std::vector<std::string> merged;
      for (size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size() && symbols[i] == left &&
            symbols[i + 1] == right) {
          merged.push_back(joined);
          ++i;
        } else {
          merged.push_back(symbols[i]);
        }
      }
      symbols = std::move(merged);
    }
  }

  // Reserved (unused) ids up to the specials, then the specials, then
  // reserved control tokens to the end.
  while (tok.tokens.size() < specialBase) {
    tok.tokens.push_back(fmt::format("<|reserved_{}|>", tok.tokens.size()));
    tok.types.push_back(TokenType::Unused);
  }
  for (std::string_view s : kSpecials) {
    if (tok.tokens.size() >= vocab)
      break;
    tok.tokens.emplace_back(s);
    tok.types.push_back(TokenType::Control);
  }
  while (tok.tokens.size() < vocab) {
    tok.tokens.push_back(
        fmt::format("<|reserved_special_{}|>", tok.tokens.size()));
    tok.types.push_back(TokenType::Control);
  }

  auto idOf = [&](std::string_view s) {
    return uint32_t(std::find(tok.tokens.begin(), tok.tokens.end(), s) -
                    tok.tokens.begin());
  };
  tok.eosId = idOf("<|endoftext|>");
  tok.eotId = idOf("<|user|>");
  tok.padId = tok.eosId;
  tok.gmaskId = idOf("[gMASK]");
  // GLM's chat format: [gMASK]<sop>, then each turn as a role marker,
  // a newline and the content.
  tok.chatTemplate =
      "[gMASK]<sop>{% for message in messages %}"
      "{% if message['role'] == 'system' %}<|system|>\n{{ message['content'] }}"
      "{% elif message['role'] == 'user' %}<|user|>\n{{ message['content'] }}"
      "{% elif message['role'] == 'assistant' %}<|assistant|>\n"
      "{{ message['content'] }}{% endif %}{% endfor %}"
      "{% if add_generation_prompt %}<|assistant|>\n{% endif %}";
  return tok;
}

} // namespace kiln::synth
