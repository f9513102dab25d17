//===- SchemaPattern.cpp - A JSON Schema pattern as an automaton ----------===//
#include "chat/SchemaPattern.h"

#include <algorithm>

namespace kiln::chat {

namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;
constexpr uint32_t kMaxCode = 0x10FFFF;

/// A parsed pattern.
struct Ast {
  enum class Kind { Chars, Concat, Alt, Repeat };
  Kind kind = Kind::Concat; // an empty Concat matches the empty string
  Ranges chars;
  std::vector<Ast> parts;
  int min = 0, max = -1; ///< Repeat's bounds (-1: no most)
};

Ranges sorted(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto &x : r) {
    if (!out.empty() && x.first <= out.back().second + 1)
      out.back().second = std::max(out.back().second, x.second);
    else
      out.push_back(x);
  }
  return out;
}

Ranges complement(const Ranges &r) {
  Ranges out;
  uint32_t next = 0;
  for (const auto &[lo, hi] : sorted(r)) {
    if (lo > next)
      out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCode)
    out.emplace_back(next, kMaxCode);
  return out;
}

const Ranges &digits() {
  static const Ranges r = {{'0', '9'}};
  return r;
}
const Ranges &wordChars() {
  static const Ranges r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
  return r;
}
/// ECMA-262's WhiteSpace and LineTerminator.
const Ranges &spaceChars() {
  static const Ranges r = {{0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},
                           {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029},
                           {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
                           {0xFEFF, 0xFEFF}};
  return r;
}
/// '.': anything but a line terminator.
Ranges dotChars() {
  return complement({{0x0A, 0x0A}, {0x0D, 0x0D}, {0x2028, 0x2029}});
}

} // namespace

class PatternCompiler {
public:
  PatternCompiler(std::u32string text, std::string where, std::string field)
      : text_(std::move(text)), where_(std::move(where)),
        field_(std::move(field)) {}

  Expected<std::shared_ptr<const SchemaPattern>> run();

private:
  Error fail(const std::string &problem) const {
    return Error(where_, field_,
                 "pattern: " + problem + " (at character " +
                     std::to_string(at_) + ")");
  }
  bool more() const { return at_ < text_.size(); }
  char32_t peek() const { return more() ? text_[at_] : 0; }

  Expected<Ast> alternatives();
  Expected<Ast> sequence();
  Expected<Ast> atom();
  Expected<Ranges> escape(bool inClass);
  Expected<Ranges> charClass();
  Status quantifier(Ast &a);

  /// Appends the automaton of `a`; returns its start and the slots left
  /// dangling (state, slot), or an error past kMaxStates.
  struct Frag {
    int32_t start;
    std::vector<std::pair<int32_t, int>> outs;
  };
  Expected<Frag> build(const Ast &a);
  /// The automata of `a`'s parts, each joined to those before it by
  /// `join(sofar, next)` (a Status).
  template <typename Join> Expected<Frag> fold(const Ast &a, Join join);
  Expected<int32_t> add(SchemaPattern::State s);
  void patch(const std::vector<std::pair<int32_t, int>> &outs, int32_t to) {
    for (const auto &[state, slot] : outs)
      p_.states_[size_t(state)].out[slot] = to;
  }

  std::u32string text_;
  std::string where_, field_;
  size_t at_ = 0;
  int depth_ = 0; ///< groups open at at_
  SchemaPattern p_;
};

Expected<int32_t> PatternCompiler::add(SchemaPattern::State s) {
  if (p_.states_.size() >= SchemaPattern::kMaxStates)
    return Error(where_, field_,
                 "pattern: too large for constrained decoding (more than " +
                     std::to_string(SchemaPattern::kMaxStates) +
                     " automaton states; a counted repeat {n,m} copies its "
                     "part)");
  p_.states_.push_back(std::move(s));
  return int32_t(p_.states_.size() - 1);
}

