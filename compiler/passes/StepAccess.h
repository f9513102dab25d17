//===- StepAccess.h - Which buffer bytes a step op touches ------*- C++ -*-===//
//
// Shared by the memory planner and the capture verifier: resolving a buffer
// value (through step.view) to its declaration and byte range, and naming
// buffers in diagnostics. Both read effects through MemoryEffectOpInterface,
// never from a list of op names.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_COMPILER_PASSES_STEPACCESS_H
#define KILN_COMPILER_PASSES_STEPACCESS_H

#include "mlir/IR/Operation.h"
#include "mlir/IR/Value.h"
#include "llvm/ADT/SmallVector.h"

#include <optional>
#include <string>

namespace mlir::step {

/// A buffer value seen as bytes [begin, end) of the buffer its declaration
/// (step.buffer, step.state, step.input, step.output, step.weight) made.
struct BufferRef {
  Operation *root = nullptr;
  int64_t begin = 0;
  int64_t end = 0;
};

/// True for the types a step's buffers have: memrefs and weight handles.
bool isBufferType(Type type);

/// True for the ops that declare a buffer.
bool isDeclaration(Operation *op);

/// Follows step.view to the declaration. Empty when `v` is not rooted in a
/// declaration (a block argument, the result of some other op).
std::optional<BufferRef> resolveBuffer(Value v);

/// How diagnostics name a buffer: `%name`, or `%name[a, b)` for a view of
/// bytes [a, b) of it.
std::string describeBuffer(Value v);

/// One declared access of an op to a buffer value.
struct Access {
  Value value;
  bool write = false; ///< MemWrite (else MemRead)
};

/// Appends the reads and writes `op` declares on buffer values, reads
/// first. False when `op` does not implement MemoryEffectOpInterface.
bool collectAccesses(Operation *op, llvm::SmallVectorImpl<Access> &out);

/// The next op after `op` that is neither a declaration nor a view (the
/// next op that computes), or null.
Operation *nextCompute(Operation *op);

/// Whether every use of `v` is by `producer` or `consumer` (a fused
/// chain's intermediate vector that nothing else reads).
bool usedOnlyBy(Value v, Operation *producer, Operation *consumer);

/// Erases the step.buffer that declares `v` once nothing uses it (a fused
/// chain's intermediate vector, after the chain's ops are gone).
void eraseIfUnusedBuffer(Value v);

/// The op before `op` that computes, or null.
Operation *previousCompute(Operation *op);

/// True when no op strictly between `from` and `to` (one block, `from`
/// first) writes the bytes `v` lives in, so that a read of `v` may move
/// from one to the other (a fusion placing a read later). False where a
/// buffer's root or an op's effects are unknown.
bool unwrittenBetween(Value v, Operation *from, Operation *to);

/// True when no op strictly between `from` and `to` (one block, `from`
/// first) reads or writes the bytes `v` lives in, so that a write of `v`
/// may move from one to the other (a fusion placing a write earlier).
/// False where a buffer's root or an op's effects are unknown.
bool untouchedBetween(Value v, Operation *from, Operation *to);

/// Whether `v` can be read or written right before `op`: defined before it
/// in its block, or by a declaration without operands that may move there
/// (declareBefore).
bool availableBefore(Value v, Operation *op);

/// Moves the declaration of `v` before `op` when it comes after it
/// (availableBefore holds).
void declareBefore(Value v, Operation *op);

/// The name a declaration gives its buffer.
std::string declarationName(Operation *root);

} // namespace mlir::step

#endif // KILN_COMPILER_PASSES_STEPACCESS_H
