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

#endif // KILN_DIALECTS_KILN_KILNOPS_H
