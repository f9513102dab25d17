//===- Value.h - Values a chat template computes with -----------*- C++ -*-===//
//
// The data model of Kiln's Jinja subset: what jinja2 sees as Python objects.
// Undefined (jinja2's default Undefined), None, bool, int (64-bit here),
// float, str (UTF-8), list, and dict with string keys in insertion order.
// A list also stands for a tuple (printed as one) and for the iterables
// Python does not print as lists (range, dict views, generators: a "view",
// which can be iterated but not printed). Values are immutable and cheap to
// copy: strings and containers are shared. Two objects are not data: a
// namespace (jinja2's namespace(), the one mutable value: its attributes
// are shared by every copy, which is how a loop body sets them) and a macro
// (a reference to a {% macro %} the renderer holds).
//
// Every container records its nesting depth, so that code walking a value
// recursively can refuse values nested deeper than it allows.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_CHAT_VALUE_H
#define KILN_CHAT_VALUE_H

#include "support/Error.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kiln::chat {

class Value;
class ValueMap;
using ValueList = std::vector<Value>;

class Value {
public:
  enum class Kind : uint8_t {
    Undefined,
    None,
    Bool,
    Int,
    Float,
    String,
    List,
    Map,
    Namespace,
    Macro
  };

  /// Undefined, as a missing variable is.
  Value() = default;
  Value(std::string text);
  Value(std::string_view text) : Value(std::string(text)) {}
  Value(const char *text) : Value(std::string(text)) {}

  /// Undefined that remembers why (jinja2's message when it is misused,
  /// e.g. "'x' is undefined").
  static Value undefined(std::string hint);
  static Value none();
  static Value boolean(bool value);
  static Value integer(int64_t value);
  static Value number(double value);
  static Value list(ValueList items);
  /// A list that prints as a Python tuple ("(1, 2)") and is not equal to a
  /// list; otherwise it behaves as a list.
  static Value tuple(ValueList items);
  /// A list standing for a Python iterable that is not a list: `range`,
  /// `dict_keys`, `dict_values`, `dict_items`, `generator` (`pythonType`).
  /// It iterates, counts and tests membership like a list; printing it,
  /// indexing it, or combining it with operators is refused, because
  /// Python's results would differ from a list's.
  static Value view(ValueList items, std::string pythonType);
  static Value map(ValueMap entries);
  /// jinja2's namespace(): attributes `entries`, shared by every copy.
  static Value nameSpace(ValueMap entries);
  /// A macro named `name`, the renderer's macro number `id`.
  static Value macro(std::string name, int64_t id);

  Kind kind() const { return kind_; }
  bool isUndefined() const { return kind_ == Kind::Undefined; }
  bool isNone() const { return kind_ == Kind::None; }
  bool isBool() const { return kind_ == Kind::Bool; }
  bool isInt() const { return kind_ == Kind::Int; }
  bool isFloat() const { return kind_ == Kind::Float; }
  bool isString() const { return kind_ == Kind::String; }
  bool isList() const { return kind_ == Kind::List; }
  bool isMap() const { return kind_ == Kind::Map; }
  bool isNamespace() const { return kind_ == Kind::Namespace; }
  bool isMacro() const { return kind_ == Kind::Macro; }
  bool isTuple() const { return kind_ == Kind::List && flavor_ == Flavor::Tuple; }
  bool isView() const { return kind_ == Kind::List && flavor_ == Flavor::View; }
  /// Lists of one flavor: both plain lists, both tuples, or both views.
  bool sameFlavor(const Value &other) const { return flavor_ == other.flavor_; }
  /// int or bool (Python's bool is an int).
  bool isIntegral() const { return isInt() || isBool(); }
  /// int, bool or float (Python's numbers.Number).
  bool isNumber() const { return isIntegral() || isFloat(); }

  bool asBool() const { return int_ != 0; }
  /// The integer value of an int or bool.
  int64_t asInt() const { return int_; }
  /// The value of any number as a double.
  double asFloat() const { return isFloat() ? float_ : static_cast<double>(int_); }
  const std::string &asString() const;
  const ValueList &asList() const;
  /// A dict's entries, or a namespace's attributes.
  const ValueMap &asMap() const;
  /// Sets a namespace's attribute (seen by every copy of the namespace).
  void setAttribute(std::string name, Value value) const;
  /// A macro's name and number.
  const std::string &macroName() const;
  int64_t macroId() const { return int_; }
  /// Why an undefined value is undefined ("" when not known).
  const std::string &undefinedHint() const;

  /// Container nesting: 0 for a scalar, 1 + the deepest element otherwise.
  uint32_t depth() const { return depth_; }

  /// Python's truth value (undefined is false).
  bool truthy() const;

  /// Python's type name, for messages ("str", "int", "dict", "NoneType").
  std::string_view typeName() const;

  /// The same shared container (for cheap identity tests).
  bool sameObject(const Value &other) const;

private:
  enum class Flavor : uint8_t { List, Tuple, View };
  Kind kind_ = Kind::Undefined;
  Flavor flavor_ = Flavor::List;
  uint32_t depth_ = 0;
  int64_t int_ = 0;
  double float_ = 0;
  std::shared_ptr<const std::string> text_; // string, undefined's hint, view's type
  std::shared_ptr<const ValueList> list_;
  std::shared_ptr<const ValueMap> map_;
  std::shared_ptr<ValueMap> attributes_; // a namespace's
};

/// A dict: string keys, insertion order kept; setting an existing key
/// replaces its value in place (as Python does).
class ValueMap {
public:
  using Entry = std::pair<std::string, Value>;

  void set(std::string key, Value value);
  const Value *find(std::string_view key) const;
  bool contains(std::string_view key) const { return find(key) != nullptr; }
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  const std::vector<Entry> &entries() const { return entries_; }
  std::vector<Entry>::const_iterator begin() const { return entries_.begin(); }
  std::vector<Entry>::const_iterator end() const { return entries_.end(); }

private:
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> index_;
};

/// Python's `==` (1 == 1.0 == True; a tuple never equals a list; dicts
/// compare regardless of order; undefined equals only undefined). `budget`
/// bounds the element comparisons; nullopt when it runs out.
std::optional<bool> pyEquals(const Value &a, const Value &b, uint64_t &budget);

/// str(value) as Python writes it (jinja2's `{{ value }}`, `|string`):
/// strings as they are, None, True, 1, 1.5, lists and dicts as repr().
/// Undefined is "" at the top and "Undefined" inside a container. Fails
/// when the text would pass `maxBytes`.
Expected<std::string> pyStr(const Value &value, size_t maxBytes);

/// repr(value): as pyStr, but strings quoted.
Expected<std::string> pyRepr(const Value &value, size_t maxBytes);

/// json.dumps(value, ...) options, as HuggingFace's `tojson` passes them.
struct JsonOptions {
  /// indent=N (N spaces) or indent="..."; absent: one line.
  std::optional<std::string> indent;
  bool ensureAscii = false;
  bool sortKeys = false;
  /// separators=(item, key); absent: ", " and ": " without indent, "," and
  /// ": " with it (json.dumps's defaults).
  std::optional<std::pair<std::string, std::string>> separators;
};

/// json.dumps(value, ...). Undefined is not serializable (an error, as in
/// Python); NaN and infinities are written as Python does (NaN, Infinity).
Expected<std::string> pyJsonDumps(const Value &value, const JsonOptions &options,
                                  size_t maxBytes);

} // namespace kiln::chat

#endif // KILN_CHAT_VALUE_H
