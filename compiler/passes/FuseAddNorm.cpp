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

/// Whether `reduce` is a sum whose result (a plain arena buffer) only the
/// next op reads, and that op `consumer` takes it as exactly one of its two
/// operands (IEEE addition commutes, so which one does not matter).
bool reducesInto(st::AllReduceOp reduce, Operation *consumer, Value lhs,
                 Value rhs) {
  Value r = reduce.getOutput();
  return reduce.getReduction() == "sum" && r.getDefiningOp<st::BufferOp>() &&
         reduce.getInput() != r && (lhs == r) != (rhs == r) &&
         st::usedOnlyBy(r, reduce, consumer);
}

struct FuseAddNorm : mlir::kiln::impl::FuseAddNormBase<FuseAddNorm> {
  using FuseAddNormBase::FuseAddNormBase;

  void runOnOperation() override {
    // A sum over ranks, the residual add of its result and a norm of that
    // which a projection takes (projection-norms): the collective and the
    // add as one op; the norm stays for kiln-fuse-norm-linear.
    // With router-norms, the same where the norm feeds a router of an F32
    // gate right after it: the norm and the router become one
    // step.rms_norm_router, which still writes the normalised vector for
    // the norm's other readers (the experts).
    SmallVector<std::pair<st::AllReduceOp, st::AddOp>> adds;
    SmallVector<std::pair<st::RMSNormOp, st::MoERouterOp>> routers;
    if (projectionNorms || routerNorms)
      getOperation().walk([&](st::AllReduceOp reduce) {
        auto add = dyn_cast_or_null<st::AddOp>(st::nextCompute(reduce));
        if (!add || !add.getOutput().getDefiningOp<st::BufferOp>() ||
            !reducesInto(reduce, add, add.getLhs(), add.getRhs()))
          return;
        auto norm = dyn_cast_or_null<st::RMSNormOp>(st::nextCompute(add));
        if (!norm || norm.getInput() != add.getOutput())
          return;
        auto router = dyn_cast_or_null<st::MoERouterOp>(st::nextCompute(norm));
        if (routerNorms && router && router.getInput() == norm.getOutput() &&
            router.getGate().getType().getFormat() == "f32" &&
            norm.getOutput().getDefiningOp<st::BufferOp>()) {
          adds.push_back({reduce, add});
          routers.push_back({norm, router});
          return;
        }
        if (!projectionNorms)
          return;
        // Only Q8_0 and F32 weights: the CUDA backend's mat-vecs of those
        // types normalise their input as they read it; for the others it
        // runs the norm's own kernel first, which here would add a launch
        // to the path where the collective's norm cost none.
        std::optional<SmallVector<mlir::kiln::QWeightType>> weights =
            mlir::kiln::projectionTakingNorm(norm);
        if (weights && llvm::all_of(*weights, [](mlir::kiln::QWeightType w) {
              return w.getFormat() == "q8_0" || w.getFormat() == "f32";
            }))
          adds.push_back({reduce, add});
      });
    for (auto [reduce, add] : adds) {
      Value r = reduce.getOutput();
      Value residual = add.getLhs() == r ? add.getRhs() : add.getLhs();
      OpBuilder b(add);
      st::AllReduceAddOp::create(b, add.getLoc(), reduce.getInput(), residual,
                                 reduce.getReductionAttr(), add.getOutput());
      add.erase();
      reduce.erase();
      st::eraseIfUnusedBuffer(r);
    }
    for (auto [norm, router] : routers) {
      OpBuilder b(router);
      st::RMSNormRouterOp::create(
          b, router.getLoc(), norm.getInput(), norm.getWeight(),
          router.getGate(), router.getBias(), norm.getEpsilonAttr(),
          router.getTopKAttr(), router.getGatingAttr(),
          router.getNormalizeAttr(), router.getRoutedScaleAttr(),
          norm.getOutput(), router.getIds(), router.getWeights());
      router.erase();
      norm.erase();
    }

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
    // in one op).
    SmallVector<std::pair<st::AllReduceOp, st::AddRMSNormOp>> reductions;
    getOperation().walk([&](st::AllReduceOp reduce) {
      auto fused = dyn_cast_or_null<st::AddRMSNormOp>(st::nextCompute(reduce));
      if (fused && reducesInto(reduce, fused, fused.getLhs(), fused.getRhs()))
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
