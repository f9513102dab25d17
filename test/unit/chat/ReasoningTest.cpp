//===- ReasoningTest.cpp - A reply's thinking block split from its answer -===//
//
// The whole-text split on hand-written replies, and the streaming form
// against it for every cut of each reply into pieces of 1 to 9 bytes.
//
//===----------------------------------------------------------------------===//
#include "chat/Reasoning.h"

#include <gtest/gtest.h>

using namespace kiln::chat;

namespace {

TEST(Reasoning, SplitsTheThinkingBlock) {
  SplitReply r = splitReasoning("\n<think>Two steps.\nFirst</think>\n\nIt is 4.");
  EXPECT_EQ(r.reasoning, "Two steps.\nFirst");
  EXPECT_EQ(r.answer, "It is 4.");
  // No block: all answer, as written.
  r = splitReasoning("  It is 4 <think>not a block</think>");
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.answer, "  It is 4 <think>not a block</think>");
  // A block cut short: all reasoning.
  r = splitReasoning("<think>Still going </thi");
  EXPECT_EQ(r.reasoning, "Still going </thi");
  EXPECT_EQ(r.answer, "");
  // An empty block (thinking off).
  r = splitReasoning("<think></think>Yes.");
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.answer, "Yes.");
}

TEST(Reasoning, StreamingMatchesTheWholeText) {
  const std::string texts[] = {
      "\n<think>Two steps.\nFirst</think>\n\nIt is 4.",
      "  It is 4 <think>not a block</think>",
      "<think>Still going </thi",
      "<think></think>Yes.",
      "<think>a</think>\n\n",
      " <thin",
      "<",
      "",
      "<think>x </ think> </think>done"};
  for (const std::string &text : texts) {
    SplitReply whole = splitReasoning(text);
    for (size_t size = 1; size <= 9; ++size) {
      SCOPED_TRACE("'" + text + "' in pieces of " + std::to_string(size));
      ReasoningStream stream;
      std::string reasoning, answer;
      for (size_t at = 0; at < text.size(); at += size) {
        SplitReply part = stream.push(text.substr(at, size));
        // The answer never starts before the reasoning has ended.
        EXPECT_TRUE(part.answer.empty() || whole.reasoning.size() ==
                                               reasoning.size() +
                                                   part.reasoning.size());
        reasoning += part.reasoning;
        answer += part.answer;
      }
      SplitReply rest = stream.finish();
      EXPECT_EQ(reasoning + rest.reasoning, whole.reasoning);
      EXPECT_EQ(answer + rest.answer, whole.answer);
    }
  }
}

TEST(Reasoning, StreamsAsItComes) {
  ReasoningStream stream;
  EXPECT_EQ(stream.push("\n<thi").reasoning, "");
  EXPECT_EQ(stream.push("nk>Let me").reasoning, "Let me");
  SplitReply r = stream.push(" see</th");
  EXPECT_EQ(r.reasoning, " see"); // "</th" may begin the closing tag
  r = stream.push("ink>\n");
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.answer, "");
  r = stream.push("4");
  EXPECT_EQ(r.answer, "4");
  EXPECT_EQ(stream.push(" <think>").answer, " <think>");
}

} // namespace
