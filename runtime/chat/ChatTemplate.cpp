//===- ChatTemplate.cpp - Lexer and parser of Kiln's Jinja subset --------===//
//
// The lexer follows jinja2's (lexer.py) rule for rule, because whitespace
// handling is where a template's output most easily drifts:
//   - the source's newlines are normalized to "\n" and, unless
//     keep_trailing_newline, one newline at the very end is dropped;
//   - `{%-`, `{{-`, `{#-` strip all whitespace (Python's str.isspace) before
//     the tag; `-%}`, `-}}`, `-#}` strip all whitespace after it;
//   - trim_blocks drops one "\n" right after `%}` or `#}` (not after `}}`;
//     `+%}` turns it off for that tag);
//   - lstrip_blocks drops the whitespace between the start of a line and a
//     `{%` or `{#` (`{%+` turns it off for that tag);
//   - inside a tag, the closing delimiter only counts where brackets are
//     balanced, so `{{ {'a': {'b': 1}} }}` works.
// The parser is a recursive-descent copy of jinja2's expression grammar and
// precedence (parser.py), restricted to the subset; constructs outside it
// are rejected by name where they are parsed.
//
//===----------------------------------------------------------------------===//
#include "chat/ChatTemplate.h"

#include "chat/PyText.h"
#include "chat/TemplateAst.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <set>

namespace kiln::chat {
namespace detail {

std::string TemplateImpl::position(size_t offset) const {
  offset = std::min(offset, source.size());
  size_t line = 1, lineStart = 0;
  for (size_t i = 0; i < offset; ++i)
    if (source[i] == '\n') {
      ++line;
      lineStart = i + 1;
    }
  size_t column = 1;
  for (size_t i = lineStart; i < offset; ++i)
    if ((static_cast<unsigned char>(source[i]) & 0xC0) != 0x80)
      ++column; // count code points, not continuation bytes
  return "line " + std::to_string(line) + ", column " + std::to_string(column);
}

namespace {

//===----------------------------------------------------------------------===//
// Lexer
//===----------------------------------------------------------------------===//

enum class TokenKind {
  Data,       // text between tags
  BlockBegin, // {%
  BlockEnd,   // %}
  VarBegin,   // {{
  VarEnd,     // }}
  Name,
  String,   // value: the decoded text
  Integer,  // value: int
  Float,    // value: float
  Operator, // text: the operator
  End,      // end of the template
};

struct Token {
  TokenKind kind;
  size_t offset;
  std::string text;
  Value value;
};

std::string describe(const Token &token) {
  switch (token.kind) {
  case TokenKind::Data:
    return "template text";
  case TokenKind::BlockBegin:
    return "'{%'";
  case TokenKind::BlockEnd:
    return "end of statement ('%}')";
  case TokenKind::VarBegin:
    return "'{{'";
  case TokenKind::VarEnd:
    return "end of print statement ('}}')";
  case TokenKind::Name:
    return "'" + token.text + "'";
  case TokenKind::String:
    return "a string";
  case TokenKind::Integer:
  case TokenKind::Float:
    return "a number";
  case TokenKind::Operator:
    return "'" + token.text + "'";
  case TokenKind::End:
    return "end of template";
  }
  return "?";
}

bool isDigit(char c) { return c >= '0' && c <= '9'; }
bool isNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool isNameChar(char c) { return isNameStart(c) || isDigit(c); }

class Lexer {
public:
  Lexer(const TemplateImpl &impl) : impl_(impl), src_(impl.source) {}

  Expected<std::vector<Token>> run() {
    size_t pos = 0;
    bool lineStarting = true; // did the previous match end with "\n"?
    while (pos < src_.size()) {
      const size_t tag = findTagStart(pos);
      if (tag == std::string::npos) {
        emit(TokenKind::Data, pos, std::string(src_.substr(pos)));
        break;
      }
      const char type = src_[tag + 1]; // '{', '%' or '#'
      const char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      const bool hasSign = sign == '-' || sign == '+';
      std::string_view text = src_.substr(pos, tag - pos);
      std::string kept(text);
      if (sign == '-') {
        kept = pytext::strip(text, std::nullopt, false, true);
      } else if (sign != '+' && impl_.options.lstripBlocks && type != '{') {
        // Whitespace between the start of the line and the tag goes.
        const size_t lineStart = text.rfind('\n') == std::string_view::npos
                                     ? 0
                                     : text.rfind('\n') + 1;
        const std::string_view rest = text.substr(lineStart);
        if ((lineStart > 0 || lineStarting) && !rest.empty() &&
            pytext::strip(rest, std::nullopt, true, false).empty())
          kept = std::string(text.substr(0, lineStart));
      }
      if (!kept.empty())
        emit(TokenKind::Data, pos, std::move(kept));
      pos = tag + 2 + (hasSign ? 1 : 0);
      if (type == '#') {
        Status s = skipComment(tag, pos);
        if (!s)
          return s.error();
      } else {
        Status s = lexTag(tag, type == '%', pos);
        if (!s)
          return s.error();
      }
      lineStarting = pos > 0 && src_[pos - 1] == '\n';
    }
    emit(TokenKind::End, src_.size(), "");
    return std::move(tokens_);
  }

private:
  const TemplateImpl &impl_;
  std::string_view src_;
  std::vector<Token> tokens_;

  Error error(size_t offset, std::string problem) const {
    return Error(impl_.where, impl_.position(offset), std::move(problem));
  }

  void emit(TokenKind kind, size_t offset, std::string text, Value value = {}) {
    tokens_.push_back(Token{kind, offset, std::move(text), std::move(value)});
  }

  bool startsWith(size_t pos, std::string_view what) const {
    return src_.substr(pos, what.size()) == what;
  }

  /// The earliest "{{", "{%" or "{#" at or after pos.
  size_t findTagStart(size_t pos) const {
    while (true) {
      pos = src_.find('{', pos);
      if (pos == std::string_view::npos || pos + 1 >= src_.size())
        return std::string_view::npos;
      const char next = src_[pos + 1];
      if (next == '{' || next == '%' || next == '#')
        return pos;
      ++pos;
    }
  }

  /// Length of the whitespace code point at pos, or 0.
  size_t spaceAt(size_t pos) const {
    const auto b = static_cast<unsigned char>(src_[pos]);
    if (b < 0x80)
      return pytext::isSpace(b) ? 1 : 0;
    const size_t len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
    if (pos + len > src_.size())
      return 0;
    const std::vector<uint32_t> cps = pytext::decode(src_.substr(pos, len));
    return cps.size() == 1 && pytext::isSpace(cps[0]) ? len : 0;
  }

  size_t skipSpace(size_t pos) const {
    while (pos < src_.size()) {
      const size_t len = spaceAt(pos);
      if (!len)
        break;
      pos += len;
    }
    return pos;
  }

  /// After `{#`: up to the first `#}` (with its `-`/`+` and trimming).
  Status skipComment(size_t tag, size_t &pos) {
    const size_t close = src_.find("#}", pos);
    if (close == std::string_view::npos)
      return error(tag, "missing end of comment tag '#}'");
    const char sign = close > pos ? src_[close - 1] : '\0';
    pos = close + 2;
    if (sign == '-')
      pos = skipSpace(pos);
    else if (sign != '+' && impl_.options.trimBlocks && pos < src_.size() &&
             src_[pos] == '\n')
      ++pos;
    return Status::ok();
  }

