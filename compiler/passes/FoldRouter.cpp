//===- FoldRouter.cpp - A MoE router's dots before the all-reduce ---------===//
//
// After partitioning, a MoE layer's router reads y = rms_norm(h) * g with
// h = x + sum_r p_r, the all-reduce's sum. Its logits G y are G (g * h) /
// rms(h), and G (g * h) = sum_r G (g * (p_r + x / tp)): each rank can take
// its share of them right after its part p_r, the all-reduce sums the
// shares with the parts, and divides them by the rms it computes anyway.
// What is left after the all-reduce is the choice (step.moe_choose).
//
// Composed (compose=true), the share is taken inside the producer: with p_r
// = W_r in_r (a row-parallel linear), G (g * (p_r + x / tp)) is
// (G diag(g) W_r) in_r plus the rank's 1/tp of G (g * x); as the ranks'
// shares only need to sum right, rank r takes its tp-th of x's columns
// whole instead of x / tp everywhere. A backend composes both matrices at
// load, and step.linear_router writes the linear and the share as one
// op's output, the all-reduce's whole partial.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"
#include "passes/StepAccess.h"

#include "step/StepOps.h"

namespace mlir::kiln {
#define GEN_PASS_DEF_FOLDROUTER
#include "passes/Passes.h.inc"
} // namespace mlir::kiln

using namespace mlir;
namespace st = mlir::step;

