//===- StepOps.cpp - Verifiers and interfaces of step ops ------------------===//
//
// The verifiers check what a backend kernel relies on (shapes, element types,
// widths); they mirror the kiln ops' checks one level down. Memory effects
// are generated from the In/Out operand decorations in StepOps.td.
//
//===----------------------------------------------------------------------===//
#include "step/StepOps.h"

#include "kiln/KilnOps.h"

#include <cmath>

using namespace mlir;
using namespace mlir::step;

int64_t mlir::step::elementBytes(Type element) {
  return (element.getIntOrFloatBitWidth() + 7) / 8;
}

int64_t mlir::step::bufferBytes(MemRefType type) {
  return type.getNumElements() * elementBytes(type.getElementType());
}

static MemRefType bufferOf(Value v) { return cast<MemRefType>(v.getType()); }

static int64_t innerDim(MemRefType t) {
  return t.getRank() == 0 ? 1 : t.getDimSize(t.getRank() - 1);
}

static bool isFloatBuffer(MemRefType t) {
  return isa<Float32Type, Float16Type, BFloat16Type>(t.getElementType());
}

static LogicalResult verifyPositive(Operation *op, StringRef what, float v) {
  if (!(v > 0.0f) || !std::isfinite(v))
    return op->emitOpError() << what << " must be positive and finite, got "
                             << v;
  return success();
}

/// `what` must be a float buffer of exactly `shape`.
static LogicalResult expectShape(Operation *op, StringRef what, Value v,
                                 ArrayRef<int64_t> shape) {
  MemRefType t = bufferOf(v);
  if (t.getShape() != shape) {
    InFlightDiagnostic d = op->emitOpError() << what << " must have shape [";
    llvm::interleaveComma(shape, d);
    return d << "], got " << t;
  }
  return success();
}

/// A per-channel parameter (float buffer or 1-D weight) of `width` values.
static LogicalResult expectParam(Operation *op, StringRef what, Value v,
                                 int64_t width) {
  if (auto w = dyn_cast<kiln::QWeightType>(v.getType())) {
    if (w.getDims().size() != 1 || w.getDims()[0] != width)
      return op->emitOpError()
             << what << " must have " << width << " values, got " << w;
    return success();
  }
  if (!isFloatBuffer(bufferOf(v)))
    return op->emitOpError() << what << " must be a float buffer";
  return expectShape(op, what, v, {width});
}

static LogicalResult expectI32Vector(Operation *op, StringRef what, Value v,
                                     int64_t size) {
  MemRefType t = bufferOf(v);
  if (t.getRank() != 1 || t.getDimSize(0) != size ||
      !t.getElementType().isInteger(32))
    return op->emitOpError() << what << " must be memref<" << size
                             << "xi32>, got " << t;
  return success();
}

/// The choice after a router's logits, shared by moe_router, moe_choose
/// and all_reduce_add_rms_norm's `choose`: `experts` logits, an optional
/// bias of as many, top_k of them chosen into ids and weights.
static LogicalResult verifyChoice(Operation *op, int64_t experts, Value bias,
                                  int64_t topK, StringRef gating, Value ids,
                                  Value weights, float routedScale) {
  if (bias)
    if (failed(expectParam(op, "bias", bias, experts)))
      return failure();
  if (topK <= 0 || topK > experts)
    return op->emitOpError("top_k must be in 1..") << experts;
  if (gating != "sigmoid" && gating != "softmax")
    return op->emitOpError("gating must be 'sigmoid' or 'softmax'");
  if (failed(expectI32Vector(op, "ids", ids, topK)) ||
      failed(expectShape(op, "weights", weights, {topK})))
    return failure();
  if (!bufferOf(weights).getElementType().isF32())
    return op->emitOpError("weights must be f32, got ") << weights.getType();
  return verifyPositive(op, "routed_scale", routedScale);
}

//===----------------------------------------------------------------------===//
// Declarations
//===----------------------------------------------------------------------===//

int64_t BufferOp::getSizeInBytes() { return bufferBytes(getType()); }

LogicalResult BufferOp::verify() {
  if (getBufferName().empty())
    return emitOpError("buffer name must not be empty");
  if (std::optional<int64_t> offset = getOffset(); offset && *offset < 0)
    return emitOpError("offset must not be negative, got ") << *offset;
  return success();
}

void BufferOp::getAsmResultNames(OpAsmSetValueNameFn setNameFn) {
  setNameFn(getResult(), getBufferName());
}

