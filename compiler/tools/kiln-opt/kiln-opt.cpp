//===- kiln-opt.cpp - Parse, verify, transform and print kiln programs -----===//
//
// The driver lit tests run: every dialect Kiln defines or writes programs in,
// plus MLIR's generic passes (canonicalize, cse, ...). Kiln's own passes and
// named pipelines register here as they are added.
//
//===----------------------------------------------------------------------===//
#include "kiln/KilnDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char **argv) {
  mlir::registerTransformsPasses();

  mlir::DialectRegistry registry;
  registry.insert<mlir::kiln::KilnDialect, mlir::arith::ArithDialect,
                  mlir::func::FuncDialect, mlir::tensor::TensorDialect>();
  return mlir::asMainReturnCode(mlir::MlirOptMain(
      argc, argv, "Kiln optimizer driver\n", registry));
}
