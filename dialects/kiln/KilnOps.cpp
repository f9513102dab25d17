//===- KilnOps.cpp - Verifiers and interfaces of kiln ops ------------------===//
#include "kiln/KilnOps.h"
#include "support/DrawKey.h"

#include <cmath>

#include "llvm/ADT/STLExtras.h"

using namespace mlir;
using namespace mlir::kiln;

//===----------------------------------------------------------------------===//
// RMSNormOp
//===----------------------------------------------------------------------===//

/// Elements of a per-channel parameter (a float vector or a 1-D weight), or
/// nullopt when it is not one-dimensional.
static std::optional<int64_t> paramWidth(Value v) {
  if (auto w = dyn_cast<QWeightType>(v.getType()))
    return w.getDims().size() == 1 ? std::optional(w.getDims()[0])
                                   : std::nullopt;
  auto t = cast<RankedTensorType>(v.getType());
  return t.getRank() == 1 ? std::optional(t.getDimSize(0)) : std::nullopt;
}

LogicalResult RMSNormOp::verify() {
  auto input = cast<RankedTensorType>(getInput().getType());
  if (input.getRank() < 1)
    return emitOpError("input must have at least one dimension, got ")
           << input;
  std::optional<int64_t> weightWidth = paramWidth(getWeight());
  if (!weightWidth)
    return emitOpError("weight must be one-dimensional, got ")
           << getWeight().getType();
  int64_t inner = input.getDimSize(input.getRank() - 1);
  int64_t width = *weightWidth;
  if (!ShapedType::isDynamic(inner) && !ShapedType::isDynamic(width) &&
      inner != width)
    return emitOpError("weight has ")
           << width << " elements but the input's innermost dimension has "
           << inner;
  float eps = getEpsilon().convertToFloat();
  if (!(eps > 0.0f) || !std::isfinite(eps))
    return emitOpError("epsilon must be positive and finite, got ") << eps;
  return success();
}

//===----------------------------------------------------------------------===//
// ArgmaxOp
//===----------------------------------------------------------------------===//

LogicalResult ArgmaxOp::inferReturnTypes(
    MLIRContext *context, std::optional<Location>, ValueRange,
    DictionaryAttr, OpaqueProperties, RegionRange,
    SmallVectorImpl<Type> &inferredReturnTypes) {
  inferredReturnTypes.push_back(
      RankedTensorType::get({}, IntegerType::get(context, 32)));
  return success();
}

bool mlir::kiln::isDrawWordCount(int64_t words) {
  return words == ::kiln::draw::kDrawWords ||
         words == ::kiln::draw::kTemperatureWords ||
         (words <= INT32_MAX && ::kiln::draw::adjustCapacity(int(words)) > 0);
}

/// A draw's operands: both or neither, the sampling words in one of
/// DrawKey.h's forms.
static LogicalResult verifyDraw(Operation *op, Value sampling, Value position) {
  if (bool(sampling) != bool(position))
    return op->emitOpError("a draw needs both its sampling words and its "
                           "position");
  // Eight words, four in the first form (a temperature only), or the
  // adjusting form's (support/DrawKey.h).
  if (sampling) {
    const int64_t words =
        cast<RankedTensorType>(sampling.getType()).getDimSize(0);
    if (!isDrawWordCount(words))
      return op->emitOpError(
                 "the sampling words must be tensor<8xi32>, tensor<4xi32> (a "
                 "temperature only) or tensor<(16 + 3 n)xi32> (with n "
                 "adjustments, n > 0), got ")
             << sampling.getType();
  }
  return success();
}

LogicalResult ArgmaxOp::verify() {
  auto input = cast<RankedTensorType>(getInput().getType());
  if (input.getRank() != 1)
    return emitOpError("input must be one-dimensional, got ") << input;
  if (input.getDimSize(0) == 0)
    return emitOpError("input must not be empty");
  return verifyDraw(*this, getSampling(), getPosition());
}

LogicalResult DistributedArgmaxOp::verify() {
  return verifyDraw(*this, getSampling(), getPosition());
}

//===----------------------------------------------------------------------===//
// Shared checks
//===----------------------------------------------------------------------===//

