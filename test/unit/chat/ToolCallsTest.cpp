//===- ToolCallsTest.cpp - GLM tool-call markup parsed into OpenAI's shape -===//
//
// The parser against hand-written replies (typed arguments, several calls,
// malformed calls kept as text), against Kiln's own GLM template (what the
// template writes for an assistant turn's tool_calls parses back to the same
// arguments), and the streaming form against the whole-text parse for every
// way of cutting the text into pieces of 1 to 7 bytes.
//
//===----------------------------------------------------------------------===//
#include "chat/ChatTemplate.h"
#include "chat/JsonValue.h"
#include "chat/ToolCalls.h"

#include <gtest/gtest.h>

using namespace kiln;
using namespace kiln::chat;
using json = nlohmann::ordered_json;

namespace {

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"},
      "metric": {"type": "boolean"}}}}},
  {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {
      "query": {"type": "string"}, "limit": {"type": "integer"},
      "exact": {"type": "boolean"}, "tags": {"type": "array"}}}}}
])");

TEST(ToolCalls, PlainReplyHasNoCalls) {
  ParsedReply r = parseToolCalls("Hello <b>world</b>\n", kTools);
  EXPECT_EQ(r.content, "Hello <b>world</b>\n");
  EXPECT_TRUE(r.calls.empty());
}

TEST(ToolCalls, ArgumentsTypedByTheSchema) {
  ParsedReply r = parseToolCalls(
      "Let me check.\n<tool_call>get_weather\n"
      "<arg_key>city</arg_key>\n<arg_value>42</arg_value>\n"
      "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n"
      "<arg_key>metric</arg_key>\n<arg_value>true</arg_value>\n"
      "<arg_key>extra</arg_key>\n<arg_value>[1, 2]</arg_value>\n"
      "<arg_key>note</arg_key>\n<arg_value>not json</arg_value>\n"
      "</tool_call>",
      kTools);
  EXPECT_EQ(r.content, "Let me check.");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  // city is a string parameter, so "42" stays text; extra and note are not
  // in the schema: JSON where it parses, else text.
  EXPECT_EQ(r.calls[0].arguments,
            R"({"city":"42","days":3,"metric":true,"extra":[1,2],)"
            R"("note":"not json"})");
}

TEST(ToolCalls, SeveralCallsAndNoArguments) {
  ParsedReply r = parseToolCalls(
      "<tool_call>now\n</tool_call>\n<tool_call>ping\n<arg_key>host</arg_key>"
      "\n<arg_value>a b</arg_value>\n</tool_call>\n",
      json());
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "now");
  EXPECT_EQ(r.calls[0].arguments, "{}");
  EXPECT_EQ(r.calls[1].name, "ping");
  EXPECT_EQ(r.calls[1].arguments, R"({"host":"a b"})");
}

TEST(ToolCalls, MalformedCallsStayText) {
  for (std::string text :
       {"<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>",
        "<tool_call>f\n<arg_key>a</arg_key>junk<arg_value>1</arg_value>"
        "</tool_call>",
        "<tool_call>\n<arg_key>a</arg_key><arg_value>1</arg_value>"
        "</tool_call>",
        "<tool_call>f\nstray text\n</tool_call>",
        "<tool_call>f\n<arg_key>a</arg_key><arg_value>1</tool_call>"}) {
    ParsedReply r = parseToolCalls(text, kTools);
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty()) << text;
  }
  // A malformed call before a good one stays text; the good one is parsed.
  ParsedReply r = parseToolCalls(
      "A<tool_call></tool_call> B\n<tool_call>now\n</tool_call>", kTools);
  EXPECT_EQ(r.content, "A<tool_call></tool_call> B");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "now");
}

