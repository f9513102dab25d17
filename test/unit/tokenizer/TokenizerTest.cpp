//===- TokenizerTest.cpp - The glm4 scanner, BPE, decoding and loading ----===//
//
// The split pattern case by case, byte-level BPE on a hand-made vocabulary
// whose merges are chosen so that rank order and ties show, streaming decode
// of UTF-8 cut across tokens, and each metadata check with its exact message.
// Agreement with HuggingFace `tokenizers` on real text is checked by
// test/python/test_tokenizer.py, not here.
//
//===----------------------------------------------------------------------===//
#include "tokenizer/Tokenizer.h"
#include "tokenizer/PreTokenizer.h"
#include "tokenizer/Unicode.h"

#include <gtest/gtest.h>

#include <random>

using namespace kiln;
using namespace kiln::tokenizer;
using kiln::gguf::Metadata;
using kiln::gguf::Value;

namespace {

std::vector<std::string> pieces(std::string_view text) {
  std::vector<std::string> out;
  for (std::string_view p : splitGlm4(text))
    out.emplace_back(p);
  return out;
}

using Pieces = std::vector<std::string>;

/// A small vocabulary: the 256 byte tokens (ids = byte values), then
/// byte-level tokens made by merges, then special and unused tokens.
struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;

  Vocab() {
    for (int b = 0; b < 256; ++b)
      add(byteLevelSpelling(std::string(1, char(b))), TokenType::Normal);
  }
  int32_t add(std::string text, TokenType type) {
    tokens.push_back(std::move(text));
    types.push_back(int32_t(type));
    return int32_t(tokens.size() - 1);
  }
  /// Adds the token "left+right" (byte-level spellings) and its merge.
  int32_t merge(std::string left, std::string right) {
    merges.push_back(left + " " + right);
    return add(left + right, TokenType::Normal);
  }

  Metadata metadata() const {
    Metadata m;
    m.emplace_back(std::string(kModelKey), Value::string("gpt2"));
    m.emplace_back(std::string(kPreKey), Value::string("glm4"));
    m.emplace_back(std::string(kTokensKey), Value::stringArray(tokens));
    std::vector<Value> typeValues;
    for (int32_t t : types)
      typeValues.push_back(Value::i32(t));
    m.emplace_back(std::string(kTokenTypeKey),
                   Value::array(gguf::ValueType::Int32, typeValues));
    m.emplace_back(std::string(kMergesKey), Value::stringArray(merges));
    return m;
  }
};

/// The vocabulary most tests share.
struct TestVocab : Vocab {
  int32_t ab, bc, abc, aa, spaceA, user, userLong, userDefined, unused;
  TestVocab() {
    bc = merge("b", "c");     // rank 0
    ab = merge("a", "b");     // rank 1
    abc = merge("ab", "c");   // rank 2 (unreachable after "b c", see tests)
    aa = merge("a", "a");     // rank 3
    spaceA = merge("Ġ", "a"); // rank 4: " a"
    user = add("<|user|>", TokenType::Control);
    userLong = add("<|user|>!", TokenType::Control);
    userDefined = add("<ud>", TokenType::UserDefined);
    unused = add("<unused>", TokenType::Unused);
  }
};

Tokenizer load(const Metadata &m) {
  Expected<Tokenizer> tok = Tokenizer::fromMetadata("test.gguf", m);
  EXPECT_TRUE(tok) << tok.error().message();
  return std::move(*tok);
}

std::string loadError(const Metadata &m) {
  Expected<Tokenizer> tok = Tokenizer::fromMetadata("bad.gguf", m);
  return tok ? std::string("loaded without error") : tok.error().message();
}

Metadata with(Metadata m, std::string_view key, Value value) {
  for (auto &[k, v] : m)
    if (k == key) {
      v = std::move(value);
      return m;
    }
  m.emplace_back(std::string(key), std::move(value));
  return m;
}

Metadata without(Metadata m, std::string_view key) {
  std::erase_if(m, [&](const auto &kv) { return kv.first == key; });
  return m;
}

std::vector<int32_t> bytesOf(std::string_view s) {
  std::vector<int32_t> ids;
  for (unsigned char c : s)
    ids.push_back(int32_t(c)); // byte tokens have the byte's id here
  return ids;
}

} // namespace

//===----------------------------------------------------------------------===//
// The split pattern
//===----------------------------------------------------------------------===//

