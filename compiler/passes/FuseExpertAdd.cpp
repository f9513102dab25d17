//===- FuseExpertAdd.cpp - An add of the experts' sum folded into them ----===//
#include "passes/Passes.h"
#include "passes/StepAccess.h"

#include "step/StepOps.h"

namespace mlir::kiln {
#define GEN_PASS_DEF_FUSEEXPERTADD
#include "passes/Passes.h.inc"
} // namespace mlir::kiln

using namespace mlir;
namespace st = mlir::step;

namespace {

struct FuseExpertAdd : mlir::kiln::impl::FuseExpertAddBase<FuseExpertAdd> {
  void runOnOperation() override {
    struct Match {
      st::MoEExpertsOp experts;
      st::AddOp add;
      Value addend;
    };
    SmallVector<Match> matches;
    getOperation().walk([&](st::AddOp add) {
      for (auto [sum, other] : {std::pair(add.getLhs(), add.getRhs()),
                                std::pair(add.getRhs(), add.getLhs())}) {
        if (sum == other || !sum.getDefiningOp<st::BufferOp>())
          continue;
        st::MoEExpertsOp experts;
        bool onlyThese = true;
        for (Operation *user : sum.getUsers()) {
          if (user == add)
            continue;
          auto m = dyn_cast<st::MoEExpertsOp>(user);
          if (!m || experts || m.getOutput() != sum)
            onlyThese = false;
          else
            experts = m;
        }
        if (!onlyThese || !experts || experts.getAddend() ||
            !experts.getShared().empty() ||
            experts->getBlock() != add->getBlock() ||
            !experts->isBeforeInBlock(add))
          continue;
        // The experts move to the add: what they read must hold the same
        // values there.
        bool still = true;
        for (Value in :
             {experts.getInput(), experts.getIds(), experts.getWeights()})
          still &= st::unwrittenBetween(in, experts, add);
        if (!still)
          continue;
        matches.push_back({experts, add, other});
        return;
      }
    });
    for (Match &m : matches) {
      Value sum = m.experts.getOutput();
      OpBuilder b(m.add);
      st::MoEExpertsOp::create(b, m.add.getLoc(), m.experts.getInput(),
                               m.experts.getIds(), m.experts.getWeights(),
                               m.addend, m.experts.getExperts(),
                               /*shared=*/ValueRange(), m.add.getOutput());
      m.add.erase();
      m.experts.erase();
      if (sum.use_empty())
        sum.getDefiningOp()->erase();
    }
  }
};

} // namespace