// Kiln's GLM template writes an assistant turn's calls; parsing that text
// gives the calls back.
TEST(ToolCalls, InvertsKilnsGlmTemplate) {
  json call = json::parse(R"({"type": "function", "function": {
      "name": "search", "arguments": {"query": "kiln \"fast\" <b>",
      "limit": 5, "exact": false, "tags": ["a", "b"]}}})");
  json messages = json::array(
      {{{"role", "user"}, {"content", "Find it"}},
       {{"role", "assistant"},
        {"content", "Sure."},
        {"tool_calls", json::array({call, call})}}});
  Expected<Value> msgs = valueFromJson(messages, "messages");
  Expected<Value> tools = valueFromJson(kTools, "tools");
  ASSERT_TRUE(msgs && tools);
  Expected<ChatTemplate> tmpl = ChatTemplate::parse(glmDefaultTemplate(), "glm");
  ASSERT_TRUE(tmpl);
  Expected<std::string> text = tmpl->render(
      chatContext(*msgs, false, std::nullopt, std::nullopt, *tools));
  ASSERT_TRUE(text) << text.error().message();
  const std::string marker = "<|assistant|>\n";
  size_t at = text->rfind(marker);
  ASSERT_NE(at, std::string::npos);
  ParsedReply r = parseToolCalls(text->substr(at + marker.size()), kTools);
  EXPECT_EQ(r.content, "Sure.");
  ASSERT_EQ(r.calls.size(), 2u);
  for (const ToolCall &c : r.calls) {
    EXPECT_EQ(c.name, "search");
    EXPECT_EQ(json::parse(c.arguments), call["function"]["arguments"]);
  }
}

TEST(ToolCalls, StreamingMatchesTheWholeText) {
  const std::string texts[] = {
      "Plain text with trailing spaces   ",
      "ends in a marker's start <tool_c",
      "a < b and <tool> tags\n\n",
      "Checking.\n\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
      "<arg_value>Paris</arg_value>\n</tool_call>",
      "<tool_call>now\n</tool_call>\n<tool_call>now\n</tool_call>",
      "<tool_call>cut short\n<arg_key>a</arg_key>"};
  for (const std::string &text : texts) {
    ParsedReply whole = parseToolCalls(text, kTools);
    for (size_t size = 1; size <= 7; ++size) {
      ToolCallStream stream;
      std::string shown;
      for (size_t at = 0; at < text.size(); at += size) {
        std::string piece = stream.push(text.substr(at, size));
        EXPECT_EQ(piece.find("<tool_call>"), std::string::npos);
        shown += piece;
      }
      ParsedReply rest = stream.finish(kTools);
      SCOPED_TRACE(text + " in pieces of " + std::to_string(size));
      EXPECT_EQ(shown + rest.content, whole.content);
      ASSERT_EQ(rest.calls.size(), whole.calls.size());
      for (size_t i = 0; i < whole.calls.size(); ++i) {
        EXPECT_EQ(rest.calls[i].name, whole.calls[i].name);
        EXPECT_EQ(rest.calls[i].arguments, whole.calls[i].arguments);
      }
    }
  }
  // Text streams as it comes: only a possible marker's start and the
  // whitespace before it are held back.
  ToolCallStream stream;
  EXPECT_EQ(stream.push("Hello"), "Hello");
  EXPECT_EQ(stream.push(" world <tool"), " world");
  EXPECT_FALSE(stream.inCall());
  EXPECT_EQ(stream.push("s> x"), " <tools> x");
  EXPECT_EQ(stream.push("\n<tool_call>f\n"), "");
  EXPECT_TRUE(stream.inCall());
}

TEST(ToolCalls, ArgumentTextBecomesObjects) {
  json messages = json::parse(R"([
    {"role": "user", "content": "x"},
    {"role": "assistant", "content": null, "tool_calls": [
      {"id": "1", "type": "function",
       "function": {"name": "f", "arguments": "{\"a\": 1, \"b\": \"c\"}"}},
      {"id": "2", "type": "function",
       "function": {"name": "g", "arguments": "[1]"}},
      {"id": "3", "type": "function",
       "function": {"name": "h", "arguments": "not json"}}]}])");
  argumentsToObjects(messages);
  const json &calls = messages[1]["tool_calls"];
  EXPECT_EQ(calls[0]["function"]["arguments"], json::parse(R"({"a":1,"b":"c"})"));
  EXPECT_EQ(calls[1]["function"]["arguments"], "[1]");
  EXPECT_EQ(calls[2]["function"]["arguments"], "not json");
}

} // namespace
