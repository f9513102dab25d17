//===- ToolCallFuzzer.cpp - libFuzzer target for forced tool calls --------===//
//
// kiln-serve's tool_choice "required" (or a named function) holds a reply
// to GLM's call markup with ToolCallPrefix, and then reads the calls out of
// it with parseToolCalls: the two must agree, or a client asking for a call
// gets text. The input is a request's "tools" JSON, a NUL byte, a flag byte
// (bit 1: the first tool named, one call; else bit 0: several calls
// allowed), then a reply. The signatures are the server's own
// (forcedCallSignatures; tools it would refuse end the input). The reply is
// fed in pieces of 1-8 bytes while the constraint takes them, `accepts`
// checked against `push` on a copy at every piece; then, where what it took
// is complete, that prefix must parse into calls: at least one (exactly one
// without `several`), nothing but whitespace around them, each naming a
// function given, its arguments a JSON object with only listed parameters
// (where the schema lists them), every required one, and a JSON value other
// than a string for each typed one. Any disagreement aborts. Built and run
// by utils/fuzz.sh.
//
//===----------------------------------------------------------------------===//
#include "chat/ForcedCalls.h"
#include "chat/JsonParse.h"
#include "chat/ToolCallPrefix.h"
#include "chat/ToolCalls.h"

#include "Pieces.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

using namespace kiln::chat;
using json = nlohmann::ordered_json;

namespace {

bool whitespace(std::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
  });
}

void checkCalls(std::string_view reply, const json &tools,
                const std::vector<ToolSignature> &sigs, bool several) {
  const ParsedReply parsed = parseToolCalls(reply, tools);
  if (parsed.calls.empty() || (!several && parsed.calls.size() != 1))
    std::abort(); // a complete forced reply must be calls
  if (!whitespace(parsed.content))
    std::abort(); // and nothing else
  for (const ToolCall &call : parsed.calls) {
    // Several tools may share a name: the call must fit one of them.
    json args;
    try {
      args = parseOrderedJson(call.arguments);
    } catch (const nlohmann::json::exception &) {
      std::abort();
    }
    if (!args.is_object())
      std::abort();
    bool fits = false;
    for (const ToolSignature &sig : sigs) {
      if (sig.name != call.name)
        continue;
      bool ok = true;
      if (!sig.parameters.empty()) {
        for (const auto &[key, value] : args.items()) {
          auto it =
              std::find(sig.parameters.begin(), sig.parameters.end(), key);
          if (it == sig.parameters.end()) {
            ok = false;
            break;
          }
          const size_t i = size_t(it - sig.parameters.begin());
          if (sig.values[i] && value.is_string())
            ok = false; // a typed value came back as text
        }
        for (size_t i = 0; i < sig.parameters.size(); ++i)
          if (sig.required[i] && !args.contains(sig.parameters[i]))
            ok = false;
      }
      fits = fits || ok;
    }
    if (!fits)
      std::abort(); // the call is not one the constraint allowed
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string_view input(reinterpret_cast<const char *>(data), size);
  const size_t nul = input.find('\0');
  if (nul == std::string_view::npos || nul + 2 > input.size())
    return 0;
  json tools;
  try {
    tools = parseOrderedJson(input.substr(0, nul));
  } catch (const nlohmann::json::exception &) {
    return 0;
  }
  // Bit 1: a named choice (the first tool's function), one call;
  // otherwise "required", several calls where bit 0 says. A request the
  // server would refuse ends the input.
  if (!tools.is_array() || tools.empty())
    return 0;
  const uint8_t flags = uint8_t(input[nul + 1]);
  const bool named = flags & 2;
  std::string forced;
  if (named) {
    const json &first = tools[0];
    if (!first.is_object() || !first.contains("function") ||
        !first["function"].is_object() || !first["function"].contains("name") ||
        !first["function"]["name"].is_string())
      return 0;
    forced = first["function"]["name"].get<std::string>();
  }
  const bool several = !named && (flags & 1);
  const std::string_view reply = input.substr(nul + 2);
  kiln::Expected<std::vector<ToolSignature>> found =
      forcedCallSignatures(tools, forced);
  if (!found)
    return 0;
  const std::vector<ToolSignature> &sigs = *found;
  ToolCallPrefix p(sigs, several);
  const size_t taken = kiln::fuzz::feedChecked(
      p, reply, [](const ToolCallPrefix &q, std::string_view piece) {
        (void)q.acceptsControl(piece);
        (void)q.key();
      });
  if (p.complete())
    checkCalls(reply.substr(0, taken), tools, sigs, several);
  return 0;
}
