//===- JsonString.h - A JSON string's bytes, one at a time ------*- C++ -*-===//
//
// Internal to runtime/chat: the string states JsonPrefix and SchemaPrefix
// share, after the opening quote (and a JSON pointer's token). Bytes must be
// UTF-8 (RFC 3629's table: no overlong forms, no surrogates, nothing past
// U+10FFFF), with no control byte below 0x20; escapes are JSON's eight and
// \uXXXX.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_CHAT_JSONSTRING_H
#define KILN_CHAT_JSONSTRING_H

#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::chat {

struct JsonString {
  enum class Mode : uint8_t {
    Chars,  ///< between characters
    Escape, ///< after '\'
    Hex,    ///< inside \uXXXX (`count` digits left)
    Utf8,   ///< inside a multi-byte sequence (`count` bytes left)
  };
  Mode mode = Mode::Chars;
  uint8_t count = 0;
  uint8_t lo = 0x80, hi = 0xBF; ///< the next continuation's range
};

/// What a byte did to a string.
enum class JsonStringByte : uint8_t {
  Refused, ///< not allowed here
  Begins,  ///< begins a character (an escape's '\' or a UTF-8 lead)
  Inside,  ///< continues a character begun before
  Closed,  ///< the closing quote
};

/// Takes `b` into the string `s`. With `surrogates` false, a \u escape of a
/// surrogate (D800-DFFF) is refused, so that every character begins where
/// one code point does (a string's length can be counted byte by byte).
inline JsonStringByte jsonStringStep(JsonString &s, uint8_t b,
                                     bool surrogates = true) {
  using Mode = JsonString::Mode;
  switch (s.mode) {
  case Mode::Chars:
    if (b == '"')
      return JsonStringByte::Closed;
    if (b == '\\') {
      s.mode = Mode::Escape;
      return JsonStringByte::Begins;
    }
    if (b < 0x20)
      return JsonStringByte::Refused;
    if (b < 0x80)
      return JsonStringByte::Begins;
    s.lo = 0x80;
    s.hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      s.count = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      s.count = 2;
      if (b == 0xE0)
        s.lo = 0xA0;
      else if (b == 0xED)
        s.hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      s.count = 3;
      if (b == 0xF0)
        s.lo = 0x90;
      else if (b == 0xF4)
        s.hi = 0x8F;
    } else {
      return JsonStringByte::Refused;
    }
    s.mode = Mode::Utf8;
    return JsonStringByte::Begins;
  case Mode::Utf8:
    if (b < s.lo || b > s.hi)
      return JsonStringByte::Refused;
    s.lo = 0x80;
    s.hi = 0xBF;
    if (--s.count == 0)
      s.mode = Mode::Chars;
    return JsonStringByte::Inside;
  case Mode::Escape:
    switch (b) {
    case '"':
    case '\\':
    case '/':
    case 'b':
    case 'f':
    case 'n':
    case 'r':
    case 't':
      s.mode = Mode::Chars;
      return JsonStringByte::Inside;
    case 'u':
      s.mode = Mode::Hex;
      s.count = 4;
      s.lo = 0; // 1 once the first digit is d or D
      return JsonStringByte::Inside;
    default:
      return JsonStringByte::Refused;
    }
  case Mode::Hex: {
    const bool digit = b >= '0' && b <= '9';
    const bool hex = digit || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F');
    if (!hex)
      return JsonStringByte::Refused;
    if (!surrogates) {
      if (s.count == 4)
        s.lo = (b == 'd' || b == 'D');
      else if (s.count == 3 && s.lo && !(digit && b <= '7'))
        return JsonStringByte::Refused;
    }
    if (--s.count == 0) {
      s.mode = Mode::Chars;
      s.lo = 0x80;
    }
    return JsonStringByte::Inside;
  }
  }
  return JsonStringByte::Refused;
}

/// `name` as a JSON pointer's token (RFC 6901: '~' as "~0", '/' as "~1").
inline std::string jsonPointerToken(std::string_view name) {
  std::string out;
  for (char c : name) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

} // namespace kiln::chat

#endif // KILN_CHAT_JSONSTRING_H