LogicalResult ViewOp::verify() {
  MemRefType source = bufferOf(getSource());
  MemRefType result = bufferOf(getResult());
  if (source.getElementType() != result.getElementType())
    return emitOpError("a view keeps the element type: ")
           << source.getElementType() << " vs " << result.getElementType();
  int64_t offset = getOffset();
  if (offset < 0 || offset + result.getNumElements() > source.getNumElements())
    return emitOpError("elements [")
           << offset << ", " << offset + result.getNumElements()
           << ") are not inside the source's " << source.getNumElements();
  return success();
}

Value ViewOp::getViewSource() { return getSource(); }

void WeightOp::getAsmResultNames(OpAsmSetValueNameFn setNameFn) {
  setNameFn(getResult(), getType().getValueName());
}

LogicalResult StateOp::verify() {
  if (getStateName().empty())
    return emitOpError("state name must not be empty");
  MemRefType t = getType();
  if (t.getRank() != 2 || !isFloatBuffer(t))
    return emitOpError("state must be a [positions x width] float buffer, "
                       "got ")
           << t;
  return success();
}

void StateOp::getAsmResultNames(OpAsmSetValueNameFn setNameFn) {
  setNameFn(getResult(), getStateName());
}

LogicalResult InputOp::verify() {
  if (getSlotName().empty())
    return emitOpError("slot name must not be empty");
  return success();
}

void InputOp::getAsmResultNames(OpAsmSetValueNameFn setNameFn) {
  setNameFn(getResult(), getSlotName());
}

LogicalResult OutputOp::verify() {
  if (getSlotName().empty())
    return emitOpError("slot name must not be empty");
  return success();
}

void OutputOp::getAsmResultNames(OpAsmSetValueNameFn setNameFn) {
  setNameFn(getResult(), getSlotName());
}

//===----------------------------------------------------------------------===//
// Data movement
//===----------------------------------------------------------------------===//

LogicalResult CopyOp::verify() {
  if (getInput().getType() != getOutput().getType())
    return emitOpError("input and output types differ: ")
           << getInput().getType() << " vs " << getOutput().getType();
  return success();
}

LogicalResult SliceOp::verify() {
  MemRefType input = bufferOf(getInput());
  MemRefType output = bufferOf(getOutput());
  ArrayRef<int64_t> offsets = getOffsets();
  if (input.getElementType() != output.getElementType() ||
      input.getRank() != output.getRank() ||
      static_cast<int64_t>(offsets.size()) != input.getRank())
    return emitOpError("input, output and offsets must agree in rank and "
                       "element type");
  for (int64_t d = 0; d < input.getRank(); ++d)
    if (offsets[d] < 0 || offsets[d] + output.getDimSize(d) >
                              input.getDimSize(d))
      return emitOpError("dimension ")
             << d << ": [" << offsets[d] << ", "
             << offsets[d] + output.getDimSize(d)
             << ") is not inside the input's " << input.getDimSize(d);
  return success();
}

LogicalResult ConcatOp::verify() {
  MemRefType output = bufferOf(getOutput());
  int64_t dim = getDim();
  if (getInputs().empty())
    return emitOpError("needs at least one input");
  if (dim < 0 || dim >= output.getRank())
    return emitOpError("dim ") << dim << " is not a dimension of " << output;
  int64_t total = 0;
  for (Value in : getInputs()) {
    MemRefType t = bufferOf(in);
    if (t.getElementType() != output.getElementType() ||
        t.getRank() != output.getRank())
      return emitOpError("input ") << t << " does not match output " << output;
    for (int64_t d = 0; d < t.getRank(); ++d)
      if (d != dim && t.getDimSize(d) != output.getDimSize(d))
        return emitOpError("input ")
               << t << " differs from the output outside dim " << dim;
    total += t.getDimSize(dim);
  }
  if (total != output.getDimSize(dim))
    return emitOpError("inputs add up to ")
           << total << " along dim " << dim << ", the output has "
           << output.getDimSize(dim);
  return success();
}

//===----------------------------------------------------------------------===//
// Element-wise, normalisation, position
//===----------------------------------------------------------------------===//

static LogicalResult verifyBinary(Operation *op, Value lhs, Value rhs,
                                  Value out) {
  if (lhs.getType() != rhs.getType() || lhs.getType() != out.getType())
    return op->emitOpError("operands and output must have one type, got ")
           << lhs.getType() << ", " << rhs.getType() << " -> "
           << out.getType();
  if (!isFloatBuffer(bufferOf(out)))
    return op->emitOpError("operands must be float buffers");
  return success();
}

