//===- KilnOps.td - Operations of the kiln dialect ---------*- tablegen -*-===//
#ifndef KILN_OPS_TD
#define KILN_OPS_TD

include "KilnDialect.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

//===----------------------------------------------------------------------===//
// Element-wise binary ops: two tensors of one type in, the same type out.
//===----------------------------------------------------------------------===//

class Kiln_ElementwiseBinaryOp<string mnemonic, list<Trait> traits = []>
    : Kiln_Op<mnemonic, traits # [Pure, SameOperandsAndResultType]> {
  let arguments = (ins Kiln_FloatTensor:$lhs, Kiln_FloatTensor:$rhs);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($result)";
}

def Kiln_AddOp : Kiln_ElementwiseBinaryOp<"add", [Commutative]> {
  let summary = "element-wise addition (the residual stream)";
  let description = [{
    `lhs + rhs`, element by element. In a decoder it is the residual update
    `x = x + block(x)`.

    Example:
    ```mlir
    %x1 = kiln.add %x0, %attn : tensor<6144xf32>
    ```
  }];
}

def Kiln_SwiGLUOp : Kiln_ElementwiseBinaryOp<"swiglu"> {
  let summary = "SwiGLU gate: silu(gate) * up";
  let description = [{
    `silu(lhs) * rhs` element by element, where `silu(g) = g / (1 + exp(-g))`;
    `lhs` is the gate projection and `rhs` the up projection of the same
    input. Not commutative: the gate is always the first operand.

    Example:
    ```mlir
    %h = kiln.swiglu %gate, %up : tensor<12288xf32>
    ```
  }];
}

//===----------------------------------------------------------------------===//
// Normalisation
//===----------------------------------------------------------------------===//

def Kiln_RMSNormOp : Kiln_Op<"rms_norm",
    [Pure, AllTypesMatch<["input", "result"]>]> {
  let summary = "RMS normalisation over the innermost dimension";
  let description = [{
    For each vector `x` along the innermost dimension of `input`:
    `x / sqrt(mean(x * x) + epsilon) * weight`, accumulated in f32.
    `weight` is one-dimensional with the innermost dimension's size.
    `epsilon` must be positive and finite (GLM-5 uses 1e-5).

    Example:
    ```mlir
    %a = kiln.rms_norm %x, %attn_norm {epsilon = 1.0e-05 : f32}
        : tensor<6144xf32>, tensor<6144xf32>
    ```
  }];
  let arguments = (ins Kiln_FloatTensor:$input, Kiln_FloatTensor:$weight,
                       F32Attr:$epsilon);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $weight attr-dict `:` type($input) `,` type($weight)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Decisions
//===----------------------------------------------------------------------===//

def Kiln_ArgmaxOp : Kiln_Op<"argmax",
    [Pure, DeclareOpInterfaceMethods<InferTypeOpInterface>]> {
  let summary = "index of the largest element (greedy decoding)";
  let description = [{
    The index of the largest element of a one-dimensional, non-empty tensor
    as a 0-d `i32` tensor; ties go to the lowest index, so every
    implementation (and every tensor-parallel rank) picks the same token.

    Example:
    ```mlir
    %token = kiln.argmax %logits : tensor<154880xf32>
    ```
  }];
  let arguments = (ins Kiln_FloatTensor:$input);
  let results = (outs 0DTensorOf<[I32]>:$result);
  let assemblyFormat = "$input attr-dict `:` type($input)";
  let hasVerifier = 1;
}

#endif // KILN_OPS_TD
