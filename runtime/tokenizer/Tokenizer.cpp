//===- Tokenizer.cpp - GLM's byte-level BPE tokenizer from GGUF ----------===//
#include "tokenizer/Tokenizer.h"

#include "tokenizer/PreTokenizer.h"
#include "tokenizer/Unicode.h"

#include <fmt/core.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <queue>

namespace kiln::tokenizer {
namespace {

/// Pieces up to this long are remembered: words recur, long runs of
/// whitespace or punctuation rarely do and would fill the cache.
constexpr size_t kMaxCachedPieceBytes = 64;
/// The cache is emptied when it reaches this many pieces (bounded memory
/// for any input).
constexpr size_t kMaxCachedPieces = size_t(1) << 16;

const gguf::Value *findKey(const gguf::Metadata &metadata,
                           std::string_view key) {
  for (const auto &[name, value] : metadata)
    if (name == key)
      return &value;
  return nullptr;
}

std::string quoted(std::string_view text) {
  return fmt::format("\"{}\"", gguf::printable(text));
}

/// "array of uint32", "string", ...: what a key holds, for messages.
std::string describeType(const gguf::Value &value) {
  if (!value.isArray())
    return std::string(gguf::valueTypeName(value.type()));
  return fmt::format("array of {}", gguf::valueTypeName(value.elementType()));
}

bool isByteLevel(TokenType type) {
  return type == TokenType::Normal || type == TokenType::Byte;
}

/// Reads one key of the metadata, every failure an Error naming the source
/// and the key.
class MetadataReader {
public:
  MetadataReader(std::string where, const gguf::Metadata &metadata)
      : where_(std::move(where)), metadata_(metadata) {}

  Error error(std::string_view key, std::string problem) const {
    return Error(where_, std::string(key), std::move(problem));
  }
  const gguf::Value *find(std::string_view key) const {
    return findKey(metadata_, key);
  }

  /// The string at `key`, or nullopt when the key is absent.
  Expected<std::optional<std::string>>
  optionalString(std::string_view key) const {
    const gguf::Value *value = find(key);
    if (!value)
      return std::optional<std::string>();
    if (const std::string *s = value->asString())
      return std::optional<std::string>(*s);
    return error(key, "expected a string, found " + describeType(*value));
  }

  /// The array of strings at `key`, which must be present.
  Expected<const std::vector<gguf::Value> *>
  stringArray(std::string_view key) const {
    const gguf::Value *value = find(key);
    if (!value)
      return error(key, "missing");
    if (!value->isArray() || value->elementType() != gguf::ValueType::String)
      return error(key, "expected an array of strings, found " +
                            describeType(*value));
    return &value->elements();
  }

