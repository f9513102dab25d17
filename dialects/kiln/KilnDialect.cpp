//===- KilnDialect.cpp - Registration of the kiln dialect ------------------===//
#include "kiln/KilnDialect.h"
#include "kiln/KilnOps.h"
#include "kiln/KilnTypes.h"

using namespace mlir;
using namespace mlir::kiln;

#include "kiln/KilnDialect.cpp.inc"

void KilnDialect::initialize() {
  registerTypes();
  registerAttributes();
  addOperations<
#define GET_OP_LIST
#include "kiln/KilnOps.cpp.inc"
      >();
}