LogicalResult AddOp::verify() {
  return verifyBinary(*this, getLhs(), getRhs(), getOutput());
}

LogicalResult SwiGLUOp::verify() {
  return verifyBinary(*this, getLhs(), getRhs(), getOutput());
}

LogicalResult RMSNormOp::verify() {
  MemRefType input = bufferOf(getInput());
  if (getOutput().getType() != input || input.getRank() < 1)
    return emitOpError("output must have the input's type ") << input;
  if (failed(expectParam(*this, "weight", getWeight(), innerDim(input))))
    return failure();
  return verifyPositive(*this, "epsilon", getEpsilon().convertToFloat());
}

/// An add whose sum is then RMS-normalised: both addends, the sum and the
/// output of one float type, a weight as wide as the innermost dim.
static LogicalResult verifyAddNorm(Operation *op, Value lhs, Value rhs,
                                   Value sumValue, Value output, Value weight,
                                   float epsilon) {
  if (failed(verifyBinary(op, lhs, rhs, sumValue)))
    return failure();
  MemRefType sum = bufferOf(sumValue);
  if (output.getType() != sum || sum.getRank() < 1)
    return op->emitOpError("output must have the sum's type ") << sum;
  if (failed(expectParam(op, "weight", weight, innerDim(sum))))
    return failure();
  return verifyPositive(op, "epsilon", epsilon);
}

LogicalResult AddRMSNormOp::verify() {
  return verifyAddNorm(*this, getLhs(), getRhs(), getSum(), getOutput(),
                       getWeight(), getEpsilon().convertToFloat());
}

LogicalResult AllReduceAddOp::verify() {
  if (getReduction() != "sum")
    return emitOpError("only a sum can feed a residual add");
  return verifyBinary(*this, getPartial(), getResidual(), getSum());
}

LogicalResult AllReduceAddRMSNormOp::verify() {
  if (getReduction() != "sum")
    return emitOpError("only a sum can feed a residual add");
  IntegerAttr tailAttr = getTailAttr();
  Value logits = getLogits();
  // The choice (kiln-fuse-router-choice): its outputs and attributes come
  // together, and only where there are logits to choose from.
  const bool choiceParts[] = {bool(getIds()),       bool(getWeights()),
                              bool(getTopK()),      bool(getGating()),
                              bool(getNormalize()), bool(getRoutedScale())};
  const bool choice = llvm::is_contained(choiceParts, true);
  if (choice && llvm::is_contained(choiceParts, false))
    return emitOpError("a choice needs its ids and weights outputs and "
                       "top_k, gating, normalize and routed_scale");
  if (getBias() && !choice)
    return emitOpError("a bias comes only with a choice");
  if (choice && !tailAttr)
    return emitOpError("a choice needs a tail: it chooses from the tail's "
                       "logits");
  if (!tailAttr && !logits)
    return verifyAddNorm(*this, getPartial(), getResidual(), getSum(),
                         getOutput(), getWeight(),
                         getEpsilon().convertToFloat());
  // A router tail (kiln-fold-router): the partial is the sum's n values
  // and then the tail's.
  if (!tailAttr || !logits)
    return emitOpError("a tail and its logits output come together");
  const int64_t tail = tailAttr.getInt();
  if (tail <= 0)
    return emitOpError("tail must be positive, got ") << tail;
  if (failed(verifyAddNorm(*this, getResidual(), getResidual(), getSum(),
                           getOutput(), getWeight(),
                           getEpsilon().convertToFloat())))
    return failure();
  MemRefType sum = bufferOf(getSum());
  if (sum.getRank() != 1 || !sum.getElementType().isF32())
    return emitOpError("with a tail the sum must be a vector of f32, got ")
           << sum;
  const int64_t n = sum.getDimSize(0);
  if (getPartial().getType() !=
      MemRefType::get({n + tail}, sum.getElementType()))
    return emitOpError("with a tail of ")
           << tail << " the partial must be memref<" << n + tail
           << "xf32> (the sum's " << n << " values, then the tail's), got "
           << getPartial().getType();
  if (logits.getType() != MemRefType::get({tail}, sum.getElementType()))
    return emitOpError("logits must be memref<")
           << tail << "xf32>, got " << logits.getType();
  if (!choice)
    return success();
  return verifyChoice(*this, tail, getBias(), int64_t(*getTopK()), *getGating(),
                      getIds(), getWeights(),
                      getRoutedScale()->convertToFloat());
}

