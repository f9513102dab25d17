//===- SessionFlags.h - The flags every session tool takes ------*- C++ -*-===//
//
// kiln-run and kiln-serve open a Session from the same arguments: the
// artifact (the one positional argument), --weights FILE..., --threads N,
// --device N, --eager and --backend-dir DIR. One parser for them, so both
// tools take the same values and say the same thing about a bad one.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_SESSION_SESSIONFLAGS_H
#define KILN_RUNTIME_SESSION_SESSIONFLAGS_H

#include "session/Session.h"

#include <string>

namespace kiln::runtime {

/// What parseSessionFlag made of an argument.
enum class FlagParse {
  NotMine, ///< another flag: the tool's own, or unknown
  Taken,   ///< a session flag (with its values) or the artifact
  Bad,     ///< a session flag with a bad or missing value, or a second
           ///< artifact: `error` says which
};

/// Parses argv[i] into `options` when it is a session flag or the artifact,
/// advancing i past the values it takes. Tools call it after their own
/// flags, and report what it leaves (NotMine) as an unknown option.
FlagParse parseSessionFlag(int argc, char **argv, int &i,
                           SessionOptions &options, std::string &error);

/// The largest --threads and --device values taken.
constexpr uint32_t kMaxThreadsFlag = 4096, kMaxDeviceFlag = 1024;

} // namespace kiln::runtime

#endif // KILN_RUNTIME_SESSION_SESSIONFLAGS_H
