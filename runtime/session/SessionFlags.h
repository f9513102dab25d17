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

/// Parses argv[i] into `options` as a session flag (advancing i past the
/// values it takes) or as the artifact. Tools call it for each argument
/// their own flags do not take: false, with `error` saying why, for a bad or
/// missing value, a second artifact or an unknown option.
bool parseSessionFlag(int argc, char **argv, int &i, SessionOptions &options,
                      std::string &error);

/// A whole decimal number in [low, high] (no sign, nothing after it): the
/// value of a numeric flag.
bool parseUnsigned(const char *text, uint64_t low, uint64_t high,
                   uint64_t &out);

/// The largest --threads and --device values taken.
constexpr uint32_t kMaxThreadsFlag = 4096, kMaxDeviceFlag = 1024;

} // namespace kiln::runtime

#endif // KILN_RUNTIME_SESSION_SESSIONFLAGS_H
