//===- SchemaPrefix.h - A reply that must be JSON a schema accepts -*- C++
//-*-===//
//
// Constrained decoding by a JSON Schema (kiln-serve's response_format
// json_schema, kiln-run --json-schema). JsonSchema compiles a schema into
// nodes; SchemaPrefix is the byte-at-a-time recogniser the generator asks
// before each token: whether the bytes so far can still become a JSON text
// the schema accepts, and whether they are one.
//
// Supported: `type` (a name or a list), `properties`, `required`,
// `additionalProperties` (a schema or false; absent or true: any value),
// `items`, `minItems` / `maxItems`, `minLength` / `maxLength` (code points),
// `minimum` / `maximum` / `exclusiveMinimum` / `exclusiveMaximum` (the
// reply's digits kept within them as they come: an integer in at most 18
// digits; a number without an exponent, in at most 15 digits),
// `multipleOf` a whole number (likewise), `pattern`
// (SchemaPattern.h: a subset of ECMA-262, on a string without length bounds),
// `enum` and `const` (the reply spells the value as compact JSON), `anyOf`,
// a one-element `allOf`, `$ref` to "#" or a JSON pointer inside the
// document (recursion included), `$defs` / `definitions` as their targets.
// Annotations are ignored: title, description, default, examples,
// deprecated, readOnly, writeOnly, $schema, $id, $comment, and `format`
// (an annotation in JSON Schema 2020-12 unless a validator asserts it).
// Every other keyword (oneOf, not, uniqueItems, ...) is refused by name:
// ignoring it would let the reply break the schema.
//
// The reply's spelling is narrowed where that keeps the recogniser exact:
// object keys are written without escapes (a property name that would need
// one is refused), and strings with a length bound take no \u escape of a
// surrogate (so that each character begins where one code point does).
// Every node of the schema must accept some value (checked at compile
// time), so the reply can always be finished.
//
// anyOf is followed as alternatives side by side (at most kMaxThreads live
// at once), each a stack of frames; a JSON value nests at most kMaxDepth.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CHAT_SCHEMAPREFIX_H
#define KILN_RUNTIME_CHAT_SCHEMAPREFIX_H

