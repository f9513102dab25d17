//===- KilnOps.h - Operations of the kiln dialect ---------------*- C++ -*-===//
#ifndef KILN_DIALECTS_KILN_KILNOPS_H
#define KILN_DIALECTS_KILN_KILNOPS_H

#include "kiln/KilnDialect.h"
#include "kiln/KilnTypes.h"

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#define GET_OP_CLASSES
#include "kiln/KilnOps.h.inc"

namespace mlir::kiln {
/// Checks a fused projection's segment map against its weights: at least
/// `fewest`, one `#kiln.segment` per weight, named after it, in its format,
/// each weight `[k, N]`, rows contiguous from 0. Returns the total rows, or
/// failure after an error on `op`. Used by kiln.fused_linear and
/// step.fused_linear (two at least: one is a linear) and
/// step.rms_norm_linear (one at least: the norm is what it fuses).
FailureOr<int64_t> verifySegmentMap(Operation *op, int64_t k,
                                    ValueRange weights, ArrayAttr segments,
                                    size_t fewest = 2);
/// Whether a sampling slot of `words` i32 words has one of DrawKey.h's
/// forms: eight, four (a temperature only) or the adjusting form's.
bool isDrawWordCount(int64_t words);

} // namespace mlir::kiln

#endif // KILN_DIALECTS_KILN_KILNOPS_H
