//===- FuseMoeFfn.cpp - An MoE layer's FFN half as one op -----------------===//
#include "passes/Passes.h"
#include "passes/StepAccess.h"

#include "step/StepOps.h"

namespace mlir::kiln {
#define GEN_PASS_DEF_FUSEMOEFFN
#include "passes/Passes.h.inc"
} // namespace mlir::kiln

using namespace mlir;
namespace st = mlir::step;

namespace {

/// The four ops of an MoE layer's FFN half, as the lowering and the earlier
/// fusions leave them.
struct MoeFfnChain {
  st::MoERouterOp router;
  st::FusedLinearOp sharedGateUp;
  st::SwiGLULinearOp sharedDown;
  st::MoEExpertsOp experts;
};

/// Whether `v` is a plain arena buffer (not a slot, a view or a weight):
/// only those can vanish into a fused op.
bool isArenaBuffer(Value v) { return bool(v.getDefiningOp<st::BufferOp>()); }

/// Whether `view` is elements [offset, offset + size) of `source`.
bool isViewOf(Value view, Value source, int64_t offset, int64_t size) {
  auto v = view.getDefiningOp<st::ViewOp>();
  return v && v.getSource() == source && int64_t(v.getOffset()) == offset &&
         cast<MemRefType>(view.getType()).getNumElements() == size;
}

/// Whether every use of `v` is by one of `ops`.
bool usedOnlyByAny(Value v, ArrayRef<Operation *> ops) {
  return llvm::all_of(v.getUsers(), [&](Operation *user) {
    return llvm::is_contained(ops, user);
  });
}

/// The op of type `OpTy` that writes `v` as its output `outputOf`, or null.
template <typename OpTy, typename Get> OpTy writerOf(Value v, Get outputOf) {
  for (Operation *user : v.getUsers())
    if (auto op = dyn_cast<OpTy>(user); op && outputOf(op) == v)
      return op;
  return nullptr;
}

/// The chain that ends in `experts`, or nothing. Every link is checked
/// from the experts op back: its addend must be the shared expert's down
/// projection, whose gate and up are the two halves of the one fused
/// projection of the experts' input, and its ids and weights the outputs
/// of a router of that input. Every intermediate is an arena buffer that
/// only the chain touches, so nothing else can see it go.
std::optional<MoeFfnChain> matchChain(st::MoEExpertsOp experts) {
  Value x = experts.getInput(), shared = experts.getAddend();
  Value ids = experts.getIds(), weights = experts.getWeights();
  if (!shared || !isArenaBuffer(shared) || !isArenaBuffer(ids) ||
      !isArenaBuffer(weights))
    return std::nullopt;

  // The router. Its bias must be a weight (kiln-fold-dequant makes it
  // one), as the fused op takes it.
  auto router = writerOf<st::MoERouterOp>(
      ids, [](st::MoERouterOp r) { return r.getIds(); });
  if (!router || router.getInput() != x || router.getWeights() != weights ||
      (router.getBias() &&
       !isa<mlir::kiln::QWeightType>(router.getBias().getType())) ||
      !st::usedOnlyBy(ids, router, experts) ||
      !st::usedOnlyBy(weights, router, experts))
    return std::nullopt;

  // The shared expert's down projection writes the addend.
  auto down = writerOf<st::SwiGLULinearOp>(
      shared, [](st::SwiGLULinearOp d) { return d.getOutput(); });
  if (!down || !st::usedOnlyBy(shared, down, experts))
    return std::nullopt;

  // Its gate and up are the halves, in that order, of a projection of x by
  // two weights of equal rows.
  auto gateView = down.getGate().getDefiningOp<st::ViewOp>();
  if (!gateView || !isArenaBuffer(gateView.getSource()))
    return std::nullopt;
  Value gu = gateView.getSource();
  auto gateUp = writerOf<st::FusedLinearOp>(
      gu, [](st::FusedLinearOp f) { return f.getOutput(); });
  if (!gateUp || gateUp.getInput() != x || gateUp.getWeights().size() != 2 ||
      gateUp.getLiveFrom())
    return std::nullopt;
  const int64_t half = cast<MemRefType>(gu.getType()).getNumElements() / 2;
  for (Value w : gateUp.getWeights())
    if (cast<mlir::kiln::QWeightType>(w.getType()).getDims().back() != half)
      return std::nullopt;
  Value gate = down.getGate(), up = down.getUp();
  if (!isViewOf(gate, gu, 0, half) || !isViewOf(up, gu, half, half) ||
      !usedOnlyByAny(gu, {gateUp, gate.getDefiningOp(), up.getDefiningOp()}) ||
      !st::usedOnlyBy(gate, down, down) || !st::usedOnlyBy(up, down, down))
    return std::nullopt;
  return MoeFfnChain{router, gateUp, down, experts};
}

/// Whether the chain may become one op where the experts op is: its ops
/// in one block in dataflow order, and x holding the same values from the
/// first of them to the experts op (weights are read-only; nothing else
/// touches the intermediates).
bool movable(MoeFfnChain c) {
  Block *block = c.experts->getBlock();
  for (Operation *op : {c.router.getOperation(), c.sharedGateUp.getOperation(),
                        c.sharedDown.getOperation()})
    if (op->getBlock() != block || !op->isBeforeInBlock(c.experts))
      return false;
  if (!c.sharedGateUp->isBeforeInBlock(c.sharedDown))
    return false;
  Operation *first = c.router->isBeforeInBlock(c.sharedGateUp)
                         ? c.router.getOperation()
                         : c.sharedGateUp.getOperation();
  return st::unwrittenBetween(c.experts.getInput(), first, c.experts);
}

struct FuseMoeFfn : mlir::kiln::impl::FuseMoeFfnBase<FuseMoeFfn> {
  void runOnOperation() override {
    SmallVector<MoeFfnChain> chains;
    getOperation().walk([&](st::MoEExpertsOp experts) {
      if (std::optional<MoeFfnChain> c = matchChain(experts); c && movable(*c))
        chains.push_back(*c);
    });
    for (MoeFfnChain &c : chains) {
      OpBuilder b(c.experts);
      ValueRange shared = c.sharedGateUp.getWeights();
      st::MoEFfnOp::create(
          b, c.experts.getLoc(), c.experts.getInput(), c.router.getGate(),
          shared[0], shared[1], c.sharedDown.getWeight(),
          c.experts.getExperts(), c.router.getBias(), c.router.getTopKAttr(),
          c.router.getGatingAttr(), c.router.getNormalizeAttr(),
          c.router.getRoutedScaleAttr(), c.experts.getOutput());
      // The intermediates: ids, weights, the shared expert's projection,
      // its halves and its output.
      Value ids = c.router.getIds(), weights = c.router.getWeights();
      Value gu = c.sharedGateUp.getOutput(), out = c.sharedDown.getOutput();
      Operation *gate = c.sharedDown.getGate().getDefiningOp();
      Operation *up = c.sharedDown.getUp().getDefiningOp();
      c.experts.erase();
      c.sharedDown.erase();
      c.sharedGateUp.erase();
      c.router.erase();
      gate->erase();
      up->erase();
      for (Value v : {ids, weights, gu, out})
        st::eraseIfUnusedBuffer(v);
    }
  }
};

} // namespace
