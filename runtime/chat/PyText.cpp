//===- PyText.cpp - Python's str operations on UTF-8 text ----------------===//
#include "chat/PyText.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string_view>

namespace kiln::chat::pytext {
namespace {

struct CodePointRun {
  uint32_t first, last;
};
struct CaseMapping {
  uint32_t from;
  uint32_t count;
  uint32_t to[3];
};

#include "chat/UnicodeTables.inc"

template <size_t N>
bool inRuns(const CodePointRun (&runs)[N], uint32_t cp) {
  // The first run whose end is at or after cp.
  const CodePointRun *it = std::lower_bound(
      runs, runs + N, cp,
      [](const CodePointRun &run, uint32_t value) { return run.last < value; });
  return it != runs + N && it->first <= cp;
}

template <size_t N>
const CaseMapping *findMapping(const CaseMapping (&table)[N], uint32_t cp) {
  const CaseMapping *it = std::lower_bound(
      table, table + N, cp,
      [](const CaseMapping &entry, uint32_t value) { return entry.from < value; });
  return it != table + N && it->from == cp ? it : nullptr;
}

template <size_t N>
void appendMapped(std::string &out, const CaseMapping (&table)[N], uint32_t cp) {
  if (const CaseMapping *m = findMapping(table, cp)) {
    for (uint32_t i = 0; i < m->count; ++i)
      append(out, m->to[i]);
  } else {
    append(out, cp);
  }
}

bool isCased(uint32_t cp) { return inRuns(kCasedRuns, cp); }
bool isCaseIgnorable(uint32_t cp) { return inRuns(kCaseIgnorableRuns, cp); }

/// Python's rule for U+03A3 in lower(): final form at the end of a word.
bool isFinalSigma(const std::vector<uint32_t> &cps, size_t i) {
  size_t j = i;
  while (j > 0 && isCaseIgnorable(cps[j - 1]))
    --j;
  if (j == 0 || !isCased(cps[j - 1]))
    return false;
  j = i + 1;
  while (j < cps.size() && isCaseIgnorable(cps[j]))
    ++j;
  return j == cps.size() || !isCased(cps[j]);
}

void appendLower(std::string &out, const std::vector<uint32_t> &cps, size_t i) {
  if (cps[i] == 0x03A3 && isFinalSigma(cps, i))
    append(out, 0x03C2);
  else
    appendMapped(out, kLowerMappings, cps[i]);
}

void appendHex(std::string &out, uint32_t value, int digits) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (int shift = (digits - 1) * 4; shift >= 0; shift -= 4)
    out += kHex[(value >> shift) & 0xF];
}

} // namespace

std::vector<uint32_t> decode(std::string_view text) {
  std::vector<uint32_t> cps;
  cps.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const auto b0 = static_cast<uint8_t>(text[i]);
    uint32_t cp = b0;
    size_t len = 1;
    if (b0 >= 0x80) {
      len = b0 >= 0xF0 && b0 <= 0xF4   ? 4
            : b0 >= 0xE0 && b0 <= 0xEF ? 3
            : b0 >= 0xC2 && b0 <= 0xDF ? 2
                                       : 0;
      bool ok = len != 0 && i + len <= text.size();
      if (ok) {
        cp = len == 2 ? b0 & 0x1F : len == 3 ? b0 & 0x0F : b0 & 0x07;
        for (size_t k = 1; k < len && ok; ++k) {
          const auto b = static_cast<uint8_t>(text[i + k]);
          ok = (b & 0xC0) == 0x80;
          cp = (cp << 6) | (b & 0x3F);
        }
        // Overlong forms, surrogates and values past U+10FFFF.
        if (ok && ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
                   (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF))
          ok = false;
      }
      if (!ok) {
        cp = 0xDC00 + b0; // surrogateescape
        len = 1;
      }
    }
    cps.push_back(cp);
    i += len;
  }
  return cps;
}