  /// End of `(\d+_)*\d+` at pos, or npos.
  size_t digitsEnd(size_t pos) const {
    if (pos >= src_.size() || !isDigit(src_[pos]))
      return std::string_view::npos;
    while (true) {
      while (pos < src_.size() && isDigit(src_[pos]))
        ++pos;
      if (pos + 1 < src_.size() && src_[pos] == '_' && isDigit(src_[pos + 1]))
        ++pos;
      else
        return pos;
    }
  }

  /// End of jinja2's float_re at pos, or npos.
  size_t floatEnd(size_t pos) const {
    if (pos > 0 && src_[pos - 1] == '.')
      return std::string_view::npos;
    const size_t whole = digitsEnd(pos);
    if (whole == std::string_view::npos)
      return whole;
    size_t afterFraction = whole;
    if (whole < src_.size() && src_[whole] == '.') {
      const size_t fraction = digitsEnd(whole + 1);
      if (fraction != std::string_view::npos)
        afterFraction = fraction;
    }
    if (afterFraction < src_.size() &&
        (src_[afterFraction] == 'e' || src_[afterFraction] == 'E')) {
      size_t q = afterFraction + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-'))
        ++q;
      const size_t exponent = digitsEnd(q);
      if (exponent != std::string_view::npos)
        return exponent;
    }
    return afterFraction != whole ? afterFraction : std::string_view::npos;
  }

  /// End of jinja2's integer_re at pos (and its base), or npos.
  size_t integerEnd(size_t pos, int &base) const {
    auto run = [&](size_t p, auto isValid) {
      // (_?D)+ : at least one digit, each optionally after one underscore.
      size_t count = 0;
      while (p < src_.size()) {
        size_t q = p;
        if (src_[q] == '_')
          ++q;
        if (q < src_.size() && isValid(src_[q])) {
          p = q + 1;
          ++count;
        } else {
          break;
        }
      }
      return count ? p : std::string_view::npos;
    };
    if (pos >= src_.size() || !isDigit(src_[pos]))
      return std::string_view::npos;
    if (src_[pos] == '0' && pos + 1 < src_.size()) {
      const char p = static_cast<char>(src_[pos + 1] | 0x20);
      size_t end = std::string_view::npos;
      if (p == 'b') {
        base = 2;
        end = run(pos + 2, [](char c) { return c == '0' || c == '1'; });
      } else if (p == 'o') {
        base = 8;
        end = run(pos + 2, [](char c) { return c >= '0' && c <= '7'; });
      } else if (p == 'x') {
        base = 16;
        end = run(pos + 2, [](char c) {
          const char l = static_cast<char>(c | 0x20);
          return isDigit(c) || (l >= 'a' && l <= 'f');
        });
      }
      if (end != std::string_view::npos)
        return end;
    }
    base = 10;
    if (src_[pos] == '0') {
      // 0(_?0)*
      size_t p = pos + 1;
      while (true) {
        size_t q = p;
        if (q < src_.size() && src_[q] == '_')
          ++q;
        if (q < src_.size() && src_[q] == '0')
          p = q + 1;
        else
          return p;
      }
    }
    const size_t rest = run(pos + 1, isDigit);
    return rest == std::string_view::npos ? pos + 1 : rest;
  }

  /// Python's unicode-escape decoding of a string literal's body (jinja2
  /// applies it after spelling non-ASCII characters as \x, \u, \U escapes).
  Expected<std::string> unescape(size_t offset, std::string_view body) const {
    const std::vector<uint32_t> cps = pytext::decode(body);
    std::string out;
    auto hex = [&](size_t start, size_t count, uint32_t &value) {
      if (start + count > cps.size())
        return false;
      value = 0;
      for (size_t k = start; k < start + count; ++k) {
        const uint32_t c = cps[k];
        uint32_t digit;
        if (c >= '0' && c <= '9')
          digit = c - '0';
        else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
          digit = (c | 0x20) - 'a' + 10;
        else
          return false;
        value = value * 16 + digit;
      }
      return true;
    };
    for (size_t i = 0; i < cps.size(); ++i) {
      if (cps[i] != '\\' || i + 1 == cps.size()) {
        pytext::append(out, cps[i]);
        continue;
      }
      const uint32_t c = cps[++i];
      switch (c) {
      case '\n': break; // line continuation
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x':
      case 'u':
      case 'U': {
        const size_t count = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        uint32_t value;
        if (!hex(i + 1, count, value))
          return error(offset, std::string("truncated \\") + char(c) +
                                   " escape in a string literal");
        if (value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF))
          return error(offset, "unsupported: escape of a surrogate or a code "
                               "point past U+10FFFF in a string literal");
        pytext::append(out, value);
        i += count;
        break;
      }
      case 'N':
        return error(offset, "unsupported: \\N{...} escape in a string literal");
      default:
        if (c >= '0' && c <= '7') {
          uint32_t value = c - '0';
          for (int k = 0; k < 2 && i + 1 < cps.size() && cps[i + 1] >= '0' &&
                          cps[i + 1] <= '7';
               ++k)
            value = value * 8 + (cps[++i] - '0');
          pytext::append(out, value);
        } else if (c >= 0x80) {
          // jinja2 spelled c as an escape first; the backslash before it
          // escaped that escape's own backslash.
          out += '\\';
          char spelled[16];
          if (c <= 0xFF)
            std::snprintf(spelled, sizeof spelled, "x%02x", c);
          else if (c <= 0xFFFF)
            std::snprintf(spelled, sizeof spelled, "u%04x", c);
          else
            std::snprintf(spelled, sizeof spelled, "U%08x", c);
          out += spelled;
        } else {
          out += '\\'; // unknown escapes stay as written
          pytext::append(out, c);
        }
      }
    }
    return out;
  }

