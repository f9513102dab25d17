//===- FuseMlaProjection.cpp - MLA's output projection into MLA -----------===//
#include "passes/Passes.h"
#include "passes/StepAccess.h"

#include "step/StepOps.h"

namespace mlir::kiln {
#define GEN_PASS_DEF_FUSEMLAPROJECTION
#include "passes/Passes.h.inc"
} // namespace mlir::kiln

using namespace mlir;
namespace st = mlir::step;

namespace {

struct FuseMlaProjection
    : mlir::kiln::impl::FuseMlaProjectionBase<FuseMlaProjection> {
  void runOnOperation() override {
    SmallVector<std::pair<st::MLAAttentionOp, st::LinearOp>> pairs;
    getOperation().walk([&](st::MLAAttentionOp mla) {
      // The heads' latent outputs must be a plain arena buffer that only
      // the next compute op reads, a linear of a stack [latent, N, heads]
      // (one matrix a head); nothing runs in between.
      Value o = mla.getOutput();
      if (mla.getProjection() || !o.getDefiningOp<st::BufferOp>())
        return;
      auto linear = dyn_cast_or_null<st::LinearOp>(st::nextCompute(mla));
      if (!linear || linear.getInput() != o ||
          linear.getWeight().getType().getDims().size() != 3)
        return;
      if (st::usedOnlyBy(o, mla, linear))
        pairs.push_back({mla, linear});
    });
    for (auto [mla, linear] : pairs) {
      Value o = mla.getOutput();
      OpBuilder b(linear);
      st::MLAAttentionOp::create(
          b, mla.getLoc(), mla.getQLatent(), mla.getQRope(), mla.getCache(),
          mla.getPosition(), mla.getSelected(), mla.getSelectedCount(),
          linear.getWeight(), mla.getScaleAttr(), linear.getOutput());
      linear.erase();
      mla.erase();
      st::eraseIfUnusedBuffer(o);
    }
  }
};

} // namespace
