//===- PyText.h - Python's str operations on UTF-8 text ---------*- C++ -*-===//
//
// jinja2 runs on Python strings, so a chat template's output depends on what
// Python's `str` methods do: which code points `strip()` removes, what
// `lower()` maps them to, how `repr()` and `json.dumps()` spell a string,
// how a float prints. This file does the same on UTF-8 `std::string`s, with
// tables generated from Python (UnicodeTables.inc, gen_unicode_tables.py).
//
// Text is decoded leniently: a byte that does not start well-formed UTF-8 is
// carried as U+DC80..U+DCFF (Python's "surrogateescape") and encoded back as
// that byte, so no input is rejected or altered by a round trip.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_CHAT_PYTEXT_H
#define KILN_CHAT_PYTEXT_H

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::chat::pytext {

/// The code points of `text` (invalid bytes as U+DC80..U+DCFF).
std::vector<uint32_t> decode(std::string_view text);

/// Appends the UTF-8 of `cp` (U+DC80..U+DCFF as the raw byte it stands for).
void append(std::string &out, uint32_t cp);

/// The UTF-8 of a code point sequence.
std::string encode(const std::vector<uint32_t> &cps);

/// Whether `text` is well-formed UTF-8.
bool isValidUtf8(std::string_view text);

/// Number of code points (Python's len()).
size_t length(std::string_view text);

/// Python's str.isspace() for one code point (also what `\s` matches in
/// Python's `re`, which jinja2's lexer uses).
bool isSpace(uint32_t cp);

/// Python's str.isprintable() for one code point.
bool isPrintable(uint32_t cp);

/// str.lower(), str.upper(), str.capitalize() (full case mappings, and
/// the final-sigma rule of lower()).
std::string lower(std::string_view text);
std::string upper(std::string_view text);
std::string capitalize(std::string_view text);

/// str.strip/lstrip/rstrip: `chars` absent strips whitespace.
std::string strip(std::string_view text, const std::optional<std::string> &chars,
                  bool left, bool right);

/// str.split(sep, maxsplit): `sep` absent splits on whitespace runs and
/// drops empty pieces. `sep` must not be empty (the caller checks).
std::vector<std::string> split(std::string_view text,
                               const std::optional<std::string> &sep,
                               int64_t maxsplit);

/// str.replace(old, new, count); count < 0 replaces all.
std::string replace(std::string_view text, std::string_view from,
                    std::string_view to, int64_t count);

/// repr(str): quoted as Python does ('...' unless the text holds ' and no ").
std::string repr(std::string_view text);

/// json.dumps(str, ensure_ascii=...).
std::string jsonQuote(std::string_view text, bool ensureAscii);

/// repr(float): shortest round-trip digits, Python's layout ("1.0", "1e-05",
/// "1e+16", "inf", "nan").
std::string formatFloat(double value);

/// The Unicode version of the tables.
std::string_view unicodeVersion();

} // namespace kiln::chat::pytext

#endif // KILN_CHAT_PYTEXT_H
