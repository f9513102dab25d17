//===- Unicode.h - Code point classes, UTF-8, byte map ----------*- C++ -*-===//
//
// The Unicode facts the tokenizer needs and nothing more: the classes the
// glm4 split pattern distinguishes (letter, number, whitespace), a lenient
// UTF-8 decoder that never fails (an invalid byte is one unit of its own),
// the length of an unfinished UTF-8 sequence at the end of a buffer (for
// streaming), and GPT-2's byte <-> code point map of byte-level BPE.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_TOKENIZER_UNICODE_H
#define KILN_TOKENIZER_UNICODE_H

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kiln::tokenizer {

/// What the split pattern can tell apart: \p{L}, \p{N}, \s, or none of them.
enum class CharClass : uint8_t { Other, Letter, Number, Space };

/// The class of code point `cp` (Other for anything above U+10FFFF).
CharClass classify(uint32_t cp);

/// The Unicode version the class tables were generated from ("16.0.0").
std::string_view unicodeTablesVersion();

/// One unit of text: a well-formed UTF-8 code point, or a single byte that
/// does not start one.
struct Utf8Unit {
  uint32_t cp = 0;     ///< The code point; the byte value when !valid.
  uint32_t length = 1; ///< Bytes taken (1 for an invalid byte).
  bool valid = true;
};

/// Decodes the unit at `text[pos]` (pos < text.size()). Overlong forms,
/// surrogates, values above U+10FFFF and truncated sequences are invalid:
/// then only the first byte is taken, so decoding goes on at the next byte.
Utf8Unit decodeUtf8(std::string_view text, size_t pos);

/// Where decodeUtf8 finds no unit at `text[pos]`: the bytes of the maximal
/// subpart there (Unicode's recommended practice for U+FFFD substitution,
/// as Python's and the server's JSON make it): the longest run from pos that
/// begins some well-formed sequence, at least 1. A truncated or interrupted
/// sequence is then one U+FFFD, not one a byte.
size_t illFormedLength(std::string_view text, size_t pos);

/// Appends the UTF-8 encoding of `cp` (at most U+10FFFF, no surrogate).
void appendUtf8(std::string &out, uint32_t cp);

/// How many bytes at the end of `bytes` are the beginning of a UTF-8
/// sequence that further bytes could still complete (0 to 3). Bytes that can
/// no longer become valid UTF-8 are not counted: holding them back would not
/// make them valid.
size_t unfinishedUtf8Suffix(std::string_view bytes);

/// GPT-2's byte-level alphabet: the code point that stands for byte `b`.
/// Printable bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) stand for themselves;
/// the other 68 get U+0100, U+0101, ... in byte order.
uint32_t byteToCodePoint(uint8_t b);

/// The byte that code point `cp` stands for, or nullopt when `cp` is not in
/// the byte-level alphabet.
std::optional<uint8_t> codePointToByte(uint32_t cp);

/// The byte-level spelling of raw bytes (UTF-8 of byteToCodePoint of each).
std::string byteLevelSpelling(std::string_view raw);

/// The raw bytes a byte-level spelling stands for, or nullopt when `text` is
/// not valid UTF-8 or holds a code point outside the alphabet.
std::optional<std::string> bytesOfByteLevelSpelling(std::string_view text);

} // namespace kiln::tokenizer

#endif // KILN_TOKENIZER_UNICODE_H
