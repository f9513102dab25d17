//===- FuseSwigluLinear.cpp - A swiglu folded into the mat-vec it feeds ---===//
#include "passes/Passes.h"
#include "passes/StepAccess.h"

#include "step/StepOps.h"

namespace mlir::kiln {
#define GEN_PASS_DEF_FUSESWIGLULINEAR
#include "passes/Passes.h.inc"
} // namespace mlir::kiln

using namespace mlir;
namespace st = mlir::step;

namespace {

struct FuseSwigluLinear
    : mlir::kiln::impl::FuseSwigluLinearBase<FuseSwigluLinear> {
  void runOnOperation() override {
    SmallVector<std::pair<st::SwiGLUOp, st::LinearOp>> pairs;
    getOperation().walk([&](st::SwiGLUOp swiglu) {
      // The product must be a plain arena vector that only the next op
      // reads, as the input of a mat-vec with a 2-D weight; nothing runs in
      // between, so gate and up still hold the same values where the fused
      // op reads them.
      Value h = swiglu.getOutput();
      if (!h.getDefiningOp<st::BufferOp>() || swiglu.getLhs() == h ||
          swiglu.getRhs() == h || cast<MemRefType>(h.getType()).getRank() != 1)
        return;
      auto linear = dyn_cast_or_null<st::LinearOp>(st::nextCompute(swiglu));
      if (!linear || linear.getInput() != h ||
          linear.getWeight().getType().getDims().size() != 2)
        return;
      if (st::usedOnlyBy(h, swiglu, linear))
        pairs.push_back({swiglu, linear});
    });
    for (auto [swiglu, linear] : pairs) {
      Value h = swiglu.getOutput();
      OpBuilder b(linear);
      st::SwiGLULinearOp::create(b, linear.getLoc(), swiglu.getLhs(),
                                 swiglu.getRhs(), linear.getWeight(),
                                 linear.getOutput());
      linear.erase();
      swiglu.erase();
      st::eraseIfUnusedBuffer(h);
    }
  }
};

} // namespace
