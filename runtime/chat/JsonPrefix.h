//===- JsonPrefix.h - Whether bytes can still become a JSON text -*- C++ -*-===//
//
// A byte-at-a-time recogniser of RFC 8259 JSON: it says whether the bytes so
// far are a prefix of some JSON text, and whether they are one whole. It is
// what constrains generation to JSON (kiln-serve's response_format
// json_object, kiln-run --json): before each token the generator asks which
// tokens' bytes keep the output a prefix (`accepts`, which leaves the state as
// it was), and ends the reply once the text is whole.
//
// Strings must be UTF-8 (overlong forms, surrogates and code points past
// U+10FFFF refused byte by byte, as RFC 3629's table), with no control byte
// below 0x20; escapes are JSON's eight and \uXXXX (a lone surrogate escape is
// accepted, as JSON's grammar and Python's json accept it). Numbers follow the
// grammar (no leading zeros, no '+', digits after '.' and 'e'). Nesting is
// bounded (kMaxDepth), so a model cannot grow the state without bound.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CHAT_JSONPREFIX_H
#define KILN_RUNTIME_CHAT_JSONPREFIX_H

#include "chat/JsonNumber.h"
#include "chat/JsonString.h"
#include "chat/ReplyConstraint.h"

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace kiln::chat {

class JsonPrefix final : public ReplyConstraint {
public:
  /// Deepest nesting of arrays and objects accepted.
  static constexpr int kMaxDepth = 128;

  /// `objectOnly`: the text must be an object (OpenAI's json_object mode);
  /// otherwise any JSON value. A top-level number is whole only once a
  /// byte after it (whitespace) ends it.
  explicit JsonPrefix(bool objectOnly = true);

  /// Takes `bytes` if every one keeps the text a prefix of a JSON text;
  /// otherwise returns false and the state is as before the call.
  bool push(std::string_view bytes) override;

  /// Whether push(bytes) would succeed; the state does not change.
  bool accepts(std::string_view bytes) const override;

  /// Whether the bytes so far are a whole JSON text (whitespace after it
  /// included; nothing else may follow).
  bool complete() const override;
  /// Once whole, only whitespace may follow: the reply ends.
  bool final() const override { return complete(); }
  /// Text tokens only.
  bool takesControlTokens() const override { return false; }
  /// The scalar state and the whole stack (at most kMaxDepth bytes).
  std::string key() const override;
  std::unique_ptr<ReplyConstraint> clone() const override {
    return std::make_unique<JsonPrefix>(*this);
  }

  /// Nesting depth now (open arrays and objects).
  int depth() const { return int(stack_.size()); }

private:
  enum class Mode : uint8_t {
    Value,       ///< a value is next (whitespace first)
    ArrayFirst,  ///< after '[': a value or ']'
    ObjectFirst, ///< after '{': a key or '}'
    Key,         ///< after ',' in an object: a key
    Colon,       ///< after a key
    After,       ///< after a value: ',', a closing bracket, or the end
    String,      ///< inside a string (`str`)
    Number,      ///< inside a number (`number`)
    Literal,     ///< inside true / false / null (`literal`, `count` done)
  };

  /// Everything but the stack: small, so that `accepts` copies it freely.
  struct Scalar {
    Mode mode = Mode::Value;
    bool key = false;          ///< the string being read is an object's key
    uint8_t count = 0;         ///< Literal bytes done
    JsonString str;            ///< where a string is
    const char *literal = nullptr; ///< "true", "false" or "null"
    JsonNumber number = JsonNumber::Start;
  };

  template <class Stack> static bool step(Scalar &s, Stack &stack, uint8_t b,
                                          bool objectOnly);
  template <class Stack>
  static bool afterValue(Scalar &s, Stack &stack, uint8_t b);
  template <class Stack>
  static bool startValue(Scalar &s, Stack &stack, uint8_t b,
                         bool topObjectOnly);

  struct OwnStack;
  struct OverlayStack;

  bool objectOnly_;
  Scalar scalar_;
  std::vector<uint8_t> stack_; ///< '[' or '{' of each open container
};

} // namespace kiln::chat

#endif // KILN_RUNTIME_CHAT_JSONPREFIX_H
