//===- Progress.cpp - Terminal progress bar --------------------------------===//
#include "support/Progress.h"

#include <fmt/core.h>

#include <cstdio>
#include <unistd.h>

namespace kiln {

namespace {
constexpr int kBarWidth = 30;
constexpr auto kRedrawInterval = std::chrono::milliseconds(100);
} // namespace

std::string formatBytes(uint64_t bytes) {
  const char *units[] = {"B", "KB", "MB", "GB", "TB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1000.0 && u < 4) {
    v /= 1000.0;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", v, units[u]);
}

ProgressBar::ProgressBar(std::string label, uint64_t totalBytes)
    : ProgressBar(std::move(label), totalBytes, isatty(STDERR_FILENO) == 1) {}

ProgressBar::ProgressBar(std::string label, uint64_t totalBytes, bool enabled)
    : label_(std::move(label)), total_(totalBytes), enabled_(enabled),
      start_(std::chrono::steady_clock::now()), lastDraw_(start_) {}

double ProgressBar::elapsedSeconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                       start_)
      .count();
}

void ProgressBar::update(uint64_t doneBytes) {
  done_ = doneBytes;
  if (!enabled_ || finished_)
    return;
  auto now = std::chrono::steady_clock::now();
  if (now - lastDraw_ < kRedrawInterval)
    return;
  lastDraw_ = now;
  draw(doneBytes);
}

void ProgressBar::finish() {
  if (finished_)
    return;
  finished_ = true;
  if (!enabled_)
    return;
  draw(done_);
  std::fputc('\n', stderr);
}

void ProgressBar::draw(uint64_t done) {
  double fraction = total_ ? double(done) / double(total_) : 1.0;
  if (fraction > 1.0)
    fraction = 1.0;
  int filled = int(fraction * kBarWidth);
  double seconds = elapsedSeconds();
  std::string rate =
      seconds > 0 ? formatBytes(uint64_t(double(done) / seconds)) + "/s" : "";
  fmt::print(stderr, "\r{} [{}{}] {:3.0f}%  {}/{}  {}   ", label_,
             std::string(filled, '#'), std::string(kBarWidth - filled, '.'),
             fraction * 100.0, formatBytes(done), formatBytes(total_), rate);
  std::fflush(stderr);
}

} // namespace kiln