static RankedTensorType tensorOf(Value v) {
  return cast<RankedTensorType>(v.getType());
}

/// A positive, finite float attribute, or an error naming it.
static LogicalResult verifyPositive(Operation *op, StringRef what, float v) {
  if (!(v > 0.0f) || !std::isfinite(v))
    return op->emitOpError() << what << " must be positive and finite, got "
                             << v;
  return success();
}

//===----------------------------------------------------------------------===//
// WeightOp, StateOp, DequantOp
//===----------------------------------------------------------------------===//

void WeightOp::getAsmResultNames(OpAsmSetValueNameFn setNameFn) {
  setNameFn(getResult(), getResult().getType().getValueName());
}

LogicalResult WeightOp::verify() {
  QWeightType type = getType();
  // tp_groups read through its attribute: GCC 12 took a test of
  // getTpGroups()'s optional for a read of uninitialised storage
  // (-Wmaybe-uninitialized).
  std::optional<int64_t> split = getTpSplit();
  IntegerAttr groups = getTpGroupsAttr();
  if (groups && !split)
    return emitOpError("tp_groups without tp_split");
  if (!split)
    return success();
  if (type.getShardDim() >= 0)
    return emitOpError("tensor '")
           << type.getName()
           << "' is already split (shard = " << type.getShardDim() << " of "
           << type.getShardParts() << ") and still carries tp_split";
  const int64_t rank = static_cast<int64_t>(type.getDims().size());
  if (*split < 0 || *split >= rank)
    return emitOpError("tensor '") << type.getName() << "': tp_split " << *split
                                   << " is not one of its " << rank << " dims";
  if (groups && groups.getInt() < 1)
    return emitOpError("tensor '")
           << type.getName() << "': tp_groups " << groups.getInt()
           << " is not a positive count";
  return success();
}

void StateOp::getAsmResultNames(OpAsmSetValueNameFn setNameFn) {
  setNameFn(getResult(), getStateName());
}

LogicalResult StateOp::verify() {
  if (getStateName().empty())
    return emitOpError("state name must not be empty");
  return success();
}

LogicalResult DequantOp::verify() {
  RankedTensorType result = tensorOf(getResult());
  RankedTensorType expected =
      getWeight().getType().getDequantizedType(result.getElementType());
  if (result != expected)
    return emitOpError("result must be ")
           << expected << " (the weight's dims reversed), got " << result;
  return success();
}

//===----------------------------------------------------------------------===//
// EmbedOp, LinearOp
//===----------------------------------------------------------------------===//

LogicalResult EmbedOp::verify() {
  ArrayRef<int64_t> dims = getTable().getType().getDims();
  if (dims.size() != 2)
    return emitOpError("table must have dims [hidden, vocab], got ")
           << dims.size() << " dims";
  int64_t width = tensorOf(getResult()).getDimSize(0);
  if (width != dims[0])
    return emitOpError("result has ")
           << width << " values but table rows have " << dims[0];
  return success();
}

LogicalResult LinearOp::verify() {
  ArrayRef<int64_t> dims = getWeight().getType().getDims();
  RankedTensorType input = tensorOf(getInput());
  RankedTensorType result = tensorOf(getResult());
  if (input.getElementType() != result.getElementType())
    return emitOpError("input and result element types differ: ")
           << input.getElementType() << " vs " << result.getElementType();
  if (input.getRank() < 1)
    return emitOpError("input must have at least one dimension");
  int64_t k = input.getDimSize(input.getRank() - 1);
  if (dims.size() == 2) {
    if (k != dims[0])
      return emitOpError("input's innermost dimension is ")
             << k << " but the weight's ne[0] is " << dims[0];
    SmallVector<int64_t> expected(input.getShape());
    expected.back() = dims[1];
    if (result.getShape() != ArrayRef<int64_t>(expected))
      return emitOpError("result must be ")
             << RankedTensorType::get(expected, result.getElementType())
             << ", got " << result;
    return success();
  }
  if (dims.size() == 3) {
    // One matrix per row of the input: [K, N, B] applied to [B, K].
    if (input.getRank() != 2 || input.getDimSize(0) != dims[2] ||
        k != dims[0])
      return emitOpError("a stacked weight [")
             << dims[0] << ", " << dims[1] << ", " << dims[2]
             << "] needs an input of shape [" << dims[2] << ", " << dims[0]
             << "], got " << input;
    RankedTensorType expected = RankedTensorType::get(
        {dims[2], dims[1]}, result.getElementType());
    if (result != expected)
      return emitOpError("result must be ") << expected << ", got " << result;
    return success();
  }
  return emitOpError("weight must have 2 dims, or 3 for a stack of "
                     "matrices, got ")
         << dims.size();
}

