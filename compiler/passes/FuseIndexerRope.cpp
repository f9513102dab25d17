//===- FuseIndexerRope.cpp - The indexer query's rope folded into the op --===//
#include "passes/Passes.h"
#include "passes/StepAccess.h"

#include "step/StepOps.h"

namespace mlir::kiln {
#define GEN_PASS_DEF_FUSEINDEXERROPE
#include "passes/Passes.h.inc"
} // namespace mlir::kiln

using namespace mlir;
namespace st = mlir::step;

namespace {

struct FuseIndexerRope
    : mlir::kiln::impl::FuseIndexerRopeBase<FuseIndexerRope> {
  void runOnOperation() override {
    SmallVector<std::pair<st::RopeOp, st::DSAIndexerOp>> pairs;
    getOperation().walk([&](st::RopeOp rope) {
      Value rotated = rope.getOutput();
      if (!rotated.getDefiningOp<st::BufferOp>() ||
          rope.getInput() == rotated)
        return;
      st::DSAIndexerOp indexer;
      for (Operation *user : rotated.getUsers()) {
        if (user == rope)
          continue;
        auto d = dyn_cast<st::DSAIndexerOp>(user);
        if (!d || indexer || d.getQuery() != rotated ||
            d.getHeadWeights() == rotated)
          return;
        indexer = d;
      }
      if (!indexer || indexer.getRopeDims() ||
          indexer.getPosition() != rope.getPosition() ||
          indexer->getBlock() != rope->getBlock() ||
          !rope->isBeforeInBlock(indexer) ||
          !st::unwrittenBetween(rope.getInput(), rope, indexer) ||
          !st::unwrittenBetween(rope.getPosition(), rope, indexer))
        return;
      pairs.push_back({rope, indexer});
    });
    for (auto [rope, indexer] : pairs) {
      Value rotated = rope.getOutput();
      Builder b(indexer);
      indexer.getQueryMutable().assign(rope.getInput());
      indexer.setRopeStyleAttr(rope.getStyleAttr());
      indexer.setRopeThetaAttr(rope.getThetaAttr());
      indexer.setRopeOffsetAttr(rope.getOffsetAttr());
      indexer.setRopeDimsAttr(rope.getDimsAttr());
      rope.erase();
      if (rotated.use_empty())
        rotated.getDefiningOp()->erase();
    }
  }
};

} // namespace
