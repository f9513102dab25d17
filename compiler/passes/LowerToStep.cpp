//===- LowerToStep.cpp - kiln (tensors) to step (buffers) ------------------===//
//
// One step op per kiln op, in program order. A tensor value becomes a buffer
// that its producer writes: a fresh arena buffer, the output slot it is
// returned in, or a view of another buffer when the value is a reshape or a
// contiguous slice. Nothing is placed here (the planner does that) and
// nothing is fused (later passes do that).
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"

#include "kiln/KilnOps.h"
#include "step/StepOps.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/FormatVariadic.h"

namespace mlir::kiln {
#define GEN_PASS_DEF_LOWERTOSTEP
#include "passes/Passes.h.inc"
} // namespace mlir::kiln

using namespace mlir;
namespace kd = mlir::kiln;
namespace st = mlir::step;

namespace {

MemRefType bufferTypeOf(Type tensor) {
  auto t = cast<RankedTensorType>(tensor);
  return MemRefType::get(t.getShape(), t.getElementType());
}

/// Lowers one kiln function into a new step function.
class FunctionLowering {
public:
  FunctionLowering(func::FuncOp source) : source_(source), b_(source) {}

  FailureOr<func::FuncOp> run();

private:
  LogicalResult lowerBlock(Block &block);
  LogicalResult lowerOp(Operation *op);
  LogicalResult lowerSlice(tensor::ExtractSliceOp op);

  /// The buffer a tensor value lives in (set when its producer is lowered).
  Value buffer(Value tensor) { return buffers_.lookup(tensor); }
  /// A buffer for `result` to be written into: its output slot when the
  /// function returns it, else a new arena buffer named `name` (prefixed
  /// with the current layer unless `global`).
  Value destination(Value result, StringRef name, bool global = false);
  std::string uniqueName(std::string name);

  func::FuncOp source_;
  OpBuilder b_;
  DenseMap<Value, Value> buffers_;
  DenseMap<Value, Value> returnSlots_;
  llvm::StringMap<unsigned> names_;
  std::string layerPrefix_;
};

std::string FunctionLowering::uniqueName(std::string name) {
  unsigned &seen = names_[name];
  if (seen++ == 0)
    return name;
  std::string unique;
  do
    unique = llvm::formatv("{0}.{1}", name, seen++).str();
  while (names_.count(unique));
  names_[unique] = 1;
  return unique;
}

Value FunctionLowering::destination(Value result, StringRef name,
                                    bool global) {
  if (Value slot = returnSlots_.lookup(result))
    return slot;
  std::string full = global ? name.str() : layerPrefix_ + name.str();
  return st::BufferOp::create(b_, result.getLoc(), bufferTypeOf(result.getType()),
                              b_.getStringAttr(uniqueName(full)),
                              IntegerAttr());
}

FailureOr<func::FuncOp> FunctionLowering::run() {
  Location loc = source_.getLoc();
  auto step = func::FuncOp::create(b_, loc, source_.getSymName(),
                                   b_.getFunctionType({}, {}));
  for (NamedAttribute attr : source_->getAttrs())
    if (attr.getName() != source_.getSymNameAttrName() &&
        attr.getName() != source_.getFunctionTypeAttrName() &&
        attr.getName() != source_.getArgAttrsAttrName() &&
        attr.getName() != source_.getResAttrsAttrName())
      step->setAttr(attr.getName(), attr.getValue());
  Block *entry = step.addEntryBlock();
  b_.setInsertionPointToStart(entry);

  auto slotName = [](DictionaryAttr attrs, StringRef fallback, size_t i) {
    if (attrs)
      if (auto name = attrs.getAs<StringAttr>("kiln.slot"))
        return name.str();
    return llvm::formatv("{0}{1}", fallback, i).str();
  };
  Block &body = source_.getBody().front();
  for (BlockArgument arg : body.getArguments()) {
    if (!isa<RankedTensorType>(arg.getType()))
      return source_.emitOpError("argument #")
             << arg.getArgNumber() << " is not a ranked tensor";
    buffers_[arg] = st::InputOp::create(
        b_, loc, bufferTypeOf(arg.getType()),
        b_.getStringAttr(slotName(source_.getArgAttrDict(arg.getArgNumber()),
                                  "input", arg.getArgNumber())));
  }
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  SmallVector<Value> slots;
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    if (!isa<RankedTensorType>(v.getType()))
      return ret.emitOpError("result #") << i << " is not a ranked tensor";
    Value slot = st::OutputOp::create(
        b_, loc, bufferTypeOf(v.getType()),
        b_.getStringAttr(slotName(source_.getResultAttrDict(i), "output", i)));
    slots.push_back(slot);
    // Producers write straight into the slot; anything else is copied.
    Operation *def = v.getDefiningOp();
    if (def && isa_and_present<kd::KilnDialect>(def->getDialect()) &&
        !isa<kd::LayerOp>(def) && !returnSlots_.count(v))
      returnSlots_[v] = slot;
  }