  /// A token id at `key`, if present, checked against the vocabulary.
  Expected<std::optional<int32_t>> optionalTokenId(std::string_view key,
                                                   size_t vocab) const {
    const gguf::Value *value = find(key);
    if (!value)
      return std::optional<int32_t>();
    std::optional<uint64_t> id;
    if (!value->isArray() && gguf::isIntegerType(value->type()))
      id = value->asUInt();
    if (!id)
      return error(key, "expected a non-negative integer token id, found " +
                            describeType(*value));
    if (*id >= vocab)
      return error(key, fmt::format("token id {} is outside the vocabulary "
                                    "of {} tokens",
                                    *id, vocab));
    return std::optional<int32_t>(int32_t(*id));
  }

private:
  std::string where_;
  const gguf::Metadata &metadata_;
};

} // namespace

struct Tokenizer::PieceCache {
  std::mutex mutex;
  std::unordered_map<std::string, std::vector<int32_t>> pieces;
};

Tokenizer::Tokenizer() : cache_(std::make_unique<PieceCache>()) {}
Tokenizer::Tokenizer(Tokenizer &&) noexcept = default;
Tokenizer &Tokenizer::operator=(Tokenizer &&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Expected<Tokenizer> Tokenizer::fromGGUF(const gguf::GGUFModel &model) {
  return fromMetadata(model.parts().front().path(), model.metadata());
}

Expected<Tokenizer> Tokenizer::fromMetadata(std::string where,
                                            const gguf::Metadata &metadata) {
  MetadataReader reader(std::move(where), metadata);
  Tokenizer tok;

  // The model: only byte-level BPE.
  Expected<std::optional<std::string>> model = reader.optionalString(kModelKey);
  if (!model)
    return model.error();
  if (!*model)
    return reader.error(kModelKey, "missing (Kiln reads byte-level BPE "
                                   "tokenizers, \"gpt2\")");
  if (**model != "gpt2")
    return reader.error(kModelKey,
                        fmt::format("tokenizer model {} is not supported (Kiln "
                                    "reads only byte-level BPE, \"gpt2\")",
                                    quoted(**model)));

  // The pre-tokenizer: glm4 under either of its names.
  Expected<std::optional<std::string>> pre = reader.optionalString(kPreKey);
  if (!pre)
    return pre.error();
  if (!*pre) {
    tok.pre_ = "glm4";
    tok.preDefaulted_ = true;
  } else if (**pre == "glm4" || **pre == "chatglm-bpe") {
    tok.pre_ = **pre;
  } else {
    return reader.error(kPreKey,
                        fmt::format("pre-tokenizer {} is not supported (Kiln "
                                    "implements \"glm4\", also named "
                                    "\"chatglm-bpe\")",
                                    quoted(**pre)));
  }

  // The vocabulary: unique strings, ids fit int32.
  Expected<const std::vector<gguf::Value> *> tokens =
      reader.stringArray(kTokensKey);
  if (!tokens)
    return tokens.error();
  const std::vector<gguf::Value> &tokenValues = **tokens;
  if (tokenValues.empty())
    return reader.error(kTokensKey, "the vocabulary is empty");
  if (tokenValues.size() > size_t(std::numeric_limits<int32_t>::max()))
    return reader.error(
        kTokensKey,
        fmt::format("{} tokens do not fit 32-bit ids", tokenValues.size()));
  const size_t vocab = tokenValues.size();
  tok.tokens_.reserve(vocab);
  tok.ids_.reserve(vocab);
  for (size_t id = 0; id < vocab; ++id) {
    const std::string *textPtr = tokenValues[id].asString();
    if (!textPtr) // the reader keeps arrays uniform; do not rely on it
      return reader.error(kTokensKey,
                          fmt::format("token {} is not a string", id));
    const std::string &text = *textPtr;
    auto [it, inserted] = tok.ids_.emplace(text, int32_t(id));
    if (!inserted)
      return reader.error(kTokensKey,
                          fmt::format("token {} {} repeats token {}", id,
                                      quoted(text), it->second));
    tok.tokens_.push_back(text);
  }

  // Token types: one integer 1..6 per token, Normal where absent.
  tok.types_.assign(vocab, TokenType::Normal);
  if (const gguf::Value *types = reader.find(kTokenTypeKey)) {
    if (!types->isArray() || !gguf::isIntegerType(types->elementType()))
      return reader.error(kTokenTypeKey, "expected an array of integers, "
                                         "found " +
                                             describeType(*types));
    if (types->elements().size() != vocab)
      return reader.error(kTokenTypeKey,
                          fmt::format("{} types for {} tokens",
                                      types->elements().size(), vocab));
    for (size_t id = 0; id < vocab; ++id) {
      std::optional<int64_t> type = types->elements()[id].asInt();
      if (!type || *type < int64_t(TokenType::Normal) ||
          *type > int64_t(TokenType::Byte))
        return reader.error(
            kTokenTypeKey,
            fmt::format("token {} has type {} (expected 1..6)", id,
                        type ? std::to_string(*type) : std::string("?")));
      tok.types_[id] = TokenType(*type);
    }
  }

  // What each token decodes to. A byte-level token must be spelled in the
  // byte-level alphabet, or it could not be decoded.
  tok.bytes_.resize(vocab);
  for (size_t id = 0; id < vocab; ++id) {
    switch (tok.types_[id]) {
    case TokenType::Normal:
    case TokenType::Byte: {
      std::optional<std::string> bytes =
          bytesOfByteLevelSpelling(tok.tokens_[id]);
      if (!bytes)
        return reader.error(
            kTokensKey,
            fmt::format("token {} {} is a byte-level token but is not "
                        "spelled in the byte-level alphabet",
                        id, quoted(tok.tokens_[id])));
      tok.bytes_[id] = std::move(*bytes);
      break;
    }
    case TokenType::Unknown:
    case TokenType::Control:
    case TokenType::UserDefined:
      tok.bytes_[id] = tok.tokens_[id];
      break;
    case TokenType::Unused:
      break;
    }
  }

  // Every byte needs a token, or some text could not be encoded.
  for (unsigned b = 0; b < 256; ++b) {
    const std::string spelling = byteLevelSpelling(std::string(1, char(b)));
    auto it = tok.ids_.find(spelling);
    if (it == tok.ids_.end())
      return reader.error(kTokensKey,
                          fmt::format("no token for byte 0x{:02X} (spelled "
                                      "{})",
                                      b, quoted(spelling)));
    if (!isByteLevel(tok.types_[it->second]))
      return reader.error(kTokensKey,
                          fmt::format("the token for byte 0x{:02X}, {} {}, "
                                      "is not a byte-level token",
                                      b, it->second, quoted(spelling)));
    tok.byteTokens_[b] = it->second;
  }

  // Merges: rank = position; every name a token, each pair once.
  Expected<const std::vector<gguf::Value> *> merges =
      reader.stringArray(kMergesKey);
  if (!merges)
    return merges.error();
  const std::vector<gguf::Value> &mergeValues = **merges;
  tok.merges_.reserve(mergeValues.size());
  for (size_t rank = 0; rank < mergeValues.size(); ++rank) {
    const std::string *mergePtr = mergeValues[rank].asString();
    if (!mergePtr)
      return reader.error(kMergesKey,
                          fmt::format("merge {} is not a string", rank));
    const std::string &merge = *mergePtr;
    const size_t space = merge.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == merge.size() ||
        merge.find(' ', space + 1) != std::string::npos)
      return reader.error(kMergesKey,
                          fmt::format("merge {} {} is not two tokens "
                                      "separated by one space",
                                      rank, quoted(merge)));
    const std::string left = merge.substr(0, space);
    const std::string right = merge.substr(space + 1);
    auto leftIt = tok.ids_.find(left);
    auto rightIt = tok.ids_.find(right);
    if (leftIt == tok.ids_.end() || rightIt == tok.ids_.end())
      return reader.error(
          kMergesKey,
          fmt::format("merge {} {} names {}, which is not a token", rank,
                      quoted(merge),
                      quoted(leftIt == tok.ids_.end() ? left : right)));
    auto resultIt = tok.ids_.find(left + right);
    if (resultIt == tok.ids_.end())
      return reader.error(
          kMergesKey, fmt::format("merge {} {} makes {}, which is not a "
                                  "token",
                                  rank, quoted(merge), quoted(left + right)));
    auto [it, inserted] =
        tok.merges_.emplace(pairKey(leftIt->second, rightIt->second),
                            Merge{uint32_t(rank), resultIt->second});
    if (!inserted)
      return reader.error(kMergesKey,
                          fmt::format("merge {} {} repeats merge {}", rank,
                                      quoted(merge), it->second.rank));
  }

  // Special token ids.
  struct IdKey {
    std::string_view key;
    std::optional<int32_t> Tokenizer::*member;
  };
  const std::array<IdKey, 4> idKeys = {{{kBosKey, &Tokenizer::bos_},
                                        {kEosKey, &Tokenizer::eos_},
                                        {kEotKey, &Tokenizer::eot_},
                                        {kPadKey, &Tokenizer::pad_}}};
  for (const IdKey &k : idKeys) {
    Expected<std::optional<int32_t>> id = reader.optionalTokenId(k.key, vocab);
    if (!id)
      return id.error();
    tok.*k.member = *id;
  }

  tok.buildSpecialTrie();
  return tok;
}

void Tokenizer::buildSpecialTrie() {
  trie_.assign(1, TrieNode());
  specialFirstByte_.fill(false);
  for (size_t id = 0; id < tokens_.size(); ++id) {
    const TokenType type = types_[id];
    const std::string &text = tokens_[id];
    if (text.empty() ||
        (type != TokenType::Control && type != TokenType::Unknown &&
         type != TokenType::UserDefined))
      continue;
    specialFirstByte_[uint8_t(text[0])] = true;
    uint32_t node = 0;
    for (char c : text) {
      auto it = trie_[node].next.find(uint8_t(c));
      if (it != trie_[node].next.end()) {
        node = it->second;
        continue;
      }
      const uint32_t child = uint32_t(trie_.size());
      trie_[node].next.emplace(uint8_t(c), child);
      trie_.emplace_back();
      node = child;
    }
    // Token texts are unique (checked on load), so no node gets two ids.
    trie_[node].token = int32_t(id);
  }
}

bool Tokenizer::matchesAsSpecial(int32_t id, bool parseSpecial) const {
  // UserDefined tokens are plain added text, matched whatever the caller
  // asks, as llama.cpp and `tokenizers` do with non-special added tokens.
  return types_[id] == TokenType::UserDefined || parseSpecial;
}

std::pair<size_t, int32_t> Tokenizer::matchSpecial(std::string_view text,
                                                   size_t pos,
                                                   bool parseSpecial) const {
  std::pair<size_t, int32_t> best{0, -1};
  uint32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    auto it = trie_[node].next.find(uint8_t(text[i]));
    if (it == trie_[node].next.end())
      break;
    node = it->second;
    const int32_t id = trie_[node].token;
    if (id >= 0 && matchesAsSpecial(id, parseSpecial))
      best = {i + 1 - pos, id};
  }
  return best;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text,
                                       bool parseSpecial) const {
  std::vector<int32_t> out;
  size_t start = 0; // First byte not yet encoded.
  for (size_t pos = 0; pos < text.size();) {
    if (specialFirstByte_[uint8_t(text[pos])]) {
      auto [length, id] = matchSpecial(text, pos, parseSpecial);
      if (length > 0) {
        encodeText(text.substr(start, pos - start), out);
        out.push_back(id);
        pos += length;
        start = pos;
        continue;
      }
    }
    ++pos;
  }
  encodeText(text.substr(start), out);
  return out;
}

