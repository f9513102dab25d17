//===- Progress.h - A progress bar for long work on a terminal --*- C++ -*-===//
//
// For anything that takes seconds (synthesising or loading GB of weights):
// "label [#######.....]  58%  4.1/7.1 GB  1.9 GB/s" redrawn on stderr at most
// ten times a second, only when stderr is a terminal (logs stay clean).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_SUPPORT_PROGRESS_H
#define KILN_SUPPORT_PROGRESS_H

#include <chrono>
#include <cstdint>
#include <string>

namespace kiln {

class ProgressBar {
public:
  /// `total` bytes of work; `enabled` false draws nothing (default: whether
  /// stderr is a terminal).
  ProgressBar(std::string label, uint64_t totalBytes);
  ProgressBar(std::string label, uint64_t totalBytes, bool enabled);
  ~ProgressBar() { finish(); }

  /// Reports `doneBytes` finished so far (monotonic).
  void update(uint64_t doneBytes);
  /// Draws the final state and ends the line (idempotent).
  void finish();

  /// Seconds since construction.
  double elapsedSeconds() const;

private:
  void draw(uint64_t done);

  std::string label_;
  uint64_t total_;
  bool enabled_;
  bool finished_ = false;
  uint64_t done_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point lastDraw_;
};

/// "7.1 GB", "512.0 MB", "3.0 KB": decimal units, as bandwidth is quoted.
std::string formatBytes(uint64_t bytes);

} // namespace kiln

#endif // KILN_SUPPORT_PROGRESS_H