void append(std::string &out, uint32_t cp) {
  if (cp >= 0xDC80 && cp <= 0xDCFF) {
    out += static_cast<char>(cp - 0xDC00);
  } else if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string encode(const std::vector<uint32_t> &cps) {
  std::string out;
  out.reserve(cps.size());
  for (uint32_t cp : cps)
    append(out, cp);
  return out;
}

bool isValidUtf8(std::string_view text) {
  for (uint32_t cp : decode(text))
    if (cp >= 0xDC80 && cp <= 0xDCFF)
      return false;
  return true;
}

size_t length(std::string_view text) { return decode(text).size(); }

bool isSpace(uint32_t cp) { return inRuns(kSpaceRuns, cp); }

bool isPrintable(uint32_t cp) { return !inRuns(kNonPrintableRuns, cp); }

std::string lower(std::string_view text) {
  const std::vector<uint32_t> cps = decode(text);
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < cps.size(); ++i)
    appendLower(out, cps, i);
  return out;
}

std::string upper(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (uint32_t cp : decode(text))
    appendMapped(out, kUpperMappings, cp);
  return out;
}

std::string capitalize(std::string_view text) {
  const std::vector<uint32_t> cps = decode(text);
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < cps.size(); ++i) {
    if (i == 0) {
      // Title case: kTitleMappings where it differs from upper case.
      if (findMapping(kTitleMappings, cps[0]))
        appendMapped(out, kTitleMappings, cps[0]);
      else
        appendMapped(out, kUpperMappings, cps[0]);
    } else {
      appendLower(out, cps, i);
    }
  }
  return out;
}

std::string strip(std::string_view text, const std::optional<std::string> &chars,
                  bool left, bool right) {
  const std::vector<uint32_t> cps = decode(text);
  std::vector<uint32_t> set;
  if (chars)
    set = decode(*chars);
  auto strippable = [&](uint32_t cp) {
    return chars ? std::find(set.begin(), set.end(), cp) != set.end()
                 : isSpace(cp);
  };
  size_t begin = 0, end = cps.size();
  if (left)
    while (begin < end && strippable(cps[begin]))
      ++begin;
  if (right)
    while (end > begin && strippable(cps[end - 1]))
      --end;
  return encode(std::vector<uint32_t>(cps.begin() + begin, cps.begin() + end));
}

std::vector<std::string> split(std::string_view text,
                               const std::optional<std::string> &sep,
                               int64_t maxsplit) {
  std::vector<std::string> parts;
  if (sep) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      const size_t hit = text.find(*sep, start);
      if (hit == std::string_view::npos)
        break;
      parts.emplace_back(text.substr(start, hit - start));
      start = hit + sep->size();
    }
    parts.emplace_back(text.substr(start));
    return parts;
  }
  // Whitespace: runs of it separate pieces; none are empty. After maxsplit
  // splits the rest (less its leading whitespace) is the last piece.
  const std::vector<uint32_t> cps = decode(text);
  size_t i = 0;
  while (true) {
    while (i < cps.size() && isSpace(cps[i]))
      ++i;
    if (i == cps.size())
      break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
      parts.push_back(encode(std::vector<uint32_t>(cps.begin() + i, cps.end())));
      break;
    }
    const size_t start = i;
    while (i < cps.size() && !isSpace(cps[i]))
      ++i;
    parts.push_back(
        encode(std::vector<uint32_t>(cps.begin() + start, cps.begin() + i)));
  }
  return parts;
}

