//===- FuseSharedExpert.cpp - A MoE layer's shared expert in its experts --===//
#include "passes/Passes.h"
#include "passes/StepAccess.h"

#include "step/StepOps.h"

namespace mlir::kiln {
#define GEN_PASS_DEF_FUSESHAREDEXPERT
#include "passes/Passes.h.inc"
} // namespace mlir::kiln

using namespace mlir;
namespace st = mlir::step;

namespace {

/// One shared expert found feeding a moe_experts' addend, and what computes
/// it: the ops that go (in erase order) and the buffers they leave unused.
struct SharedExpert {
  st::MoEExpertsOp experts;
  Value gate, up, down;
  SmallVector<Operation *> dead;
  SmallVector<Value> buffers;
};

/// The gate and up projections as the two halves (views) of one
/// fused_linear of exactly two weights: every reader of the fused buffer is
/// the fused_linear or one of the two views, and each view is read only by
/// `consumer`.
static bool matchFusedHalves(Value gate, Value up, Operation *consumer,
                             SharedExpert &m) {
  auto gateView = gate.getDefiningOp<st::ViewOp>();
  auto upView = up.getDefiningOp<st::ViewOp>();
  if (!gateView || !upView || gateView == upView ||
      gateView.getSource() != upView.getSource())
    return false;
  Value fused = gateView.getSource();
  if (!fused.getDefiningOp<st::BufferOp>() ||
      !st::usedOnlyBy(gate, consumer, consumer) ||
      !st::usedOnlyBy(up, consumer, consumer))
    return false;
  st::FusedLinearOp linear;
  for (Operation *user : fused.getUsers()) {
    if (user == gateView || user == upView)
      continue;
    auto l = dyn_cast<st::FusedLinearOp>(user);
    if (!l || linear || l.getOutput() != fused)
      return false;
    linear = l;
  }
  // live_from would make some rows stale at some positions: not what the
  // shared expert computes.
  if (!linear || linear.getWeights().size() != 2 || linear.getLiveFrom())
    return false;
  // Which weight's rows each view holds.
  auto weightOf = [&](st::ViewOp view) -> Value {
    int64_t rows = cast<MemRefType>(view.getType()).getNumElements();
    for (auto [segment, weight] :
         llvm::zip(linear.getSegments(), linear.getWeights())) {
      auto s = cast<mlir::kiln::SegmentAttr>(segment);
      if (s.getOffset() == int64_t(view.getOffset()) && s.getRows() == rows)
        return weight;
    }
    return Value();
  };
  m.gate = weightOf(gateView);
  m.up = weightOf(upView);
  if (!m.gate || !m.up || m.gate == m.up)
    return false;
  m.dead.append({gateView, upView, linear});
  m.buffers.push_back(fused);
  return true;
}

/// The gate and up projections as two step.linears of 2-D weights, each
/// into a buffer that only it writes and `consumer` reads.
static bool matchLinears(Value gate, Value up, Operation *consumer,
                         SharedExpert &m) {
  if (gate == up)
    return false;
  SmallVector<Operation *> producers;
  for (Value v : {gate, up}) {
    if (!v.getDefiningOp<st::BufferOp>())
      return false;
    st::LinearOp linear;
    for (Operation *user : v.getUsers())
      if (auto l = dyn_cast<st::LinearOp>(user); l && l.getOutput() == v)
        linear = l;
    if (!linear || linear.getWeight().getType().getDims().size() != 2 ||
        !st::usedOnlyBy(v, linear, consumer))
      return false;
    producers.push_back(linear);
  }
  auto gateLinear = cast<st::LinearOp>(producers[0]);
  auto upLinear = cast<st::LinearOp>(producers[1]);
  m.gate = gateLinear.getWeight();
  m.up = upLinear.getWeight();
  m.dead.append({gateLinear, upLinear});
  m.buffers.append({gate, up});
  return true;
}

/// The vector a gate or up projection reads.
static Value projectionInput(Operation *op) {
  if (auto fused = dyn_cast<st::FusedLinearOp>(op))
    return fused.getInput();
  if (auto linear = dyn_cast<st::LinearOp>(op))
    return linear.getInput();
  return Value();
}

static std::optional<SharedExpert> matchSharedExpert(st::MoEExpertsOp experts) {
  Value addend = experts.getAddend();
  if (!addend || !experts.getShared().empty() ||
      !addend.getDefiningOp<st::BufferOp>())
    return std::nullopt;
  st::SwiGLULinearOp down;
  for (Operation *user : addend.getUsers())
    if (auto s = dyn_cast<st::SwiGLULinearOp>(user);
        s && s.getOutput() == addend)
      down = s;
  if (!down || !st::usedOnlyBy(addend, down, experts) ||
      down->getBlock() != experts->getBlock() ||
      !down->isBeforeInBlock(experts))
    return std::nullopt;

  SharedExpert m;
  m.experts = experts;
  m.down = down.getWeight();
  m.dead.push_back(down);
  if (!matchFusedHalves(down.getGate(), down.getUp(), down, m) &&
      !matchLinears(down.getGate(), down.getUp(), down, m))
    return std::nullopt;
  m.buffers.push_back(addend);

  // The projections move to the experts: they must read the experts' own
  // input, and it must hold the same values there.
  Value input = experts.getInput();
  for (Operation *op : m.dead) {
    if (isa<st::ViewOp>(op) || op == down)
      continue;
    if (projectionInput(op) != input || op->getBlock() != down->getBlock() ||
        !op->isBeforeInBlock(down) || !st::unwrittenBetween(input, op, experts))
      return std::nullopt;
  }
  return m;
}

struct FuseSharedExpert
    : mlir::kiln::impl::FuseSharedExpertBase<FuseSharedExpert> {
  void runOnOperation() override {
    SmallVector<SharedExpert> matches;
    getOperation().walk([&](st::MoEExpertsOp experts) {
      if (std::optional<SharedExpert> m = matchSharedExpert(experts))
        matches.push_back(std::move(*m));
    });
    for (SharedExpert &m : matches) {
      st::MoEExpertsOp old = m.experts;
      OpBuilder b(old);
      st::MoEExpertsOp::create(
          b, old.getLoc(), old.getInput(), old.getIds(), old.getWeights(),
          /*addend=*/Value(), old.getExperts(),
          ValueRange{m.gate, m.up, m.down}, old.getOutput());
      old.erase();
      for (Operation *op : m.dead)
        op->erase();
      for (Value buffer : m.buffers)
        st::eraseIfUnusedBuffer(buffer);
    }
  }
};

} // namespace