void Tokenizer::encodeText(std::string_view text,
                           std::vector<int32_t> &out) const {
  for (std::string_view piece : splitGlm4(text))
    encodePiece(piece, out);
}

void Tokenizer::encodePiece(std::string_view piece,
                            std::vector<int32_t> &out) const {
  if (piece.size() == 1) {
    out.push_back(byteTokens_[uint8_t(piece[0])]);
    return;
  }
  const bool cacheable = piece.size() <= kMaxCachedPieceBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    auto it = cache_->pieces.find(std::string(piece));
    if (it != cache_->pieces.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  mergePiece(piece, out);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    if (cache_->pieces.size() >= kMaxCachedPieces)
      cache_->pieces.clear();
    cache_->pieces.emplace(
        std::string(piece),
        std::vector<int32_t>(out.begin() + first, out.end()));
  }
}

void Tokenizer::mergePiece(std::string_view piece,
                           std::vector<int32_t> &out) const {
  // The symbols of the piece as a linked list; a merge folds the right
  // symbol into the left one (id -1 marks a folded symbol).
  struct Symbol {
    int32_t id;
    size_t prev;
    size_t next;
  };
  constexpr size_t kNone = std::numeric_limits<size_t>::max();
  // A pair that a merge applies to, as it was when queued. The queue yields
  // the lowest rank first and, among equal ranks, the leftmost pair, as
  // `tokenizers` does; entries made stale by an earlier merge are skipped.
  struct Candidate {
    uint32_t rank;
    size_t left;
    int32_t leftId;
    int32_t rightId;
    int32_t result;
    bool operator>(const Candidate &other) const {
      return rank != other.rank ? rank > other.rank : left > other.left;
    }
  };

  const size_t n = piece.size();
  if (n == 0)
    return;
  std::vector<Symbol> symbols(n);
  for (size_t i = 0; i < n; ++i)
    symbols[i] = {byteTokens_[uint8_t(piece[i])], i == 0 ? kNone : i - 1,
                  i + 1 < n ? i + 1 : kNone};

  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto consider = [&](size_t left) {
    if (left == kNone || symbols[left].next == kNone)
      return;
    const Symbol &right = symbols[symbols[left].next];
    auto it = merges_.find(pairKey(symbols[left].id, right.id));
    if (it != merges_.end())
      queue.push({it->second.rank, left, symbols[left].id, right.id,
                  it->second.result});
  };
  for (size_t i = 0; i + 1 < n; ++i)
    consider(i);

  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol &left = symbols[c.left];
    if (left.id != c.leftId || left.next == kNone ||
        symbols[left.next].id != c.rightId)
      continue;
    Symbol &right = symbols[left.next];
    left.id = c.result;
    left.next = right.next;
    if (right.next != kNone)
      symbols[right.next].prev = c.left;
    right.id = -1;
    consider(left.prev);
    consider(c.left);
  }

  for (size_t i = 0; i != kNone; i = symbols[i].next)
    out.push_back(symbols[i].id);
}

