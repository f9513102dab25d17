//===- ModelText.cpp - A model's text interface: tokenizer, chat template -===//
#include "session/ModelText.h"

#include <fstream>
#include <sstream>

namespace kiln::runtime {

Expected<ModelChatTemplate> loadChatTemplate(const gguf::GGUFModel &model,
                                             const std::string &file,
                                             const std::string &override) {
  std::string where = file + ": tokenizer.chat_template";
  std::string source;
  if (override == "glm") {
    source = std::string(chat::glmDefaultTemplate());
    where = "Kiln's GLM chat template (--chat-template glm)";
  } else if (!override.empty()) {
    std::ifstream in(override, std::ios::binary);
    std::ostringstream text;
    if (in)
      text << in.rdbuf();
    if (!in || in.bad())
      return Error(override, "--chat-template",
                   "cannot read the file (give a Jinja template file, or "
                   "'glm' for Kiln's GLM template)");
    source = text.str();
    where = override;
  } else if (const gguf::Value *v = model.find("tokenizer.chat_template");
             v && v->asString()) {
    source = *v->asString();
  } else {
    source = std::string(chat::glmDefaultTemplate());
    where = "GLM's default chat template";
  }
  Expected<chat::ChatTemplate> parsed = chat::ChatTemplate::parse(source, where);
  if (!parsed)
    return parsed.error();
  return ModelChatTemplate{std::move(*parsed), where};
}

Expected<TextModel> openTextModel(const SessionOptions &options,
                                  const std::string &chatTemplate) {
  Expected<std::unique_ptr<Session>> session = Session::open(options);
  if (!session)
    return session.error();
  const gguf::GGUFModel &model = (*session)->model();
  Expected<tokenizer::Tokenizer> tok = tokenizer::Tokenizer::fromGGUF(model);
  if (!tok)
    return tok.error();
  Expected<ModelChatTemplate> chat =
      loadChatTemplate(model, options.weightPaths.front(), chatTemplate);
  if (!chat)
    return chat.error();
  return TextModel{std::move(*session), std::move(*tok), std::move(*chat)};
}

} // namespace kiln::runtime