Expected<Ranges> PatternCompiler::escape(bool inClass) {
  if (!more())
    return fail("a '\\' at the end");
  const char32_t c = text_[at_++];
  auto hex = [&](int n) -> Expected<Ranges> {
    uint32_t v = 0;
    for (int i = 0; i < n; ++i) {
      const char32_t h = peek();
      int d = h >= '0' && h <= '9'   ? int(h - '0')
              : h >= 'a' && h <= 'f' ? int(h - 'a' + 10)
              : h >= 'A' && h <= 'F' ? int(h - 'A' + 10)
                                     : -1;
      if (d < 0)
        return fail("expected " + std::to_string(n) + " hex digits");
      v = v * 16 + uint32_t(d);
      ++at_;
    }
    return Ranges{{v, v}};
  };
  switch (c) {
  case 'd':
    return digits();
  case 'D':
    return complement(digits());
  case 'w':
    return wordChars();
  case 'W':
    return complement(wordChars());
  case 's':
    return spaceChars();
  case 'S':
    return complement(spaceChars());
  case 't':
    return Ranges{{9, 9}};
  case 'n':
    return Ranges{{10, 10}};
  case 'v':
    return Ranges{{11, 11}};
  case 'f':
    return Ranges{{12, 12}};
  case 'r':
    return Ranges{{13, 13}};
  case 'x':
    return hex(2);
  case 'u':
    return hex(4);
  default:
    break;
  }
  // An escaped punctuation mark stands for itself ('-' only in a class).
  static constexpr std::u32string_view kMarks = U"\\/^$.|?*+()[]{}-";
  if (kMarks.find(c) != std::u32string_view::npos && (c != '-' || inClass))
    return Ranges{{uint32_t(c), uint32_t(c)}};
  return fail(std::string("the escape \\") + char(c < 0x80 ? c : '?') +
              " is not supported (back-references, \\b and the like)");
}

Expected<Ranges> PatternCompiler::charClass() {
  // After '['.
  bool negated = false;
  if (peek() == '^') {
    negated = true;
    ++at_;
  }
  // ECMA-262 reads "[]" as no character and "[^]" as any; other dialects
  // read a ']' first as itself: refused rather than read one way.
  if (peek() == ']')
    return fail("a class that begins with ']' ('[]', '[^]')");
  Ranges out;
  while (true) {
    if (!more())
      return fail("a '[' without its ']'");
    char32_t c = text_[at_];
    if (c == ']') {
      ++at_;
      break;
    }
    Ranges item;
    ++at_;
    if (c == '\\') {
      Expected<Ranges> e = escape(true);
      if (!e)
        return e.error();
      item = *e;
    } else {
      item = {{uint32_t(c), uint32_t(c)}};
    }
    // A range a-b between two single characters.
    if (peek() == '-' && at_ + 1 < text_.size() && text_[at_ + 1] != ']' &&
        item.size() == 1 && item[0].first == item[0].second) {
      ++at_;
      char32_t d = text_[at_++];
      Ranges end = {{uint32_t(d), uint32_t(d)}};
      if (d == '\\') {
        Expected<Ranges> e = escape(true);
        if (!e)
          return e.error();
        end = *e;
      }
      if (end.size() != 1 || end[0].first != end[0].second ||
          end[0].first < item[0].first)
        return fail("a class range out of order or between classes");
      item = {{item[0].first, end[0].first}};
    }
    out.insert(out.end(), item.begin(), item.end());
  }
  return negated ? complement(out) : sorted(out);
}

/// Whether c begins a quantifier.
bool quantifierStart(char32_t c) {
  return c == '*' || c == '+' || c == '?' || c == '{';
}

