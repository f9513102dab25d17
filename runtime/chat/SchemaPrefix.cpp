//===- SchemaPrefix.cpp - A reply that must be JSON a schema accepts ------===//
#include "chat/SchemaPrefix.h"

#include "chat/ReplyText.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <unordered_map>

namespace kiln::chat {

//===----------------------------------------------------------------------===//
// Compiling a schema.
//===----------------------------------------------------------------------===//

namespace {

using Node = JsonSchema::Node;

/// Keywords that say nothing about which values are valid.
bool isAnnotation(std::string_view k) {
  static constexpr std::string_view kNames[] = {
      "title",    "description", "default",    "examples", "deprecated",
      "readOnly", "writeOnly",   "$schema",    "$id",      "$comment",
      "format",   "$defs",       "definitions"};
  return std::find(std::begin(kNames), std::end(kNames), k) != std::end(kNames);
}

/// 10^e for 0 <= e <= 38.
__int128 pow10(int e) {
  __int128 r = 1;
  while (e-- > 0)
    r *= 10;
  return r;
}

/// Bounds past any number of kMaxNumberDigits digits, in units of 10^-15.
const __int128 kDecimalFar = pow10(32);

/// A bound `x` in units of 10^-kMaxNumberDigits, rounded up (`up`) or down:
/// its shortest decimal form (the double a validator compares with, as
/// std::to_chars writes it) scaled exactly; clamped to +-kDecimalFar.
__int128 scaledBound(double x, bool up) {
  char buf[64];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof buf, x);
  std::string_view t(buf, size_t(r.ptr - buf));
  const bool negative = !t.empty() && t[0] == '-';
  if (negative)
    t.remove_prefix(1);
  // Mantissa digits (at most 17) and the power of ten they are scaled by.
  __int128 m = 0;
  int e = 0;
  bool point = false;
  size_t i = 0;
  for (; i < t.size() && t[i] != 'e'; ++i) {
    if (t[i] == '.') {
      point = true;
      continue;
    }
    m = m * 10 + (t[i] - '0');
    e -= point;
  }
  if (i < t.size())
    e += std::atoi(std::string(t.substr(i + 1)).c_str());
  e += JsonSchema::kMaxNumberDigits;
  // |x| = m 10^e units: floor q, and whether anything is left over.
  __int128 q;
  bool rest = false;
  if (e >= 0) {
    int digits = 0;
    for (__int128 v = m; v > 0; v /= 10)
      ++digits;
    q = digits + e > 32 ? kDecimalFar : m * pow10(e);
  } else if (-e > 38) {
    q = 0;
    rest = m != 0;
  } else {
    q = m / pow10(-e);
    rest = m % pow10(-e) != 0;
  }
  q = std::min(q, kDecimalFar);
  // Up for +|x| is the ceiling, for -|x| minus the floor; down the other way.
  if (!negative)
    return up ? q + rest : q;
  return up ? -q : -(q + rest);
}

/// Whether the multiples of `step` have one in [a, b] and in [lo, hi].
bool gridMeets(__int128 a, __int128 b, __int128 step, __int128 lo,
               __int128 hi) {
  const __int128 l = std::max(a, lo), h = std::min(b, hi);
  if (l > h)
    return false;
  const __int128 k = l >= 0 ? (l + step - 1) / step : -(-l / step);
  return k * step <= h;
}

} // namespace

/// Whether a number written so far (in `phase`, with its sign, its digits
/// as one integer, `whole` integer digits and `fraction` fraction digits)
/// can still become a value in [lo, hi] (units of 10^-15), a multiple of
/// `multiple` where it is not 0, written without an exponent in at most
/// kMaxNumberDigits digits. Each way on is a set of
/// multiples of a step between two ends: j more integer digits leave the
/// rest of the digits to the fraction.
static bool decimalMeets(JsonNumber phase, bool negative, int64_t digits,
                         int whole, int fraction, __int128 lo, __int128 hi,
                         int64_t multiple) {
  constexpr int kDigits = JsonSchema::kMaxNumberDigits;
  const __int128 unit = pow10(kDigits);
  // A whole multiple's units are a multiple of every step below: its
  // multiples are the values left on each run.
  auto meets = [&](__int128 a, __int128 b, __int128 step, bool minus) {
    if (multiple)
      step = __int128(multiple) * unit;
    return minus ? gridMeets(-b, -a, step, lo, hi)
                 : gridMeets(a, b, step, lo, hi);
  };
  switch (phase) {
  case JsonNumber::Start:
  case JsonNumber::Minus:
    // "0.f" (steps of 10^-15 below 1), or i integer digits (steps of
    // 10^-(15 - i) in [10^(i-1), 10^i)); a '-' already written: negative.
    for (bool minus : {false, true}) {
      if (phase == JsonNumber::Minus && !minus)
        continue;
      if (meets(0, unit - 1, 1, minus))
        return true;
      for (int i = 1; i <= kDigits; ++i)
        if (meets(pow10(i - 1) * unit, pow10(i) * unit - pow10(i), pow10(i),
                  minus))
          return true;
    }
    return false;
  case JsonNumber::Zero:
    return meets(0, unit - 1, 1, negative);
  case JsonNumber::Integer:
    for (int j = 0; whole + j <= kDigits; ++j) {
      const __int128 step = pow10(whole + j);
      const __int128 a = __int128(digits) * pow10(j) * unit;
      if (meets(a, a + pow10(j) * unit - step, step, negative))
        return true;
    }
    return false;
  case JsonNumber::Dot:
  case JsonNumber::Fraction: {
    if (phase == JsonNumber::Dot && whole + fraction >= kDigits)
      return false; // a digit must follow, and none may
    const __int128 step = pow10(whole);
    const __int128 a = __int128(digits) * pow10(kDigits - fraction);
    return meets(a, a + pow10(kDigits - fraction) - step, step, negative);
  }
  default:
    return false; // no exponent is written
  }
}

namespace {

/// Whether a property name can be written as a key without an escape.
bool writableKey(std::string_view name) {
  for (char c : name)
    if (c == '"' || c == '\\' || uint8_t(c) < 0x20)
      return false;
  return true;
}

} // namespace