namespace {

/// One router found reading a fused all-reduce's output, and the op that
/// writes the all-reduce's partial.
struct RouterFold {
  st::AllReduceAddRMSNormOp reduce;
  st::MoERouterOp router;
  Operation *producer = nullptr;
  /// Composed: the producer, a row-parallel linear that becomes a
  /// step.linear_router.
  st::LinearOp linear;
};

/// Whether `op` writes `v` and does not read it.
static bool onlyWrites(Operation *op, Value v) {
  SmallVector<st::Access> accesses;
  if (!st::collectAccesses(op, accesses))
    return false;
  bool writes = false;
  for (const st::Access &a : accesses) {
    if (a.value != v)
      continue;
    if (!a.write)
      return false;
    writes = true;
  }
  return writes;
}

/// Whether `producer` can become the step.linear_router of a composed fold
/// of a partial of `n` values at `tp` ranks: a linear of one vector by a
/// 2-D weight cut by rows into `tp` parts (each rank's input is its part
/// of the weight's input, and the parts' products sum to the whole), with
/// `n` outputs, which the ranks' shares of the residual divide evenly.
static st::LinearOp composableLinear(Operation *producer, int64_t n,
                                     int64_t tp) {
  auto linear = dyn_cast<st::LinearOp>(producer);
  if (!linear || n % tp != 0)
    return {};
  mlir::kiln::QWeightType w = linear.getWeight().getType();
  auto input = cast<MemRefType>(linear.getInput().getType());
  if (w.getDims().size() != 2 || w.getDims()[1] != n || w.getShardDim() != 0 ||
      w.getShardParts() != tp || w.getShardGroups() != 1 ||
      input.getRank() != 1 || !input.getElementType().isF32())
    return {};
  return linear;
}

static std::optional<RouterFold>
matchRouterFold(st::AllReduceAddRMSNormOp reduce, int64_t tp, bool compose) {
  if (reduce.getTail() || reduce.getLogits())
    return std::nullopt;
  Value partial = reduce.getPartial(), y = reduce.getOutput();
  auto type = cast<MemRefType>(partial.getType());
  // The all-reduce reads it as its partial only (not in place, not as the
  // residual): only that operand grows.
  if (!partial.getDefiningOp<st::BufferOp>() || type.getRank() != 1 ||
      !type.getElementType().isF32() ||
      llvm::count(reduce->getOperands(), partial) != 1)
    return std::nullopt;
  const int64_t n = type.getDimSize(0);

  // The router reads the normalised sum, still as the all-reduce wrote it.
  RouterFold m;
  m.reduce = reduce;
  for (Operation *user : y.getUsers())
    if (auto r = dyn_cast<st::MoERouterOp>(user); r && r.getInput() == y) {
      m.router = r;
      break;
    }
  if (!m.router || m.router->getBlock() != reduce->getBlock() ||
      !reduce->isBeforeInBlock(m.router) ||
      !st::unwrittenBetween(y, reduce, m.router))
    return std::nullopt;
  // Its dots move to f32 shares of a sum: an f32 gate, rows as wide as y.
  mlir::kiln::QWeightType gate = m.router.getGate().getType();
  if (gate.getFormat() != "f32" || gate.getDims().size() != 2 ||
      gate.getDims()[0] != n)
    return std::nullopt;

  // The partial: an arena buffer one op writes (and does not read) before
  // the all-reduce, which alone reads it. It grows by the router's tail.
  for (Operation *user : partial.getUsers()) {
    if (user == reduce)
      continue;
    if (m.producer && m.producer != user)
      return std::nullopt;
    m.producer = user;
  }
  if (!m.producer || m.producer->getBlock() != reduce->getBlock() ||
      !m.producer->isBeforeInBlock(reduce) || !onlyWrites(m.producer, partial))
    return std::nullopt;

  // The shares are taken right after the producer: the residual and the
  // norm's weight must hold there what the all-reduce reads.
  Value residual = reduce.getResidual(), norm = reduce.getWeight();
  for (Value v : {residual, norm, Value(m.router.getGate())})
    if (!st::availableBefore(v, m.producer))
      return std::nullopt;
  if (!st::unwrittenBetween(residual, m.producer, reduce) ||
      !st::unwrittenBetween(norm, m.producer, reduce))
    return std::nullopt;

  // Composed, the producer must be a row-parallel linear and the norm a
  // weight whose values a backend reads at load. A layer that does not
  // compose keeps its router: it does not fall back to the simpler fold,
  // so that a step has one form of the fold or the other, never both.
  if (compose) {
    auto normWeight = dyn_cast<mlir::kiln::QWeightType>(norm.getType());
    m.linear = composableLinear(m.producer, n, tp);
    if (!m.linear || !normWeight || normWeight.getFormat() != "f32")
      return std::nullopt;
  }
  return m;
}

/// The name of the logits buffer: the router's ids buffer's, with
/// `logits` for `ids`.
static std::string logitsName(st::MoERouterOp router) {
  auto ids = router.getIds().getDefiningOp<st::BufferOp>();
  if (!ids)
    return "router.logits";
  StringRef name = ids.getBufferName();
  name.consume_back(".ids");
  return (name + ".logits").str();
}

/// The all-reduce of `whole` (the partial, n + E values) with the router's
/// tail in place of the old one, a logits buffer for it, and the choice of
/// those logits in place of the router.
static void reduceWithTail(const RouterFold &m, Value whole) {
  st::AllReduceAddRMSNormOp reduce = m.reduce;
  st::MoERouterOp router = m.router;
  const int64_t experts = router.getGate().getType().getDims()[1];
  Type f32 = cast<MemRefType>(whole.getType()).getElementType();
  OpBuilder b(reduce);
  Value logits =
      st::BufferOp::create(b, router.getLoc(), MemRefType::get({experts}, f32),
                           b.getStringAttr(logitsName(router)), IntegerAttr());
  st::AllReduceAddRMSNormOp::create(
      b, reduce.getLoc(), whole, reduce.getResidual(), reduce.getWeight(),
      /*bias=*/Value(), reduce.getEpsilonAttr(), reduce.getReductionAttr(),
      b.getI64IntegerAttr(experts), /*top_k=*/IntegerAttr(),
      /*gating=*/StringAttr(), /*normalize=*/BoolAttr(),
      /*routed_scale=*/FloatAttr(), reduce.getSum(), reduce.getOutput(), logits,
      /*ids=*/Value(), /*weights=*/Value());
  reduce.erase();

  b.setInsertionPoint(router);
  st::MoEChooseOp::create(
      b, router.getLoc(), logits, router.getBias(), router.getTopKAttr(),
      router.getGatingAttr(), router.getNormalizeAttr(),
      router.getRoutedScaleAttr(), router.getIds(), router.getWeights());
  router.erase();
}

/// The simpler fold: a router_partial after the producer.
static void foldPartial(const RouterFold &m, float residualScale) {
  st::AllReduceAddRMSNormOp reduce = m.reduce;
  st::MoERouterOp router = m.router;
  Operation *producer = m.producer;
  Value partial = reduce.getPartial(), residual = reduce.getResidual(),
        norm = reduce.getWeight(), gate = router.getGate();
  auto oldBuffer = partial.getDefiningOp<st::BufferOp>();
  auto type = cast<MemRefType>(partial.getType());
  Type f32 = type.getElementType();
  const int64_t n = type.getDimSize(0);
  const int64_t experts = router.getGate().getType().getDims()[1];
  Location loc = reduce.getLoc();

  // The partial becomes the first n values of a buffer of n + E; the
  // producer writes them, the router's share the rest.
  OpBuilder b(producer);
  Value whole = st::BufferOp::create(
      b, oldBuffer.getLoc(), MemRefType::get({n + experts}, f32),
      oldBuffer.getBufferNameAttr(), IntegerAttr());
  Value head = st::ViewOp::create(b, loc, type, whole, b.getI64IntegerAttr(0));
  Value tail = st::ViewOp::create(b, loc, MemRefType::get({experts}, f32),
                                  whole, b.getI64IntegerAttr(n));
  for (Value v : {residual, norm, gate})
    st::declareBefore(v, producer);
  partial.replaceAllUsesWith(head);
  oldBuffer.erase();

  b.setInsertionPointAfter(producer);
  st::RouterPartialOp::create(b, router.getLoc(), head, residual, gate, norm,
                              b.getF32FloatAttr(residualScale), tail);
  reduceWithTail(m, whole);
}

/// The composed fold: a linear_router in the producing linear's place
/// writes the whole partial of n + E values.
static void foldComposed(const RouterFold &m, int64_t tp) {
  st::LinearOp linear = m.linear;
  st::AllReduceAddRMSNormOp reduce = m.reduce;
  st::MoERouterOp router = m.router;
  Value partial = reduce.getPartial(), residual = reduce.getResidual(),
        norm = reduce.getWeight(), gate = router.getGate();
  auto oldBuffer = partial.getDefiningOp<st::BufferOp>();
  auto type = cast<MemRefType>(partial.getType());
  const int64_t n = type.getDimSize(0);
  const int64_t experts = router.getGate().getType().getDims()[1];

  OpBuilder b(linear);
  Value whole = st::BufferOp::create(
      b, oldBuffer.getLoc(),
      MemRefType::get({n + experts}, type.getElementType()),
      oldBuffer.getBufferNameAttr(), IntegerAttr());
  for (Value v : {residual, norm, gate})
    st::declareBefore(v, linear);
  st::LinearRouterOp::create(b, linear.getLoc(), linear.getInput(),
                             linear.getWeight(), residual, gate, norm,
                             b.getI64IntegerAttr(tp), whole);
  reduceWithTail(m, whole);
  linear.erase();
  oldBuffer.erase();
}

struct FoldRouter : mlir::kiln::impl::FoldRouterBase<FoldRouter> {
  using FoldRouterBase::FoldRouterBase;
  void runOnOperation() override {
    // Without tensor parallelism there is no all-reduce to fold into.
    auto tp = getOperation()->getAttrOfType<IntegerAttr>("kiln.tp");
    if (!tp || tp.getInt() <= 1)
      return;
    SmallVector<RouterFold> matches;
    getOperation().walk([&](st::AllReduceAddRMSNormOp reduce) {
      if (std::optional<RouterFold> m =
              matchRouterFold(reduce, tp.getInt(), compose))
        matches.push_back(*m);
    });
    const float residualScale = 1.0f / float(tp.getInt());
    for (const RouterFold &m : matches) {
      if (compose)
        foldComposed(m, tp.getInt());
      else
        foldPartial(m, residualScale);
    }
  }
};

} // namespace
