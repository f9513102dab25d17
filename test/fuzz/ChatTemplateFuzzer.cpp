//===- ChatTemplateFuzzer.cpp - libFuzzer target for chat templates --------===//
//
// A chat template comes from the GGUF file: untrusted input. The fuzzer
// parses arbitrary bytes as a template and renders what parses with a small
// conversation (system, user, assistant with content parts, a tool message,
// a tools list), with tight limits so that every input finishes quickly:
// whatever the template does, the renderer must return a text or an error,
// never crash, hang or read out of bounds. Built and run by utils/fuzz.sh,
// seeded with Kiln's GLM template.
//
//===----------------------------------------------------------------------===//
#include "chat/ChatTemplate.h"

#include <cstddef>
#include <cstdint>
#include <string_view>

using namespace kiln::chat;

namespace {

Value message(const char *role, Value content) {
  ValueMap m;
  m.set("role", Value(role));
  m.set("content", std::move(content));
  return Value::map(std::move(m));
}

const Value &context() {
  static const Value value = [] {
    ValueMap part;
    part.set("type", Value("text"));
    part.set("text", Value("part \xF0\x9F\x99\x82 two"));
    ValueMap tool;
    tool.set("name", Value("lookup"));
    tool.set("description", Value("finds things"));
    ValueList messages = {
        message("system", Value("Be brief.")),
        message("user", Value("Hello\n  there")),
        message("assistant", Value::list({Value::map(part)})),
        message("tool", Value("{\"ok\": true}")),
        message("user", Value("")),
    };
    return chatContext(Value::list(std::move(messages)), true,
                       std::string("<s>"), std::string("</s>"),
                       Value::list({Value::map(tool)}));
  }();
  return value;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string_view source(reinterpret_cast<const char *>(data), size);
  TemplateOptions options;
  // The last byte picks the lexer options, so all four are fuzzed.
  if (size > 0) {
    options.trimBlocks = data[size - 1] & 1;
    options.lstripBlocks = data[size - 1] & 2;
  }
  kiln::Expected<ChatTemplate> parsed =
      ChatTemplate::parse(source, "fuzz", options);
  if (!parsed)
    return 0;
  RenderLimits limits;
  limits.maxOutputBytes = size_t(1) << 20;
  limits.maxLoopIterations = 100'000;
  (void)parsed->render(context(), limits);
  return 0;
}