class SchemaCompiler {
public:
  SchemaCompiler(const Value &doc, std::string where)
      : doc_(doc), where_(std::move(where)) {}

  Expected<int32_t> compile(const Value &s, const std::string &at);
  Status checkSatisfiable();
  /// The value at a JSON pointer ("" is the document), or null.
  const Value *locate(const std::string &pointer) const;

  JsonSchema out;

private:
  Error fail(const std::string &at, std::string problem) const {
    return Error(where_, "#" + at, std::move(problem));
  }
  Expected<int32_t> reference(const Value &ref, const std::string &at);
  Expected<uint32_t> count(const Value &v, const std::string &at) const;
  Status object(const ValueMap &m, const std::string &at, Node &n);
  Status numberBounds(const ValueMap &m, const std::string &at, Node &n);
  Expected<int32_t> enumeration(const ValueMap &m, const std::string &at,
                                uint8_t types);
  int32_t add(Node n) {
    out.nodes_.push_back(std::move(n));
    return int32_t(out.nodes_.size() - 1);
  }

  Expected<int32_t> compileAt(const Value &s, const std::string &at);

  const Value &doc_;
  std::string where_;
  std::unordered_map<std::string, int32_t> refs_;
  int depth_ = 0; ///< compile() calls open
};

Expected<uint32_t> SchemaCompiler::count(const Value &v,
                                         const std::string &at) const {
  double x = v.isNumber() && !v.isBool() ? v.asFloat() : -1;
  if (!(x >= 0) || x != std::floor(x) || x >= double(UINT32_MAX))
    return fail(at, "must be a non-negative integer below 2^32 - 1");
  return uint32_t(x);
}

const Value *SchemaCompiler::locate(const std::string &pointer) const {
  const Value *v = &doc_;
  size_t i = 0;
  while (i < pointer.size()) {
    if (pointer[i] != '/')
      return nullptr;
    size_t end = pointer.find('/', i + 1);
    if (end == std::string::npos)
      end = pointer.size();
    std::string token;
    for (size_t j = i + 1; j < end; ++j) {
      if (pointer[j] == '~' && j + 1 < end &&
          (pointer[j + 1] == '0' || pointer[j + 1] == '1')) {
        token += pointer[j + 1] == '0' ? '~' : '/';
        ++j;
      } else {
        token += pointer[j];
      }
    }
    const Value *next = nullptr;
    if (v->isMap()) {
      next = v->asMap().find(token);
    } else if (v->isList() && !token.empty() && token.size() < 10 &&
               token.find_first_not_of("0123456789") == std::string::npos &&
               std::stoul(token) < v->asList().size()) {
      next = &v->asList()[std::stoul(token)];
    }
    if (!next)
      return nullptr;
    v = next;
    i = end;
  }
  return v;
}

Expected<int32_t> SchemaCompiler::reference(const Value &ref,
                                            const std::string &at) {
  if (!ref.isString() || ref.asString().empty() || ref.asString()[0] != '#')
    return fail(at, "$ref must be a string naming a place in this document "
                    "('#' or '#/...'); other documents are not read");
  const std::string pointer = ref.asString().substr(1);
  if (auto it = refs_.find(pointer); it != refs_.end())
    return it->second;
  const Value *v = locate(pointer);
  if (!v)
    return fail(at,
                "$ref '" + ref.asString() + "' names nothing in the document");
  // The node is made before its target is compiled, so that the target
  // may refer to it (recursion): a one-alternative anyOf of the target.
  Node wrapper;
  wrapper.kind = Node::Kind::AnyOf;
  wrapper.where = pointer;
  const int32_t id = add(std::move(wrapper));
  refs_.emplace(pointer, id);
  Expected<int32_t> target = compile(*v, pointer);
  if (!target)
    return target.error();
  out.nodes_[size_t(id)].alternatives = {*target};
  return id;
}

Expected<int32_t> SchemaCompiler::enumeration(const ValueMap &m,
                                              const std::string &at,
                                              uint8_t types) {
  Node n;
  n.kind = Node::Kind::Enum;
  n.where = at;
  std::vector<const Value *> values;
  std::string field;
  if (const Value *c = m.find("const")) {
    values.push_back(c);
    field = at + "/const";
  } else {
    const Value *e = m.find("enum");
    field = at + "/enum";
    if (!e->isList() || e->asList().empty())
      return fail(field, "must be a non-empty list");
    for (const Value &v : e->asList())
      values.push_back(&v);
  }
  JsonOptions compact;
  compact.separators = std::make_pair(std::string(","), std::string(":"));
  for (const Value *v : values) {
    // An integral number is an integer to JSON Schema, 1.0 included.
    const bool integral =
        v->isInt() ||
        (v->isFloat() && v->asFloat() == std::floor(v->asFloat()));
    uint8_t type = JsonSchema::Number;
    if (v->isNone())
      type = JsonSchema::Null;
    else if (v->isBool())
      type = JsonSchema::Boolean;
    else if (v->isString())
      type = JsonSchema::String;
    else if (v->isList())
      type = JsonSchema::Array;
    else if (v->isMap())
      type = JsonSchema::Object;
    else if (integral)
      type = JsonSchema::Integer | JsonSchema::Number;
    if (!(type & types))
      continue;
    Expected<std::string> text = pyJsonDumps(*v, compact, 1 << 20);
    if (!text)
      return fail(field, text.error().problem());
    if (std::find(n.literals.begin(), n.literals.end(), *text) ==
        n.literals.end())
      n.literals.push_back(std::move(*text));
  }
  if (n.literals.empty())
    return fail(field, "no value has the schema's type");
  if (n.literals.size() > JsonSchema::kMaxMembers)
    return fail(field, "more than " + std::to_string(JsonSchema::kMaxMembers) +
                           " values");
  return add(std::move(n));
}