  /// Tokens of one `{% ... %}` or `{{ ... }}` (pos: after the opening
  /// delimiter and its sign).
  Status lexTag(size_t tag, bool block, size_t &pos) {
    emit(block ? TokenKind::BlockBegin : TokenKind::VarBegin, tag, "");
    std::vector<char> closers; // brackets still open
    while (true) {
      if (pos >= src_.size())
        return error(tag, std::string("unexpected end of template: the tag "
                                      "opened here is never closed (missing '") +
                              (block ? "%}" : "}}") + "')");
      if (closers.empty()) {
        if (block) {
          if (startsWith(pos, "+%}")) {
            emit(TokenKind::BlockEnd, pos, "");
            pos += 3;
            return Status::ok();
          }
          if (startsWith(pos, "-%}")) {
            emit(TokenKind::BlockEnd, pos, "");
            pos = skipSpace(pos + 3);
            return Status::ok();
          }
          if (startsWith(pos, "%}")) {
            emit(TokenKind::BlockEnd, pos, "");
            pos += 2;
            if (impl_.options.trimBlocks && pos < src_.size() && src_[pos] == '\n')
              ++pos;
            return Status::ok();
          }
        } else {
          if (startsWith(pos, "-}}")) {
            emit(TokenKind::VarEnd, pos, "");
            pos = skipSpace(pos + 3);
            return Status::ok();
          }
          if (startsWith(pos, "}}")) {
            emit(TokenKind::VarEnd, pos, "");
            pos += 2;
            return Status::ok();
          }
        }
      }
      if (const size_t space = spaceAt(pos)) {
        pos += space;
        continue;
      }
      const char c = src_[pos];
      const size_t start = pos;
      if (const size_t end = floatEnd(pos); end != std::string_view::npos) {
        std::string digits;
        for (size_t k = pos; k < end; ++k)
          if (src_[k] != '_')
            digits += src_[k];
        emit(TokenKind::Float, start, digits,
             Value::number(std::strtod(digits.c_str(), nullptr)));
        pos = end;
        continue;
      }
      int base = 10;
      if (const size_t end = integerEnd(pos, base); end != std::string_view::npos) {
        std::string digits;
        for (size_t k = base == 10 ? pos : pos + 2; k < end; ++k)
          if (src_[k] != '_')
            digits += src_[k];
        errno = 0;
        char *stop = nullptr;
        const long long value = std::strtoll(digits.c_str(), &stop, base);
        if (errno == ERANGE)
          return error(start, "integer literal too large (Kiln's integers are "
                              "64-bit)");
        emit(TokenKind::Integer, start, std::string(src_.substr(pos, end - pos)),
             Value::integer(value));
        pos = end;
        continue;
      }
      if (isNameStart(c)) {
        while (pos < src_.size() && isNameChar(src_[pos]))
          ++pos;
        emit(TokenKind::Name, start, std::string(src_.substr(start, pos - start)));
        continue;
      }
      if (c == '\'' || c == '"') {
        size_t p = pos + 1;
        while (p < src_.size() && src_[p] != c)
          p += src_[p] == '\\' ? 2 : 1;
        if (p >= src_.size())
          return error(start, "unterminated string literal");
        Expected<std::string> text = unescape(start, src_.substr(pos + 1, p - pos - 1));
        if (!text)
          return text.error();
        emit(TokenKind::String, start, "", Value(std::move(*text)));
        pos = p + 1;
        continue;
      }
      static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
      std::string op;
      for (std::string_view two : kTwo)
        if (startsWith(pos, two))
          op = two;
      if (op.empty() && std::strchr("+-/*%~[](){}><=.:|,;", c) && c != '\0')
        op = std::string(1, c);
      if (op.empty())
        return error(start, std::string("unexpected character '") +
                                pytext::encode({pytext::decode(src_.substr(pos, 4))[0]}) +
                                "' in a tag");
      if (op == "(" || op == "[" || op == "{") {
        closers.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
      } else if (op == ")" || op == "]" || op == "}") {
        if (closers.empty())
          return error(start, "unexpected '" + op + "'");
        if (closers.back() != op[0])
          return error(start, "unexpected '" + op + "', expected '" +
                                  std::string(1, closers.back()) + "'");
        closers.pop_back();
      }
      emit(TokenKind::Operator, start, op);
      pos += op.size();
    }
  }
};

//===----------------------------------------------------------------------===//
// Parser
//===----------------------------------------------------------------------===//

/// Jinja tags that exist but are not in the subset.
constexpr std::string_view kUnsupportedTags[] = {
    "call",          "endcall", "filter",  "endfilter", "include",
    "import",        "from",    "extends", "block",     "endblock",
    "with",          "endwith", "raw",     "endraw",    "autoescape",
    "endautoescape", "do",      "trans",   "endtrans",  "pluralize",
    "endset",        "print"};

/// Jinja globals and functions that exist but are not in the subset.
constexpr std::string_view kKnownUnsupportedFunctions[] = {
    "dict",   "lipsum", "cycler", "joiner",  "strftime_now",
    "caller", "super",  "self",   "varargs", "kwargs"};

/// Names a macro's body may not use: jinja2 gives them meaning there
/// (extra arguments, {% call %}), which the subset does not have.
constexpr std::string_view kMacroSpecialNames[] = {"varargs", "kwargs",
                                                   "caller"};

bool contains(std::initializer_list<std::string_view> list, std::string_view s) {
  return std::find(list.begin(), list.end(), s) != list.end();
}

class Parser {
public:
  Parser(const TemplateImpl &impl, std::vector<Token> tokens)
      : impl_(impl), tokens_(std::move(tokens)) {}

  Expected<Body> run() {
    std::string endTag;
    Expected<Body> body = parseBody({}, endTag, 0);
    if (!body)
      return body.error();
    // A call to a name that is neither a function nor a macro defined
    // anywhere in the template (a macro may call one defined after it).
    for (const auto &[name, offset] : macroCalls_)
      if (!macroNames_.count(name)) {
        const bool known =
            std::find(std::begin(kKnownUnsupportedFunctions),
                      std::end(kKnownUnsupportedFunctions),
                      name) != std::end(kKnownUnsupportedFunctions);
        return error(offset,
                     "unsupported: " + std::string(known ? "" : "unknown ") +
                         "function '" + name +
                         "()' (Kiln's Jinja subset has range(), "
                         "namespace(), raise_exception() and the "
                         "template's macros)");
      }
    return body;
  }

private:
  const TemplateImpl &impl_;
  std::vector<Token> tokens_;
  size_t index_ = 0;
  uint32_t depth_ = 0;
  int loops_ = 0; // enclosing for loops (for break/continue)
  int macros_ = 0; // enclosing macro definitions
  std::set<std::string> macroNames_;
  std::vector<std::pair<std::string, size_t>> macroCalls_;

  // --- helpers -------------------------------------------------------------

  Error error(size_t offset, std::string problem) const {
    return Error(impl_.where, impl_.position(offset), std::move(problem));
  }
  Error unexpected(std::string_view expected) const {
    return error(cur().offset, "expected " + std::string(expected) + ", got " +
                                   describe(cur()));
  }

  const Token &cur() const { return tokens_[index_]; }
  const Token &peek(size_t ahead = 1) const {
    return tokens_[std::min(index_ + ahead, tokens_.size() - 1)];
  }
  void advance() {
    if (index_ + 1 < tokens_.size())
      ++index_;
  }
  bool isOp(std::string_view op) const {
    return cur().kind == TokenKind::Operator && cur().text == op;
  }
  bool isName(std::string_view name) const {
    return cur().kind == TokenKind::Name && cur().text == name;
  }
  bool skipOp(std::string_view op) {
    if (!isOp(op))
      return false;
    advance();
    return true;
  }
  bool skipName(std::string_view name) {
    if (!isName(name))
      return false;
    advance();
    return true;
  }
  Status expectOp(std::string_view op) {
    if (!skipOp(op)) {
      std::string quoted(1, '\'');
      quoted.append(op);
      quoted += '\'';
      return unexpected(quoted);
    }
    return Status::ok();
  }
  Status expectBlockEnd() {
    if (cur().kind != TokenKind::BlockEnd)
      return unexpected("end of statement ('%}')");
    advance();
    return Status::ok();
  }

