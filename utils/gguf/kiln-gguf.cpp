//===- kiln-gguf.cpp - The GGUF command-line tool
//--------------------------===//
//
// kiln-gguf types [--json]        the ggml type table Kiln knows
// kiln-gguf info FILE... [--json] metadata and tensor table of a model
// kiln-gguf check FILE...         structural validation of a model
// kiln-gguf dequant FILE... --tensor NAME -o OUT   a tensor as float32
// kiln-gguf synth OUT.gguf ...    a synthetic GLM-5 model
//
// Subcommands live in tool/, one file each; this file only dispatches.
//
//===----------------------------------------------------------------------===//
#include "synth/SynthCommand.h"
#include "tool/Commands.h"

#include <fmt/core.h>

#include <string_view>

namespace {

constexpr std::string_view kUsage =
    "usage: kiln-gguf <command> [options]\n"
    "commands:\n"
    "  types [--json]          the ggml tensor types and their block "
    "geometry\n"
    "  info FILE... [--json]   metadata and tensor table of a GGUF model\n"
    "  check FILE...           validate a GGUF model's structure\n"
    "  dequant FILE... --tensor NAME -o OUT\n"
    "                          a tensor as raw little-endian float32\n"
    "  synth OUT.gguf [...]    write a synthetic GLM-5 model\n"
    "'kiln-gguf <command> --help' describes a command.\n";

} // namespace

int main(int argc, char **argv) {
  using namespace kiln::gguf::tool;
  if (argc < 2) {
    fmt::print(stderr, "{}", kUsage);
    return kExitUsage;
  }
  std::string_view command = argv[1];
  if (command == "--help" || command == "-h") {
    fmt::print("{}", kUsage);
    return 0;
  }
  if (command == "types")
    return runTypes(argc - 2, argv + 2);
  if (command == "info")
    return runInfo(argc - 2, argv + 2);
  if (command == "check")
    return runCheck(argc - 2, argv + 2);
  if (command == "dequant")
    return runDequant(argc - 2, argv + 2);
  if (command == "synth")
    return kiln::synth::runSynthCommand(argc - 2, argv + 2);
  fmt::print(stderr, "kiln-gguf: error: unknown command '{}'\n{}", command,
             kUsage);
  return kExitUsage;
}