Status SchemaCompiler::numberBounds(const ValueMap &m, const std::string &at,
                                    Node &n) {
  static constexpr const char *kKeys[] = {
      "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
  const Value *given[4] = {};
  const char *first = nullptr;
  for (int i = 0; i < 4; ++i)
    if ((given[i] = m.find(kKeys[i])) && !first)
      first = kKeys[i];
  const Value *multipleOf = m.find("multipleOf");
  if (multipleOf && !first)
    first = "multipleOf";
  if (!first)
    return Status::ok();
  if (!(n.types & (JsonSchema::Integer | JsonSchema::Number)))
    return fail(at + "/" + first,
                "bounds on a schema whose type admits no number");
  if (multipleOf) {
    // Multiples of a fraction differ between decimal arithmetic and a
    // validator's binary floating point (0.3 of 0.1): whole numbers only.
    const double x = multipleOf->isNumber() && !multipleOf->isBool()
                         ? multipleOf->asFloat()
                         : -1;
    if (!(x > 0) || !std::isfinite(x))
      return fail(at + "/multipleOf", "must be a number above 0");
    if (x != std::floor(x) || x > double(JsonSchema::kMaxBoundedInteger))
      return fail(at + "/multipleOf",
                  "a multiple is kept only of a whole number from 1 to "
                  "10^18 - 1 (a fraction's multiples differ between "
                  "decimal and binary arithmetic)");
    n.multiple = int64_t(x);
  }
  // Draft 4's boolean exclusives qualify minimum / maximum.
  const bool exclusiveMinimum =
                 given[2] && given[2]->isBool() && given[2]->asBool(),
             exclusiveMaximum =
                 given[3] && given[3]->isBool() && given[3]->asBool();
  for (int i = 0; i < 4; ++i) {
    const Value *v = given[i];
    if (v && !(i >= 2 && v->isBool()) &&
        (!v->isNumber() || v->isBool() || !std::isfinite(v->asFloat())))
      return fail(at + "/" + kKeys[i], "must be a number");
  }
  // Each bound made inclusive on a grid, `round(x, up)` rounding onto it.
  auto inclusive = [&](auto round, auto &lo, auto &hi) {
    for (int i = 0; i < 4; ++i) {
      const Value *v = given[i];
      if (!v || (i >= 2 && v->isBool()))
        continue;
      const double x = v->asFloat();
      const bool exclusive =
          i >= 2 || (i == 0 ? exclusiveMinimum : exclusiveMaximum);
      if (i % 2 == 0)
        lo = std::max(lo, exclusive ? round(x, false) + 1 : round(x, true));
      else
        hi = std::min(hi, exclusive ? round(x, true) - 1 : round(x, false));
    }
  };
  auto nothingWithin = [&](const char *what, const char *digits) {
    return fail(at + "/" + first,
                std::string("no ") + (n.multiple ? "multiple" : what) +
                    " of at most " + digits + " lies within the bounds");
  };
  if (n.types & JsonSchema::Number) {
    // Any number: kept in units of 10^-15.
    __int128 lo = -kDecimalFar, hi = kDecimalFar;
    inclusive(scaledBound, lo, hi);
    if (!decimalMeets(JsonNumber::Start, false, 0, 0, 0, lo, hi, n.multiple))
      return nothingWithin("number", "15 digits without an exponent");
    n.decimal = true;
    n.decimalLeast = lo;
    n.decimalMost = hi;
    return Status::ok();
  }
  const double kMax = double(JsonSchema::kMaxBoundedInteger);
  double least = -kMax, most = kMax;
  inclusive([](double x, bool up) { return up ? std::ceil(x) : std::floor(x); },
            least, most);
  // In integers from here (a double holds 18 digits only roughly): the
  // bounds within 18 digits, then the multiples within them.
  const int64_t cap = JsonSchema::kMaxBoundedInteger;
  int64_t lo = least <= -double(cap) ? -cap : int64_t(least);
  int64_t hi = most >= double(cap) ? cap : int64_t(most);
  if (n.multiple && lo <= hi) {
    const int64_t k = n.multiple;
    lo = lo >= 0 ? (lo + k - 1) / k * k : -(-lo / k * k);
    hi = hi >= 0 ? hi / k * k : -((-hi + k - 1) / k * k);
  }
  if (least > most || lo > hi)
    return nothingWithin("integer", "18 digits");
  n.bounded = true;
  n.least = lo;
  n.most = hi;
  return Status::ok();
}

Status SchemaCompiler::object(const ValueMap &m, const std::string &at,
                              Node &n) {
  if (const Value *a = m.find("additionalProperties")) {
    if (a->isBool()) {
      n.additional = a->asBool() ? JsonSchema::kAny : -1;
    } else {
      Expected<int32_t> c = compile(*a, at + "/additionalProperties");
      if (!c)
        return c.error();
      n.additional = *c;
    }
  }
  auto addProperty = [&](const std::string &name, int32_t node,
                         const std::string &field) -> Status {
    if (!writableKey(name))
      return fail(field, "the property name needs an escape in JSON ('\"', "
                         "'\\\\' or a control character), which constrained "
                         "replies do not write");
    if (n.names.size() == JsonSchema::kMaxMembers)
      return fail(field, "more than " +
                             std::to_string(JsonSchema::kMaxMembers) +
                             " properties in one object");
    n.every.set(n.names.size());
    n.names.push_back(name);
    n.properties.push_back(node);
    return Status::ok();
  };
  if (const Value *p = m.find("properties")) {
    if (!p->isMap())
      return fail(at + "/properties", "must be an object");
    for (const auto &[name, schema] : p->asMap()) {
      const std::string field = at + "/properties/" + jsonPointerToken(name);
      Expected<int32_t> c = compile(schema, field);
      if (!c)
        return c.error();
      if (Status st = addProperty(name, *c, field); !st)
        return st;
    }
  }
  if (const Value *r = m.find("required")) {
    const std::string field = at + "/required";
    if (!r->isList())
      return fail(field, "must be a list of property names");
    for (const Value &name : r->asList()) {
      if (!name.isString())
        return fail(field, "must be a list of property names");
      auto it = std::find(n.names.begin(), n.names.end(), name.asString());
      if (it == n.names.end()) {
        if (n.additional < 0)
          return fail(field, "'" + name.asString() +
                                 "' is required but not among the properties, "
                                 "and additionalProperties is false");
        if (Status st = addProperty(name.asString(), n.additional, field); !st)
          return st;
        it = n.names.end() - 1;
      }
      n.required.set(size_t(it - n.names.begin()));
    }
  }
  return Status::ok();
}

Expected<int32_t> SchemaCompiler::compile(const Value &s,
                                          const std::string &at) {
  if (depth_ >= JsonSchema::kMaxCompileDepth)
    return fail(at, "schemas nested more than " +
                        std::to_string(JsonSchema::kMaxCompileDepth) +
                        " deep (subschemas and $refs followed alike)");
  ++depth_;
  Expected<int32_t> id = compileAt(s, at);
  --depth_;
  return id;
}

Expected<int32_t> SchemaCompiler::compileAt(const Value &s,
                                            const std::string &at) {
  if (s.isBool()) {
    if (s.asBool())
      return JsonSchema::kAny;
    return fail(at, "the schema false accepts no value");
  }
  if (!s.isMap())
    return fail(at, "a schema must be an object or a boolean");
  const ValueMap &m = s.asMap();
  static constexpr std::string_view kKnown[] = {"type",
                                                "properties",
                                                "required",
                                                "additionalProperties",
                                                "items",
                                                "minItems",
                                                "maxItems",
                                                "minLength",
                                                "maxLength",
                                                "enum",
                                                "const",
                                                "anyOf",
                                                "allOf",
                                                "$ref",
                                                "pattern",
                                                "minimum",
                                                "maximum",
                                                "exclusiveMinimum",
                                                "exclusiveMaximum",
                                                "multipleOf"};
  size_t constraining = 0;
  for (const auto &[k, v] : m) {
    if (isAnnotation(k))
      continue;
    if (std::find(std::begin(kKnown), std::end(kKnown), k) == std::end(kKnown))
      return fail(at + "/" + jsonPointerToken(k),
                  "keyword '" + k +
                      "' is not supported by constrained decoding (a reply "
                      "could break it)");
    ++constraining;
  }
  auto alone = [&](std::string_view k, size_t allowed) -> Status {
    if (constraining > allowed)
      return fail(at + "/" + std::string(k),
                  std::string(k) +
                      " beside other keywords (except annotations) is not "
                      "supported");
    return Status::ok();
  };
  if (const Value *ref = m.find("$ref")) {
    if (Status st = alone("$ref", 1); !st)
      return st.error();
    return reference(*ref, at + "/$ref");
  }
  if (const Value *all = m.find("allOf")) {
    if (Status st = alone("allOf", 1); !st)
      return st.error();
    if (!all->isList() || all->asList().size() != 1)
      return fail(at + "/allOf", "only an allOf of one schema is supported");
    return compile(all->asList()[0], at + "/allOf/0");
  }
  if (const Value *any = m.find("anyOf")) {
    if (Status st = alone("anyOf", 1); !st)
      return st.error();
    if (!any->isList() || any->asList().empty())
      return fail(at + "/anyOf", "must be a non-empty list of schemas");
    Node n;
    n.kind = Node::Kind::AnyOf;
    n.where = at;
    for (size_t i = 0; i < any->asList().size(); ++i) {
      Expected<int32_t> c =
          compile(any->asList()[i], at + "/anyOf/" + std::to_string(i));
      if (!c)
        return c.error();
      n.alternatives.push_back(*c);
    }
    return add(std::move(n));
  }
  uint8_t types = JsonSchema::AnyType;
  if (const Value *t = m.find("type")) {
    static constexpr std::pair<std::string_view, uint8_t> kTypes[] = {
        {"null", JsonSchema::Null},       {"boolean", JsonSchema::Boolean},
        {"integer", JsonSchema::Integer}, {"number", JsonSchema::Number},
        {"string", JsonSchema::String},   {"array", JsonSchema::Array},
        {"object", JsonSchema::Object}};
    std::vector<Value> names =
        t->isList() ? t->asList() : std::vector<Value>{*t};
    types = 0;
    for (const Value &name : names) {
      auto it = std::find_if(
          std::begin(kTypes), std::end(kTypes), [&](const auto &p) {
            return name.isString() && p.first == name.asString();
          });
      if (it == std::end(kTypes))
        return fail(at + "/type",
                    "expected a JSON type name (null, boolean, integer, "
                    "number, string, array, object) or a list of them");
      types |= it->second;
    }
    if (types == 0)
      return fail(at + "/type", "an empty list of types accepts no value");
  }
  if (m.find("enum") || m.find("const")) {
    if (Status st = alone(m.find("enum") ? "enum" : "const",
                          1 + (m.find("type") != nullptr));
        !st)
      return st.error();
    return enumeration(m, at, types);
  }
  // Reserve the node's place before its children (their ids follow it).
  const int32_t id = add(Node{});
  Node n;
  n.types = types;
  n.where = at;
  if (Status st = object(m, at, n); !st)
    return st.error();
  if (const Value *items = m.find("items")) {
    if (items->isBool() && !items->asBool()) {
      n.maxItems = 0;
    } else {
      Expected<int32_t> c = compile(*items, at + "/items");
      if (!c)
        return c.error();
      n.items = *c;
    }
  }
  struct Bound {
    const char *name;
    uint32_t *slot;
  } bounds[] = {{"minItems", &n.minItems},
                {"maxItems", &n.maxItems},
                {"minLength", &n.minLength},
                {"maxLength", &n.maxLength}};
  const uint32_t itemsCap = n.maxItems; // 0 where items is false
  for (const Bound &b : bounds) {
    if (const Value *v = m.find(b.name)) {
      Expected<uint32_t> c = count(*v, at + "/" + b.name);
      if (!c)
        return c.error();
      *b.slot = *c;
    }
  }
  n.maxItems = std::min(n.maxItems, itemsCap);
  if (Status st = numberBounds(m, at, n); !st)
    return st.error();
  if (const Value *p = m.find("pattern")) {
    if (!p->isString())
      return fail(at + "/pattern", "must be a string");
    if (m.find("minLength") || m.find("maxLength"))
      return fail(at + "/pattern",
                  "a pattern beside minLength / maxLength is not supported");
    Expected<std::shared_ptr<const SchemaPattern>> re =
        SchemaPattern::compile(p->asString(), where_, "#" + at + "/pattern");
    if (!re)
      return re.error();
    n.pattern = *re;
  }
  if ((types & JsonSchema::Array) && n.minItems > n.maxItems)
    return fail(at + "/minItems", "more items are required than allowed");
  if ((types & JsonSchema::String) && n.minLength > n.maxLength)
    return fail(at + "/minLength", "longer than maxLength");
  out.nodes_[size_t(id)] = std::move(n);
  return id;
}

Status SchemaCompiler::checkSatisfiable() {
  const std::vector<Node> &nodes = out.nodes_;
  std::vector<uint8_t> sat(nodes.size(), 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (sat[i])
        continue;
      const Node &n = nodes[i];
      bool ok = false;
      switch (n.kind) {
      case Node::Kind::Enum:
        ok = true;
        break;
      case Node::Kind::AnyOf:
        for (int32_t a : n.alternatives)
          ok = ok || sat[size_t(a)];
        break;
      case Node::Kind::Typed: {
        ok = (n.types &
              (JsonSchema::Null | JsonSchema::Boolean | JsonSchema::Integer |
               JsonSchema::Number | JsonSchema::String)) != 0;
        if ((n.types & JsonSchema::Array) &&
            (n.minItems == 0 || sat[size_t(n.items)]))
          ok = true;
        if (n.types & JsonSchema::Object) {
          bool all = true;
          for (size_t p = 0; p < n.names.size(); ++p)
            if (n.required.test(p))
              all = all && sat[size_t(n.properties[p])];
          ok = ok || all;
        }
        break;
      }
      }
      if (ok) {
        sat[i] = 1;
        changed = true;
      }
    }
  }
  // Every node reachable from the root must accept a value: a reply that
  // began one that does not could never be finished.
  std::vector<uint8_t> seen(nodes.size(), 0);
  std::vector<int32_t> todo = {out.root_};
  while (!todo.empty()) {
    const int32_t i = todo.back();
    todo.pop_back();
    if (seen[size_t(i)])
      continue;
    seen[size_t(i)] = 1;
    const Node &n = nodes[size_t(i)];
    if (!sat[size_t(i)])
      return fail(n.where,
                  "accepts no value (a required property or an item whose "
                  "schema accepts none, or a reference to itself only)");
    for (int32_t a : n.alternatives)
      todo.push_back(a);
    if (n.kind == Node::Kind::Typed) {
      if (n.types & JsonSchema::Object) {
        for (int32_t p : n.properties)
          todo.push_back(p);
        if (n.additional >= 0)
          todo.push_back(n.additional);
      }
      if ((n.types & JsonSchema::Array) && n.maxItems > 0)
        todo.push_back(n.items);
    }
  }
  return Status::ok();
}

