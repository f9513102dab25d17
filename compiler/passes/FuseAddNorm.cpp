//===- FuseAddNorm.cpp - Residual add and the next norm in one pass -------===//
#include "passes/Passes.h"
#include "passes/StepAccess.h"

#include "step/StepOps.h"

namespace mlir::kiln {
#define GEN_PASS_DEF_FUSEADDNORM
#include "passes/Passes.h.inc"
} // namespace mlir::kiln

using namespace mlir;
namespace st = mlir::step;

namespace {

struct FuseAddNorm : mlir::kiln::impl::FuseAddNormBase<FuseAddNorm> {
  void runOnOperation() override {
    SmallVector<std::pair<st::AddOp, st::RMSNormOp>> pairs;
    getOperation().walk([&](st::AddOp add) {
      // The sum must be a plain arena buffer (not a view, not a slot), so
      // writing it together with the norm changes nothing else.
      if (!add.getOutput().getDefiningOp<st::BufferOp>())
        return;
      auto norm = dyn_cast_or_null<st::RMSNormOp>(st::nextCompute(add));
      if (norm && norm.getInput() == add.getOutput() &&
          norm.getOutput() != add.getOutput())
        pairs.push_back({add, norm});
    });
    for (auto [add, norm] : pairs) {
      OpBuilder b(norm);
      st::AddRMSNormOp::create(b, norm.getLoc(), add.getLhs(), add.getRhs(),
                               norm.getWeight(), norm.getEpsilonAttr(),
                               add.getOutput(), norm.getOutput());
      norm.erase();
      add.erase();
    }

    // After partitioning: a sum over ranks whose result is only that add's
    // operand joins it (the collective, the residual add and the next norm
    // in one op). IEEE addition commutes, so the operand order of the add
    // does not matter.
    SmallVector<std::pair<st::AllReduceOp, st::AddRMSNormOp>> reductions;
    getOperation().walk([&](st::AllReduceOp reduce) {
      Value r = reduce.getOutput();
      if (reduce.getReduction() != "sum" || !r.getDefiningOp<st::BufferOp>() ||
          reduce.getInput() == r)
        return;
      auto fused = dyn_cast_or_null<st::AddRMSNormOp>(st::nextCompute(reduce));
      if (!fused || (fused.getLhs() == r) == (fused.getRhs() == r))
        return;
      // The reduced buffer must have no reader but the fused op.
      if (st::usedOnlyBy(r, reduce, fused))
        reductions.push_back({reduce, fused});
    });
    for (auto [reduce, fused] : reductions) {
      Value r = reduce.getOutput();
      Value residual = fused.getLhs() == r ? fused.getRhs() : fused.getLhs();
      OpBuilder b(fused);
      st::AllReduceAddRMSNormOp::create(
          b, fused.getLoc(), reduce.getInput(), residual, fused.getWeight(),
          /*bias=*/Value(), fused.getEpsilonAttr(), reduce.getReductionAttr(),
          /*tail=*/IntegerAttr(), /*top_k=*/IntegerAttr(),
          /*gating=*/StringAttr(), /*normalize=*/BoolAttr(),
          /*routed_scale=*/FloatAttr(), fused.getSum(), fused.getOutput(),
          /*logits=*/Value(), /*ids=*/Value(), /*weights=*/Value());
      fused.erase();
      reduce.erase();
      st::eraseIfUnusedBuffer(r);
    }
  }
};

} // namespace