LogicalResult LayerNormOp::verify() {
  MemRefType input = bufferOf(getInput());
  if (getOutput().getType() != input || input.getRank() < 1)
    return emitOpError("output must have the input's type ") << input;
  if (failed(expectParam(*this, "weight", getWeight(), innerDim(input))) ||
      failed(expectParam(*this, "bias", getBias(), innerDim(input))))
    return failure();
  return verifyPositive(*this, "epsilon", getEpsilon().convertToFloat());
}

LogicalResult RopeOp::verify() {
  MemRefType input = bufferOf(getInput());
  if (getOutput().getType() != input || input.getRank() < 1)
    return emitOpError("output must have the input's type ") << input;
  if (getStyle() != "interleaved" && getStyle() != "neox")
    return emitOpError("style must be 'interleaved' or 'neox', got '")
           << getStyle() << "'";
  int64_t dims = getDims(), offset = getOffset();
  if (dims <= 0 || dims % 2 != 0 || offset < 0 ||
      offset + dims > innerDim(input))
    return emitOpError("rotates [")
           << offset << ", " << offset + dims << ") (an even, positive width "
           << "is needed) of an innermost dimension of " << innerDim(input);
  return verifyPositive(*this, "theta", getTheta().convertToFloat());
}

//===----------------------------------------------------------------------===//
// Weights
//===----------------------------------------------------------------------===//

LogicalResult DequantOp::verify() {
  ArrayRef<int64_t> dims = getWeight().getType().getDims();
  SmallVector<int64_t> shape(dims.rbegin(), dims.rend());
  if (!isFloatBuffer(bufferOf(getOutput())))
    return emitOpError("output must be a float buffer");
  return expectShape(*this, "output", getOutput(), shape);
}

LogicalResult EmbedOp::verify() {
  ArrayRef<int64_t> dims = getTable().getType().getDims();
  if (dims.size() != 2)
    return emitOpError("table must be [hidden, vocab]");
  return expectShape(*this, "output", getOutput(), {dims[0]});
}

LogicalResult SwiGLULinearOp::verify() {
  if (failed(verifyBinary(*this, getGate(), getUp(), getGate())))
    return failure();
  MemRefType input = bufferOf(getGate());
  ArrayRef<int64_t> dims = getWeight().getType().getDims();
  if (input.getRank() != 1)
    return emitOpError("gate and up must be vectors, got ") << input;
  if (dims.size() != 2)
    return emitOpError("weight must have 2 dims");
  if (input.getShape()[0] != dims[0])
    return emitOpError("gate and up have ")
           << input.getShape()[0] << " values but the weight's ne[0] is "
           << dims[0];
  return expectShape(*this, "output", getOutput(), {dims[1]});
}

LogicalResult LinearOp::verify() {
  ArrayRef<int64_t> dims = getWeight().getType().getDims();
  MemRefType input = bufferOf(getInput());
  if (input.getRank() < 1 || !isFloatBuffer(input))
    return emitOpError("input must be a float buffer of rank >= 1");
  if (dims.size() == 2) {
    if (innerDim(input) != dims[0])
      return emitOpError("input's innermost dimension is ")
             << innerDim(input) << " but the weight's ne[0] is " << dims[0];
    SmallVector<int64_t> shape(input.getShape());
    shape.back() = dims[1];
    return expectShape(*this, "output", getOutput(), shape);
  }
  if (dims.size() == 3) {
    if (failed(expectShape(*this, "input", getInput(), {dims[2], dims[0]})))
      return failure();
    return expectShape(*this, "output", getOutput(), {dims[2], dims[1]});
  }
  return emitOpError("weight must have 2 dims, or 3 for a stack");
}

/// A projection's live_from: one position per weight, none negative.
static LogicalResult verifyLiveFrom(Operation *op,
                                    std::optional<ArrayRef<int64_t>> liveFrom,
                                    size_t weights) {
  if (!liveFrom)
    return success();
  if (liveFrom->size() != weights)
    return op->emitOpError("live_from needs one position per weight (")
           << weights << "), got " << liveFrom->size();
  for (int64_t p : *liveFrom)
    if (p < 0)
      return op->emitOpError("live_from positions must not be negative, got ")
             << p;
  return success();
}