  /// Counts nesting; fails past kMaxNestingDepth.
  struct DepthGuard {
    uint32_t &depth;
    explicit DepthGuard(uint32_t &d) : depth(d) { ++depth; }
    ~DepthGuard() { --depth; }
  };
  Status checkDepth(size_t offset) const {
    if (depth_ > kMaxNestingDepth)
      return error(offset, "template nested too deeply (limit " +
                               std::to_string(kMaxNestingDepth) + ")");
    return Status::ok();
  }

  static ExprPtr make(ExprKind kind, size_t offset) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->offset = offset;
    return e;
  }

  /// Records a finished node's height (1 + its tallest child) and refuses
  /// trees taller than kMaxNestingDepth: the renderer walks them
  /// recursively, and `1 + 1 + ... + 1` builds height without recursion here.
  Expected<ExprPtr> seal(ExprPtr node) const {
    uint32_t tallest = 0;
    for (const ExprPtr &child : node->operands)
      if (child)
        tallest = std::max(tallest, child->height);
    for (const Arg &arg : node->args)
      if (arg.value)
        tallest = std::max(tallest, arg.value->height);
    node->height = tallest + 1;
    if (node->height > kMaxNestingDepth)
      return error(node->offset, "expression nested too deeply (limit " +
                                     std::to_string(kMaxNestingDepth) + ")");
    return node;
  }

  // --- statements ----------------------------------------------------------

  /// Nodes up to a `{% NAME` with NAME in `ends` (left at NAME, whose text
  /// goes to `endTag`) or, when `ends` is empty, the end of the template.
  Expected<Body> parseBody(std::initializer_list<std::string_view> ends,
                           std::string &endTag, size_t opener) {
    DepthGuard guard(depth_);
    if (Status s = checkDepth(opener); !s)
      return s.error();
    Body body;
    while (true) {
      const Token &token = cur();
      switch (token.kind) {
      case TokenKind::End:
        if (ends.size() != 0) {
          std::string names;
          for (std::string_view e : ends)
            names += (names.empty() ? "'{% " : "' or '{% ") + std::string(e) + " %}";
          return error(opener, "unexpected end of template: the block opened "
                               "here is never closed (expected " +
                                   names + "')");
        }
        return body;
      case TokenKind::Data: {
        Node node;
        node.kind = NodeKind::Text;
        node.offset = token.offset;
        node.text = token.text;
        body.push_back(std::move(node));
        advance();
        break;
      }
      case TokenKind::VarBegin: {
        Node node;
        node.kind = NodeKind::Output;
        node.offset = token.offset;
        advance();
        Expected<ExprPtr> expr = parseTuple(true);
        if (!expr)
          return expr.error();
        if (cur().kind != TokenKind::VarEnd)
          return unexpected("end of print statement ('}}')");
        advance();
        node.expr = std::move(*expr);
        body.push_back(std::move(node));
        break;
      }
      case TokenKind::BlockBegin: {
        advance();
        if (cur().kind != TokenKind::Name)
          return unexpected("a statement name");
        const std::string name = cur().text;
        if (contains(ends, name)) {
          endTag = name;
          return body;
        }
        if (contains({"elif", "else", "endif", "endfor"}, name)) {
          std::string expected;
          for (std::string_view e : ends)
            expected += (expected.empty() ? "'{% " : "' or '{% ") + std::string(e) + " %}";
          return error(cur().offset,
                       "unexpected '{% " + name + " %}'" +
                           (expected.empty() ? std::string(" (no block is open)")
                                             : " (expected " + expected + "')"));
        }
        Status s = parseStatement(body);
        if (!s)
          return s.error();
        break;
      }
      default:
        return unexpected("template text or a tag");
      }
    }
  }

  Status parseStatement(Body &body) {
    const Token &token = cur();
    const std::string &name = token.text;
    if (name == "if")
      return parseIf(body);
    if (name == "for")
      return parseFor(body);
    if (name == "set")
      return parseSet(body);
    if (name == "macro")
      return parseMacro(body);
    if (name == "break" || name == "continue") {
      if (loops_ == 0)
        return error(token.offset, "'" + name + "' outside of a for loop");
      Node node;
      node.kind = name == "break" ? NodeKind::Break : NodeKind::Continue;
      node.offset = token.offset;
      advance();
      if (Status s = expectBlockEnd(); !s)
        return s;
      body.push_back(std::move(node));
      return Status::ok();
    }
    if (std::find(std::begin(kUnsupportedTags), std::end(kUnsupportedTags), name) !=
        std::end(kUnsupportedTags))
      return error(token.offset, "unsupported: '{% " + name +
                                     " %}' is not in Kiln's Jinja subset "
                                     "(docs/chat.md)");
    return error(token.offset, "unknown tag '" + name + "'");
  }

  Status parseIf(Body &body) {
    Node node;
    node.kind = NodeKind::If;
    node.offset = cur().offset;
    advance(); // if
    while (true) {
      IfBranch branch;
      Expected<ExprPtr> cond = parseTuple(false);
      if (!cond)
        return cond.error();
      branch.condition = std::move(*cond);
      if (Status s = expectBlockEnd(); !s)
        return s;
      std::string endTag;
      Expected<Body> inner = parseBody({"elif", "else", "endif"}, endTag, node.offset);
      if (!inner)
        return inner.error();
      branch.body = std::move(*inner);
      node.branches.push_back(std::move(branch));
      advance(); // the end tag's name
      if (endTag == "elif")
        continue;
      if (endTag == "else") {
        if (Status s = expectBlockEnd(); !s)
          return s;
        IfBranch elseBranch;
        Expected<Body> rest = parseBody({"endif"}, endTag, node.offset);
        if (!rest)
          return rest.error();
        elseBranch.body = std::move(*rest);
        node.branches.push_back(std::move(elseBranch));
        advance(); // endif
      }
      if (Status s = expectBlockEnd(); !s)
        return s;
      break;
    }
    body.push_back(std::move(node));
    return Status::ok();
  }

  /// `name` or `a, b` or `(a, b)`: the names a for or set assigns.
  Status parseTargets(Node &node, std::string_view statement) {
    const bool parenthesized = skipOp("(");
    while (true) {
      if (cur().kind != TokenKind::Name)
        return unexpected("a variable name");
      const std::string &name = cur().text;
      if (contains({"true", "false", "none", "True", "False", "None"}, name))
        return error(cur().offset, "cannot assign to '" + name + "'");
      node.targets.push_back(name);
      advance();
      if (isOp(".") || isOp("["))
        return error(cur().offset,
                     "unsupported: assigning to an attribute or item in '{% " +
                         std::string(statement) +
                         " %}' (a namespace's attribute is set by '{% set "
                         "ns.name = ... %}')");
      if (!skipOp(","))
        break;
      node.unpack = true;
      if (parenthesized && isOp(")"))
        break;
    }
    if (parenthesized) {
      node.unpack = true;
      if (Status s = expectOp(")"); !s)
        return s;
    }
    return Status::ok();
  }

