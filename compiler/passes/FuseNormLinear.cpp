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
    SmallVector<std::pair<st::RMSNormOp, st::FusedLinearOp>> pairs;
    getOperation().walk([&](st::RMSNormOp norm) {
      // The normalised vector must be a plain arena buffer that only the
      // next op reads, as its input; nothing runs in between, so the
      // norm's input still holds the same values where the fused op reads
      // it.
      Value y = norm.getOutput();
      if (!y.getDefiningOp<st::BufferOp>() || norm.getInput() == y)
        return;
      auto linear = dyn_cast_or_null<st::FusedLinearOp>(st::nextCompute(norm));
      if (!linear || linear.getInput() != y)
        return;
      if (st::usedOnlyBy(y, norm, linear))
        pairs.push_back({norm, linear});
    });
    for (auto [norm, linear] : pairs) {
      Value y = norm.getOutput();
      OpBuilder b(linear);
      st::RMSNormLinearOp::create(
          b, linear.getLoc(), norm.getInput(), norm.getWeight(),
          linear.getWeights(), norm.getEpsilonAttr(), linear.getSegmentsAttr(),
          linear.getOutput(), linear.getLiveFromAttr());
      linear.erase();
      norm.erase();
      st::eraseIfUnusedBuffer(y);
    }
  }
};

} // namespace
