//===- WhitespaceCap.h - A bound on a JSON reply's runs of whitespace -*- C++ -*-===//
//
// JSON allows any amount of whitespace between tokens, and a model under a
// JSON constraint can spend its whole budget on it (a known way for
// constrained decoding to fail: newlines until max_tokens). WhitespaceCap
// wraps a JSON constraint (JsonPrefix, SchemaPrefix) and refuses the byte
// that would make a run of whitespace outside strings longer than `limit`
// (64 by default: room for any pretty-printed nesting a reply uses, a
// 2-space indent 31 levels deep). It follows the JSON text's strings with a
// lexer of its own ('"' opens and closes, '\' escapes the next byte), which
// is the same for every reading of the text, so it needs nothing from the
// constraint it wraps. Whitespace inside strings is the string's own and is
// not counted.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CHAT_WHITESPACECAP_H
#define KILN_RUNTIME_CHAT_WHITESPACECAP_H

#include "chat/ReplyConstraint.h"
#include "chat/ReplyText.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace kiln::chat {

class WhitespaceCap final : public ReplyConstraint {
public:
  static constexpr uint32_t kDefaultLimit = reply::kWhitespaceRun;

  explicit WhitespaceCap(std::unique_ptr<ReplyConstraint> json,
                         uint32_t limit = kDefaultLimit);
  WhitespaceCap(const WhitespaceCap &other);

  bool accepts(std::string_view bytes) const override;
  bool push(std::string_view bytes) override;
  bool complete() const override { return json_->complete(); }
  bool final() const override { return json_->final(); }
  bool takesControlTokens() const override {
    return json_->takesControlTokens();
  }
  bool acceptsControl(std::string_view bytes) const override;
  /// The wrapped constraint's key and the current run's length.
  std::string key() const override;
  std::unique_ptr<ReplyConstraint> clone() const override {
    return std::make_unique<WhitespaceCap>(*this);
  }

private:
  /// Where the lexer is: outside strings (with the run's length), inside
  /// one, or after a backslash inside one.
  struct Lexer {
    enum class Mode : uint8_t { Outside, String, Escape } mode = Mode::Outside;
    uint32_t run = 0;
    /// Takes `bytes`; false where a run would pass `limit`.
    bool take(std::string_view bytes, uint32_t limit);
  };

  std::unique_ptr<ReplyConstraint> json_;
  uint32_t limit_;
  Lexer lexer_;
};

} // namespace kiln::chat

#endif // KILN_RUNTIME_CHAT_WHITESPACECAP_H