  Status parseFor(Body &body) {
    Node node;
    node.kind = NodeKind::For;
    node.offset = cur().offset;
    advance(); // for
    if (Status s = parseTargets(node, "for"); !s)
      return s;
    if (!skipName("in"))
      return unexpected("'in'");
    Expected<ExprPtr> iterable = parseTuple(false);
    if (!iterable)
      return iterable.error();
    node.expr = std::move(*iterable);
    if (skipName("if")) {
      Expected<ExprPtr> filter = parseExpression(true);
      if (!filter)
        return filter.error();
      node.filter = std::move(*filter);
    }
    if (isName("recursive"))
      return error(cur().offset, "unsupported: recursive for loops");
    if (Status s = expectBlockEnd(); !s)
      return s;
    std::string endTag;
    ++loops_;
    Expected<Body> inner = parseBody({"endfor", "else"}, endTag, node.offset);
    --loops_;
    if (!inner)
      return inner.error();
    node.body = std::move(*inner);
    advance();
    if (endTag == "else") {
      if (Status s = expectBlockEnd(); !s)
        return s;
      Expected<Body> rest = parseBody({"endfor"}, endTag, node.offset);
      if (!rest)
        return rest.error();
      node.elseBody = std::move(*rest);
      advance();
    }
    if (Status s = expectBlockEnd(); !s)
      return s;
    body.push_back(std::move(node));
    return Status::ok();
  }

  /// `{% macro name(a, b=default) %}...{% endmacro %}`.
  Status parseMacro(Body &body) {
    Node node;
    node.kind = NodeKind::Macro;
    node.offset = cur().offset;
    advance(); // macro
    if (cur().kind != TokenKind::Name)
      return unexpected("a macro name");
    if (findFunction(cur().text) || cur().text == "namespace")
      return error(cur().offset, "unsupported: a macro named '" + cur().text +
                                     "' (it would hide the function of that "
                                     "name, which Kiln's calls still reach)");
    node.text = cur().text;
    advance();
    if (Status s = expectOp("("); !s)
      return s;
    while (!isOp(")")) {
      if (!node.targets.empty())
        if (Status s = expectOp(","); !s)
          return s;
      if (cur().kind != TokenKind::Name)
        return unexpected("a parameter name");
      const std::string &param = cur().text;
      if (std::find(node.targets.begin(), node.targets.end(), param) !=
          node.targets.end())
        return error(cur().offset, "duplicate parameter '" + param + "'");
      node.targets.push_back(param);
      advance();
      ExprPtr fallback;
      if (skipOp("=")) {
        Expected<ExprPtr> value = parseExpression(true);
        if (!value)
          return value.error();
        fallback = std::move(*value);
      } else if (!node.defaults.empty() && node.defaults.back()) {
        return error(cur().offset,
                     "non-default argument follows default argument");
      }
      node.defaults.push_back(std::move(fallback));
    }
    advance(); // )
    if (Status s = expectBlockEnd(); !s)
      return s;
    // The body is a scope of its own: no loop encloses it.
    const int loops = loops_;
    loops_ = 0;
    ++macros_;
    std::string endTag;
    Expected<Body> inner = parseBody({"endmacro"}, endTag, node.offset);
    --macros_;
    loops_ = loops;
    if (!inner)
      return inner.error();
    node.body = std::move(*inner);
    advance(); // endmacro
    if (cur().kind == TokenKind::Name && cur().text == node.text)
      advance(); // {% endmacro name %}
    if (Status s = expectBlockEnd(); !s)
      return s;
    macroNames_.insert(node.text);
    body.push_back(std::move(node));
    return Status::ok();
  }

  Status parseSet(Body &body) {
    Node node;
    node.kind = NodeKind::Set;
    node.offset = cur().offset;
    advance(); // set
    // `set ns.attr = value`: a namespace's attribute.
    const bool attribute = cur().kind == TokenKind::Name &&
                           peek().kind == TokenKind::Operator &&
                           peek().text == "." &&
                           peek(2).kind == TokenKind::Name;
    if (attribute) {
      node.targets.push_back(cur().text);
      node.attribute = peek(2).text;
      advance();
      advance();
      advance();
    } else if (Status s = parseTargets(node, "set"); !s) {
      return s;
    }
    if (!skipOp("=")) {
      if (attribute)
        return unexpected("'='");
      if (cur().kind == TokenKind::BlockEnd || isOp("|"))
        return error(cur().offset, "unsupported: block assignment '{% set " +
                                       node.targets[0] + " %}...{% endset %}'");
      return unexpected("'='");
    }
    Expected<ExprPtr> value = parseTuple(true);
    if (!value)
      return value.error();
    node.expr = std::move(*value);
    if (Status s = expectBlockEnd(); !s)
      return s;
    body.push_back(std::move(node));
    return Status::ok();
  }

  // --- expressions (jinja2's grammar, highest level first) -----------------

  bool atTupleEnd() const {
    return cur().kind == TokenKind::VarEnd || cur().kind == TokenKind::BlockEnd ||
           isOp(")");
  }

  /// An expression, or several separated by commas (a tuple).
  Expected<ExprPtr> parseTuple(bool withCondition, bool explicitParens = false) {
    const size_t offset = cur().offset;
    std::vector<ExprPtr> items;
    bool isTuple = false;
    while (true) {
      if (!items.empty()) {
        if (Status s = expectOp(","); !s)
          return s.error();
      }
      if (!items.empty() && atTupleEnd()) // a trailing comma: (1,)
        break;
      if (items.empty() && explicitParens && isOp(")"))
        break;
      Expected<ExprPtr> item = withCondition ? parseExpression(true) : parseOr();
      if (!item)
        return item.error();
      items.push_back(std::move(*item));
      if (isOp(","))
        isTuple = true;
      else
        break;
    }
    if (!isTuple) {
      if (items.empty()) {
        if (explicitParens) // ()
          return make(ExprKind::Tuple, offset);
        return unexpected("an expression");
      }
      return std::move(items[0]);
    }
    ExprPtr tuple = make(ExprKind::Tuple, offset);
    tuple->operands = std::move(items);
    return seal(std::move(tuple));
  }

  Expected<ExprPtr> parseExpression(bool withCondition) {
    DepthGuard guard(depth_);
    if (Status s = checkDepth(cur().offset); !s)
      return s.error();
    if (!withCondition)
      return parseOr();
    Expected<ExprPtr> expr = parseOr();
    if (!expr)
      return expr;
    ExprPtr result = std::move(*expr);
    while (isName("if")) {
      const size_t offset = cur().offset;
      advance();
      Expected<ExprPtr> cond = parseOr();
      if (!cond)
        return cond;
      ExprPtr node = make(ExprKind::Cond, offset);
      node->operands.push_back(std::move(result));
      node->operands.push_back(std::move(*cond));
      if (skipName("else")) {
        Expected<ExprPtr> otherwise = parseExpression(true);
        if (!otherwise)
          return otherwise;
        node->operands.push_back(std::move(*otherwise));
      } else {
        node->operands.push_back(nullptr);
      }
      Expected<ExprPtr> sealed = seal(std::move(node));
      if (!sealed)
        return sealed;
      result = std::move(*sealed);
    }
    return result;
  }

