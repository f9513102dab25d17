//===- SessionFlags.cpp - The flags every session tool takes --------------===//
#include "session/SessionFlags.h"

#include "backend/KilnBackend.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace kiln::runtime {

bool parseUnsigned(const char *text, uint64_t low, uint64_t high,
                   uint64_t &out) {
  char *end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || text[0] == '-' || v < low ||
      v > high)
    return false;
  out = uint64_t(v);
  return true;
}

bool parseSessionFlag(int argc, char **argv, int &i, SessionOptions &options,
                      std::string &error) {
  const std::string arg = argv[i];
  // The value after the flag, or null (error set) when there is none.
  auto value = [&]() -> const char * {
    if (i + 1 >= argc) {
      error = arg + " needs a value";
      return nullptr;
    }
    return argv[++i];
  };
  auto count = [&](uint64_t most, const char *what, uint32_t &out) {
    const char *v = value();
    if (!v)
      return false;
    uint64_t parsed = 0;
    if (!parseUnsigned(v, 0, most, parsed)) {
      error = fmt::format("{}: expected {} from 0 to {}, not '{}'", arg, what,
                          most, v);
      return false;
    }
    out = uint32_t(parsed);
    return true;
  };
  if (arg == "--weights") {
    const size_t before = options.weightPaths.size();
    while (i + 1 < argc && argv[i + 1][0] != '-')
      options.weightPaths.push_back(argv[++i]);
    if (options.weightPaths.size() == before) {
      error = "--weights needs at least one file";
      return false;
    }
    return true;
  }
  if (arg == "--threads")
    return count(kMaxThreadsFlag, "a thread count (0: every core)",
                 options.threads);
  if (arg == "--device")
    return count(kMaxDeviceFlag, "a GPU ordinal", options.device);
  if (arg == "--eager") {
    options.flags |= KILN_RUN_EAGER;
    return true;
  }
  if (arg == "--one-gpu") {
    options.flags |= KILN_RUN_ONE_GPU;
    return true;
  }
  if (arg == "--backend-dir") {
    const char *v = value();
    if (!v)
      return false;
    options.backendDirs.push_back(v);
    return true;
  }
  if (!arg.empty() && arg[0] == '-') {
    error = "unknown option " + arg;
    return false;
  }
  if (!options.artifactPath.empty()) {
    error = "more than one artifact given: " + arg;
    return false;
  }
  options.artifactPath = arg;
  return true;
}

} // namespace kiln::runtime
