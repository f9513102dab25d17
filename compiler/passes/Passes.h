//===- Passes.h - Kiln's compiler passes ------------------------*- C++ -*-===//
#ifndef KILN_COMPILER_PASSES_PASSES_H
#define KILN_COMPILER_PASSES_PASSES_H

#include "kiln/KilnDialect.h"
#include "kiln/KilnTypes.h"
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

/// Function attributes (i64) counting what kiln-elide-indexers left out and
/// what kiln-split-projections cut, for kiln-compile --report.
inline constexpr llvm::StringLiteral kElidedIndexersAttrName =
    "kiln.elided_indexers";
inline constexpr llvm::StringLiteral kSplitProjectionsAttrName =
    "kiln.split_projections";

/// Adds `n` to the i64 count `name` on `func`.
void addToCount(Operation *func, StringRef name, int64_t n);

/// The segment a projection's `[K, N]` weight makes of a fused output at
/// `offset`: its tensor name without ".weight", its N rows, its format.
SegmentAttr projectionSegment(QWeightType weight, int64_t offset);

/// The weights of the projection kiln-fuse-norm-linear folds `norm` (a
/// step.rms_norm) into, or none: the next compute op, a step.fused_linear
/// or a step.linear of a `[K, N]` weight, reads the norm's output (a plain
/// arena buffer nothing else reads) as its input.
std::optional<SmallVector<QWeightType>> projectionTakingNorm(Operation *norm);

/// What the step pipeline runs besides its fixed passes.
struct StepPipelineOptions {
  /// Byte alignment of every arena buffer (the planner's).
  int64_t alignment = 256;
  /// The fusions (fold-dequant, fuse-projections, and every fuse-* and
  /// mark-live-rows pass on the step program).
  bool fuse = true;
  /// Tensor-parallel ranks: partition runs when above 1.
  int64_t tp = 1;
  /// Ops after an arena buffer's last access before its bytes are reused
  /// (the planner's).
  int64_t reuseDistance = 0;
  /// fuse-shared-expert after fuse-expert-add (with `fuse`).
  bool fuseSharedExpert = true;
  /// fold-router in that form after it (with `fuse`; off by default).
  RouterFold foldRouter = RouterFold::Off;
  /// fuse-router-choice right after fold-router (off by default: measured
  /// slower on the GPU, docs/perf.md).
  bool fuseRouterChoice = false;
  /// elide-indexers first: indexers whose caches hold no more positions
  /// than their top-k (they select every position) left out.
  bool elideIndexers = true;
  /// split-projections after partition: a projection read only in slices
  /// of its heads becomes one per slice (the slices become views).
  bool splitProjections = true;
  /// fuse-add-norm's projection-norms: a collective's residual add whose
  /// norm folds into a projection becomes step.all_reduce_add.
  bool projectionNorms = false;
  /// fuse-add-norm's router-norms, without the router fold (which takes
  /// those collectives' norm itself): the norm goes to the F32 router that
  /// reads it (step.rms_norm_router).
  bool routerNorms = false;
};

/// Adds elide-indexers, partition, split-projections, fold-dequant,
/// fuse-projections, lower-to-step, the step fusions, plan-memory and
/// verify-capture, as `options` asks: a kiln module in, a planned, verified
/// step module out.
void buildStepPipeline(OpPassManager &pm,
                       const StepPipelineOptions &options = {});

/// Registers the passes and the named pipeline `kiln-step-pipeline`.
void registerKilnPassesAndPipelines();

} // namespace mlir::kiln

#endif // KILN_COMPILER_PASSES_PASSES_H
