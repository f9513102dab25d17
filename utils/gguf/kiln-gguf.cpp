//===- kiln-gguf.cpp - The GGUF command-line tool --------------------------===//
//
// kiln-gguf types [--json]   the ggml type table Kiln knows (id, name, block
//                            values, block bytes)
//
// Subcommands are dispatched by name; each prints its own usage on --help.
//
//===----------------------------------------------------------------------===//
#include "quant/QuantTypes.h"

#include <fmt/core.h>

#include <cstdio>
#include <string_view>

namespace {

constexpr std::string_view kUsage =
    "usage: kiln-gguf <command> [options]\n"
    "commands:\n"
    "  types [--json]   the ggml tensor types and their block geometry\n";

int runTypes(int argc, char **argv) {
  bool json = false;
  for (int i = 0; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--json") {
      json = true;
    } else if (arg == "--help" || arg == "-h") {
      fmt::print("usage: kiln-gguf types [--json]\n");
      return 0;
    } else {
      fmt::print(stderr, "kiln-gguf: error: types: unknown argument '{}'\n",
                 arg);
      return 2;
    }
  }
  if (json)
    fmt::print("[");
  bool first = true;
  for (uint32_t id = 0; id < 256; ++id) {
    auto t = kiln::lookupGGMLType(id);
    if (!t)
      continue;
    if (json)
      fmt::print("{}{{\"id\": {}, \"name\": \"{}\", \"block_size\": {}, "
                 "\"block_bytes\": {}}}",
                 first ? "" : ", ", id, t->name, t->blockSize, t->blockBytes);
    else
      fmt::print("{:>3} {:<8} {:>4} values {:>4} bytes\n", id, t->name,
                 t->blockSize, t->blockBytes);
    first = false;
  }
  if (json)
    fmt::print("]\n");
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    fmt::print(stderr, "{}", kUsage);
    return 2;
  }
  std::string_view command = argv[1];
  if (command == "--help" || command == "-h") {
    fmt::print("{}", kUsage);
    return 0;
  }
  if (command == "types")
    return runTypes(argc - 2, argv + 2);
  fmt::print(stderr, "kiln-gguf: error: unknown command '{}'\n{}", command,
             kUsage);
  return 2;
}
