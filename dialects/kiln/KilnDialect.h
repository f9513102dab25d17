//===- KilnDialect.h - The model-level kiln dialect -------------*- C++ -*-===//
#ifndef KILN_DIALECTS_KILN_KILNDIALECT_H
#define KILN_DIALECTS_KILN_KILNDIALECT_H

#include "mlir/IR/Dialect.h"

#include "kiln/KilnDialect.h.inc"

#endif // KILN_DIALECTS_KILN_KILNDIALECT_H
