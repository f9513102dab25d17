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
// Arrays and objects nest at most kMaxNestingDepth deep (ChatTemplate.h,
// the Values' own limit): nlohmann's dump and
// comparisons recurse, and a request nesting 1,000,000 arrays (2 MB) in its
// "model" ran kiln-serve out of stack.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_CHAT_JSONPARSE_H
#define KILN_CHAT_JSONPARSE_H

#include "chat/ChatTemplate.h"

#include <nlohmann/json.hpp>

#include <string_view>

namespace kiln::chat {

/// Thrown for a document nested deeper than kMaxNestingDepth; a
/// nlohmann::ordered_json::exception, so that a caller's handler for parse
/// errors takes it too.
class JsonTooDeep : public nlohmann::ordered_json::exception {
public:
  JsonTooDeep();
};

/// The document `text` holds. Throws nlohmann's parse_error where it is not
/// one JSON value, and JsonTooDeep where it nests too deep (both
/// nlohmann::ordered_json::exception).
nlohmann::ordered_json parseOrderedJson(std::string_view text);

} // namespace kiln::chat

#endif // KILN_CHAT_JSONPARSE_H
