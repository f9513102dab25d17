//===- JsonParse.h - JSON text to ordered_json in linear time ---*- C++ -*-===//
//
// nlohmann::ordered_json keeps an object's keys in their order (as Python's
// json.load does, which chat templates and tool schemas rely on), but its
// parser looks each new key up in the keys before it: an object of N keys
// costs N^2 / 2 comparisons. Request bodies and schema files are untrusted
// input, and an object of 200,000 keys (7 MB) took ~25 s of CPU. This
// parser builds the same document through nlohmann's SAX interface, with a
// hash of each open object's keys: linear in the text. A repeated key keeps
// its first place and takes its last value, as nlohmann's own parser does.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_CHAT_JSONPARSE_H
#define KILN_CHAT_JSONPARSE_H

#include <nlohmann/json.hpp>

#include <string_view>

namespace kiln::chat {

/// The document `text` holds, or nlohmann's parse_error (thrown, a
/// nlohmann::ordered_json::exception) where it is not one JSON value.
nlohmann::ordered_json parseOrderedJson(std::string_view text);

} // namespace kiln::chat

#endif // KILN_CHAT_JSONPARSE_H