TEST(Glm4Split, DigitsGroupByAtMostThree) {
  EXPECT_EQ(pieces("1234567"), (Pieces{"123", "456", "7"}));
  EXPECT_EQ(pieces("x12345y"), (Pieces{"x", "123", "45", "y"}));
  EXPECT_EQ(pieces("a 42"), (Pieces{"a", " ", "42"}));
  // Any \p{N}: Arabic-Indic digits, superscripts and fractions group too.
  EXPECT_EQ(pieces("\u0663\u0664\u0665\u0666\u00b2\u00bd"),
            (Pieces{"\u0663\u0664\u0665", "\u0666\u00b2\u00bd"}));
}

TEST(Glm4Split, ContractionsIgnoreCase) {
  EXPECT_EQ(pieces("don't"), (Pieces{"don", "'t"}));
  EXPECT_EQ(pieces("I'M"), (Pieces{"I", "'M"}));
  EXPECT_EQ(pieces("they'Re we'LL he'D"),
            (Pieces{"they", "'Re", " we", "'LL", " he", "'D"}));
  // The first alternative wins even inside a word; a non-contraction
  // apostrophe leads the letters after it.
  EXPECT_EQ(pieces("'sa"), (Pieces{"'s", "a"}));
  EXPECT_EQ(pieces("'x"), (Pieces{"'x"}));
  // U+017F LONG S case-folds to 's', as in Oniguruma's (?i).
  EXPECT_EQ(pieces("x'\u017fy"), (Pieces{"x", "'\u017f", "y"}));
  EXPECT_EQ(pieces("'"), (Pieces{"'"}));
}

TEST(Glm4Split, WhitespaceRuns) {
  // \s+(?!\S): a run before a word leaves its last space to the word.
  EXPECT_EQ(pieces("a  b"), (Pieces{"a", " ", " b"}));
  EXPECT_EQ(pieces("a    b"), (Pieces{"a", "   ", " b"}));
  // At the end of the text the whole run is one piece.
  EXPECT_EQ(pieces("a \t "), (Pieces{"a", " \t "}));
  EXPECT_EQ(pieces("   "), (Pieces{"   "}));
  // \s*[\r\n]+: up to and including the run's last line break.
  EXPECT_EQ(pieces("a \n\n  b"), (Pieces{"a", " \n\n", " ", " b"}));
  EXPECT_EQ(pieces("x\r\n"), (Pieces{"x", "\r\n"}));
  // A single whitespace before a non-letter is \s+ alone.
  EXPECT_EQ(pieces("a\t1"), (Pieces{"a", "\t", "1"}));
  // A tab (not only a space) may lead letters; a line break may not.
  EXPECT_EQ(pieces("\tab\ncd"), (Pieces{"\tab", "\n", "cd"}));
  // Unicode whitespace: NBSP and U+3000 are \s, U+001C and U+200B are not.
  EXPECT_EQ(pieces("a\u00a0\u3000b"), (Pieces{"a", "\u00a0", "\u3000b"}));
  EXPECT_EQ(pieces("a\034b"), (Pieces{"a", "\034b"}));
  EXPECT_EQ(pieces("a\u200bb"), (Pieces{"a", "\u200bb"}));
}

TEST(Glm4Split, PunctuationAndLetters) {
  EXPECT_EQ(pieces("a !!b"), (Pieces{"a", " !!", "b"}));
  EXPECT_EQ(pieces("end.\n\nnext"), (Pieces{"end", ".\n\n", "next"}));
  EXPECT_EQ(pieces("a  !"), (Pieces{"a", " ", " !"}));
  EXPECT_EQ(pieces("Hello, world!"), (Pieces{"Hello", ",", " world", "!"}));
  EXPECT_EQ(pieces("世界123"), (Pieces{"世界", "123"}));
  // A combining mark is no letter: it leads the letters after it.
  EXPECT_EQ(pieces("e\u0301te"), (Pieces{"e", "\u0301te"}));
  // An emoji is punctuation-like: it joins a run of its kind.
  EXPECT_EQ(pieces("hi 😀😀!"), (Pieces{"hi", " 😀😀!"}));
}

