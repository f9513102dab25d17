//===- KilnDialect.td - The model-level kiln dialect -------*- tablegen -*-===//
//
// The dialect definition and the op base classes shared by every kiln op.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_DIALECT_TD
#define KILN_DIALECT_TD

include "mlir/IR/OpBase.td"

def Kiln_Dialect : Dialect {
  let name = "kiln";
  let cppNamespace = "::mlir::kiln";
  let summary = "Model-level operations of large mixture-of-experts models";
  let description = [{
    The `kiln` dialect describes one decode step of a language model such as
    GLM-5 with value semantics on tensors: every op consumes tensors and
    produces new ones, and the verifiers check every shape, head count and
    quantisation-block constraint with a precise message. Lower levels (the
    buffer-level step dialect, backends) make memory and mutation explicit.

    Weights are `!kiln.qweight` handles naming a GGUF tensor, its block
    format and its dims; dequantisation is part of the meaning of the ops
    that consume them. The model's per-token state (MLA latent cache, DSA
    indexer key cache) is typed (`!kiln.latent_cache`, `!kiln.index_cache`)
    and only ops that declare a read or write effect on it touch it.
  }];
  let useDefaultTypePrinterParser = 1;
  let useDefaultAttributePrinterParser = 1;
  let extraClassDeclaration = [{
    void registerTypes();
    void registerAttributes();
  }];
}

/// Every kiln op.
class Kiln_Op<string mnemonic, list<Trait> traits = []>
    : Op<Kiln_Dialect, mnemonic, traits>;

/// Activations: ranked tensors of the float types decode runs in.
def Kiln_FloatTensor : RankedTensorOf<[F32, F16, BF16]>;

#endif // KILN_DIALECT_TD
