//===- PlanMemory.cpp - Static memory plan of a step: one arena ------------===//
//
// Liveness from declared effects, then greedy placement, largest buffer
// first, at the lowest aligned offset that collides with no buffer whose
// live interval meets its own. An interval can be held for `reuse-distance`
// more ops than its last access: reusing bytes is a write after the
// previous owner's reads, which a backend that runs independent ops side by
// side must order, so bytes freed only just before are worth not taking.
// The capture verifier re-checks the offsets this pass writes, with its own
// per-access analysis, so a bug here is caught rather than trusted.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"
#include "passes/StepAccess.h"
#include "step/StepOps.h"

#include "llvm/ADT/STLExtras.h"

#include <algorithm>

namespace mlir::kiln {
#define GEN_PASS_DEF_PLANMEMORY
#include "passes/Passes.h.inc"
} // namespace mlir::kiln

using namespace mlir;
using namespace mlir::step;

namespace {

/// A buffer, its size and the ops during which it holds a value: from the
/// first op that touches it to the last (inclusive), in program order.
struct LiveBuffer {
  BufferOp op;
  int64_t bytes = 0;
  int64_t first = 0;
  int64_t last = -1; ///< Below `first` when nothing touches the buffer.

  /// Whether the bytes of the two may not be shared: their intervals,
  /// each held `hold` more ops, meet.
  bool meets(const LiveBuffer &o, int64_t hold) const {
    if (last < first || o.last < o.first) // untouched: no bytes needed
      return false;
    return first <= o.last + hold && o.first <= last + hold;
  }
};

int64_t alignUp(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

struct PlanMemory : mlir::kiln::impl::PlanMemoryBase<PlanMemory> {
  using PlanMemoryBase::PlanMemoryBase;

  void runOnOperation() override {
    func::FuncOp func = getOperation();
    if (alignment <= 0 || (alignment & (alignment - 1)) != 0) {
      func.emitError("kiln-plan-memory: alignment must be a power of two, "
                     "got ")
          << static_cast<int64_t>(alignment);
      return signalPassFailure();
    }
    if (reuseDistance < 0) {
      func.emitError("kiln-plan-memory: reuse-distance must not be "
                     "negative, got ")
          << static_cast<int64_t>(reuseDistance);
      return signalPassFailure();
    }

    SmallVector<LiveBuffer> buffers;
    DenseMap<Operation *, size_t> index;
    func.walk([&](BufferOp op) {
      index[op] = buffers.size();
      buffers.push_back({op, op.getSizeInBytes(), 0, -1});
    });
    if (buffers.empty())
      return;

    // Live intervals over program order, through views.
    int64_t position = 0;
    SmallVector<Access> accesses;
    WalkResult walk = func.walk([&](Operation *op) {
      if (isDeclaration(op) || isa<ViewOp>(op))
        return WalkResult::advance();
      ++position;
      accesses.clear();
      if (!collectAccesses(op, accesses)) {
        for (Value v : op->getOperands())
          if (std::optional<BufferRef> ref = resolveBuffer(v);
              ref && isa<BufferOp>(ref->root)) {
            op->emitOpError("has unknown memory effects on ")
                << describeBuffer(v) << "; cannot plan this step";
            return WalkResult::interrupt();
          }
        return WalkResult::advance();
      }
      for (const Access &a : accesses) {
        std::optional<BufferRef> ref = resolveBuffer(a.value);
        if (!ref || !isa<BufferOp>(ref->root))
          continue;
        LiveBuffer &b = buffers[index[ref->root]];
        if (b.last < b.first)
          b.first = position;
        b.last = position;
      }
      return WalkResult::advance();
    });
    if (walk.wasInterrupted())
      return signalPassFailure();

    // Peak live bytes: the most bytes held at any one op.
    SmallVector<int64_t> delta(position + 2, 0);
    for (const LiveBuffer &b : buffers)
      if (b.last >= b.first) {
        delta[b.first] += b.bytes;
        delta[b.last + 1] -= b.bytes;
      }
    int64_t live = 0, peak = 0;
    for (int64_t d : delta)
      peak = std::max(peak, live += d);

    // Largest first; among equals, earliest first, so the plan does not
    // depend on anything but the program.
    SmallVector<size_t> order(buffers.size());
    for (size_t i = 0; i < order.size(); ++i)
      order[i] = i;
    llvm::stable_sort(order, [&](size_t a, size_t b) {
      if (buffers[a].bytes != buffers[b].bytes)
        return buffers[a].bytes > buffers[b].bytes;
      return buffers[a].first < buffers[b].first;
    });

    SmallVector<int64_t> offsets(buffers.size(), -1);
    SmallVector<size_t> placed;
    SmallVector<std::pair<int64_t, int64_t>> taken;
    int64_t arena = 0;
    for (size_t i : order) {
      const LiveBuffer &b = buffers[i];
      taken.clear();
      for (size_t j : placed)
        if (b.meets(buffers[j], reuseDistance))
          taken.push_back({offsets[j], offsets[j] + buffers[j].bytes});
      llvm::sort(taken);
      int64_t at = 0;
      for (auto [begin, end] : taken) {
        if (at + b.bytes <= begin)
          break;
        at = std::max(at, alignUp(end, alignment));
      }
      offsets[i] = at;
      placed.push_back(i);
      arena = std::max(arena, at + b.bytes);
    }

    OpBuilder builder(func.getContext());
    for (size_t i = 0; i < buffers.size(); ++i)
      buffers[i].op.setOffset(offsets[i]);
    func->setAttr(kPlanAttrName,
                  PlanAttr::get(func.getContext(), alignUp(arena, alignment),
                                peak, alignment,
                                static_cast<int64_t>(buffers.size())));
  }
};

} // namespace