TEST(Glm4Split, InvalidUtf8IsKeptByteForByte) {
  // Each invalid byte is one character of no class, like punctuation.
  EXPECT_EQ(pieces("a\377b"), (Pieces{"a", "\377b"}));
  EXPECT_EQ(pieces("ok \xc3( x"), (Pieces{"ok", " \xc3(", " x"}));
  // A truncated sequence at the end, an overlong form, a surrogate.
  EXPECT_EQ(pieces("x\xe4\xb8"), (Pieces{"x", "\xe4\xb8"}));
  EXPECT_EQ(pieces("\300\257a"), (Pieces{"\300\257", "a"}));
  EXPECT_EQ(pieces("\xed\xa0\x80"), (Pieces{"\xed\xa0\x80"}));
}

TEST(Glm4Split, PiecesCoverAnyInput) {
  std::mt19937 rng(7);
  const std::string alphabet =
      std::string("ab1 \t\r\n'!\xff\xc3\xa9\xe4\xb8\x96", 16);
  for (int round = 0; round < 500; ++round) {
    std::string text;
    const int length = int(rng() % 40);
    for (int i = 0; i < length; ++i)
      text += alphabet[rng() % alphabet.size()];
    std::string joined;
    for (std::string_view p : splitGlm4(text)) {
      ASSERT_FALSE(p.empty()) << text;
      joined += p;
    }
    EXPECT_EQ(joined, text);
  }
  EXPECT_TRUE(splitGlm4("").empty());
}

TEST(Unicode, Classes) {
  EXPECT_EQ(classify('a'), CharClass::Letter);
  EXPECT_EQ(classify('Z'), CharClass::Letter);
  EXPECT_EQ(classify('7'), CharClass::Number);
  EXPECT_EQ(classify('!'), CharClass::Other);
  EXPECT_EQ(classify(' '), CharClass::Space);
  EXPECT_EQ(classify('\v'), CharClass::Space);
  EXPECT_EQ(classify(0x85), CharClass::Space);
  EXPECT_EQ(classify(0x1c), CharClass::Other); // isspace() in Python, not \s
  EXPECT_EQ(classify(0x2028), CharClass::Space);
  EXPECT_EQ(classify(0x180e), CharClass::Other); // Cf since Unicode 6.3
  EXPECT_EQ(classify(0x4e00), CharClass::Letter);
  EXPECT_EQ(classify(0x0663), CharClass::Number);
  EXPECT_EQ(classify(0x2160), CharClass::Number); // Nl: ROMAN NUMERAL ONE
  EXPECT_EQ(classify(0x0301), CharClass::Other);  // Mn
  EXPECT_EQ(classify(0x1f600), CharClass::Other);
  EXPECT_EQ(classify(0x20000), CharClass::Letter); // CJK Extension B
  EXPECT_EQ(classify(0x10ffff), CharClass::Other);
  EXPECT_EQ(classify(0x110000), CharClass::Other);
  EXPECT_FALSE(unicodeTablesVersion().empty());
}

TEST(Unicode, Utf8) {
  EXPECT_EQ(decodeUtf8("\xf0\x9f\x98\x80", 0).cp, 0x1f600u);
  EXPECT_EQ(decodeUtf8("\xf0\x9f\x98\x80", 0).length, 4u);
  for (std::string_view bad :
       {"\xc0\xaf", "\xe0\x80\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80",
        "\xf8\x88\x80\x80", "\x80", "\xe4\xb8"}) {
    Utf8Unit u = decodeUtf8(bad, 0);
    EXPECT_FALSE(u.valid) << gguf::printable(bad);
    EXPECT_EQ(u.length, 1u);
  }
  EXPECT_EQ(unfinishedUtf8Suffix(""), 0u);
  EXPECT_EQ(unfinishedUtf8Suffix("a\xf0"), 1u);
  EXPECT_EQ(unfinishedUtf8Suffix("a\xf0\x9f"), 2u);
  EXPECT_EQ(unfinishedUtf8Suffix("a\xf0\x9f\x98"), 3u);
  EXPECT_EQ(unfinishedUtf8Suffix("a\xf0\x9f\x98\x80"), 0u);
  EXPECT_EQ(unfinishedUtf8Suffix("\xe0\x80"), 0u); // can never be valid
  EXPECT_EQ(unfinishedUtf8Suffix("\x80\x80"), 0u);
  EXPECT_EQ(unfinishedUtf8Suffix("\xff"), 0u);
}

