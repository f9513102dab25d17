//===- KilnTypes.cpp - Verifiers of kiln types and attributes --------------===//
#include "kiln/KilnTypes.h"
#include "kiln/KilnDialect.h"

#include "quant/QuantTypes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::kiln;

/// A qweight's optional parts, each after a comma, in this order:
/// `shard = D of N`, `groups = G`, `rows = A to B of P`.
static ParseResult parseWeightParts(AsmParser &parser, int64_t &shardDim,
                                    int64_t &shardParts, int64_t &shardGroups,
                                    int64_t &rowsBegin, int64_t &rowsEnd,
                                    int64_t &rowsPeriod) {
  shardDim = -1;
  shardParts = 1;
  shardGroups = 1;
  rowsBegin = rowsEnd = rowsPeriod = 0;
  while (succeeded(parser.parseOptionalComma())) {
    if (succeeded(parser.parseOptionalKeyword("shard"))) {
      if (parser.parseEqual() || parser.parseInteger(shardDim) ||
          parser.parseKeyword("of") || parser.parseInteger(shardParts))
        return failure();
    } else if (succeeded(parser.parseOptionalKeyword("groups"))) {
      if (parser.parseEqual() || parser.parseInteger(shardGroups))
        return failure();
    } else if (succeeded(parser.parseOptionalKeyword("rows"))) {
      if (parser.parseEqual() || parser.parseInteger(rowsBegin) ||
          parser.parseKeyword("to") || parser.parseInteger(rowsEnd) ||
          parser.parseKeyword("of") || parser.parseInteger(rowsPeriod))
        return failure();
    } else {
      return parser.emitError(parser.getCurrentLocation(),
                              "expected 'shard', 'groups' or 'rows'");
    }
  }
  return success();
}

static void printWeightParts(AsmPrinter &printer, int64_t shardDim,
                             int64_t shardParts, int64_t shardGroups,
                             int64_t rowsBegin, int64_t rowsEnd,
                             int64_t rowsPeriod) {
  if (shardDim >= 0)
    printer << ", shard = " << shardDim << " of " << shardParts;
  if (shardGroups != 1)
    printer << ", groups = " << shardGroups;
  if (rowsPeriod != 0)
    printer << ", rows = " << rowsBegin << " to " << rowsEnd << " of "
            << rowsPeriod;
}

#define GET_TYPEDEF_CLASSES
#include "kiln/KilnTypes.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "kiln/KilnAttrs.cpp.inc"

void KilnDialect::registerTypes() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "kiln/KilnTypes.cpp.inc"
      >();
}

void KilnDialect::registerAttributes() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "kiln/KilnAttrs.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// QWeightType
//===----------------------------------------------------------------------===//

/// GGUF allows at most four dims (ggml's GGML_MAX_DIMS).
static constexpr size_t kMaxWeightDims = 4;

LogicalResult
QWeightType::verify(function_ref<InFlightDiagnostic()> emitError,
                    StringRef name, StringRef format, ArrayRef<int64_t> dims,
                    int64_t shardDim, int64_t shardParts,
                    int64_t shardGroups, int64_t rowsBegin, int64_t rowsEnd,
                    int64_t rowsPeriod) {
  if (shardGroups < 1 || (shardGroups > 1 && shardDim < 0) ||
      (shardDim >= 0 && shardDim < static_cast<int64_t>(dims.size()) &&
       dims[shardDim] % shardGroups != 0))
    return emitError() << "weight '" << name << "': " << shardGroups
                       << " groups do not divide its split dim";
  if (shardParts < 1 || shardDim < -1 ||
      shardDim >= static_cast<int64_t>(dims.size()) ||
      (shardDim == -1) != (shardParts == 1))
    return emitError() << "weight '" << name << "': shard " << shardDim
                       << " of " << shardParts
                       << " is not a dim of the tensor and a part count";
  if (rowsPeriod != 0 &&
      (rowsPeriod < 0 || rowsBegin < 0 || rowsEnd <= rowsBegin ||
       rowsEnd > rowsPeriod || dims.size() < 2 ||
       dims[1] % (rowsEnd - rowsBegin) != 0))
    return emitError() << "weight '" << name << "': rows " << rowsBegin
                       << " to " << rowsEnd << " of " << rowsPeriod
                       << " is not a cut of every period of dim 1 that "
                          "divides its "
                       << (dims.size() < 2 ? 0 : dims[1]) << " rows";
  if (name.empty())
    return emitError() << "weight has an empty tensor name";
  std::optional<::kiln::GGMLType> type =
      ::kiln::parseGGMLType(std::string_view(format.data(), format.size()));
  if (!type || format.lower() != format)
    return emitError() << "weight '" << name << "': unknown format '"
                       << format << "' (expected a lower-case ggml type such "
                          "as q4_k, q8_0, bf16, f32)";
  if (dims.empty() || dims.size() > kMaxWeightDims)
    return emitError() << "weight '" << name << "' has " << dims.size()
                       << " dims; GGUF tensors have 1 to 4";
  for (int64_t d : dims)
    if (d <= 0)
      return emitError() << "weight '" << name
                         << "' has a non-positive dim " << d;
  uint32_t block = ::kiln::traitsOf(*type).blockSize;
  if (dims[0] % block != 0)
    return emitError() << "weight '" << name << "': ne[0] = " << dims[0]
                       << " is not a multiple of " << format
                       << "'s block of " << block << " values";
  return success();
}

SmallVector<int64_t> QWeightType::getFullDims() const {
  SmallVector<int64_t> dims(getDims());
  if (hasRowCut())
    dims[1] = dims[1] / (getRowsEnd() - getRowsBegin()) * getRowsPeriod();
  if (getShardDim() >= 0)
    dims[getShardDim()] *= getShardParts();
  return dims;
}

StringRef QWeightType::getStem() const {
  StringRef name = getName();
  name.consume_back(".weight");
  return name;
}

std::string QWeightType::getValueName() const {
  std::string out = getStem().str();
  if (hasRowCut())
    out += ".rows" + std::to_string(getRowsBegin()) + "to" +
           std::to_string(getRowsEnd());
  return out;
}

int64_t QWeightType::getNumElements() const {
  int64_t n = 1;
  for (int64_t d : getDims())
    n *= d;
  return n;
}

RankedTensorType QWeightType::getDequantizedType(Type element) const {
  SmallVector<int64_t> shape(getDims().rbegin(), getDims().rend());
  return RankedTensorType::get(shape, element);
}

//===----------------------------------------------------------------------===//
// Cache types
//===----------------------------------------------------------------------===//

static LogicalResult verifyCacheElement(function_ref<InFlightDiagnostic()> emitError,
                                        Type element) {
  if (!isa<Float32Type, Float16Type, BFloat16Type>(element))
    return emitError() << "cache element type must be f32, f16 or bf16, got "
                       << element;
  return success();
}

LogicalResult
LatentCacheType::verify(function_ref<InFlightDiagnostic()> emitError,
                        int64_t positions, int64_t latent, int64_t rope,
                        Type element) {
  if (positions <= 0 || latent <= 0 || rope <= 0)
    return emitError() << "latent cache sizes must be positive, got positions "
                       << positions << ", latent " << latent << ", rope "
                       << rope;
  return verifyCacheElement(emitError, element);
}

LogicalResult
IndexCacheType::verify(function_ref<InFlightDiagnostic()> emitError,
                       int64_t positions, int64_t dim, Type element) {
  if (positions <= 0 || dim <= 0)
    return emitError() << "index cache sizes must be positive, got positions "
                       << positions << ", dim " << dim;
  return verifyCacheElement(emitError, element);
}
