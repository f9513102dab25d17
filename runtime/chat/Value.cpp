//===- Value.cpp - Values a chat template computes with ------------------===//
#include "chat/Value.h"

#include "chat/PyText.h"

#include <algorithm>
#include <cmath>

namespace kiln::chat {

namespace {
const std::string kEmpty;
const ValueList kEmptyList;
const ValueMap kEmptyMap;
} // namespace

Value::Value(std::string text)
    : kind_(Kind::String),
      text_(std::make_shared<const std::string>(std::move(text))) {}

Value Value::undefined(std::string hint) {
  Value v;
  if (!hint.empty())
    v.text_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::None;
  return v;
}

Value Value::boolean(bool value) {
  Value v;
  v.kind_ = Kind::Bool;
  v.int_ = value ? 1 : 0;
  return v;
}

Value Value::integer(int64_t value) {
  Value v;
  v.kind_ = Kind::Int;
  v.int_ = value;
  return v;
}

Value Value::number(double value) {
  Value v;
  v.kind_ = Kind::Float;
  v.float_ = value;
  return v;
}

Value Value::list(ValueList items) {
  Value v;
  v.kind_ = Kind::List;
  uint32_t deepest = 0;
  for (const Value &item : items)
    deepest = std::max(deepest, item.depth());
  v.depth_ = deepest + 1;
  v.list_ = std::make_shared<const ValueList>(std::move(items));
  return v;
}

Value Value::tuple(ValueList items) {
  Value v = list(std::move(items));
  v.flavor_ = Flavor::Tuple;
  return v;
}

Value Value::view(ValueList items, std::string pythonType) {
  Value v = list(std::move(items));
  v.flavor_ = Flavor::View;
  v.text_ = std::make_shared<const std::string>(std::move(pythonType));
  return v;
}

Value Value::map(ValueMap entries) {
  Value v;
  v.kind_ = Kind::Map;
  uint32_t deepest = 0;
  for (const auto &entry : entries)
    deepest = std::max(deepest, entry.second.depth());
  v.depth_ = deepest + 1;
  v.map_ = std::make_shared<const ValueMap>(std::move(entries));
  return v;
}

Value Value::nameSpace(ValueMap entries) {
  Value v;
  v.kind_ = Kind::Namespace;
  v.attributes_ = std::make_shared<ValueMap>(std::move(entries));
  return v;
}

Value Value::macro(std::string name, int64_t id) {
  Value v;
  v.kind_ = Kind::Macro;
  v.int_ = id;
  v.text_ = std::make_shared<const std::string>(std::move(name));
  return v;
}

void Value::setAttribute(std::string name, Value value) const {
  if (isNamespace())
    attributes_->set(std::move(name), std::move(value));
}

const std::string &Value::macroName() const {
  return isMacro() && text_ ? *text_ : kEmpty;
}

const std::string &Value::asString() const {
  return isString() && text_ ? *text_ : kEmpty;
}
const ValueList &Value::asList() const {
  return isList() && list_ ? *list_ : kEmptyList;
}
const ValueMap &Value::asMap() const {
  if (isNamespace())
    return *attributes_;
  return isMap() && map_ ? *map_ : kEmptyMap;
}
const std::string &Value::undefinedHint() const {
  return isUndefined() && text_ ? *text_ : kEmpty;
}

bool Value::truthy() const {
  switch (kind_) {
  case Kind::Undefined:
  case Kind::None:
    return false;
  case Kind::Bool:
  case Kind::Int:
    return int_ != 0;
  case Kind::Float:
    return float_ != 0;
  case Kind::String:
    return !asString().empty();
  case Kind::List:
    return !asList().empty();
  case Kind::Map:
    return !asMap().empty();
  case Kind::Namespace:
  case Kind::Macro:
    return true; // objects, as Python's default truth
  }
  return false;
}

std::string_view Value::typeName() const {
  switch (kind_) {
  case Kind::Undefined:
    return "Undefined";
  case Kind::None:
    return "NoneType";
  case Kind::Bool:
    return "bool";
  case Kind::Int:
    return "int";
  case Kind::Float:
    return "float";
  case Kind::String:
    return "str";
  case Kind::List:
    if (flavor_ == Flavor::View && text_)
      return *text_;
    return flavor_ == Flavor::Tuple ? "tuple" : "list";
  case Kind::Map:
    return "dict";
  case Kind::Namespace:
    return "Namespace";
  case Kind::Macro:
    return "Macro";
  }
  return "?";
}

bool Value::sameObject(const Value &other) const {
  if (kind_ != other.kind_)
    return false;
  if (isList())
    return list_ == other.list_ && flavor_ == other.flavor_;
  if (isMap())
    return map_ == other.map_;
  if (isString())
    return text_ == other.text_;
  if (isNamespace())
    return attributes_ == other.attributes_;
  if (isMacro())
    return int_ == other.int_;
  return false;
}

void ValueMap::set(std::string key, Value value) {
  auto found = index_.find(key);
  if (found != index_.end()) {
    entries_[found->second].second = std::move(value);
    return;
  }
  index_.emplace(key, entries_.size());
  entries_.emplace_back(std::move(key), std::move(value));
}

const Value *ValueMap::find(std::string_view key) const {
  auto found = index_.find(std::string(key));
  return found == index_.end() ? nullptr : &entries_[found->second].second;
}

std::optional<bool> pyEquals(const Value &a, const Value &b, uint64_t &budget) {
  if (budget == 0)
    return std::nullopt;
  --budget;
  if (a.isNumber() && b.isNumber()) {
    if (a.isIntegral() && b.isIntegral())
      return a.asInt() == b.asInt();
    return a.asFloat() == b.asFloat();
  }
  if (a.kind() != b.kind())
    return false;
  switch (a.kind()) {
  case Value::Kind::Undefined:
  case Value::Kind::None:
    return true;
  case Value::Kind::String:
    return a.asString() == b.asString();
  case Value::Kind::List: {
    if (!a.sameFlavor(b))
      return false;
    if (a.sameObject(b))
      return true;
    const ValueList &x = a.asList(), &y = b.asList();
    if (x.size() != y.size())
      return false;
    for (size_t i = 0; i < x.size(); ++i) {
      if (x[i].sameObject(y[i]))
        continue;
      std::optional<bool> same = pyEquals(x[i], y[i], budget);
      if (!same || !*same)
        return same;
    }
    return true;
  }
  case Value::Kind::Map: {
    if (a.sameObject(b))
      return true;
    const ValueMap &x = a.asMap(), &y = b.asMap();
    if (x.size() != y.size())
      return false;
    for (const auto &[key, value] : x) {
      const Value *other = y.find(key);
      if (!other)
        return false;
      std::optional<bool> same = pyEquals(value, *other, budget);
      if (!same || !*same)
        return same;
    }
    return true;
  }
  case Value::Kind::Namespace:
  case Value::Kind::Macro:
    return a.sameObject(b); // objects: identity, as Python's default
  default:
    return false; // numbers were handled above
  }
}

namespace {

/// Appends text up to a byte limit; remembers that it overflowed.
class LimitedText {
public:
  explicit LimitedText(size_t maxBytes) : maxBytes_(maxBytes) {}
  void add(std::string_view piece) {
    if (overflow_ || problem_)
      return;
    if (piece.size() > maxBytes_ - text_.size()) {
      overflow_ = true;
      return;
    }
    text_.append(piece);
  }
  bool overflow() const { return overflow_ || problem_; }
  /// Gives up with a problem of its own.
  void fail(std::string problem) {
    if (!problem_)
      problem_ = std::move(problem);
  }
  Expected<std::string> take(std::string_view what) {
    if (problem_)
      return Error("", "", *problem_);
    if (overflow_)
      return Error("", "",
                   std::string(what) + " longer than the limit of " +
                       std::to_string(maxBytes_) + " bytes");
    return std::move(text_);
  }

private:
  size_t maxBytes_;
  std::string text_;
  bool overflow_ = false;
  std::optional<std::string> problem_;
};

void appendRepr(LimitedText &out, const Value &value) {
  if (out.overflow())
    return;
  switch (value.kind()) {
  case Value::Kind::Undefined:
    out.add("Undefined");
    return;
  case Value::Kind::None:
    out.add("None");
    return;
  case Value::Kind::Bool:
    out.add(value.asBool() ? "True" : "False");
    return;
  case Value::Kind::Int:
    out.add(std::to_string(value.asInt()));
    return;
  case Value::Kind::Float:
    out.add(pytext::formatFloat(value.asFloat()));
    return;
  case Value::Kind::String:
    out.add(pytext::repr(value.asString()));
    return;
  case Value::Kind::List: {
    if (value.isView()) {
      out.fail("unsupported: printing a '" + std::string(value.typeName()) +
               "' object (Python does not print it as a list); iterate over "
               "it or apply | list");
      return;
    }
    const ValueList &items = value.asList();
    out.add(value.isTuple() ? "(" : "[");
    for (size_t i = 0; i < items.size(); ++i) {
      if (i)
        out.add(", ");
      appendRepr(out, items[i]);
    }
    if (value.isTuple() && items.size() == 1)
      out.add(",");
    out.add(value.isTuple() ? ")" : "]");
    return;
  }
  case Value::Kind::Map:
  case Value::Kind::Namespace: {
    // jinja2's Namespace prints its attributes as a dict: <Namespace {...}>.
    const bool ns = value.isNamespace();
    out.add(ns ? "<Namespace {" : "{");
    bool first = true;
    for (const auto &[key, item] : value.asMap()) {
      if (!first)
        out.add(", ");
      first = false;
      out.add(pytext::repr(key));
      out.add(": ");
      appendRepr(out, item);
    }
    out.add(ns ? "}>" : "}");
    return;
  }
  case Value::Kind::Macro:
    out.add("<Macro " + pytext::repr(value.macroName()) + ">");
    return;
  }
}

} // namespace

Expected<std::string> pyRepr(const Value &value, size_t maxBytes) {
  LimitedText out(maxBytes);
  appendRepr(out, value);
  return out.take("repr()");
}

Expected<std::string> pyStr(const Value &value, size_t maxBytes) {
  if (value.isUndefined())
    return std::string();
  if (value.isString()) {
    if (value.asString().size() > maxBytes)
      return Error("", "", "string longer than the limit of " +
                               std::to_string(maxBytes) + " bytes");
    return value.asString();
  }
  return pyRepr(value, maxBytes);
}

namespace {

struct JsonWriter {
  const JsonOptions &options;
  LimitedText &out;
  std::string itemSep, keySep;
  std::optional<std::string> problem;

