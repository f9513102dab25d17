//===- ChatTemplate.h - Kiln's Jinja subset for chat templates --*- C++ -*-===//
//
// A GGUF model carries its prompt format as `tokenizer.chat_template`, a
// Jinja2 template that HuggingFace's apply_chat_template renders with
// `messages`, `add_generation_prompt`, `bos_token`, `eos_token` and
// optionally `tools`. ChatTemplate renders such a template in C++ with a
// documented subset of Jinja2 (docs/chat.md): what it accepts it renders as
// jinja2 would, byte for byte; anything outside the subset is an error that
// names the line, the column and the construct (at parse time wherever the
// construct is visible in the text, at render time otherwise), never a
// silently different prompt.
//
// Nothing here throws. Malicious templates are bounded: nesting depth, total
// loop iterations, string and output sizes all have limits with clear errors.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_CHAT_CHATTEMPLATE_H
#define KILN_CHAT_CHATTEMPLATE_H

#include "chat/Value.h"
#include "support/Error.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace kiln::chat {

/// Lexer options. The defaults are HuggingFace's (apply_chat_template uses
/// trim_blocks=True, lstrip_blocks=True); jinja2's own defaults are both
/// false. keep_trailing_newline is false in both.
struct TemplateOptions {
  /// Remove the first newline after a block tag (`%}`) or comment (`#}`).
  bool trimBlocks = true;
  /// Remove spaces and tabs from the start of a line up to a block tag or
  /// comment (`{%`, `{#`).
  bool lstripBlocks = true;
  /// Keep a single newline at the very end of the template source.
  bool keepTrailingNewline = false;
};

/// Bounds on one render.
struct RenderLimits {
  /// The rendered text, and any one string computed on the way.
  size_t maxOutputBytes = size_t(16) << 20;
  /// `for` iterations over the whole render.
  uint64_t maxLoopIterations = 1'000'000;
};

/// Nesting limit of template constructs (blocks and expressions) and of
/// values (lists and dicts).
inline constexpr uint32_t kMaxNestingDepth = 256;

namespace detail {
struct TemplateImpl;
}

class ChatTemplate {
public:
  /// Parses `source`. `where` names it in errors (a file, "GGUF
  /// tokenizer.chat_template"). Errors read "where: line L, column C: ...".
  static Expected<ChatTemplate> parse(std::string_view source, std::string where,
                                      TemplateOptions options = {});

  /// Renders with `context`, a map whose entries are the template's
  /// variables (messages, add_generation_prompt, bos_token, ...).
  Expected<std::string> render(const Value &context,
                               const RenderLimits &limits = {}) const;

  /// Whether the template names variable `name` anywhere (a server asks
  /// before it hands a template `tools` it would not read).
  bool readsVariable(std::string_view name) const;

private:
  explicit ChatTemplate(std::shared_ptr<const detail::TemplateImpl> impl)
      : impl_(std::move(impl)) {}
  std::shared_ptr<const detail::TemplateImpl> impl_;
};

/// The variables HuggingFace's apply_chat_template passes: `messages`, a
/// list of dicts with "role" and "content"; `bos_token`/`eos_token` are
/// set only when given; `tools` only when not undefined.
Value chatContext(Value messages, bool addGenerationPrompt,
                  std::optional<std::string> bosToken = std::nullopt,
                  std::optional<std::string> eosToken = std::nullopt,
                  Value tools = Value());

/// Kiln's GLM chat template (runtime/chat/glm.jinja, embedded at build time):
/// the format GLM models use, for model files that carry no template.
std::string_view glmDefaultTemplate();

} // namespace kiln::chat

#endif // KILN_CHAT_CHATTEMPLATE_H
