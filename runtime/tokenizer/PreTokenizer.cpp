//===- PreTokenizer.cpp - The glm4 split pattern as a scanner ------------===//
//
// At each position the alternatives are tried in the pattern's order and the
// first that matches wins, with the backtracking each alternative's
// quantifiers would do worked out in closed form (see each helper). Where
// no alternative matches, which the classes make impossible, one character
// is taken so that the scan always advances.
//
//===----------------------------------------------------------------------===//
#include "tokenizer/PreTokenizer.h"

#include "tokenizer/Unicode.h"

#include <array>
#include <cstdint>

namespace kiln::tokenizer {
namespace {

/// One character of the text being split.
struct Unit {
  size_t offset; ///< Of its first byte.
  uint32_t cp;   ///< kNoCodePoint for an invalid byte.
  CharClass cls;
};

/// Stands for an invalid byte: equal to no character the pattern names.
constexpr uint32_t kNoCodePoint = 0xffffffff;

bool isLineBreak(const Unit &u) { return u.cp == '\r' || u.cp == '\n'; }
bool isLetter(const Unit &u) { return u.cls == CharClass::Letter; }
bool isNumber(const Unit &u) { return u.cls == CharClass::Number; }
bool isSpace(const Unit &u) { return u.cls == CharClass::Space; }
/// [^\s\p{L}\p{N}]
bool isOther(const Unit &u) { return u.cls == CharClass::Other; }

class Scanner {
public:
  explicit Scanner(std::vector<Unit> units) : u_(std::move(units)) {}

  /// End (exclusive) of the piece that starts at unit `i`.
  size_t match(size_t i) const {
    if (size_t j = contraction(i))
      return j;
    if (size_t j = letters(i))
      return j;
    if (size_t j = numbers(i))
      return j;
    if (size_t j = punctuation(i))
      return j;
    if (size_t j = spaces(i))
      return j;
    return i + 1;
  }

private:
  size_t size() const { return u_.size(); }

  /// (?i:'s|'t|'re|'ve|'m|'ll|'d). Case-insensitive matching folds the
  /// ASCII capitals and U+017F LATIN SMALL LETTER LONG S (whose case folding
  /// is 's'); no other character folds to one of these letters.
  size_t contraction(size_t i) const {
    if (u_[i].cp != '\'')
      return 0;
    static constexpr std::array<std::string_view, 7> kSuffixes = {
        "s", "t", "re", "ve", "m", "ll", "d"};
    auto fold = [](uint32_t cp) -> uint32_t {
      if (cp >= 'A' && cp <= 'Z')
        return cp - 'A' + 'a';
      return cp == 0x17f ? uint32_t('s') : cp;
    };
    for (std::string_view suffix : kSuffixes) {
      if (size() - (i + 1) < suffix.size())
        continue;
      bool same = true;
      for (size_t k = 0; k < suffix.size() && same; ++k)
        same = fold(u_[i + 1 + k].cp) == uint32_t(suffix[k]);
      if (same)
        return i + 1 + suffix.size();
    }
    return 0;
  }

  /// [^\r\n\p{L}\p{N}]?\p{L}+ : the optional lead is taken when a letter
  /// follows it, else dropped (backtracking) and the run starts at i.
  size_t letters(size_t i) const {
    size_t j = i;
    if (!isLineBreak(u_[i]) && !isLetter(u_[i]) && !isNumber(u_[i]) &&
        i + 1 < size() && isLetter(u_[i + 1]))
      j = i + 1;
    if (!isLetter(u_[j]))
      return 0;
    while (j < size() && isLetter(u_[j]))
      ++j;
    return j;
  }

  /// \p{N}{1,3}
  size_t numbers(size_t i) const {
    size_t j = i;
    while (j < size() && j - i < 3 && isNumber(u_[j]))
      ++j;
    return j == i ? 0 : j;
  }

  /// " ?[^\s\p{L}\p{N}]+[\r\n]*": the optional space only when what follows
  /// it starts the run; a lone space is left to the whitespace alternatives.
  size_t punctuation(size_t i) const {
    size_t j = i;
    if (u_[j].cp == ' ' && j + 1 < size() && isOther(u_[j + 1]))
      ++j;
    if (!isOther(u_[j]))
      return 0;
    while (j < size() && isOther(u_[j]))
      ++j;
    while (j < size() && isLineBreak(u_[j]))
      ++j;
    return j;
  }

  /// \s*[\r\n]+ | \s+(?!\S) | \s+ over the whitespace run at i.
  size_t spaces(size_t i) const {
    if (!isSpace(u_[i]))
      return 0;
    size_t end = i;
    size_t lastBreak = size();
    for (; end < size() && isSpace(u_[end]); ++end)
      if (isLineBreak(u_[end]))
        lastBreak = end;
    // \s*[\r\n]+: \s* gives back characters until a line break follows,
    // so the piece ends just after the run's last line break.
    if (lastBreak != size())
      return lastBreak + 1;
    // \s+(?!\S): the whole run at the end of the text; before a non-space,
    // all but the run's last character, which joins the next piece.
    if (end == size())
      return end;
    if (end - i >= 2)
      return end - 1;
    // \s+: a single whitespace character before a non-space.
    return end;
  }

  std::vector<Unit> u_;
};

std::vector<Unit> decodeUnits(std::string_view text) {
  std::vector<Unit> units;
  units.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const Utf8Unit unit = decodeUtf8(text, pos);
    if (unit.valid)
      units.push_back({pos, unit.cp, classify(unit.cp)});
    else
      units.push_back({pos, kNoCodePoint, CharClass::Other});
    pos += unit.length;
  }
  return units;
}

} // namespace

std::vector<std::string_view> splitGlm4(std::string_view text) {
  std::vector<std::string_view> pieces;
  if (text.empty())
    return pieces;
  std::vector<Unit> units = decodeUnits(text);
  const size_t count = units.size();
  std::vector<size_t> offsets;
  offsets.reserve(count + 1);
  for (const Unit &u : units)
    offsets.push_back(u.offset);
  offsets.push_back(text.size());

  Scanner scanner(std::move(units));
  for (size_t i = 0; i < count;) {
    const size_t j = scanner.match(i);
    pieces.push_back(text.substr(offsets[i], offsets[j] - offsets[i]));
    i = j;
  }
  return pieces;
}

} // namespace kiln::tokenizer
