//===- SchemaPattern.h - A JSON Schema pattern as an automaton --*- C++ -*-===//
//
// Internal to runtime/chat: a string's `pattern` for SchemaPrefix, compiled
// to a Thompson automaton over code points whose states are kept as a set
// (at most kMaxStates). JSON Schema's patterns are ECMA-262 regular
// expressions that need only occur in the string; without a leading '^' or
// a trailing '$' the automaton takes any text before or after them.
//
// The subset: literals, '.', classes ([a-z], [^...]), escapes (\d \w \s and
// their complements, \t \n \r \f \v, \xHH, \uXXXX, an escaped
// punctuation mark), groups ((...), (?:...)), '|', the quantifiers * + ?
// {n} {n,} {n,m} (lazy or not: the same language), '^' first and '$' last.
// Anything else (back-references, look-arounds, \b, anchors elsewhere) is
// refused by name, as are a quantifier on a quantifier ("a**", a syntax
// error in ECMA-262 too) and groups nested more than kMaxGroupDepth deep.
// States that cannot reach the end are dropped after every step, so a set that
// is not empty can always be finished.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_CHAT_SCHEMAPATTERN_H
#define KILN_CHAT_SCHEMAPATTERN_H

#include "support/Error.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln::chat {

/// A set of automaton states.
struct PatternSet {
  uint64_t w[4] = {0, 0, 0, 0};
  void set(size_t i) { w[i / 64] |= uint64_t(1) << (i % 64); }
  bool test(size_t i) const { return (w[i / 64] >> (i % 64)) & 1; }
  bool any() const { return (w[0] | w[1] | w[2] | w[3]) != 0; }
  PatternSet &operator|=(const PatternSet &o) {
    for (int i = 0; i < 4; ++i)
      w[i] |= o.w[i];
    return *this;
  }
  PatternSet &operator&=(const PatternSet &o) {
    for (int i = 0; i < 4; ++i)
      w[i] &= o.w[i];
    return *this;
  }
  bool operator==(const PatternSet &o) const {
    return w[0] == o.w[0] && w[1] == o.w[1] && w[2] == o.w[2] && w[3] == o.w[3];
  }
};

class SchemaPattern {
public:
  static constexpr size_t kMaxStates = 256;
  /// Deepest nesting of groups. The compiler parses and builds the
  /// automaton recursively, and a pattern is untrusted input (a request's
  /// schema), so deeper nesting is refused before it can exhaust the stack.
  static constexpr int kMaxGroupDepth = 64;

  /// Compiles `pattern`; errors name `where` and `field`.
  static Expected<std::shared_ptr<const SchemaPattern>>
  compile(std::string_view pattern, const std::string &where,
          const std::string &field);

  /// The states before any character (empty: no string matches).
  PatternSet start() const { return start_; }
  /// The states after code point `cp` (empty: no string with these
  /// characters first matches).
  PatternSet step(const PatternSet &s, uint32_t cp) const;
  /// Whether some code point in [lo, hi] can come next (a character read
  /// part of the way: a UTF-8 sequence or an escape).
  bool canTake(const PatternSet &s, uint32_t lo, uint32_t hi) const;
  /// Whether a string that ends here matches.
  bool accepts(const PatternSet &s) const { return s.test(size_t(match_)); }

  /// A state: a code point in `ranges` leads to out[0]; without ranges, an
  /// empty step to out[0] and out[1] (-1: none); the match state has
  /// neither.
  struct State {
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    int32_t out[2] = {-1, -1};
  };

private:
  friend class PatternCompiler;
  std::vector<State> states_;
  std::vector<PatternSet> closure_; ///< each state's empty-step closure
  PatternSet live_;                 ///< the states that reach the match
  PatternSet start_;
  int32_t match_ = 0;
};

} // namespace kiln::chat

#endif // KILN_CHAT_SCHEMAPATTERN_H