LogicalResult FusedLinearOp::verify() {
  MemRefType input = bufferOf(getInput());
  if (input.getRank() != 1 || !isFloatBuffer(input))
    return emitOpError("input must be a float vector");
  FailureOr<int64_t> total = kiln::verifySegmentMap(
      *this, input.getDimSize(0), getWeights(), getSegments());
  if (failed(total) ||
      failed(verifyLiveFrom(*this, getLiveFrom(), getWeights().size())))
    return failure();
  return expectShape(*this, "output", getOutput(), {*total});
}

LogicalResult RMSNormLinearOp::verify() {
  MemRefType input = bufferOf(getInput());
  if (input.getRank() != 1 || !isFloatBuffer(input))
    return emitOpError("input must be a float vector");
  if (failed(expectParam(*this, "norm", getNorm(), input.getDimSize(0))) ||
      failed(verifyPositive(*this, "epsilon", getEpsilon().convertToFloat())))
    return failure();
  FailureOr<int64_t> total = kiln::verifySegmentMap(*this, input.getDimSize(0),
                                                    getWeights(), getSegments(),
                                                    /*fewest=*/1);
  if (failed(total) ||
      failed(verifyLiveFrom(*this, getLiveFrom(), getWeights().size())))
    return failure();
  return expectShape(*this, "output", getOutput(), {*total});
}

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

LogicalResult CacheAppendOp::verify() {
  MemRefType cache = bufferOf(getCache());
  if (cache.getRank() != 2)
    return emitOpError("cache must be [positions x width], got ") << cache;
  return expectShape(*this, "entry", getEntry(), {cache.getDimSize(1)});
}

LogicalResult NormRopeAppendOp::verify() {
  MemRefType cache = bufferOf(getCache());
  if (cache.getRank() != 2)
    return emitOpError("cache must be [positions x width], got ") << cache;
  const int64_t width = cache.getDimSize(1);
  if (failed(expectShape(*this, "entry", getEntry(), {width})))
    return failure();
  const int64_t normDims = getNormDims();
  if (normDims <= 0 || normDims > width)
    return emitOpError("norm_dims ")
           << normDims << " must be in [1, " << width << "]";
  if (getNorm() != "rms" && getNorm() != "layer")
    return emitOpError("norm must be 'rms' or 'layer', got '")
           << getNorm() << "'";
  const bool layer = getNorm() == "layer";
  if (layer != static_cast<bool>(getBias()))
    return emitOpError(layer ? "a layer norm needs a bias"
                             : "an rms norm takes no bias");
  if (failed(expectParam(*this, "weight", getWeight(), normDims)) ||
      (layer && failed(expectParam(*this, "bias", getBias(), normDims))))
    return failure();
  if (getStyle() != "interleaved" && getStyle() != "neox")
    return emitOpError("style must be 'interleaved' or 'neox', got '")
           << getStyle() << "'";
  const int64_t dims = getDims(), offset = getOffset();
  if (dims <= 0 || dims % 2 != 0 || offset < 0 || offset + dims > width)
    return emitOpError("rotates [")
           << offset << ", " << offset + dims << ") (an even, positive width "
           << "is needed) of a row of " << width;
  if (failed(verifyPositive(*this, "epsilon", getEpsilon().convertToFloat())))
    return failure();
  return verifyPositive(*this, "theta", getTheta().convertToFloat());
}

LogicalResult MLAAttentionOp::verify() {
  MemRefType ql = bufferOf(getQLatent()), qr = bufferOf(getQRope());
  MemRefType cache = bufferOf(getCache());
  if (ql.getRank() != 2 || qr.getRank() != 2 ||
      ql.getDimSize(0) != qr.getDimSize(0))
    return emitOpError("q_latent and q_rope must be [heads x width] with "
                       "the same heads");
  if (cache.getRank() != 2 ||
      cache.getDimSize(1) != ql.getDimSize(1) + qr.getDimSize(1))
    return emitOpError("cache rows must be latent + rope = ")
           << ql.getDimSize(1) + qr.getDimSize(1) << " wide, got " << cache;
  if (static_cast<bool>(getSelected()) != static_cast<bool>(getSelectedCount()))
    return emitOpError("selected and selected_count come together");
  if (Value sel = getSelected()) {
    MemRefType t = bufferOf(sel);
    if (t.getRank() != 1 || !t.getElementType().isInteger(32))
      return emitOpError("selected must be a vector of i32, got ") << t;
  }
  if (Value projection = getProjection()) {
    // [latent, N, heads]: each head's latent output times its N x latent.
    ArrayRef<int64_t> dims =
        cast<kiln::QWeightType>(projection.getType()).getDims();
    if (dims.size() != 3 || dims[0] != ql.getDimSize(1) ||
        dims[2] != ql.getDimSize(0))
      return emitOpError("projection must be a stack [latent = ")
             << ql.getDimSize(1) << ", N, heads = " << ql.getDimSize(0)
             << "], got " << projection.getType();
    if (failed(expectShape(*this, "output", getOutput(),
                           {ql.getDimSize(0), dims[1]})))
      return failure();
  } else if (failed(expectShape(*this, "output", getOutput(), ql.getShape()))) {
    return failure();
  }
  return verifyPositive(*this, "scale", getScale().convertToFloat());
}