  /// Left-associative binary levels.
  template <typename Next>
  Expected<ExprPtr> parseBinaryLevel(Next next,
                                     std::initializer_list<std::string_view> ops,
                                     ExprKind kind, bool namedOp) {
    Expected<ExprPtr> left = (this->*next)();
    if (!left)
      return left;
    ExprPtr result = std::move(*left);
    while (true) {
      std::string op;
      for (std::string_view candidate : ops)
        if (namedOp ? isName(candidate) : isOp(candidate))
          op = candidate;
      if (op.empty())
        return result;
      const size_t offset = cur().offset;
      advance();
      Expected<ExprPtr> right = (this->*next)();
      if (!right)
        return right;
      ExprPtr node = make(kind, offset);
      node->name = op;
      node->operands.push_back(std::move(result));
      node->operands.push_back(std::move(*right));
      Expected<ExprPtr> sealed = seal(std::move(node));
      if (!sealed)
        return sealed;
      result = std::move(*sealed);
    }
  }

  Expected<ExprPtr> parseOr() {
    return parseBinaryLevel(&Parser::parseAnd, {"or"}, ExprKind::Or, true);
  }
  Expected<ExprPtr> parseAnd() {
    return parseBinaryLevel(&Parser::parseNot, {"and"}, ExprKind::And, true);
  }
  Expected<ExprPtr> parseNot() {
    if (isName("not")) {
      const size_t offset = cur().offset;
      DepthGuard guard(depth_);
      if (Status s = checkDepth(offset); !s)
        return s.error();
      advance();
      Expected<ExprPtr> inner = parseNot();
      if (!inner)
        return inner;
      ExprPtr node = make(ExprKind::Not, offset);
      node->operands.push_back(std::move(*inner));
      return seal(std::move(node));
    }
    return parseCompare();
  }
  Expected<ExprPtr> parseCompare() {
    const size_t offset = cur().offset;
    Expected<ExprPtr> first = parseMath1();
    if (!first)
      return first;
    ExprPtr node = make(ExprKind::Compare, offset);
    node->operands.push_back(std::move(*first));
    while (true) {
      std::string op;
      if (cur().kind == TokenKind::Operator &&
          contains({"==", "!=", "<", "<=", ">", ">="}, cur().text)) {
        op = cur().text;
        advance();
      } else if (isName("in")) {
        op = "in";
        advance();
      } else if (isName("not") && peek().kind == TokenKind::Name &&
                 peek().text == "in") {
        op = "notin";
        advance();
        advance();
      } else {
        break;
      }
      Expected<ExprPtr> next = parseMath1();
      if (!next)
        return next;
      node->ops.push_back(op);
      node->operands.push_back(std::move(*next));
    }
    if (node->ops.empty())
      return std::move(node->operands[0]);
    return seal(std::move(node));
  }
  Expected<ExprPtr> parseMath1() {
    return parseBinaryLevel(&Parser::parseConcat, {"+", "-"}, ExprKind::Binary, false);
  }
  Expected<ExprPtr> parseConcat() {
    return parseBinaryLevel(&Parser::parseMath2, {"~"}, ExprKind::Binary, false);
  }
  Expected<ExprPtr> parseMath2() {
    return parseBinaryLevel(&Parser::parsePow, {"*", "/", "//", "%"},
                            ExprKind::Binary, false);
  }
  Expected<ExprPtr> parsePow() {
    return parseBinaryLevel(&Parser::parseUnaryWithFilters, {"**"},
                            ExprKind::Binary, false);
  }
  Expected<ExprPtr> parseUnaryWithFilters() { return parseUnary(true); }

  Expected<ExprPtr> parseUnary(bool withFilters) {
    const size_t offset = cur().offset;
    DepthGuard guard(depth_);
    if (Status s = checkDepth(offset); !s)
      return s.error();
    ExprPtr node;
    if (isOp("-") || isOp("+")) {
      const bool negate = isOp("-");
      advance();
      Expected<ExprPtr> inner = parseUnary(false);
      if (!inner)
        return inner;
      ExprPtr sign = make(negate ? ExprKind::Neg : ExprKind::Pos, offset);
      sign->operands.push_back(std::move(*inner));
      Expected<ExprPtr> sealed = seal(std::move(sign));
      if (!sealed)
        return sealed;
      node = std::move(*sealed);
    } else {
      Expected<ExprPtr> primary = parsePrimary();
      if (!primary)
        return primary;
      node = std::move(*primary);
    }
    Expected<ExprPtr> postfix = parsePostfix(std::move(node));
    if (!postfix || !withFilters)
      return postfix;
    return parseFilterExpr(std::move(*postfix));
  }

  Expected<ExprPtr> parsePrimary() {
    const Token &token = cur();
    const size_t offset = token.offset;
    switch (token.kind) {
    case TokenKind::Name: {
      ExprPtr node = make(ExprKind::Literal, offset);
      const std::string &name = token.text;
      if (name == "true" || name == "True")
        node->literal = Value::boolean(true);
      else if (name == "false" || name == "False")
        node->literal = Value::boolean(false);
      else if (name == "none" || name == "None")
        node->literal = Value::none();
      else {
        if (macros_ > 0 && std::find(std::begin(kMacroSpecialNames),
                                     std::end(kMacroSpecialNames),
                                     name) != std::end(kMacroSpecialNames))
          return error(offset, "unsupported: '" + name +
                                   "' in a macro (Kiln's macros take their "
                                   "declared parameters only)");
        node->kind = ExprKind::Name;
        node->name = name;
      }
      advance();
      return node;
    }
    case TokenKind::String: {
      // Adjacent string literals join, as in Python.
      std::string text;
      while (cur().kind == TokenKind::String) {
        text += cur().value.asString();
        advance();
      }
      ExprPtr node = make(ExprKind::Literal, offset);
      node->literal = Value(std::move(text));
      return node;
    }
    case TokenKind::Integer:
    case TokenKind::Float: {
      ExprPtr node = make(ExprKind::Literal, offset);
      node->literal = token.value;
      advance();
      return node;
    }
    case TokenKind::Operator:
      if (token.text == "(") {
        advance();
        Expected<ExprPtr> inner = parseTuple(true, true);
        if (!inner)
          return inner;
        if (Status s = expectOp(")"); !s)
          return s.error();
        return inner;
      }
      if (token.text == "[")
        return parseListOrDict(false);
      if (token.text == "{")
        return parseListOrDict(true);
      break;
    default:
      break;
    }
    return unexpected("an expression");
  }

  Expected<ExprPtr> parseListOrDict(bool dict) {
    ExprPtr node = make(dict ? ExprKind::Dict : ExprKind::List, cur().offset);
    advance(); // [ or {
    const std::string_view close = dict ? "}" : "]";
    while (!isOp(close)) {
      if (!node->operands.empty()) {
        if (Status s = expectOp(","); !s)
          return s.error();
        if (isOp(close))
          break;
      }
      Expected<ExprPtr> item = parseExpression(true);
      if (!item)
        return item;
      node->operands.push_back(std::move(*item));
      if (dict) {
        if (Status s = expectOp(":"); !s)
          return s.error();
        Expected<ExprPtr> value = parseExpression(true);
        if (!value)
          return value;
        node->operands.push_back(std::move(*value));
      }
    }
    advance();
    return seal(std::move(node));
  }

