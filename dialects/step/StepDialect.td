//===- StepDialect.td - The buffer-level step dialect ------*- tablegen -*-===//
//
// The dialect definition, the buffer type constraints and the op base classes
// shared by every step op.
//
//===----------------------------------------------------------------------===//
#ifndef STEP_DIALECT_TD
#define STEP_DIALECT_TD

include "mlir/IR/OpBase.td"
include "mlir/Interfaces/DestinationStyleOpInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def Step_Dialect : Dialect {
  let name = "step";
  let cppNamespace = "::mlir::step";
  let summary = "Buffer-level decode steps with declared mutation";
  let description = [{
    One decode step at the level of buffers, the form every backend consumes
    and the form a CUDA graph records. Every op is in destination-passing
    style: it names the buffers it reads (`ins`) and the buffers it writes
    (`outs`) and declares a memory effect per operand (`MemRead` on each
    input, `MemWrite` on each output). An in-place op names the same buffer
    in both lists, so it reads and writes it, and says so.

    Every buffer comes from a declaration at the top of the step: a weight
    (`step.weight`, read-only), a piece of persistent state (`step.state`:
    the latent and indexer caches), an input or output slot of the step
    (`step.input`, `step.output`), or a range of the step's one arena
    (`step.buffer`), optionally seen through a contiguous `step.view`.
    Nothing allocates, nothing synchronises with the host, and
    `--kiln-verify-capture` proves it before any backend sees the step.
  }];
  let dependentDialects = ["::mlir::kiln::KilnDialect"];
  let useDefaultAttributePrinterParser = 1;
  let extraClassDeclaration = [{
    void registerAttributes();
  }];
}

/// Every step op.
class Step_Op<string mnemonic, list<Trait> traits = []>
    : Op<Step_Dialect, mnemonic, traits>;

/// Activations and scalars at the buffer level: statically shaped memrefs
/// with the identity layout (views are contiguous by construction).
def Step_Buffer : Type<
    And<[IsMemRefTypePred,
         CPred<"::llvm::cast<::mlir::MemRefType>($_self).hasStaticShape()">,
         CPred<"::llvm::cast<::mlir::MemRefType>($_self).getLayout()"
               ".isIdentity()">]>,
    "statically shaped memref with the identity layout",
    "::mlir::MemRefType">;

/// A compute op in destination-passing style whose last `numOuts` operands
/// are the buffers it writes (its DPS inits).
class Step_ComputeOp<string mnemonic, int numOuts, list<Trait> traits = []>
    : Step_Op<mnemonic, traits # [DestinationStyleOpInterface]> {
  let extraClassDeclaration = [{
    /// The buffers this op writes: its last }] # numOuts # [{ operands.
    ::mlir::MutableOperandRange getDpsInitsMutable() {
      ::mlir::Operation *op = getOperation();
      return ::mlir::MutableOperandRange(
          op, op->getNumOperands() - }] # numOuts # [{, }] # numOuts # [{);
    }
  }];
}

/// A read-only input buffer of a compute op.
class In<Constraint type, string desc = "input"> : Arg<type, desc, [MemRead]>;
/// A buffer a compute op writes.
class Out<Constraint type, string desc = "output"> : Arg<type, desc, [MemWrite]>;

#endif // STEP_DIALECT_TD
