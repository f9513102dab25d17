//===- ForcedCalls.h - The calls a request can force ------------*- C++ -*-===//
//
// tool_choice "required" or a named function holds generation to GLM's call
// markup (ToolCallPrefix) over the request's functions. Which functions,
// and whether the request can force a call at all, is decided here, so that
// kiln-serve and the forced-call fuzz target (test/fuzz/ToolCallFuzzer.cpp)
// run the same code.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_CHAT_FORCEDCALLS_H
#define KILN_CHAT_FORCEDCALLS_H

#include "chat/ToolCallPrefix.h"
#include "support/Error.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace kiln::chat {

/// The signatures a forced call is held to (ToolCallPrefix), from a
/// request's "tools": each function's, or only `forced`'s where it is not
/// empty (a named tool_choice). An error where the request cannot force a
/// call: a tool without a function name, a name or parameter the markup
/// cannot hold (writableInMarkup), parameters that are not JSON values
/// Kiln keeps, more than ToolCallPrefix::kMaxChoices functions or
/// parameters, or no function named `forced`; its field is the request's
/// parameter at fault ("tools" or "tool_choice"), its problem the message.
Expected<std::vector<ToolSignature>>
forcedCallSignatures(const nlohmann::ordered_json &tools,
                     const std::string &forced);

} // namespace kiln::chat

#endif // KILN_CHAT_FORCEDCALLS_H
