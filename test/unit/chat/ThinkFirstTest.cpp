//===- ThinkFirstTest.cpp - A thinking block before a constrained answer
//---===//
//
// Replies with and without a thinking block before a JSON object or a tool
// call (whole only once the answer is), refusals at stated bytes, when
// control tokens may spell the reply, and `accepts` against `push` on
// seeded random pieces.
//
//===----------------------------------------------------------------------===//
#include "chat/ThinkFirst.h"
#include "chat/JsonPrefix.h"
#include "chat/ToolCallPrefix.h"

#include "support/Random.h"

#include "ConstraintStates.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace kiln::chat;

namespace {

ThinkFirst json() { return ThinkFirst(std::make_unique<JsonPrefix>()); }

ThinkFirst calls() {
  std::vector<ToolSignature> tools = {{"get", {"city"}, {}, {true}}};
  return ThinkFirst(std::make_unique<ToolCallPrefix>(tools, false));
}

const std::string kCall = "<tool_call>get\n<arg_key>city</arg_key>\n"
                          "<arg_value>Oslo</arg_value>\n</tool_call>";

} // namespace

TEST(ThinkFirst, ThinkingThenTheAnswer) {
  for (const std::string &text :
       {std::string("{\"a\":1}"), std::string(" \n{}"),
        std::string("<think>Let me see: {\"x\" < 3</th </think>\n{\"a\":[]}"),
        std::string("\n<think></think>{}")}) {
    ThinkFirst p = json();
    for (size_t i = 0; i < text.size(); ++i) {
      ASSERT_FALSE(p.complete()) << text << ": whole before byte " << i;
      ASSERT_TRUE(p.accepts(text.substr(i, 1))) << text << " at " << i;
      ASSERT_TRUE(p.push(text.substr(i, 1))) << text << " at " << i;
    }
    EXPECT_TRUE(p.complete()) << text;
    EXPECT_TRUE(p.final()) << text;
  }
  // A tool call shares "<t" with "<think>": both are followed.
  for (const std::string &text :
       {kCall, "<think>call get</think>\n\n" + kCall}) {
    ThinkFirst p = calls();
    ASSERT_TRUE(p.push(text.substr(0, 2)));
    EXPECT_FALSE(p.answering());
    ASSERT_TRUE(p.push(text.substr(2)));
    EXPECT_TRUE(p.answering());
    EXPECT_TRUE(p.final()) << text;
  }
}

TEST(ThinkFirst, RefusesAtTheStatedByte) {
  struct Case {
    bool calls;
    std::string text;
    size_t bad;
  } cases[] = {
      {false, "<thinx", 5}, // not "<think>" and no JSON
      {false, "<x", 1},
      {false, "<think>a</think> x", 17}, // the answer must be JSON
      {false, "{} <think>", 3},          // no thinking after the answer
      {true, "<tool_call>got", 12},
      {true, "<think>ok</think><th", 19},         // one block only
      {true, "<tool_call>get\n</tool_call>", 16}, // "city" is required
      // At most 64 whitespace bytes in a row around the block.
      {false, std::string(65, ' ') + "{}", 64},
      {true, "<think>a</think>" + std::string(65, '\n'), 16 + 64},
  };
  for (const Case &c : cases) {
    ThinkFirst p = c.calls ? calls() : json();
    ASSERT_TRUE(p.push(c.text.substr(0, c.bad))) << c.text;
    const std::string before = p.key();
    EXPECT_FALSE(p.accepts(c.text.substr(c.bad, 1))) << c.text;
    EXPECT_FALSE(p.push(c.text.substr(c.bad))) << c.text;
    EXPECT_EQ(p.key(), before) << c.text;
  }
}

TEST(ThinkFirst, WhitespaceRunsAroundTheBlockAreBounded) {
  ThinkFirst p = json();
  ASSERT_TRUE(p.push(std::string(63, ' ')));
  const std::string room = p.key();
  ASSERT_TRUE(p.push(" "));
  EXPECT_NE(p.key(), room); // one more space was allowed there, not here
  EXPECT_FALSE(p.accepts(" "));
  ASSERT_TRUE(p.push("<think>"));
  ASSERT_TRUE(p.push(std::string(500, ' '))); // the thinking is free text
  ASSERT_TRUE(p.push("</think>" + std::string(64, '\t')));
  EXPECT_FALSE(p.accepts("\t"));
  ASSERT_TRUE(p.push("{"));
  EXPECT_TRUE(p.answering());
}

TEST(ThinkFirst, ControlTokensWhereTheStateTakesThem) {
  ThinkFirst p = json();
  EXPECT_TRUE(p.takesControlTokens()); // "<think>" may be a special token
  ASSERT_TRUE(p.push("<think>hm"));
  EXPECT_TRUE(p.takesControlTokens());
  ASSERT_TRUE(p.push("</think>{"));
  EXPECT_FALSE(p.takesControlTokens()); // JSON: text tokens only
  ThinkFirst q = calls();
  ASSERT_TRUE(q.push("<think></think><tool_call>"));
  EXPECT_TRUE(q.takesControlTokens()); // GLM's call markers
}

TEST(ThinkFirst, AcceptsAgreesWithPushOnRandomPieces) {
  const uint64_t seed = 5;
  SCOPED_TRACE("seed " + std::to_string(seed));
  kiln::Rng rng(seed);
  const std::vector<std::string> texts = {
      "<think>a <b> </thin </think> {\"k\": \"</think>\"}",
      " <think>\n</think>\n" + kCall, kCall, "{\"z\": [1, 2]}"};
  size_t refused = 0;
  for (int round = 0; round < 80; ++round) {
    std::string text = texts[size_t(round) % texts.size()];
    const bool isCall = text.find("tool_call") != std::string::npos;
    if (round >= 8)
      text[rng.below(text.size())] = "<>/{}\"tk "[rng.below(9)];
    ThinkFirst p = isCall ? calls() : json();
    const bool taken = takePieces(p, text, rng, 7);
    refused += !taken;
    if (round < 8) {
      EXPECT_TRUE(taken && p.complete()) << text;
    }
  }
  EXPECT_GT(refused, 10u);
  const std::vector<ThinkFirst> states = statesAlong(json(), texts[0]);
  checkEqualKeys(states, {"<", "</think>", "{", "}", "\"", "x", " "});
}