Expected<std::shared_ptr<const JsonSchema>>
JsonSchema::compile(const Value &schema, const std::string &where) {
  return compile(schema, where, "");
}

Expected<std::shared_ptr<const JsonSchema>>
JsonSchema::compile(const Value &document, const std::string &where,
                    const std::string &pointer) {
  SchemaCompiler c(document, where);
  // The fixed nodes: any value; true / false; null.
  JsonSchema::Node any;
  any.where = "(any value)";
  c.out.nodes_.push_back(any);
  JsonSchema::Node boolean;
  boolean.kind = JsonSchema::Node::Kind::Enum;
  boolean.literals = {"true", "false"};
  c.out.nodes_.push_back(boolean);
  JsonSchema::Node null;
  null.kind = JsonSchema::Node::Kind::Enum;
  null.literals = {"null"};
  c.out.nodes_.push_back(null);
  const Value *schema = c.locate(pointer);
  if (!schema)
    return Error(where, "#" + pointer, "names nothing in the document");
  Expected<int32_t> root = c.compile(*schema, pointer);
  if (!root)
    return root.error();
  c.out.root_ = *root;
  if (Status st = c.checkSatisfiable(); !st)
    return st.error();
  return std::make_shared<const JsonSchema>(std::move(c.out));
}

//===----------------------------------------------------------------------===//
// The recogniser.
//===----------------------------------------------------------------------===//

