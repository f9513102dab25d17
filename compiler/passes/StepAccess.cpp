//===- StepAccess.cpp - Which buffer bytes a step op touches
//---------------===//
#include "passes/StepAccess.h"

#include "step/StepOps.h"

#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/FormatVariadic.h"

using namespace mlir;
using namespace mlir::step;

bool mlir::step::isBufferType(Type type) {
  return isa<BaseMemRefType, mlir::kiln::QWeightType>(type);
}

bool mlir::step::isDeclaration(Operation *op) {
  return isa<BufferOp, WeightOp, StateOp, InputOp, OutputOp>(op);
}

bool mlir::step::collectAccesses(Operation *op, SmallVectorImpl<Access> &out) {
  auto iface = dyn_cast<MemoryEffectOpInterface>(op);
  if (!iface)
    return false;
  SmallVector<MemoryEffects::EffectInstance> effects;
  iface.getEffects(effects);
  for (bool write : {false, true})
    for (const MemoryEffects::EffectInstance &e : effects) {
      Value v = e.getValue();
      if (!v || !isBufferType(v.getType()))
        continue;
      if (write ? isa<MemoryEffects::Write>(e.getEffect())
                : isa<MemoryEffects::Read>(e.getEffect()))
        out.push_back({v, write});
    }
  return true;
}

std::optional<BufferRef> mlir::step::resolveBuffer(Value v) {
  int64_t begin = 0;
  int64_t bytes = isa<MemRefType>(v.getType())
                      ? bufferBytes(cast<MemRefType>(v.getType()))
                      : 0;
  while (auto view = v.getDefiningOp<ViewOp>()) {
    begin += view.getOffset() *
             elementBytes(view.getSource().getType().getElementType());
    v = view.getSource();
  }
  Operation *root = v.getDefiningOp();
  if (!root || !isDeclaration(root))
    return std::nullopt;
  // Weights are not arena bytes; their range is empty and never compared.
  return BufferRef{root, begin, begin + bytes};
}

std::string mlir::step::declarationName(Operation *root) {
  return llvm::TypeSwitch<Operation *, std::string>(root)
      .Case([](BufferOp op) { return op.getBufferName().str(); })
      .Case([](StateOp op) { return op.getStateName().str(); })
      .Case([](InputOp op) { return op.getSlotName().str(); })
      .Case([](OutputOp op) { return op.getSlotName().str(); })
      .Case([](WeightOp op) { return op.getType().getValueName(); })
      .Default(
          [](Operation *op) { return op->getName().getStringRef().str(); });
}

std::string mlir::step::describeBuffer(Value v) {
  std::optional<BufferRef> ref = resolveBuffer(v);
  if (!ref) {
    std::string s;
    llvm::raw_string_ostream os(s);
    if (auto arg = dyn_cast<BlockArgument>(v))
      os << "block argument #" << arg.getArgNumber();
    else
      os << "result #" << cast<OpResult>(v).getResultNumber() << " of '"
         << v.getDefiningOp()->getName() << "'";
    return s;
  }
  // Appended, not "%" + name: GCC 12 warned on the inlined insert of the
  // concatenation (-Wrestrict, a false positive).
  std::string name = "%";
  name += declarationName(ref->root);
  if (v.getDefiningOp<ViewOp>())
    name += llvm::formatv("[{0}, {1})", ref->begin, ref->end).str();
  return name;
}

/// Whether no op strictly between `from` and `to` writes (`writesOnly`) or
/// reads or writes v's buffer, and every op there says what it accesses.
static bool clearBetween(Value v, Operation *from, Operation *to,
                         bool writesOnly) {
  std::optional<BufferRef> ref = resolveBuffer(v);
  if (!ref)
    return false;
  for (Operation *op = from->getNextNode(); op && op != to;
       op = op->getNextNode()) {
    SmallVector<Access> accesses;
    if (!collectAccesses(op, accesses))
      return false;
    for (const Access &a : accesses) {
      if (writesOnly && !a.write)
        continue;
      std::optional<BufferRef> other = resolveBuffer(a.value);
      if (!other || other->root == ref->root)
        return false;
    }
  }
  return true;
}

bool mlir::step::unwrittenBetween(Value v, Operation *from, Operation *to) {
  return clearBetween(v, from, to, /*writesOnly=*/true);
}

bool mlir::step::untouchedBetween(Value v, Operation *from, Operation *to) {
  return clearBetween(v, from, to, /*writesOnly=*/false);
}

bool mlir::step::availableBefore(Value v, Operation *op) {
  Operation *def = v.getDefiningOp();
  if (!def)
    return v.getParentBlock() == op->getBlock();
  if (def->getBlock() != op->getBlock())
    return false;
  return def->isBeforeInBlock(op) ||
         (isDeclaration(def) && def->getNumOperands() == 0);
}

void mlir::step::declareBefore(Value v, Operation *op) {
  Operation *def = v.getDefiningOp();
  if (def && !def->isBeforeInBlock(op))
    def->moveBefore(op);
}

bool mlir::step::usedOnlyBy(Value v, Operation *producer, Operation *consumer) {
  return llvm::all_of(v.getUses(), [&](OpOperand &use) {
    return use.getOwner() == producer || use.getOwner() == consumer;
  });
}

void mlir::step::eraseIfUnusedBuffer(Value v) {
  if (auto buffer = v.getDefiningOp<BufferOp>(); buffer && v.use_empty())
    buffer.erase();
}

Operation *mlir::step::nextCompute(Operation *op) {
  for (Operation *next = op->getNextNode(); next; next = next->getNextNode())
    if (!isDeclaration(next) && !isa<ViewOp>(next))
      return next;
  return nullptr;
}

Operation *mlir::step::previousCompute(Operation *op) {
  for (Operation *p = op->getPrevNode(); p; p = p->getPrevNode())
    if (!isDeclaration(p) && !isa<ViewOp>(p))
      return p;
  return nullptr;
}
