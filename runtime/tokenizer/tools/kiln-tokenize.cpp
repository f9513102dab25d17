//===- kiln-tokenize.cpp - Encode and decode with a model's tokenizer ---===//
//
// kiln-tokenize FILE.gguf encode [--no-special]  stdin bytes -> "1,2,3"
// kiln-tokenize FILE.gguf decode                 "1,2,3" on stdin -> bytes
// kiln-tokenize FILE.gguf split                  byte lengths of the glm4
//                                                pre-tokenizer's pieces
// kiln-tokenize FILE.gguf info                   vocabulary facts
//
// A driver for tests and for looking at prompts: stdin is read as raw bytes
// and decoded bytes are written unchanged. Errors go to stderr, exit 1
// (2 for a usage error).
//
//===----------------------------------------------------------------------===//
#include "tokenizer/PreTokenizer.h"
#include "tokenizer/Tokenizer.h"
#include "tokenizer/Unicode.h"

#include <fmt/core.h>

#include <charconv>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

using namespace kiln;
using namespace kiln::tokenizer;

namespace {

constexpr std::string_view kUsage =
    R"(usage: kiln-tokenize FILE.gguf MODE [--no-special]

Tokenizes with the tokenizer stored in a GGUF model (byte-level BPE, glm4).
modes:
  encode   read text (raw bytes) on stdin, print its token ids as "1,2,3"
  decode   read token ids "1,2,3" on stdin, write their bytes to stdout
  split    print the byte length of each piece the glm4 pre-tokenizer cuts
           stdin into, as "3,1,4" (special tokens are not looked for)
  info     print the vocabulary size, pre-tokenizer and special ids
options:
  --no-special   encode special-token text as plain text
  --help         this text
)";

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

int fail(const std::string &message) {
  fmt::print(stderr, "kiln-tokenize: error: {}\n", message);
  return kExitError;
}

std::string readStdin() {
  std::string data;
  char buffer[1 << 16];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof buffer, stdin)) > 0)
    data.append(buffer, got);
  return data;
}

bool isBlank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && isBlank(s.front()))
    s.remove_prefix(1);
  while (!s.empty() && isBlank(s.back()))
    s.remove_suffix(1);
  return s;
}

/// "1, 2,3\n" -> {1, 2, 3}; blank input is no ids.
Expected<std::vector<int32_t>> parseIds(std::string_view input) {
  std::vector<int32_t> ids;
  if (trim(input).empty())
    return ids;
  size_t index = 0;
  while (true) {
    const size_t comma = input.find(',');
    const std::string_view field = trim(input.substr(0, comma));
    int32_t id = 0;
    auto [end, ec] =
        std::from_chars(field.data(), field.data() + field.size(), id);
    if (field.empty() || ec != std::errc() ||
        end != field.data() + field.size())
      return Error("stdin", fmt::format("id #{}", index),
                   fmt::format("\"{}\" is not a 32-bit integer token id",
                               kiln::gguf::printable(field)));
    ids.push_back(id);
    ++index;
    if (comma == std::string_view::npos)
      return ids;
    input.remove_prefix(comma + 1);
  }
}

template <typename T> std::string joinComma(const std::vector<T> &values) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i)
      out += ',';
    out += std::to_string(values[i]);
  }
  return out;
}

void printId(std::string_view name, const std::optional<int32_t> &id) {
  if (id)
    fmt::print("{} {}\n", name, *id);
}

} // namespace

int main(int argc, char **argv) {
  std::vector<std::string> positional;
  bool parseSpecial = true;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      fmt::print("{}", kUsage);
      return 0;
    }
    if (arg == "--no-special") {
      parseSpecial = false;
    } else if (arg.starts_with("-")) {
      fmt::print(stderr, "kiln-tokenize: error: unknown option '{}'\n{}", arg,
                 kUsage);
      return kExitUsage;
    } else {
      positional.emplace_back(arg);
    }
  }
  if (positional.size() != 2) {
    fmt::print(stderr, "kiln-tokenize: error: expected FILE.gguf and MODE\n{}",
               kUsage);
    return kExitUsage;
  }
  const std::string &mode = positional[1];
  if (mode != "encode" && mode != "decode" && mode != "split" &&
      mode != "info") {
    fmt::print(stderr, "kiln-tokenize: error: unknown mode '{}'\n{}", mode,
               kUsage);
    return kExitUsage;
  }

  Expected<gguf::GGUFModel> model = gguf::GGUFModel::open({positional[0]});
  if (!model)
    return fail(model.error().message());
  Expected<Tokenizer> tok = Tokenizer::fromGGUF(*model);
  if (!tok)
    return fail(tok.error().message());
  if (tok->preTokenizerDefaulted())
    fmt::print(stderr, "kiln-tokenize: note: {} has no {}; using glm4\n",
               positional[0], kPreKey);

  if (mode == "info") {
    fmt::print("vocab {}\npre {}\nunicode {}\n", tok->vocabSize(),
               tok->preTokenizer(), unicodeTablesVersion());
    printId("bos", tok->bosId());
    printId("eos", tok->eosId());
    printId("eot", tok->eotId());
    printId("pad", tok->padId());
    return 0;
  }

  const std::string input = readStdin();
  if (mode == "encode") {
    fmt::print("{}\n", joinComma(tok->encode(input, parseSpecial)));
    return 0;
  }
  if (mode == "split") {
    std::vector<size_t> lengths;
    for (std::string_view piece : splitGlm4(input))
      lengths.push_back(piece.size());
    fmt::print("{}\n", joinComma(lengths));
    return 0;
  }
  Expected<std::vector<int32_t>> ids = parseIds(input);
  if (!ids)
    return fail(ids.error().message());
  Expected<std::string> bytes = tok->decode(*ids);
  if (!bytes)
    return fail(bytes.error().message());
  std::fwrite(bytes->data(), 1, bytes->size(), stdout);
  return 0;
}
