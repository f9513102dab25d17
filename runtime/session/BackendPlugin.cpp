//===- BackendPlugin.cpp - Opening backend plugins by name -----------------===//
#include "session/BackendPlugin.h"

#include <fmt/format.h>

#include <dlfcn.h>
#include <filesystem>
#include <unistd.h>

namespace kiln::runtime {

namespace fs = std::filesystem;

static std::vector<std::string> searchPath(const std::vector<std::string> &dirs) {
  std::vector<std::string> out(dirs);
  if (const char *env = std::getenv("KILN_BACKEND_PATH")) {
    std::string s(env);
    size_t start = 0;
    while (start <= s.size()) {
      size_t end = s.find(':', start);
      if (end == std::string::npos)
        end = s.size();
      if (end > start)
        out.push_back(s.substr(start, end - start));
      start = end + 1;
    }
  }
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    out.push_back((self.parent_path().parent_path() / "lib").string());
    out.push_back(self.parent_path().string());
  }
  return out;
}

Expected<BackendPlugin> BackendPlugin::open(const std::string &name,
                                            const std::vector<std::string> &dirs) {
  if (name.empty() ||
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_-") !=
          std::string::npos)
    return Error("backend", name, "is not a backend name");
  std::string file = fmt::format("libkiln-backend-{}.so", name);
  std::vector<std::string> places = searchPath(dirs);
  for (const std::string &dir : places) {
    fs::path candidate = fs::path(dir) / file;
    std::error_code ec;
    if (!fs::exists(candidate, ec))
      continue;
    void *handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle)
      return Error(candidate.string(), "", fmt::format("cannot load: {}",
                                                       dlerror()));
    auto entry = reinterpret_cast<kiln_backend_entry_fn>(
        dlsym(handle, KILN_BACKEND_ENTRY_SYMBOL));
    if (!entry) {
      dlclose(handle);
      return Error(candidate.string(), KILN_BACKEND_ENTRY_SYMBOL,
                   "is not exported: not a Kiln backend plugin");
    }
    const kiln_backend_v1 *api = entry(KILN_BACKEND_ABI_VERSION);
    if (!api || api->abi_version != KILN_BACKEND_ABI_VERSION ||
        api->struct_bytes < sizeof(kiln_backend_v1)) {
      dlclose(handle);
      return Error(candidate.string(), "ABI",
                   fmt::format("the plugin does not speak backend ABI "
                               "version {} (built for another Kiln?)",
                               KILN_BACKEND_ABI_VERSION));
    }
    BackendPlugin plugin;
    plugin.handle_ = handle;
    plugin.api_ = api;
    plugin.path_ = candidate.string();
    return plugin;
  }
  std::string looked;
  for (const std::string &dir : places)
    looked += (looked.empty() ? "" : ", ") + dir;
  return Error("backend", name,
               fmt::format("no plugin {} (looked in: {}; set "
                           "KILN_BACKEND_PATH or --backend-dir)",
                           file, looked));
}

BackendPlugin::BackendPlugin(BackendPlugin &&o) noexcept
    : handle_(o.handle_), api_(o.api_), path_(std::move(o.path_)) {
  o.handle_ = nullptr;
  o.api_ = nullptr;
}

BackendPlugin &BackendPlugin::operator=(BackendPlugin &&o) noexcept {
  if (this != &o) {
    if (handle_)
      dlclose(handle_);
    handle_ = o.handle_;
    api_ = o.api_;
    path_ = std::move(o.path_);
    o.handle_ = nullptr;
    o.api_ = nullptr;
  }
  return *this;
}

BackendPlugin::~BackendPlugin() {
  if (handle_)
    dlclose(handle_);
}

} // namespace kiln::runtime
