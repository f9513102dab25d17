//===- ReplyConstraint.h - What a constrained reply may be ------*- C++ -*-===//
//
// The interface the generator asks before each token (session/Generator):
// which bytes may follow the reply so far, whether the reply may end here,
// and whether it must. JsonPrefix (response_format json_object),
// SchemaPrefix (json_schema) and ToolCallPrefix (tool_choice required or a
// named function) implement it; ThinkFirst puts a thinking block before
// another.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CHAT_REPLYCONSTRAINT_H
#define KILN_RUNTIME_CHAT_REPLYCONSTRAINT_H

#include <memory>
#include <string>
#include <string_view>

namespace kiln::chat {

class ReplyConstraint {
public:
  virtual ~ReplyConstraint() = default;
  /// Whether push(bytes) would succeed; the state does not change.
  virtual bool accepts(std::string_view bytes) const = 0;
  /// Takes `bytes` if they keep the reply acceptable; otherwise returns
  /// false and the state is as before.
  virtual bool push(std::string_view bytes) = 0;
  /// Whether the reply may end here (an end-of-reply token may come next).
  virtual bool complete() const = 0;
  /// Whether nothing but the end may follow: generation stops here.
  virtual bool final() const = 0;
  /// Whether control tokens may spell what follows now (GLM's tool-call
  /// markers are control tokens), or only text tokens may. It may change
  /// with the state (ThinkFirst: yes in a thinking block, then the inner
  /// constraint's answer); key() tells such states apart.
  virtual bool takesControlTokens() const = 0;
  /// Whether a control token with these bytes may come next (asked only
  /// where takesControlTokens()): by default wherever its bytes are
  /// accepted. A constraint whose markup is control tokens narrows this to
  /// the markup, so that a special token is never spelled as text.
  virtual bool acceptsControl(std::string_view bytes) const {
    return takesControlTokens() && accepts(bytes);
  }
  /// Bytes equal for two states only if they accept the same bytes and
  /// agree on complete() and final(): the generator keeps each state's
  /// allowed set under it and reuses it where the state recurs (inside a
  /// long string or value, most steps).
  virtual std::string key() const = 0;
  /// A copy in the same state.
  virtual std::unique_ptr<ReplyConstraint> clone() const = 0;
};

} // namespace kiln::chat

#endif // KILN_RUNTIME_CHAT_REPLYCONSTRAINT_H