Expected<std::string> Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::optional<std::string_view> bytes = tokenBytes(ids[i]);
    if (!bytes)
      return Error("decode", fmt::format("token #{}", i),
                   fmt::format("token id {} is outside the vocabulary of {} "
                               "tokens",
                               ids[i], tokens_.size()));
    out += *bytes;
  }
  return out;
}

std::optional<std::string_view> Tokenizer::tokenBytes(int32_t id) const {
  if (!isValidId(id))
    return std::nullopt;
  return std::string_view(bytes_[id]);
}

std::optional<int32_t> Tokenizer::findToken(std::string_view text) const {
  auto it = ids_.find(std::string(text));
  if (it == ids_.end())
    return std::nullopt;
  return it->second;
}

std::vector<int32_t> Tokenizer::endOfReplyIds() const {
  std::vector<int32_t> ids;
  auto add = [&](std::optional<int32_t> id) {
    if (id && std::find(ids.begin(), ids.end(), *id) == ids.end())
      ids.push_back(*id);
  };
  add(eos_);
  add(eot_);
  for (std::string_view marker :
       {"<|endoftext|>", "<|user|>", "<|observation|>"})
    if (std::optional<int32_t> id = findToken(marker);
        id && tokenType(*id) == TokenType::Control)
      add(id);
  return ids;
}

Expected<std::string> StreamDecoder::push(int32_t id) {
  std::optional<std::string_view> bytes = tokenizer_->tokenBytes(id);
  if (!bytes)
    return Error("decode", "token id",
                 fmt::format("token id {} is outside the vocabulary of {} "
                             "tokens",
                             id, tokenizer_->vocabSize()));
  pending_ += *bytes;
  const size_t hold = unfinishedUtf8Suffix(pending_);
  std::string ready = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return ready;
}

std::string StreamDecoder::flush() {
  std::string rest;
  rest.swap(pending_);
  return rest;
}

} // namespace kiln::tokenizer
