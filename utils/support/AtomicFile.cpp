//===- AtomicFile.cpp - Temporary file, fsync, rename ----------------------===//
#include "support/AtomicFile.h"

#include <fmt/core.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <random>
#include <unistd.h>

namespace kiln {

AtomicFile::~AtomicFile() {
  if (fd_ >= 0)
    ::close(fd_);
  if (!tempPath_.empty())
    ::unlink(tempPath_.c_str());
}

Status AtomicFile::create(const std::string &target) {
  namespace fs = std::filesystem;
  target_ = target;
  fs::path t(target);
  std::random_device rd;
  for (int attempt = 0; attempt < 16; ++attempt) {
    std::string name = fmt::format(".{}.{}-{:08x}.tmp", t.filename().string(),
                                   getpid(), rd());
    std::string candidate = (t.parent_path() / name).string();
    // 0666 and the process umask, as for any new file.
    int fd = ::open(candidate.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                    0666);
    if (fd >= 0) {
      fd_ = fd;
      tempPath_ = candidate;
      return Status::ok();
    }
    if (errno != EEXIST)
      return Error(target, "",
                   fmt::format("cannot create a temporary file in its folder: "
                               "{}",
                               std::strerror(errno)));
  }
  return Error(target, "", "cannot create a unique temporary file");
}

Status AtomicFile::resize(uint64_t bytes) {
  if (ftruncate(fd_, static_cast<off_t>(bytes)) != 0)
    return Error(target_, "",
                 fmt::format("cannot size the file to {} bytes: {}", bytes,
                             std::strerror(errno)));
  return Status::ok();
}

Status AtomicFile::writeAt(const void *data, uint64_t size, uint64_t offset) {
  const auto *bytes = static_cast<const uint8_t *>(data);
  while (size > 0) {
    ssize_t n = pwrite(fd_, bytes, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return Error(target_, "",
                   fmt::format("write failed: {}",
                               std::strerror(n < 0 ? errno : EIO)));
    bytes += n;
    size -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Status::ok();
}

Status AtomicFile::commit() {
  if (fsync(fd_) != 0)
    return Error(target_, "",
                 fmt::format("fsync failed: {}", std::strerror(errno)));
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0)
    return Error(target_, "",
                 fmt::format("close failed: {}", std::strerror(errno)));
  if (std::rename(tempPath_.c_str(), target_.c_str()) != 0)
    return Error(target_, "",
                 fmt::format("cannot rename the temporary file into place: {}",
                             std::strerror(errno)));
  tempPath_.clear();
  return Status::ok();
}

} // namespace kiln
