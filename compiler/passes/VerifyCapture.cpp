//===- VerifyCapture.cpp - Prove a step is safe to capture as a graph ------===//
//
// A CUDA graph replays the kernels and buffers it recorded, nothing else.
// Replays are correct only if every mutation is declared (so the graph's
// dependencies and the plan know about it), nothing allocates or waits for
// the host, and no kernel writes bytes another buffer still needs. This pass
// proves that for a planned step from the IR alone: effects come from
// MemoryEffectOpInterface, places from the `at` offsets the planner wrote,
// and liveness from its own walk over every access, not from the planner.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"
#include "passes/StepAccess.h"
#include "step/StepOps.h"

#include "mlir/Analysis/AliasAnalysis.h"
#include "mlir/Interfaces/DestinationStyleOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Interfaces/ViewLikeInterface.h"

#include "llvm/ADT/STLExtras.h"

namespace mlir::kiln {
#define GEN_PASS_DEF_VERIFYCAPTURE
#include "passes/Passes.h.inc"
} // namespace mlir::kiln

using namespace mlir;
using namespace mlir::step;

namespace {

using Range = std::pair<int64_t, int64_t>; // [first, second) bytes

bool overlaps(Range a, Range b) {
  return a.first < b.second && b.first < a.second;
}

/// Bytes of one buffer that hold a value, as sorted disjoint ranges.
struct WrittenBytes {
  SmallVector<Range> ranges;

  void add(Range r) {
    ranges.push_back(r);
    llvm::sort(ranges);
    SmallVector<Range> merged;
    for (Range x : ranges)
      if (!merged.empty() && x.first <= merged.back().second)
        merged.back().second = std::max(merged.back().second, x.second);
      else
        merged.push_back(x);
    ranges = std::move(merged);
  }
  bool covers(Range r) const {
    for (Range x : ranges)
      if (x.first <= r.first && r.second <= x.second)
        return true;
    return r.first >= r.second;
  }
};

/// One access to an arena buffer, in program order.
struct Event {
  int64_t position;
  bool write;
  Range bytes; ///< relative to the buffer
};

struct VerifyCapture : mlir::kiln::impl::VerifyCaptureBase<VerifyCapture> {
  void runOnOperation() override {
    func::FuncOp func = getOperation();
    bool isStep = false;
    func.walk([&](Operation *op) {
      if (isa_and_present<StepDialect>(op->getDialect()))
        isStep = true;
    });
    if (!isStep)
      return;
    if (failed(verifyStep(func)))
      signalPassFailure();
  }

