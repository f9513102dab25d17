//===- JsonPrefixTest.cpp - The JSON prefix recogniser ---------------------===//
//
// Whole documents byte by byte (every prefix taken, whole only at the end),
// texts that go wrong at a stated byte (taken up to it, refused there, the
// state unchanged by the refusal), and `accepts` against `push` on the
// pieces of seeded random cuts of the documents and their corruptions.
//
//===----------------------------------------------------------------------===//
#include "chat/JsonPrefix.h"

#include "support/Random.h"

#include "ConstraintStates.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace kiln::chat;

namespace {

/// Valid texts for objectOnly (objects) and for any value.
const std::vector<std::string> kObjects = {
    "{}",
    " \t\r\n{ }\n",
    R"({"a":1})",
    R"({"a" : [1, -2.5e+3, 0, 0.25, 1E9, -0, true, false, null], "b": {}})",
    R"({"k":"\"\\\/\b\f\n\r\t\u00e9\uD83D\uDE00","n":{"m":[[],[{}]]}})",
    "{\"utf8\":\"\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xed\x9f\xbf "
    "\xf4\x8f\xbf\xbf\"}",
    R"({"deep":[[[[[[[[[[1]]]]]]]]]], "e": 12.5e-10})",
};
const std::vector<std::string> kValues = {
    "[1, 2]", "\"text\"", "true", "null", "-12.5e3 ", "0 ", "[]",
};

void expectWhole(JsonPrefix &p, const std::string &text) {
  for (size_t i = 0; i < text.size(); ++i) {
    ASSERT_FALSE(p.complete() && text.find_first_not_of(" \t\r\n", i) !=
                                     std::string::npos)
        << text << ": whole before byte " << i;
    ASSERT_TRUE(p.accepts(text.substr(i, 1))) << text << ": byte " << i;
    ASSERT_TRUE(p.push(text.substr(i, 1))) << text << ": byte " << i;
  }
  EXPECT_TRUE(p.complete()) << text;
  EXPECT_EQ(p.depth(), 0) << text;
}

TEST(JsonPrefix, TakesWholeDocumentsByteByByte) {
  for (const std::string &text : kObjects) {
    JsonPrefix p(true);
    expectWhole(p, text);
  }
  for (const std::string &text : kValues) {
    JsonPrefix p(false);
    expectWhole(p, text);
  }
  // A top-level number is whole only once something ends it.
  JsonPrefix number(false);
  ASSERT_TRUE(number.push("12"));
  EXPECT_FALSE(number.complete());
  ASSERT_TRUE(number.push(" "));
  EXPECT_TRUE(number.complete());
}

TEST(JsonPrefix, RefusesAtTheFirstWrongByte) {
  struct Case {
    bool objectOnly;
    std::string text;
    size_t bad; ///< the first byte refused
  };
  const std::vector<Case> cases = {
      {true, "[1]", 0},             // json_object: not an object
      {true, "\"a\"", 0},
      {true, "{} {}", 3},           // nothing after the whole text
      {true, "{}x", 2},
      {true, "{a:1}", 1},           // keys are strings
      {true, "{\"a\" 1}", 5},       // the colon
      {true, "{\"a\":1,}", 7},      // no trailing comma
      {true, "{\"a\":01}", 6},      // no leading zero
      {true, "{\"a\":+1}", 5},
      {true, "{\"a\":1.}", 7},      // digits after the point
      {true, "{\"a\":1e}", 7},
      {true, "{\"a\":.5}", 5},
      {true, "{\"a\":tru}", 8},
      {true, "{\"a\":nul1}", 8},
      {true, "{\"a\":[1 2]}", 8},
      {true, "{\"a\":[1,]}", 8},
      {true, "{\"a\":[}", 6},
      {true, "{\"a\":\"\\x\"}", 7},  // not an escape
      {true, "{\"a\":\"\\u12G4\"}", 10},
      {true, "{\"a\":\"\x01\"}", 6}, // a control byte
      {true, "{\"a\":\"\xc0\xaf\"}", 6}, // overlong
      {true, "{\"a\":\"\xe0\x80\x80\"}", 7},
      {true, "{\"a\":\"\xed\xa0\x80\"}", 7}, // a surrogate
      {true, "{\"a\":\"\xf4\x90\x80\x80\"}", 7}, // past U+10FFFF
      {true, "{\"a\":\"\xc3\"}", 7},  // a lead without its continuation
      {true, "{\"a\":\"\x80\"}", 6},  // a lone continuation
      {false, "[1]]", 3},
      {false, "-a", 1},
  };
  for (const Case &c : cases) {
    JsonPrefix p(c.objectOnly);
    for (size_t i = 0; i < c.bad; ++i)
      ASSERT_TRUE(p.push(c.text.substr(i, 1))) << c.text << ": byte " << i;
    const int depth = p.depth();
    EXPECT_FALSE(p.accepts(c.text.substr(c.bad, 1))) << c.text;
    EXPECT_FALSE(p.push(c.text.substr(c.bad))) << c.text;
    // The refusal left the state as it was: the good prefix goes on.
    EXPECT_EQ(p.depth(), depth) << c.text;
  }
}

