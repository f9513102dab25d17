//===- WhitespaceCap.cpp - A bound on a JSON reply's runs of whitespace ---===//
#include "chat/WhitespaceCap.h"

#include "chat/ReplyText.h"

namespace kiln::chat {

WhitespaceCap::WhitespaceCap(std::unique_ptr<ReplyConstraint> json,
                             uint32_t limit)
    : json_(std::move(json)), limit_(limit) {}

WhitespaceCap::WhitespaceCap(const WhitespaceCap &other)
    : json_(other.json_->clone()), limit_(other.limit_),
      lexer_(other.lexer_) {}

bool WhitespaceCap::Lexer::take(std::string_view bytes, uint32_t limit) {
  for (char c : bytes) {
    switch (mode) {
    case Mode::Escape:
      mode = Mode::String;
      break;
    case Mode::String:
      if (c == '\\')
        mode = Mode::Escape;
      else if (c == '"')
        mode = Mode::Outside;
      break;
    case Mode::Outside:
      if (reply::isSpace(c)) {
        if (run >= limit)
          return false;
        ++run;
      } else {
        run = 0;
        if (c == '"')
          mode = Mode::String;
      }
      break;
    }
  }
  return true;
}

bool WhitespaceCap::accepts(std::string_view bytes) const {
  Lexer l = lexer_;
  return l.take(bytes, limit_) && json_->accepts(bytes);
}

bool WhitespaceCap::acceptsControl(std::string_view bytes) const {
  Lexer l = lexer_;
  return l.take(bytes, limit_) && json_->acceptsControl(bytes);
}

bool WhitespaceCap::push(std::string_view bytes) {
  Lexer l = lexer_;
  if (!l.take(bytes, limit_) || !json_->push(bytes))
    return false;
  lexer_ = l;
  return true;
}

std::string WhitespaceCap::key() const {
  std::string k = json_->key();
  k.push_back('\0');
  k.push_back(char(lexer_.mode));
  k.append(reinterpret_cast<const char *>(&lexer_.run), sizeof lexer_.run);
  return k;
}

} // namespace kiln::chat