std::string replace(std::string_view text, std::string_view from,
                    std::string_view to, int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` before every code point and at the end.
    const std::vector<uint32_t> cps = decode(text);
    int64_t done = 0;
    for (uint32_t cp : cps) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      append(out, cp);
    }
    if (count < 0 || done < count)
      out += to;
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t hit = text.find(from, start);
    if (hit == std::string_view::npos)
      break;
    out.append(text.substr(start, hit - start));
    out.append(to);
    start = hit + from.size();
    ++done;
  }
  out.append(text.substr(start));
  return out;
}

std::string repr(std::string_view text) {
  const std::vector<uint32_t> cps = decode(text);
  const bool hasSingle = std::find(cps.begin(), cps.end(), '\'') != cps.end();
  const bool hasDouble = std::find(cps.begin(), cps.end(), '"') != cps.end();
  const char quote = hasSingle && !hasDouble ? '"' : '\'';
  std::string out(1, quote);
  for (uint32_t cp : cps) {
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < 0x20 || cp == 0x7F) {
      out += "\\x";
      appendHex(out, cp, 2);
    } else if (cp < 0x7F || isPrintable(cp)) {
      append(out, cp);
    } else if (cp <= 0xFF) {
      out += "\\x";
      appendHex(out, cp, 2);
    } else if (cp <= 0xFFFF) {
      out += "\\u";
      appendHex(out, cp, 4);
    } else {
      out += "\\U";
      appendHex(out, cp, 8);
    }
  }
  out += quote;
  return out;
}

std::string jsonQuote(std::string_view text, bool ensureAscii) {
  std::string out = "\"";
  for (uint32_t cp : decode(text)) {
    switch (cp) {
    case '"': out += "\\\""; continue;
    case '\\': out += "\\\\"; continue;
    case '\n': out += "\\n"; continue;
    case '\r': out += "\\r"; continue;
    case '\t': out += "\\t"; continue;
    case '\b': out += "\\b"; continue;
    case '\f': out += "\\f"; continue;
    default: break;
    }
    if (cp < 0x20 || (ensureAscii && cp >= 0x7F)) {
      if (cp > 0xFFFF) {
        // A UTF-16 surrogate pair, as Python writes it.
        const uint32_t v = cp - 0x10000;
        out += "\\u";
        appendHex(out, 0xD800 + (v >> 10), 4);
        out += "\\u";
        appendHex(out, 0xDC00 + (v & 0x3FF), 4);
      } else {
        out += "\\u";
        appendHex(out, cp, 4);
      }
    } else {
      append(out, cp);
    }
  }
  out += '"';
  return out;
}

std::string formatFloat(double value) {
  if (std::isnan(value))
    return "nan";
  if (std::isinf(value))
    return value < 0 ? "-inf" : "inf";
  if (value == 0)
    return std::signbit(value) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form: "d.ddde[+-]x".
  std::array<char, 64> buffer;
  const auto result = std::to_chars(buffer.data(), buffer.data() + buffer.size(),
                                    value, std::chars_format::scientific);
  const std::string_view sci(buffer.data(), result.ptr - buffer.data());
  std::string out;
  size_t pos = 0;
  if (sci[0] == '-') {
    out += '-';
    pos = 1;
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t i = pos; i < e; ++i)
    if (sci[i] != '.')
      digits += sci[i];
  int exponent = 0;
  std::from_chars(sci.data() + e + (sci[e + 1] == '+' ? 2 : 1),
                  sci.data() + sci.size(), exponent);
  // value = 0.DIGITS * 10^decpt, as in CPython's float_repr_style "short".
  const int decpt = exponent + 1;
  const int ndigits = static_cast<int>(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0.";
      out.append(static_cast<size_t>(-decpt), '0');
      out += digits;
    } else if (decpt >= ndigits) {
      out += digits;
      out.append(static_cast<size_t>(decpt - ndigits), '0');
      out += ".0";
    } else {
      out += digits.substr(0, decpt);
      out += '.';
      out += digits.substr(decpt);
    }
    return out;
  }
  out += digits[0];
  if (ndigits > 1) {
    out += '.';
    out += digits.substr(1);
  }
  const int exp = decpt - 1;
  char expText[16];
  std::snprintf(expText, sizeof expText, "e%c%02d", exp < 0 ? '-' : '+',
                exp < 0 ? -exp : exp);
  out += expText;
  return out;
}

std::string_view unicodeVersion() { return kUnicodeVersion; }

} // namespace kiln::chat::pytext
