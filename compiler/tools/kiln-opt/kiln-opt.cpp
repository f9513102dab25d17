//===- kiln-opt.cpp - Parse, verify, transform and print kiln programs -----===//
//
// The driver lit tests run: the kiln and step dialects, the upstream dialects
// kiln programs are written with, MLIR's generic passes (canonicalize, cse,
// ...), and Kiln's passes and named pipelines (kiln-step-pipeline).
//
//===----------------------------------------------------------------------===//
#include "kiln/KilnDialect.h"
#include "passes/Passes.h"
#include "step/StepDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char **argv) {
  mlir::registerTransformsPasses();
  mlir::kiln::registerKilnPassesAndPipelines();

  mlir::DialectRegistry registry;
  registry.insert<mlir::kiln::KilnDialect, mlir::step::StepDialect,
                  mlir::arith::ArithDialect, mlir::func::FuncDialect,
                  mlir::memref::MemRefDialect, mlir::tensor::TensorDialect>();
  return mlir::asMainReturnCode(mlir::MlirOptMain(
      argc, argv, "Kiln optimizer driver\n", registry));
}