namespace {

bool isSpace(uint8_t b) { return reply::isSpace(char(b)); }

/// The next count of items or characters: kept at `least` once it is
/// reached where nothing bounds it above, so that states recur.
uint32_t bump(uint32_t count, uint32_t least, uint32_t most) {
  return most == UINT32_MAX && count >= least ? count : count + 1;
}

} // namespace

SchemaPrefix::SchemaPrefix(std::shared_ptr<const JsonSchema> schema)
    : schema_(std::move(schema)) {
  Thread t(2);
  t[0].node = -1;
  t[0].mode = Mode::Done; // reached once the value above it is whole
  t[1].node = schema_->root();
  threads_.push_back(std::move(t));
  first_.fill(-1);
}

bool SchemaPrefix::startValue(Thread &t, uint8_t b) const {
  Frame &f = t.back();
  const JsonSchema::Node &n = schema_->node(f.node);
  auto literal = [&](int32_t node, size_t values) {
    f.node = node;
    f.mode = Mode::Literal;
    f.count = 0;
    f.cand = SchemaBits{};
    for (size_t i = 0; i < values; ++i)
      f.cand.set(i);
  };
  if (n.kind == JsonSchema::Node::Kind::Enum) {
    literal(f.node, n.literals.size());
    return true; // the caller steps the literal by b
  }
  switch (b) {
  case '{':
    if (!(n.types & JsonSchema::Object))
      return false;
    f.mode = Mode::ObjectFirst;
    return true;
  case '[':
    if (!(n.types & JsonSchema::Array))
      return false;
    f.mode = Mode::ArrayFirst;
    return true;
  case '"':
    if (!(n.types & JsonSchema::String))
      return false;
    f.mode = Mode::String;
    if (n.pattern)
      f.re = n.pattern->start();
    return true;
  case 't':
  case 'f':
    if (!(n.types & JsonSchema::Boolean))
      return false;
    literal(JsonSchema::kBoolean, 2);
    return true;
  case 'n':
    if (!(n.types & JsonSchema::Null))
      return false;
    literal(JsonSchema::kNull, 1);
    return true;
  default:
    if (!(n.types & (JsonSchema::Integer | JsonSchema::Number)))
      return false;
    f.mode = Mode::Number;
    f.number = JsonNumber::Start;
    f.magnitude = 0;
    f.negative = false;
    f.whole = f.fraction = 0;
    return true;
  }
}

