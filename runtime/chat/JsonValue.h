//===- JsonValue.h - JSON documents as template values ----------*- C++ -*-===//
//
// Converts parsed JSON (nlohmann::ordered_json, which keeps key order as
// Python's json.load does) to chat-template Values: null -> None, true/false
// -> bool, integers -> int (64-bit; larger ones are an error), other numbers
// -> float, strings, arrays -> list, objects -> dict. Kept apart from
// ChatTemplate so the template library itself does not depend on JSON.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_CHAT_JSONVALUE_H
#define KILN_CHAT_JSONVALUE_H

#include "chat/Value.h"
#include "support/Error.h"

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace kiln::chat {

/// The Value of `json`. `where` names the document in errors; a field names
/// the offending element as a JSON pointer ("/0/content").
Expected<Value> valueFromJson(const nlohmann::ordered_json &json,
                              const std::string &where);

/// Parses `text` as JSON and converts it.
Expected<Value> parseJsonValue(std::string_view text, const std::string &where);

} // namespace kiln::chat

#endif // KILN_CHAT_JSONVALUE_H