  void newline(int level) {
    out.add("\n");
    for (int i = 0; i < level; ++i)
      out.add(*options.indent);
  }

  void write(const Value &value, int level) {
    if (problem || out.overflow())
      return;
    switch (value.kind()) {
    case Value::Kind::Undefined:
      problem = "Object of type Undefined is not JSON serializable";
      return;
    case Value::Kind::None:
      out.add("null");
      return;
    case Value::Kind::Bool:
      out.add(value.asBool() ? "true" : "false");
      return;
    case Value::Kind::Int:
      out.add(std::to_string(value.asInt()));
      return;
    case Value::Kind::Float: {
      const double d = value.asFloat();
      if (std::isnan(d))
        out.add("NaN");
      else if (std::isinf(d))
        out.add(d < 0 ? "-Infinity" : "Infinity");
      else
        out.add(pytext::formatFloat(d));
      return;
    }
    case Value::Kind::String:
      out.add(pytext::jsonQuote(value.asString(), options.ensureAscii));
      return;
    case Value::Kind::List: {
      if (value.isView()) {
        problem = "Object of type " + std::string(value.typeName()) +
                  " is not JSON serializable";
        return;
      }
      const ValueList &items = value.asList();
      if (items.empty()) {
        out.add("[]");
        return;
      }
      out.add("[");
      if (options.indent)
        newline(level + 1);
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) {
          out.add(itemSep);
          if (options.indent)
            newline(level + 1);
        }
        write(items[i], level + 1);
      }
      if (options.indent)
        newline(level);
      out.add("]");
      return;
    }
    case Value::Kind::Namespace:
    case Value::Kind::Macro:
      problem = "Object of type " + std::string(value.typeName()) +
                " is not JSON serializable";
      return;
    case Value::Kind::Map: {
      const ValueMap &map = value.asMap();
      if (map.empty()) {
        out.add("{}");
        return;
      }
      std::vector<const ValueMap::Entry *> entries;
      for (const auto &entry : map)
        entries.push_back(&entry);
      if (options.sortKeys)
        // Keys are unique; UTF-8 byte order is code point order.
        std::sort(entries.begin(), entries.end(),
                  [](const ValueMap::Entry *a, const ValueMap::Entry *b) {
                    return a->first < b->first;
                  });
      out.add("{");
      if (options.indent)
        newline(level + 1);
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) {
          out.add(itemSep);
          if (options.indent)
            newline(level + 1);
        }
        out.add(pytext::jsonQuote(entries[i]->first, options.ensureAscii));
        out.add(keySep);
        write(entries[i]->second, level + 1);
      }
      if (options.indent)
        newline(level);
      out.add("}");
      return;
    }
    }
  }
};

} // namespace

Expected<std::string> pyJsonDumps(const Value &value, const JsonOptions &options,
                                  size_t maxBytes) {
  LimitedText out(maxBytes);
  JsonWriter writer{options, out, options.indent ? "," : ", ", ": ", {}};
  if (options.separators) {
    writer.itemSep = options.separators->first;
    writer.keySep = options.separators->second;
  }
  writer.write(value, 0);
  if (writer.problem)
    return Error("", "", *writer.problem);
  return out.take("tojson output");
}

} // namespace kiln::chat