LogicalResult DSAIndexerOp::verify() {
  MemRefType q = bufferOf(getQuery()), cache = bufferOf(getCache());
  if (q.getRank() != 2)
    return emitOpError("query must be [indexer heads x dim], got ") << q;
  if (failed(expectShape(*this, "head_weights", getHeadWeights(),
                         {q.getDimSize(0)})))
    return failure();
  if (cache.getRank() != 2 || cache.getDimSize(1) != q.getDimSize(1))
    return emitOpError("cache rows must be ")
           << q.getDimSize(1) << " wide, got " << cache;
  if (int64_t(getTopK()) <= 0)
    return emitOpError("top_k must be positive");
  if (failed(expectI32Vector(*this, "selected", getSelected(), getTopK())))
    return failure();
  const int present = int(bool(getRopeStyle())) + int(bool(getRopeTheta())) +
                      int(bool(getRopeOffset())) + int(bool(getRopeDims()));
  if (present != 0 && present != 4)
    return emitOpError("rope_style, rope_theta, rope_offset and rope_dims "
                       "come together");
  if (present == 4) {
    if (*getRopeStyle() != "interleaved" && *getRopeStyle() != "neox")
      return emitOpError("rope_style must be 'interleaved' or 'neox', got '")
             << *getRopeStyle() << "'";
    const int64_t dims = int64_t(*getRopeDims()),
                  offset = int64_t(*getRopeOffset());
    if (dims <= 0 || dims % 2 != 0 || offset < 0 ||
        offset + dims > q.getDimSize(1))
      return emitOpError("rotates [")
             << offset << ", " << offset + dims << ") (an even, positive "
             << "width is needed) of a query row of " << q.getDimSize(1);
    if (failed(verifyPositive(*this, "rope_theta",
                              getRopeTheta()->convertToFloat())))
      return failure();
  }
  return verifyPositive(*this, "scale", getScale().convertToFloat());
}

//===----------------------------------------------------------------------===//
// Mixture of experts
//===----------------------------------------------------------------------===//

LogicalResult MoERouterOp::verify() {
  ArrayRef<int64_t> dims = getGate().getType().getDims();
  MemRefType input = bufferOf(getInput());
  if (dims.size() != 2 || input.getRank() != 1 || input.getDimSize(0) != dims[0])
    return emitOpError("gate must be [hidden, experts] matching the input");
  return verifyChoice(*this, dims[1], getBias(), int64_t(getTopK()),
                      getGating(), getIds(), getWeights(),
                      getRoutedScale().convertToFloat());
}

LogicalResult RMSNormRouterOp::verify() {
  ArrayRef<int64_t> dims = getGate().getType().getDims();
  MemRefType input = bufferOf(getInput());
  if (getOutput().getType() != input)
    return emitOpError("output must have the input's type ") << input;
  if (dims.size() != 2 || input.getRank() != 1 ||
      input.getDimSize(0) != dims[0])
    return emitOpError("gate must be [hidden, experts] matching the input");
  if (failed(expectParam(*this, "norm", getNorm(), dims[0])) ||
      failed(verifyPositive(*this, "epsilon", getEpsilon().convertToFloat())))
    return failure();
  return verifyChoice(*this, dims[1], getBias(), int64_t(getTopK()),
                      getGating(), getIds(), getWeights(),
                      getRoutedScale().convertToFloat());
}

