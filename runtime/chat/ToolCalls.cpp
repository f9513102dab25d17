//===- ToolCalls.cpp - GLM's tool-call markup in a reply, parsed ----------===//
#include "chat/ToolCalls.h"

#include "chat/JsonParse.h"
#include "chat/ReplyText.h"

#include <optional>

namespace kiln::chat {
namespace {

using json = nlohmann::ordered_json;

constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>";
constexpr std::string_view kKeyOpen = "<arg_key>", kKeyClose = "</arg_key>";
constexpr std::string_view kValueOpen = "<arg_value>",
                           kValueClose = "</arg_value>";

using reply::isSpace;
using reply::trim;

/// `s` from `at` past any whitespace, if it then starts with `marker`: the
/// position after the marker.
std::optional<size_t> expect(std::string_view s, size_t at,
                             std::string_view marker) {
  at = reply::skipSpace(s, at);
  if (s.substr(at, marker.size()) != marker)
    return std::nullopt;
  return at + marker.size();
}

/// The JSON schema type of parameter `key` of function `name` in `tools`
/// ("" when the tools do not say).
std::string parameterType(const json &tools, const std::string &name,
                          const std::string &key) {
  if (!tools.is_array())
    return "";
  for (const json &tool : tools) {
    if (!tool.is_object())
      continue;
    const json &fn = tool.contains("function") ? tool["function"] : tool;
    if (!fn.is_object() || !fn.contains("name") || fn["name"] != name)
      continue;
    const json *params = fn.contains("parameters") ? &fn["parameters"] : nullptr;
    if (!params || !params->is_object() || !params->contains("properties"))
      return "";
    const json &props = (*params)["properties"];
    if (!props.is_object() || !props.contains(key) ||
        !props[key].is_object() || !props[key].contains("type"))
      return "";
    const json &type = props[key]["type"];
    return type.is_string() ? type.get<std::string>() : "";
  }
  return "";
}

/// The value text as the tool's schema wants it: a string for a string
/// parameter, else JSON where it parses, else the text as a string.
json argumentValue(std::string_view text, const std::string &type) {
  if (type == "string")
    return json(std::string(text));
  try {
    return parseOrderedJson(text);
  } catch (const json::exception &) {
    return json(std::string(text));
  }
}

/// One call's body (between the markers), or nothing when it is not well
/// formed.
std::optional<ToolCall> parseCall(std::string_view body, const json &tools) {
  size_t nameEnd = body.find(kKeyOpen);
  std::string_view name = trim(body.substr(0, nameEnd));
  if (name.empty() || name.find('\n') != std::string_view::npos ||
      name.find('<') != std::string_view::npos)
    return std::nullopt;
  ToolCall call;
  call.name = std::string(name);
  json args = json::object();
  size_t at = nameEnd == std::string_view::npos ? body.size() : nameEnd;
  while (trim(body.substr(at)).size() > 0) {
    std::optional<size_t> keyStart = expect(body, at, kKeyOpen);
    if (!keyStart)
      return std::nullopt;
    size_t keyEnd = body.find(kKeyClose, *keyStart);
    if (keyEnd == std::string_view::npos)
      return std::nullopt;
    std::optional<size_t> valueStart =
        expect(body, keyEnd + kKeyClose.size(), kValueOpen);
    if (!valueStart)
      return std::nullopt;
    size_t valueEnd = body.find(kValueClose, *valueStart);
    if (valueEnd == std::string_view::npos)
      return std::nullopt;
    std::string key(trim(body.substr(*keyStart, keyEnd - *keyStart)));
    std::string_view value = body.substr(*valueStart, valueEnd - *valueStart);
    args[key] = argumentValue(value, parameterType(tools, call.name, key));
    at = valueEnd + kValueClose.size();
  }
  // Generated text may hold bytes that are not UTF-8: each becomes U+FFFD.
  call.arguments = args.dump(-1, ' ', false, json::error_handler_t::replace);
  return call;
}

} // namespace

ParsedReply parseToolCalls(std::string_view text, const json &tools) {
  ParsedReply out;
  size_t at = 0;
  while (at < text.size()) {
    size_t open = text.find(kOpen, at);
    if (open == std::string_view::npos)
      break;
    size_t bodyStart = open + kOpen.size();
    size_t close = text.find(kClose, bodyStart);
    if (close == std::string_view::npos)
      break; // unterminated (a reply cut short): left as text
    std::optional<ToolCall> call =
        parseCall(text.substr(bodyStart, close - bodyStart), tools);
    if (!call) { // not well formed: kept as text, the search goes on
      out.content += text.substr(at, close + kClose.size() - at);
      at = close + kClose.size();
      continue;
    }
    // The template writes a newline before each call: whitespace before
    // the first call, and whitespace alone between calls, is not content.
    std::string_view before = text.substr(at, open - at);
    if (out.calls.empty())
      while (!before.empty() && isSpace(before.back()))
        before.remove_suffix(1);
    else if (trim(before).empty())
      before = {};
    out.content += before;
    out.calls.push_back(std::move(*call));
    at = close + kClose.size();
  }
  std::string_view rest = text.substr(at);
  if (!out.calls.empty())
    rest = trim(rest).empty() ? std::string_view() : rest;
  out.content += rest;
  return out;
}

std::string ToolCallStream::push(std::string_view piece) {
  text_ += piece;
  if (inCall_)
    return "";
  std::string_view unshown = std::string_view(text_).substr(shown_);
  size_t open = unshown.find(kOpen);
  size_t end;
  if (open != std::string_view::npos) {
    inCall_ = true;
    end = open;
  } else {
    // Hold back a tail that may still begin a call: the longest proper
    // prefix of the marker at the end...
    end = unshown.size() - reply::tagPrefixAtEnd(unshown, kOpen);
  }
  // ... and the whitespace before it (trimmed if a call follows).
  while (end > 0 && isSpace(unshown[end - 1]))
    --end;
  std::string out(unshown.substr(0, end));
  shown_ += end;
  return out;
}

ParsedReply ToolCallStream::finish(const json &tools) const {
  return parseToolCalls(std::string_view(text_).substr(shown_), tools);
}

void argumentsToObjects(json &messages) {
  if (!messages.is_array())
    return;
  for (json &message : messages) {
    if (!message.is_object() || !message.contains("tool_calls") ||
        !message["tool_calls"].is_array())
      continue;
    for (json &call : message["tool_calls"]) {
      if (!call.is_object())
        continue;
      json &fn = call.contains("function") ? call["function"] : call;
      if (!fn.is_object() || !fn.contains("arguments") ||
          !fn["arguments"].is_string())
        continue;
      try {
        json parsed = parseOrderedJson(fn["arguments"].get<std::string>());
        if (parsed.is_object())
          fn["arguments"] = std::move(parsed);
      } catch (const json::exception &) {
        // not JSON: the arguments stay the string they are
      }
    }
  }
}

} // namespace kiln::chat
