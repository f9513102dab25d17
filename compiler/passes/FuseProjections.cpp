//===- FuseProjections.cpp - One mat-vec for projections of one input -----===//
//
// The field bug this makes impossible: merged projections whose parts were
// laid out in the order a file streamed them. Here the segment map is
// written from program order when the ops are fused, travels with the op
// (and into the artifact), and every consumer reads its part at the offset
// the map gives; no tensor order in any file is ever consulted.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"

#include "kiln/KilnOps.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "llvm/ADT/MapVector.h"

namespace mlir::kiln {
#define GEN_PASS_DEF_FUSEPROJECTIONS
#include "passes/Passes.h.inc"
} // namespace mlir::kiln

using namespace mlir;
namespace kd = mlir::kiln;

mlir::kiln::SegmentAttr mlir::kiln::projectionSegment(QWeightType weight,
                                                      int64_t offset) {
  return SegmentAttr::get(weight.getContext(), weight.getStem(), offset,
                          weight.getDims()[1], weight.getFormat());
}

namespace {

bool fusable(kd::LinearOp op) {
  auto input = cast<RankedTensorType>(op.getInput().getType());
  return input.getRank() == 1 && op.getWeight().getType().getDims().size() == 2;
}

void fuseGroup(ArrayRef<kd::LinearOp> group) {
  kd::LinearOp first = group.front();
  // Weight handles are operand-free and pure: hoist the later members'
  // handles above the fused op so it can use them.
  for (kd::LinearOp op : group)
    if (Operation *def = op.getWeight().getDefiningOp();
        def && def->getBlock() == first->getBlock() &&
        first->isBeforeInBlock(def))
      def->moveBefore(first);

  OpBuilder b(first);
  SmallVector<Value> weights;
  SmallVector<Attribute> segments;
  int64_t offset = 0;
  for (kd::LinearOp op : group) {
    kd::QWeightType w = op.getWeight().getType();
    weights.push_back(op.getWeight());
    segments.push_back(kd::projectionSegment(w, offset));
    offset += w.getDims()[1];
  }
  auto inputType = cast<RankedTensorType>(first.getInput().getType());
  auto type = RankedTensorType::get({offset}, inputType.getElementType());
  auto fused = kd::FusedLinearOp::create(b, first.getLoc(), type,
                                         first.getInput(), weights,
                                         b.getArrayAttr(segments));
  // Every part first (the builder inserts before the first member, which
  // must outlive the loop), then the members go.
  offset = 0;
  for (kd::LinearOp op : group) {
    int64_t rows = op.getWeight().getType().getDims()[1];
    SmallVector<OpFoldResult> offsets{b.getIndexAttr(offset)};
    SmallVector<OpFoldResult> sizes{b.getIndexAttr(rows)};
    SmallVector<OpFoldResult> strides{b.getIndexAttr(1)};
    Value part = tensor::ExtractSliceOp::create(b, op.getLoc(), fused, offsets,
                                                sizes, strides);
    op.getResult().replaceAllUsesWith(part);
    offset += rows;
  }
  for (kd::LinearOp op : group)
    op.erase();
}

struct FuseProjections
    : mlir::kiln::impl::FuseProjectionsBase<FuseProjections> {
  void runOnOperation() override {
    SmallVector<Block *> blocks;
    getOperation().walk([&](Block *block) { blocks.push_back(block); });
    for (Block *block : blocks) {
      // Program order within the block, groups in order of first member.
      llvm::MapVector<Value, SmallVector<kd::LinearOp>> groups;
      for (Operation &op : *block)
        if (auto linear = dyn_cast<kd::LinearOp>(op); linear && fusable(linear))
          groups[linear.getInput()].push_back(linear);
      for (auto &[input, group] : groups)
        if (group.size() >= 2)
          fuseGroup(group);
    }
  }
};

} // namespace
