//===- Pipelines.cpp - Named pipelines of Kiln's passes --------------------===//
#include "passes/Passes.h"

using namespace mlir;

void mlir::kiln::addToCount(Operation *func, StringRef name, int64_t n) {
  int64_t before = 0;
  if (auto count = func->getAttrOfType<IntegerAttr>(name))
    before = count.getInt();
  func->setAttr(name, IntegerAttr::get(IntegerType::get(func->getContext(), 64),
                                       before + n));
}

void mlir::kiln::buildStepPipeline(OpPassManager &pm,
                                   const StepPipelineOptions &options) {
  if (options.elideIndexers)
    pm.addPass(createElideIndexers());
  if (options.tp > 1) {
    PartitionOptions partition;
    partition.tp = options.tp;
    pm.addNestedPass<func::FuncOp>(createPartition(partition));
  }
  if (options.splitProjections)
    pm.addNestedPass<func::FuncOp>(createSplitProjections());
  if (options.fuse) {
    pm.addNestedPass<func::FuncOp>(createFoldDequant());
    pm.addNestedPass<func::FuncOp>(createFuseProjections());
  }
  pm.addPass(createLowerToStep());
  if (options.fuse) {
    FuseAddNormOptions addNorm;
    addNorm.projectionNorms = options.projectionNorms;
    // The router fold (below) takes the MoE collectives' norm itself.
    addNorm.routerNorms =
        options.routerNorms && options.foldRouter == RouterFold::Off;
    pm.addNestedPass<func::FuncOp>(createFuseAddNorm(addNorm));
    pm.addNestedPass<func::FuncOp>(createFuseNormLinear());
    pm.addNestedPass<func::FuncOp>(createFuseSwigluLinear());
    pm.addNestedPass<func::FuncOp>(createFuseMlaProjection());
    pm.addNestedPass<func::FuncOp>(createFuseCacheAppend());
    pm.addNestedPass<func::FuncOp>(createFuseExpertAdd());
    if (options.fuseSharedExpert)
      pm.addNestedPass<func::FuncOp>(createFuseSharedExpert());
    if (options.foldRouter != RouterFold::Off) {
      FoldRouterOptions fold;
      fold.compose = options.foldRouter == RouterFold::Composed;
      pm.addNestedPass<func::FuncOp>(createFoldRouter(fold));
      if (options.fuseRouterChoice)
        pm.addNestedPass<func::FuncOp>(createFuseRouterChoice());
    }
    pm.addNestedPass<func::FuncOp>(createFuseIndexerRope());
    pm.addNestedPass<func::FuncOp>(createMarkLiveRows());
  }
  PlanMemoryOptions plan;
  plan.alignment = options.alignment;
  plan.reuseDistance = options.reuseDistance;
  pm.addNestedPass<func::FuncOp>(createPlanMemory(plan));
  pm.addNestedPass<func::FuncOp>(createVerifyCapture());
}

void mlir::kiln::registerKilnPassesAndPipelines() {
  registerKilnPasses();
  PassPipelineRegistration<>(
      "kiln-step-pipeline",
      "Fuse a kiln program's projections, lower it to a planned step "
      "program and verify that it is safe to capture",
      [](OpPassManager &pm) { buildStepPipeline(pm); });
}
