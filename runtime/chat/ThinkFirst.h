//===- ThinkFirst.h - A thinking block before a constrained answer -*- C++
//-*-===//
//
// GLM-4.5 and later (GLM-5 among them) think before they answer (see
// Reasoning.h): the reply is "<think>REASONING</think>" and then the answer.
// A constrained chat reply (a JSON object, a JSON schema's value, forced tool
// calls) should leave the thinking free and constrain the answer, as the
// server then returns them apart ("reasoning_content", "content").
// ThinkFirst wraps the answer's constraint: optional whitespace, then either
// "<think>", any bytes up to "</think>" and optional whitespace before the
// answer, or the answer at once (each whitespace run at most
// reply::kWhitespaceRun bytes) (a model that does not think, or whose
// template closed an empty block in the prompt). Where the answer may itself
// begin with '<' (a tool call), both are followed until the bytes decide.
//
// Control tokens may spell the thinking block (GLM's tags are special
// tokens); the answer takes them as its own constraint says.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CHAT_THINKFIRST_H
#define KILN_RUNTIME_CHAT_THINKFIRST_H

#include "chat/ReplyConstraint.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace kiln::chat {

class ThinkFirst final : public ReplyConstraint {
public:
  explicit ThinkFirst(std::unique_ptr<ReplyConstraint> answer);
  ThinkFirst(const ThinkFirst &other);
  ThinkFirst &operator=(const ThinkFirst &other);
  ThinkFirst(ThinkFirst &&) = default;
  ThinkFirst &operator=(ThinkFirst &&) = default;

  bool accepts(std::string_view bytes) const override;
  bool push(std::string_view bytes) override;
  /// Once the answer may end.
  bool complete() const override;
  bool final() const override;
  /// Before and inside the thinking block: yes; then the answer's say.
  bool takesControlTokens() const override;
  /// In the thinking block any (it is free text); then the answer's rule.
  bool acceptsControl(std::string_view bytes) const override;
  std::string key() const override;
  std::unique_ptr<ReplyConstraint> clone() const override {
    return std::make_unique<ThinkFirst>(*this);
  }

  /// Whether the answer has begun (the thinking block, if any, is over).
  bool answering() const { return phase_ == Phase::Answer; }

private:
  enum class Phase : uint8_t {
    Lead,   ///< whitespace before the reply
    Open,   ///< inside "<think>" (`at_` bytes), the answer perhaps too
    Think,  ///< inside the block (`at_` bytes of "</think>" matched)
    After,  ///< whitespace after "</think>"
    Answer, ///< the answer's constraint has the bytes
  };

  bool step(uint8_t b);
  /// A whitespace byte in Lead or After: at most reply::kWhitespaceRun in
  /// a row (counted in at_).
  bool space();
  /// Gives byte b to the answer's constraint.
  bool feed(uint8_t b);

  Phase phase_ = Phase::Lead;
  /// Open, Think: the tag's bytes matched; Lead, After: the whitespace run.
  uint32_t at_ = 0;
  /// The answer's constraint; in Open, null once "<think>" is all that the
  /// bytes can still be.
  std::unique_ptr<ReplyConstraint> answer_;
  /// The answer's constraint as it was before any byte (for After).
  std::unique_ptr<ReplyConstraint> fresh_;
};

} // namespace kiln::chat

#endif // KILN_RUNTIME_CHAT_THINKFIRST_H
