//===- SplitProjections.cpp - One projection per slice of its heads -------===//
//
// A projection whose heads are read in column slices (GLM-5's q_b: 192 rows
// per head without position, 64 with) would otherwise be copied out slice
// by slice after its mat-vec. Cutting the weight's rows per slice instead
// (recorded in each handle's type, gathered at load) makes every slice a
// projection of its own; fuse-projections then puts them back into one
// mat-vec with the slices as its segments, read through views.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"

#include "kiln/KilnOps.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include <map>

namespace mlir::kiln {
#define GEN_PASS_DEF_SPLITPROJECTIONS
#include "passes/Passes.h.inc"
} // namespace mlir::kiln

using namespace mlir;
namespace kd = mlir::kiln;

namespace {

/// The rows [begin, end) of every head a slice reads.
struct Cut {
  int64_t begin, end;
  bool operator<(const Cut &o) const {
    return std::tie(begin, end) < std::tie(o.begin, o.end);
  }
};

/// The cut of a slice `[0, A] [heads, B - A] [1, 1]` of `[heads, period]`,
/// or nothing when the slice is not of that form.
std::optional<Cut> cutOf(tensor::ExtractSliceOp slice, int64_t heads) {
  auto offsets = slice.getStaticOffsets();
  auto sizes = slice.getStaticSizes();
  auto strides = slice.getStaticStrides();
  if (offsets.size() != 2 || ShapedType::isDynamic(offsets[1]) ||
      offsets[0] != 0 || sizes[0] != heads || ShapedType::isDynamic(sizes[1]) ||
      strides[0] != 1 || strides[1] != 1 ||
      slice.getResultType().getRank() != 2)
    return std::nullopt;
  return Cut{offsets[1], offsets[1] + sizes[1]};
}

/// Splits `op` when its result is read only in slices of its heads; each
/// slice then reads a projection of its own. Returns whether it did.
bool split(kd::LinearOp op) {
  auto input = cast<RankedTensorType>(op.getInput().getType());
  kd::QWeightType w = op.getWeight().getType();
  auto weight = op.getWeight().getDefiningOp<kd::WeightOp>();
  if (input.getRank() != 1 || w.getDims().size() != 2 || w.hasRowCut() ||
      !weight || !op.getResult().hasOneUse())
    return false;
  auto expand = dyn_cast<tensor::ExpandShapeOp>(*op->user_begin());
  if (!expand || expand.getResultType().getRank() != 2 ||
      !expand.getResultType().hasStaticShape())
    return false;
  const int64_t heads = expand.getResultType().getDimSize(0);
  const int64_t period = expand.getResultType().getDimSize(1);
  // Every reader a slice of whole heads; slices of one cut share a
  // projection; cuts must not overlap (no row read twice).
  std::map<Cut, SmallVector<tensor::ExtractSliceOp>> cuts;
  for (Operation *user : expand->getUsers()) {
    auto slice = dyn_cast<tensor::ExtractSliceOp>(user);
    std::optional<Cut> cut = slice ? cutOf(slice, heads) : std::nullopt;
    if (!cut)
      return false;
    cuts[*cut].push_back(slice);
  }
  if (cuts.empty() || (cuts.size() == 1 && cuts.begin()->first.begin == 0 &&
                       cuts.begin()->first.end == period))
    return false;
  int64_t covered = 0;
  for (const auto &[cut, slices] : cuts) {
    if (cut.begin < covered)
      return false;
    covered = cut.end;
  }

  OpBuilder b(op);
  for (const auto &[cut, slices] : cuts) {
    const int64_t rows = cut.end - cut.begin;
    auto type = kd::QWeightType::get(
        op.getContext(), w.getName(), w.getFormat(),
        {w.getDims()[0], heads * rows}, w.getShardDim(), w.getShardParts(),
        w.getShardGroups(), cut.begin, cut.end, period);
    auto part = cast<kd::WeightOp>(b.clone(*weight));
    part.getResult().setType(type);
    auto result = RankedTensorType::get({heads * rows}, input.getElementType());
    auto linear = kd::LinearOp::create(b, op.getLoc(), result, op.getInput(),
                                       part.getResult());
    auto shaped = tensor::ExpandShapeOp::create(
        b, expand.getLoc(),
        RankedTensorType::get({heads, rows}, input.getElementType()),
        linear.getResult(), expand.getReassociationIndices());
    for (tensor::ExtractSliceOp slice : slices) {
      slice.getResult().replaceAllUsesWith(shaped.getResult());
      slice.erase();
    }
  }
  expand.erase();
  op.erase();
  if (weight.getResult().use_empty())
    weight.erase();
  return true;
}

struct SplitProjections
    : mlir::kiln::impl::SplitProjectionsBase<SplitProjections> {
  void runOnOperation() override {
    SmallVector<kd::LinearOp> linears;
    getOperation().walk([&](kd::LinearOp op) { linears.push_back(op); });
    int64_t done = 0;
    for (kd::LinearOp op : linears)
      done += split(op);
    if (done > 0)
      kd::addToCount(getOperation(), kd::kSplitProjectionsAttrName, done);
  }
};

} // namespace