bool SchemaPrefix::integerWithin(const Frame &f, const JsonSchema::Node &n) {
  if (!n.bounded)
    return true;
  const int64_t v = f.negative ? -f.magnitude : f.magnitude;
  return v >= n.least && v <= n.most && (!n.multiple || v % n.multiple == 0);
}

bool SchemaPrefix::decimalWithin(const Frame &f, const JsonSchema::Node &n) {
  if (!jsonNumberWhole(f.number))
    return false;
  const __int128 v =
      __int128(f.magnitude) * pow10(JsonSchema::kMaxNumberDigits - f.fraction);
  const __int128 signed_ = f.negative ? -v : v;
  return signed_ >= n.decimalLeast && signed_ <= n.decimalMost &&
         (!n.multiple ||
          v % (__int128(n.multiple) * pow10(JsonSchema::kMaxNumberDigits)) ==
              0);
}

bool SchemaPrefix::decimalLeadsIn(const Frame &f, const JsonSchema::Node &n) {
  return decimalMeets(f.number, f.negative, f.magnitude, f.whole, f.fraction,
                      n.decimalLeast, n.decimalMost, n.multiple);
}

bool SchemaPrefix::integerLeadsIn(const Frame &f, const JsonSchema::Node &n) {
  // What the digits so far can still become: "-" zero ("-0") or any
  // negative; "0" or "-0" only zero; digits D, D * 10^m + [0, 10^m) for
  // m = 0, 1, .. (negated after '-') while they are at most 18 digits. The
  // bounds are multiples of `multiple` where one is set, so "-" leads in
  // wherever the least is at most 0.
  const __int128 lo = n.least, hi = n.most;
  const __int128 step = n.multiple ? n.multiple : 1;
  if (f.number == JsonNumber::Minus)
    return lo <= 0;
  if (f.number == JsonNumber::Zero)
    return lo <= 0 && hi >= 0;
  __int128 base = f.magnitude, span = 1;
  for (; base <= JsonSchema::kMaxBoundedInteger; base *= 10, span *= 10) {
    const __int128 a = f.negative ? -(base + span - 1) : base;
    const __int128 b = f.negative ? -base : base + span - 1;
    if (gridMeets(a, b, step, lo, hi))
      return true;
  }
  return false;
}

JsonStringByte SchemaPrefix::stringByte(Frame &f, const JsonSchema::Node &n,
                                        uint8_t b) {
  const bool bounded = n.minLength > 0 || n.maxLength != UINT32_MAX;
  const JsonString::Mode before = f.str.mode;
  const JsonStringByte r = jsonStringStep(f.str, b, !bounded && !n.pattern);
  if (r == JsonStringByte::Refused)
    return r;
  if (n.pattern) {
    // The character each byte completes, through the pattern.
    if (r == JsonStringByte::Closed)
      return n.pattern->accepts(f.re) ? r : JsonStringByte::Refused;
    bool whole = false;
    if (before == JsonString::Mode::Chars) {
      f.code = b == '\\' ? 0 : b < 0x80 ? b : b & (0x3F >> f.str.count);
      whole = b != '\\' && b < 0x80;
    } else if (before == JsonString::Mode::Utf8) {
      f.code = f.code << 6 | (b & 0x3F);
      whole = f.str.mode == JsonString::Mode::Chars;
    } else if (before == JsonString::Mode::Escape) {
      static constexpr std::string_view kFrom = "\"\\/bfnrt",
                                        kTo = "\"\\/\b\f\n\r\t";
      whole = b != 'u';
      f.code = whole ? uint8_t(kTo[kFrom.find(char(b))]) : 0;
    } else { // a hex digit of \uXXXX
      f.code =
          f.code * 16 + uint32_t(b <= '9' ? b - '0' : (b | 0x20) - 'a' + 10);
      whole = f.str.mode == JsonString::Mode::Chars;
    }
    if (whole) {
      f.re = n.pattern->step(f.re, f.code);
      f.code = 0;
      return f.re.any() ? r : JsonStringByte::Refused;
    }
    // Part of a character: some code point it can still be must come
    // next (never a surrogate).
    uint32_t lo = 0, hi = 0;
    if (f.str.mode == JsonString::Mode::Utf8) {
      const uint32_t shift = 6 * (f.str.count - 1u);
      lo = (f.code << 6 | (f.str.lo & 0x3Fu)) << shift;
      hi = (f.code << 6 | (f.str.hi & 0x3Fu)) << shift | ((1u << shift) - 1);
    } else if (f.str.mode == JsonString::Mode::Escape) {
      hi = 0xFFFF;
    } else { // \u and the hex digits so far
      const uint32_t shift = 4 * f.str.count;
      lo = f.code << shift;
      hi = lo | ((1u << shift) - 1);
    }
    const SchemaPattern &pat = *n.pattern;
    const bool can =
        (lo <= 0xD7FF && pat.canTake(f.re, lo, std::min(hi, 0xD7FFu))) ||
        (hi >= 0xE000 && pat.canTake(f.re, std::max(lo, 0xE000u), hi));
    return can ? r : JsonStringByte::Refused;
  }
  if (r == JsonStringByte::Closed && f.count < n.minLength)
    return JsonStringByte::Refused;
  if (r == JsonStringByte::Begins) {
    if (f.count >= n.maxLength)
      return JsonStringByte::Refused;
    f.count = bump(f.count, n.minLength, n.maxLength);
  }
  return r;
}

