//===- ToolCallFuzzer.cpp - libFuzzer target for forced tool calls --------===//
//
// kiln-serve's tool_choice "required" (or a named function) holds a reply
// to GLM's call markup with ToolCallPrefix, and then reads the calls out of
// it with parseToolCalls: the two must agree, or a client asking for a call
// gets text. The input is a request's "tools" JSON, a NUL byte, a flag byte
// (bit 1: the first tool named, one call; else bit 0: several calls
// allowed), then a reply. Signatures are built from the tools as the server
// builds them (tools it would refuse end the input). The reply is fed in pieces
// of 1-8 bytes while the constraint takes them, `accepts` checked against
// `push` on a copy at every piece; then, where what it took is complete, that
// prefix must parse into calls: at least one (exactly one without `several`),
// nothing but whitespace around them, each naming a function given, its
// arguments a JSON object with only listed parameters (where the schema lists
// them), every required one, and a JSON value other than a string for each
// typed one. Any disagreement aborts. Built and run by utils/fuzz.sh.
//
//===----------------------------------------------------------------------===//
#include "chat/JsonParse.h"
#include "chat/JsonValue.h"
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
using kiln::Expected;
using json = nlohmann::ordered_json;

namespace {

/// The signatures the server forces a call of, or none where it would
/// refuse the request (kiln-serve's readOptions: every tool a function with
/// a name the markup can hold, parameters it can convert and name, at most
/// kMaxChoices of each). `forced`: only that function (a named choice).
std::vector<ToolSignature> signatures(const json &tools,
                                      const std::string *forced) {
  std::vector<ToolSignature> out;
  if (!tools.is_array() || tools.empty())
    return {};
  for (const json &tool : tools) {
    if (!tool.is_object() || !tool.contains("function"))
      return {};
    const json &fn = tool["function"];
    if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string())
      return {};
    const std::string name = fn["name"].get<std::string>();
    if (forced && name != *forced)
      continue;
    if (!writableInMarkup(name))
      return {};
    Value params;
    if (fn.contains("parameters") && fn["parameters"].is_object() &&
        fn["parameters"].contains("properties") &&
        fn["parameters"]["properties"].is_object()) {
      Expected<Value> doc = valueFromJson(fn["parameters"], "parameters");
      if (!doc)
        return {};
      params = std::move(*doc);
    }
    Expected<ToolSignature> sig = toolSignature(name, params);
    if (!sig || sig->parameters.size() > ToolCallPrefix::kMaxChoices)
      return {};
    out.push_back(std::move(*sig));
  }
  if (out.size() > ToolCallPrefix::kMaxChoices)
    return {};
  return out;
}

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
  // otherwise "required", several calls where bit 0 says.
  const uint8_t flags = uint8_t(input[nul + 1]);
  std::string forced;
  const bool named = flags & 2;
  if (named) {
    if (!tools.is_array() || tools.empty() || !tools[0].is_object() ||
        !tools[0].contains("function") || !tools[0]["function"].is_object() ||
        !tools[0]["function"].contains("name") ||
        !tools[0]["function"]["name"].is_string())
      return 0;
    forced = tools[0]["function"]["name"].get<std::string>();
  }
  const bool several = !named && (flags & 1);
  const std::string_view reply = input.substr(nul + 2);
  const std::vector<ToolSignature> sigs =
      signatures(tools, named ? &forced : nullptr);
  if (sigs.empty())
    return 0;
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