  if (failed(lowerBlock(body)))
    return failure();

  b_.setInsertionPointToEnd(entry);
  for (auto [v, slot] : llvm::zip(ret.getOperands(), slots))
    if (buffer(v) != slot)
      st::CopyOp::create(b_, ret.getLoc(), buffer(v), slot);
  func::ReturnOp::create(b_, ret.getLoc());
  return step;
}

LogicalResult FunctionLowering::lowerBlock(Block &block) {
  for (Operation &op : block)
    if (failed(lowerOp(&op)))
      return failure();
  return success();
}

LogicalResult FunctionLowering::lowerSlice(tensor::ExtractSliceOp op) {
  RankedTensorType source = op.getSourceType();
  ArrayRef<int64_t> offsets = op.getStaticOffsets();
  ArrayRef<int64_t> sizes = op.getStaticSizes();
  ArrayRef<int64_t> strides = op.getStaticStrides();
  if (ShapedType::isDynamicShape(offsets) || ShapedType::isDynamicShape(sizes) ||
      llvm::any_of(strides, [](int64_t s) { return s != 1; }))
    return op.emitOpError("only static, unit-stride slices lower to steps");
  // Row-major contiguous: unit sizes, then one partial dimension, then
  // full dimensions.
  int64_t rank = source.getRank(), k = 0;
  while (k < rank - 1 && sizes[k] == 1)
    ++k;
  bool contiguous = true;
  for (int64_t d = k + 1; d < rank; ++d)
    contiguous &= sizes[d] == source.getDimSize(d) && offsets[d] == 0;
  Value src = buffer(op.getSource());
  MemRefType resultType = bufferTypeOf(op.getType());
  if (contiguous) {
    int64_t element = 0, stride = 1;
    for (int64_t d = rank - 1; d >= 0; --d) {
      element += offsets[d] * stride;
      stride *= source.getDimSize(d);
    }
    buffers_[op.getResult()] =
        st::ViewOp::create(b_, op.getLoc(), resultType, src,
                           b_.getI64IntegerAttr(element));
    return success();
  }
  // A strided box: copy it out, unreduced, then view it at the result's
  // (possibly rank-reduced) shape.
  auto boxType = MemRefType::get(sizes, source.getElementType());
  Value box;
  if (boxType == resultType) {
    box = destination(op.getResult(), "slice");
  } else {
    box = st::BufferOp::create(b_, op.getLoc(), boxType,
                               b_.getStringAttr(uniqueName(layerPrefix_ +
                                                           "slice")),
                               IntegerAttr());
  }
  st::SliceOp::create(b_, op.getLoc(), src,
                      b_.getDenseI64ArrayAttr(offsets), box);
  buffers_[op.getResult()] =
      box.getType() == resultType
          ? box
          : st::ViewOp::create(b_, op.getLoc(), resultType, box,
                               b_.getI64IntegerAttr(0))
                .getResult();
  return success();
}

