//===- Unicode.cpp - Code point classes, UTF-8 and the GPT-2 byte map ---===//
#include "tokenizer/Unicode.h"

#include <algorithm>
#include <array>
#include <iterator>

namespace kiln::tokenizer {
namespace {

struct CodePointRange {
  uint32_t first;
  uint32_t last;
  CharClass cls;
};

constexpr CharClass L = CharClass::Letter;
constexpr CharClass N = CharClass::Number;
constexpr CharClass S = CharClass::Space;
#include "UnicodeTables.inc"

/// ASCII is most text: answer it from a table built once from the ranges,
/// so the common case takes no search.
constexpr std::array<CharClass, 128> asciiClasses() {
  std::array<CharClass, 128> table{};
  for (const CodePointRange &r : kCodePointRanges)
    for (uint32_t cp = r.first; cp <= r.last && cp < 128; ++cp)
      table[cp] = r.cls;
  return table;
}
constexpr std::array<CharClass, 128> kAsciiClasses = asciiClasses();

/// Bytes in the sequence that `lead` starts (2..4), or 0 if it starts none.
uint32_t sequenceLength(uint8_t lead) {
  if (lead >= 0xc2 && lead <= 0xdf)
    return 2;
  if (lead >= 0xe0 && lead <= 0xef)
    return 3;
  if (lead >= 0xf0 && lead <= 0xf4)
    return 4;
  return 0;
}

bool isContinuation(uint8_t b) { return (b & 0xc0) == 0x80; }

/// Whether `b` may follow `lead` as its first continuation byte. The narrow
/// ranges after E0, ED, F0 and F4 are what exclude overlong forms,
/// surrogates and values above U+10FFFF.
bool validSecondByte(uint8_t lead, uint8_t b) {
  switch (lead) {
  case 0xe0:
    return b >= 0xa0 && b <= 0xbf;
  case 0xed:
    return b >= 0x80 && b <= 0x9f;
  case 0xf0:
    return b >= 0x90 && b <= 0xbf;
  case 0xf4:
    return b >= 0x80 && b <= 0x8f;
  default:
    return isContinuation(b);
  }
}

/// The byte-level alphabet as two tables, built at compile time.
struct ByteMap {
  std::array<uint32_t, 256> toCodePoint{};
  /// Indexed by code point; -1 where the code point stands for no byte.
  /// 256 printable-or-shifted code points all lie below 256 + 68.
  std::array<int16_t, 256 + 68> toByte{};
};

constexpr bool isPrintableByte(uint32_t b) {
  return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) ||
         (b >= 0xae && b <= 0xff);
}

constexpr ByteMap makeByteMap() {
  ByteMap map;
  for (int16_t &b : map.toByte)
    b = -1;
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t cp = isPrintableByte(b) ? b : next++;
    map.toCodePoint[b] = cp;
    map.toByte[cp] = int16_t(b);
  }
  return map;
}
constexpr ByteMap kByteMap = makeByteMap();

} // namespace

CharClass classify(uint32_t cp) {
  if (cp < 128)
    return kAsciiClasses[cp];
  // The last range starting at or before cp is the only one that can hold it.
  const CodePointRange *end = std::end(kCodePointRanges);
  const CodePointRange *it = std::upper_bound(
      std::begin(kCodePointRanges), end, cp,
      [](uint32_t value, const CodePointRange &r) { return value < r.first; });
  if (it == std::begin(kCodePointRanges))
    return CharClass::Other;
  --it;
  return cp <= it->last ? it->cls : CharClass::Other;
}

std::string_view unicodeTablesVersion() { return kUnicodeVersion; }

Utf8Unit decodeUtf8(std::string_view text, size_t pos) {
  const uint8_t lead = uint8_t(text[pos]);
  if (lead < 0x80)
    return {lead, 1, true};
  const Utf8Unit invalid{lead, 1, false};
  const uint32_t length = sequenceLength(lead);
  if (length == 0 || text.size() - pos < length)
    return invalid;
  if (!validSecondByte(lead, uint8_t(text[pos + 1])))
    return invalid;
  // The lead keeps 7 - length payload bits; each continuation byte 6.
  uint32_t cp = lead & (0x7fu >> length);
  for (uint32_t i = 1; i < length; ++i) {
    const uint8_t b = uint8_t(text[pos + i]);
    if (!isContinuation(b))
      return invalid;
    cp = (cp << 6) | (b & 0x3f);
  }
  return {cp, length, true};
}

size_t illFormedLength(std::string_view text, size_t pos) {
  const uint8_t lead = uint8_t(text[pos]);
  const uint32_t length = sequenceLength(lead);
  size_t taken = 1;
  while (taken < length && pos + taken < text.size() &&
         (taken == 1 ? validSecondByte(lead, uint8_t(text[pos + 1]))
                     : isContinuation(uint8_t(text[pos + taken]))))
    ++taken;
  return taken;
}

void appendUtf8(std::string &out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xc0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += char(0xe0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  } else {
    out += char(0xf0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3f));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  }
}

size_t unfinishedUtf8Suffix(std::string_view bytes) {
  const size_t n = bytes.size();
  // A sequence is at most 4 bytes, so an unfinished one at most 3: look for
  // its lead among the last 3 bytes, stepping back over continuation bytes.
  for (size_t k = 1; k <= 3 && k <= n; ++k) {
    const uint8_t b = uint8_t(bytes[n - k]);
    if (isContinuation(b))
      continue;
    const uint32_t length = sequenceLength(b);
    if (length <= k)
      return 0; // ASCII, an invalid lead, or a sequence already complete.
    if (k >= 2 && !validSecondByte(b, uint8_t(bytes[n - k + 1])))
      return 0;
    return k;
  }
  return 0;
}

uint32_t byteToCodePoint(uint8_t b) { return kByteMap.toCodePoint[b]; }

std::optional<uint8_t> codePointToByte(uint32_t cp) {
  if (cp >= kByteMap.toByte.size() || kByteMap.toByte[cp] < 0)
    return std::nullopt;
  return uint8_t(kByteMap.toByte[cp]);
}

std::string byteLevelSpelling(std::string_view raw) {
  std::string out;
  out.reserve(raw.size() * 2);
  for (char c : raw)
    appendUtf8(out, byteToCodePoint(uint8_t(c)));
  return out;
}

std::optional<std::string> bytesOfByteLevelSpelling(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const Utf8Unit unit = decodeUtf8(text, pos);
    if (!unit.valid)
      return std::nullopt;
    const std::optional<uint8_t> b = codePointToByte(unit.cp);
    if (!b)
      return std::nullopt;
    out += char(*b);
    pos += unit.length;
  }
  return out;
}

} // namespace kiln::tokenizer
