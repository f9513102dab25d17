//===- Partition.cpp - Tensor-parallel partitioning of kiln programs -----===//
//
// A forward walk that knows, for every value, whether each rank holds all of
// it (replicated), its part along one dimension (split) or a partial sum
// (partial). Each weight is split as its kiln.weight says (tp_split and
// tp_groups, the model builder's choice: this pass knows no tensor names),
// each op maps the states of its operands to the state of its results and
// rewrites its types to the local shapes, and a value in the wrong state for
// its user is made whole there: an all_reduce for a partial sum, an all_gather
// for a split. The rules that matter for cost are the ones that keep values
// split (heads through attention, the intermediate dimension through FFNs) so
// only two partial sums per layer need a collective.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"

#include "kiln/KilnOps.h"
#include "quant/QuantTypes.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "llvm/ADT/TypeSwitch.h"

namespace mlir::kiln {
#define GEN_PASS_DEF_PARTITION
#include "passes/Passes.h.inc"
} // namespace mlir::kiln

using namespace mlir;
namespace kd = mlir::kiln;

namespace {

enum class Kind { Replicated, Split, Partial };

struct Sharding {
  Kind kind = Kind::Replicated;
  int64_t dim = -1; ///< Split: the split dimension of the value
  static Sharding replicated() { return {}; }
  static Sharding split(int64_t d) { return {Kind::Split, d}; }
  static Sharding partial() { return {Kind::Partial, -1}; }
};

RankedTensorType withDim(Type type, int64_t dim, int64_t size) {
  auto t = cast<RankedTensorType>(type);
  SmallVector<int64_t> shape(t.getShape());
  shape[dim] = size;
  return RankedTensorType::get(shape, t.getElementType());
}

class Partitioner {
public:
  explicit Partitioner(int64_t n) : n_(n) {}
  LogicalResult run(func::FuncOp func);

private:
  LogicalResult visit(Operation *op);
  LogicalResult visitWeight(kd::WeightOp op);
  LogicalResult visitLinear(kd::LinearOp op);
  LogicalResult visitLayer(kd::LayerOp op);
  Sharding of(Value v) const {
    auto it = state_.find(v);
    return it == state_.end() ? Sharding::replicated() : it->second;
  }
  /// Makes operand `index` of `user` whole on every rank.
  LogicalResult replicateOperand(Operation *user, unsigned index);
  void replicateAll(Operation *op) {
    for (unsigned i = 0; i < op->getNumOperands(); ++i)
      (void)replicateOperand(op, i);
  }