Status PatternCompiler::quantifier(Ast &a) {
  const char32_t c = peek();
  if (!quantifierStart(c))
    return Status::ok();
  int lo = 0, hi = -1;
  if (c == '+') {
    lo = 1;
  } else if (c == '?') {
    hi = 1;
  } else if (c == '{') {
    // {n}, {n,}, {n,m}; a '{' that does not open one is refused.
    size_t j = at_ + 1;
    auto number = [&](int &v) {
      const size_t from = j;
      v = 0;
      while (j < text_.size() && text_[j] >= '0' && text_[j] <= '9' &&
             v <= 1000)
        v = v * 10 + int(text_[j++] - '0');
      return j > from;
    };
    if (!number(lo))
      return fail("a '{' that is not a counted repeat");
    hi = lo;
    if (j < text_.size() && text_[j] == ',') {
      ++j;
      if (!number(hi))
        hi = -1;
    }
    if (j >= text_.size() || text_[j] != '}' || lo > 1000 ||
        (hi >= 0 && (hi < lo || hi > 1000)))
      return fail("a counted repeat must be {n}, {n,} or {n,m} with n <= "
                  "m <= 1000");
    at_ = j; // its '}', taken below
  }
  ++at_;
  if (peek() == '?')
    ++at_; // lazy: the same strings
  Ast r;
  r.kind = Ast::Kind::Repeat;
  r.min = lo;
  r.max = hi;
  r.parts.push_back(std::move(a));
  a = std::move(r);
  // "a**", "a{2}{3}": ECMA-262 has nothing for the second to repeat. Taking
  // them would also let a run of quantifiers nest the parse tree (and the
  // recursion over it) without bound.
  if (peek() == '{' && !(at_ + 1 < text_.size() && text_[at_ + 1] >= '0' &&
                         text_[at_ + 1] <= '9'))
    return fail("a '{' that is not a counted repeat");
  if (quantifierStart(peek()))
    return fail("a quantifier after a quantifier (nothing to repeat)");
  return Status::ok();
}

Expected<Ast> PatternCompiler::atom() {
  const char32_t c = text_[at_++];
  Ast a;
  a.kind = Ast::Kind::Chars;
  switch (c) {
  case '(': {
    if (peek() == '?') {
      if (at_ + 1 < text_.size() && text_[at_ + 1] == ':')
        at_ += 2;
      else
        return fail("look-arounds and named groups are not supported");
    }
    if (depth_ >= SchemaPattern::kMaxGroupDepth)
      return fail("groups nested more than " +
                  std::to_string(SchemaPattern::kMaxGroupDepth) + " deep");
    ++depth_;
    Expected<Ast> inner = alternatives();
    --depth_;
    if (!inner)
      return inner;
    if (peek() != ')')
      return fail("a '(' without its ')'");
    ++at_;
    return inner;
  }
  case '[': {
    Expected<Ranges> r = charClass();
    if (!r)
      return r.error();
    a.chars = *r;
    return a;
  }
  case '.':
    a.chars = dotChars();
    return a;
  case '\\': {
    Expected<Ranges> r = escape(false);
    if (!r)
      return r.error();
    a.chars = *r;
    return a;
  }
  case '^':
  case '$':
    --at_;
    return fail("'^' and '$' are supported only first and last");
  case ')':
    --at_;
    return fail("a ')' without its '('");
  case '*':
  case '+':
  case '?':
  case '{':
    --at_;
    return fail("a quantifier with nothing before it");
  default:
    a.chars = {{uint32_t(c), uint32_t(c)}};
    return a;
  }
}

Expected<Ast> PatternCompiler::sequence() {
  Ast seq;
  while (more() && peek() != '|' && peek() != ')') {
    // A '$' last in the whole pattern is the end anchor (the caller's).
    if (peek() == '$' && at_ + 1 == text_.size())
      break;
    Expected<Ast> a = atom();
    if (!a)
      return a;
    if (Status st = quantifier(*a); !st)
      return st.error();
    seq.parts.push_back(std::move(*a));
  }
  return seq;
}

Expected<Ast> PatternCompiler::alternatives() {
  Expected<Ast> first = sequence();
  if (!first || peek() != '|')
    return first;
  Ast alt;
  alt.kind = Ast::Kind::Alt;
  alt.parts.push_back(std::move(*first));
  while (peek() == '|') {
    ++at_;
    Expected<Ast> next = sequence();
    if (!next)
      return next;
    alt.parts.push_back(std::move(*next));
  }
  return alt;
}

