//===- Render.cpp - Rendering Kiln's Jinja subset -------------------------===//
//
// Walks the parsed template with a context and produces the text, with the
// semantics jinja2 gives the same constructs on Python values:
//   - scopes: `{% set %}` at the top level sets a template variable; each
//     iteration of a for loop runs in a fresh scope over the enclosing one,
//     so a set inside a loop is seen neither after the loop nor by the next
//     iteration (jinja2's behaviour; `if` makes no scope);
//   - undefined (jinja2's default Undefined): prints as "", is false, is an
//     empty iterable of length 0, equals only undefined; using it as a
//     number, an object (`x.y`, `x[0]`, `x.m()`) or comparing it with `<`
//     is an error naming the missing variable or attribute;
//   - operators, filters, tests and methods follow Python and jinja2.
// Errors name the line and column of the expression that failed.
//
//===----------------------------------------------------------------------===//
#include "chat/PyText.h"
#include "chat/TemplateAst.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <unordered_map>

namespace kiln::chat::detail {

//===----------------------------------------------------------------------===//
// What is supported
//===----------------------------------------------------------------------===//

namespace {

const Signature *findIn(const std::vector<Signature> &table, std::string_view name) {
  for (const Signature &sig : table)
    if (sig.name == name)
      return &sig;
  return nullptr;
}

} // namespace

const Signature *findFilter(std::string_view name) {
  static const std::vector<Signature> kFilters = {
      {"trim", {"chars"}, 0},
      {"length", {}, 0},
      {"lower", {}, 0},
      {"upper", {}, 0},
      {"capitalize", {}, 0},
      // HuggingFace's tojson (json.dumps), not jinja2's htmlsafe one.
      {"tojson", {"ensure_ascii", "indent", "separators", "sort_keys"}, 0},
      {"string", {}, 0},
      {"default", {"default_value", "boolean"}, 0},
      {"first", {}, 0},
      {"last", {}, 0},
      {"join", {"d"}, 0},
      {"replace", {"old", "new", "count"}, 2},
      {"int", {"default", "base"}, 0},
      {"list", {}, 0},
      {"items", {}, 0},
  };
  if (name == "count")
    name = "length";
  else if (name == "d")
    name = "default";
  return findIn(kFilters, name);
}

const Signature *findTest(std::string_view name) {
  static const std::vector<Signature> kTests = {
      {"defined", {}, 0},  {"undefined", {}, 0}, {"none", {}, 0},
      {"string", {}, 0},   {"mapping", {}, 0},   {"iterable", {}, 0},
      {"number", {}, 0},   {"sequence", {}, 0},  {"boolean", {}, 0},
      {"integer", {}, 0},  {"float", {}, 0},     {"true", {}, 0},
      {"false", {}, 0},    {"odd", {}, 0},       {"even", {}, 0},
      {"divisibleby", {"num"}, 1},
  };
  return findIn(kTests, name);
}

const Signature *findMethod(std::string_view name) {
  static const std::vector<Signature> kMethods = {
      // str
      {"strip", {"chars"}, 0},
      {"lstrip", {"chars"}, 0},
      {"rstrip", {"chars"}, 0},
      {"startswith", {"prefix"}, 1},
      {"endswith", {"suffix"}, 1},
      {"split", {"sep", "maxsplit"}, 0},
      {"upper", {}, 0},
      {"lower", {}, 0},
      {"replace", {"old", "new", "count"}, 2},
      // dict
      {"items", {}, 0},
      {"keys", {}, 0},
      {"values", {}, 0},
      {"get", {"key", "default"}, 1},
  };
  return findIn(kMethods, name);
}

const Signature *findFunction(std::string_view name) {
  static const std::vector<Signature> kFunctions = {
      {"range", {"start", "stop", "step"}, 1},
      {"raise_exception", {"message"}, 1},
  };
  return findIn(kFunctions, name);
}

namespace {

//===----------------------------------------------------------------------===//
// Python facts
//===----------------------------------------------------------------------===//

/// Attribute names that are methods of Python's dict, str and list: jinja2
/// resolves `obj.name` to the method before looking for a key, so these are
/// refused unless called as supported methods.
bool isDictMethodName(std::string_view name) {
  static constexpr std::string_view kNames[] = {
      "clear", "copy", "fromkeys", "get", "items", "keys", "pop", "popitem",
      "setdefault", "update", "values"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}
bool isStrMethodName(std::string_view name) {
  static constexpr std::string_view kNames[] = {
      "capitalize", "casefold", "center", "count", "encode", "endswith",
      "expandtabs", "find", "format", "format_map", "index", "isalnum",
      "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower",
      "isnumeric", "isprintable", "isspace", "istitle", "isupper", "join",
      "ljust", "lower", "lstrip", "maketrans", "partition", "removeprefix",
      "removesuffix", "replace", "rfind", "rindex", "rjust", "rpartition",
      "rsplit", "rstrip", "split", "splitlines", "startswith", "strip",
      "swapcase", "title", "translate", "upper", "zfill"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}
bool isListMethodName(std::string_view name) {
  static constexpr std::string_view kNames[] = {
      "append", "clear", "copy", "count", "extend", "index", "insert", "pop",
      "remove", "reverse", "sort"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

/// jinja2's object_type_repr: how "'x' has no attribute" names the object.
std::string objectTypeRepr(const Value &value) {
  if (value.isNone())
    return "None";
  return std::string(value.typeName()) + " object";
}

/// Python's int(text, base) for strings; nullopt when it would raise
/// ValueError. `overflow` is set when the number does not fit 64 bits.
std::optional<int64_t> parsePythonInt(std::string_view text, int base,
                                      bool &overflow) {
  const std::string stripped = pytext::strip(text, std::nullopt, true, true);
  std::string_view s = stripped;
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  bool prefixed = false;
  if (s.size() >= 2 && s[0] == '0') {
    const char p = static_cast<char>(s[1] | 0x20);
    if ((base == 16 && p == 'x') || (base == 8 && p == 'o') || (base == 2 && p == 'b')) {
      s.remove_prefix(2);
      prefixed = true;
    }
  }
  // Digits, each optionally after one underscore (not before the first
  // digit unless a base prefix came first).
  unsigned __int128 value = 0;
  size_t digits = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '_') {
      if ((digits == 0 && !prefixed) || i + 1 == s.size() || s[i + 1] == '_')
        return std::nullopt;
      continue;
    }
    int d;
    const char l = static_cast<char>(c | 0x20);
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (l >= 'a' && l <= 'z')
      d = l - 'a' + 10;
    else
      return std::nullopt;
    if (d >= base)
      return std::nullopt;
    value = value * static_cast<unsigned>(base) + static_cast<unsigned>(d);
    if (value > (static_cast<unsigned __int128>(1) << 64))
      overflow = true;
    ++digits;
  }
  if (digits == 0)
    return std::nullopt;
  const unsigned __int128 limit =
      negative ? (static_cast<unsigned __int128>(1) << 63)
               : (static_cast<unsigned __int128>(1) << 63) - 1;
  if (overflow || value > limit) {
    overflow = true;
    return std::nullopt;
  }
  return negative ? static_cast<int64_t>(-static_cast<__int128>(value))
                  : static_cast<int64_t>(value);
}

/// Python's float(text); nullopt when it would raise ValueError.
std::optional<double> parsePythonFloat(std::string_view text) {
  std::string s = pytext::strip(text, std::nullopt, true, true);
  std::string lowered;
  for (char c : s)
    lowered += static_cast<char>(c >= 'A' && c <= 'Z' ? c | 0x20 : c);
  std::string_view body = lowered;
  double sign = 1;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
    sign = body[0] == '-' ? -1 : 1;
    body.remove_prefix(1);
  }
  if (body == "inf" || body == "infinity")
    return sign * std::numeric_limits<double>::infinity();
  if (body == "nan")
    return std::numeric_limits<double>::quiet_NaN();
  // digits [. digits] [e [sign] digits], or . digits [...]; underscores
  // only between digits.
  std::string clean;
  size_t i = 0;
  auto digitRun = [&]() {
    size_t count = 0;
    while (i < body.size()) {
      if (body[i] >= '0' && body[i] <= '9') {
        clean += body[i++];
        ++count;
      } else if (body[i] == '_' && count && i + 1 < body.size() &&
                 body[i + 1] >= '0' && body[i + 1] <= '9') {
        ++i;
      } else {
        break;
      }
    }
    return count;
  };
  size_t mantissa = digitRun();
  if (i < body.size() && body[i] == '.') {
    clean += body[i++];
    mantissa += digitRun();
  }
  if (mantissa == 0)
    return std::nullopt;
  if (i < body.size() && body[i] == 'e') {
    clean += body[i++];
    if (i < body.size() && (body[i] == '+' || body[i] == '-'))
      clean += body[i++];
    if (digitRun() == 0)
      return std::nullopt;
  }
  if (i != body.size())
    return std::nullopt;
  return sign * std::strtod(clean.c_str(), nullptr);
}

//===----------------------------------------------------------------------===//
// The renderer
//===----------------------------------------------------------------------===//

/// Budget of element comparisons for ==, `in` and ordering in one render.
constexpr uint64_t kCompareBudget = 10'000'000;
/// Macro calls in progress at once (a macro may call itself). Each may
/// nest expressions and statements to their own limits, so this bounds the
/// renderer's stack: GLM's templates call one macro from another at most.
constexpr uint32_t kMaxMacroDepth = 20;
/// Longest list an operation may build.
constexpr size_t kMaxListLength = 1'000'000;
/// jinja2's sandbox (which HuggingFace uses) refuses larger ranges.
constexpr int64_t kMaxRange = 100'000;

enum class Flow { Normal, Break, Continue };

#define KILN_CHAT_TRY(expr)                                                    \
  do {                                                                         \
    if (Status status_ = (expr); !status_)                                     \
      return status_.error();                                                  \
  } while (0)

#define KILN_CHAT_EVAL(var, expr)                                              \
  Expected<Value> var##OrError = (expr);                                       \
  if (!var##OrError)                                                           \
    return var##OrError.error();                                               \
  Value var = std::move(*var##OrError)

class Renderer {
public:
  Renderer(const TemplateImpl &impl, const ValueMap &context,
           const RenderLimits &limits)
      : impl_(impl), context_(context), limits_(limits) {
    frames_.emplace_back(); // the template's own variables
  }

  Expected<std::string> run() {
    KILN_CHAT_TRY(renderBody(impl_.body));
    return std::move(out_);
  }

private:
  using Frame = std::unordered_map<std::string, Value>;

  const TemplateImpl &impl_;
  const ValueMap &context_;
  const RenderLimits &limits_;
  std::string out_;
  std::vector<Frame> frames_;
  uint64_t iterations_ = 0;
  /// The {% macro %} nodes met so far; a macro value is an index here.
  std::vector<const Node *> macroNodes_;
  uint32_t macroDepth_ = 0;
  uint64_t compareBudget_ = kCompareBudget;
  Flow flow_ = Flow::Normal;

  Error error(size_t offset, std::string problem) const {
    return Error(impl_.where, impl_.position(offset), std::move(problem));
  }
  /// Using an undefined value where jinja2 raises UndefinedError.
  Error undefinedError(size_t offset, const Value &value) const {
    const std::string &hint = value.undefinedHint();
    return error(offset, hint.empty() ? "undefined value used" : hint);
  }
  /// An error from a Value helper (no position) at `offset`.
  Error relocate(size_t offset, const Error &e) const {
    return error(offset, e.problem());
  }

  Status checkDepth(const Value &value, size_t offset) const {
    if (value.depth() > kMaxNestingDepth)
      return error(offset, "value nested too deeply (limit " +
                               std::to_string(kMaxNestingDepth) + ")");
    return Status::ok();
  }
  Expected<Value> makeString(std::string text, size_t offset) const {
    if (text.size() > limits_.maxOutputBytes)
      return error(offset, "string longer than the limit of " +
                               std::to_string(limits_.maxOutputBytes) + " bytes");
    return Value(std::move(text));
  }
  Expected<std::string> str(const Value &value, size_t offset) const {
    Expected<std::string> text = pyStr(value, limits_.maxOutputBytes);
    if (!text)
      return relocate(offset, text.error());
    return text;
  }
  Expected<bool> equals(const Value &a, const Value &b, size_t offset) {
    std::optional<bool> same = pyEquals(a, b, compareBudget_);
    if (!same)
      return error(offset, "comparison too expensive (more than " +
                               std::to_string(kCompareBudget) +
                               " element comparisons)");
    return *same;
  }

  // --- statements ----------------------------------------------------------

  Status renderBody(const Body &body) {
    for (const Node &node : body) {
      KILN_CHAT_TRY(renderNode(node));
      if (flow_ != Flow::Normal)
        return Status::ok();
    }
    return Status::ok();
  }

  Status emitText(std::string_view text, size_t offset) {
    if (text.size() > limits_.maxOutputBytes - out_.size())
      return error(offset, "output longer than the limit of " +
                               std::to_string(limits_.maxOutputBytes) + " bytes");
    out_.append(text);
    return Status::ok();
  }

  Status renderNode(const Node &node) {
    switch (node.kind) {
    case NodeKind::Text:
      return emitText(node.text, node.offset);
    case NodeKind::Output: {
      KILN_CHAT_EVAL(value, eval(*node.expr));
      Expected<std::string> text = str(value, node.expr->offset);
      if (!text)
        return text.error();
      return emitText(*text, node.offset);
    }
    case NodeKind::If:
      for (const IfBranch &branch : node.branches) {
        if (branch.condition) {
          KILN_CHAT_EVAL(cond, eval(*branch.condition));
          if (!cond.truthy())
            continue;
        }
        return renderBody(branch.body);
      }
      return Status::ok();
    case NodeKind::For:
      return renderFor(node);
    case NodeKind::Set: {
      KILN_CHAT_EVAL(value, eval(*node.expr));
      if (!node.attribute.empty())
        return setAttribute(node, value);
      Frame &frame = frames_.back();
      return bindTargets(node, value, frame);
    }
    case NodeKind::Macro:
      // Defined from here on, in this scope (as jinja2 binds a macro's name).
      frames_.back()[node.text] =
          Value::macro(node.text, static_cast<int64_t>(macroNodes_.size()));
      macroNodes_.push_back(&node);
      return Status::ok();
    case NodeKind::Break:
      flow_ = Flow::Break;
      return Status::ok();
    case NodeKind::Continue:
      flow_ = Flow::Continue;
      return Status::ok();
    }
    return Status::ok();
  }

  /// `set ns.attr = value`: a namespace's attribute. A namespace is not
  /// stored inside one (nor in a list or dict that is), so that no value
  /// contains itself.
  Status setAttribute(const Node &node, const Value &value) {
    const Value target = lookup(node.targets[0]);
    if (!target.isNamespace())
      return error(node.offset,
                   target.isUndefined()
                       ? "'" + node.targets[0] + "' is undefined"
                       : "cannot assign attribute on non-namespace object");
    KILN_CHAT_TRY(checkDepth(value, node.offset));
    if (holdsNamespace(value))
      return error(node.offset, "unsupported: a namespace stored in a "
                                "namespace's attribute");
    target.setAttribute(node.attribute, value);
    return Status::ok();
  }

  static bool holdsNamespace(const Value &value) {
    if (value.isNamespace())
      return true;
    if (value.isList())
      for (const Value &item : value.asList())
        if (holdsNamespace(item))
          return true;
    if (value.isMap())
      for (const auto &entry : value.asMap())
        if (holdsNamespace(entry.second))
          return true;
    return false;
  }

  /// Assigns `value` to the names of a for or set (unpacking a, b = ...).
  Status bindTargets(const Node &node, const Value &value, Frame &frame) {
    if (!node.unpack) {
      frame[node.targets[0]] = value;
      return Status::ok();
    }
    if (!value.isList() && !value.isString() && !value.isMap() &&
        !value.isUndefined())
      return error(node.offset, "cannot unpack non-iterable " +
                                    std::string(value.typeName()) + " object");
    Expected<ValueList> parts = iterate(value, node.offset);
    if (!parts)
      return parts.error();
    const size_t want = node.targets.size();
    if (parts->size() != want)
      return error(node.offset,
                   parts->size() > want
                       ? "too many values to unpack (expected " +
                             std::to_string(want) + ")"
                       : "not enough values to unpack (expected " +
                             std::to_string(want) + ", got " +
                             std::to_string(parts->size()) + ")");
    for (size_t i = 0; i < want; ++i)
      frame[node.targets[i]] = (*parts)[i];
    return Status::ok();
  }

  Status countIteration(size_t offset) {
    if (++iterations_ > limits_.maxLoopIterations)
      return error(offset, "too many loop iterations (limit " +
                               std::to_string(limits_.maxLoopIterations) + ")");
    return Status::ok();
  }

  Status renderFor(const Node &node) {
    KILN_CHAT_EVAL(iterable, eval(*node.expr));
    Expected<ValueList> all = iterate(iterable, node.expr->offset);
    if (!all)
      return all.error();
    ValueList items;
    if (node.filter) {
      // `for x in xs if cond`: filtered first, so loop.length counts only
      // the items kept.
      for (const Value &item : *all) {
        KILN_CHAT_TRY(countIteration(node.offset));
        frames_.emplace_back();
        Status bound = bindTargets(node, item, frames_.back());
        Expected<Value> keep = bound ? eval(*node.filter) : Expected<Value>(bound.error());
        frames_.pop_back();
        if (!keep)
          return keep.error();
        if (keep->truthy())
          items.push_back(item);
      }
    } else {
      items = std::move(*all);
    }
    if (items.empty()) {
      frames_.emplace_back();
      Status s = renderBody(node.elseBody);
      frames_.pop_back();
      return s;
    }
    const size_t n = items.size();
    for (size_t i = 0; i < n; ++i) {
      KILN_CHAT_TRY(countIteration(node.offset));
      frames_.emplace_back();
      Status s = bindTargets(node, items[i], frames_.back());
      if (s) {
        frames_.back()["loop"] = loopValue(items, i);
        s = renderBody(node.body);
      }
      frames_.pop_back();
      if (!s)
        return s;
      if (flow_ == Flow::Break) {
        flow_ = Flow::Normal;
        break;
      }
      flow_ = Flow::Normal;
    }
    return Status::ok();
  }

  static Value loopValue(const ValueList &items, size_t i) {
    const auto n = static_cast<int64_t>(items.size());
    const auto index = static_cast<int64_t>(i);
    ValueMap loop;
    loop.set("index", Value::integer(index + 1));
    loop.set("index0", Value::integer(index));
    loop.set("revindex", Value::integer(n - index));
    loop.set("revindex0", Value::integer(n - index - 1));
    loop.set("first", Value::boolean(index == 0));
    loop.set("last", Value::boolean(index == n - 1));
    loop.set("length", Value::integer(n));
    loop.set("depth", Value::integer(1));
    loop.set("depth0", Value::integer(0));
    loop.set("previtem", index > 0 ? items[i - 1]
                                   : Value::undefined("there is no previous item"));
    loop.set("nextitem", index + 1 < n ? items[i + 1]
                                       : Value::undefined("there is no next item"));
    return Value::map(std::move(loop));
  }

  // --- values --------------------------------------------------------------

  Value lookup(const std::string &name) const {
    for (auto frame = frames_.rbegin(); frame != frames_.rend(); ++frame) {
      auto found = frame->find(name);
      if (found != frame->end())
        return found->second;
    }
    if (const Value *value = context_.find(name))
      return *value;
    return Value::undefined("'" + name + "' is undefined");
  }

  /// What `for` walks: list items, dict keys, string characters; undefined
  /// is empty.
  Expected<ValueList> iterate(const Value &value, size_t offset) const {
    switch (value.kind()) {
    case Value::Kind::Undefined:
      return ValueList();
    case Value::Kind::List:
      return value.asList();
    case Value::Kind::Map: {
      ValueList keys;
      for (const auto &entry : value.asMap())
        keys.emplace_back(entry.first);
      return keys;
    }
    case Value::Kind::String: {
      ValueList chars;
      for (uint32_t cp : pytext::decode(value.asString())) {
        std::string one;
        pytext::append(one, cp);
        chars.emplace_back(std::move(one));
      }
      return chars;
    }
    default:
      return error(offset, "'" + std::string(value.typeName()) +
                               "' object is not iterable");
    }
  }

  Expected<Value> getAttr(const Value &object, const std::string &name,
                          size_t offset) const {
    if (object.isUndefined())
      return undefinedError(offset, object);
    if (object.isNamespace()) {
      if (const Value *found = object.asMap().find(name))
        return *found;
      return Value::undefined("'Namespace' object has no attribute '" + name +
                              "'");
    }
    if (object.isMap()) {
      if (isDictMethodName(name))
        return error(offset, "unsupported: dict method '" + name +
                                 "' used as a value (write ['" + name +
                                 "'] for the key, or call it)");
      if (const Value *found = object.asMap().find(name))
        return *found;
    } else if ((object.isString() && isStrMethodName(name)) ||
               (object.isList() && isListMethodName(name))) {
      return error(offset, "unsupported: " + std::string(object.typeName()) +
                               " method '" + name + "' used as a value");
    }
    return Value::undefined("'" + objectTypeRepr(object) +
                            "' has no attribute '" + name + "'");
  }

  Expected<Value> getItem(const Value &object, const Value &key,
                          size_t offset) const {
    if (object.isUndefined())
      return undefinedError(offset, object);
    if (object.isView())
      return error(offset, "unsupported: indexing a '" +
                               std::string(object.typeName()) + "' object");
    if (key.isString()) {
      if (object.isMap()) {
        if (const Value *found = object.asMap().find(key.asString()))
          return *found;
      }
      // jinja2 falls back to the attribute of that name.
      return getAttr(object, key.asString(), offset);
    }
    if (key.isIntegral() && (object.isList() || object.isString())) {
      int64_t index = key.asInt();
      if (object.isList()) {
        const ValueList &items = object.asList();
        const auto n = static_cast<int64_t>(items.size());
        if (index < 0)
          index += n;
        if (index >= 0 && index < n)
          return items[static_cast<size_t>(index)];
      } else {
        const std::vector<uint32_t> cps = pytext::decode(object.asString());
        const auto n = static_cast<int64_t>(cps.size());
        if (index < 0)
          index += n;
        if (index >= 0 && index < n) {
          std::string one;
          pytext::append(one, cps[static_cast<size_t>(index)]);
          return Value(std::move(one));
        }
      }
    }
    Expected<std::string> shown = pyRepr(key, 200);
    return Value::undefined("'" + objectTypeRepr(object) + "' has no element " +
                            (shown ? *shown : std::string("?")));
  }

  /// Python's slice semantics (start, stop, step; absent as nullopt).
  Expected<Value> slice(const Value &object, const Value *bounds[3],
                        size_t offset) const {
    if (object.isUndefined())
      return undefinedError(offset, object);
    std::optional<int64_t> parts[3];
    for (int k = 0; k < 3; ++k) {
      if (!bounds[k] || bounds[k]->isNone())
        continue;
      if (!bounds[k]->isIntegral()) // jinja2: TypeError, hence undefined
        return Value::undefined("slice indices must be integers or None");
      parts[k] = bounds[k]->asInt();
    }
    if (object.isView())
      return error(offset, "unsupported: slicing a '" +
                               std::string(object.typeName()) + "' object");
    const int64_t step = parts[2].value_or(1);
    if (step == 0)
      return error(offset, "slice step cannot be zero");
    if (!object.isList() && !object.isString())
      return Value::undefined("'" + objectTypeRepr(object) +
                              "' cannot be sliced");
    std::vector<uint32_t> cps;
    int64_t length;
    if (object.isString()) {
      cps = pytext::decode(object.asString());
      length = static_cast<int64_t>(cps.size());
    } else {
      length = static_cast<int64_t>(object.asList().size());
    }
    const int64_t lower = step < 0 ? -1 : 0;
    const int64_t upper = step < 0 ? length - 1 : length;
    auto adjust = [&](std::optional<int64_t> bound, int64_t fallback) {
      if (!bound)
        return fallback;
      int64_t v = *bound;
      if (v < 0) {
        v += length;
        if (v < lower)
          v = lower;
      } else if (v > upper) {
        v = upper;
      }
      return v;
    };
    const int64_t start = adjust(parts[0], step < 0 ? upper : lower);
    const int64_t stop = adjust(parts[1], step < 0 ? lower : upper);
    std::vector<size_t> picked;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
      picked.push_back(static_cast<size_t>(i));
    if (object.isString()) {
      std::string out;
      for (size_t i : picked)
        pytext::append(out, cps[i]);
      return Value(std::move(out));
    }
    ValueList out;
    for (size_t i : picked)
      out.push_back(object.asList()[i]);
    return object.isTuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
  }

  // --- operators -------------------------------------------------------------

  Expected<Value> arithmetic(const std::string &op, const Value &a, const Value &b,
                             size_t offset) const {
    if (op == "~") {
      Expected<std::string> left = str(a, offset);
      if (!left)
        return left.error();
      Expected<std::string> right = str(b, offset);
      if (!right)
        return right.error();
      if (right->size() > limits_.maxOutputBytes - std::min(limits_.maxOutputBytes, left->size()))
        return error(offset, "string longer than the limit of " +
                                 std::to_string(limits_.maxOutputBytes) + " bytes");
      return Value(*left + *right);
    }
    if (a.isUndefined())
      return undefinedError(offset, a);
    if (b.isUndefined())
      return undefinedError(offset, b);
    if (a.isNumber() && b.isNumber())
      return numeric(op, a, b, offset);
    if (op == "+") {
      if (a.isString() && b.isString())
        return makeString(a.asString() + b.asString(), offset);
      if (a.isList() && b.isList() && a.sameFlavor(b) && !a.isView()) {
        if (a.asList().size() + b.asList().size() > kMaxListLength)
          return error(offset, "list longer than the limit of " +
                                   std::to_string(kMaxListLength) + " items");
        ValueList joined = a.asList();
        joined.insert(joined.end(), b.asList().begin(), b.asList().end());
        return a.isTuple() ? Value::tuple(std::move(joined))
                           : Value::list(std::move(joined));
      }
    }
    if (op == "*") {
      const Value *seq = a.isIntegral() ? &b : &a;
      const Value *count = a.isIntegral() ? &a : &b;
      if (count->isIntegral() && (seq->isString() || seq->isList()) &&
          !seq->isView()) {
        const int64_t times = std::max<int64_t>(0, count->asInt());
        if (seq->isString()) {
          const size_t size = seq->asString().size();
          if (size && static_cast<uint64_t>(times) > limits_.maxOutputBytes / size)
            return error(offset, "string longer than the limit of " +
                                     std::to_string(limits_.maxOutputBytes) + " bytes");
          std::string out;
          for (int64_t i = 0; i < times; ++i)
            out += seq->asString();
          return Value(std::move(out));
        }
        const size_t size = seq->asList().size();
        if (size && static_cast<uint64_t>(times) > kMaxListLength / size)
          return error(offset, "list longer than the limit of " +
                                   std::to_string(kMaxListLength) + " items");
        ValueList out;
        for (int64_t i = 0; i < times; ++i)
          out.insert(out.end(), seq->asList().begin(), seq->asList().end());
        return seq->isTuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
      }
    }
    if (op == "%" && a.isString())
      return error(offset, "unsupported: string formatting with '%'");
    return error(offset, "unsupported operand type(s) for " + op + ": '" +
                             std::string(a.typeName()) + "' and '" +
                             std::string(b.typeName()) + "'");
  }

  Expected<Value> numeric(const std::string &op, const Value &a, const Value &b,
                          size_t offset) const {
    if (a.isIntegral() && b.isIntegral() && op != "/") {
      const int64_t x = a.asInt(), y = b.asInt();
      int64_t r = 0;
      bool overflow = false;
      if (op == "+") {
        overflow = __builtin_add_overflow(x, y, &r);
      } else if (op == "-") {
        overflow = __builtin_sub_overflow(x, y, &r);
      } else if (op == "*") {
        overflow = __builtin_mul_overflow(x, y, &r);
      } else if (op == "//" || op == "%") {
        if (y == 0)
          return error(offset, "integer division or modulo by zero");
        if (y == -1) {
          if (op == "%")
            return Value::integer(0);
          overflow = __builtin_sub_overflow(int64_t(0), x, &r);
        } else if (op == "//") {
          r = x / y;
          if ((x % y != 0) && ((x < 0) != (y < 0)))
            --r;
        } else {
          r = x % y;
          if (r != 0 && ((r < 0) != (y < 0)))
            r += y;
        }
      } else if (op == "**") {
        if (y < 0) {
          if (x == 0)
            return error(offset, "0.0 cannot be raised to a negative power");
          return Value::number(std::pow(static_cast<double>(x), static_cast<double>(y)));
        }
        r = 1;
        int64_t base = x, e = y;
        while (e > 0 && !overflow) {
          if (e & 1)
            overflow = __builtin_mul_overflow(r, base, &r);
          e >>= 1;
          if (e > 0 && !overflow)
            overflow = __builtin_mul_overflow(base, base, &base);
        }
      }
      if (overflow)
        return error(offset, "integer overflow (Kiln's integers are 64-bit)");
      return Value::integer(r);
    }
    const double x = a.asFloat(), y = b.asFloat();
    if (op == "+")
      return Value::number(x + y);
    if (op == "-")
      return Value::number(x - y);
    if (op == "*")
      return Value::number(x * y);
    if (op == "/") {
      if (y == 0)
        return error(offset, "division by zero");
      return Value::number(x / y);
    }
    if (op == "//" || op == "%") {
      if (y == 0)
        return error(offset, "float floor division or modulo by zero");
      // CPython's float_divmod.
      double mod = std::fmod(x, y);
      double div = (x - mod) / y;
      if (mod != 0) {
        if ((y < 0) != (mod < 0)) {
          mod += y;
          div -= 1.0;
        }
      } else {
        mod = std::copysign(0.0, y);
      }
      double floordiv;
      if (div != 0) {
        floordiv = std::floor(div);
        if (div - floordiv > 0.5)
          floordiv += 1.0;
      } else {
        floordiv = std::copysign(0.0, x / y);
      }
      return Value::number(op == "//" ? floordiv : mod);
    }
    // **
    if (x == 0 && y < 0)
      return error(offset, "0.0 cannot be raised to a negative power");
    if (x < 0 && std::floor(y) != y)
      return error(offset, "unsupported: a complex result of '**'");
    const double r = std::pow(x, y);
    if (std::isinf(r) && std::isfinite(x) && std::isfinite(y))
      return error(offset, "numerical result out of range in '**'");
    return Value::number(r);
  }

  /// a < b (and <=, >, >=) on Python's ordered types.
  Expected<bool> order(const std::string &op, const Value &a, const Value &b,
                       size_t offset) {
    if (a.isUndefined())
      return undefinedError(offset, a);
    if (b.isUndefined())
      return undefinedError(offset, b);
    auto decide = [&](auto x, auto y) {
      if (op == "<")
        return x < y;
      if (op == "<=")
        return x <= y;
      if (op == ">")
        return x > y;
      return x >= y;
    };
    if (a.isNumber() && b.isNumber()) {
      if (a.isIntegral() && b.isIntegral())
        return decide(a.asInt(), b.asInt());
      return decide(a.asFloat(), b.asFloat());
    }
    if (a.isString() && b.isString())
      return decide(a.asString(), b.asString()); // UTF-8 order = code points
    if (a.isList() && b.isList() && a.sameFlavor(b) && !a.isView()) {
      const ValueList &x = a.asList(), &y = b.asList();
      for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
        Expected<bool> same = equals(x[i], y[i], offset);
        if (!same)
          return same;
        if (!*same)
          return order(op, x[i], y[i], offset);
      }
      return decide(x.size(), y.size());
    }
    return error(offset, "'" + op + "' not supported between instances of '" +
                             std::string(a.typeName()) + "' and '" +
                             std::string(b.typeName()) + "'");
  }

  /// needle in container.
  Expected<bool> contains(const Value &container, const Value &needle,
                          size_t offset) {
    switch (container.kind()) {
    case Value::Kind::Undefined:
      return false;
    case Value::Kind::String:
      if (!needle.isString())
        return error(offset, "'in <string>' requires string as left operand, not " +
                                 std::string(needle.typeName()));
      return container.asString().find(needle.asString()) != std::string::npos;
    case Value::Kind::List:
      for (const Value &item : container.asList()) {
        Expected<bool> same = equals(item, needle, offset);
        if (!same || *same)
          return same;
      }
      return false;
    case Value::Kind::Map:
      if (needle.isList() || needle.isMap())
        return error(offset, "unhashable type: '" + std::string(needle.typeName()) + "'");
      return needle.isString() && container.asMap().contains(needle.asString());
    default:
      return error(offset, "argument of type '" + std::string(container.typeName()) +
                               "' is not iterable");
    }
  }

  // --- expressions -------------------------------------------------------------

  /// The arguments of a call, in signature order (undefined where absent;
  /// `present` says which were given).
  Expected<ValueList> evalArgs(const Expr &e, std::vector<bool> &present) {
    ValueList values;
    present.clear();
    for (const Arg &arg : e.args) {
      present.push_back(arg.value != nullptr);
      if (!arg.value) {
        values.emplace_back();
        continue;
      }
      KILN_CHAT_EVAL(value, eval(*arg.value));
      values.push_back(std::move(value));
    }
    return values;
  }

  Expected<Value> eval(const Expr &e) {
    switch (e.kind) {
    case ExprKind::Literal:
      return e.literal;
    case ExprKind::Name:
      return lookup(e.name);
    case ExprKind::List:
    case ExprKind::Tuple: {
      ValueList items;
      for (const ExprPtr &operand : e.operands) {
        KILN_CHAT_EVAL(item, eval(*operand));
        items.push_back(std::move(item));
      }
      Value result = e.kind == ExprKind::Tuple ? Value::tuple(std::move(items))
                                               : Value::list(std::move(items));
      KILN_CHAT_TRY(checkDepth(result, e.offset));
      return result;
    }
    case ExprKind::Dict: {
      ValueMap map;
      for (size_t i = 0; i + 1 < e.operands.size(); i += 2) {
        KILN_CHAT_EVAL(key, eval(*e.operands[i]));
        if (!key.isString())
          return error(e.operands[i]->offset,
                       "unsupported: dict key of type '" +
                           std::string(key.typeName()) + "' (only strings)");
        KILN_CHAT_EVAL(value, eval(*e.operands[i + 1]));
        map.set(key.asString(), std::move(value));
      }
      Value result = Value::map(std::move(map));
      KILN_CHAT_TRY(checkDepth(result, e.offset));
      return result;
    }
    case ExprKind::Attr: {
      KILN_CHAT_EVAL(object, eval(*e.operands[0]));
      return getAttr(object, e.name, e.offset);
    }
    case ExprKind::Item: {
      KILN_CHAT_EVAL(object, eval(*e.operands[0]));
      KILN_CHAT_EVAL(key, eval(*e.operands[1]));
      return getItem(object, key, e.offset);
    }
    case ExprKind::Slice: {
      KILN_CHAT_EVAL(object, eval(*e.operands[0]));
      Value parts[3];
      const Value *bounds[3] = {nullptr, nullptr, nullptr};
      for (int k = 0; k < 3; ++k) {
        if (!e.operands[k + 1])
          continue;
        KILN_CHAT_EVAL(part, eval(*e.operands[k + 1]));
        parts[k] = std::move(part);
        bounds[k] = &parts[k];
      }
      return slice(object, bounds, e.offset);
    }
    case ExprKind::Call:
      return evalCall(e);
    case ExprKind::MacroCall:
      return evalMacroCall(e);
    case ExprKind::Namespace: {
      ValueMap attributes;
      for (const Arg &arg : e.args) {
        KILN_CHAT_EVAL(value, eval(*arg.value));
        if (!arg.name.empty()) {
          attributes.set(arg.name, value);
          continue;
        }
        if (!value.isMap())
          return error(arg.value->offset, "namespace() takes a dict, not " +
                                              std::string(value.typeName()));
        for (const auto &entry : value.asMap())
          attributes.set(entry.first, entry.second);
      }
      for (const auto &entry : attributes)
        if (holdsNamespace(entry.second))
          return error(e.offset, "unsupported: a namespace stored in a "
                                 "namespace's attribute");
      return Value::nameSpace(std::move(attributes));
    }
    case ExprKind::Method:
      return evalMethod(e);
    case ExprKind::Filter:
      return evalFilter(e);
    case ExprKind::Test: {
      Expected<bool> result = evalTest(e);
      if (!result)
        return result.error();
      return Value::boolean(*result != e.negated);
    }
    case ExprKind::Not: {
      KILN_CHAT_EVAL(value, eval(*e.operands[0]));
      return Value::boolean(!value.truthy());
    }
    case ExprKind::Neg:
    case ExprKind::Pos: {
      KILN_CHAT_EVAL(value, eval(*e.operands[0]));
      if (value.isUndefined())
        return undefinedError(e.offset, value);
      if (!value.isNumber())
        return error(e.offset, std::string("bad operand type for unary ") +
                                   (e.kind == ExprKind::Neg ? "-" : "+") + ": '" +
                                   std::string(value.typeName()) + "'");
      if (e.kind == ExprKind::Pos)
        return value.isFloat() ? value : Value::integer(value.asInt());
      if (value.isFloat())
        return Value::number(-value.asFloat());
      if (value.asInt() == std::numeric_limits<int64_t>::min())
        return error(e.offset, "integer overflow (Kiln's integers are 64-bit)");
      return Value::integer(-value.asInt());
    }
    case ExprKind::Binary: {
      KILN_CHAT_EVAL(left, eval(*e.operands[0]));
      KILN_CHAT_EVAL(right, eval(*e.operands[1]));
      return arithmetic(e.name, left, right, e.offset);
    }
    case ExprKind::Compare: {
      KILN_CHAT_EVAL(left, eval(*e.operands[0]));
      // a < b < c is a < b and b < c, each operand evaluated once.
      for (size_t i = 0; i < e.ops.size(); ++i) {
        KILN_CHAT_EVAL(right, eval(*e.operands[i + 1]));
        const std::string &op = e.ops[i];
        Expected<bool> holds = false;
        if (op == "==" || op == "!=") {
          holds = equals(left, right, e.offset);
          if (holds && op == "!=")
            holds = !*holds;
        } else if (op == "in" || op == "notin") {
          holds = contains(right, left, e.offset);
          if (holds && op == "notin")
            holds = !*holds;
        } else {
          holds = order(op, left, right, e.offset);
        }
        if (!holds)
          return holds.error();
        if (!*holds)
          return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case ExprKind::And: {
      KILN_CHAT_EVAL(left, eval(*e.operands[0]));
      if (!left.truthy())
        return left;
      return eval(*e.operands[1]);
    }
    case ExprKind::Or: {
      KILN_CHAT_EVAL(left, eval(*e.operands[0]));
      if (left.truthy())
        return left;
      return eval(*e.operands[1]);
    }
    case ExprKind::Cond: {
      KILN_CHAT_EVAL(cond, eval(*e.operands[1]));
      if (cond.truthy())
        return eval(*e.operands[0]);
      if (e.operands[2])
        return eval(*e.operands[2]);
      return Value::undefined("the inline if expression evaluated to false and "
                              "no else section was defined");
    }
    }
    return error(e.offset, "internal error: unknown expression");
  }

  /// A macro's call: the arguments evaluated here, the body rendered in
  /// the macro's own scope (the template's top-level variables, then its
  /// parameters; not the caller's loop variables, as in jinja2), its output
  /// the value.
  Expected<Value> evalMacroCall(const Expr &e) {
    const Value callee = lookup(e.name);
    if (callee.isUndefined())
      return undefinedError(e.offset, callee);
    if (!callee.isMacro())
      return error(e.offset, "'" + std::string(callee.typeName()) +
                                 "' object is not callable");
    const Node &macro = *macroNodes_[static_cast<size_t>(callee.macroId())];
    const std::vector<std::string> &params = macro.targets;
    Frame own;
    std::vector<bool> given(params.size(), false);
    size_t positional = 0;
    for (const Arg &arg : e.args) {
      KILN_CHAT_EVAL(value, eval(*arg.value));
      size_t slot = positional;
      if (arg.name.empty()) {
        if (positional == params.size())
          return error(e.offset,
                       "macro '" + macro.text + "' takes not more than " +
                           std::to_string(params.size()) + " argument(s)");
        ++positional;
      } else {
        slot = static_cast<size_t>(
            std::find(params.begin(), params.end(), arg.name) - params.begin());
        if (slot == params.size() || given[slot])
          return error(e.offset, "macro '" + macro.text +
                                     "' takes no keyword argument '" +
                                     arg.name + "'");
      }
      given[slot] = true;
      own[params[slot]] = std::move(value);
    }
    if (macroDepth_ >= kMaxMacroDepth)
      return error(e.offset, "macro calls nested too deeply (limit " +
                                 std::to_string(kMaxMacroDepth) + ")");
    // Calls are work as loop iterations are: one bound for both.
    if (++iterations_ > limits_.maxLoopIterations)
      return error(e.offset, "too many loop iterations and macro calls "
                             "(limit " +
                                 std::to_string(limits_.maxLoopIterations) +
                                 ")");
    // Into the macro's scope; everything is put back however it ends.
    std::vector<Frame> caller(std::make_move_iterator(frames_.begin() + 1),
                              std::make_move_iterator(frames_.end()));
    frames_.resize(1);
    frames_.push_back(std::move(own));
    std::string callerOut;
    std::swap(out_, callerOut);
    ++macroDepth_;
    Status st = Status::ok();
    // Defaults are evaluated in the macro's scope: one may name an earlier
    // parameter. A parameter without one is undefined.
    for (size_t i = 0; i < params.size() && st; ++i) {
      if (given[i])
        continue;
      if (!macro.defaults[i]) {
        frames_.back()[params[i]] =
            Value::undefined("'" + params[i] + "' is undefined");
        continue;
      }
      Expected<Value> fallback = eval(*macro.defaults[i]);
      if (!fallback)
        st = fallback.error();
      else
        frames_.back()[params[i]] = std::move(*fallback);
    }
    if (st)
      st = renderBody(macro.body);
    --macroDepth_;
    std::string text;
    std::swap(out_, text);
    std::swap(out_, callerOut);
    frames_.resize(1);
    for (Frame &frame : caller)
      frames_.push_back(std::move(frame));
    if (!st)
      return st.error();
    return makeString(std::move(text), e.offset);
  }

  Expected<Value> evalCall(const Expr &e) {
    std::vector<bool> present;
    Expected<ValueList> args = evalArgs(e, present);
    if (!args)
      return args.error();
    const ValueList &a = *args;
    if (e.name == "raise_exception") {
      Expected<std::string> message = str(a[0], e.offset);
      if (!message)
        return message.error();
      return error(e.offset, "raise_exception: " + *message);
    }
    // range(stop) / range(start, stop[, step])
    for (size_t i = 0; i < a.size(); ++i)
      if (present[i] && !a[i].isIntegral())
        return error(e.offset, "range() arguments must be integers, not '" +
                                   std::string(a[i].typeName()) + "'");
    int64_t start = 0, stop = a[0].asInt(), step = 1;
    if (present[1]) {
      start = a[0].asInt();
      stop = a[1].asInt();
    }
    if (present[2])
      step = a[2].asInt();
    if (step == 0)
      return error(e.offset, "range() arg 3 must not be zero");
    __int128 count = 0;
    if (step > 0 && start < stop)
      count = ((__int128)stop - start + step - 1) / step;
    else if (step < 0 && start > stop)
      count = ((__int128)start - stop - step - 1) / -(__int128)step;
    if (count > kMaxRange)
      return error(e.offset, "range too big (more than " + std::to_string(kMaxRange) +
                                 " items, jinja2's sandbox limit)");
    ValueList items;
    for (__int128 i = 0; i < count; ++i)
      items.push_back(Value::integer(static_cast<int64_t>(start + i * step)));
    return Value::view(std::move(items), "range");
  }

  Expected<Value> evalMethod(const Expr &e) {
    KILN_CHAT_EVAL(object, eval(*e.operands[0]));
    if (object.isUndefined())
      return undefinedError(e.offset, object);
    std::vector<bool> present;
    Expected<ValueList> args = evalArgs(e, present);
    if (!args)
      return args.error();
    const ValueList &a = *args;
    const std::string &m = e.name;
    auto optionalString = [&](size_t i, const char *what)
        -> Expected<std::optional<std::string>> {
      if (!present[i] || a[i].isNone())
        return std::optional<std::string>();
      if (!a[i].isString())
        return error(e.offset, std::string(what) + " must be None or a string, not '" +
                                   std::string(a[i].typeName()) + "'");
      return std::optional<std::string>(a[i].asString());
    };
    auto optionalInt = [&](size_t i, int64_t fallback) -> Expected<int64_t> {
      if (!present[i])
        return fallback;
      if (!a[i].isIntegral())
        return error(e.offset, "'" + std::string(a[i].typeName()) +
                                   "' object cannot be interpreted as an integer");
      return a[i].asInt();
    };
    auto requireString = [&](size_t i) -> Expected<std::string> {
      if (!a[i].isString())
        return error(e.offset, "." + m + "() needs a string argument, not '" +
                                   std::string(a[i].typeName()) + "'");
      return a[i].asString();
    };

    if (object.isString()) {
      const std::string &s = object.asString();
      if (m == "strip" || m == "lstrip" || m == "rstrip") {
        Expected<std::optional<std::string>> chars = optionalString(0, "strip arg");
        if (!chars)
          return chars.error();
        return Value(pytext::strip(s, *chars, m != "rstrip", m != "lstrip"));
      }
      if (m == "startswith" || m == "endswith") {
        std::vector<std::string> affixes;
        if (a[0].isString()) {
          affixes.push_back(a[0].asString());
        } else if (a[0].isTuple()) {
          for (const Value &item : a[0].asList()) {
            if (!item.isString())
              return error(e.offset, "tuple for " + m + " must only contain str");
            affixes.push_back(item.asString());
          }
        } else {
          return error(e.offset, m + " first arg must be str or a tuple of str, not " +
                                     std::string(a[0].typeName()));
        }
        for (const std::string &affix : affixes) {
          const bool hit =
              affix.size() <= s.size() &&
              (m == "startswith" ? s.compare(0, affix.size(), affix) == 0
                                 : s.compare(s.size() - affix.size(), affix.size(),
                                             affix) == 0);
          if (hit)
            return Value::boolean(true);
        }
        return Value::boolean(false);
      }
      if (m == "split") {
        Expected<std::optional<std::string>> sep = optionalString(0, "sep");
        if (!sep)
          return sep.error();
        if (*sep && (*sep)->empty())
          return error(e.offset, "empty separator");
        Expected<int64_t> maxsplit = optionalInt(1, -1);
        if (!maxsplit)
          return maxsplit.error();
        ValueList parts;
        for (std::string &piece : pytext::split(s, *sep, *maxsplit))
          parts.emplace_back(std::move(piece));
        return Value::list(std::move(parts));
      }
      if (m == "upper")
        return makeString(pytext::upper(s), e.offset);
      if (m == "lower")
        return makeString(pytext::lower(s), e.offset);
      if (m == "replace") {
        Expected<std::string> from = requireString(0);
        if (!from)
          return from.error();
        Expected<std::string> to = requireString(1);
        if (!to)
          return to.error();
        Expected<int64_t> count = optionalInt(2, -1);
        if (!count)
          return count.error();
        return replaceChecked(s, *from, *to, *count, e.offset);
      }
    } else if (object.isMap()) {
      const ValueMap &map = object.asMap();
      if (m == "items") {
        ValueList pairs;
        for (const auto &[key, value] : map)
          pairs.push_back(Value::tuple({Value(key), value}));
        Value result = Value::view(std::move(pairs), "dict_items");
        KILN_CHAT_TRY(checkDepth(result, e.offset));
        return result;
      }
      if (m == "keys" || m == "values") {
        ValueList out;
        for (const auto &[key, value] : map)
          out.push_back(m == "keys" ? Value(key) : value);
        return Value::view(std::move(out), m == "keys" ? "dict_keys" : "dict_values");
      }
      if (m == "get") {
        const Value fallback = present[1] ? a[1] : Value::none();
        if (a[0].isList() || a[0].isMap())
          return error(e.offset, "unhashable type: '" + std::string(a[0].typeName()) + "'");
        if (a[0].isString())
          if (const Value *found = map.find(a[0].asString()))
            return *found;
        return fallback;
      }
    }
    return error(e.offset, "'" + objectTypeRepr(object) + "' has no method '" + m +
                               "()' in Kiln's Jinja subset");
  }

  Expected<Value> replaceChecked(const std::string &s, const std::string &from,
                                 const std::string &to, int64_t count,
                                 size_t offset) const {
    // Bound the result before building it.
    uint64_t hits = 0;
    if (from.empty()) {
      hits = pytext::length(s) + 1;
    } else {
      for (size_t at = s.find(from); at != std::string::npos;
           at = s.find(from, at + from.size()))
        ++hits;
    }
    if (count >= 0)
      hits = std::min<uint64_t>(hits, static_cast<uint64_t>(count));
    const long double size = static_cast<long double>(s.size()) +
                             static_cast<long double>(hits) * to.size();
    if (size > static_cast<long double>(limits_.maxOutputBytes))
      return error(offset, "string longer than the limit of " +
                               std::to_string(limits_.maxOutputBytes) + " bytes");
    return Value(pytext::replace(s, from, to, count));
  }

  Expected<bool> evalTest(const Expr &e) {
    KILN_CHAT_EVAL(v, eval(*e.operands[0]));
    const std::string &t = e.name;
    if (t == "defined")
      return !v.isUndefined();
    if (t == "undefined")
      return v.isUndefined();
    if (t == "none")
      return v.isNone();
    if (t == "string")
      return v.isString();
    if (t == "mapping")
      return v.isMap();
    if (t == "iterable" || t == "sequence")
      return v.isString() || v.isList() || v.isMap() || v.isUndefined();
    if (t == "number")
      return v.isNumber();
    if (t == "boolean")
      return v.isBool();
    if (t == "integer")
      return v.isInt();
    if (t == "float")
      return v.isFloat();
    if (t == "true")
      return v.isBool() && v.asBool();
    if (t == "false")
      return v.isBool() && !v.asBool();
    // odd, even, divisibleby: value % n
    Value divisor = Value::integer(2);
    if (t == "divisibleby") {
      std::vector<bool> present;
      Expected<ValueList> args = evalArgs(e, present);
      if (!args)
        return args.error();
      divisor = (*args)[0];
    }
    if (divisor.isUndefined())
      return undefinedError(e.offset, divisor);
    if (!v.isNumber() || !divisor.isNumber())
      return error(e.offset, "test '" + t + "' needs numbers, not '" +
                                 std::string(v.typeName()) + "'");
    Expected<Value> rest = numeric("%", v, divisor, e.offset);
    if (!rest)
      return rest.error();
    const bool zero = rest->asFloat() == 0;
    return t == "odd" ? !zero : zero;
  }

  Expected<Value> evalFilter(const Expr &e) {
    KILN_CHAT_EVAL(v, eval(*e.operands[0]));
    std::vector<bool> present;
    Expected<ValueList> args = evalArgs(e, present);
    if (!args)
      return args.error();
    const ValueList &a = *args;
    const std::string &f = e.name;
    const size_t at = e.offset;

    // Filters that take the value's text (jinja2's soft_str).
    if (f == "trim" || f == "lower" || f == "upper" || f == "capitalize" ||
        f == "string" || f == "replace") {
      Expected<std::string> text = str(v, at);
      if (!text)
        return text.error();
      if (f == "string")
        return Value(std::move(*text));
      if (f == "lower")
        return makeString(pytext::lower(*text), at);
      if (f == "upper")
        return makeString(pytext::upper(*text), at);
      if (f == "capitalize")
        return makeString(pytext::capitalize(*text), at);
      if (f == "trim") {
        std::optional<std::string> chars;
        if (present[0] && !a[0].isNone()) {
          if (!a[0].isString())
            return error(at, "trim chars must be None or a string");
          chars = a[0].asString();
        }
        return Value(pytext::strip(*text, chars, true, true));
      }
      // replace(old, new, count=None): old and new as text too.
      Expected<std::string> from = str(a[0], at);
      if (!from)
        return from.error();
      Expected<std::string> to = str(a[1], at);
      if (!to)
        return to.error();
      int64_t count = -1;
      if (present[2] && !a[2].isNone()) {
        if (!a[2].isIntegral())
          return error(at, "replace count must be an integer");
        count = a[2].asInt();
      }
      return replaceChecked(*text, *from, *to, count, at);
    }
    if (f == "length") {
      switch (v.kind()) {
      case Value::Kind::Undefined:
        return Value::integer(0);
      case Value::Kind::String:
        return Value::integer(static_cast<int64_t>(pytext::length(v.asString())));
      case Value::Kind::List:
        return Value::integer(static_cast<int64_t>(v.asList().size()));
      case Value::Kind::Map:
        return Value::integer(static_cast<int64_t>(v.asMap().size()));
      default:
        return error(at, "object of type '" + std::string(v.typeName()) +
                             "' has no len()");
      }
    }
    if (f == "default") {
      const Value fallback = present[0] ? a[0] : Value("");
      const bool boolean = present[1] && a[1].truthy();
      if (v.isUndefined() || (boolean && !v.truthy()))
        return fallback;
      return v;
    }
    if (f == "first" || f == "last" || f == "list" || f == "join") {
      Expected<ValueList> items = iterate(v, at);
      if (!items)
        return items.error();
      if (f == "list")
        return Value::list(std::move(*items));
      if (f == "join") {
        std::string sep;
        if (present[0]) {
          Expected<std::string> text = str(a[0], at);
          if (!text)
            return text.error();
          sep = std::move(*text);
        }
        std::string out;
        for (size_t i = 0; i < items->size(); ++i) {
          Expected<std::string> piece = str((*items)[i], at);
          if (!piece)
            return piece.error();
          if (i)
            out += sep;
          out += *piece;
          if (out.size() > limits_.maxOutputBytes)
            return error(at, "string longer than the limit of " +
                                 std::to_string(limits_.maxOutputBytes) + " bytes");
        }
        return Value(std::move(out));
      }
      if (items->empty())
        return Value::undefined(f == "first" ? "No first item, sequence was empty."
                                             : "No last item, sequence was empty.");
      return f == "first" ? items->front() : items->back();
    }
    if (f == "items") {
      if (v.isUndefined())
        return Value::view({}, "generator");
      if (!v.isMap())
        return error(at, "Can only get item pairs from a mapping.");
      ValueList pairs;
      for (const auto &[key, value] : v.asMap())
        pairs.push_back(Value::tuple({Value(key), value}));
      Value result = Value::view(std::move(pairs), "generator");
      KILN_CHAT_TRY(checkDepth(result, at));
      return result;
    }
    if (f == "int")
      return intFilter(v, present[0] ? a[0] : Value::integer(0),
                       present[1] ? a[1] : Value::integer(10), at);
    if (f == "tojson")
      return tojson(v, a, present, at);
    return error(at, "internal error: filter '" + f + "' has no implementation");
  }

  /// jinja2's do_int: int(value, base) for strings, int(value) otherwise,
  /// then int(float(value)); `fallback` where both fail.
  Expected<Value> intFilter(const Value &v, const Value &fallback, const Value &base,
                            size_t at) const {
    if (v.isUndefined())
      return undefinedError(at, v);
    if (!base.isIntegral() || base.asInt() < 2 || base.asInt() > 36)
      return error(at, "unsupported: int base other than 2..36");
    auto fromDouble = [&](double d) -> Expected<Value> {
      if (std::isnan(d))
        return fallback;
      if (std::isinf(d))
        return error(at, "cannot convert float infinity to integer");
      const double t = std::trunc(d);
      if (t < -9223372036854775808.0 || t >= 9223372036854775808.0)
        return error(at, "integer overflow (Kiln's integers are 64-bit)");
      return Value::integer(static_cast<int64_t>(t));
    };
    if (v.isString()) {
      bool overflow = false;
      std::optional<int64_t> parsed =
          parsePythonInt(v.asString(), static_cast<int>(base.asInt()), overflow);
      if (overflow)
        return error(at, "integer overflow (Kiln's integers are 64-bit)");
      if (parsed)
        return Value::integer(*parsed);
      if (std::optional<double> d = parsePythonFloat(v.asString()))
        return fromDouble(*d);
      return fallback;
    }
    if (v.isIntegral())
      return Value::integer(v.asInt());
    if (v.isFloat())
      return fromDouble(v.asFloat());
    return fallback;
  }

  /// HuggingFace's tojson: json.dumps(x, ensure_ascii=False, indent=None,
  /// separators=None, sort_keys=False).
  Expected<Value> tojson(const Value &v, const ValueList &a,
                         const std::vector<bool> &present, size_t at) const {
    JsonOptions options;
    options.ensureAscii = present[0] && a[0].truthy();
    if (present[1] && !a[1].isNone()) {
      if (a[1].isIntegral())
        options.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(
                                         a[1].asInt(), 0, 1024)),
                                     ' ');
      else if (a[1].isString())
        options.indent = a[1].asString();
      else
        return error(at, "tojson indent must be an integer or a string");
    }
    if (present[2] && !a[2].isNone()) {
      const Value &sep = a[2];
      if (!sep.isList() || sep.asList().size() != 2 || !sep.asList()[0].isString() ||
          !sep.asList()[1].isString())
        return error(at, "tojson separators must be a pair of strings");
      options.separators = std::make_pair(sep.asList()[0].asString(),
                                          sep.asList()[1].asString());
    }
    options.sortKeys = present[3] && a[3].truthy();
    Expected<std::string> text = pyJsonDumps(v, options, limits_.maxOutputBytes);
    if (!text)
      return relocate(at, text.error());
    return Value(std::move(*text));
  }
};

#undef KILN_CHAT_EVAL
#undef KILN_CHAT_TRY

} // namespace

Expected<std::string> renderTemplate(const TemplateImpl &impl, const Value &context,
                                     const RenderLimits &limits) {
  if (!context.isMap())
    return Error(impl.where, "", "the render context must be a map of variables");
  if (context.depth() > kMaxNestingDepth + 1)
    return Error(impl.where, "",
                 "the render context is nested too deeply (limit " +
                     std::to_string(kMaxNestingDepth) + ")");
  Renderer renderer(impl, context.asMap(), limits);
  return renderer.run();
}

} // namespace kiln::chat::detail