SchemaPrefix::Step SchemaPrefix::step(Thread &t, uint8_t b,
                                      std::vector<Thread> &forks) const {
  for (;;) {
    Frame &f = t.back();
    if (f.mode == Mode::Done)
      return isSpace(b) ? Step::Taken : Step::Refused;
    const JsonSchema::Node &n = schema_->node(f.node);
    auto push = [&](int32_t child) {
      if (t.size() >= kMaxDepth)
        return false;
      Frame c;
      c.node = child;
      t.push_back(c);
      return true;
    };
    switch (f.mode) {
    case Mode::Done:
      break;
    case Mode::Value:
      if (isSpace(b))
        return Step::Taken;
      if (n.kind == JsonSchema::Node::Kind::AnyOf) {
        if (n.alternatives.size() == 1) {
          f.node = n.alternatives[0];
          continue;
        }
        // Each alternative goes on as a thread of its own.
        for (int32_t a : n.alternatives) {
          Thread copy = t;
          copy.back().node = a;
          if (step(copy, b, forks) == Step::Taken)
            forks.push_back(std::move(copy));
        }
        return Step::Forked;
      }
      if (!startValue(t, b))
        return Step::Refused;
      if (f.mode == Mode::Literal || f.mode == Mode::Number)
        continue; // b is their first byte
      return Step::Taken;
    case Mode::Literal: {
      SchemaBits keep;
      bool whole = false, longer = false;
      for (size_t i = 0; i < n.literals.size(); ++i) {
        if (!f.cand.test(i))
          continue;
        const std::string &lit = n.literals[i];
        if (lit.size() > f.count && uint8_t(lit[f.count]) == b) {
          keep.set(i);
          longer = longer || lit.size() > f.count + 1;
        } else if (lit.size() == f.count) {
          whole = true;
        }
      }
      if (!keep.any()) {
        if (!whole)
          return Step::Refused;
        t.pop_back(); // the value ended before b
        continue;
      }
      f.cand = keep;
      ++f.count;
      if (!longer)
        t.pop_back(); // nothing longer can follow: the value is whole
      return Step::Taken;
    }
    case Mode::Number:
      if (!(n.decimal && (b == 'e' || b == 'E')) &&
          jsonNumberStep(f.number, b, !(n.types & JsonSchema::Number))) {
        if (n.decimal) {
          // A bounded number: at most kMaxNumberDigits digits (a lone
          // leading 0 aside), no exponent, still leading into the bounds.
          if (b == '-') {
            f.negative = true;
          } else if (b >= '0' && b <= '9' && f.number != JsonNumber::Zero) {
            if (f.whole + f.fraction >= JsonSchema::kMaxNumberDigits)
              return Step::Refused;
            f.magnitude = f.magnitude * 10 + (b - '0');
            ++(f.number == JsonNumber::Fraction ? f.fraction : f.whole);
          }
          return decimalLeadsIn(f, n) ? Step::Taken : Step::Refused;
        }
        if (!n.bounded)
          return Step::Taken;
        // A bounded integer: its digits so far must still lead into the
        // bounds.
        if (b == '-')
          f.negative = true;
        else if (f.magnitude > JsonSchema::kMaxBoundedInteger / 10)
          return Step::Refused; // past 18 digits
        else
          f.magnitude = f.magnitude * 10 + (b - '0');
        return integerLeadsIn(f, n) ? Step::Taken : Step::Refused;
      }
      if (!jsonNumberWhole(f.number) || !numberWithin(f, n))
        return Step::Refused;
      t.pop_back(); // the number ended before b
      continue;
    case Mode::String:
      switch (stringByte(f, n, b)) {
      case JsonStringByte::Refused:
        return Step::Refused;
      case JsonStringByte::Closed:
        t.pop_back();
        return Step::Taken;
      default:
        return Step::Taken;
      }
    case Mode::ObjectFirst:
    case Mode::ObjectKey:
    case Mode::ObjectAfter: {
      if (isSpace(b))
        return Step::Taken;
      const bool more = n.additional >= 0 || n.every.without(f.seen).any();
      if (b == '}' && f.mode != Mode::ObjectKey) {
        if (!f.seen.covers(n.required))
          return Step::Refused;
        t.pop_back();
        return Step::Taken;
      }
      if (f.mode == Mode::ObjectAfter) {
        if (b != ',' || !more)
          return Step::Refused;
        f.mode = Mode::ObjectKey;
        return Step::Taken;
      }
      if (b != '"' || !more)
        return Step::Refused;
      f.mode = Mode::Key;
      f.str = JsonString{};
      f.count = 0;
      f.cand = n.additional < 0 ? n.every.without(f.seen) : n.every;
      return Step::Taken;
    }
    case Mode::Key: {
      if (b == '\\')
        return Step::Refused; // keys are written without escapes
      const JsonStringByte r = jsonStringStep(f.str, b);
      if (r == JsonStringByte::Refused)
        return Step::Refused;
      if (r == JsonStringByte::Closed) {
        int32_t match = -1;
        for (size_t i = 0; i < n.names.size(); ++i)
          if (f.cand.test(i) && n.names[i].size() == f.count)
            match = int32_t(i);
        if (match >= 0) {
          if (f.seen.test(size_t(match)))
            return Step::Refused; // a key read before
          f.seen.set(size_t(match));
        } else if (n.additional < 0) {
          return Step::Refused;
        }
        f.member = match;
        f.mode = Mode::Colon;
        f.str = JsonString{};
        f.count = 0;
        f.cand = SchemaBits{};
        return Step::Taken;
      }
      if (!f.cand.any()) // another key, past every name
        return Step::Taken;
      SchemaBits keep;
      for (size_t i = 0; i < n.names.size(); ++i)
        if (f.cand.test(i) && n.names[i].size() > f.count &&
            uint8_t(n.names[i][f.count]) == b)
          keep.set(i);
      f.cand = keep;
      if (!keep.any()) {
        if (n.additional < 0)
          return Step::Refused;
        f.count = 0; // no name matches: the count no longer matters
        return Step::Taken;
      }
      ++f.count;
      return Step::Taken;
    }
    case Mode::Colon: {
      if (isSpace(b))
        return Step::Taken;
      if (b != ':')
        return Step::Refused;
      const int32_t child =
          f.member >= 0 ? n.properties[size_t(f.member)] : n.additional;
      f.mode = Mode::ObjectAfter;
      f.member = -1;
      return push(child) ? Step::Taken : Step::Refused;
    }
    case Mode::ArrayFirst:
      if (isSpace(b))
        return Step::Taken;
      if (b == ']') {
        if (n.minItems > 0)
          return Step::Refused;
        t.pop_back();
        return Step::Taken;
      }
      if (n.maxItems == 0)
        return Step::Refused;
      f.mode = Mode::ArrayAfter;
      f.count = bump(0, n.minItems, n.maxItems);
      if (!push(n.items))
        return Step::Refused;
      continue; // b begins the first item
    case Mode::ArrayAfter:
      if (isSpace(b))
        return Step::Taken;
      if (b == ']') {
        if (f.count < n.minItems)
          return Step::Refused;
        t.pop_back();
        return Step::Taken;
      }
      if (b != ',' || f.count >= n.maxItems)
        return Step::Refused;
      f.count = bump(f.count, n.minItems, n.maxItems);
      return push(n.items) ? Step::Taken : Step::Refused;
    }
    return Step::Refused;
  }
}

