//===- StepReport.h - What a planned step costs, in figures -----*- C++ -*-===//
#ifndef KILN_COMPILER_PASSES_STEPREPORT_H
#define KILN_COMPILER_PASSES_STEPREPORT_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mlir::step {

/// Figures of one planned step function.
struct StepReport {
  std::string function;
  int64_t ops = 0;            ///< compute ops per step (kernels, unfused)
  std::map<std::string, int64_t> opCounts; ///< by op name
  int64_t buffers = 0;        ///< arena buffers
  int64_t arenaBytes = 0;     ///< the plan's arena
  int64_t peakLiveBytes = 0;  ///< lower bound any plan needs
  int64_t alignment = 0;
  int64_t cachePositions = 0; ///< positions each cache holds
  int64_t cacheBytesPerToken = 0;
  int64_t caches = 0;
  int64_t weights = 0;        ///< distinct weight tensors the step reads
  int64_t weightBytes = 0;    ///< their bytes in the file's formats
  int64_t slotBytes = 0;      ///< input and output slots
  int64_t ranks = 1;          ///< tensor-parallel ranks (each runs this)
  int64_t allReduces = 0;     ///< sums over ranks per step (fused or not)
  int64_t fusedAllReduces = 0; ///< of which inside all_reduce_add_rms_norm
  int64_t addedAllReduces = 0; ///< of which inside all_reduce_add
  int64_t allReduceBytes = 0; ///< bytes each rank contributes, summed
  int64_t allGathers = 0;
  int64_t allGatherBytes = 0;
  /// Indexers left out (kiln-elide-indexers: each would select every
  /// position) and projections cut per slice (kiln-split-projections), as
  /// those passes recorded on the function.
  int64_t elidedIndexers = 0;
  int64_t splitProjections = 0;
};

/// Figures of every step function (functions with step ops) in `module`.
std::vector<StepReport> reportSteps(ModuleOp module);

/// Prints the figures as an aligned table, one block per function.
void printReport(llvm::raw_ostream &os, const std::vector<StepReport> &steps);

} // namespace mlir::step

#endif // KILN_COMPILER_PASSES_STEPREPORT_H