TEST(JsonPrefix, NestingIsBounded) {
  JsonPrefix p(false);
  std::string open(JsonPrefix::kMaxDepth, '[');
  ASSERT_TRUE(p.push(open));
  EXPECT_EQ(p.depth(), JsonPrefix::kMaxDepth);
  EXPECT_FALSE(p.accepts("["));
  EXPECT_FALSE(p.push("["));
  EXPECT_TRUE(p.push(std::string(JsonPrefix::kMaxDepth, ']')));
  EXPECT_TRUE(p.complete());
}

TEST(JsonPrefix, AcceptsAgreesWithPushOnRandomPieces) {
  const uint64_t seed = 20261205;
  SCOPED_TRACE("seed " + std::to_string(seed));
  kiln::Rng rng(seed);
  std::vector<std::string> texts = kObjects;
  // Corruptions: a byte replaced by one of JSON's structural or odd bytes.
  const std::string odd = "{}[]\",:\\ 0-.eE\x01\x80\xc3\xed";
  for (const std::string &t : kObjects)
    for (int k = 0; k < 20; ++k) {
      std::string c = t;
      c[rng.below(c.size())] = odd[rng.below(odd.size())];
      texts.push_back(c);
    }
  size_t pieces = 0;
  for (const std::string &text : texts)
    for (int round = 0; round < 10; ++round) {
      JsonPrefix p(true);
      for (size_t at = 0; at < text.size();) {
        // Pieces of 1-70 bytes: past the overlay's 64 too.
        const size_t n = 1 + rng.below(round == 9 ? 70 : 8);
        const std::string piece = text.substr(at, n);
        const bool accepted = p.accepts(piece);
        JsonPrefix copy = p;
        ASSERT_EQ(copy.push(piece), accepted) << text << " at " << at;
        ++pieces;
        if (!accepted)
          break;
        ASSERT_TRUE(p.push(piece));
        at += piece.size();
      }
    }
  EXPECT_GT(pieces, 1000u);
}

} // namespace

namespace {

/// States with equal keys accept the same probes and agree on complete():
/// every prefix of the documents against every other.
TEST(JsonPrefix, EqualKeysAcceptAlike) {
  const std::vector<std::string> probes = {
      "\"",  "}", "]", ",",  ":", " ",        "1",    "a",    "{\"", "\"}",
      "\"]", "e", ".", "\\", "u", "\xc3\xa9", "\xa9", "true", "]}",  "0,"};
  std::vector<JsonPrefix> states;
  for (const std::string &text : kObjects) {
    std::vector<JsonPrefix> along = statesAlong(JsonPrefix(true), text);
    states.insert(states.end(), along.begin(), along.end());
  }
  EXPECT_GT(checkEqualKeys(states, probes), 100u); // strings and values recur
}

} // namespace