TEST(Unicode, IllFormedSubparts) {
  // The Unicode standard's example of U+FFFD substitution by maximal
  // subparts (chapter 3, "U+FFFD Substitution of Maximal Subparts"): 61 F1
  // 80 80 E1 80 C2 62 80 63 80 BF 64 reads a, FFFD, FFFD, FFFD, b, FFFD, c,
  // FFFD, FFFD, d; and surrogates, overlongs and values past U+10FFFF are
  // a FFFD a byte (their second byte is out of range).
  for (const auto &[bytes, want] :
       {std::pair{std::string_view("a\xf1\x80\x80\xe1\x80\xc2"
                                   "b\x80"
                                   "c\x80\xbf"
                                   "d"),
                  std::string("a?"
                              "?"
                              "?"
                              "b?c??d")},
        std::pair{std::string_view("\xed\xa0\x80"
                                   "x"),
                  std::string("???x")},
        std::pair{std::string_view("\xc0\xaf"), std::string("??")},
        std::pair{std::string_view("\xf4\x90\x80\x80"), std::string("????")},
        std::pair{std::string_view("\xee\xa3"
                                   "F"),
                  std::string("?F")},
        std::pair{std::string_view("\xf0\x9f\x98"), std::string("?")}}) {
    std::string got;
    for (size_t i = 0; i < bytes.size();) {
      const Utf8Unit u = decodeUtf8(bytes, i);
      if (u.valid) {
        got += bytes.substr(i, u.length);
        i += u.length;
      } else {
        got += '?';
        i += illFormedLength(bytes, i);
      }
    }
    EXPECT_EQ(got, want) << gguf::printable(bytes);
  }
}

TEST(Unicode, ByteLevelAlphabet) {
  EXPECT_EQ(byteToCodePoint('!'), uint32_t('!'));
  EXPECT_EQ(byteToCodePoint(' '), 0x120u);  // 'Ġ'
  EXPECT_EQ(byteToCodePoint('\n'), 0x10au); // 'Ċ'
  EXPECT_EQ(byteToCodePoint(0xad), 0x143u);
  for (int b = 0; b < 256; ++b)
    EXPECT_EQ(codePointToByte(byteToCodePoint(uint8_t(b))), uint8_t(b));
  EXPECT_EQ(codePointToByte(' '), std::nullopt);
  EXPECT_EQ(codePointToByte(0x4e00), std::nullopt);
  EXPECT_EQ(bytesOfByteLevelSpelling(byteLevelSpelling("a b\n\xff")),
            std::string("a b\n\xff"));
  EXPECT_EQ(bytesOfByteLevelSpelling("a b"), std::nullopt);
}

//===----------------------------------------------------------------------===//
// Encoding and decoding
//===----------------------------------------------------------------------===//

TEST(Tokenizer, MergesApplyLowestRankFirst) {
  TestVocab v;
  Tokenizer tok = load(v.metadata());
  // "b c" (rank 0) beats "a b" (rank 1), so "ab c" never applies.
  EXPECT_EQ(tok.encode("abc", true), (std::vector<int32_t>{'a', v.bc}));
  EXPECT_EQ(tok.encode("ab", true), (std::vector<int32_t>{v.ab}));
  // Equal ranks: the leftmost pair first.
  EXPECT_EQ(tok.encode("aaa", true), (std::vector<int32_t>{v.aa, 'a'}));
  EXPECT_EQ(tok.encode(" a", true), (std::vector<int32_t>{v.spaceA}));

  // With "a b" ranked first, "abc" becomes one token through "ab c".
  Vocab w;
  int32_t ab = w.merge("a", "b");
  w.merge("b", "c");
  int32_t abc = w.merge("ab", "c");
  Tokenizer other = load(w.metadata());
  EXPECT_EQ(other.encode("abc", true), (std::vector<int32_t>{abc}));
  EXPECT_EQ(other.encode("abab", true), (std::vector<int32_t>{ab, ab}));
}

TEST(Tokenizer, EncodesPiecesSeparately) {
  TestVocab v;
  Tokenizer tok = load(v.metadata());
  // "ab ab" is "ab", " ab": " ab" merges "a b" (rank 1) before "Ġ a"
  // (rank 4) can apply, and no merge crosses the boundary between pieces.
  EXPECT_EQ(tok.encode("ab ab", true), (std::vector<int32_t>{v.ab, ' ', v.ab}));
  std::vector<int32_t> ids = tok.encode("a a", true);
  EXPECT_EQ(ids, (std::vector<int32_t>{'a', v.spaceA}));
  // Repeated pieces come from the cache: same answer.
  EXPECT_EQ(tok.encode("aaa aaa aaa", true), tok.encode("aaa aaa aaa", true));
  EXPECT_TRUE(tok.encode("", true).empty());
}

