//===- Tokenizer.h - GLM's byte-level BPE tokenizer from GGUF ---*- C++ -*-===//
//
// The tokenizer a GLM-5 GGUF file describes (GLM5.md section 3):
// tokenizer.ggml.model "gpt2" (byte-level BPE) with the "glm4" pre-tokenizer.
// Encoding splits out special tokens, cuts the text between them with the
// glm4 pattern (PreTokenizer.h), spells each piece in GPT-2's byte-level
// alphabet and applies the merges, lowest rank first. No BOS is added.
// Decoding maps ids back to bytes.
//
// The metadata is untrusted: every key is checked for type, every index for
// range, and the vocabulary, types and merges for consistency before a
// Tokenizer exists; problems come back as kiln::Error naming the file, the
// key and the problem.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_TOKENIZER_TOKENIZER_H
#define KILN_TOKENIZER_TOKENIZER_H

#include "gguf/GGUFFile.h"
#include "gguf/GGUFValue.h"
#include "support/Error.h"

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kiln::tokenizer {

/// Token types as llama.cpp stores them in tokenizer.ggml.token_type.
enum class TokenType : int32_t {
  Normal = 1,      ///< A byte-level BPE token.
  Unknown = 2,     ///< Matched like Control; decodes to its text.
  Control = 3,     ///< Special: [gMASK], <|user|>, ...
  UserDefined = 4, ///< Added text, always matched whole; decodes to itself.
  Unused = 5,      ///< Padding of the vocabulary; decodes to nothing.
  Byte = 6,        ///< Treated as Normal (byte-level spelling).
};

/// The metadata keys read.
inline constexpr std::string_view kModelKey = "tokenizer.ggml.model";
inline constexpr std::string_view kPreKey = "tokenizer.ggml.pre";
inline constexpr std::string_view kTokensKey = "tokenizer.ggml.tokens";
inline constexpr std::string_view kTokenTypeKey = "tokenizer.ggml.token_type";
inline constexpr std::string_view kMergesKey = "tokenizer.ggml.merges";
inline constexpr std::string_view kBosKey = "tokenizer.ggml.bos_token_id";
inline constexpr std::string_view kEosKey = "tokenizer.ggml.eos_token_id";
inline constexpr std::string_view kEotKey = "tokenizer.ggml.eot_token_id";
inline constexpr std::string_view kPadKey = "tokenizer.ggml.padding_token_id";

class Tokenizer {
public:
  /// Reads the tokenizer of `model` (its first part holds the metadata).
  static Expected<Tokenizer> fromGGUF(const gguf::GGUFModel &model);

  /// Reads a tokenizer from metadata; `where` names its source in errors.
  ///
  /// Required: tokenizer.ggml.model = "gpt2", tokens (strings, unique),
  /// merges ("left right", rank = position; both sides and their
  /// concatenation must be tokens; no pair twice), and a Normal or Byte
  /// token for each of the 256 byte-level symbols. Optional: token_type
  /// (integers 1..6, one per token; all Normal when absent), pre
  /// ("glm4" or "chatglm-bpe"; glm4 when absent, see preTokenizerDefaulted),
  /// and the bos/eos/eot/padding ids (each within the vocabulary).
  static Expected<Tokenizer> fromMetadata(std::string where,
                                          const gguf::Metadata &metadata);

  Tokenizer(Tokenizer &&) noexcept;
  Tokenizer &operator=(Tokenizer &&) noexcept;
  ~Tokenizer();

  /// Token ids of `text` (raw bytes; invalid UTF-8 is kept byte for byte).
  /// With `parseSpecial`, Control and Unknown tokens written in the text
  /// become their ids; UserDefined tokens always do. Where several match at
  /// one position the longest wins (leftmost-longest, as `tokenizers`).
  /// No BOS is added. Safe to call from several threads.
  std::vector<int32_t> encode(std::string_view text, bool parseSpecial) const;

  /// The bytes of `ids`: byte-level tokens their bytes, Control, Unknown and
  /// UserDefined tokens their text, Unused tokens nothing. An id outside the
  /// vocabulary is an error naming it.
  Expected<std::string> decode(std::span<const int32_t> ids) const;

  /// The bytes of one token (as decode), or nullopt for an id out of range.
  std::optional<std::string_view> tokenBytes(int32_t id) const;

  int32_t vocabSize() const { return int32_t(tokens_.size()); }
  bool isValidId(int32_t id) const { return id >= 0 && id < vocabSize(); }
  /// The token's text as stored in the file (byte-level spelling for Normal
  /// tokens). `id` must be valid.
  const std::string &tokenText(int32_t id) const { return tokens_[id]; }
  TokenType tokenType(int32_t id) const { return types_[id]; }
  /// The id of the token stored as `text`, if any.
  std::optional<int32_t> findToken(std::string_view text) const;

  std::optional<int32_t> bosId() const { return bos_; }
  std::optional<int32_t> eosId() const { return eos_; }
  std::optional<int32_t> eotId() const { return eot_; }
  std::optional<int32_t> padId() const { return pad_; }
  /// The ids that end a reply: eos and eot when set, and GLM's turn
  /// markers where the vocabulary has them as control tokens
  /// (<|endoftext|>, <|user|>, <|observation|>: a GLM model ends its turn
  /// with the next speaker's marker, <|observation|> after a tool call),
  /// as llama.cpp's end-of-generation set for GLM. Each once, in that order.
  std::vector<int32_t> endOfReplyIds() const;

  /// tokenizer.ggml.pre as read ("glm4" when absent).
  const std::string &preTokenizer() const { return pre_; }
  /// True when tokenizer.ggml.pre was absent and glm4 was assumed: Kiln
  /// reads only GLM models, whose files all use that pattern.
  bool preTokenizerDefaulted() const { return preDefaulted_; }

private:
  Tokenizer();

  struct Merge {
    uint32_t rank;
    int32_t result;
  };
  /// A node of the special-token trie (byte edges).
  struct TrieNode {
    std::unordered_map<uint8_t, uint32_t> next;
    int32_t token = -1; ///< The token spelled by the path to here, if any.
  };
  struct PieceCache;

  static uint64_t pairKey(int32_t left, int32_t right) {
    return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
  }

  void buildSpecialTrie();
  bool matchesAsSpecial(int32_t id, bool parseSpecial) const;
  /// Length and id of the longest eligible special token at text[pos], or
  /// {0, -1}.
  std::pair<size_t, int32_t> matchSpecial(std::string_view text, size_t pos,
                                          bool parseSpecial) const;
  void encodeText(std::string_view text, std::vector<int32_t> &out) const;
  void encodePiece(std::string_view piece, std::vector<int32_t> &out) const;
  void mergePiece(std::string_view piece, std::vector<int32_t> &out) const;

  std::vector<std::string> tokens_;
  std::vector<TokenType> types_;
  std::vector<std::string> bytes_; ///< What each token decodes to.
  std::unordered_map<std::string, int32_t> ids_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byteTokens_{};
  std::vector<TrieNode> trie_;
  std::array<bool, 256> specialFirstByte_{};
  std::string pre_;
  bool preDefaulted_ = false;
  std::optional<int32_t> bos_, eos_, eot_, pad_;
  std::unique_ptr<PieceCache> cache_;
};

/// Decodes a stream of ids one at a time, returning only text that cannot
/// change: the bytes of a UTF-8 sequence split across tokens (an emoji is
/// often four byte tokens) are held back until it is complete. Bytes that
/// cannot become valid UTF-8 are passed through unchanged, so everything
/// pushed and then flushed concatenates to decode(ids).
class StreamDecoder {
public:
  /// `tokenizer` must outlive the decoder.
  explicit StreamDecoder(const Tokenizer &tokenizer) : tokenizer_(&tokenizer) {}

  /// The bytes that `id` completes (possibly none); an id out of range is an
  /// error and changes nothing.
  Expected<std::string> push(int32_t id);
  /// Whatever is held back (an unfinished sequence at the end of the stream)
  /// and a fresh start.
  std::string flush();

private:
  const Tokenizer *tokenizer_;
  std::string pending_;
};

} // namespace kiln::tokenizer

#endif // KILN_TOKENIZER_TOKENIZER_H
