//===- PluginSupport.h - What the plugins' entry points share ---*- C++ -*-===//
//
// The error plumbing of a plugin: Status/Expected propagation macros, the
// guard every C entry point runs its body in (an error or an exception
// becomes the C ABI's non-zero return and message), and the lookup of a
// named step and slot by the runtime's names, checked against the bytes
// the caller passes.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_BACKENDS_COMMON_PLUGINSUPPORT_H
#define KILN_BACKENDS_COMMON_PLUGINSUPPORT_H

#include "artifact/Artifact.h"
#include "common/StepOps.h"

#include <fmt/format.h>

#include <exception>
#include <map>
#include <string>

/// Returns the error of a failed Status expression.
#define KILN_TRY(expr)                                                         \
  do {                                                                         \
    if (::kiln::Status st_ = (expr); !st_)                                     \
      return st_.error();                                                      \
  } while (0)

/// Declares `var` from an Expected expression, or returns its error.
#define KILN_ASSIGN(var, expr)                                                 \
  auto var##OrError = (expr);                                                  \
  if (!var##OrError)                                                           \
    return var##OrError.error();                                               \
  auto var = std::move(*var##OrError)

namespace kiln::backend {

/// Runs a C entry point's body: 0 on success, else 1 with the message (an
/// escaping exception's too, prefixed with the plugin's name) in `error`.
template <typename Fn>
int guarded(const char *plugin, char *error, uint64_t errorBytes, Fn &&fn) {
  try {
    Status st = fn();
    if (!st) {
      setError(error, errorBytes, st.error().message());
      return 1;
    }
    return 0;
  } catch (const std::exception &e) {
    setError(error, errorBytes, std::string(plugin) + ": " + e.what());
    return 1;
  }
}

/// The prepared step named `name` in `steps`, or an error naming it.
template <typename PreparedStep>
Expected<PreparedStep *> findStep(std::map<std::string, PreparedStep> &steps,
                                  const char *name) {
  auto it = steps.find(name ? name : "");
  if (it == steps.end())
    return Error("artifact", "step",
                 fmt::format("no step named '{}'", name ? name : ""));
  return &it->second;
}

/// The buffer index of `step`'s `kind` slot named `slot`, whose size must
/// be `bytes`.
inline Expected<int32_t> findSlot(const artifact::Step &step,
                                  artifact::BufferKind kind, const char *slot,
                                  uint64_t bytes) {
  std::optional<int32_t> i = step.slot(kind, slot ? slot : "");
  if (!i)
    return Error(step.name, slot ? slot : "",
                 fmt::format("no {} slot of that name", nameOf(kind)));
  const artifact::Buffer &b = step.buffers[*i];
  if (b.bytes() != bytes)
    return Error(step.name, slot,
                 fmt::format("the slot holds {} bytes, {} given", b.bytes(),
                             bytes));
  return *i;
}

} // namespace kiln::backend

#endif // KILN_BACKENDS_COMMON_PLUGINSUPPORT_H