TEST(Tokenizer, SpecialTokens) {
  TestVocab v;
  Tokenizer tok = load(v.metadata());
  EXPECT_EQ(tok.encode("ab<|user|>ab", true),
            (std::vector<int32_t>{v.ab, v.user, v.ab}));
  // The longest special token at a position wins.
  EXPECT_EQ(tok.encode("<|user|>!", true), (std::vector<int32_t>{v.userLong}));
  EXPECT_EQ(tok.encode("<|user|><|user|>", true),
            (std::vector<int32_t>{v.user, v.user}));
  // Without special parsing the text is plain text, but a UserDefined token
  // is still matched.
  std::vector<int32_t> plain = tok.encode("<|user|>", false);
  EXPECT_EQ(plain.size(), 8u);
  EXPECT_EQ(tok.encode("<ud>", false), (std::vector<int32_t>{v.userDefined}));
  EXPECT_EQ(tok.encode("a<ud>", true),
            (std::vector<int32_t>{'a', v.userDefined}));
  // Unused tokens are never matched.
  EXPECT_EQ(tok.encode("<unused>", true).size(), 8u);
  // A prefix of a special token is text.
  EXPECT_EQ(tok.encode("<|user", true), bytesOf("<|user"));
}

TEST(Tokenizer, DecodeAndRoundTrip) {
  TestVocab v;
  Tokenizer tok = load(v.metadata());
  for (std::string_view text :
       {"abc aaa", "x<|user|>y<ud>", "\xff\xfe bad \xc3(", "tab\t\r\n", "",
        "😀 世界 1234567"}) {
    Expected<std::string> back = tok.decode(tok.encode(text, true));
    ASSERT_TRUE(back) << back.error().message();
    EXPECT_EQ(*back, text);
  }
  // Any bytes at all come back unchanged.
  std::mt19937 rng(11);
  for (int round = 0; round < 300; ++round) {
    std::string bytes;
    const int length = int(rng() % 64);
    for (int i = 0; i < length; ++i)
      bytes += char(rng() % 256);
    EXPECT_EQ(*tok.decode(tok.encode(bytes, true)), bytes);
  }
  const int32_t ids[] = {v.ab, v.unused, v.user, ' '};
  EXPECT_EQ(*tok.decode(ids), "ab<|user|> ");
  const int32_t bad[] = {v.ab, tok.vocabSize()};
  Expected<std::string> err = tok.decode(bad);
  ASSERT_FALSE(err);
  EXPECT_EQ(err.error().message(),
            "decode: token #1: token id 265 is outside the vocabulary of 265 "
            "tokens");
  const int32_t negative[] = {-1};
  EXPECT_FALSE(tok.decode(negative));
}

TEST(StreamDecoder, HoldsBackPartialUtf8) {
  TestVocab v;
  Tokenizer tok = load(v.metadata());
  StreamDecoder stream(tok);
  // An emoji as four byte tokens: nothing until its last byte.
  std::vector<std::string> outputs;
  for (int32_t id : bytesOf("😀")) {
    Expected<std::string> out = stream.push(id);
    ASSERT_TRUE(out);
    outputs.push_back(*out);
  }
  EXPECT_EQ(outputs, (std::vector<std::string>{"", "", "", "😀"}));
  EXPECT_EQ(*stream.push('a'), "a");
  // A sequence split after its second byte, then completed by a token that
  // carries more text.
  EXPECT_EQ(*stream.push(0xe4), "");
  EXPECT_EQ(*stream.push(0xb8), "");
  EXPECT_EQ(*stream.push(0x96), "世");
  // Bytes that cannot become UTF-8 are not held back.
  EXPECT_EQ(*stream.push(0x80), "\x80");
  EXPECT_EQ(*stream.push(0xe0), "");
  EXPECT_EQ(*stream.push(0x80), "\xe0\x80");
  // Special tokens pass through; an unfinished sequence comes out on flush.
  EXPECT_EQ(*stream.push(0xf0), "");
  EXPECT_EQ(*stream.push(v.user), "\xf0<|user|>");
  EXPECT_EQ(*stream.push(0xf0), "");
  EXPECT_EQ(*stream.push(0x9f), "");
  EXPECT_EQ(stream.flush(), "\xf0\x9f");
  EXPECT_EQ(stream.flush(), "");
  // A bad id is an error and loses nothing held.
  EXPECT_EQ(*stream.push(0xc3), "");
  EXPECT_FALSE(stream.push(-5));
  EXPECT_EQ(*stream.push(0xa9), "é");
}