  Expected<ExprPtr> parsePostfix(ExprPtr node) {
    while (true) {
      if (isOp(".")) {
        const size_t offset = cur().offset;
        advance();
        if (cur().kind == TokenKind::Name) {
          ExprPtr attr = make(ExprKind::Attr, offset);
          attr->name = cur().text;
          if (node->kind == ExprKind::Name && node->name == "loop" &&
              contains({"cycle", "changed"}, attr->name))
            return error(offset, "unsupported: loop." + attr->name);
          attr->operands.push_back(std::move(node));
          Expected<ExprPtr> sealed = seal(std::move(attr));
          if (!sealed)
            return sealed;
          node = std::move(*sealed);
          advance();
        } else if (cur().kind == TokenKind::Integer) {
          ExprPtr item = make(ExprKind::Item, offset);
          ExprPtr key = make(ExprKind::Literal, cur().offset);
          key->literal = cur().value;
          item->operands.push_back(std::move(node));
          item->operands.push_back(std::move(key));
          Expected<ExprPtr> sealed = seal(std::move(item));
          if (!sealed)
            return sealed;
          node = std::move(*sealed);
          advance();
        } else {
          return unexpected("an attribute name");
        }
      } else if (isOp("[")) {
        Expected<ExprPtr> sub = parseSubscript(std::move(node));
        if (!sub)
          return sub;
        node = std::move(*sub);
      } else if (isOp("(")) {
        Expected<ExprPtr> call = parseCall(std::move(node));
        if (!call)
          return call;
        node = std::move(*call);
      } else {
        return node;
      }
    }
  }

  Expected<ExprPtr> parseSubscript(ExprPtr object) {
    const size_t offset = cur().offset;
    advance(); // [
    std::vector<ExprPtr> parts; // start, stop, step
    if (isOp(":")) {
      parts.push_back(nullptr);
    } else {
      Expected<ExprPtr> index = parseExpression(true);
      if (!index)
        return index;
      if (!isOp(":")) {
        if (isOp(","))
          return error(cur().offset, "unsupported: tuple subscript a[x, y]");
        if (Status s = expectOp("]"); !s)
          return s.error();
        ExprPtr item = make(ExprKind::Item, offset);
        item->operands.push_back(std::move(object));
        item->operands.push_back(std::move(*index));
        return seal(std::move(item));
      }
      parts.push_back(std::move(*index));
    }
    advance(); // the first ':'
    auto optionalPart = [&]() -> Expected<ExprPtr> {
      if (isOp("]") || isOp(",") || isOp(":"))
        return ExprPtr();
      return parseExpression(true);
    };
    Expected<ExprPtr> stop = optionalPart();
    if (!stop)
      return stop;
    parts.push_back(std::move(*stop));
    if (skipOp(":")) {
      Expected<ExprPtr> step = optionalPart();
      if (!step)
        return step;
      parts.push_back(std::move(*step));
    } else {
      parts.push_back(nullptr);
    }
    if (isOp(","))
      return error(cur().offset, "unsupported: tuple subscript a[x, y]");
    if (Status s = expectOp("]"); !s)
      return s.error();
    ExprPtr node = make(ExprKind::Slice, offset);
    node->operands.push_back(std::move(object));
    for (ExprPtr &part : parts)
      node->operands.push_back(std::move(part));
    return seal(std::move(node));
  }

  /// `( args )`: positional, then name=value.
  Expected<std::vector<Arg>> parseArgs() {
    std::vector<Arg> args;
    advance(); // (
    bool sawKeyword = false;
    while (!isOp(")")) {
      if (!args.empty()) {
        if (Status s = expectOp(","); !s)
          return s.error();
        if (isOp(")"))
          break;
      }
      if (isOp("*") || isOp("**"))
        return error(cur().offset, "unsupported: *args and **kwargs in calls");
      Arg arg;
      if (cur().kind == TokenKind::Name && peek().kind == TokenKind::Operator &&
          peek().text == "=") {
        arg.name = cur().text;
        advance();
        advance();
        sawKeyword = true;
      } else if (sawKeyword) {
        return error(cur().offset, "positional argument after a keyword argument");
      }
      Expected<ExprPtr> value = parseExpression(true);
      if (!value)
        return value.error();
      arg.value = std::move(*value);
      args.push_back(std::move(arg));
    }
    advance(); // )
    return args;
  }

  /// Orders `args` by `sig`'s parameters (null where absent); checks them.
  Status bindArgs(const Signature &sig, std::vector<Arg> &args, size_t offset,
                  const std::string &what) {
    std::vector<Arg> bound(sig.params.size());
    size_t positional = 0;
    for (Arg &arg : args) {
      size_t slot;
      if (arg.name.empty()) {
        slot = positional++;
        if (slot >= sig.params.size())
          return error(offset, what + " takes at most " +
                                   std::to_string(sig.params.size()) +
                                   " argument(s)");
      } else {
        auto it = std::find(sig.params.begin(), sig.params.end(), arg.name);
        if (it == sig.params.end())
          return error(offset, what + " has no argument '" + arg.name + "'");
        slot = static_cast<size_t>(it - sig.params.begin());
      }
      if (bound[slot].value)
        return error(offset, what + " got argument '" +
                                 std::string(sig.params[slot]) + "' twice");
      bound[slot].name = sig.params[slot];
      bound[slot].value = std::move(arg.value);
    }
    for (size_t i = 0; i < sig.required; ++i)
      if (!bound[i].value)
        return error(offset, what + " needs argument '" +
                                 std::string(sig.params[i]) + "'");
    args = std::move(bound);
    return Status::ok();
  }

  Expected<ExprPtr> parseCall(ExprPtr callee) {
    const size_t offset = callee->offset;
    Expected<std::vector<Arg>> args = parseArgs();
    if (!args)
      return args.error();
    if (const Signature *sig = callee->kind == ExprKind::Name
                                   ? findFunction(callee->name)
                                   : nullptr) {
      if (Status s = bindArgs(*sig, *args, offset, callee->name + "()"); !s)
        return s.error();
      ExprPtr node = make(ExprKind::Call, offset);
      node->name = callee->name;
      node->args = std::move(*args);
      return seal(std::move(node));
    }
    if (callee->kind == ExprKind::Name && callee->name == "namespace") {
      // namespace(), namespace(dict), namespace(k=v, ...).
      size_t positional = 0;
      for (const Arg &arg : *args)
        positional += arg.name.empty();
      if (positional > 1)
        return error(offset, "namespace() takes at most one positional "
                             "argument (a dict)");
      ExprPtr node = make(ExprKind::Namespace, offset);
      node->args = std::move(*args);
      return seal(std::move(node));
    }
    if (callee->kind == ExprKind::Name) {
      // A macro's: checked once the whole template is parsed (run()).
      macroCalls_.emplace_back(callee->name, offset);
      ExprPtr node = make(ExprKind::MacroCall, offset);
      node->name = callee->name;
      node->args = std::move(*args);
      return seal(std::move(node));
    }
    if (callee->kind == ExprKind::Attr) {
      const Signature *sig = findMethod(callee->name);
      if (!sig)
        return error(callee->offset, "unsupported: method '." + callee->name +
                                         "()' (docs/chat.md lists the supported "
                                         "methods)");
      if (Status s = bindArgs(*sig, *args, callee->offset, "." + callee->name + "()");
          !s)
        return s.error();
      ExprPtr node = make(ExprKind::Method, callee->offset);
      node->name = callee->name;
      node->operands = std::move(callee->operands);
      node->args = std::move(*args);
      return seal(std::move(node));
    }
    return error(offset, "unsupported: calling the result of an expression");
  }

