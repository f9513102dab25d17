//===- GlmTemplate.cpp - Kiln's GLM chat template, embedded ---------------===//
//
// glm.jinja's bytes, written into GlmTemplate.inc at build time
// (EmbedFile.cmake), so the constant can never drift from the file.
//
//===----------------------------------------------------------------------===//
#include "chat/ChatTemplate.h"

namespace kiln::chat {
namespace {
constexpr unsigned char kGlmTemplate[] = {
#include "GlmTemplate.inc"
};
} // namespace

std::string_view glmDefaultTemplate() {
  return std::string_view(reinterpret_cast<const char *>(kGlmTemplate),
                          sizeof kGlmTemplate);
}

} // namespace kiln::chat