bool isValidUtf8(std::string_view s) {
  for (size_t pos = 0; pos < s.size();) {
    Utf8Unit u = decodeUtf8(s, pos);
    if (!u.valid)
      return false;
    pos += u.length;
  }
  return true;
}

TEST(StreamDecoder, ConcatenationIsDecode) {
  TestVocab v;
  Tokenizer tok = load(v.metadata());
  std::mt19937 rng(3);
  // Any ids, valid UTF-8 or not: nothing is lost, added or reordered.
  for (int round = 0; round < 200; ++round) {
    std::vector<int32_t> ids;
    const int length = int(rng() % 30);
    for (int i = 0; i < length; ++i)
      ids.push_back(int32_t(rng() % uint32_t(tok.vocabSize())));
    StreamDecoder stream(tok);
    std::string streamed;
    for (int32_t id : ids)
      streamed += *stream.push(id);
    streamed += stream.flush();
    EXPECT_EQ(streamed, *tok.decode(ids));
  }
  // Text that is valid UTF-8, mostly single byte tokens here: every part
  // returned is itself valid UTF-8, and the flush is empty.
  const std::string_view chars[] = {"a", " ", "é", "世", "😀", "👍🏽", "\n"};
  for (int round = 0; round < 100; ++round) {
    std::string text;
    for (int i = 0; i < 12; ++i)
      text += chars[rng() % std::size(chars)];
    StreamDecoder stream(tok);
    std::string streamed;
    for (int32_t id : tok.encode(text, true)) {
      std::string part = *stream.push(id);
      EXPECT_TRUE(isValidUtf8(part)) << gguf::printable(part);
      streamed += part;
    }
    EXPECT_EQ(stream.flush(), "");
    EXPECT_EQ(streamed, text);
  }
}

TEST(Tokenizer, Facts) {
  TestVocab v;
  Metadata m = v.metadata();
  m.emplace_back(std::string(kEosKey), Value::u32(uint32_t(v.user)));
  m.emplace_back(std::string(kBosKey), Value::i32(5));
  Tokenizer tok = load(m);
  EXPECT_EQ(tok.eosId(), v.user);
  EXPECT_EQ(tok.bosId(), 5);
  EXPECT_EQ(tok.eotId(), std::nullopt);
  EXPECT_EQ(tok.vocabSize(), int32_t(v.tokens.size()));
  EXPECT_EQ(tok.findToken("<|user|>"), v.user);
  EXPECT_EQ(tok.findToken("nope"), std::nullopt);
  EXPECT_EQ(tok.tokenType(v.userDefined), TokenType::UserDefined);
  EXPECT_EQ(tok.preTokenizer(), "glm4");
  EXPECT_FALSE(tok.preTokenizerDefaulted());

  Tokenizer alias = load(with(m, kPreKey, Value::string("chatglm-bpe")));
  EXPECT_EQ(alias.preTokenizer(), "chatglm-bpe");
  Tokenizer defaulted = load(without(m, kPreKey));
  EXPECT_TRUE(defaulted.preTokenizerDefaulted());
  EXPECT_EQ(defaulted.preTokenizer(), "glm4");
  // Without token types every token is Normal: specials are then text.
  Tokenizer untyped =
      load(without(with(v.metadata(), kTokensKey,
                        Value::stringArray(std::vector<std::string>(
                            v.tokens.begin(), v.tokens.begin() + 261))),
                   kTokenTypeKey));
  EXPECT_EQ(untyped.vocabSize(), 261);
}

//===----------------------------------------------------------------------===//
// Malformed metadata
//===----------------------------------------------------------------------===//

