//===- FuseNormLinear.cpp - A norm folded into the mat-vec it feeds -------===//
#include "passes/Passes.h"
#include "passes/StepAccess.h"

#include "step/StepOps.h"

namespace mlir::kiln {
#define GEN_PASS_DEF_FUSENORMLINEAR
#include "passes/Passes.h.inc"
} // namespace mlir::kiln

using namespace mlir;
namespace st = mlir::step;

namespace {

struct FuseNormLinear : mlir::kiln::impl::FuseNormLinearBase<FuseNormLinear> {
  void runOnOperation() override {
    SmallVector<std::pair<st::RMSNormOp, Operation *>> pairs;
    getOperation().walk([&](st::RMSNormOp norm) {
      // The normalised vector must be a plain arena buffer that only the
      // next op reads, as its input; nothing runs in between, so the
      // norm's input still holds the same values where the fused op reads
      // it.
      Value y = norm.getOutput();
      if (!y.getDefiningOp<st::BufferOp>() || norm.getInput() == y)
        return;
      Operation *next = st::nextCompute(norm);
      auto fused = dyn_cast_or_null<st::FusedLinearOp>(next);
      auto linear = dyn_cast_or_null<st::LinearOp>(next);
      // A plain linear as a fused one of one segment: a [K, N] weight.
      if (linear && linear.getWeight().getType().getDims().size() != 2)
        linear = nullptr;
      Value input = fused    ? fused.getInput()
                    : linear ? linear.getInput()
                             : Value();
      if (input == y && st::usedOnlyBy(y, norm, next))
        pairs.push_back({norm, next});
    });
    for (auto [norm, next] : pairs) {
      Value y = norm.getOutput();
      OpBuilder b(next);
      if (auto fused = dyn_cast<st::FusedLinearOp>(next)) {
        st::RMSNormLinearOp::create(
            b, fused.getLoc(), norm.getInput(), norm.getWeight(),
            fused.getWeights(), norm.getEpsilonAttr(), fused.getSegmentsAttr(),
            fused.getOutput(), fused.getLiveFromAttr());
      } else {
        auto linear = cast<st::LinearOp>(next);
        Value weight = linear.getWeight();
        st::RMSNormLinearOp::create(
            b, linear.getLoc(), norm.getInput(), norm.getWeight(),
            ValueRange{weight}, norm.getEpsilonAttr(),
            b.getArrayAttr({mlir::kiln::projectionSegment(
                cast<mlir::kiln::QWeightType>(weight.getType()), 0)}),
            linear.getOutput(), DenseI64ArrayAttr());
      }
      next->erase();
      norm.erase();
      st::eraseIfUnusedBuffer(y);
    }
  }
};

} // namespace