  Expected<ExprPtr> parseFilterExpr(ExprPtr node) {
    while (true) {
      if (isOp("|")) {
        const size_t offset = cur().offset;
        advance();
        if (cur().kind != TokenKind::Name)
          return unexpected("a filter name");
        const std::string name = cur().text;
        advance();
        if (isOp("."))
          return error(offset, "unsupported: dotted filter name");
        const Signature *sig = findFilter(name);
        if (!sig)
          return error(offset, "unsupported: filter '" + name +
                                   "' (docs/chat.md lists the supported filters)");
        std::vector<Arg> args;
        if (isOp("(")) {
          Expected<std::vector<Arg>> parsed = parseArgs();
          if (!parsed)
            return parsed.error();
          args = std::move(*parsed);
        }
        if (Status s = bindArgs(*sig, args, offset, "filter '" + name + "'"); !s)
          return s.error();
        ExprPtr filter = make(ExprKind::Filter, offset);
        filter->name = sig->name;
        filter->operands.push_back(std::move(node));
        filter->args = std::move(args);
        Expected<ExprPtr> sealed = seal(std::move(filter));
        if (!sealed)
          return sealed;
        node = std::move(*sealed);
      } else if (isName("is")) {
        const size_t offset = cur().offset;
        advance();
        const bool negated = skipName("not");
        if (cur().kind != TokenKind::Name)
          return unexpected("a test name");
        const std::string name = cur().text;
        advance();
        if (isOp("."))
          return error(offset, "unsupported: dotted test name");
        const Signature *sig = findTest(name);
        if (!sig)
          return error(offset, "unsupported: test 'is " + name +
                                   "' (docs/chat.md lists the supported tests)");
        std::vector<Arg> args;
        if (isOp("(")) {
          Expected<std::vector<Arg>> parsed = parseArgs();
          if (!parsed)
            return parsed.error();
          args = std::move(*parsed);
        } else if ((cur().kind == TokenKind::Name || cur().kind == TokenKind::String ||
                    cur().kind == TokenKind::Integer ||
                    cur().kind == TokenKind::Float || isOp("[") || isOp("{")) &&
                   !isName("else") && !isName("or") && !isName("and")) {
          // `x is divisibleby 3`: one argument without parentheses.
          if (isName("is"))
            return error(cur().offset, "tests cannot be chained with 'is'");
          Expected<ExprPtr> arg = parsePrimary();
          if (!arg)
            return arg.error();
          Expected<ExprPtr> full = parsePostfix(std::move(*arg));
          if (!full)
            return full.error();
          args.push_back(Arg{"", std::move(*full)});
        }
        if (Status s = bindArgs(*sig, args, offset, "test '" + name + "'"); !s)
          return s.error();
        ExprPtr test = make(ExprKind::Test, offset);
        test->name = sig->name;
        test->negated = negated;
        test->operands.push_back(std::move(node));
        test->args = std::move(args);
        Expected<ExprPtr> sealed = seal(std::move(test));
        if (!sealed)
          return sealed;
        node = std::move(*sealed);
      } else if (isOp("(")) {
        return error(cur().offset, "unsupported: calling the result of a filter "
                                   "or test");
      } else {
        return node;
      }
    }
  }
};

} // namespace
} // namespace detail

Expected<ChatTemplate> ChatTemplate::parse(std::string_view source,
                                           std::string where,
                                           TemplateOptions options) {
  auto impl = std::make_shared<detail::TemplateImpl>();
  impl->where = std::move(where);
  impl->options = options;
  if (!pytext::isValidUtf8(source))
    return Error(impl->where, "", "the template is not valid UTF-8");
  // jinja2 normalizes "\r\n" and "\r" to "\n" and drops one final newline.
  impl->source.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      impl->source += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n')
        ++i;
    } else {
      impl->source += source[i];
    }
  }
  if (!options.keepTrailingNewline && !impl->source.empty() &&
      impl->source.back() == '\n')
    impl->source.pop_back();

  detail::Lexer lexer(*impl);
  Expected<std::vector<detail::Token>> tokens = lexer.run();
  if (!tokens)
    return tokens.error();
  detail::Parser parser(*impl, std::move(*tokens));
  Expected<detail::Body> body = parser.run();
  if (!body)
    return body.error();
  impl->body = std::move(*body);
  return ChatTemplate(std::move(impl));
}

Expected<std::string> ChatTemplate::render(const Value &context,
                                           const RenderLimits &limits) const {
  return detail::renderTemplate(*impl_, context, limits);
}

namespace {

bool exprReads(const detail::Expr *e, std::string_view name) {
  if (!e)
    return false;
  if (e->kind == detail::ExprKind::Name && e->name == name)
    return true;
  for (const detail::ExprPtr &operand : e->operands)
    if (exprReads(operand.get(), name))
      return true;
  for (const detail::Arg &arg : e->args)
    if (exprReads(arg.value.get(), name))
      return true;
  return false;
}

bool bodyReads(const detail::Body &body, std::string_view name) {
  for (const detail::Node &node : body) {
    if (exprReads(node.expr.get(), name) ||
        exprReads(node.filter.get(), name) || bodyReads(node.body, name) ||
        bodyReads(node.elseBody, name))
      return true;
    for (const detail::IfBranch &branch : node.branches)
      if (exprReads(branch.condition.get(), name) ||
          bodyReads(branch.body, name))
        return true;
    for (const detail::ExprPtr &fallback : node.defaults)
      if (exprReads(fallback.get(), name))
        return true;
  }
  return false;
}

} // namespace

bool ChatTemplate::readsVariable(std::string_view name) const {
  return bodyReads(impl_->body, name);
}

Value chatContext(Value messages, bool addGenerationPrompt,
                  std::optional<std::string> bosToken,
                  std::optional<std::string> eosToken, Value tools) {
  ValueMap map;
  map.set("messages", std::move(messages));
  if (!tools.isUndefined())
    map.set("tools", std::move(tools));
  map.set("add_generation_prompt", Value::boolean(addGenerationPrompt));
  if (bosToken)
    map.set("bos_token", Value(std::move(*bosToken)));
  if (eosToken)
    map.set("eos_token", Value(std::move(*eosToken)));
  return Value::map(std::move(map));
}

} // namespace kiln::chat
