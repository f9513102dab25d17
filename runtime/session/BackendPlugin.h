//===- BackendPlugin.h - Opening backend plugins by name --------*- C++ -*-===//
#ifndef KILN_RUNTIME_SESSION_BACKENDPLUGIN_H
#define KILN_RUNTIME_SESSION_BACKENDPLUGIN_H

#include "backend/KilnBackend.h"
#include "support/Error.h"

#include <string>
#include <vector>

namespace kiln::runtime {

/// A loaded plugin: libkiln-backend-<name>.so, dlopen'ed, its ABI checked.
/// Closing it (destruction) unloads the library; ranks must be closed first.
class BackendPlugin {
public:
  /// Finds libkiln-backend-<name>.so in, in order: `dirs`, the folders in
  /// $KILN_BACKEND_PATH (colon-separated), <dir of this executable>/../lib
  /// and the executable's own folder. Errors list every place looked.
  static Expected<BackendPlugin> open(const std::string &name,
                                      const std::vector<std::string> &dirs);

  BackendPlugin(BackendPlugin &&other) noexcept;
  BackendPlugin &operator=(BackendPlugin &&other) noexcept;
  BackendPlugin(const BackendPlugin &) = delete;
  BackendPlugin &operator=(const BackendPlugin &) = delete;
  ~BackendPlugin();

  const kiln_backend_v1 &api() const { return *api_; }
  const std::string &path() const { return path_; }

private:
  BackendPlugin() = default;
  void *handle_ = nullptr;
  const kiln_backend_v1 *api_ = nullptr;
  std::string path_;
};

} // namespace kiln::runtime

#endif // KILN_RUNTIME_SESSION_BACKENDPLUGIN_H
