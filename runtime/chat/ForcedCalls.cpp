//===- ForcedCalls.cpp - The calls a request can force --------------------===//
#include "chat/ForcedCalls.h"

#include "chat/JsonValue.h"

#include <fmt/format.h>

namespace kiln::chat {

using json = nlohmann::ordered_json;

Expected<std::vector<ToolSignature>>
forcedCallSignatures(const json &tools, const std::string &forced) {
  // A name as JSON text, bytes that are not UTF-8 as U+FFFD.
  auto quoted = [](const std::string &text) {
    return json(text).dump(-1, ' ', false, json::error_handler_t::replace);
  };
  auto refuse = [](const char *field, std::string problem) {
    return Error("request", field, std::move(problem));
  };
  std::vector<ToolSignature> signatures;
  for (const json &tool : tools) {
    const json *fn = tool.is_object() && tool.contains("function")
                         ? &tool["function"]
                         : nullptr;
    if (!fn || !fn->is_object() || !fn->contains("name") ||
        !(*fn)["name"].is_string())
      return refuse("tools", "every tool must have a function with a name to "
                             "force a call");
    const std::string name = (*fn)["name"].get<std::string>();
    if (!forced.empty() && name != forced)
      continue;
    if (!writableInMarkup(name))
      return refuse("tools", fmt::format("function name {} cannot be written "
                                         "in GLM's call markup",
                                         quoted(name)));
    Value params;
    if (fn->contains("parameters") && (*fn)["parameters"].is_object() &&
        (*fn)["parameters"].contains("properties") &&
        (*fn)["parameters"]["properties"].is_object()) {
      Expected<Value> doc = valueFromJson((*fn)["parameters"], "parameters");
      if (!doc)
        return refuse("tools", fmt::format("the parameters of {}: {}", name,
                                           doc.error().message()));
      params = std::move(*doc);
    }
    // Each parameter's value: JSON where the schema gives one type the
    // markup's reader turns into JSON; any text otherwise.
    Expected<ToolSignature> found = toolSignature(name, params);
    if (!found)
      return refuse("tools", fmt::format("parameter {} of {} cannot be "
                                         "written in GLM's call markup",
                                         quoted(found.error().field()), name));
    if (found->parameters.size() > ToolCallPrefix::kMaxChoices)
      return refuse("tools",
                    fmt::format("{} has more than {} parameters to "
                                "force a call of",
                                found->name, ToolCallPrefix::kMaxChoices));
    signatures.push_back(std::move(*found));
  }
  if (signatures.empty())
    return refuse("tool_choice",
                  fmt::format("'tool_choice' names function {}, which "
                              "'tools' does not have",
                              quoted(forced)));
  if (signatures.size() > ToolCallPrefix::kMaxChoices)
    return refuse("tools", fmt::format("more than {} tools to force a call of",
                                       ToolCallPrefix::kMaxChoices));
  return signatures;
}

} // namespace kiln::chat
