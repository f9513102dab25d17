//===- StepSchedule.h - A step's ops as a dataflow graph over branches ----===//
//
// A step's ops are listed in an order that is correct when they run one
// after another. Many of them need not: the latent cache's norm and rope,
// the indexer key's norm, rope and append, and the shared expert beside the
// routed experts touch disjoint memory. scheduleStep() finds, from the
// bytes each op reads and writes, which earlier ops each op must follow
// (read after write, write after read, write after write), and lays the
// ops out on a few parallel branches (the CUDA backend's streams, captured
// into one graph) so that every such pair stays ordered and independent
// ops may overlap.
//
// The result orders at least every conflicting pair (and every pair of
// `ordered` ops, e.g. collectives, which every rank must issue in the same
// order); it may order more, never less. Running the ops in list order on
// one branch is always a valid schedule of the same step, which is how the
// eager mode runs it: both give the same bits because each op is
// deterministic and sees the same inputs.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_BACKENDS_COMMON_STEPSCHEDULE_H
#define KILN_BACKENDS_COMMON_STEPSCHEDULE_H

#include <cstdint>
#include <vector>

namespace kiln::backend {

/// Bytes [begin, end) of one address space that an op reads or writes.
struct MemoryRange {
  uint64_t begin = 0, end = 0;
  bool write = false;
};

/// What one op touches. Read-only data (weights) need not be listed.
struct OpFootprint {
  std::vector<MemoryRange> ranges;
  /// Kept in list order with every other ordered op (collectives).
  bool ordered = false;
  /// A short op (elementwise work, a cache row) that the step's long
  /// chains of mat-vecs need not follow at once: where a later op close by
  /// in the list, not light, depends on the same op this one would follow
  /// and not on this one, the schedule leaves that branch to it, so it
  /// follows its dependency directly and this op waits on another branch.
  /// (A CUDA graph launches a kernel early, under its predecessor's tail,
  /// only where it has that one predecessor: docs/perf.md, thirty-sixth
  /// pass.)
  bool light = false;
};

struct StepSchedule {
  int branches = 1;
  /// Per op: its branch, 0 .. branches-1. Ops of one branch run in list
  /// order.
  std::vector<int> branch;
  /// Per op: the earlier ops on other branches it must wait for (the
  /// transitive reduction of its conflicts, restricted to other branches).
  std::vector<std::vector<int32_t>> waits;
  /// Per op: whether a later op waits for it (its completion is signalled).
  std::vector<bool> signals;
  /// Per op: whether its waits alone order it after every op it must
  /// follow, the op before it on its branch included (that op is one of
  /// the waited ops' ancestors), so that a graph may leave the edge from
  /// that op out. A kernel node with one predecessor can be launched under
  /// that predecessor's tail; one with two waits for both to end
  /// (docs/perf.md, thirty-sixth pass).
  std::vector<bool> waitsSuffice;
};

/// Whether two ops' footprints conflict (overlapping bytes, one of them
/// written; or both ordered).
bool conflicts(const OpFootprint &a, const OpFootprint &b);

/// The ops on at most `maxBranches` (>= 1) branches; see the file comment.
StepSchedule scheduleStep(const std::vector<OpFootprint> &ops,
                          int maxBranches);

/// The same step with some ops left out (`skip`, per op) on `layout`'s
/// branches (a schedule of `ops` with every op, from scheduleStep): each
/// kept op stays on its branch, and waits for the ops it conflicts with
/// that its branch does not already order before it. A left-out op is
/// nobody's predecessor: it has no waits, does not signal, and the op after
/// it on its branch follows the kept op before it. A step that leaves a few
/// ops out keeps the layout it was measured with; scheduling the rest
/// afresh would move ops to other branches.
StepSchedule scheduleOnBranches(const std::vector<OpFootprint> &ops,
                                const StepSchedule &layout,
                                const std::vector<bool> &skip);

/// Per op: whether one of its direct predecessors in `s` (the op before it
/// on its branch, or an op it waits for) is ordered (a collective). The
/// CUDA backend starts such ops without an early prefetch of their weights:
/// bytes in flight beside a latency-bound collective slow the collective
/// more than they save (docs/perf.md, fourteenth pass). Ops `skip` marks
/// (scheduleOnBranches) are nobody's predecessor and are marked false.
std::vector<bool> followsOrdered(const StepSchedule &s,
                                 const std::vector<OpFootprint> &ops,
                                 const std::vector<bool> &skip = {});

/// For checks: whether op `earlier` is ordered before op `later` by the
/// schedule (through branch order and waits). O(ops) per call.
bool scheduleOrders(const StepSchedule &s, int32_t earlier, int32_t later);

/// The captured graphs a step with DSA indexers may have, by the attended
/// positions (position + 1) a run is at: its first graph; one without the
/// indexers where each selects every attended position (attended <=
/// `selectsAll`, the smallest top-k; 0: no such graph); one whose
/// selections run by 16-block clusters from `wideFrom` attended positions
/// (0: no such graph). Below the top-k the graph without the indexers wins:
/// they would select everything either way.
enum class StepGraphKind { First, AllSelected, WideSelect };
StepGraphKind stepGraphAt(int64_t position, int64_t selectsAll,
                          int64_t wideFrom);

} // namespace kiln::backend

#endif // KILN_BACKENDS_COMMON_STEPSCHEDULE_H
