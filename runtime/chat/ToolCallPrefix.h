//===- ToolCallPrefix.h - A reply that must call a tool ---------*- C++ -*-===//
//
// A recogniser of replies that are GLM tool calls and nothing else, in the
// form Kiln's GLM template writes an assistant's calls (chat/ToolCalls.h):
//
//   <tool_call>NAME
//   <arg_key>KEY</arg_key>
//   <arg_value>VALUE</arg_value>
//   </tool_call>
//
// after optional whitespace; NAME one of the given functions', KEY one of
// that function's parameters where its schema lists them (each at most
// once, and the call ends only once the required ones are written;
// otherwise any text without '<' or a newline), VALUE any bytes up to
// "</arg_value>" but for "</tool_call>", or for a parameter of one JSON
// type other than string, a JSON value its schema accepts (SchemaPrefix; as
// ToolCalls.h then reads it) whose strings hold neither marker: the reader
// ends a value at the first "</arg_value>" and a call at the first
// "</tool_call>". With
// `several`, more calls may follow, each after whitespace. It is what
// kiln-serve's tool_choice "required" (any of the request's functions, one
// call or more) and a named function (that one, one call) constrain
// generation with; the reply may end after a whole call.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CHAT_TOOLCALLPREFIX_H
#define KILN_RUNTIME_CHAT_TOOLCALLPREFIX_H

#include "chat/ReplyConstraint.h"
#include "chat/SchemaPrefix.h"

#include <bitset>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::chat {

/// Whether a function or parameter name can be written in the markup and
/// read back as itself: non-empty, without '<' or a newline, and without
/// whitespace at either end (the reader, ToolCalls.h, trims names and
/// keys).
bool writableInMarkup(std::string_view name);

/// A schema of the one JSON type `type` names ("integer", "object", ...);
/// null for "string" or a name that is not a JSON type.
std::shared_ptr<const JsonSchema> typeSchema(std::string_view type);

/// What a forced call may write as parameter `name`'s value, from the
/// function's `parameters` schema (a JSON document): null (any text)
/// unless the parameter's "type" is one JSON type other than "string",
/// which ToolCalls.h reads as JSON; then the parameter's own schema where
/// SchemaPrefix can keep it, otherwise that type alone.
std::shared_ptr<const JsonSchema> parameterValues(const Value &parameters,
                                                  const std::string &name);

/// A function a forced call may name: its parameters' names (empty: its
/// schema lists none, and any key may be written), the schema each one's
/// value keeps (null or missing: any text), and which must be given (none
/// missing: none). A listed parameter is written at most once.
struct ToolSignature {
  std::string name;
  std::vector<std::string> parameters;
  std::vector<std::shared_ptr<const JsonSchema>> values;
  std::vector<bool> required;
};

/// Function `name`'s signature from its `parameters` schema (a JSON
/// document): its "properties" in order, each one's values as
/// parameterValues says, "required" marking those that must be given; no
/// "properties": any key. An error (where: the function, field: the
/// parameter) for a parameter name the markup cannot hold.
Expected<ToolSignature> toolSignature(std::string name,
                                      const Value &parameters);

class ToolCallPrefix final : public ReplyConstraint {
public:
  /// Most functions, and most parameters of one, a call may choose among.
  static constexpr size_t kMaxChoices = 256;

  /// `tools` must be non-empty, each name non-empty without '<' or a
  /// newline, at most kMaxChoices of them and of each one's parameters
  /// (the server checks; anything else names no call).
  ToolCallPrefix(std::vector<ToolSignature> tools, bool several);

  bool accepts(std::string_view bytes) const override;
  bool push(std::string_view bytes) override;
  /// After a whole call (and any whitespace).
  bool complete() const override;
  /// After the one call that may be made.
  bool final() const override;
  /// GLM's markers (<tool_call>, <arg_key>, ...) are control tokens.
  bool takesControlTokens() const override { return true; }
  /// A control token only as one whole marker the call takes there: never
  /// inside a name, a key or a value (where the vocabulary's other special
  /// tokens would otherwise spell text).
  bool acceptsControl(std::string_view bytes) const override;
  /// The phase, the literal and bytes matched, the function, the alive
  /// candidates.
  std::string key() const override;
  std::unique_ptr<ReplyConstraint> clone() const override {
    return std::make_unique<ToolCallPrefix>(*this);
  }

private:
  enum class Phase : uint8_t {
    Lead,    ///< whitespace before the first call
    Literal, ///< inside `literal` (`at` bytes matched)
    Choice,  ///< "<arg_key>" or "</tool_call>" (`alive`: bits 0 and 1)
    Name,    ///< a function's name and "\n" (`alive`: the candidates)
    Key,     ///< a parameter's name and what follows it
    FreeKey, ///< a key not in a list: any text without '<' or '\n'
    Value,   ///< VALUE (`at`: bytes of "</arg_value>" matched)
    Typed,   ///< a VALUE its schema constrains (`value`)
    Done,    ///< after a call
  };
  struct State {
    Phase phase = Phase::Lead;
    const char *literal = nullptr;
    uint32_t at = 0;
    /// Value, Typed: the bytes of "</tool_call>" just taken (a value may
    /// not hold it: the reader would end the call there).
    uint32_t closeAt = 0;
    uint32_t function = 0; ///< the chosen function's index
    std::bitset<kMaxChoices> alive;
    std::bitset<kMaxChoices> seen;     ///< the call's parameters written
    std::optional<SchemaPrefix> value; ///< Typed: the value so far
  };

  /// After a function's name or a value: "<arg_key>" where a parameter may
  /// still be written, "</tool_call>" where every required one has been.
  void openChoice(State &s) const;
  bool step(State &s, uint8_t b) const;
  /// step over every byte of `bytes`; false at the first refused.
  bool run(State &s, std::string_view bytes) const;

  std::shared_ptr<const std::vector<ToolSignature>> tools_;
  bool several_;
  State state_;
};

} // namespace kiln::chat

#endif // KILN_RUNTIME_CHAT_TOOLCALLPREFIX_H
