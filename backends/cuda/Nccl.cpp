//===- Nccl.cpp - NCCL, loaded at run time --------------------------------===//
#include "Nccl.h"

#include "RuntimeLibrary.h"

#include <mutex>
#include <optional>

namespace kiln::cuda {

namespace {

Expected<NcclApi> open() {
  NcclApi api;
  ncclResult_t (*getVersion)(int *) = nullptr;
  Expected<std::string> path = openRuntimeLibrary(
      {"NCCL",
       "library",
       "KILN_NCCL_LIBRARY",
       {"libnccl.so.2", "libnccl.so"},
       "libnccl.so.2",
       "an NCCL 2 entry point",
       [&](void *lib) {
         return resolve(lib, "ncclGetVersion", getVersion) &&
                resolve(lib, "ncclGetUniqueId", api.getUniqueId) &&
                resolve(lib, "ncclCommInitRank", api.commInitRank) &&
                resolve(lib, "ncclCommDestroy", api.commDestroy) &&
                resolve(lib, "ncclAllReduce", api.allReduce) &&
                resolve(lib, "ncclAllGather", api.allGather) &&
                resolve(lib, "ncclGetErrorString", api.getErrorString);
       }});
  if (!path)
    return path.error();
  api.path = *path;
  getVersion(&api.version);
  return api;
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
