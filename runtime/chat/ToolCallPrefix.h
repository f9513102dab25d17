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
// that function's parameters where its schema lists them (otherwise any text
// without '<' or a newline), VALUE any bytes up to "</arg_value>", or for a
// parameter typed integer, number or boolean, a JSON integer, number or
// true / false (as ToolCalls.h then reads it). With
// `several`, more calls may follow, each after whitespace. It is what
// kiln-serve's tool_choice "required" (any of the request's functions, one
// call or more) and a named function (that one, one call) constrain
// generation with; the reply may end after a whole call.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CHAT_TOOLCALLPREFIX_H
#define KILN_RUNTIME_CHAT_TOOLCALLPREFIX_H

#include "chat/JsonNumber.h"
#include "chat/ReplyConstraint.h"

#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::chat {

/// What a parameter's value may be (its JSON schema type).
enum class ValueKind : uint8_t { Any, Integer, Number, Boolean };

/// The kind of a JSON schema "type" ("integer", "number", "boolean"; any
/// other: Any, a value of any text).
ValueKind valueKindOf(std::string_view schemaType);

/// Whether a function or parameter name can be written in the markup:
/// non-empty, without '<' or a newline.
bool writableInMarkup(std::string_view name);

/// A function a forced call may name, and its parameters' names (empty:
/// its schema lists none, and any key may be written) and kinds (one a
/// parameter, or none: all Any).
struct ToolSignature {
  std::string name;
  std::vector<std::string> parameters;
  std::vector<ValueKind> kinds;
};

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
  /// The phase, the literal and bytes matched, the function, the alive
  /// candidates.
  std::string key() const override;

private:
  enum class Phase : uint8_t {
    Lead,    ///< whitespace before the first call
    Literal, ///< inside `literal` (`at` bytes matched)
    Choice,  ///< "<arg_key>" or "</tool_call>" (`alive`: bits 0 and 1)
    Name,    ///< a function's name and "\n" (`alive`: the candidates)
    Key,     ///< a parameter's name and what follows it
    FreeKey, ///< a key not in a list: any text without '<' or '\n'
    Value,   ///< VALUE (`at`: bytes of "</arg_value>" matched)
    Typed,   ///< a typed VALUE (`kind`; `number` or `word`)
    Done,    ///< after a call
  };
  struct State {
    Phase phase = Phase::Lead;
    const char *literal = nullptr;
    uint32_t at = 0;
    uint32_t function = 0; ///< the chosen function's index
    ValueKind kind = ValueKind::Any;
    JsonNumber number = JsonNumber::Start; ///< Typed: a number so far
    const char *word = nullptr; ///< Typed: "true" or "false" (`at` matched)
    std::bitset<kMaxChoices> alive;
  };

  bool step(State &s, uint8_t b) const;
  /// step over every byte of `bytes`; false at the first refused.
  bool run(State &s, std::string_view bytes) const;

  std::shared_ptr<const std::vector<ToolSignature>> tools_;
  bool several_;
  State state_;
};

} // namespace kiln::chat

#endif // KILN_RUNTIME_CHAT_TOOLCALLPREFIX_H
