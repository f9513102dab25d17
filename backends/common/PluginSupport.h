//===- PluginSupport.h - What the plugins' entry points share ---*- C++ -*-===//
//
// The error plumbing of a plugin: Status/Expected propagation macros, the
// guard every C entry point runs its body in (an error or an exception
// becomes the C ABI's non-zero return and message), the lookup of a named
// step and slot by the runtime's names, checked against the bytes the
// caller passes, and the C entry points themselves, made from a plugin's
// C++ operations (PluginEntryPoints).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_BACKENDS_COMMON_PLUGINSUPPORT_H
#define KILN_BACKENDS_COMMON_PLUGINSUPPORT_H

#include "artifact/Artifact.h"
#include "backend/KilnBackend.h"
#include "common/StepOps.h"

#include <fmt/format.h>

#include <exception>
#include <map>
#include <memory>
#include <span>
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
    return Error(
        step.name, slot,
        fmt::format("the slot holds {} bytes, {} given", b.bytes(), bytes));
  return *i;
}

/// The C ABI's function table of a plugin, from its C++ operations, so that
/// every plugin's entry points guard, cast and copy alike. Ops provides:
///   using Group = ...;                  // what a kiln_group points at
///   static constexpr const char *kName; // prefixes an escaping exception
///   static Expected<std::unique_ptr<Group>> open(std::span<const uint8_t>
///       artifact, const kiln_weight_bytes *, uint32_t count,
///       const kiln_rank_options *);
///   static Status copySlot(Group &, const char *step, artifact::BufferKind,
///       const char *slot, void *data, uint64_t bytes); // in, or out
///   static Status run(Group &, const char *step);
///   static Status reset(Group &);
///   static void close(std::unique_ptr<Group>); // what comes before freeing
template <typename Ops> struct PluginEntryPoints {
  using Group = typename Ops::Group;

  static Group &of(kiln_group *g) { return *reinterpret_cast<Group *>(g); }

  static int open(const uint8_t *artifact, uint64_t artifactBytes,
                  const kiln_weight_bytes *weights, uint32_t weightCount,
                  const kiln_rank_options *options, kiln_group **out,
                  char *error, uint64_t errorBytes) {
    return guarded(Ops::kName, error, errorBytes, [&]() -> Status {
      KILN_ASSIGN(group,
                  Ops::open(std::span<const uint8_t>(artifact, artifactBytes),
                            weights, weightCount, options));
      *out = reinterpret_cast<kiln_group *>(group.release());
      return Status::ok();
    });
  }
  static int writeSlot(kiln_group *g, const char *step, const char *slot,
                       const void *data, uint64_t bytes, char *error,
                       uint64_t errorBytes) {
    return guarded(Ops::kName, error, errorBytes, [&] {
      return Ops::copySlot(of(g), step, artifact::BufferKind::Input, slot,
                           const_cast<void *>(data), bytes);
    });
  }
  static int readSlot(kiln_group *g, const char *step, const char *slot,
                      void *data, uint64_t bytes, char *error,
                      uint64_t errorBytes) {
    return guarded(Ops::kName, error, errorBytes, [&] {
      return Ops::copySlot(of(g), step, artifact::BufferKind::Output, slot,
                           data, bytes);
    });
  }
  static int runStep(kiln_group *g, const char *step, char *error,
                     uint64_t errorBytes) {
    return guarded(Ops::kName, error, errorBytes,
                   [&] { return Ops::run(of(g), step); });
  }
  static int reset(kiln_group *g, char *error, uint64_t errorBytes) {
    return guarded(Ops::kName, error, errorBytes,
                   [&] { return Ops::reset(of(g)); });
  }
  static void close(kiln_group *g) {
    Ops::close(std::unique_ptr<Group>(&of(g)));
  }

  /// The table kiln_backend_entry returns.
  static constexpr kiln_backend_v1 table(const char *name,
                                         const char *description) {
    return {KILN_BACKEND_ABI_VERSION,
            sizeof(kiln_backend_v1),
            name,
            description,
            open,
            writeSlot,
            runStep,
            readSlot,
            reset,
            close};
  }
};

} // namespace kiln::backend

#endif // KILN_BACKENDS_COMMON_PLUGINSUPPORT_H
