//===- FuseRouterChoice.cpp - The router's choice inside its all-reduce ---===//
//
// After kiln-fold-router a MoE layer's router is a share of its logits
// before the attention's all-reduce, the all-reduce's tail that sums and
// divides them, and a step.moe_choose after it. The choice needs nothing
// but the logits and the bias, so the all-reduce can make it where the
// reduced tail already is: the moe_choose becomes the all-reduce's
// `choose` clause, defined as the same choice after the same all-reduce.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"
#include "passes/StepAccess.h"

#include "step/StepOps.h"

namespace mlir::kiln {
#define GEN_PASS_DEF_FUSEROUTERCHOICE
#include "passes/Passes.h.inc"
} // namespace mlir::kiln

using namespace mlir;
namespace st = mlir::step;

namespace {

/// A choice and the all-reduce whose logits it reads.
struct ChoiceFusion {
  st::AllReduceAddRMSNormOp reduce;
  st::MoEChooseOp choose;
};

/// The all-reduce that writes `choose`'s logits and may take the choice,
/// or none.
static st::AllReduceAddRMSNormOp reduceTaking(st::MoEChooseOp choose) {
  Value logits = choose.getLogits();
  st::AllReduceAddRMSNormOp reduce;
  for (Operation *user : logits.getUsers())
    if (auto r = dyn_cast<st::AllReduceAddRMSNormOp>(user);
        r && r.getLogits() == logits)
      reduce = r;
  if (!reduce || reduce.hasChoice() ||
      reduce->getBlock() != choose->getBlock() ||
      !reduce->isBeforeInBlock(choose))
    return {};
  // The logits as the all-reduce wrote them, for the choice alone: the
  // all-reduce keeps writing them, and the choice reads them at once.
  if (!st::usedOnlyBy(logits, reduce, choose) ||
      !st::unwrittenBetween(logits, reduce, choose))
    return {};
  // The bias must hold at the all-reduce what the choice reads.
  if (Value bias = choose.getBias())
    if (!st::availableBefore(bias, reduce) ||
        !st::unwrittenBetween(bias, reduce, choose))
      return {};
  // Its outputs are written earlier: nothing in between may see them
  // change, nor write them after.
  for (Value out : {choose.getIds(), choose.getWeights()})
    if (!st::availableBefore(out, reduce) ||
        !st::untouchedBetween(out, reduce, choose))
      return {};
  return reduce;
}

/// The all-reduce with the choice's operands and attributes in place of
/// the two ops.
static void fuse(const ChoiceFusion &m) {
  st::AllReduceAddRMSNormOp reduce = m.reduce;
  st::MoEChooseOp choose = m.choose;
  Value bias = choose.getBias(), ids = choose.getIds(),
        weights = choose.getWeights();
  for (Value v : {bias, ids, weights})
    if (v)
      st::declareBefore(v, reduce);
  OpBuilder b(reduce);
  st::AllReduceAddRMSNormOp::create(
      b, reduce.getLoc(), reduce.getPartial(), reduce.getResidual(),
      reduce.getWeight(), bias, reduce.getEpsilonAttr(),
      reduce.getReductionAttr(), reduce.getTailAttr(), choose.getTopKAttr(),
      choose.getGatingAttr(), choose.getNormalizeAttr(),
      choose.getRoutedScaleAttr(), reduce.getSum(), reduce.getOutput(),
      reduce.getLogits(), ids, weights);
  reduce.erase();
  choose.erase();
}

struct FuseRouterChoice
    : mlir::kiln::impl::FuseRouterChoiceBase<FuseRouterChoice> {
  void runOnOperation() override {
    SmallVector<ChoiceFusion> matches;
    getOperation().walk([&](st::MoEChooseOp choose) {
      if (st::AllReduceAddRMSNormOp reduce = reduceTaking(choose))
        matches.push_back({reduce, choose});
    });
    for (const ChoiceFusion &m : matches)
      fuse(m);
  }
};

} // namespace
