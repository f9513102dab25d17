//===- FoldDequant.cpp - Norms and the router read their own weights ------===//
#include "passes/Passes.h"

#include "kiln/KilnOps.h"

namespace mlir::kiln {
#define GEN_PASS_DEF_FOLDDEQUANT
#include "passes/Passes.h.inc"
} // namespace mlir::kiln

using namespace mlir;
namespace kd = mlir::kiln;

namespace {

/// Whether `use` is an operand that accepts a weight handle directly.
bool takesWeight(OpOperand &use) {
  Operation *user = use.getOwner();
  if (auto n = dyn_cast<kd::RMSNormOp>(user))
    return &use == &n.getWeightMutable();
  if (auto n = dyn_cast<kd::LayerNormOp>(user))
    return &use == &n.getWeightMutable() || &use == &n.getBiasMutable();
  if (auto r = dyn_cast<kd::MoERouterOp>(user))
    return r.getBias() && &use == &r.getBiasMutable()[0];
  return false;
}

struct FoldDequant : mlir::kiln::impl::FoldDequantBase<FoldDequant> {
  void runOnOperation() override {
    SmallVector<kd::DequantOp> dequants;
    getOperation().walk([&](kd::DequantOp op) {
      if (op.getWeight().getType().getDims().size() == 1)
        dequants.push_back(op);
    });
    for (kd::DequantOp op : dequants) {
      for (OpOperand &use : llvm::make_early_inc_range(op->getUses()))
        if (takesWeight(use))
          use.set(op.getWeight());
      if (op->use_empty())
        op->erase();
    }
  }
};

} // namespace