TEST(TokenizerMetadata, ModelAndPre) {
  Metadata m = TestVocab().metadata();
  EXPECT_EQ(loadError(without(m, kModelKey)),
            "bad.gguf: tokenizer.ggml.model: missing (Kiln reads byte-level "
            "BPE tokenizers, \"gpt2\")");
  EXPECT_EQ(loadError(with(m, kModelKey, Value::string("llama"))),
            "bad.gguf: tokenizer.ggml.model: tokenizer model \"llama\" is not "
            "supported (Kiln reads only byte-level BPE, \"gpt2\")");
  EXPECT_EQ(loadError(with(m, kModelKey, Value::u32(2))),
            "bad.gguf: tokenizer.ggml.model: expected a string, found uint32");
  EXPECT_EQ(loadError(with(m, kPreKey, Value::string("qwen2"))),
            "bad.gguf: tokenizer.ggml.pre: pre-tokenizer \"qwen2\" is not "
            "supported (Kiln implements \"glm4\", also named "
            "\"chatglm-bpe\")");
}

TEST(TokenizerMetadata, Tokens) {
  TestVocab v;
  Metadata m = v.metadata();
  EXPECT_EQ(loadError(without(m, kTokensKey)),
            "bad.gguf: tokenizer.ggml.tokens: missing");
  EXPECT_EQ(
      loadError(with(m, kTokensKey,
                     Value::array(gguf::ValueType::UInt32, {Value::u32(1)}))),
      "bad.gguf: tokenizer.ggml.tokens: expected an array of strings, "
      "found array of uint32");
  // An array whose declared element type its elements do not have (the
  // file reader never builds one; metadata built in memory can).
  EXPECT_EQ(
      loadError(with(m, kTokensKey,
                     Value::array(gguf::ValueType::String, {Value::u32(1)}))),
      "bad.gguf: tokenizer.ggml.tokens: token 0 is not a string");
  EXPECT_EQ(
      loadError(with(m, kMergesKey,
                     Value::array(gguf::ValueType::String,
                                  {Value::string("a b"), Value::u32(1)}))),
      "bad.gguf: tokenizer.ggml.merges: merge 1 is not a string");
  EXPECT_EQ(loadError(with(m, kTokensKey, Value::stringArray({}))),
            "bad.gguf: tokenizer.ggml.tokens: the vocabulary is empty");
  std::vector<std::string> duplicate = v.tokens;
  duplicate[v.unused] = "<|user|>";
  EXPECT_EQ(loadError(with(m, kTokensKey, Value::stringArray(duplicate))),
            "bad.gguf: tokenizer.ggml.tokens: token 264 \"<|user|>\" repeats "
            "token 261");
  // A byte without its token.
  std::vector<std::string> noByte = v.tokens;
  noByte['x'] = "xx";
  EXPECT_EQ(loadError(with(m, kTokensKey, Value::stringArray(noByte))),
            "bad.gguf: tokenizer.ggml.tokens: no token for byte 0x78 (spelled "
            "\"x\")");
  // A normal token not in the byte-level alphabet (a raw space).
  std::vector<std::string> raw = v.tokens;
  raw[v.unused] = "a b";
  Metadata rawTypes = m;
  std::vector<Value> types;
  for (int32_t t : v.types)
    types.push_back(Value::i32(t));
  types[v.unused] = Value::i32(1);
  rawTypes = with(with(m, kTokensKey, Value::stringArray(raw)), kTokenTypeKey,
                  Value::array(gguf::ValueType::Int32, types));
  EXPECT_EQ(loadError(rawTypes),
            "bad.gguf: tokenizer.ggml.tokens: token 264 \"a b\" is a "
            "byte-level token but is not spelled in the byte-level alphabet");
  // A byte whose token is a control token.
  types[v.unused] = Value::i32(5);
  types['x'] = Value::i32(3);
  EXPECT_EQ(loadError(with(m, kTokenTypeKey,
                           Value::array(gguf::ValueType::Int32, types))),
            "bad.gguf: tokenizer.ggml.tokens: the token for byte 0x78, 120 "
            "\"x\", is not a byte-level token");
}

TEST(TokenizerMetadata, TokenTypes) {
  TestVocab v;
  Metadata m = v.metadata();
  EXPECT_EQ(
      loadError(with(m, kTokenTypeKey,
                     Value::array(gguf::ValueType::Int32, {Value::i32(1)}))),
      "bad.gguf: tokenizer.ggml.token_type: 1 types for 265 tokens");
  EXPECT_EQ(loadError(with(m, kTokenTypeKey, Value::stringArray({"a"}))),
            "bad.gguf: tokenizer.ggml.token_type: expected an array of "
            "integers, found array of string");
  std::vector<Value> types(v.tokens.size(), Value::i32(1));
  types[7] = Value::i32(9);
  EXPECT_EQ(loadError(with(m, kTokenTypeKey,
                           Value::array(gguf::ValueType::Int32, types))),
            "bad.gguf: tokenizer.ggml.token_type: token 7 has type 9 "
            "(expected 1..6)");
}