LogicalResult MoEChooseOp::verify() {
  MemRefType logits = bufferOf(getLogits());
  if (logits.getRank() != 1 || !logits.getElementType().isF32())
    return emitOpError("logits must be a vector of f32, got ") << logits;
  return verifyChoice(*this, logits.getDimSize(0), getBias(),
                      int64_t(getTopK()), getGating(), getIds(), getWeights(),
                      getRoutedScale().convertToFloat());
}

LogicalResult RouterPartialOp::verify() {
  MemRefType partial = bufferOf(getPartial());
  if (partial.getRank() != 1 || !partial.getElementType().isF32())
    return emitOpError("partial must be a vector of f32, got ") << partial;
  if (getResidual().getType() != partial)
    return emitOpError("residual must have the partial's type ")
           << partial << ", got " << getResidual().getType();
  const int64_t n = partial.getDimSize(0);
  mlir::kiln::QWeightType gate = getGate().getType();
  ArrayRef<int64_t> dims = gate.getDims();
  // F32 as moe_router's gate is in GLM-5: its rows are read as stored.
  if (gate.getFormat() != "f32" || dims.size() != 2 || dims[0] != n)
    return emitOpError("gate must be an f32 [")
           << n << ", experts] weight, got " << gate;
  if (failed(expectParam(*this, "norm", getNorm(), n)) ||
      failed(expectShape(*this, "output", getOutput(), {dims[1]})))
    return failure();
  if (!bufferOf(getOutput()).getElementType().isF32())
    return emitOpError("output must be f32");
  return verifyPositive(*this, "residual_scale",
                        getResidualScale().convertToFloat());
}

LogicalResult LinearRouterOp::verify() {
  MemRefType input = bufferOf(getInput());
  mlir::kiln::QWeightType weight = getWeight().getType();
  ArrayRef<int64_t> dims = weight.getDims();
  if (dims.size() != 2)
    return emitOpError("weight must be a 2-D [K, N] matrix, got ") << weight;
  const int64_t k = dims[0], n = dims[1];
  if (input.getRank() != 1 || !input.getElementType().isF32() ||
      input.getDimSize(0) != k)
    return emitOpError("input must be memref<")
           << k << "xf32> (the weight's ne[0]), got " << input;
  MemRefType residual = bufferOf(getResidual());
  if (residual.getRank() != 1 || !residual.getElementType().isF32() ||
      residual.getDimSize(0) != n)
    return emitOpError("residual must be memref<")
           << n << "xf32> (the weight's ne[1]), got " << residual;
  // F32 as moe_router's gate is in GLM-5, and whole: each rank composes
  // every expert's row, and reads the gate as stored.
  mlir::kiln::QWeightType gate = getGate().getType();
  ArrayRef<int64_t> gateDims = gate.getDims();
  if (gate.getFormat() != "f32" || gateDims.size() != 2 || gateDims[0] != n ||
      gate.getShardDim() >= 0)
    return emitOpError("gate must be a whole f32 [")
           << n << ", experts] weight, got " << gate;
  // The norm's values are composed into the matrix when the step is
  // loaded, so they must be a weight's, not a buffer's.
  auto norm = dyn_cast<mlir::kiln::QWeightType>(getNorm().getType());
  if (!norm || norm.getFormat() != "f32" || norm.getDims().size() != 1 ||
      norm.getDims()[0] != n) {
    InFlightDiagnostic d = emitOpError("norm must be an f32 weight of ")
                           << n << " values (read at load), got ";
    return d << getNorm().getType();
  }
  const int64_t ranks = getRanks();
  if (ranks < 1 || n % ranks != 0)
    return emitOpError("ranks must be at least 1 and divide the ")
           << n << " outputs, got " << ranks;
  MemRefType output = bufferOf(getOutput());
  if (failed(expectShape(*this, "output", getOutput(), {n + gateDims[1]})))
    return failure();
  if (!output.getElementType().isF32())
    return emitOpError("output must be f32");
  return success();
}