FailureOr<int64_t> mlir::kiln::verifySegmentMap(Operation *op, int64_t k,
                                                ValueRange weights,
                                                ArrayAttr segments,
                                                size_t fewest) {
  if (weights.size() < fewest)
    return op->emitOpError("fuses at least ")
           << fewest << " projection" << (fewest == 1 ? "" : "s") << ", got "
           << weights.size();
  if (segments.size() != weights.size())
    return op->emitOpError("has ")
           << segments.size() << " segments for " << weights.size()
           << " weights";
  int64_t offset = 0;
  for (auto [i, pair] : llvm::enumerate(llvm::zip(segments, weights))) {
    auto segment = dyn_cast<SegmentAttr>(std::get<0>(pair));
    auto weight = cast<QWeightType>(std::get<1>(pair).getType());
    if (!segment)
      return op->emitOpError("segment ") << i << " is not a #kiln.segment";
    if (segment.getName() != weight.getStem())
      return op->emitOpError("segment ")
             << i << " is named '" << segment.getName() << "' but weight "
             << i << " is '" << weight.getName() << "'";
    if (segment.getFormat() != weight.getFormat())
      return op->emitOpError("segment ")
             << i << " says format '" << segment.getFormat()
             << "' but its weight is '" << weight.getFormat() << "'";
    ArrayRef<int64_t> dims = weight.getDims();
    if (dims.size() != 2 || dims[0] != k)
      return op->emitOpError("weight ")
             << i << " must be [" << k << ", N], got " << weight;
    if (segment.getOffset() != offset || segment.getRows() != dims[1])
      return op->emitOpError("segment ")
             << i << " must cover rows [" << offset << ", "
             << offset + dims[1] << "), got [" << segment.getOffset()
             << ", " << segment.getOffset() + segment.getRows() << ")";
    offset += dims[1];
  }
  return offset;
}

LogicalResult FusedLinearOp::verify() {
  auto input = cast<RankedTensorType>(getInput().getType());
  auto result = cast<RankedTensorType>(getResult().getType());
  FailureOr<int64_t> total = verifySegmentMap(
      *this, input.getDimSize(0), getWeights(), getSegments());
  if (failed(total))
    return failure();
  if (result.getDimSize(0) != *total ||
      result.getElementType() != input.getElementType())
    return emitOpError("result must be ")
           << RankedTensorType::get({*total}, input.getElementType())
           << ", got " << result;
  return success();
}

LogicalResult AllGatherOp::verify() {
  auto input = cast<RankedTensorType>(getInput().getType());
  auto result = cast<RankedTensorType>(getResult().getType());
  int64_t dim = getDim(), ranks = getRanks();
  if (ranks < 1 || dim < 0 || dim >= input.getRank())
    return emitOpError("needs a dim of the input and at least one rank");
  SmallVector<int64_t> shape(input.getShape());
  shape[dim] *= ranks;
  if (result.getShape() != ArrayRef<int64_t>(shape) ||
      result.getElementType() != input.getElementType())
    return emitOpError("result must be ")
           << RankedTensorType::get(shape, input.getElementType()) << ", got "
           << result;
  return success();
}

//===----------------------------------------------------------------------===//
// LayerNormOp, RopeOp
//===----------------------------------------------------------------------===//

LogicalResult LayerNormOp::verify() {
  RankedTensorType input = tensorOf(getInput());
  if (input.getRank() < 1)
    return emitOpError("input must have at least one dimension");
  int64_t inner = input.getDimSize(input.getRank() - 1);
  for (auto [what, v] : {std::pair<StringRef, Value>{"weight", getWeight()},
                         std::pair<StringRef, Value>{"bias", getBias()}}) {
    if (paramWidth(v) != inner)
      return emitOpError() << what << " must have " << inner
                           << " values (the input's innermost dimension), "
                              "got "
                           << v.getType();
  }
  return verifyPositive(*this, "epsilon", getEpsilon().convertToFloat());
}

