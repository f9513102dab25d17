//===- StepReport.cpp - What a planned step costs, in figures --------------===//
#include "passes/StepReport.h"

#include "passes/Passes.h"
#include "passes/StepAccess.h"
#include "quant/QuantTypes.h"
#include "step/StepOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/Format.h"

using namespace mlir;
using namespace mlir::step;

static int64_t weightBytesOf(mlir::kiln::QWeightType type) {
  std::optional<::kiln::GGMLType> format = ::kiln::parseGGMLType(type.getFormat().str());
  ArrayRef<int64_t> dims = type.getDims();
  if (!format || dims.empty())
    return 0;
  std::optional<uint64_t> row = ::kiln::rowBytes(*format, dims[0]);
  if (!row)
    return 0;
  int64_t bytes = static_cast<int64_t>(*row);
  for (int64_t d : dims.drop_front())
    bytes *= d;
  return bytes;
}

std::vector<StepReport> mlir::step::reportSteps(ModuleOp module) {
  std::vector<StepReport> out;
  for (auto func : module.getOps<func::FuncOp>()) {
    StepReport r;
    r.function = func.getSymName().str();
    // A tensor bound in parts (attn_q_b's row cuts) counts each part.
    llvm::StringSet<> weights;
    bool isStep = false;
    func.walk([&](Operation *op) {
      if (!isa_and_present<StepDialect>(op->getDialect()))
        return;
      isStep = true;
      if (auto w = dyn_cast<WeightOp>(op)) {
        if (weights.insert(w.getType().getValueName()).second) {
          ++r.weights;
          r.weightBytes += weightBytesOf(w.getType());
        }
      } else if (auto s = dyn_cast<StateOp>(op)) {
        MemRefType t = s.getType();
        ++r.caches;
        r.cachePositions = std::max(r.cachePositions, t.getDimSize(0));
        r.cacheBytesPerToken +=
            t.getDimSize(1) * elementBytes(t.getElementType());
      } else if (isa<InputOp, OutputOp>(op)) {
        r.slotBytes += bufferBytes(cast<MemRefType>(op->getResult(0).getType()));
      } else if (isa<BufferOp>(op)) {
        ++r.buffers;
      } else if (auto reduce = dyn_cast<AllReduceOp>(op)) {
        ++r.allReduces;
        r.allReduceBytes += bufferBytes(reduce.getInput().getType());
      } else if (auto fused = dyn_cast<AllReduceAddRMSNormOp>(op)) {
        ++r.allReduces;
        ++r.fusedAllReduces;
        r.allReduceBytes += bufferBytes(fused.getPartial().getType());
      } else if (auto added = dyn_cast<AllReduceAddOp>(op)) {
        ++r.allReduces;
        ++r.addedAllReduces;
        r.allReduceBytes += bufferBytes(added.getPartial().getType());
      } else if (auto gather = dyn_cast<AllGatherOp>(op)) {
        ++r.allGathers;
        r.allGatherBytes += bufferBytes(gather.getInput().getType());
      }
      if (!isa<ViewOp, BufferOp, WeightOp, StateOp, InputOp, OutputOp>(op)) {
        ++r.ops;
        ++r.opCounts[op->getName().getStringRef().str()];
      }
    });
    if (!isStep)
      continue;
    if (auto tp = func->getAttrOfType<IntegerAttr>("kiln.tp"))
      r.ranks = tp.getInt();
    if (auto n = func->getAttrOfType<IntegerAttr>(
            mlir::kiln::kElidedIndexersAttrName))
      r.elidedIndexers = n.getInt();
    if (auto n = func->getAttrOfType<IntegerAttr>(
            mlir::kiln::kSplitProjectionsAttrName))
      r.splitProjections = n.getInt();
    if (auto plan = func->getAttrOfType<PlanAttr>(kPlanAttrName)) {
      r.arenaBytes = plan.getArenaBytes();
      r.peakLiveBytes = plan.getPeakLiveBytes();
      r.alignment = plan.getAlignment();
    }
    out.push_back(std::move(r));
  }
  return out;
}

static std::string human(int64_t bytes) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  std::string s;
  llvm::raw_string_ostream os(s);
  if (u == 0)
    os << bytes << " B";
  else
    os << llvm::format("%.2f %s", v, units[u]);
  return s;
}

void mlir::step::printReport(llvm::raw_ostream &os,
                             const std::vector<StepReport> &steps) {
  auto row = [&](StringRef what, int64_t value, bool bytes) {
    os << "  " << llvm::left_justify(what, 28)
       << llvm::format_decimal(value, 16);
    if (bytes && value >= 1024)
      os << "  (" << human(value) << ")";
    os << "\n";
  };
  for (const StepReport &r : steps) {
    os << "step @" << r.function;
    if (r.ranks > 1)
      os << " (per rank; each of the " << r.ranks
         << " tensor-parallel ranks runs the same step on its own slices)";
    os << "\n";
    row("ops per step", r.ops, false);
    row("all_reduce per step", r.allReduces, false);
    if (r.fusedAllReduces)
      row("  fused with add + norm", r.fusedAllReduces, false);
    if (r.addedAllReduces)
      row("  fused with add", r.addedAllReduces, false);
    if (r.allReduces)
      row("  bytes per all_reduce", r.allReduceBytes / r.allReduces, true);
    row("all_gather per step", r.allGathers, false);
    if (r.allGathers)
      row("  bytes per all_gather part", r.allGatherBytes / r.allGathers,
          true);
    row("arena buffers", r.buffers, false);
    row("arena bytes", r.arenaBytes, true);
    row("peak live bytes", r.peakLiveBytes, true);
    row("plan alignment", r.alignment, false);
    row("caches", r.caches, false);
    row("cache bytes per token", r.cacheBytesPerToken, true);
    row("cache positions", r.cachePositions, false);
    row("cache bytes at positions", r.cacheBytesPerToken * r.cachePositions,
        true);
    row("weights read", r.weights, false);
    row("weight bytes", r.weightBytes, true);
    row("slot bytes", r.slotBytes, true);
    if (r.elidedIndexers)
      row("indexers left out", r.elidedIndexers, false);
    if (r.splitProjections)
      row("projections cut per slice", r.splitProjections, false);
    os << "  ops by kind:";
    for (const auto &[name, count] : r.opCounts)
      os << " " << StringRef(name).drop_front(5) << "=" << count;
    os << "\n";
  }
}
