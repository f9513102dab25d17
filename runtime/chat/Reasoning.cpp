//===- Reasoning.cpp - A GLM reply's thinking block, apart from its answer -===//
#include "chat/Reasoning.h"

#include "chat/ReplyText.h"

namespace kiln::chat {
namespace {

constexpr std::string_view kOpen = "<think>", kClose = "</think>";

using reply::skipSpace;
using reply::tagPrefixAtEnd;

} // namespace

SplitReply splitReasoning(std::string_view text) {
  size_t start = skipSpace(text);
  if (text.substr(start, kOpen.size()) != kOpen)
    return {"", std::string(text)};
  std::string_view rest = text.substr(start + kOpen.size());
  size_t close = rest.find(kClose);
  if (close == std::string_view::npos)
    return {std::string(rest), ""};
  return {std::string(rest.substr(0, close)),
          std::string(rest.substr(skipSpace(rest, close + kClose.size())))};
}

SplitReply ReasoningStream::push(std::string_view piece) {
  SplitReply out;
  held_ += piece;
  // Each state consumes what it can decide and leaves the rest held; a
  // change of state goes round again on what is left.
  for (;;) {
    switch (state_) {
    case State::Start: {
      size_t start = skipSpace(held_);
      std::string_view after = std::string_view(held_).substr(start);
      if (after.substr(0, kOpen.size()) == kOpen) {
        held_.erase(0, start + kOpen.size());
        state_ = State::Reasoning;
        continue;
      }
      if (after.size() < kOpen.size() && kOpen.substr(0, after.size()) == after)
        return out; // whitespace, or the tag's beginning: not yet decided
      state_ = State::Answer;
      continue;
    }
    case State::Reasoning: {
      size_t close = held_.find(kClose);
      if (close != std::string::npos) {
        out.reasoning += held_.substr(0, close);
        held_.erase(0, close + kClose.size());
        state_ = State::AfterThink;
        continue;
      }
      size_t keep = tagPrefixAtEnd(held_, kClose);
      out.reasoning += held_.substr(0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
      return out;
    }
    case State::AfterThink: {
      size_t start = skipSpace(held_);
      held_.erase(0, start);
      if (held_.empty())
        return out;
      state_ = State::Answer;
      continue;
    }
    case State::Answer:
      out.answer += held_;
      held_.clear();
      return out;
    }
  }
}

SplitReply ReasoningStream::finish() {
  SplitReply out;
  if (state_ == State::Reasoning)
    out.reasoning = std::move(held_);
  else if (state_ != State::AfterThink) // Start: whitespace or a partial tag
    out.answer = std::move(held_);
  held_.clear();
  return out;
}

} // namespace kiln::chat