LogicalResult RopeOp::verify() {
  if (getStyle() != "interleaved" && getStyle() != "neox")
    return emitOpError("style must be \"interleaved\" or \"neox\", got \"")
           << getStyle() << "\"";
  if (failed(verifyPositive(*this, "theta", getTheta().convertToFloat())))
    return failure();
  int64_t dims = getDims(), offset = getOffset();
  if (dims <= 0 || dims % 2)
    return emitOpError("dims must be positive and even, got ") << dims;
  RankedTensorType input = tensorOf(getInput());
  if (input.getRank() < 1)
    return emitOpError("input must have at least one dimension");
  int64_t inner = input.getDimSize(input.getRank() - 1);
  if (offset < 0 || offset + dims > inner)
    return emitOpError("rotated values [")
           << offset << ", " << offset + dims
           << ") do not fit the innermost dimension of " << inner;
  return success();
}

//===----------------------------------------------------------------------===//
// CacheAppendOp, MLAAttentionOp, DSAIndexerOp
//===----------------------------------------------------------------------===//

LogicalResult CacheAppendOp::verify() {
  int64_t width = 0;
  if (auto latent = dyn_cast<LatentCacheType>(getCache().getType()))
    width = latent.getWidth();
  else
    width = cast<IndexCacheType>(getCache().getType()).getDim();
  int64_t entry = tensorOf(getEntry()).getDimSize(0);
  if (entry != width)
    return emitOpError("entry has ")
           << entry << " values but the cache stores " << width
           << " per token";
  return success();
}

LogicalResult MLAAttentionOp::verify() {
  LatentCacheType cache = getCache().getType();
  RankedTensorType qLatent = tensorOf(getQLatent());
  RankedTensorType qRope = tensorOf(getQRope());
  if (qLatent.getRank() != 2 || qLatent.getDimSize(1) != cache.getLatent())
    return emitOpError("q_latent must be [heads, ")
           << cache.getLatent() << "] (the cache's latent width), got "
           << qLatent;
  int64_t heads = qLatent.getDimSize(0);
  if (qRope.getRank() != 2 || qRope.getDimSize(0) != heads ||
      qRope.getDimSize(1) != cache.getRope())
    return emitOpError("q_rope must be [")
           << heads << ", " << cache.getRope() << "], got " << qRope;
  if (tensorOf(getResult()) != qLatent)
    return emitOpError("result must have q_latent's type ")
           << qLatent << ", got " << getResult().getType();
  return verifyPositive(*this, "scale", getScale().convertToFloat());
}

LogicalResult DSAIndexerOp::verify() {
  IndexCacheType cache = getCache().getType();
  RankedTensorType query = tensorOf(getQuery());
  if (query.getRank() != 2 || query.getDimSize(1) != cache.getDim())
    return emitOpError("query must be [heads, ")
           << cache.getDim() << "] (the cache's key width), got " << query;
  int64_t heads = tensorOf(getHeadWeights()).getDimSize(0);
  if (heads != query.getDimSize(0))
    return emitOpError("head_weights has ")
           << heads << " values for " << query.getDimSize(0) << " heads";
  if (int64_t(getTopK()) <= 0)
    return emitOpError("top_k must be positive, got ") << int64_t(getTopK());
  if (tensorOf(getSelected()).getDimSize(0) != int64_t(getTopK()))
    return emitOpError("selected must have top_k = ")
           << getTopK() << " entries, got " << getSelected().getType();
  return verifyPositive(*this, "scale", getScale().convertToFloat());
}

//===----------------------------------------------------------------------===//
// MoERouterOp, MoEExpertsOp
//===----------------------------------------------------------------------===//

