//===- Passes.h - Kiln's compiler passes ------------------------*- C++ -*-===//
#ifndef KILN_COMPILER_PASSES_PASSES_H
#define KILN_COMPILER_PASSES_PASSES_H

#include "kiln/KilnDialect.h"
#include "step/StepDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassManager.h"

namespace mlir::kiln {

#define GEN_PASS_DECL
#include "passes/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"

/// Which form of kiln-fold-router the step pipeline runs, if any.
enum class RouterFold {
  Off,
  /// step.router_partial after the producer (kiln-compile --fold-router).
  Partial,
  /// step.linear_router in the producing linear's place
  /// (--fold-router=composed).
  Composed,
};

/// Adds partition (when `tp` > 1), fold-dequant, fuse-projections,
/// lower-to-step, fuse-add-norm (the fusions unless `fuse` is false),
/// plan-memory and verify-capture: a kiln module in, a planned, verified
/// step module out. `alignment` and `reuseDistance` are the planner's.
/// `fuseSharedExpert` adds fuse-shared-expert after fuse-expert-add (when
/// `fuse` is on; the default). `foldRouter` adds fold-router in that form
/// after it (when `fuse` is on; off by default), and `fuseRouterChoice`
/// fuse-router-choice right after fold-router (with it; off by default:
/// measured slower on the GPU, docs/perf.md).
void buildStepPipeline(OpPassManager &pm, int64_t alignment = 256,
                       bool fuse = true, int64_t tp = 1,
                       int64_t reuseDistance = 0, bool fuseSharedExpert = true,
                       RouterFold foldRouter = RouterFold::Off,
                       bool fuseRouterChoice = false);

/// Registers the passes and the named pipeline `kiln-step-pipeline`.
void registerKilnPassesAndPipelines();

} // namespace mlir::kiln

#endif // KILN_COMPILER_PASSES_PASSES_H
