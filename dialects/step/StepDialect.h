//===- StepDialect.h - The buffer-level step dialect ------------*- C++ -*-===//
#ifndef KILN_DIALECTS_STEP_STEPDIALECT_H
#define KILN_DIALECTS_STEP_STEPDIALECT_H

#include "mlir/IR/Dialect.h"

#include "step/StepDialect.h.inc"

#endif // KILN_DIALECTS_STEP_STEPDIALECT_H