LogicalResult FunctionLowering::lowerOp(Operation *op) {
  Location loc = op->getLoc();
  auto mnemonic = [](Operation *o) {
    return o->getName().stripDialect().str();
  };
  auto simple = [&](Value result, auto create) {
    Value out = destination(result, mnemonic(op));
    create(out);
    buffers_[result] = out;
    return success();
  };
  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
      .Case([&](kd::WeightOp w) {
        buffers_[w.getResult()] = st::WeightOp::create(b_, loc, w.getType());
        return success();
      })
      .Case([&](kd::StateOp s) {
        Type cache = s.getType();
        MemRefType type;
        if (auto latent = dyn_cast<kd::LatentCacheType>(cache))
          type = MemRefType::get(
              {latent.getPositions(), latent.getLatent() + latent.getRope()},
              latent.getElement());
        else {
          auto index = cast<kd::IndexCacheType>(cache);
          type = MemRefType::get({index.getPositions(), index.getDim()},
                                 index.getElement());
        }
        buffers_[s.getResult()] =
            st::StateOp::create(b_, loc, type, s.getStateNameAttr());
        return success();
      })
      .Case([&](kd::EmbedOp e) {
        return simple(e.getResult(), [&](Value out) {
          st::EmbedOp::create(b_, loc, buffer(e.getTable()),
                              buffer(e.getToken()), out);
        });
      })
      .Case([&](kd::DequantOp d) {
        Value out = destination(
            d.getResult(), d.getWeight().getType().getValueName() + ".dequant",
            /*global=*/true);
        st::DequantOp::create(b_, loc, buffer(d.getWeight()), out);
        buffers_[d.getResult()] = out;
        return success();
      })
      .Case([&](kd::LinearOp l) {
        Value out = destination(l.getResult(),
                                l.getWeight().getType().getValueName() + ".out",
                                /*global=*/true);
        st::LinearOp::create(b_, loc, buffer(l.getInput()),
                             buffer(l.getWeight()), out);
        buffers_[l.getResult()] = out;
        return success();
      })
      .Case([&](kd::FusedLinearOp l) {
        auto first = cast<kd::SegmentAttr>(l.getSegments()[0]);
        Value out = destination(l.getResult(), first.getName().str() + ".fused",
                                /*global=*/true);
        SmallVector<Value> weights;
        for (Value w : l.getWeights())
          weights.push_back(buffer(w));
        st::FusedLinearOp::create(b_, loc, buffer(l.getInput()), weights,
                                  l.getSegments(), out,
                                  /*live_from=*/nullptr);
        buffers_[l.getResult()] = out;
        return success();
      })
      .Case([&](kd::RMSNormOp n) {
        return simple(n.getResult(), [&](Value out) {
          st::RMSNormOp::create(b_, loc, buffer(n.getInput()),
                                buffer(n.getWeight()), n.getEpsilonAttr(),
                                out);
        });
      })
      .Case([&](kd::LayerNormOp n) {
        return simple(n.getResult(), [&](Value out) {
          st::LayerNormOp::create(b_, loc, buffer(n.getInput()),
                                  buffer(n.getWeight()), buffer(n.getBias()),
                                  n.getEpsilonAttr(), out);
        });
      })
      .Case([&](kd::RopeOp r) {
        return simple(r.getResult(), [&](Value out) {
          st::RopeOp::create(b_, loc, buffer(r.getInput()),
                             buffer(r.getPosition()), r.getStyleAttr(),
                             r.getThetaAttr(), r.getOffsetAttr(),
                             r.getDimsAttr(), out);
        });
      })
      .Case([&](kd::AddOp a) {
        return simple(a.getResult(), [&](Value out) {
          st::AddOp::create(b_, loc, buffer(a.getLhs()), buffer(a.getRhs()),
                            out);
        });
      })
      .Case([&](kd::SwiGLUOp s) {
        return simple(s.getResult(), [&](Value out) {
          st::SwiGLUOp::create(b_, loc, buffer(s.getLhs()),
                               buffer(s.getRhs()), out);
        });
      })
      .Case([&](kd::AllReduceOp a) {
        return simple(a.getResult(), [&](Value out) {
          st::AllReduceOp::create(b_, loc, buffer(a.getInput()),
                                  a.getReductionAttr(), out);
        });
      })
      .Case([&](kd::DistributedArgmaxOp a) {
        return simple(a.getResult(), [&](Value out) {
          st::DistributedArgmaxOp::create(
              b_, loc, buffer(a.getInput()), buffer(a.getSampling()),
              buffer(a.getPosition()), a.getRanksAttr(), out);
        });
      })
      .Case([&](kd::AllGatherOp a) {
        return simple(a.getResult(), [&](Value out) {
          st::AllGatherOp::create(b_, loc, buffer(a.getInput()),
                                  a.getDimAttr(), a.getRanksAttr(), out);
        });
      })
      .Case([&](kd::ArgmaxOp a) {
        return simple(a.getResult(), [&](Value out) {
          st::ArgmaxOp::create(b_, loc, buffer(a.getInput()),
                               buffer(a.getSampling()), buffer(a.getPosition()),
                               out);
        });
      })
      .Case([&](kd::CacheAppendOp c) {
        st::CacheAppendOp::create(b_, loc, buffer(c.getEntry()),
                                  buffer(c.getPosition()),
                                  buffer(c.getCache()));
        return success();
      })
      .Case([&](kd::MLAAttentionOp m) {
        return simple(m.getResult(), [&](Value out) {
          Value sel = m.getSelected() ? buffer(m.getSelected()) : Value();
          Value count =
              m.getSelectedCount() ? buffer(m.getSelectedCount()) : Value();
          st::MLAAttentionOp::create(
              b_, loc, buffer(m.getQLatent()), buffer(m.getQRope()),
              buffer(m.getCache()), buffer(m.getPosition()), sel, count,
              /*projection=*/Value(), m.getScaleAttr(), out);
        });
      })
      .Case([&](kd::DSAIndexerOp d) {
        Value sel = destination(d.getSelected(), "dsa_indexer.selected");
        Value count = destination(d.getCount(), "dsa_indexer.count");
        st::DSAIndexerOp::create(b_, loc, buffer(d.getQuery()),
                                 buffer(d.getHeadWeights()),
                                 buffer(d.getCache()),
                                 buffer(d.getPosition()), d.getTopKAttr(),
                                 d.getScaleAttr(), /*rope_style=*/nullptr,
                                 /*rope_theta=*/nullptr,
                                 /*rope_offset=*/nullptr,
                                 /*rope_dims=*/nullptr, sel, count);
        buffers_[d.getSelected()] = sel;
        buffers_[d.getCount()] = count;
        return success();
      })
      .Case([&](kd::MoERouterOp r) {
        Value ids = destination(r.getIds(), "moe_router.ids");
        Value weights = destination(r.getWeights(), "moe_router.weights");
        Value bias = r.getBias() ? buffer(r.getBias()) : Value();
        st::MoERouterOp::create(b_, loc, buffer(r.getInput()),
                                buffer(r.getGate()), bias, r.getTopKAttr(),
                                r.getGatingAttr(), r.getNormalizeAttr(),
                                r.getRoutedScaleAttr(), ids, weights);
        buffers_[r.getIds()] = ids;
        buffers_[r.getWeights()] = weights;
        return success();
      })
      .Case([&](kd::MoEExpertsOp m) {
        return simple(m.getResult(), [&](Value out) {
          SmallVector<Value> experts;
          for (Value w : m.getExperts())
            experts.push_back(buffer(w));
          st::MoEExpertsOp::create(b_, loc, buffer(m.getInput()),
                                   buffer(m.getIds()), buffer(m.getWeights()),
                                   /*addend=*/Value(), experts,
                                   /*shared=*/ValueRange(), out);
        });
      })
      .Case([&](kd::LayerOp layer) {
        std::string saved = layerPrefix_;
        layerPrefix_ = llvm::formatv("blk.{0}.", layer.getIndex()).str();
        Block &body = layer.getBody().front();
        buffers_[body.getArgument(0)] = buffer(layer.getInput());
        if (failed(lowerBlock(body)))
          return failure();
        auto yield = cast<kd::YieldOp>(body.getTerminator());
        buffers_[layer.getResult()] = buffer(yield.getValue());
        layerPrefix_ = saved;
        return success();
      })
      .Case([&](kd::YieldOp) { return success(); })
      .Case([&](func::ReturnOp) { return success(); })
      .Case<tensor::ExpandShapeOp, tensor::CollapseShapeOp>([&](auto reshape) {
        buffers_[reshape.getResult()] = st::ViewOp::create(
            b_, loc, bufferTypeOf(reshape.getType()),
            buffer(reshape.getSrc()), b_.getI64IntegerAttr(0));
        return success();
      })
      .Case([&](tensor::ExtractSliceOp s) { return lowerSlice(s); })
      .Case([&](tensor::ConcatOp c) {
        return simple(c.getResult(), [&](Value out) {
          SmallVector<Value> inputs;
          for (Value v : c.getInputs())
            inputs.push_back(buffer(v));
          st::ConcatOp::create(b_, loc, inputs,
                               b_.getI64IntegerAttr(c.getDim()), out);
        });
      })
      .Default([&](Operation *other) {
        return other->emitOpError("cannot be lowered to the step dialect");
      });
}

struct LowerToStep : mlir::kiln::impl::LowerToStepBase<LowerToStep> {
  void runOnOperation() override {
    SmallVector<func::FuncOp> kilnFunctions;
    for (auto func : getOperation().getOps<func::FuncOp>()) {
      bool usesKiln = false;
      func.walk([&](Operation *op) {
        if (isa_and_present<kd::KilnDialect>(op->getDialect()))
          usesKiln = true;
      });
      if (usesKiln && !func.isExternal())
        kilnFunctions.push_back(func);
    }
    for (func::FuncOp func : kilnFunctions) {
      FailureOr<func::FuncOp> step = FunctionLowering(func).run();
      if (failed(step))
        return signalPassFailure();
      func.erase();
    }
  }
};

} // namespace