  int64_t n_;
  DenseMap<Value, Sharding> state_;
  DenseMap<Value, Value> whole_;
};

LogicalResult Partitioner::replicateOperand(Operation *user, unsigned index) {
  Value v = user->getOperand(index);
  Sharding s = of(v);
  if (s.kind == Kind::Replicated || !isa<RankedTensorType>(v.getType()))
    return success();
  Value whole = whole_.lookup(v);
  if (!whole) {
    OpBuilder b(v.getContext());
    b.setInsertionPointAfterValue(v);
    if (s.kind == Kind::Partial) {
      whole = kd::AllReduceOp::create(b, v.getLoc(), v.getType(), v,
                                      b.getStringAttr("sum"));
    } else {
      auto t = cast<RankedTensorType>(v.getType());
      whole = kd::AllGatherOp::create(
          b, v.getLoc(), withDim(t, s.dim, t.getDimSize(s.dim) * n_), v,
          b.getI64IntegerAttr(s.dim), b.getI64IntegerAttr(n_));
    }
    whole_[v] = whole;
  }
  user->setOperand(index, whole);
  return success();
}

LogicalResult Partitioner::visitWeight(kd::WeightOp op) {
  kd::QWeightType type = op.getType();
  std::optional<int64_t> dim = op.getTpSplit();
  if (!dim)
    return success();
  // Groups of the dim cut alike (a fused gate/up: each rank takes its part
  // of the gate half and of the up half).
  const int64_t groups = op.getTpGroups().value_or(1);
  if (type.hasRowCut())
    return op.emitOpError("tensor '")
           << type.getName()
           << "' has its rows cut: kiln-split-projections runs after "
              "kiln-partition, not before";
  // The split is recorded in the type from here on.
  op.removeTpSplitAttr();
  op.removeTpGroupsAttr();
  SmallVector<int64_t> dims(type.getDims());
  if (*dim >= static_cast<int64_t>(dims.size()) ||
      dims[*dim] % (n_ * groups) != 0)
    return op.emitOpError("tensor '")
           << type.getName() << "' (" << type.getFormat() << "): dim "
           << *dim << " has " << (*dim < int64_t(dims.size()) ? dims[*dim] : 0)
           << " values, which do not split into " << n_ << " equal parts"
           << (groups > 1 ? " of each half" : "");
  int64_t part = dims[*dim] / n_;
  if (*dim == 0) {
    std::optional<::kiln::GGMLType> ggml =
        ::kiln::parseGGMLType(type.getFormat().str());
    int64_t block = ggml ? ::kiln::traitsOf(*ggml).blockSize : 1;
    if (part % block != 0)
      return op.emitOpError("tensor '")
             << type.getName() << "' (" << type.getFormat()
             << "): a tp=" << n_ << " part of ne[0] = " << dims[0] << " is "
             << part << " values, which cuts its " << block
             << "-value blocks";
  }
  dims[*dim] = part;
  op.getResult().setType(kd::QWeightType::get(op.getContext(), type.getName(),
                                              type.getFormat(), dims, *dim,
                                              n_, groups, 0, 0, 0));
  return success();
}

LogicalResult Partitioner::visitLinear(kd::LinearOp op) {
  kd::QWeightType w = op.getWeight().getType();
  ArrayRef<int64_t> dims = w.getDims();
  auto inputType = cast<RankedTensorType>(op.getInput().getType());
  Sharding in = of(op.getInput());
  int64_t last = inputType.getRank() - 1;
  if (w.getShardDim() < 0) {
    if (failed(replicateOperand(op, 0)))
      return failure();
    return success();
  }
  if (dims.size() == 2 && w.getShardDim() == 1) {
    // Column-parallel: whole input, this rank's output rows.
    if (failed(replicateOperand(op, 0)))
      return failure();
    op.getResult().setType(withDim(op.getResult().getType(), last, dims[1]));
    state_[op.getResult()] = Sharding::split(last);
    return success();
  }
  if (dims.size() == 2 && w.getShardDim() == 0) {
    // Row-parallel: this rank's part of the input, a partial sum out.
    if (in.kind != Kind::Split || in.dim != last)
      return op.emitOpError("row-parallel weight '")
             << w.getName() << "' needs its input split on its last dim";
    state_[op.getResult()] = Sharding::partial();
    return success();
  }
  if (dims.size() == 3 && w.getShardDim() == 2) {
    // One matrix per head: this rank's heads.
    if (in.kind != Kind::Split || in.dim != 0)
      return op.emitOpError("per-head weight '")
             << w.getName() << "' needs its input split by heads";
    op.getResult().setType(withDim(op.getResult().getType(), 0, dims[2]));
    state_[op.getResult()] = Sharding::split(0);
    return success();
  }
  return op.emitOpError("no partitioning rule for weight '")
         << w.getName() << "' split on dim " << w.getShardDim();
}

LogicalResult Partitioner::visitLayer(kd::LayerOp op) {
  if (failed(replicateOperand(op, 0)))
    return failure();
  Block &body = op.getBody().front();
  for (Operation &inner : llvm::make_early_inc_range(body))
    if (failed(visit(&inner)))
      return failure();
  return success();
}

LogicalResult Partitioner::visit(Operation *op) {
  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
      .Case([&](kd::WeightOp w) -> LogicalResult { return visitWeight(w); })
      .Case([&](kd::LinearOp l) -> LogicalResult { return visitLinear(l); })
      .Case([&](kd::LayerOp l) -> LogicalResult { return visitLayer(l); })
      .Case<kd::YieldOp, func::ReturnOp, kd::RMSNormOp, kd::LayerNormOp,
            kd::DSAIndexerOp, kd::MoERouterOp, kd::CacheAppendOp,
            kd::EmbedOp, kd::DequantOp, kd::StateOp,
            tensor::ConcatOp>([&](Operation *o) -> LogicalResult {
        replicateAll(o);
        return success();
      })
      .Case([&](kd::ArgmaxOp a) -> LogicalResult {
        // The argmax of split logits needs only each rank's best value and
        // index, not the logits: the whole vector is gathered only where
        // something else (the returned logits) needs it.
        Sharding s = of(a.getInput());
        if (s.kind == Kind::Split && s.dim == 0) {
          OpBuilder b(a);
          Value next = kd::DistributedArgmaxOp::create(
              b, a.getLoc(), a.getType(), a.getInput(), a.getSampling(),
              a.getPosition(), b.getI64IntegerAttr(n_));
          a.getResult().replaceAllUsesWith(next);
          a.erase();
          return success();
        }
        replicateAll(a);
        return success();
      })
      .Case<kd::RopeOp>([&](kd::RopeOp r) -> LogicalResult {
        state_[r.getResult()] = of(r.getInput());
        r.getResult().setType(r.getInput().getType());
        return success();
      })
      .Case<kd::AddOp, kd::SwiGLUOp>([&](Operation *o) -> LogicalResult {
        Sharding a = of(o->getOperand(0)), b = of(o->getOperand(1));
        bool same = a.kind == b.kind && a.dim == b.dim;
        if (!same) {
          replicateAll(o);
          a = Sharding::replicated();
        } else if (a.kind == Kind::Partial && isa<kd::SwiGLUOp>(o)) {
          replicateAll(o);
          a = Sharding::replicated();
        }
        state_[o->getResult(0)] = a;
        o->getResult(0).setType(o->getOperand(0).getType());
        return success();
      })
      .Case([&](kd::MLAAttentionOp m) -> LogicalResult {
        Sharding q = of(m.getQLatent());
        if (of(m.getQRope()).kind != q.kind ||
            (q.kind != Kind::Replicated &&
             (q.kind != Kind::Split || q.dim != 0)))
          return m.emitOpError("queries must be split by heads together");
        for (unsigned i = 2; i < m->getNumOperands(); ++i)
          if (failed(replicateOperand(m, i)))
            return failure();
        state_[m.getResult()] = q;
        m.getResult().setType(m.getQLatent().getType());
        return success();
      })
      .Case([&](kd::MoEExpertsOp m) -> LogicalResult {
        for (unsigned i = 0; i < 3; ++i)
          if (failed(replicateOperand(m, i)))
            return failure();
        bool split = llvm::any_of(m.getExperts(), [](Value w) {
          return cast<kd::QWeightType>(w.getType()).getShardDim() >= 0;
        });
        if (split)
          state_[m.getResult()] = Sharding::partial();
        return success();
      })
      .Case([&](tensor::ExpandShapeOp e) -> LogicalResult {
        Sharding s = of(e.getSrc());
        if (s.kind == Kind::Replicated)
          return success();
        if (s.kind != Kind::Split)
          return failed(replicateOperand(e, 0)) ? failure() : success();
        // The split dim must be the outer dim of its group of result dims.
        auto groups = e.getReassociationIndices();
        int64_t outer = groups[s.dim].front();
        auto local = cast<RankedTensorType>(e.getSrc().getType());
        auto old = cast<RankedTensorType>(e.getType());
        int64_t inner = 1;
        for (int64_t d : ArrayRef<int64_t>(groups[s.dim]).drop_front())
          inner *= old.getDimSize(d);
        if (local.getDimSize(s.dim) % inner != 0)
          return e.emitOpError("a split does not fall on whole groups");
        RankedTensorType type =
            withDim(old, outer, local.getDimSize(s.dim) / inner);
        OpBuilder b(e);
        auto fresh = tensor::ExpandShapeOp::create(b, e.getLoc(), type,
                                                   e.getSrc(), groups);
        e.getResult().replaceAllUsesWith(fresh.getResult());
        e.erase();
        state_[fresh.getResult()] = Sharding::split(outer);
        return success();
      })
      .Case([&](tensor::CollapseShapeOp c) -> LogicalResult {
        Sharding s = of(c.getSrc());
        if (s.kind == Kind::Replicated)
          return success();
        if (s.kind != Kind::Split)
          return failed(replicateOperand(c, 0)) ? failure() : success();
        auto groups = c.getReassociationIndices();
        for (auto [i, group] : llvm::enumerate(groups))
          if (llvm::is_contained(group, s.dim)) {
            if (group.front() != s.dim)
              return c.emitOpError("a split must be the outer dim of the "
                                   "collapsed group");
            OpBuilder b(c);
            auto fresh =
                tensor::CollapseShapeOp::create(b, c.getLoc(), c.getSrc(),
                                                groups);
            c.getResult().replaceAllUsesWith(fresh.getResult());
            c.erase();
            state_[fresh.getResult()] = Sharding::split(int64_t(i));
            return success();
          }
        return c.emitOpError("split dim not in any group");
      })
      .Case([&](tensor::ExtractSliceOp x) -> LogicalResult {
        Sharding s = of(x.getSource());
        if (s.kind == Kind::Replicated)
          return success();
        if (s.kind != Kind::Split)
          return failed(replicateOperand(x, 0)) ? failure() : success();
        auto local = cast<RankedTensorType>(x.getSource().getType());
        SmallVector<int64_t> sizes(x.getStaticSizes());
        ArrayRef<int64_t> offsets = x.getStaticOffsets();
        auto result = cast<RankedTensorType>(x.getType());
        if (result.getRank() != local.getRank() || offsets[s.dim] != 0 ||
            sizes[s.dim] != local.getDimSize(s.dim) * n_)
          return x.emitOpError("a slice of a split value must keep the whole "
                               "split dim");
        sizes[s.dim] = local.getDimSize(s.dim);
        OpBuilder b(x);
        auto fresh = tensor::ExtractSliceOp::create(
            b, x.getLoc(), withDim(result, s.dim, sizes[s.dim]), x.getSource(),
            ValueRange(), ValueRange(), ValueRange(),
            b.getDenseI64ArrayAttr(offsets), b.getDenseI64ArrayAttr(sizes),
            b.getDenseI64ArrayAttr(x.getStaticStrides()));
        x.getResult().replaceAllUsesWith(fresh.getResult());
        x.erase();
        state_[fresh.getResult()] = s;
        return success();
      })
      .Case<kd::AllReduceOp, kd::AllGatherOp, kd::DistributedArgmaxOp,
            kd::FusedLinearOp>(
          [&](Operation *o) -> LogicalResult {
            return o->emitOpError("is already partitioned or fused: "
                                  "partition before fusion, once");
          })
      .Default([&](Operation *o) -> LogicalResult {
        return o->emitOpError("has no tensor-parallel rule");
      });
}

LogicalResult Partitioner::run(func::FuncOp func) {
  // The dimensions the rules split must divide evenly; say which one does
  // not before any rewrite.
  if (auto c = func->getAttrOfType<kd::GLM5ConfigAttr>("kiln.config"))
    for (auto [what, size] :
         {std::pair<const char *, int64_t>{"attention heads", c.getHeads()},
          {"dense FFN intermediate size", c.getDenseFf()},
          {"expert intermediate size", c.getExpertFf()},
          {"vocabulary", c.getVocab()}})
      if (size % n_ != 0)
        return func.emitOpError("tp=")
               << n_ << " does not divide the " << size << " " << what;
  Block &body = func.getBody().front();
  for (Operation &op : llvm::make_early_inc_range(body))
    if (failed(visit(&op)))
      return failure();
  func->setAttr("kiln.tp", IntegerAttr::get(IntegerType::get(
                                                func.getContext(), 64),
                                            n_));
  return success();
}

struct Partition : mlir::kiln::impl::PartitionBase<Partition> {
  using PartitionBase::PartitionBase;
  void runOnOperation() override {
    func::FuncOp func = getOperation();
    if (tp < 1) {
      func.emitError("kiln-partition: tp must be at least 1, got ")
          << static_cast<int64_t>(tp);
      return signalPassFailure();
    }
    bool usesKiln = false;
    func.walk([&](Operation *op) {
      usesKiln |= isa_and_present<kd::KilnDialect>(op->getDialect());
    });
    if (!usesKiln || tp == 1 || func.isExternal())
      return;
    if (failed(Partitioner(tp).run(func)))
      signalPassFailure();
  }
};

} // namespace