  LogicalResult verifyStep(func::FuncOp func);
  LogicalResult verifyPlacement(func::FuncOp func, PlanAttr plan);
  LogicalResult verifyOp(Operation *op, AliasAnalysis &aliases);
};

/// Checks every arena buffer is placed, aligned and inside the arena.
LogicalResult VerifyCapture::verifyPlacement(func::FuncOp func,
                                             PlanAttr plan) {
  WalkResult r = func.walk([&](BufferOp buffer) {
    std::optional<int64_t> at = buffer.getOffset();
    if (!at) {
      buffer.emitOpError("buffer %")
          << buffer.getBufferName()
          << " has no arena offset: run --kiln-plan-memory first";
      return WalkResult::interrupt();
    }
    if (!plan) {
      buffer.emitOpError("buffer %")
          << buffer.getBufferName() << " has an offset but @"
          << func.getSymName() << " has no step.plan";
      return WalkResult::interrupt();
    }
    int64_t end = *at + buffer.getSizeInBytes();
    if (*at % plan.getAlignment() != 0) {
      buffer.emitOpError("buffer %")
          << buffer.getBufferName() << " at " << *at
          << " is not aligned to the plan's " << plan.getAlignment()
          << " bytes";
      return WalkResult::interrupt();
    }
    if (end > plan.getArenaBytes()) {
      buffer.emitOpError("buffer %")
          << buffer.getBufferName() << " occupies [" << *at << ", " << end
          << ") but the arena has " << plan.getArenaBytes() << " bytes";
      return WalkResult::interrupt();
    }
    return WalkResult::advance();
  });
  return failure(r.wasInterrupted());
}

/// The rules that concern one op by itself: declared effects, no
/// allocation, no host synchronisation, no undeclared aliasing.
LogicalResult VerifyCapture::verifyOp(Operation *op, AliasAnalysis &aliases) {
  auto bufferOperands = [&] {
    SmallVector<Value> out;
    for (Value v : op->getOperands())
      if (isBufferType(v.getType()))
        out.push_back(v);
    return out;
  };
  SmallVector<Value> operands = bufferOperands();

  if (op->getNumRegions() != 0)
    return op->emitOpError("has regions: a step is straight-line code, with "
                           "no control flow the host would have to decide");

  auto iface = dyn_cast<MemoryEffectOpInterface>(op);
  if (!iface) {
    if (!operands.empty())
      return op->emitOpError("has unknown memory effects on ")
             << describeBuffer(operands.front())
             << ": every op in a step must declare what it reads and "
                "writes";
    for (Value r : op->getResults())
      if (isBufferType(r.getType()))
        return op->emitOpError("produces a buffer with unknown memory "
                               "effects: buffers come from declarations");
    return success();
  }

  SmallVector<MemoryEffects::EffectInstance> effects;
  iface.getEffects(effects);
  for (const MemoryEffects::EffectInstance &e : effects)
    if (isa<MemoryEffects::Allocate>(e.getEffect())) {
      return op->emitOpError("allocates a buffer inside a step: every "
                             "buffer must be declared and placed by the "
                             "memory plan");
    }
  for (const MemoryEffects::EffectInstance &e : effects)
    if (isa<MemoryEffects::Free>(e.getEffect()))
      return op->emitOpError("frees memory inside a step");

  // A buffer result must be a declaration or a declared view; anything
  // else may alias its operands without saying so.
  if (!isDeclaration(op) && !isa<ViewOp>(op))
    for (Value r : op->getResults()) {
      if (!isBufferType(r.getType()))
        continue;
      for (Value v : operands)
        if (!aliases.alias(r, v).isNo())
          return op->emitOpError("result #")
                 << cast<OpResult>(r).getResultNumber() << " may alias "
                 << describeBuffer(v)
                 << " without an in-place declaration: step ops write "
                    "through outs, and views are step.view";
      return op->emitOpError("result #")
             << cast<OpResult>(r).getResultNumber()
             << " is a buffer no declaration or plan places";
    }
  // Every buffer operand is covered by a declared effect.
  for (auto [i, v] : llvm::enumerate(op->getOperands())) {
    if (!isBufferType(v.getType()))
      continue;
    bool declared = llvm::any_of(effects, [&](auto &e) {
      return e.getValue() == v &&
             isa<MemoryEffects::Read, MemoryEffects::Write>(e.getEffect());
    });
    if (!declared && !isa<ViewOp>(op))
      return op->emitOpError("declares no memory effect on operand #")
             << i << " (" << describeBuffer(v)
             << "): a step op says whether it reads or writes each buffer";
  }

  // Writes go only to the buffers an op names as destinations.
  auto dps = dyn_cast<DestinationStyleOpInterface>(op);
  for (const MemoryEffects::EffectInstance &e : effects) {
    Value v = e.getValue();
    if (!isa<MemoryEffects::Write>(e.getEffect()) || !v ||
        !isBufferType(v.getType()))
      continue;
    bool isInit = dps && llvm::any_of(dps.getDpsInits(),
                                      [&](Value init) { return init == v; });
    if (!isInit)
      return op->emitOpError("writes ")
             << describeBuffer(v)
             << " without naming it as a destination (outs); an in-place "
                "write names the buffer in both ins and outs";
  }

  // A value that leaves device memory for the host forces a wait.
  bool readsBuffer = llvm::any_of(effects, [](auto &e) {
    return isa<MemoryEffects::Read>(e.getEffect()) && e.getValue() &&
           isBufferType(e.getValue().getType());
  });
  for (Value r : op->getResults())
    if (readsBuffer && !isBufferType(r.getType())) {
      Value source;
      for (auto &e : effects)
        if (isa<MemoryEffects::Read>(e.getEffect()) && e.getValue())
          source = e.getValue();
      return op->emitOpError("reads ")
             << describeBuffer(source)
             << " into a host value: a host synchronisation inside a step "
                "(a graph replay cannot return data to the host mid-step)";
    }

  return success();
}

LogicalResult VerifyCapture::verifyStep(func::FuncOp func) {
  if (!func.getBody().hasOneBlock())
    return func.emitOpError("a step is one block of straight-line code");
  auto plan = func->getAttrOfType<PlanAttr>(kPlanAttrName);
  if (failed(verifyPlacement(func, plan)))
    return failure();

  AliasAnalysis aliases(func);
  Block &body = func.getBody().front();

  // Pass 1: the per-op rules, and every access to every buffer in order.
  DenseMap<Operation *, SmallVector<Event>> events;
  SmallVector<Operation *> ops;
  SmallVector<SmallVector<Access, 4>> opAccesses; // per entry of `ops`
  for (Operation &op : body) {
    if (auto ret = dyn_cast<func::ReturnOp>(op)) {
      if (ret.getNumOperands() != 0)
        return ret.emitOpError("a step returns nothing: its results are "
                               "written to step.output slots");
      continue;
    }
    if (failed(verifyOp(&op, aliases)))
      return failure();
    if (isDeclaration(&op) || isa<ViewOp>(op))
      continue;
    int64_t position = static_cast<int64_t>(ops.size());
    ops.push_back(&op);
    SmallVector<Access, 4> &accesses = opAccesses.emplace_back();
    collectAccesses(&op, accesses);
    for (const Access &a : accesses) {
      std::optional<BufferRef> ref = resolveBuffer(a.value);
      if (!ref)
        return op.emitOpError("touches ")
               << describeBuffer(a.value)
               << ", which is not rooted in a step declaration";
      events[ref->root].push_back(
          {position, a.write, {ref->begin, ref->end}});
    }
  }

  // Arena buffers by their placed ranges, for the overlap rule.
  SmallVector<std::pair<BufferOp, Range>> placed;
  func.walk([&](BufferOp b) {
    int64_t at = *b.getOffset();
    placed.push_back({b, {at, at + b.getSizeInBytes()}});
  });

  // Pass 2: replay the accesses. Reads must see written bytes; writes must
  // not land on read-only buffers or on bytes another buffer still needs.
  DenseMap<Operation *, WrittenBytes> written;
  for (auto [position, op] : llvm::enumerate(ops)) {
    for (const Access &a : opAccesses[position]) {
      BufferRef ref = *resolveBuffer(a.value);
      Operation *root = ref.root;
      Range bytes{ref.begin, ref.end};
      if (!a.write) {
        if (isa<WeightOp, StateOp, InputOp>(root))
          continue; // Placed before the step runs.
        if (!written[root].covers(bytes))
          return op->emitOpError("reads ")
                 << describeBuffer(a.value)
                 << ", which nothing in the step wrote before";
        continue;
      }
      if (isa<WeightOp, InputOp>(root))
        return op->emitOpError("writes ")
               << describeBuffer(a.value) << ", a read-only "
               << (isa<WeightOp>(root) ? "weight" : "input slot");
      written[root].add(bytes);

      auto buffer = dyn_cast<BufferOp>(root);
      if (!buffer)
        continue;
      Range arena{*buffer.getOffset() + bytes.first,
                  *buffer.getOffset() + bytes.second};
      for (auto &[other, otherRange] : placed) {
        if (other == buffer || !overlaps(arena, otherRange))
          continue;
        Range clobbered{std::max(arena.first, otherRange.first) -
                            otherRange.first,
                        std::min(arena.second, otherRange.second) -
                            otherRange.first};
        // `other` is live here if it holds a value (written at or before
        // this op) that a read at or after this op still needs, with no
        // complete rewrite of the clobbered bytes in between.
        const SmallVector<Event> &history = events[other];
        bool held = llvm::any_of(history, [&](const Event &e) {
          return e.write && e.position <= static_cast<int64_t>(position);
        });
        if (!held)
          continue;
        for (const Event &e : history) {
          if (e.position < static_cast<int64_t>(position))
            continue;
          if (e.write && e.position > static_cast<int64_t>(position) &&
              e.bytes.first <= clobbered.first &&
              clobbered.second <= e.bytes.second)
            break;
          bool needsValue = !e.write && overlaps(e.bytes, clobbered);
          bool sameOpWrite =
              e.write && e.position == static_cast<int64_t>(position);
          if (needsValue || sameOpWrite)
            return op->emitOpError("writes ")
                   << describeBuffer(a.value) << " at arena bytes ["
                   << arena.first << ", " << arena.second << "), over %"
                   << other.getBufferName() << " at [" << otherRange.first
                   << ", " << otherRange.second
                   << (sameOpWrite ? "), which the same op also writes"
                                   : "), which is still to be read");
        }
      }
    }
  }
  return success();
}

} // namespace