LogicalResult MoERouterOp::verify() {
  ArrayRef<int64_t> dims = getGate().getType().getDims();
  int64_t hidden = tensorOf(getInput()).getDimSize(0);
  if (dims.size() != 2 || dims[0] != hidden)
    return emitOpError("gate must have dims [")
           << hidden << ", experts], got " << getGate().getType();
  int64_t experts = dims[1];
  if (getBias() && paramWidth(getBias()) != experts)
    return emitOpError("bias has ")
           << paramWidth(getBias()).value_or(-1) << " values for " << experts
           << " experts";
  if (int64_t(getTopK()) <= 0 || int64_t(getTopK()) > experts)
    return emitOpError("top_k must be between 1 and the ")
           << experts << " experts, got " << int64_t(getTopK());
  if (getGating() != "sigmoid" && getGating() != "softmax")
    return emitOpError("gating must be \"sigmoid\" or \"softmax\", got \"")
           << getGating() << "\"";
  for (Value v : {getIds(), getWeights()})
    if (tensorOf(v).getDimSize(0) != int64_t(getTopK()))
      return emitOpError("results must have top_k = ")
             << getTopK() << " entries, got " << v.getType();
  return verifyPositive(*this, "routed_scale",
                        getRoutedScale().convertToFloat());
}

LogicalResult MoEExpertsOp::verify() {
  int64_t hidden = tensorOf(getInput()).getDimSize(0);
  int64_t k = tensorOf(getIds()).getDimSize(0);
  if (tensorOf(getWeights()).getDimSize(0) != k)
    return emitOpError("weights has ")
           << tensorOf(getWeights()).getDimSize(0) << " entries for " << k
           << " ids";
  if (getResult().getType() != getInput().getType())
    return emitOpError("result must have the input's type");
  auto experts = getExperts();
  if (experts.size() != 2 && experts.size() != 3)
    return emitOpError("experts must be (gate, up, down) or (gate_up, down), "
                       "got ")
           << experts.size() << " weights";
  auto dimsOf = [](Value v) { return cast<QWeightType>(v.getType()).getDims(); };
  ArrayRef<int64_t> down = dimsOf(experts.back());
  if (down.size() != 3 || down[1] != hidden)
    return emitOpError("down must have dims [ff, ")
           << hidden << ", experts], got " << experts.back().getType();
  int64_t ff = down[0], count = down[2];
  if (k > count)
    return emitOpError("") << k << " ids for " << count << " experts";
  int64_t rows = experts.size() == 3 ? ff : 2 * ff;
  for (Value w : experts.drop_back()) {
    ArrayRef<int64_t> d = dimsOf(w);
    if (d.size() != 3 || d[0] != hidden || d[1] != rows || d[2] != count)
      return emitOpError("")
             << cast<QWeightType>(w.getType()).getName() << " must have dims ["
             << hidden << ", " << rows << ", " << count << "], got "
             << w.getType();
  }
  return success();
}

//===----------------------------------------------------------------------===//
// AllReduceOp, LayerOp
//===----------------------------------------------------------------------===//

LogicalResult AllReduceOp::verify() {
  if (getReduction() != "sum" && getReduction() != "max")
    return emitOpError("reduction must be \"sum\" or \"max\", got \"")
           << getReduction() << "\"";
  return success();
}

void LayerOp::getAsmBlockArgumentNames(Region &region,
                                       OpAsmSetValueNameFn setNameFn) {
  if (!region.empty() && region.front().getNumArguments() == 1)
    setNameFn(region.front().getArgument(0), "x");
}

LogicalResult LayerOp::verify() {
  if (getKind() != "dense" && getKind() != "moe" && getKind() != "mtp")
    return emitOpError("kind must be \"dense\", \"moe\" or \"mtp\", got \"")
           << getKind() << "\"";
  Block &body = getBody().front();
  if (body.getNumArguments() != 1 ||
      body.getArgument(0).getType() != getInput().getType())
    return emitOpError("body must take one argument of type ")
           << getInput().getType();
  auto yield = dyn_cast<YieldOp>(body.getTerminator());
  if (!yield)
    return emitOpError("body must end with kiln.yield");
  if (yield.getValue().getType() != getResult().getType())
    return emitOpError("yields ")
           << yield.getValue().getType() << " but the layer returns "
           << getResult().getType();
  return success();
}

#define GET_OP_CLASSES
#include "kiln/KilnOps.cpp.inc"
