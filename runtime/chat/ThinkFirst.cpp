//===- ThinkFirst.cpp - A thinking block before a constrained answer ------===//
#include "chat/ThinkFirst.h"

#include "chat/ReplyText.h"

namespace kiln::chat {

namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

std::unique_ptr<ReplyConstraint>
copyOf(const std::unique_ptr<ReplyConstraint> &c) {
  return c ? c->clone() : nullptr;
}

} // namespace

ThinkFirst::ThinkFirst(std::unique_ptr<ReplyConstraint> answer)
    : answer_(std::move(answer)), fresh_(answer_->clone()) {}

ThinkFirst::ThinkFirst(const ThinkFirst &other)
    : phase_(other.phase_), at_(other.at_), answer_(copyOf(other.answer_)),
      fresh_(copyOf(other.fresh_)) {}

ThinkFirst &ThinkFirst::operator=(const ThinkFirst &other) {
  if (this != &other) {
    phase_ = other.phase_;
    at_ = other.at_;
    answer_ = copyOf(other.answer_);
    fresh_ = copyOf(other.fresh_);
  }
  return *this;
}

bool ThinkFirst::feed(uint8_t b) {
  const char c = char(b);
  return answer_->push(std::string_view(&c, 1));
}

bool ThinkFirst::space() {
  if (at_ >= reply::kWhitespaceRun)
    return false;
  ++at_;
  return true;
}

bool ThinkFirst::step(uint8_t b) {
  switch (phase_) {
  case Phase::Lead:
    if (reply::isSpace(char(b)))
      return space();
    at_ = 0;
    if (b == uint8_t(kOpen[0])) {
      // "<think>" or an answer that begins with '<'.
      phase_ = Phase::Open;
      at_ = 1;
      if (!feed(b))
        answer_.reset();
      return true;
    }
    phase_ = Phase::Answer;
    return feed(b);
  case Phase::Open: {
    const bool think = b == uint8_t(kOpen[at_]);
    bool answer = answer_ && feed(b);
    if (!answer)
      answer_.reset();
    if (think && ++at_ == kOpen.size()) {
      // "<think>" is no answer's beginning the constraints here accept;
      // the block it opens decides.
      phase_ = Phase::Think;
      at_ = 0;
      answer_.reset();
      return true;
    }
    if (think)
      return true;
    if (!answer)
      return false;
    phase_ = Phase::Answer; // the answer began with '<'
    return true;
  }
  case Phase::Think:
    // "</think>" has no border but its '<': a mismatch restarts the match
    // at this byte.
    if (b == uint8_t(kClose[at_])) {
      if (++at_ == kClose.size()) {
        phase_ = Phase::After;
        at_ = 0;
      }
    } else {
      at_ = b == uint8_t(kClose[0]) ? 1 : 0;
    }
    return true;
  case Phase::After:
    if (reply::isSpace(char(b)))
      return space();
    at_ = 0;
    phase_ = Phase::Answer;
    answer_ = fresh_->clone();
    return feed(b);
  case Phase::Answer:
    return feed(b);
  }
  return false;
}

bool ThinkFirst::push(std::string_view bytes) {
  if (phase_ == Phase::Answer) // the common case: the answer alone
    return answer_->push(bytes);
  ThinkFirst copy = *this;
  for (char c : bytes)
    if (!copy.step(uint8_t(c)))
      return false;
  *this = std::move(copy);
  return true;
}

bool ThinkFirst::accepts(std::string_view bytes) const {
  if (phase_ == Phase::Answer)
    return answer_->accepts(bytes);
  // Inside the block, bytes without a '<' stay in it.
  if (phase_ == Phase::Think && at_ == 0 &&
      bytes.find('<') == std::string_view::npos)
    return true;
  ThinkFirst copy = *this;
  for (char c : bytes)
    if (!copy.step(uint8_t(c)))
      return false;
  return true;
}

bool ThinkFirst::complete() const {
  return phase_ == Phase::Answer && answer_->complete();
}

bool ThinkFirst::final() const {
  return phase_ == Phase::Answer && answer_->final();
}

bool ThinkFirst::takesControlTokens() const {
  return phase_ == Phase::Answer ? answer_->takesControlTokens() : true;
}

bool ThinkFirst::acceptsControl(std::string_view bytes) const {
  return phase_ == Phase::Answer ? answer_->acceptsControl(bytes)
                                 : accepts(bytes);
}

std::string ThinkFirst::key() const {
  std::string k = {char(phase_), char(at_), char(answer_ != nullptr)};
  if (answer_)
    k += answer_->key();
  return k;
}

} // namespace kiln::chat
