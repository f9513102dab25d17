//===- KilnTypes.h - Types and attributes of the kiln dialect ---*- C++ -*-===//
#ifndef KILN_DIALECTS_KILN_KILNTYPES_H
#define KILN_DIALECTS_KILN_KILNTYPES_H

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Types.h"

#define GET_TYPEDEF_CLASSES
#include "kiln/KilnTypes.h.inc"

#define GET_ATTRDEF_CLASSES
#include "kiln/KilnAttrs.h.inc"

#endif // KILN_DIALECTS_KILN_KILNTYPES_H
