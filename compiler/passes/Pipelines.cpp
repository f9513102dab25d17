//===- Pipelines.cpp - Named pipelines of Kiln's passes --------------------===//
#include "passes/Passes.h"

using namespace mlir;

void mlir::kiln::buildStepPipeline(OpPassManager &pm, int64_t alignment,
                                   bool fuse, int64_t tp, int64_t reuseDistance,
                                   bool fuseSharedExpert, RouterFold foldRouter,
                                   bool fuseRouterChoice) {
  if (tp > 1) {
    PartitionOptions partition;
    partition.tp = tp;
    pm.addNestedPass<func::FuncOp>(createPartition(partition));
  }
  if (fuse) {
    pm.addNestedPass<func::FuncOp>(createFoldDequant());
    pm.addNestedPass<func::FuncOp>(createFuseProjections());
  }
  pm.addPass(createLowerToStep());
  if (fuse) {
    pm.addNestedPass<func::FuncOp>(createFuseAddNorm());
    pm.addNestedPass<func::FuncOp>(createFuseNormLinear());
    pm.addNestedPass<func::FuncOp>(createFuseSwigluLinear());
    pm.addNestedPass<func::FuncOp>(createFuseMlaProjection());
    pm.addNestedPass<func::FuncOp>(createFuseCacheAppend());
    pm.addNestedPass<func::FuncOp>(createFuseExpertAdd());
    if (fuseSharedExpert)
      pm.addNestedPass<func::FuncOp>(createFuseSharedExpert());
    if (foldRouter != RouterFold::Off) {
      FoldRouterOptions fold;
      fold.compose = foldRouter == RouterFold::Composed;
      pm.addNestedPass<func::FuncOp>(createFoldRouter(fold));
      if (fuseRouterChoice)
        pm.addNestedPass<func::FuncOp>(createFuseRouterChoice());
    }
    pm.addNestedPass<func::FuncOp>(createFuseIndexerRope());
    pm.addNestedPass<func::FuncOp>(createMarkLiveRows());
  }
  PlanMemoryOptions plan;
  plan.alignment = alignment;
  plan.reuseDistance = reuseDistance;
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
