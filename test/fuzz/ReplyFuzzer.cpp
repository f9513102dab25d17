//===- ReplyFuzzer.cpp - libFuzzer target for a reply's markup ------------===//
//
// A model's reply is whatever it samples: on random or damaged weights, any
// bytes. kiln-serve splits it into a thinking block and an answer and reads
// GLM's tool-call markup out of it, both whole and as it streams. The input
// is a request's "tools" JSON (anything: what does not parse is no tools), a
// NUL byte, and the reply, streamed in pieces of 1-8 bytes whose lengths
// come from the reply. Checked: every call's arguments are a JSON object's
// text; the streamed content and calls equal the whole reply's; the
// streamed reasoning and answer equal the whole reply's split. Any
// disagreement aborts. Built and run by utils/fuzz.sh.
//
//===----------------------------------------------------------------------===//
#include "chat/JsonParse.h"
#include "chat/Reasoning.h"
#include "chat/ToolCalls.h"

#include "Pieces.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

using namespace kiln::chat;

namespace {

bool sameCalls(const std::vector<ToolCall> &a, const std::vector<ToolCall> &b) {
  if (a.size() != b.size())
    return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].name != b[i].name || a[i].arguments != b[i].arguments)
      return false;
  return true;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string_view input(reinterpret_cast<const char *>(data), size);
  const size_t nul = input.find('\0');
  if (nul == std::string_view::npos)
    return 0;
  const std::string_view toolsText = input.substr(0, nul);
  const std::string_view reply = input.substr(nul + 1);
  nlohmann::ordered_json tools = nullptr;
  try {
    tools = parseOrderedJson(toolsText);
  } catch (const nlohmann::json::exception &) {
    tools = nullptr; // not JSON, or nested too deeply: no tools
  }
  const std::vector<std::string_view> cut = kiln::fuzz::pieces(reply);

  // Tool calls, whole and streamed.
  const ParsedReply whole = parseToolCalls(reply, tools);
  for (const ToolCall &call : whole.calls) {
    nlohmann::ordered_json arguments;
    try {
      arguments = parseOrderedJson(call.arguments);
    } catch (const nlohmann::json::exception &) {
      std::abort(); // a call's arguments must be JSON text
    }
    if (!arguments.is_object())
      std::abort(); // and a JSON object
  }
  ToolCallStream stream;
  std::string content;
  for (std::string_view piece : cut)
    content += stream.push(piece);
  const ParsedReply rest = stream.finish(tools);
  content += rest.content;
  if (content != whole.content || !sameCalls(rest.calls, whole.calls))
    std::abort(); // streaming and the whole reply disagree

  // The thinking block, whole and streamed.
  const SplitReply split = splitReasoning(reply);
  ReasoningStream reasoning;
  SplitReply streamed;
  for (std::string_view piece : cut) {
    SplitReply part = reasoning.push(piece);
    streamed.reasoning += part.reasoning;
    streamed.answer += part.answer;
  }
  SplitReply last = reasoning.finish();
  streamed.reasoning += last.reasoning;
  streamed.answer += last.answer;
  if (streamed.reasoning != split.reasoning || streamed.answer != split.answer)
    std::abort(); // streaming and the whole reply disagree
  return 0;
}
