//===- ToolCalls.h - GLM's tool-call markup in a reply, parsed -*- C++ -*-===//
//
// A GLM model calls a tool by writing, after any text of its reply,
//
//   <tool_call>NAME
//   <arg_key>KEY</arg_key>
//   <arg_value>VALUE</arg_value>
//   ...
//   </tool_call>
//
// (the form Kiln's GLM template writes an assistant turn's tool_calls in,
// docs/chat.md). This turns such a reply into OpenAI's shape: the text
// outside the calls, and per call the function's name and its arguments as
// JSON object text. A value is a JSON string where the tool's schema says
// the parameter is a string; otherwise it is read as JSON when it parses
// (numbers, booleans, objects, lists) and kept as a string when not. A call
// that is not well formed (unterminated, no name, text between its pairs)
// stays in the text, as the model wrote it.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_CHAT_TOOLCALLS_H
#define KILN_CHAT_TOOLCALLS_H

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace kiln::chat {

struct ToolCall {
  std::string name;
  std::string arguments; ///< a JSON object, as compact text
};

struct ParsedReply {
  std::string content; ///< the text outside the calls
  std::vector<ToolCall> calls;
};

/// The calls in `text` and the text around them (trailing whitespace before
/// the first call trimmed when there are calls). `tools` is the request's
/// "tools" array (null when there is none): parameter types come from each
/// function's "parameters" JSON schema.
ParsedReply parseToolCalls(std::string_view text,
                           const nlohmann::ordered_json &tools);

/// A reply's text as it streams: push() returns what is certainly content,
/// holding back a tail that may begin a call (whitespace, then a prefix of
/// "<tool_call>"); from the first "<tool_call>" on it returns nothing, and
/// finish() parses the rest.
class ToolCallStream {
public:
  std::string push(std::string_view piece);
  /// Whether a "<tool_call>" has appeared (what follows is held).
  bool inCall() const { return inCall_; }
  /// The content not yet returned and the calls, once the reply has ended.
  ParsedReply finish(const nlohmann::ordered_json &tools) const;

private:
  std::string text_;
  size_t shown_ = 0;
  bool inCall_ = false;
};

/// In `messages` (an OpenAI request's), each assistant tool call whose
/// function.arguments is text holding a JSON object gets that object
/// instead, so that a template writes it key by key as the model wrote it
/// (OpenAI clients send arguments as text).
void argumentsToObjects(nlohmann::ordered_json &messages);

} // namespace kiln::chat

#endif // KILN_CHAT_TOOLCALLS_H
