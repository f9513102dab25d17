//===- KilnDialect.cpp - Registration of the kiln dialect ------------------===//
#include "kiln/KilnDialect.h"
#include "kiln/KilnOps.h"

using namespace mlir;
using namespace mlir::kiln;

#include "kiln/KilnDialect.cpp.inc"

void KilnDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "kiln/KilnOps.cpp.inc"
      >();
}
