//===- ReplyText.h - Scanning a model's reply for markers --------*- C++ -*-===//
//
// Internal to runtime/chat: what the tool-call and thinking readers share.
// Whitespace here is ASCII's (space, tab, CR, LF), the separators GLM writes
// around its markers; a marker's beginning at the end of streamed text is
// held back until the next piece says whether it is one.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_CHAT_REPLYTEXT_H
#define KILN_CHAT_REPLYTEXT_H

#include <algorithm>
#include <cstdint>
#include <string_view>

namespace kiln::chat::reply {

inline bool isSpace(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

/// The most whitespace bytes in a row a constrained reply may write where
/// whitespace is only a separator (WhitespaceCap's JSON, ThinkFirst's
/// whitespace around the thinking block): a model under a constraint cannot
/// spend its budget on it.
constexpr uint32_t kWhitespaceRun = 64;

/// The first position at or after `at` that is not whitespace.
inline size_t skipSpace(std::string_view s, size_t at = 0) {
  while (at < s.size() && isSpace(s[at]))
    ++at;
  return at;
}

/// `s` without whitespace at either end.
inline std::string_view trim(std::string_view s) {
  s.remove_prefix(skipSpace(s));
  while (!s.empty() && isSpace(s.back()))
    s.remove_suffix(1);
  return s;
}

/// The length of the longest proper prefix of `tag` that `s` ends with.
inline size_t tagPrefixAtEnd(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == tag.substr(0, n))
      return n;
  return 0;
}

} // namespace kiln::chat::reply

#endif // KILN_CHAT_REPLYTEXT_H
