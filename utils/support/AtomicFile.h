//===- AtomicFile.h - Output files that appear only when complete -*- C++ -*-===//
//
// Every file Kiln writes (GGUF models, dequantised tensors, artifacts) goes
// through this: a hidden temporary file in the target's folder, written,
// fsync'ed, then renamed over the target. A failure or a crash leaves no
// half-written output and an existing target untouched.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_SUPPORT_ATOMICFILE_H
#define KILN_SUPPORT_ATOMICFILE_H

#include "support/Error.h"

#include <cstdint>
#include <string>

namespace kiln {

class AtomicFile {
public:
  AtomicFile() = default;
  AtomicFile(const AtomicFile &) = delete;
  AtomicFile &operator=(const AtomicFile &) = delete;
  /// Removes the temporary file unless commit() succeeded.
  ~AtomicFile();

  /// Creates the temporary file for `target`.
  Status create(const std::string &target);

  /// Sets the file's length (later bytes not written read as zeros and,
  /// on file systems with holes, take no disk).
  Status resize(uint64_t bytes);

  /// Writes all of `data` at `offset` (retrying short writes).
  Status writeAt(const void *data, uint64_t size, uint64_t offset);

  /// Flushes and renames the file onto the target.
  Status commit();

  int fd() const { return fd_; }

private:
  int fd_ = -1;
  std::string target_;
  std::string tempPath_;
};

} // namespace kiln

#endif // KILN_SUPPORT_ATOMICFILE_H
