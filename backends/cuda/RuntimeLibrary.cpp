//===- RuntimeLibrary.cpp - Libraries opened with dlopen on first use -----===//
#include "RuntimeLibrary.h"

#include <fmt/format.h>

#include <cstdlib>

namespace kiln::cuda {

Expected<std::string> openRuntimeLibrary(const RuntimeLibrary &l) {
  std::vector<std::string> candidates;
  if (const char *env = std::getenv(l.envVar); env && *env)
    candidates.push_back(env);
  else
    candidates = l.defaults;
  std::string tried;
  for (const std::string &path : candidates) {
    void *lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      tried += fmt::format("\n  {}: {}", path, dlerror());
      continue;
    }
    if (l.bind(lib))
      return path;
    tried += fmt::format("\n  {}: lacks {}", path, l.lacks);
    dlclose(lib);
  }
  return Error(l.what, l.field,
               fmt::format("cannot be opened (set {} to {}); tried:{}",
                           l.envVar, l.hint, tried));
}

} // namespace kiln::cuda
