//===- TokenizerFuzzer.cpp - libFuzzer target for the GGUF tokenizer ------===//
//
// A GGUF file's vocabulary, token types, merges and special ids are
// untrusted input, and so is the text a request asks to encode. The input is
// a vocabulary description, a NUL byte, then the text. The description is
// lines, each led by one code byte:
//   '1'..'6' a token of that type (the rest of the line is its text);
//   '0', '7' a token of an invalid type (0 or 7);
//   'm'      a merge, written as the file writes it ("left right");
//   'c'      a chain: the raw bytes of the rest become byte-level tokens
//            b0b1, b0b1b2, ... with the merges that make them (so that
//            merges which apply are easy to reach);
//   'b'..'e' bos, eos, eot or padding id: the rest as a decimal number;
//   'p'      the pre-tokenizer's name; 'x' drops the byte token of the
//            rest's first byte; 'u' leaves out the token types;
//   anything else: a Normal token spelled by the whole line.
// Every description starts from the 256 byte tokens. Loading may fail with
// an error; what loads encodes the text both ways (special tokens parsed and
// not), and the ids must be valid, decode back to the text where the
// vocabulary is self-consistent (below), and stream-decode to what decode
// gives. Any disagreement aborts. Built and run by utils/fuzz.sh.
//
//===----------------------------------------------------------------------===//
#include "tokenizer/Tokenizer.h"
#include "tokenizer/Unicode.h"

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

using namespace kiln;
using namespace kiln::tokenizer;
using kiln::gguf::Metadata;
using kiln::gguf::Value;

namespace {

struct Description {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  std::string pre = "glm4";
  bool withTypes = true;
  std::vector<std::pair<std::string_view, uint64_t>> ids;

  void add(std::string text, int32_t type) {
    tokens.push_back(std::move(text));
    types.push_back(type);
  }
};

Description describe(std::string_view spec) {
  Description d;
  bool dropped[256] = {};
  std::vector<std::pair<std::string, int32_t>> extra;
  while (!spec.empty()) {
    const size_t end = spec.find('\n');
    std::string_view line = spec.substr(0, end);
    spec = end == std::string_view::npos ? std::string_view()
                                         : spec.substr(end + 1);
    if (line.empty())
      continue;
    const char code = line[0];
    const std::string_view rest = line.substr(1);
    if (code >= '0' && code <= '7') {
      extra.emplace_back(std::string(rest), code - '0');
    } else if (code == 'm') {
      d.merges.emplace_back(rest);
    } else if (code == 'c') {
      for (size_t n = 2; n <= rest.size() && n <= 16; ++n) {
        d.merges.push_back(byteLevelSpelling(rest.substr(0, n - 1)) + " " +
                           byteLevelSpelling(rest.substr(n - 1, 1)));
        extra.emplace_back(byteLevelSpelling(rest.substr(0, n)),
                           int32_t(TokenType::Normal));
      }
    } else if (code >= 'b' && code <= 'e') {
      static constexpr std::string_view keys[] = {kBosKey, kEosKey, kEotKey,
                                                  kPadKey};
      uint64_t id = 0;
      std::from_chars(rest.data(), rest.data() + rest.size(), id);
      d.ids.emplace_back(keys[code - 'b'], id);
    } else if (code == 'p') {
      d.pre = std::string(rest);
    } else if (code == 'x' && !rest.empty()) {
      dropped[uint8_t(rest[0])] = true;
    } else if (code == 'u') {
      d.withTypes = false;
    } else {
      extra.emplace_back(std::string(line), int32_t(TokenType::Normal));
    }
  }
  for (int b = 0; b < 256; ++b)
    if (!dropped[b])
      d.add(byteLevelSpelling(std::string(1, char(b))),
            int32_t(TokenType::Normal));
  for (auto &[text, type] : extra)
    d.add(std::move(text), type);
  return d;
}

Metadata metadata(const Description &d) {
  Metadata m;
  m.emplace_back(std::string(kModelKey), Value::string("gpt2"));
  m.emplace_back(std::string(kPreKey), Value::string(d.pre));
  m.emplace_back(std::string(kTokensKey), Value::stringArray(d.tokens));
  if (d.withTypes) {
    std::vector<Value> types;
    for (int32_t t : d.types)
      types.push_back(Value::i32(t));
    m.emplace_back(std::string(kTokenTypeKey),
                   Value::array(gguf::ValueType::Int32, std::move(types)));
  }
  m.emplace_back(std::string(kMergesKey), Value::stringArray(d.merges));
  for (auto [key, id] : d.ids)
    m.emplace_back(std::string(key), Value::u64(id));
  return m;
}

bool byteLevel(TokenType type) {
  return type == TokenType::Normal || type == TokenType::Byte;
}

/// True when every merge joins byte-level tokens into a byte-level token:
/// then a merge's bytes are its sides' bytes, and decode(encode(text)) must
/// give the text back. (A merge whose result is a control token decodes to
/// the control token's own text, as `tokenizers` decodes it; such a file
/// round-trips only where the spellings agree, so it is not checked.)
bool selfConsistent(const Tokenizer &tok, const Description &d) {
  for (const std::string &merge : d.merges) {
    const size_t space = merge.find(' ');
    const std::string left = merge.substr(0, space);
    const std::string right = merge.substr(space + 1);
    for (const std::string &text : {left, right, left + right}) {
      std::optional<int32_t> id = tok.findToken(text);
      if (!id || !byteLevel(tok.tokenType(*id)))
        return false;
    }
  }
  return true;
}

void check(const Tokenizer &tok, std::string_view text, bool parseSpecial,
           bool roundTrip) {
  const std::vector<int32_t> ids = tok.encode(text, parseSpecial);
  for (int32_t id : ids)
    if (!tok.isValidId(id))
      std::abort(); // an id outside the vocabulary
  if (tok.encode(text, parseSpecial) != ids)
    std::abort(); // the piece cache changed the answer
  Expected<std::string> decoded = tok.decode(ids);
  if (!decoded)
    std::abort(); // valid ids must decode
  if (roundTrip && *decoded != text)
    std::abort(); // encode lost or changed bytes
  StreamDecoder stream(tok);
  std::string streamed;
  for (int32_t id : ids) {
    Expected<std::string> piece = stream.push(id);
    if (!piece)
      std::abort();
    streamed += *piece;
  }
  streamed += stream.flush();
  if (streamed != *decoded)
    std::abort(); // streaming must give what decode gives
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string_view input(reinterpret_cast<const char *>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view spec = input.substr(0, nul);
  const std::string_view text = nul == std::string_view::npos
                                    ? std::string_view()
                                    : input.substr(nul + 1);
  const Description d = describe(spec);
  Expected<Tokenizer> tok = Tokenizer::fromMetadata("fuzz.gguf", metadata(d));
  if (!tok) {
    if (tok.error().message().empty())
      std::abort(); // an error must say what is wrong
    return 0;
  }
  const bool roundTrip = selfConsistent(*tok, d);
  check(*tok, text, false, roundTrip);
  check(*tok, text, true, roundTrip);
  return 0;
}
