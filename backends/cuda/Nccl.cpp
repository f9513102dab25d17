//===- Nccl.cpp - NCCL, loaded at run time ---------------------------------===//
#include "Nccl.h"

#include <fmt/format.h>

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <vector>

namespace kiln::cuda {

namespace {

template <typename Fn> bool resolve(void *lib, const char *name, Fn &out) {
  out = reinterpret_cast<Fn>(dlsym(lib, name));
  return out != nullptr;
}

Expected<NcclApi> open() {
  std::vector<std::string> candidates;
  if (const char *env = std::getenv("KILN_NCCL_LIBRARY"); env && *env)
    candidates.push_back(env);
  else
    candidates = {"libnccl.so.2", "libnccl.so"};
  std::string tried;
  for (const std::string &path : candidates) {
    void *lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      tried += fmt::format("\n  {}: {}", path, dlerror());
      continue;
    }
    NcclApi api;
    api.path = path;
    ncclResult_t (*getVersion)(int *) = nullptr;
    if (!resolve(lib, "ncclGetVersion", getVersion) ||
        !resolve(lib, "ncclGetUniqueId", api.getUniqueId) ||
        !resolve(lib, "ncclCommInitRank", api.commInitRank) ||
        !resolve(lib, "ncclCommDestroy", api.commDestroy) ||
        !resolve(lib, "ncclAllReduce", api.allReduce) ||
        !resolve(lib, "ncclAllGather", api.allGather) ||
        !resolve(lib, "ncclGetErrorString", api.getErrorString)) {
      tried += fmt::format("\n  {}: lacks an NCCL 2 entry point", path);
      dlclose(lib);
      continue;
    }
    getVersion(&api.version);
    return api;
  }
  return Error("NCCL", "library",
               "cannot be opened (set KILN_NCCL_LIBRARY to libnccl.so.2); "
               "tried:" + tried);
}

} // namespace

Expected<const NcclApi *> loadNccl() {
  static std::mutex mutex;
  static std::optional<Expected<NcclApi>> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  if (!loaded)
    loaded.emplace(open());
  if (!*loaded)
    return loaded->error();
  return &**loaded;
}

} // namespace kiln::cuda
