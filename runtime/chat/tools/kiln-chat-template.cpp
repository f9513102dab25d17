//===- kiln-chat-template.cpp - Render a chat template ---------------------===//
//
// kiln-chat-template TEMPLATE --messages MESSAGES.json [options]
//
// Renders a Jinja chat template with Kiln's subset (docs/chat.md) the way
// HuggingFace's apply_chat_template would, and writes the text to stdout
// exactly (no newline added). A test driver, and a way to look at prompts.
// Errors go to stderr, exit 1 (2 for a usage error).
//
//===----------------------------------------------------------------------===//
#include "chat/ChatTemplate.h"
#include "chat/JsonValue.h"

#include <fmt/core.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

using namespace kiln;
using namespace kiln::chat;

namespace {

constexpr std::string_view kUsage =
    R"(usage: kiln-chat-template TEMPLATE --messages MESSAGES.json [options]

Renders a chat template (a Jinja2 file, or @glm for Kiln's built-in GLM
template) with Kiln's Jinja subset, as HuggingFace's apply_chat_template
does, and writes the text to stdout exactly as rendered.
options:
  --messages FILE          a JSON list of {"role": ..., "content": ...}
                           ("-" reads stdin)
  --tools FILE             a JSON list of tool descriptions (variable `tools`)
  --context FILE           a JSON object: more variables (the options above
                           override its entries)
  --add-generation-prompt  set add_generation_prompt (default false)
  --bos S, --eos S         set bos_token, eos_token (default: not defined)
  --no-trim-blocks         jinja2's trim_blocks=False (HuggingFace: True)
  --no-lstrip-blocks       jinja2's lstrip_blocks=False (HuggingFace: True)
  --keep-trailing-newline  keep a final newline of the template
  --print-default-template write the built-in GLM template and exit
  --help                   this text
)";

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

int fail(const std::string &message) {
  fmt::print(stderr, "kiln-chat-template: error: {}\n", message);
  return kExitError;
}

int usage(const std::string &message) {
  fmt::print(stderr, "kiln-chat-template: {}\n{}", message, kUsage);
  return kExitUsage;
}

/// The bytes of `path` ("-": stdin).
Expected<std::string> readFile(const std::string &path) {
  FILE *file = path == "-" ? stdin : std::fopen(path.c_str(), "rb");
  if (!file)
    return Error(path, "", std::strerror(errno));
  std::string data;
  char buffer[1 << 16];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof buffer, file)) > 0)
    data.append(buffer, got);
  const bool failed = std::ferror(file);
  if (file != stdin)
    std::fclose(file);
  if (failed)
    return Error(path, "", "read error");
  return data;
}

Expected<Value> readJson(const std::string &path) {
  Expected<std::string> text = readFile(path);
  if (!text)
    return text.error();
  return parseJsonValue(*text, path);
}

bool writeAll(std::string_view text) {
  return std::fwrite(text.data(), 1, text.size(), stdout) == text.size() &&
         std::fflush(stdout) == 0;
}

} // namespace

int main(int argc, char **argv) {
  std::optional<std::string> templatePath, messagesPath, toolsPath, contextPath;
  std::optional<std::string> bos, eos;
  bool addGenerationPrompt = false;
  TemplateOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&](std::optional<std::string> &slot) {
      if (i + 1 >= argc)
        return false;
      slot = argv[++i];
      return true;
    };
    if (arg == "--help" || arg == "-h") {
      fmt::print("{}", kUsage);
      return 0;
    }
    if (arg == "--print-default-template")
      return writeAll(glmDefaultTemplate()) ? 0 : fail("cannot write stdout");
    if (arg == "--messages" || arg == "--tools" || arg == "--context" ||
        arg == "--bos" || arg == "--eos") {
      std::optional<std::string> &slot = arg == "--messages" ? messagesPath
                                         : arg == "--tools"  ? toolsPath
                                         : arg == "--context" ? contextPath
                                         : arg == "--bos"     ? bos
                                                              : eos;
      if (!value(slot))
        return usage(std::string(arg) + " needs a value");
    } else if (arg == "--add-generation-prompt") {
      addGenerationPrompt = true;
    } else if (arg == "--no-trim-blocks") {
      options.trimBlocks = false;
    } else if (arg == "--no-lstrip-blocks") {
      options.lstripBlocks = false;
    } else if (arg == "--keep-trailing-newline") {
      options.keepTrailingNewline = true;
    } else if (arg.size() > 1 && arg[0] == '-' && arg != "-") {
      return usage("unknown option " + std::string(arg));
    } else if (!templatePath) {
      templatePath = std::string(arg);
    } else {
      return usage("unexpected argument " + std::string(arg));
    }
  }
  if (!templatePath)
    return usage("missing TEMPLATE");
  if (!messagesPath && !contextPath)
    return usage("missing --messages (or --context)");

  // The template.
  std::string source;
  if (*templatePath == "@glm") {
    source = std::string(glmDefaultTemplate());
  } else {
    Expected<std::string> text = readFile(*templatePath);
    if (!text)
      return fail(text.error().message());
    source = std::move(*text);
  }
  Expected<ChatTemplate> tmpl = ChatTemplate::parse(source, *templatePath, options);
  if (!tmpl)
    return fail(tmpl.error().message());

  // The variables: --context first, then what the options set.
  ValueMap variables;
  if (contextPath) {
    Expected<Value> context = readJson(*contextPath);
    if (!context)
      return fail(context.error().message());
    if (!context->isMap())
      return fail(Error(*contextPath, "", "expected a JSON object of variables")
                      .message());
    for (const auto &[name, value] : context->asMap())
      variables.set(name, value);
  }
  if (messagesPath) {
    Expected<Value> messages = readJson(*messagesPath);
    if (!messages)
      return fail(messages.error().message());
    if (!messages->isList())
      return fail(Error(*messagesPath, "", "expected a JSON list of messages")
                      .message());
    variables.set("messages", *messages);
  }
  if (toolsPath) {
    Expected<Value> tools = readJson(*toolsPath);
    if (!tools)
      return fail(tools.error().message());
    variables.set("tools", *tools);
  }
  if (addGenerationPrompt || !variables.contains("add_generation_prompt"))
    variables.set("add_generation_prompt", Value::boolean(addGenerationPrompt));
  if (bos)
    variables.set("bos_token", Value(*bos));
  if (eos)
    variables.set("eos_token", Value(*eos));

  Expected<std::string> text = tmpl->render(Value::map(std::move(variables)));
  if (!text)
    return fail(text.error().message());
  return writeAll(*text) ? 0 : fail("cannot write stdout");
}
