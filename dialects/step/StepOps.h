//===- StepOps.h - Operations and attributes of the step dialect -*- C++ -*-===//
#ifndef KILN_DIALECTS_STEP_STEPOPS_H
#define KILN_DIALECTS_STEP_STEPOPS_H

#include "kiln/KilnTypes.h"
#include "step/StepDialect.h"

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/DestinationStyleOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Interfaces/ViewLikeInterface.h"

#define GET_ATTRDEF_CLASSES
#include "step/StepAttrs.h.inc"

#define GET_OP_CLASSES
#include "step/StepOps.h.inc"

namespace mlir::step {
/// Bytes one element of a step buffer occupies (f32/i32: 4, f16/bf16: 2).
int64_t elementBytes(Type element);
/// Bytes a statically shaped buffer occupies.
int64_t bufferBytes(MemRefType type);
/// Name of the function attribute that holds a step's `#step.plan`.
inline constexpr llvm::StringLiteral kPlanAttrName = "step.plan";
} // namespace mlir::step

#endif // KILN_DIALECTS_STEP_STEPOPS_H
