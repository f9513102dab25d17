//===- KilnOps.cpp - Verifiers and interfaces of kiln ops ------------------===//
#include "kiln/KilnOps.h"

#include <cmath>

using namespace mlir;
using namespace mlir::kiln;

//===----------------------------------------------------------------------===//
// RMSNormOp
//===----------------------------------------------------------------------===//

LogicalResult RMSNormOp::verify() {
  auto input = cast<RankedTensorType>(getInput().getType());
  auto weight = cast<RankedTensorType>(getWeight().getType());
  if (input.getRank() < 1)
    return emitOpError("input must have at least one dimension, got ")
           << input;
  if (weight.getRank() != 1)
    return emitOpError("weight must be one-dimensional, got ") << weight;
  int64_t inner = input.getDimSize(input.getRank() - 1);
  int64_t width = weight.getDimSize(0);
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

LogicalResult ArgmaxOp::verify() {
  auto input = cast<RankedTensorType>(getInput().getType());
  if (input.getRank() != 1)
    return emitOpError("input must be one-dimensional, got ") << input;
  if (input.getDimSize(0) == 0)
    return emitOpError("input must not be empty");
  return success();
}

#define GET_OP_CLASSES
#include "kiln/KilnOps.cpp.inc"
