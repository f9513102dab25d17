//===- StepDialect.cpp - Registration of the step dialect ------------------===//
#include "step/StepDialect.h"
#include "kiln/KilnDialect.h"
#include "step/StepOps.h"

#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::step;

#include "step/StepDialect.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "step/StepAttrs.cpp.inc"

void StepDialect::initialize() {
  registerAttributes();
  addOperations<
#define GET_OP_LIST
#include "step/StepOps.cpp.inc"
      >();
}

void StepDialect::registerAttributes() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "step/StepAttrs.cpp.inc"
      >();
}

LogicalResult PlanAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                               int64_t arenaBytes, int64_t peakLiveBytes,
                               int64_t alignment, int64_t buffers) {
  if (arenaBytes < 0 || peakLiveBytes < 0 || buffers < 0)
    return emitError() << "plan sizes and counts must not be negative";
  if (alignment <= 0 || (alignment & (alignment - 1)) != 0)
    return emitError() << "plan alignment must be a power of two, got "
                       << alignment;
  if (peakLiveBytes > arenaBytes)
    return emitError() << "peak live bytes (" << peakLiveBytes
                       << ") cannot exceed the arena (" << arenaBytes << ")";
  return success();
}
