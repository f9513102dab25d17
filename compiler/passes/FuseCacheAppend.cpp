//===- FuseCacheAppend.cpp - A cache row's norm, rope and append as one op ===//
#include "passes/Passes.h"
#include "passes/StepAccess.h"

#include "step/StepOps.h"

#include "llvm/ADT/SetVector.h"

namespace mlir::kiln {
#define GEN_PASS_DEF_FUSECACHEAPPEND
#include "passes/Passes.h.inc"
} // namespace mlir::kiln

using namespace mlir;
namespace st = mlir::step;

namespace {

/// What the fused op needs of a chain, and the ops it replaces.
struct Chain {
  st::CacheAppendOp append;
  SmallVector<Operation *> ops; ///< the chain's compute ops, append last
  Operation *norm = nullptr;    ///< st::RMSNormOp or st::LayerNormOp
  st::RopeOp rope;
  Value source;             ///< the vector the chain starts from...
  int64_t sourceOffset = 0; ///< ...at this element
  int64_t normDims = 0, ropeOffset = 0;
};

/// A plain arena buffer that no op but those of `chain` touches.
bool privateTo(Value v, ArrayRef<Operation *> chain) {
  if (!v.getDefiningOp<st::BufferOp>())
    return false;
  for (Operation *user : v.getUsers())
    if (!llvm::is_contained(chain, user))
      return false;
  return true;
}

bool isVector(Value v) {
  auto t = dyn_cast<MemRefType>(v.getType());
  return t && t.getRank() == 1 && t.getElementType().isF32();
}

int64_t elements(Value v) {
  return cast<MemRefType>(v.getType()).getNumElements();
}

Value normInput(Operation *norm) {
  if (auto rms = dyn_cast<st::RMSNormOp>(norm))
    return rms.getInput();
  return cast<st::LayerNormOp>(norm).getInput();
}

Value normOutput(Operation *norm) {
  if (auto rms = dyn_cast<st::RMSNormOp>(norm))
    return rms.getOutput();
  return cast<st::LayerNormOp>(norm).getOutput();
}

/// `v` as (source, element offset): through one step.view, or itself.
std::pair<Value, int64_t> viewed(Value v) {
  if (auto view = v.getDefiningOp<st::ViewOp>())
    return {view.getSource(), view.getOffset()};
  return {v, 0};
}

/// rope(norm(x)) -> append: the indexer key's chain.
std::optional<Chain> matchRotatedNorm(st::CacheAppendOp append) {
  Operation *ropeOp = st::previousCompute(append);
  auto r = dyn_cast_or_null<st::RopeOp>(ropeOp);
  if (!r || r.getOutput() != append.getEntry() ||
      r.getPosition() != append.getPosition())
    return std::nullopt;
  Operation *norm = st::previousCompute(r);
  if (!norm || !isa<st::RMSNormOp, st::LayerNormOp>(norm) ||
      normOutput(norm) != r.getInput())
    return std::nullopt;
  Value x = normInput(norm);
  if (!isVector(x) || !isVector(r.getInput()) ||
      elements(x) != elements(append.getEntry()))
    return std::nullopt;
  Chain c;
  c.append = append;
  c.ops = {norm, r, append};
  if (!privateTo(r.getInput(), c.ops) || !privateTo(r.getOutput(), c.ops))
    return std::nullopt;
  c.norm = norm;
  c.rope = r;
  c.source = x;
  c.normDims = elements(x);
  c.ropeOffset = r.getOffset();
  return c;
}

/// concat(norm(s[a, a + n)), rope(s[a + n, a + n + m))) -> append: the
/// latent cache's chain, the norm and the rope in either order.
std::optional<Chain> matchNormThenRotated(st::CacheAppendOp append) {
  auto concat = dyn_cast_or_null<st::ConcatOp>(st::previousCompute(append));
  if (!concat || concat.getOutput() != append.getEntry() ||
      concat.getInputs().size() != 2 || concat.getDim() != 0)
    return std::nullopt;
  Operation *second = st::previousCompute(concat);
  Operation *first = second ? st::previousCompute(second) : nullptr;
  if (!first || !second)
    return std::nullopt;
  Operation *norm = isa<st::RMSNormOp, st::LayerNormOp>(first) ? first : second;
  auto rope = dyn_cast<st::RopeOp>(norm == first ? second : first);
  if (!isa<st::RMSNormOp, st::LayerNormOp>(norm) || !rope ||
      normOutput(norm) != concat.getInputs()[0] ||
      rope.getOutput() != concat.getInputs()[1] ||
      rope.getPosition() != append.getPosition())
    return std::nullopt;
  Value a = normInput(norm), b = rope.getInput();
  if (!isVector(a) || !isVector(b) || !isVector(concat.getOutput()))
    return std::nullopt;
  auto [sourceA, offsetA] = viewed(a);
  auto [sourceB, offsetB] = viewed(b);
  if (sourceA != sourceB || offsetB != offsetA + elements(a))
    return std::nullopt;
  Chain c;
  c.append = append;
  c.ops = {first, second, concat, append};
  if (!privateTo(normOutput(norm), c.ops) ||
      !privateTo(rope.getOutput(), c.ops) ||
      !privateTo(concat.getOutput(), c.ops))
    return std::nullopt;
  c.norm = norm;
  c.rope = rope;
  c.source = sourceA;
  c.sourceOffset = offsetA;
  c.normDims = elements(a);
  c.ropeOffset = elements(a) + rope.getOffset();
  return c;
}

struct FuseCacheAppend
    : mlir::kiln::impl::FuseCacheAppendBase<FuseCacheAppend> {
  void runOnOperation() override {
    SmallVector<Chain> chains;
    getOperation().walk([&](st::CacheAppendOp append) {
      if (std::optional<Chain> c = matchRotatedNorm(append))
        chains.push_back(*c);
      else if (std::optional<Chain> c = matchNormThenRotated(append))
        chains.push_back(*c);
    });
    for (Chain &c : chains) {
      OpBuilder b(c.append);
      Location loc = c.append.getLoc();
      Value entry = c.source;
      const int64_t width = elements(c.append.getEntry());
      if (c.sourceOffset != 0 || !isVector(entry) || elements(entry) != width)
        entry =
            st::ViewOp::create(b, loc, MemRefType::get({width}, b.getF32Type()),
                               c.source, b.getI64IntegerAttr(c.sourceOffset));
      Value weight, bias;
      FloatAttr epsilon;
      StringRef kind;
      if (auto rms = dyn_cast<st::RMSNormOp>(c.norm)) {
        weight = rms.getWeight();
        epsilon = rms.getEpsilonAttr();
        kind = "rms";
      } else {
        auto layer = cast<st::LayerNormOp>(c.norm);
        weight = layer.getWeight();
        bias = layer.getBias();
        epsilon = layer.getEpsilonAttr();
        kind = "layer";
      }
      st::NormRopeAppendOp::create(
          b, loc, entry, weight, bias, c.append.getPosition(),
          b.getStringAttr(kind), b.getI64IntegerAttr(c.normDims), epsilon,
          c.rope.getStyleAttr(), c.rope.getThetaAttr(),
          b.getI64IntegerAttr(c.ropeOffset), c.rope.getDimsAttr(),
          c.append.getCache());
      // The chain's intermediates, then its ops, last first.
      SmallVector<Value> scratch;
      for (Operation *op : c.ops)
        for (Value out : cast<DestinationStyleOpInterface>(op).getDpsInits())
          if (out.getDefiningOp<st::BufferOp>())
            scratch.push_back(out);
      llvm::SetVector<Operation *> views;
      for (Operation *op : c.ops)
        for (Value in : op->getOperands())
          if (auto view = in.getDefiningOp<st::ViewOp>())
            views.insert(view);
      for (Operation *op : llvm::reverse(c.ops))
        op->erase();
      for (Operation *view : views)
        if (view->use_empty())
          view->erase();
      for (Value v : scratch)
        if (v.use_empty())
          v.getDefiningOp()->erase();
    }
  }
};

} // namespace
