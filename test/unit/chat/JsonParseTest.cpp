//===- JsonParseTest.cpp - the linear-time JSON parser against nlohmann's
//--===//
//
// parseOrderedJson must give the document nlohmann::ordered_json::parse
// gives (the same dump, key order and repeated keys included) and refuse
// what it refuses: hand-written documents, errors, seeded random documents
// whose keys repeat, and one object of 20,000 keys (nlohmann's own parser
// takes a quadratic ~0.2 s there; ours is the reason for the file).
//
//===----------------------------------------------------------------------===//
#include "chat/JsonParse.h"

#include "support/Random.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

using namespace kiln;
using namespace kiln::chat;
using json = nlohmann::ordered_json;

namespace {

void expectSame(const std::string &text) {
  const json want = json::parse(text);
  const json got = parseOrderedJson(text);
  EXPECT_EQ(got.dump(), want.dump()) << text;
  EXPECT_EQ(got, want) << text;
}

TEST(JsonParse, HandWrittenDocuments) {
  for (const char *text :
       {"null", "true", "0", "-0", "1.5e300", "-9223372036854775808",
        "18446744073709551615", "2.5", R"("\u00e9\ud83d\ude00\n")", "[]", "{}",
        "[[[]], {}, [1, [2, [3]]]]", R"({"b": 1, "a": 2})",
        R"({"a": 1, "b": {"c": [true, null, "x"]}, "a": 3})",
        R"({"k": {"k": {"k": {}}}, "k": [1]})", R"( [ 1 , "two" ] )"})
    expectSame(text);
}

TEST(JsonParse, RefusesWhatNlohmannRefuses) {
  for (const char *text : {"", "{", R"({"a":})", "[1,", R"({"a" 1})", "[1] x",
                           "nul", R"("\x")", "01", "[1,]"}) {
    EXPECT_THROW(json::parse(text), json::exception) << text;
    EXPECT_THROW(parseOrderedJson(text), json::exception) << text;
  }
}

/// A random document of nested arrays and objects whose keys come from a
/// small alphabet, so that they repeat.
std::string randomDocument(Rng &rng, int depth) {
  const uint64_t kind = depth > 4 ? rng.below(4) : rng.below(6);
  switch (kind) {
  case 0:
    return std::to_string(int64_t(rng.next() >> 20) - (int64_t(1) << 43));
  case 1:
    return rng.below(2) ? "true" : "null";
  case 2:
    return "\"s" + std::to_string(rng.below(100)) + "\"";
  case 3: {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%.17g", rng.normal() * 1e3);
    return buffer;
  }
  case 4: {
    std::string out = "[";
    for (uint64_t i = 0, n = rng.below(5); i < n; ++i)
      out += (i ? "," : "") + randomDocument(rng, depth + 1);
    return out + "]";
  }
  default: {
    std::string out = "{";
    for (uint64_t i = 0, n = rng.below(7); i < n; ++i)
      out += (i ? ",\"k" : "\"k") + std::to_string(rng.below(4)) +
             "\":" + randomDocument(rng, depth + 1);
    return out + "}";
  }
  }
}

TEST(JsonParse, RandomDocumentsWithRepeatedKeys) {
  const uint64_t seed = 20261207;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  Rng rng(seed);
  for (int i = 0; i < 2000; ++i)
    expectSame(randomDocument(rng, 0));
}

TEST(JsonParse, NestsOnlySoDeep) {
  auto nested = [](size_t depth) {
    return std::string(depth, '[') + std::string(depth, ']');
  };
  expectSame(nested(kMaxNestingDepth));
  expectSame(R"({"a": )" + nested(kMaxNestingDepth - 1) + "}");
  EXPECT_THROW(parseOrderedJson(nested(kMaxNestingDepth + 1)), JsonTooDeep);
  EXPECT_THROW(parseOrderedJson(R"({"a": )" + nested(kMaxNestingDepth) + "}"),
               JsonTooDeep);
  // A million levels: refused at level 257, long before any recursion.
  try {
    parseOrderedJson(nested(1000000));
    ADD_FAILURE() << "a million levels parsed";
  } catch (const json::exception &e) {
    EXPECT_NE(std::string(e.what()).find("nested too deeply (limit 256)"),
              std::string::npos)
        << e.what();
  }
}

TEST(JsonParse, ManyKeysInOneObject) {
  std::string text = "{";
  for (int i = 0; i < 20000; ++i)
    text += (i ? ",\"key" : "\"key") + std::to_string(i * 7919 % 20000) +
            "\":" + std::to_string(i);
  text += ",\"key5\":\"last\"}"; // a repeat, at the end
  expectSame(text);
}

} // namespace