#include "chat/JsonNumber.h"
#include "chat/JsonString.h"
#include "chat/ReplyConstraint.h"
#include "chat/SchemaPattern.h"
#include "chat/Value.h"
#include "support/Error.h"

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::chat {

/// A set of at most 128 properties or enum values.
struct SchemaBits {
  uint64_t w[2] = {0, 0};
  void set(size_t i) { w[i / 64] |= uint64_t(1) << (i % 64); }
  bool test(size_t i) const { return (w[i / 64] >> (i % 64)) & 1; }
  bool any() const { return (w[0] | w[1]) != 0; }
  /// Whether every member of `o` is in this set.
  bool covers(const SchemaBits &o) const {
    return (o.w[0] & ~w[0]) == 0 && (o.w[1] & ~w[1]) == 0;
  }
  SchemaBits without(const SchemaBits &o) const {
    SchemaBits r;
    r.w[0] = w[0] & ~o.w[0];
    r.w[1] = w[1] & ~o.w[1];
    return r;
  }
  bool operator==(const SchemaBits &o) const {
    return w[0] == o.w[0] && w[1] == o.w[1];
  }
};

class JsonSchema {
public:
  /// Most properties of one object, and most values of one enum.
  static constexpr size_t kMaxMembers = 128;
  /// Most schemas compiled inside one another, subschemas and $refs
  /// followed alike: the compiler recurses through them, and a schema is
  /// untrusted input (a chain of 200,000 $refs ran it out of stack).
  static constexpr int kMaxCompileDepth = 256;
  /// The largest magnitude of an integer with bounds (18 digits).
  static constexpr int64_t kMaxBoundedInteger = 999'999'999'999'999'999;
  /// A number with bounds is written without an exponent in at most 15
  /// digits (its integer digits, a lone leading 0 aside, and its fraction
  /// digits together): two such numbers are two doubles, so its decimal
  /// value compares with a bound's shortest decimal form as a validator's
  /// doubles compare.
  static constexpr int kMaxNumberDigits = 15;

  /// JSON types, as a node's mask.
  enum Type : uint8_t {
    Null = 1,
    Boolean = 2,
    Integer = 4,
    Number = 8,
    String = 16,
    Array = 32,
    Object = 64,
    AnyType = 127,
  };

  struct Node {
    enum class Kind : uint8_t {
      Typed, ///< any value of `types`, with their keywords
      Enum,  ///< one of `literals`
      AnyOf, ///< a value of one of `alternatives`
    };
    Kind kind = Kind::Typed;
    uint8_t types = AnyType;
    // Objects.
    std::vector<std::string> names;  ///< property names, as written
    std::vector<int32_t> properties; ///< the node of each
    SchemaBits every;                ///< all of `names`
    SchemaBits required;
    int32_t additional = 0; ///< other keys' node; -1: none allowed
    // Arrays.
    int32_t items = 0;
    uint32_t minItems = 0, maxItems = UINT32_MAX;
    // Strings.
    uint32_t minLength = 0, maxLength = UINT32_MAX;
    std::shared_ptr<const SchemaPattern> pattern; ///< null: none
    // Integers: minimum / maximum (exclusive ones made inclusive), within
    // +-kMaxBoundedInteger; without them, any integer.
    bool bounded = false;
    int64_t least = 0, most = 0;
    // Numbers (`decimal`): the bounds in units of 10^-kFractionDigits,
    // inclusive, of a number written without an exponent in at most
    // kMaxNumberDigits digits.
    bool decimal = false;
    __int128 decimalLeast = 0, decimalMost = 0;
    // Either: multipleOf, a whole number (0: none).
    int64_t multiple = 0;
    // Enum: each value's compact JSON; AnyOf: the alternatives.
    std::vector<std::string> literals;
    std::vector<int32_t> alternatives;
    /// Where in the schema (a JSON pointer), for errors.
    std::string where;
  };

  /// Node 0 accepts any JSON value; nodes 1 and 2 are the literals
  /// true/false and null; the schema's own root is root().
  static constexpr int32_t kAny = 0, kBoolean = 1, kNull = 2;

  /// Compiles `schema` (a JSON document as a Value: dicts, lists, strings,
  /// numbers, booleans, None). Errors name `where` and the JSON pointer of
  /// the offending keyword.
  static Expected<std::shared_ptr<const JsonSchema>>
  compile(const Value &schema, const std::string &where);
  /// The schema at `pointer` inside `document` (a JSON pointer, "" for the
  /// whole), its $refs resolved against the whole document.
  static Expected<std::shared_ptr<const JsonSchema>>
  compile(const Value &document, const std::string &where,
          const std::string &pointer);

  const Node &node(int32_t i) const { return nodes_[size_t(i)]; }
  int32_t root() const { return root_; }
  size_t size() const { return nodes_.size(); }

private:
  friend class SchemaCompiler;
  std::vector<Node> nodes_;
  int32_t root_ = 0;
};

class SchemaPrefix final : public ReplyConstraint {
public:
  /// Deepest nesting of values (each open array, object or member).
  static constexpr size_t kMaxDepth = 128;
  /// Most anyOf alternatives followed side by side.
  static constexpr size_t kMaxThreads = 64;

  explicit SchemaPrefix(std::shared_ptr<const JsonSchema> schema);

  bool push(std::string_view bytes) override;
  bool accepts(std::string_view bytes) const override;
  /// Takes one byte in place: cheaper than push, but after a refusal the
  /// state is not kept (for a caller that steps a copy, as ToolCallPrefix).
  bool take(uint8_t b);
  /// Whether some alternative is a whole value (whitespace after it
  /// included).
  bool complete() const override;
  /// Whether every alternative is whole: only whitespace may follow.
  bool final() const override;
  bool takesControlTokens() const override { return false; }
  std::string key() const override;
  std::unique_ptr<ReplyConstraint> clone() const override {
    return std::make_unique<SchemaPrefix>(*this);
  }

  /// Alternatives followed now.
  size_t alternatives() const { return threads_.size(); }

private:
  enum class Mode : uint8_t {
    Done,        ///< the bottom frame once its value is whole
    Value,       ///< a value of `node` is next (whitespace first)
    ObjectFirst, ///< after '{'
    ObjectKey,   ///< after ',' in an object: a key
    Key,         ///< inside a key (`cand`: names still matching)
    Colon,       ///< after a key
    ObjectAfter, ///< after a member's value
    ArrayFirst,  ///< after '['
    ArrayAfter,  ///< after an item (`count` items)
    String,      ///< inside a string (`count` characters)
    Number,      ///< inside a number
    Literal,     ///< inside an enum value or true/false/null
  };

  struct Frame {
    int32_t node = 0;
    Mode mode = Mode::Value;
    JsonNumber number = JsonNumber::Start;
    JsonString str;
    uint32_t count = 0;  ///< items, characters, or key / literal bytes
    int32_t member = -1; ///< the property being read (-1: another key)
    SchemaBits seen;     ///< the object's properties read
    SchemaBits cand;     ///< the key's names, or the literal's values
    int64_t magnitude = 0; ///< a bounded number's digits so far
    bool negative = false; ///< ... its sign
    uint8_t whole = 0;     ///< ... its integer digits (a lone 0 aside)
    uint8_t fraction = 0;  ///< ... and its fraction digits
    PatternSet re;         ///< a string's pattern states
    uint32_t code = 0;     ///< ... and the character being read
  };
  using Thread = std::vector<Frame>;

  enum class Step : uint8_t { Refused, Taken, Forked };
  Step step(Thread &t, uint8_t b, std::vector<Thread> &forks) const;
  bool startValue(Thread &t, uint8_t b) const;
  /// A byte of the string value `f` (of node `n`): its length bounds
  /// applied, the count kept.
  static JsonStringByte stringByte(Frame &f, const JsonSchema::Node &n,
                                   uint8_t b);
  /// A bounded integer's digits: whole and within the bounds; or able to
  /// become so with more digits.
  static bool integerWithin(const Frame &f, const JsonSchema::Node &n);
  static bool integerLeadsIn(const Frame &f, const JsonSchema::Node &n);
  /// A bounded number's (JsonSchema::Node::decimal) likewise.
  static bool decimalWithin(const Frame &f, const JsonSchema::Node &n);
  static bool decimalLeadsIn(const Frame &f, const JsonSchema::Node &n);
  /// A number's value so far is whole and within the node's bounds, where
  /// it has any.
  static bool numberWithin(const Frame &f, const JsonSchema::Node &n) {
    return n.decimal ? decimalWithin(f, n) : integerWithin(f, n);
  }
  /// Steps the first `live` of `threads` by b; the ones that took it come
  /// first after, and the count of them is returned (threads past it are
  /// spare storage).
  size_t stepLive(std::vector<Thread> &threads, size_t live, uint8_t b) const;
  /// stepLive over each of `bytes`; 0 where every thread refused one or
  /// more than kMaxThreads went on.
  size_t stepBytes(std::vector<Thread> &threads, size_t live,
                   std::string_view bytes) const;
  bool acceptsFresh(std::string_view bytes) const;
  /// After threads_ took bytes: one of each equal state, and the first
  /// bytes' answers forgotten.
  void settle();
  /// Keeps one of each set of threads with equal keys, sorted by key.
  void dedupe();
  static void appendKey(std::string &k, const Thread &t);

  std::shared_ptr<const JsonSchema> schema_;
  std::vector<Thread> threads_; ///< sorted by their keys, none equal
  /// accepts' working copy of threads_, kept for its storage; a copy of
  /// the recogniser starts without it.
  struct Scratch {
    std::vector<Thread> v;
    Scratch() = default;
    Scratch(const Scratch &) {}
    Scratch &operator=(const Scratch &) { return *this; }
  };
  mutable Scratch scratch_;
  /// Whether each first byte is accepted in this state (-1: not known).
  mutable std::array<int8_t, 256> first_;
};

} // namespace kiln::chat

#endif // KILN_RUNTIME_CHAT_SCHEMAPREFIX_H
