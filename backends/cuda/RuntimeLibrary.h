//===- RuntimeLibrary.h - Libraries opened on first use ---------*- C++ -*-===//
//
// The CUDA plugin links neither NCCL nor CUPTI: a GPU host has its own (a
// system package, a Python wheel's copy), often not where the build
// machine's was, and most runs need neither. Each is opened on first use:
// the path in an environment variable when set, else the usual names from
// the loader's search path, the first that has every entry point the caller
// resolves.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_BACKENDS_CUDA_RUNTIMELIBRARY_H
#define KILN_BACKENDS_CUDA_RUNTIMELIBRARY_H

#include "support/Error.h"

#include <dlfcn.h>

#include <functional>
#include <string>
#include <vector>

namespace kiln::cuda {

/// Entry point `name` of `lib` into `out`; false when it lacks it.
template <typename Fn> bool resolve(void *lib, const char *name, Fn &out) {
  out = reinterpret_cast<Fn>(dlsym(lib, name));
  return out != nullptr;
}

/// What openRuntimeLibrary needs to know of one library.
struct RuntimeLibrary {
  const char *what, *field;          ///< the error's subject and field
  const char *envVar;                ///< "KILN_NCCL_LIBRARY"
  std::vector<std::string> defaults; ///< names tried when envVar is unset
  const char *hint;                  ///< the path the error suggests
  const char *lacks;                 ///< "an NCCL 2 entry point"
  /// Resolves every entry point from an opened library; false when one
  /// is missing (the library is then closed and the next one tried).
  std::function<bool(void *)> bind;
};

/// Opens the first candidate `bind` accepts and returns its path; the
/// error lists every path tried and why it was refused.
Expected<std::string> openRuntimeLibrary(const RuntimeLibrary &l);

} // namespace kiln::cuda

#endif // KILN_BACKENDS_CUDA_RUNTIMELIBRARY_H
