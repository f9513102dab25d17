//===- MarkLiveRows.cpp - Projection rows only an indexer reads -----------===//
#include "passes/Passes.h"

#include "step/StepOps.h"

#include "llvm/ADT/DenseMap.h"

namespace mlir::kiln {
#define GEN_PASS_DEF_MARKLIVEROWS
#include "passes/Passes.h.inc"
} // namespace mlir::kiln

using namespace mlir;
namespace st = mlir::step;

namespace {

/// A value's root buffer and the element range of it the value covers,
/// through contiguous views.
struct Span {
  Value root;
  int64_t offset = 0, size = 0;
};

Span spanOf(Value v) {
  Span s{v, 0, cast<MemRefType>(v.getType()).getNumElements()};
  while (auto view = s.root.getDefiningOp<st::ViewOp>()) {
    s.offset += view.getOffset();
    s.root = view.getSource();
  }
  return s;
}

/// Whether `operand`, as `indexer` reads it, is the only read of the
/// root's elements [offset, offset + size): every other use of the root or
/// of a view of it (except `producer`, which writes the root) covers none
/// of them.
bool onlyReader(Value root, int64_t offset, int64_t size, Value operand,
                Operation *indexer, Operation *producer) {
  SmallVector<Value> work{root};
  while (!work.empty()) {
    Value v = work.pop_back_val();
    for (OpOperand &use : v.getUses()) {
      Operation *user = use.getOwner();
      if (auto view = dyn_cast<st::ViewOp>(user)) {
        work.push_back(view.getResult());
        continue;
      }
      if ((user == producer && v == root) || (user == indexer && v == operand))
        continue;
      const Span s = spanOf(v);
      if (s.offset < offset + size && offset < s.offset + s.size)
        return false;
    }
  }
  return true;
}

struct MarkLiveRows : mlir::kiln::impl::MarkLiveRowsBase<MarkLiveRows> {
  void runOnOperation() override {
    // Per projection, the first position each segment is read from.
    llvm::DenseMap<Operation *, SmallVector<int64_t>> live;
    getOperation().walk([&](st::DSAIndexerOp indexer) {
      auto input = indexer.getPosition().getDefiningOp<st::InputOp>();
      if (!input || input.getSlotName() != "position")
        return;
      for (Value operand : {indexer.getQuery(), indexer.getHeadWeights()}) {
        Span span = spanOf(operand);
        if (!span.root.getDefiningOp<st::BufferOp>())
          continue;
        // The projection (either kind) that writes the root.
        Operation *producer = nullptr;
        ArrayAttr segments;
        size_t weights = 0;
        auto take = [&](auto f) {
          if (f && f.getOutput() == span.root) {
            producer = f;
            segments = f.getSegments();
            weights = f.getWeights().size();
          }
        };
        for (Operation *user : span.root.getUsers()) {
          take(dyn_cast<st::FusedLinearOp>(user));
          take(dyn_cast<st::RMSNormLinearOp>(user));
        }
        if (!producer)
          continue;
        // Exactly one segment's rows.
        std::optional<size_t> segment;
        for (auto [i, attr] : llvm::enumerate(segments)) {
          auto seg = cast<mlir::kiln::SegmentAttr>(attr);
          if (seg.getOffset() == span.offset && seg.getRows() == span.size)
            segment = i;
        }
        if (!segment || !onlyReader(span.root, span.offset, span.size, operand,
                                    indexer, producer))
          continue;
        auto [it, fresh] =
            live.try_emplace(producer, SmallVector<int64_t>(weights, 0));
        it->second[*segment] = indexer.getTopK();
      }
    });
    for (auto &[op, from] : live)
      op->setAttr("live_from", DenseI64ArrayAttr::get(op->getContext(), from));
  }
};

} // namespace
