//===- Reasoning.h - A GLM reply's thinking block, apart from its answer -*- C++ -*-===//
//
// GLM-4.5 and later (GLM-5 among them) start a reply by thinking:
//
//   <think>REASONING</think>
//   ANSWER
//
// (the generation prompt ends at "<|assistant|>", so the model writes the
// block itself; whitespace may come before it). OpenAI-compatible servers
// return the block as "reasoning_content" beside "content". A reply that
// does not start with "<think>" is all answer; one whose block never closes
// (cut short) is all reasoning.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_CHAT_REASONING_H
#define KILN_CHAT_REASONING_H

#include <string>
#include <string_view>

namespace kiln::chat {

struct SplitReply {
  std::string reasoning; ///< between the tags
  std::string answer;    ///< after "</think>", leading whitespace dropped
};

/// The thinking block of `text` and the rest.
SplitReply splitReasoning(std::string_view text);

/// The same as the reply streams: push() returns the new reasoning and the
/// new answer text, holding back what may still be a tag's beginning (and
/// the whitespace after "</think>" until the answer starts).
class ReasoningStream {
public:
  SplitReply push(std::string_view piece);
  /// What is held back once the reply has ended.
  SplitReply finish();

private:
  enum class State { Start, Reasoning, AfterThink, Answer };
  State state_ = State::Start;
  std::string held_;
};

} // namespace kiln::chat

#endif // KILN_CHAT_REASONING_H
