//===- ModelText.cpp - A model's text interface: tokenizer, stops, chat template -===//
#include "session/ModelText.h"

namespace kiln::runtime {

std::vector<int32_t> endOfReplyIds(const tokenizer::Tokenizer &tokenizer) {
  std::vector<int32_t> ids;
  for (std::optional<int32_t> id : {tokenizer.eosId(), tokenizer.eotId()})
    if (id)
      ids.push_back(*id);
  return ids;
}

Expected<ModelChatTemplate> loadChatTemplate(const gguf::GGUFModel &model,
                                             const std::string &file) {
  std::string where = file + ": tokenizer.chat_template";
  std::string source;
  if (const gguf::Value *v = model.find("tokenizer.chat_template");
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

Expected<TextModel> openTextModel(const SessionOptions &options) {
  Expected<std::unique_ptr<Session>> session = Session::open(options);
  if (!session)
    return session.error();
  const gguf::GGUFModel &model = (*session)->model();
  Expected<tokenizer::Tokenizer> tok = tokenizer::Tokenizer::fromGGUF(model);
  if (!tok)
    return tok.error();
  Expected<ModelChatTemplate> chat =
      loadChatTemplate(model, options.weightPaths.front());
  if (!chat)
    return chat.error();
  return TextModel{std::move(*session), std::move(*tok), std::move(*chat)};
}

} // namespace kiln::runtime