template <typename Join>
Expected<PatternCompiler::Frag> PatternCompiler::fold(const Ast &a, Join join) {
  Expected<Frag> f = build(a.parts[0]);
  if (!f)
    return f;
  for (size_t i = 1; i < a.parts.size(); ++i) {
    Expected<Frag> g = build(a.parts[i]);
    if (!g)
      return g;
    if (Status st = join(*f, *g); !st)
      return st.error();
  }
  return f;
}

Expected<PatternCompiler::Frag> PatternCompiler::build(const Ast &a) {
  auto epsilon = [&]() -> Expected<Frag> {
    Expected<int32_t> s = add({});
    if (!s)
      return s.error();
    return Frag{*s, {{*s, 0}}};
  };
  switch (a.kind) {
  case Ast::Kind::Chars: {
    SchemaPattern::State st;
    st.ranges = a.chars;
    if (st.ranges.empty())
      st.ranges = {{1, 0}}; // no code point (and not an empty step)
    Expected<int32_t> s = add(std::move(st));
    if (!s)
      return s.error();
    return Frag{*s, {{*s, 0}}};
  }
  case Ast::Kind::Concat:
    if (a.parts.empty())
      return epsilon();
    return fold(a, [&](Frag &f, Frag &g) {
      patch(f.outs, g.start);
      f.outs = std::move(g.outs);
      return Status::ok();
    });
  case Ast::Kind::Alt:
    return fold(a, [&](Frag &f, Frag &g) -> Status {
      SchemaPattern::State split;
      split.out[0] = f.start;
      split.out[1] = g.start;
      Expected<int32_t> s = add(std::move(split));
      if (!s)
        return s.error();
      f.start = *s;
      f.outs.insert(f.outs.end(), g.outs.begin(), g.outs.end());
      return Status::ok();
    });
  case Ast::Kind::Repeat: {
    // min copies, then (max - min) optional ones, or a loop.
    Expected<Frag> f = epsilon();
    if (!f)
      return f;
    auto append = [&](const Frag &g) {
      patch(f->outs, g.start);
      f->outs = g.outs;
    };
    for (int i = 0; i < a.min; ++i) {
      Expected<Frag> g = build(a.parts[0]);
      if (!g)
        return g;
      append(*g);
    }
    // A copy behind a split whose other way (slot 1) passes it by.
    auto optional = [&](int32_t &split) -> Expected<Frag> {
      Expected<Frag> g = build(a.parts[0]);
      if (!g)
        return g;
      SchemaPattern::State st;
      st.out[0] = g->start;
      Expected<int32_t> s = add(std::move(st));
      if (!s)
        return s.error();
      patch(f->outs, *s);
      split = *s;
      return g;
    };
    int32_t split = -1;
    if (a.max < 0) { // a loop back to the split
      Expected<Frag> g = optional(split);
      if (!g)
        return g;
      patch(g->outs, split);
      f->outs = {{split, 1}};
      return f;
    }
    std::vector<std::pair<int32_t, int>> skips;
    for (int i = a.min; i < a.max; ++i) {
      Expected<Frag> g = optional(split);
      if (!g)
        return g;
      skips.emplace_back(split, 1);
      f->outs = g->outs;
    }
    f->outs.insert(f->outs.end(), skips.begin(), skips.end());
    return f;
  }
  }
  return epsilon();
}

