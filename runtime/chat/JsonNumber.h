//===- JsonNumber.h - RFC 8259's number grammar, byte by byte ---*- C++ -*-===//
//
// Internal to runtime/chat: the number states JsonPrefix (a number inside a
// JSON text) and ToolCallPrefix (a typed argument value) share. A number is
// -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?; an integer has no
// fraction or exponent.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_CHAT_JSONNUMBER_H
#define KILN_CHAT_JSONNUMBER_H

#include <cstdint>

namespace kiln::chat {

enum class JsonNumber : uint8_t {
  Start,          ///< nothing yet
  Minus,          ///< after '-'
  Zero,           ///< a leading 0
  Integer,        ///< integer digits, the first 1-9
  Dot,            ///< after '.'
  Fraction,       ///< fraction digits
  Exponent,       ///< after 'e' / 'E'
  ExponentSign,   ///< after the exponent's sign
  ExponentDigits, ///< exponent digits
};

/// Takes `b` into the number if the grammar allows it there.
inline bool jsonNumberStep(JsonNumber &n, uint8_t b, bool integerOnly) {
  const bool digit = b >= '0' && b <= '9';
  switch (n) {
  case JsonNumber::Start:
    if (b == '-') {
      n = JsonNumber::Minus;
      return true;
    }
    [[fallthrough]];
  case JsonNumber::Minus:
    if (!digit)
      return false;
    n = b == '0' ? JsonNumber::Zero : JsonNumber::Integer;
    return true;
  case JsonNumber::Zero:
  case JsonNumber::Integer:
  case JsonNumber::Fraction:
    if (digit && n != JsonNumber::Zero)
      return true;
    if (integerOnly)
      return false;
    if (b == '.' && n != JsonNumber::Fraction) {
      n = JsonNumber::Dot;
      return true;
    }
    if (b == 'e' || b == 'E') {
      n = JsonNumber::Exponent;
      return true;
    }
    return false;
  case JsonNumber::Dot:
    if (!digit)
      return false;
    n = JsonNumber::Fraction;
    return true;
  case JsonNumber::Exponent:
    if (b == '+' || b == '-') {
      n = JsonNumber::ExponentSign;
      return true;
    }
    [[fallthrough]];
  case JsonNumber::ExponentSign:
  case JsonNumber::ExponentDigits:
    if (!digit)
      return false;
    n = JsonNumber::ExponentDigits;
    return true;
  }
  return false;
}

/// Whether the number may end here.
inline bool jsonNumberWhole(JsonNumber n) {
  return n == JsonNumber::Zero || n == JsonNumber::Integer ||
         n == JsonNumber::Fraction || n == JsonNumber::ExponentDigits;
}

} // namespace kiln::chat

#endif // KILN_CHAT_JSONNUMBER_H
