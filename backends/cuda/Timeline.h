//===- Timeline.h - The kernels of one replayed step, from CUPTI -*- C++
//-*-===//
//
// KILN_CUDA_TIMELINE=FILE: on the fifth replay of a captured step (after the
// warm-up ones), rank 0 records every kernel the GPUs ran while it replayed,
// with CUPTI's activity records (start and end on the GPU's clock), and
// writes them to FILE as CSV: kernel,start_ns,end_ns,device,stream,
// graph_node. utils/timeline.py reads it: the step's span, the time no
// kernel ran, and each kernel's time alone on the GPU (its share of the
// critical path). CUPTI is opened with dlopen on first use ($KILN_CUPTI_LIBRARY
// when set, else libcupti.so.13 and libcupti.so from the loader's path), so
// the plugin needs it only when asked. For measuring only.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_BACKENDS_CUDA_TIMELINE_H
#define KILN_BACKENDS_CUDA_TIMELINE_H

#include "support/Error.h"

#include <string>

namespace kiln::cuda {

/// The replay a timeline records (the first ones warm caches and clocks).
constexpr int kTimelineReplay = 5;

/// Starts recording kernels (the whole process: one rank records at a
/// time).
Status beginTimeline();

/// Stops recording and writes the kernels recorded since beginTimeline to
/// `path` as CSV, atomically (a temporary file renamed into place).
Status endTimeline(const std::string &path);

} // namespace kiln::cuda

#endif // KILN_BACKENDS_CUDA_TIMELINE_H
