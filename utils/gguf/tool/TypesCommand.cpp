//===- TypesCommand.cpp - kiln-gguf types: the ggml type table
//-------------===//
#include "quant/QuantTypes.h"
#include "tool/Commands.h"

#include <fmt/core.h>

namespace kiln::gguf::tool {

int runTypes(int argc, char **argv) {
  constexpr std::string_view kUsage = "usage: kiln-gguf types [--json]\n";
  bool json = false;
  for (int i = 0; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--json") {
      json = true;
    } else if (arg == "--help" || arg == "-h") {
      fmt::print("{}", kUsage);
      return 0;
    } else {
      return usageError("types", fmt::format("unknown argument '{}'", arg),
                        kUsage);
    }
  }
  if (json)
    fmt::print("[");
  bool first = true;
  for (uint32_t id = 0; id < 256; ++id) {
    auto t = lookupGGMLType(id);
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

} // namespace kiln::gguf::tool