TEST(TokenizerMetadata, Merges) {
  TestVocab v;
  Metadata m = v.metadata();
  auto mergesError = [&](std::vector<std::string> merges) {
    return loadError(with(m, kMergesKey, Value::stringArray(merges)));
  };
  EXPECT_EQ(loadError(without(m, kMergesKey)),
            "bad.gguf: tokenizer.ggml.merges: missing");
  EXPECT_EQ(mergesError({"a b", "zz b"}),
            "bad.gguf: tokenizer.ggml.merges: merge 1 \"zz b\" names \"zz\", "
            "which is not a token");
  EXPECT_EQ(mergesError({"a zz"}),
            "bad.gguf: tokenizer.ggml.merges: merge 0 \"a zz\" names \"zz\", "
            "which is not a token");
  EXPECT_EQ(mergesError({"c a"}),
            "bad.gguf: tokenizer.ggml.merges: merge 0 \"c a\" makes \"ca\", "
            "which is not a token");
  for (std::string bad : {"ab", " a", "a ", "a b c", "a  b"})
    EXPECT_NE(mergesError({bad}).find("is not two tokens separated by one "
                                      "space"),
              std::string::npos)
        << bad;
  EXPECT_EQ(mergesError({"a b", "b c", "a b"}),
            "bad.gguf: tokenizer.ggml.merges: merge 2 \"a b\" repeats merge 0");
  // No merges at all is a valid (byte-only) tokenizer.
  EXPECT_EQ(mergesError({}), "loaded without error");
}

TEST(TokenizerMetadata, SpecialIds) {
  Metadata m = TestVocab().metadata();
  EXPECT_EQ(loadError(with(m, kEosKey, Value::u32(265))),
            "bad.gguf: tokenizer.ggml.eos_token_id: token id 265 is outside "
            "the vocabulary of 265 tokens");
  EXPECT_EQ(loadError(with(m, kBosKey, Value::i32(-1))),
            "bad.gguf: tokenizer.ggml.bos_token_id: expected a non-negative "
            "integer token id, found int32");
  EXPECT_EQ(loadError(with(m, kPadKey, Value::string("1"))),
            "bad.gguf: tokenizer.ggml.padding_token_id: expected a "
            "non-negative integer token id, found string");
  EXPECT_EQ(loadError(with(m, kEotKey, Value::u64(uint64_t(1) << 40))),
            "bad.gguf: tokenizer.ggml.eot_token_id: token id 1099511627776 is "
            "outside the vocabulary of 265 tokens");
}

//===----------------------------------------------------------------------===//
// End of a reply
//===----------------------------------------------------------------------===//

// eos and eot, then GLM's turn markers that are control tokens: a GLM model
// ends a turn that calls a tool with <|observation|>, which is neither.
TEST(EndOfReply, EosEotAndGlmTurnMarkers) {
  Vocab v;
  const int32_t eos = v.add("<|endoftext|>", TokenType::Control);
  const int32_t user = v.add("<|user|>", TokenType::Control);
  const int32_t obs = v.add("<|observation|>", TokenType::Control);
  const int32_t stop = v.add("<stop>", TokenType::Control);
  Metadata m = with(with(v.metadata(), kEosKey, Value::u32(uint32_t(stop))),
                    kEotKey, Value::u32(uint32_t(user)));
  EXPECT_EQ(load(m).endOfReplyIds(),
            (std::vector<int32_t>{stop, user, eos, obs}));
  // Markers spelled as plain text are not turn markers.
  Vocab plain;
  plain.add("<|observation|>", TokenType::Normal);
  const int32_t plainEos = plain.add("<|endoftext|>", TokenType::Control);
  EXPECT_EQ(
      load(with(plain.metadata(), kEosKey, Value::u32(uint32_t(plainEos))))
          .endOfReplyIds(),
      (std::vector<int32_t>{plainEos}));
  // Nothing set, no markers: none.
  EXPECT_TRUE(load(Vocab().metadata()).endOfReplyIds().empty());
}
