//===- StepTraffic.h - The bytes one decode step reads ----------*- C++ -*-===//
//
// What the floor of a decode step divides by the copy bandwidth
// (docs/perf.md): the bytes rank `rank`'s @decode_step must read from
// device memory at context `context`. Every weight the rank binds counts
// whole, except the routed experts, of which only top_k of E experts' rows
// are read, and the embedding, of which one row is; the caches count the
// positions attention and the indexer scan (0 .. context, at most the
// cache's length). A projection's rows that are live only from a later
// position (step.fused_linear live_from: GLM-5's indexer query and head
// weights below the indexer's top-k) are not read at a context before it.
// Attention given the indexer's selection reads only the selected rows of
// its cache: at most the selection's length (GLM-5: 2,048), whatever the
// context; the indexer reads every position's key.
// A step.linear_router (kiln-fold-router composed) reads, besides its
// weight, a matrix its backend composed at load from the router's gate and
// the next norm, E rows of K + N/R f32 values: those bytes count, read and
// bound, and the gate and norm themselves count as bound only, unless
// another op of the step reads them (the all-reduce reads the norm).
// One definition for `kiln-run --bench` and `--describe` and
// `kiln-compile --report`.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_ARTIFACT_STEPTRAFFIC_H
#define KILN_RUNTIME_ARTIFACT_STEPTRAFFIC_H

#include "artifact/Artifact.h"

#include <cstdint>

namespace kiln::artifact {

struct StepTraffic {
  uint64_t weightBytes = 0; ///< read per step
  /// Bound by the rank (every expert), composed matrices included.
  uint64_t boundBytes = 0;
  /// Weight bytes read at later contexts but not at this one (live_from).
  uint64_t notLiveBytes = 0;
  uint64_t cacheBytes = 0; ///< read at the context
  /// Cache bytes one more attended position adds, up to selectedPositions.
  uint64_t cacheBytesPerPosition = 0;
  /// The fewest positions an attention given a selection reads (0: no
  /// attention reads a selection), and the cache bytes one more position
  /// adds past that many (the caches read whole: the indexer's keys).
  uint64_t selectedPositions = 0;
  uint64_t cacheBytesPerPositionPast = 0;
};

/// The traffic of rank `rank`'s decode_step (zero when it has none).
StepTraffic stepTraffic(const Artifact &a, uint32_t rank, uint64_t context);

} // namespace kiln::artifact

#endif // KILN_RUNTIME_ARTIFACT_STEPTRAFFIC_H
