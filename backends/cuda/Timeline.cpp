//===- Timeline.cpp - The kernels of one replayed step, from CUPTI --------===//
#include "Timeline.h"

#include "RuntimeLibrary.h"

#include "common/PluginSupport.h"
#include "support/AtomicFile.h"

#include <cupti_activity.h>
#include <fmt/format.h>

#include <cxxabi.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <vector>

namespace kiln::cuda {

namespace {

/// The CUPTI calls the timeline makes, resolved from the library.
struct CuptiApi {
  CUptiResult (*registerCallbacks)(CUpti_BuffersCallbackRequestFunc,
                                   CUpti_BuffersCallbackCompleteFunc);
  CUptiResult (*enable)(CUpti_ActivityKind);
  CUptiResult (*disable)(CUpti_ActivityKind);
  CUptiResult (*flushAll)(uint32_t);
  CUptiResult (*nextRecord)(uint8_t *, size_t, CUpti_Activity **);
};

Expected<CuptiApi> open() {
  CuptiApi api{};
  Expected<std::string> path = openRuntimeLibrary(
      {"KILN_CUDA_TIMELINE",
       "CUPTI",
       "KILN_CUPTI_LIBRARY",
       {"libcupti.so.13", "libcupti.so"},
       "libcupti.so",
       "a CUPTI activity entry point",
       [&](void *lib) {
         return resolve(lib, "cuptiActivityRegisterCallbacks",
                        api.registerCallbacks) &&
                resolve(lib, "cuptiActivityEnable", api.enable) &&
                resolve(lib, "cuptiActivityDisable", api.disable) &&
                resolve(lib, "cuptiActivityFlushAll", api.flushAll) &&
                resolve(lib, "cuptiActivityGetNextRecord", api.nextRecord);
       }});
  if (!path)
    return path.error();
  return api;
}

/// One kernel the GPU ran.
struct Kernel {
  std::string name;
  uint64_t start, end, node;
  uint32_t device, stream;
};

std::mutex recordsMutex;
std::vector<Kernel> records;
const CuptiApi *api = nullptr;
constexpr size_t kBufferBytes = 8 << 20;

/// A kernel's name without its parameter list (templates kept), demangled.
std::string shortName(const char *mangled) {
  if (!mangled)
    return "?";
  int status = 0;
  char *plain = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && plain ? plain : mangled;
  std::free(plain);
  // Namespaces are the same for every kernel here: dropped.
  for (const char *noise :
       {"(anonymous namespace)::", "kiln::cuda::", "void "}) {
    for (size_t at = name.find(noise); at != std::string::npos;
         at = name.find(noise))
      name.erase(at, std::strlen(noise));
  }
  // Cut the parameter list: the last '(' at template depth 0.
  int depth = 0;
  for (size_t i = 0; i < name.size(); ++i) {
    if (name[i] == '<')
      ++depth;
    else if (name[i] == '>')
      --depth;
    else if (name[i] == '(' && depth == 0 && i > 0) {
      name.resize(i);
      break;
    }
  }
  for (char &c : name)
    if (c == ',')
      c = ';'; // the CSV's separator
  return name;
}

void CUPTIAPI requested(uint8_t **buffer, size_t *size, size_t *maxRecords) {
  *buffer = static_cast<uint8_t *>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *maxRecords = 0;
}

void CUPTIAPI completed(CUcontext, uint32_t, uint8_t *buffer, size_t,
                        size_t valid) {
  CUpti_Activity *record = nullptr;
  std::lock_guard<std::mutex> lock(recordsMutex);
  while (api && api->nextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
        record->kind != CUPTI_ACTIVITY_KIND_KERNEL)
      continue;
    const auto *k = reinterpret_cast<const CUpti_ActivityKernel10 *>(record);
    records.push_back({shortName(k->name), k->start, k->end, k->graphNodeId,
                       k->deviceId, k->streamId});
  }
  std::free(buffer);
}

Status check(CUptiResult r, const char *call) {
  if (r == CUPTI_SUCCESS)
    return Status::ok();
  return Error("KILN_CUDA_TIMELINE", call,
               fmt::format("CUPTI error {}", int(r)));
}

} // namespace

Status beginTimeline() {
  static std::optional<Expected<CuptiApi>> loaded;
  if (!loaded) {
    loaded.emplace(open());
    if (*loaded) {
      api = &**loaded;
      KILN_TRY(check(api->registerCallbacks(requested, completed),
                     "cuptiActivityRegisterCallbacks"));
    }
  }
  if (!*loaded)
    return loaded->error();
  {
    std::lock_guard<std::mutex> lock(recordsMutex);
    records.clear();
  }
  return check(api->enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL),
               "cuptiActivityEnable");
}

Status endTimeline(const std::string &path) {
  if (!api)
    return Error("KILN_CUDA_TIMELINE", "CUPTI", "no timeline was begun");
  KILN_TRY(check(api->flushAll(0), "cuptiActivityFlushAll"));
  KILN_TRY(check(api->disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL),
                 "cuptiActivityDisable"));
  std::string text = "kernel,start_ns,end_ns,device,stream,graph_node\n";
  {
    std::lock_guard<std::mutex> lock(recordsMutex);
    for (const Kernel &k : records)
      text += fmt::format("{},{},{},{},{},{}\n", k.name, k.start, k.end,
                          k.device, k.stream, k.node);
    records.clear();
  }
  AtomicFile file;
  KILN_TRY(file.create(path));
  KILN_TRY(file.writeAt(text.data(), text.size(), 0));
  return file.commit();
}

} // namespace kiln::cuda
