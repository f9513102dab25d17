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

/// What an rms_norm_linear takes from the projection it replaces.
struct Projection {
  Operation *op;
  SmallVector<Value> weights;
  ArrayAttr segments;
  DenseI64ArrayAttr liveFrom;
  Value input, output;
};

/// `op` as a projection the norm can fold into: a fused_linear, or a linear
/// of a [K, N] weight as a fused one of one segment.
std::optional<Projection> projectionOf(Operation *op) {
  if (auto fused = dyn_cast_or_null<st::FusedLinearOp>(op))
    return Projection{fused,
                      llvm::to_vector(fused.getWeights()),
                      fused.getSegmentsAttr(),
                      fused.getLiveFromAttr(),
                      fused.getInput(),
                      fused.getOutput()};
  auto linear = dyn_cast_or_null<st::LinearOp>(op);
  if (!linear)
    return std::nullopt;
  auto weight = cast<mlir::kiln::QWeightType>(linear.getWeight().getType());
  if (weight.getDims().size() != 2)
    return std::nullopt;
  return Projection{linear,
                    {linear.getWeight()},
                    ArrayAttr::get(op->getContext(),
                                   {mlir::kiln::projectionSegment(weight, 0)}),
                    DenseI64ArrayAttr(),
                    linear.getInput(),
                    linear.getOutput()};
}

/// The projection `norm` folds into, if any.
std::optional<Projection> foldTarget(st::RMSNormOp norm) {
  // The normalised vector must be a plain arena buffer that only the next
  // op reads, as its input; nothing runs in between, so the norm's input
  // still holds the same values where the fused op reads it.
  Value y = norm.getOutput();
  if (!y.getDefiningOp<st::BufferOp>() || norm.getInput() == y)
    return std::nullopt;
  std::optional<Projection> next = projectionOf(st::nextCompute(norm));
  if (next && next->input == y && st::usedOnlyBy(y, norm, next->op))
    return next;
  return std::nullopt;
}

struct FuseNormLinear : mlir::kiln::impl::FuseNormLinearBase<FuseNormLinear> {
  void runOnOperation() override {
    SmallVector<std::pair<st::RMSNormOp, Projection>> pairs;
    getOperation().walk([&](st::RMSNormOp norm) {
      if (std::optional<Projection> next = foldTarget(norm))
        pairs.push_back({norm, std::move(*next)});
    });
    for (auto &[norm, next] : pairs) {
      Value y = norm.getOutput();
      OpBuilder b(next.op);
      st::RMSNormLinearOp::create(
          b, next.op->getLoc(), norm.getInput(), norm.getWeight(), next.weights,
          norm.getEpsilonAttr(), next.segments, next.output, next.liveFrom);
      next.op->erase();
      norm.erase();
      st::eraseIfUnusedBuffer(y);
    }
  }
};

} // namespace

std::optional<SmallVector<mlir::kiln::QWeightType>>
mlir::kiln::projectionTakingNorm(Operation *norm) {
  auto rms = dyn_cast_or_null<st::RMSNormOp>(norm);
  std::optional<Projection> target =
      rms ? foldTarget(rms) : std::optional<Projection>();
  if (!target)
    return std::nullopt;
  SmallVector<QWeightType> types;
  for (Value w : target->weights)
    types.push_back(cast<QWeightType>(w.getType()));
  return types;
}
