//===- ModelText.h - A model's text interface: tokenizer, chat template -*- C++
//-*-===//
//
// What every text front end (kiln-run, kiln-run --chat, kiln-serve) takes
// from the GGUF set the same way: the tokenizer (whose endOfReplyIds() end
// a reply), and the chat template (the file's, Kiln's GLM template when the
// file has none, or --chat-template's), with where it came from for
// messages.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_SESSION_MODELTEXT_H
#define KILN_RUNTIME_SESSION_MODELTEXT_H

#include "chat/ChatTemplate.h"
#include "gguf/GGUFFile.h"
#include "session/Session.h"
#include "tokenizer/Tokenizer.h"

#include <memory>
#include <string>
#include <vector>

namespace kiln::runtime {

struct ModelChatTemplate {
  chat::ChatTemplate chatTemplate;
  /// "FILE: tokenizer.chat_template" or "GLM's default chat template".
  std::string where;
};

/// The model's chat template, parsed; `file` names the set in messages.
/// `override` (--chat-template) replaces the file's: "glm" is Kiln's GLM
/// template, anything else a file of Jinja text.
Expected<ModelChatTemplate> loadChatTemplate(const gguf::GGUFModel &model,
                                             const std::string &file,
                                             const std::string &override = "");

/// A session with its text interface, as the chat front ends (kiln-run
/// --chat, kiln-serve) open it: the tokenizer and the chat template are
/// required.
struct TextModel {
  std::unique_ptr<Session> session;
  tokenizer::Tokenizer tokenizer;
  ModelChatTemplate chat;
};
Expected<TextModel> openTextModel(const SessionOptions &options,
                                  const std::string &chatTemplate = "");

} // namespace kiln::runtime

#endif // KILN_RUNTIME_SESSION_MODELTEXT_H