size_t SchemaPrefix::stepLive(std::vector<Thread> &threads, size_t live,
                              uint8_t b) const {
  std::vector<Thread> forks;
  size_t n = 0;
  for (size_t i = 0; i < live; ++i) {
    if (step(threads[i], b, forks) != Step::Taken)
      continue;
    if (i != n)
      std::swap(threads[n], threads[i]);
    ++n;
  }
  for (Thread &f : forks) {
    if (n < threads.size())
      threads[n] = std::move(f);
    else
      threads.push_back(std::move(f));
    ++n;
  }
  return n;
}

size_t SchemaPrefix::stepBytes(std::vector<Thread> &threads, size_t live,
                               std::string_view bytes) const {
  for (char c : bytes) {
    live = stepLive(threads, live, uint8_t(c));
    if (live == 0 || live > kMaxThreads)
      return 0;
  }
  return live;
}

bool SchemaPrefix::acceptsFresh(std::string_view bytes) const {
  std::vector<Thread> &scratch = scratch_.v;
  if (scratch.size() < threads_.size())
    scratch.resize(threads_.size());
  for (size_t i = 0; i < threads_.size(); ++i)
    scratch[i] = threads_[i];
  return stepBytes(scratch, threads_.size(), bytes) > 0;
}

bool SchemaPrefix::accepts(std::string_view bytes) const {
  if (bytes.empty())
    return true;
  // Most tokens are refused at their first byte: that is decided once a
  // state for each byte.
  int8_t &first = first_[uint8_t(bytes[0])];
  if (first < 0)
    first = acceptsFresh(bytes.substr(0, 1));
  if (!first)
    return false;
  if (bytes.size() == 1)
    return true;
  // Inside a string (most steps of a long one), a token that stays inside
  // it is read on the string's own state; one that closes it takes the
  // general path.
  if (threads_.size() == 1 && threads_[0].back().mode == Mode::String) {
    Frame f = threads_[0].back();
    const JsonSchema::Node &n = schema_->node(f.node);
    size_t i = 0;
    for (; i < bytes.size(); ++i) {
      const JsonStringByte r = stringByte(f, n, uint8_t(bytes[i]));
      if (r == JsonStringByte::Refused)
        return false;
      if (r == JsonStringByte::Closed)
        break;
    }
    if (i == bytes.size())
      return true;
  }
  return acceptsFresh(bytes);
}

bool SchemaPrefix::push(std::string_view bytes) {
  std::vector<Thread> threads = threads_;
  const size_t live = stepBytes(threads, threads.size(), bytes);
  if (live == 0)
    return false;
  threads.resize(live);
  threads_ = std::move(threads);
  settle();
  return true;
}

bool SchemaPrefix::take(uint8_t b) {
  const char c = char(b);
  const size_t live = stepBytes(threads_, threads_.size(), {&c, 1});
  threads_.resize(live);
  if (live == 0)
    return false;
  settle();
  return true;
}

void SchemaPrefix::settle() {
  if (threads_.size() > 1)
    dedupe(); // alternatives that reached the same state are one
  first_.fill(-1);
}

void SchemaPrefix::dedupe() {
  std::vector<std::pair<std::string, size_t>> keys;
  for (size_t i = 0; i < threads_.size(); ++i) {
    std::string k;
    appendKey(k, threads_[i]);
    keys.emplace_back(std::move(k), i);
  }
  std::sort(keys.begin(), keys.end());
  std::vector<Thread> kept;
  for (size_t i = 0; i < keys.size(); ++i)
    if (i == 0 || keys[i].first != keys[i - 1].first)
      kept.push_back(std::move(threads_[keys[i].second]));
  threads_ = std::move(kept);
}

bool SchemaPrefix::complete() const {
  for (const Thread &t : threads_) {
    if (t.size() == 1)
      return true; // Done
    if (t.size() != 2)
      continue;
    // The value may end at the end of the text: a number, or an enum value
    // that a longer one could still continue.
    const Frame &f = t.back();
    if (f.mode == Mode::Number && jsonNumberWhole(f.number) &&
        numberWithin(f, schema_->node(f.node)))
      return true;
    if (f.mode == Mode::Literal) {
      const JsonSchema::Node &n = schema_->node(f.node);
      for (size_t i = 0; i < n.literals.size(); ++i)
        if (f.cand.test(i) && n.literals[i].size() == f.count)
          return true;
    }
  }
  return false;
}

bool SchemaPrefix::final() const {
  for (const Thread &t : threads_)
    if (t.size() != 1)
      return false;
  return !threads_.empty();
}

void SchemaPrefix::appendKey(std::string &k, const Thread &t) {
  auto put = [&k](const auto &v) {
    k.append(reinterpret_cast<const char *>(&v), sizeof(v));
  };
  put(uint32_t(t.size()));
  for (const Frame &f : t) {
    put(f.node);
    put(uint8_t(f.mode));
    put(uint8_t(f.number));
    put(uint8_t(f.str.mode));
    put(f.str.count);
    put(f.str.lo);
    put(f.str.hi);
    put(f.count);
    put(f.member);
    put(f.seen.w[0]);
    put(f.seen.w[1]);
    put(f.cand.w[0]);
    put(f.cand.w[1]);
    put(f.magnitude);
    put(uint8_t(f.negative));
    put(f.whole);
    put(f.fraction);
    for (uint64_t w : f.re.w)
      put(w);
    put(f.code);
  }
}

std::string SchemaPrefix::key() const {
  // threads_ is kept sorted by its threads' keys (push), so equal sets of
  // alternatives give equal keys.
  std::string k;
  for (const Thread &t : threads_)
    appendKey(k, t);
  return k;
}

} // namespace kiln::chat