/// The shared expert's weights, when there are some (kiln-fuse-shared-expert).
static LogicalResult verifySharedExpert(MoEExpertsOp op, int64_t hidden) {
  ValueRange shared = op.getShared();
  if (shared.empty())
    return success();
  if (shared.size() != 3)
    return op.emitOpError("shared is (gate, up, down), got ")
           << shared.size() << " weights";
  // Both add a vector to the experts' sum last: one op holds one of them.
  if (op.getAddend())
    return op.emitOpError("takes an addend or a shared expert, not both");
  // Weight dims are ggml's: ne[0] (a row's length, the input) first.
  auto dims = [&](int i) {
    return cast<mlir::kiln::QWeightType>(shared[i].getType()).getDims();
  };
  ArrayRef<int64_t> gate = dims(0), up = dims(1), down = dims(2);
  if (gate.size() != 2 || up.size() != 2 || down.size() != 2)
    return op.emitOpError("shared weights must be 2-D");
  if (gate[0] != hidden || up != gate)
    return op.emitOpError("shared gate and up must both be [")
           << hidden << ", ffn] (hidden matching the input), got [" << gate[0]
           << ", " << gate[1] << "] and [" << up[0] << ", " << up[1] << "]";
  if (down[0] != gate[1] || down[1] != hidden)
    return op.emitOpError("shared down must be [")
           << gate[1] << ", " << hidden << "] (ffn, hidden), got [" << down[0]
           << ", " << down[1] << "]";
  return success();
}

LogicalResult MoEExpertsOp::verify() {
  MemRefType input = bufferOf(getInput());
  size_t n = getExperts().size();
  if (n != 2 && n != 3)
    return emitOpError("experts are (gate, up, down) or (gate_up, down), got ")
           << n << " weights";
  int64_t k = bufferOf(getIds()).getNumElements();
  if (failed(expectI32Vector(*this, "ids", getIds(), k)) ||
      failed(expectShape(*this, "weights", getWeights(), {k})))
    return failure();
  auto down = cast<mlir::kiln::QWeightType>(getExperts().back().getType());
  if (input.getRank() != 1 || down.getDims().size() != 3 ||
      down.getDims()[1] != input.getDimSize(0))
    return emitOpError("down experts must be [ff, hidden, experts] with "
                       "hidden matching the input");
  if (Value addend = getAddend())
    if (failed(expectShape(*this, "addend", addend, input.getShape())))
      return failure();
  if (failed(verifySharedExpert(*this, input.getDimSize(0))))
    return failure();
  return expectShape(*this, "output", getOutput(), input.getShape());
}

//===----------------------------------------------------------------------===//
// Collectives and decisions
//===----------------------------------------------------------------------===//

LogicalResult AllReduceOp::verify() {
  if (getInput().getType() != getOutput().getType())
    return emitOpError("input and output types differ");
  if (getReduction() != "sum" && getReduction() != "max")
    return emitOpError("reduction must be 'sum' or 'max'");
  return success();
}

LogicalResult AllGatherOp::verify() {
  MemRefType input = bufferOf(getInput());
  int64_t dim = getDim(), ranks = getRanks();
  if (ranks < 1 || dim < 0 || dim >= input.getRank())
    return emitOpError("needs a dim of the input and at least one rank");
  SmallVector<int64_t> shape(input.getShape());
  shape[dim] *= ranks;
  if (bufferOf(getOutput()).getElementType() != input.getElementType())
    return emitOpError("input and output element types differ");
  return expectShape(*this, "output", getOutput(), shape);
}

/// A draw's operands: both or neither, the sampling words memref<4xi32>.
static LogicalResult verifyDraw(Operation *op, Value sampling, Value position) {
  if (bool(sampling) != bool(position))
    return op->emitOpError("a draw needs both its sampling words and its "
                           "position");
  if (!sampling)
    return success();
  MemRefType words = bufferOf(sampling);
  // Eight words, four in the first form (a temperature only), or the
  // adjusting form's (support/DrawKey.h).
  const int64_t count = words.getRank() == 1 ? words.getDimSize(0) : 0;
  if (!kiln::isDrawWordCount(count) || !words.getElementType().isInteger(32))
    return op->emitOpError(
               "the sampling words must be memref<8xi32>, memref<4xi32> (a "
               "temperature only) or memref<(16 + 3 n)xi32> (with n "
               "adjustments, n > 0), got ")
           << words;
  return success();
}

LogicalResult DistributedArgmaxOp::verify() {
  return verifyDraw(*this, getSampling(), getPosition());
}

LogicalResult ArgmaxOp::verify() {
  MemRefType input = bufferOf(getInput());
  if (input.getRank() != 1 || input.getDimSize(0) == 0)
    return emitOpError("input must be a non-empty vector, got ") << input;
  return verifyDraw(*this, getSampling(), getPosition());
}

#define GET_OP_CLASSES
#include "step/StepOps.cpp.inc"
