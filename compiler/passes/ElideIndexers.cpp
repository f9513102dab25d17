//===- ElideIndexers.cpp - Indexers that select every position ------------===//
#include "passes/Passes.h"

#include "kiln/KilnOps.h"

#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringSet.h"

namespace mlir::kiln {
#define GEN_PASS_DEF_ELIDEINDEXERS
#include "passes/Passes.h.inc"
} // namespace mlir::kiln

using namespace mlir;
namespace kd = mlir::kiln;

namespace {

/// The state a cache handle names, or "" when it is not a kiln.state.
StringRef stateName(Value cache) {
  if (auto state = cache.getDefiningOp<kd::StateOp>())
    return state.getStateName();
  return {};
}

/// Whether every use of the indexer's results is an MLA's selection, so
/// that MLA attending 0 .. position without it replaces every reader.
bool onlyMlaReads(kd::DSAIndexerOp indexer) {
  for (Value result : indexer->getResults())
    for (OpOperand &use : result.getUses()) {
      auto mla = dyn_cast<kd::MLAAttentionOp>(use.getOwner());
      if (!mla || mla.getPosition() != indexer.getPosition())
        return false;
    }
  return true;
}

struct ElideIndexers : mlir::kiln::impl::ElideIndexersBase<ElideIndexers> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<kd::DSAIndexerOp> elided;
    module.walk([&](kd::DSAIndexerOp indexer) {
      auto cache = cast<kd::IndexCacheType>(indexer.getCache().getType());
      // Positions run from 0 to the cache's size - 1 (an append past it
      // fails at run time), so the count min(top_k, position + 1) is always
      // position + 1 and the selection is 0 .. position in order.
      if (cache.getPositions() > 0 &&
          uint64_t(cache.getPositions()) <= indexer.getTopK() &&
          onlyMlaReads(indexer))
        elided.push_back(indexer);
    });
    if (elided.empty())
      return;

    // Ops whose results may have lost their last reader.
    llvm::SetVector<Operation *> maybeDead;
    auto erase = [&](Operation *op) {
      for (Value operand : op->getOperands())
        if (Operation *def = operand.getDefiningOp())
          maybeDead.insert(def);
      maybeDead.remove(op);
      op->erase();
    };
    llvm::StringSet<> caches;
    for (kd::DSAIndexerOp indexer : elided) {
      for (Value result : indexer->getResults())
        for (OpOperand &use : llvm::make_early_inc_range(result.getUses())) {
          auto mla = cast<kd::MLAAttentionOp>(use.getOwner());
          mla.getSelectedMutable().clear();
          mla.getSelectedCountMutable().clear();
        }
      if (StringRef name = stateName(indexer.getCache()); !name.empty())
        caches.insert(name);
      if (auto func = indexer->getParentOfType<func::FuncOp>())
        kd::addToCount(func, kd::kElidedIndexersAttrName, 1);
      erase(indexer);
    }

    // A key cache that no op reads any more (states of one name are one
    // state, in every function of the module): its appends are dead.
    module.walk([&](kd::DSAIndexerOp indexer) {
      caches.erase(stateName(indexer.getCache()));
    });
    SmallVector<kd::CacheAppendOp> appends;
    module.walk([&](kd::CacheAppendOp append) {
      if (caches.contains(stateName(append.getCache())))
        appends.push_back(append);
    });
    for (kd::CacheAppendOp append : appends)
      erase(append);

    // What fed only them: the indexer's query and head-weight projections,
    // its key's projection, norm and rope, their weights and the states.
    while (!maybeDead.empty()) {
      Operation *op = maybeDead.pop_back_val();
      if (isOpTriviallyDead(op))
        erase(op);
    }
  }
};

} // namespace