Expected<std::shared_ptr<const SchemaPattern>> PatternCompiler::run() {
  const bool anchoredStart = !text_.empty() && text_[0] == U'^';
  if (anchoredStart)
    ++at_;
  Expected<Ast> body = alternatives();
  if (!body)
    return body.error();
  bool anchoredEnd = false;
  if (more() && peek() == '$' && at_ + 1 == text_.size()) {
    anchoredEnd = true;
    ++at_;
  }
  if (more())
    return fail(peek() == ')'
                    ? "a ')' without its '('"
                    : "'^' and '$' are supported only first and last");
  if (body->kind == Ast::Kind::Alt && (anchoredStart || anchoredEnd))
    return fail("an anchor beside a top-level '|' (write ^(a|b)$)");
  // Unanchored ends take any text.
  Ast any;
  any.kind = Ast::Kind::Repeat;
  any.parts.push_back(Ast{Ast::Kind::Chars, complement({}), {}, 0, -1});
  Ast whole;
  if (!anchoredStart)
    whole.parts.push_back(any);
  whole.parts.push_back(std::move(*body));
  if (!anchoredEnd)
    whole.parts.push_back(any);
  Expected<Frag> f = build(whole);
  if (!f)
    return f.error();
  Expected<int32_t> match = add({});
  if (!match)
    return match.error();
  p_.match_ = *match;
  patch(f->outs, *match);
  // Closures, then the states that reach the match.
  const size_t n = p_.states_.size();
  p_.closure_.assign(n, PatternSet{});
  for (size_t i = 0; i < n; ++i) {
    std::vector<int32_t> todo = {int32_t(i)};
    while (!todo.empty()) {
      const int32_t s = todo.back();
      todo.pop_back();
      if (p_.closure_[i].test(size_t(s)))
        continue;
      p_.closure_[i].set(size_t(s));
      const SchemaPattern::State &st = p_.states_[size_t(s)];
      if (st.ranges.empty())
        for (int32_t o : st.out)
          if (o >= 0)
            todo.push_back(o);
    }
  }
  p_.live_.set(size_t(p_.match_));
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < n; ++i) {
      if (p_.live_.test(i))
        continue;
      const SchemaPattern::State &st = p_.states_[i];
      // A class of no code point leads nowhere.
      if (st.ranges.size() == 1 && st.ranges[0].first > st.ranges[0].second)
        continue;
      bool reaches = false;
      for (int32_t o : st.out)
        reaches = reaches || (o >= 0 && p_.live_.test(size_t(o)));
      if (reaches) {
        p_.live_.set(i);
        changed = true;
      }
    }
  }
  p_.start_ = p_.closure_[size_t(f->start)];
  p_.start_ &= p_.live_;
  if (!p_.start_.any())
    return fail("matches no string");
  return std::make_shared<const SchemaPattern>(std::move(p_));
}

PatternSet SchemaPattern::step(const PatternSet &s, uint32_t cp) const {
  PatternSet next;
  for (size_t i = 0; i < states_.size(); ++i) {
    if (!s.test(i) || states_[i].ranges.empty())
      continue;
    const Ranges &r = states_[i].ranges;
    auto it = std::upper_bound(
        r.begin(), r.end(), cp,
        [](uint32_t v, const std::pair<uint32_t, uint32_t> &x) {
          return v < x.first;
        });
    if (it != r.begin() && cp <= std::prev(it)->second)
      next |= closure_[size_t(states_[i].out[0])];
  }
  next &= live_;
  return next;
}

bool SchemaPattern::canTake(const PatternSet &s, uint32_t lo,
                            uint32_t hi) const {
  for (size_t i = 0; i < states_.size(); ++i) {
    if (!s.test(i) || states_[i].ranges.empty())
      continue;
    PatternSet next = closure_[size_t(states_[i].out[0])];
    next &= live_;
    if (!next.any())
      continue;
    for (const auto &[a, b] : states_[i].ranges)
      if (a <= hi && b >= lo && a <= b)
        return true;
  }
  return false;
}

Expected<std::shared_ptr<const SchemaPattern>>
SchemaPattern::compile(std::string_view pattern, const std::string &where,
                       const std::string &field) {
  // The pattern's code points (UTF-8 as JSON gives it).
  std::u32string text;
  for (size_t i = 0; i < pattern.size();) {
    const uint8_t b = uint8_t(pattern[i]);
    const int n = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
    uint32_t cp = n == 1 ? b : b & (0x3F >> (n - 1));
    if (i + size_t(n) > pattern.size())
      return Error(where, field, "pattern: not UTF-8");
    for (int k = 1; k < n; ++k)
      cp = cp << 6 | (uint8_t(pattern[i + size_t(k)]) & 0x3F);
    text.push_back(char32_t(cp));
    i += size_t(n);
  }
  return PatternCompiler(std::move(text), where, field).run();
}

} // namespace kiln::chat
