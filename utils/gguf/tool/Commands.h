//===- Commands.h - kiln-gguf subcommands -----------------------*- C++ -*-===//
//
// Each subcommand takes the arguments after its name and returns the exit
// status: 0 success, 1 bad input (an unreadable or invalid file), 2 bad usage.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_GGUF_TOOL_COMMANDS_H
#define KILN_GGUF_TOOL_COMMANDS_H

#include "gguf/GGUFValue.h"
#include "support/Error.h"

#include <string>
#include <string_view>

namespace kiln::gguf::tool {

inline constexpr int kExitBadInput = 1;
inline constexpr int kExitUsage = 2;

int runTypes(int argc, char **argv);
int runInfo(int argc, char **argv);
int runCheck(int argc, char **argv);
int runDequant(int argc, char **argv);

/// Prints "kiln-gguf: error: <message>" on stderr; returns kExitBadInput.
int reportError(const Error &error);
/// Prints "kiln-gguf: error: <command>: <problem>" and the command's usage
/// on stderr; returns kExitUsage.
int usageError(std::string_view command, std::string_view problem,
               std::string_view usage);

/// `text` as a JSON string literal (invalid UTF-8 replaced by U+FFFD).
std::string jsonString(std::string_view text);
/// A metadata value as JSON: {"type": ..., "value": ...}; arrays also carry
/// "element_type", and arrays of arrays hold typed objects.
std::string jsonValue(const Value &value);
/// A metadata value for people: long arrays and strings shortened.
std::string summarizeValue(const Value &value);

} // namespace kiln::gguf::tool

#endif // KILN_GGUF_TOOL_COMMANDS_H
