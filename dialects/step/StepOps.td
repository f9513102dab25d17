//===- StepOps.td - Operations of the step dialect ---------*- tablegen -*-===//
#ifndef STEP_OPS_TD
#define STEP_OPS_TD

include "StepAttrs.td"
include "StepDialect.td"
include "kiln/KilnAttrs.td"
include "kiln/KilnTypes.td"
include "mlir/IR/OpAsmInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/ViewLikeInterface.td"

/// 0-d i32 buffers: token ids, positions, argmax results, selection counts.
def Step_I32Scalar : Type<
    And<[Step_Buffer.predicate,
         CPred<"::llvm::cast<::mlir::MemRefType>($_self).getRank() == 0">,
         CPred<"::llvm::cast<::mlir::MemRefType>($_self).getElementType()"
               ".isInteger(32)">]>,
    "0-d i32 memref", "::mlir::MemRefType">;

/// A per-channel parameter: a float buffer, or a one-dimensional weight the
/// op reads (dequantising it) itself.
def Step_Param : AnyTypeOf<[Step_Buffer, Kiln_QWeightType],
    "float buffer or one-dimensional weight">;

//===----------------------------------------------------------------------===//
// Buffer declarations
//===----------------------------------------------------------------------===//

class Step_DeclOp<string mnemonic, list<Trait> traits = []>
    : Step_Op<mnemonic, traits # [Pure,
        DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmResultNames"]>]>;

def Step_BufferOp : Step_DeclOp<"buffer"> {
  let summary = "a range of the step's arena";
  let description = [{
    An intermediate of the step: `size(type)` bytes of the arena at byte
    offset `at`. Before memory planning the offset is absent; the planner
    (`--kiln-plan-memory`) assigns every buffer an offset from a liveness
    analysis, reusing bytes whose values are dead, and the capture verifier
    checks those offsets again itself. Two buffers are distinct values even
    when their ranges overlap; what may overlap is decided by when each is
    live, never by trust. `name` is for people (and printed SSA names).

    Example:
    ```mlir
    %blk.0.attn_q_a.out = step.buffer "blk.0.attn_q_a.out" at 1024 : memref<2048xf32>
    ```
  }];
  let arguments = (ins StrAttr:$buffer_name,
                       OptionalAttr<I64Attr>:$offset);
  let results = (outs Step_Buffer:$result);
  let assemblyFormat = [{
    $buffer_name (`at` $offset^)? attr-dict `:` type($result)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// Bytes the buffer occupies in the arena.
    int64_t getSizeInBytes();
  }];
}

def Step_ViewOp : Step_Op<"view", [Pure,
    DeclareOpInterfaceMethods<ViewLikeOpInterface>]> {
  let summary = "a contiguous reinterpretation of part of a buffer";
  let description = [{
    The `numel(result)` elements of `source` starting at element `offset`,
    reshaped to the result's shape (row-major, same element type). Views are
    how a step reshapes (`[64 x 192]` heads of a `[12288]` projection) and
    takes contiguous slices without copying; they alias their source, and
    every analysis sees that through `ViewLikeOpInterface`. Strided slices
    are copies (`step.slice`).

    Example:
    ```mlir
    %heads = step.view %q[0] : memref<384xf32> to memref<8x48xf32>
    ```
  }];
  let arguments = (ins Step_Buffer:$source, I64Attr:$offset);
  let results = (outs Step_Buffer:$result);
  let assemblyFormat = [{
    $source `[` $offset `]` attr-dict `:` type($source) `to` type($result)
  }];
  let hasVerifier = 1;
}

def Step_WeightOp : Step_DeclOp<"weight"> {
  let summary = "a read-only weight tensor of the model file";
  let description = [{
    The handle to one GGUF tensor (name, block format and dims are its
    type), placed by the runtime before the first step. Steps only read
    weights; a write to one is rejected by the capture verifier.

    Example:
    ```mlir
    %blk.0.attn_q_a = step.weight : !kiln.qweight<"blk.0.attn_q_a.weight", "q8_0", [256, 128]>
    ```
  }];
  let results = (outs Kiln_QWeightType:$result);
  let assemblyFormat = "attr-dict `:` qualified(type($result))";
}

def Step_StateOp : Step_DeclOp<"state"> {
  let summary = "persistent state: a cache that lives across steps";
  let description = [{
    A buffer the runtime owns for the whole generation, one row per
    position: `memref<positions x width x f16>`. The MLA latent cache rows
    are `[latent | rope]` (`kv_lora_rank + qk_rope_dim` values), the DSA
    indexer cache rows the indexer key. State counts as written before the
    step starts (earlier steps wrote it); `step.cache_append` writes this
    step's row.

    Example:
    ```mlir
    %blk.0.kv_cache = step.state "blk.0.kv_cache" : memref<4096x80xf16>
    ```
  }];
  let arguments = (ins StrAttr:$state_name);
  let results = (outs Step_Buffer:$result);
  let assemblyFormat = "$state_name attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Step_InputOp : Step_DeclOp<"input"> {
  let summary = "an input slot of the step (token id, position)";
  let description = [{
    A buffer the runtime fills before each replay of the step, at a fixed
    place, so a captured graph reads the new value without being captured
    again. Read-only inside the step.

    Example:
    ```mlir
    %pos = step.input "position" : memref<i32>
    ```
  }];
  let arguments = (ins StrAttr:$slot_name);
  let results = (outs Step_Buffer:$result);
  let assemblyFormat = "$slot_name attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Step_OutputOp : Step_DeclOp<"output"> {
  let summary = "an output slot of the step (next token, logits)";
  let description = [{
    A buffer the step writes and the runtime reads after each replay, at a
    fixed place. Like an arena buffer it holds nothing when the step starts:
    it must be written before it is read.

    Example:
    ```mlir
    %logits = step.output "logits" : memref<1024xf32>
    ```
  }];
  let arguments = (ins StrAttr:$slot_name);
  let results = (outs Step_Buffer:$result);
  let assemblyFormat = "$slot_name attr-dict `:` type($result)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Data movement
//===----------------------------------------------------------------------===//

def Step_CopyOp : Step_ComputeOp<"copy", 1> {
  let summary = "copy one buffer into another of the same type";
  let description = [{
    Example:
    ```mlir
    step.copy ins(%x : memref<256xf32>) outs(%y : memref<256xf32>)
    ```
  }];
  let arguments = (ins In<Step_Buffer>:$input, Out<Step_Buffer>:$output);
  let assemblyFormat = [{
    `ins` `(` $input `:` type($input) `)` `outs` `(` $output `:`
    type($output) `)` attr-dict
  }];
  let hasVerifier = 1;
}

def Step_SliceOp : Step_ComputeOp<"slice", 1> {
  let summary = "copy a (strided) box of a buffer into a dense buffer";
  let description = [{
    `output[i...] = input[offsets + i...]` for every index of `output`;
    `offsets` has one entry per dimension. Contiguous slices are views;
    this op is for the rest (the rope half of each query head).

    Example:
    ```mlir
    step.slice ins(%heads : memref<8x48xf32>) outs(%q_pe : memref<8x16xf32>) {offsets = array<i64: 0, 32>}
    ```
  }];
  let arguments = (ins In<Step_Buffer>:$input, DenseI64ArrayAttr:$offsets,
                       Out<Step_Buffer>:$output);
  let assemblyFormat = [{
    `ins` `(` $input `:` type($input) `)` `outs` `(` $output `:`
    type($output) `)` attr-dict
  }];
  let hasVerifier = 1;
}

def Step_ConcatOp : Step_ComputeOp<"concat", 1> {
  let summary = "concatenate buffers along one dimension";
  let description = [{
    Example:
    ```mlir
    step.concat ins(%lat, %pe : memref<64xf32>, memref<16xf32>) outs(%row : memref<80xf32>) {dim = 0 : i64}
    ```
  }];
  let arguments = (ins In<Variadic<Step_Buffer>>:$inputs, I64Attr:$dim,
                       Out<Step_Buffer>:$output);
  let assemblyFormat = [{
    `ins` `(` $inputs `:` type($inputs) `)` `outs` `(` $output `:`
    type($output) `)` attr-dict
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Element-wise
//===----------------------------------------------------------------------===//

class Step_BinaryOp<string mnemonic> : Step_ComputeOp<mnemonic, 1> {
  let arguments = (ins In<Step_Buffer>:$lhs, In<Step_Buffer>:$rhs,
                       Out<Step_Buffer>:$output);
  let assemblyFormat = [{
    `ins` `(` $lhs `,` $rhs `:` type($lhs) `,` type($rhs) `)` `outs` `(`
    $output `:` type($output) `)` attr-dict
  }];
  let hasVerifier = 1;
}

def Step_AddOp : Step_BinaryOp<"add"> {
  let summary = "element-wise sum";
  let description = [{
    `output = lhs + rhs`. The residual update may be in place: name the
    stream in `ins` and `outs`.

    Example:
    ```mlir
    step.add ins(%x, %attn : memref<256xf32>, memref<256xf32>) outs(%x : memref<256xf32>)
    ```
  }];
}

def Step_SwiGLUOp : Step_BinaryOp<"swiglu"> {
  let summary = "silu(gate) * up";
  let description = [{
    `output = silu(lhs) * rhs`, `lhs` the gate projection.

    Example:
    ```mlir
    step.swiglu ins(%g, %u : memref<512xf32>, memref<512xf32>) outs(%h : memref<512xf32>)
    ```
  }];
}

//===----------------------------------------------------------------------===//
// Normalisation and position
//===----------------------------------------------------------------------===//

def Step_RMSNormOp : Step_ComputeOp<"rms_norm", 1> {
  let summary = "RMS normalisation over the innermost dimension";
  let description = [{
    As `kiln.rms_norm`, into `output`.

    Example:
    ```mlir
    step.rms_norm ins(%x, %w : memref<256xf32>, memref<256xf32>) outs(%n : memref<256xf32>) {epsilon = 1.0e-05 : f32}
    ```
  }];
  let arguments = (ins In<Step_Buffer>:$input, In<Step_Param>:$weight,
                       F32Attr:$epsilon, Out<Step_Buffer>:$output);
  let assemblyFormat = [{
    `ins` `(` $input `,` $weight `:` type($input) `,`
    qualified(type($weight)) `)` `outs` `(` $output `:` type($output) `)`
    attr-dict
  }];
  let hasVerifier = 1;
}

def Step_AddRMSNormOp : Step_ComputeOp<"add_rms_norm", 2> {
  let summary = "residual add, then RMS normalisation of the sum";
  let description = [{
    `sum = lhs + rhs`, then `output = rms_norm(sum) * weight` over the
    innermost dimension: the residual update and the next norm in one
    pass, writing both the new stream and its normalised form. Produced by
    `--kiln-fuse-add-norm` from an add whose sum feeds the next norm.

    Example:
    ```mlir
    step.add_rms_norm ins(%x, %attn, %ffn_norm : memref<256xf32>, memref<256xf32>, !kiln.qweight<"blk.0.ffn_norm.weight", "f32", [256]>) outs(%x1, %f : memref<256xf32>, memref<256xf32>) {epsilon = 1.0e-05 : f32}
    ```
  }];
  let arguments = (ins In<Step_Buffer>:$lhs, In<Step_Buffer>:$rhs,
                       In<Step_Param>:$weight, F32Attr:$epsilon,
                       Out<Step_Buffer>:$sum, Out<Step_Buffer>:$output);
  let assemblyFormat = [{
    `ins` `(` $lhs `,` $rhs `,` $weight `:` type($lhs) `,` type($rhs) `,`
    qualified(type($weight)) `)` `outs` `(` $sum `,` $output `:` type($sum)
    `,` type($output) `)` attr-dict
  }];
  let hasVerifier = 1;
}

def Step_AllReduceAddRMSNormOp
    : Step_ComputeOp<"all_reduce_add_rms_norm", 2, [AttrSizedOperandSegments]> {
  let summary = "sum over ranks, residual add, then the next RMS norm";
  let description = [{
    `sum = residual + all_reduce(partial)` (over the tensor-parallel ranks,
    in rank order), then `output = rms_norm(sum) * weight`: a row-parallel
    projection's partial result made whole, added to the stream and
    normalised for the next block in one op, so the collective and the
    elementwise work share one pass. Produced by `--kiln-fuse-add-norm` after
    partitioning.

    With a router tail (`tail = E` and a third output `logits`, from
    `kiln-fold-router`) the partial holds `n + E` values, `n` the sum's:
    its first `n` are the projection's part and its last `E` this rank's
    `step.router_partial` (or the whole partial is one
    `step.linear_router`'s). All `n + E` are summed over the ranks in one
    collective; the first `n` are added and normalised as above, and
    `logits[i] = reduced[n + i] / rms`, where `rms = sqrt(mean(sum^2) +
    epsilon)` is the one the norm divides by: the router's logits `gate .
    output`, with the norm weight applied on the ranks, before the sum.
    Only a one-dimensional sum takes a tail.

    With a tail the op may also make the router's choice from those logits
    (`kiln-fuse-router-choice`): a `choose` clause with the choice's
    optional selection bias (`E` values) and its outputs `ids` (`top_k`
    i32) and `weights` (`top_k` f32), and the attributes `top_k`, `gating`,
    `normalize` and `routed_scale`, all as `step.moe_choose`'s. The op is
    then exactly the all-reduce with its tail, `logits` written as above,
    followed by exactly `step.moe_choose` of `logits` (the same bits as the
    two ops), so a backend may choose where the reduced tail already is,
    without an op of its own after the collective. Every rank makes the
    choice: every rank reads `ids` and `weights`. The operands are stored
    in the order partial, residual, weight, bias (when there is one), sum,
    output, logits, ids, weights.

    Example:
    ```mlir
    step.all_reduce_add_rms_norm ins(%o_part, %x, %ffn_norm : memref<6144xf32>, memref<6144xf32>, !kiln.qweight<"blk.3.ffn_norm.weight", "f32", [6144]>) outs(%x1, %f : memref<6144xf32>, memref<6144xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum"}
    step.all_reduce_add_rms_norm ins(%p, %x, %ffn_norm : memref<6400xf32>, memref<6144xf32>, !kiln.qweight<"blk.3.ffn_norm.weight", "f32", [6144]>) outs(%x1, %f, %logits : memref<6144xf32>, memref<6144xf32>, memref<256xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum", tail = 256 : i64}
    step.all_reduce_add_rms_norm ins(%p, %x, %ffn_norm : memref<6400xf32>, memref<6144xf32>, !kiln.qweight<"blk.3.ffn_norm.weight", "f32", [6144]>) outs(%x1, %f, %logits : memref<6144xf32>, memref<6144xf32>, memref<256xf32>) choose ins(%bias : !kiln.qweight<"blk.3.exp_probs_b.bias", "f32", [256]>) outs(%ids, %w : memref<8xi32>, memref<8xf32>) {epsilon = 1.0e-05 : f32, gating = "sigmoid", normalize = true, reduction = "sum", routed_scale = 2.5 : f32, tail = 256 : i64, top_k = 8 : i64}
    ```
  }];
  let arguments = (ins In<Step_Buffer>:$partial, In<Step_Buffer>:$residual,
                       In<Step_Param>:$weight,
                       In<Optional<Step_Param>>:$bias, F32Attr:$epsilon,
                       StrAttr:$reduction, OptionalAttr<I64Attr>:$tail,
                       OptionalAttr<I64Attr>:$top_k,
                       OptionalAttr<StrAttr>:$gating,
                       OptionalAttr<BoolAttr>:$normalize,
                       OptionalAttr<F32Attr>:$routed_scale,
                       Out<Step_Buffer>:$sum, Out<Step_Buffer>:$output,
                       Out<Optional<Step_Buffer>>:$logits,
                       Out<Optional<Step_Buffer>>:$ids,
                       Out<Optional<Step_Buffer>>:$weights);
  let assemblyFormat = [{
    `ins` `(` $partial `,` $residual `,` $weight `:` type($partial) `,`
    type($residual) `,` qualified(type($weight)) `)` `outs` `(` $sum `,`
    $output (`,` $logits^)? `:` type($sum) `,` type($output)
    (`,` type($logits)^)? `)`
    (`choose` (`ins` `(` $bias^ `:` qualified(type($bias)) `)`)? `outs` `(`
    $ids^ `,` $weights `:` type($ids) `,` type($weights) `)`)? attr-dict
  }];
  let hasVerifier = 1;
  // Two outputs; three with the router tail's logits; five with the
  // choice's ids and weights.
  let extraClassDeclaration = [{
    /// The buffers this op writes: every operand from `sum` on.
    ::mlir::MutableOperandRange getDpsInitsMutable() {
      ::mlir::Operation *op = getOperation();
      const unsigned first = getSumMutable().getOperandNumber();
      return ::mlir::MutableOperandRange(op, first,
                                         op->getNumOperands() - first);
    }
    /// Whether the op makes the router's choice (`choose`).
    bool hasChoice() { return getIds() != nullptr; }
  }];
}

def Step_AllReduceAddOp : Step_ComputeOp<"all_reduce_add", 1> {
  let summary = "sum over ranks, then the residual add";
  let description = [{
    `sum = residual + all_reduce(partial)` over the tensor-parallel ranks, in
    rank order: `step.all_reduce_add_rms_norm` without the norm. Produced by
    `kiln-fuse-add-norm` where the next norm of the sum folds into the
    Q8_0 or F32 projection that reads it instead (`kiln-fuse-norm-linear`), so
    that the collective needs no sum of squares across its blocks and the
    projection normalises its input as it reads it (GLM-5: the collective
    that ends each layer, whose norm feeds the next layer's q_a run).

    Example:
    ```mlir
    step.all_reduce_add ins(%down_part, %x : memref<6144xf32>, memref<6144xf32>) outs(%x1 : memref<6144xf32>) {reduction = "sum"}
    ```
  }];
  let arguments = (ins In<Step_Buffer>:$partial, In<Step_Buffer>:$residual,
                       StrAttr:$reduction, Out<Step_Buffer>:$sum);
  let assemblyFormat = [{
    `ins` `(` $partial `,` $residual `:` type($partial) `,` type($residual)
    `)` `outs` `(` $sum `:` type($sum) `)` attr-dict
  }];
  let hasVerifier = 1;
}
def Step_LayerNormOp : Step_ComputeOp<"layer_norm", 1> {
  let summary = "layer normalisation over the innermost dimension";
  let description = [{
    As `kiln.layer_norm`, into `output`.

    Example:
    ```mlir
    step.layer_norm ins(%k, %w, %b : memref<32xf32>, memref<32xf32>, memref<32xf32>) outs(%kn : memref<32xf32>) {epsilon = 1.0e-06 : f32}
    ```
  }];
  let arguments = (ins In<Step_Buffer>:$input, In<Step_Param>:$weight,
                       In<Step_Param>:$bias, F32Attr:$epsilon,
                       Out<Step_Buffer>:$output);
  let assemblyFormat = [{
    `ins` `(` $input `,` $weight `,` $bias `:` type($input) `,`
    qualified(type($weight)) `,` qualified(type($bias)) `)` `outs` `(`
    $output `:` type($output) `)` attr-dict
  }];
  let hasVerifier = 1;
}

def Step_RopeOp : Step_ComputeOp<"rope", 1> {
  let summary = "rotary position embedding";
  let description = [{
    As `kiln.rope`, with the position read from a buffer (so a captured
    step rotates by the current position on every replay).

    Example:
    ```mlir
    step.rope ins(%q, %pos : memref<8x16xf32>, memref<i32>) outs(%qr : memref<8x16xf32>) {dims = 16 : i64, offset = 0 : i64, style = "interleaved", theta = 1.0e+06 : f32}
    ```
  }];
  let arguments = (ins In<Step_Buffer>:$input, In<Step_I32Scalar>:$position,
                       StrAttr:$style, F32Attr:$theta, I64Attr:$offset,
                       I64Attr:$dims, Out<Step_Buffer>:$output);
  let assemblyFormat = [{
    `ins` `(` $input `,` $position `:` type($input) `,` type($position) `)`
    `outs` `(` $output `:` type($output) `)` attr-dict
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Weights
//===----------------------------------------------------------------------===//

def Step_DequantOp : Step_ComputeOp<"dequant", 1> {
  let summary = "dequantise a whole (small) weight into a buffer";
  let description = [{
    As `kiln.dequant`. Used for norm weights and biases.

    Example:
    ```mlir
    step.dequant ins(%w : !kiln.qweight<"output_norm.weight", "f32", [256]>) outs(%n : memref<256xf32>)
    ```
  }];
  let arguments = (ins In<Kiln_QWeightType, "weight">:$weight,
                       Out<Step_Buffer>:$output);
  let assemblyFormat = [{
    `ins` `(` $weight `:` qualified(type($weight)) `)` `outs` `(` $output
    `:` type($output) `)` attr-dict
  }];
  let hasVerifier = 1;
}

def Step_EmbedOp : Step_ComputeOp<"embed", 1> {
  let summary = "one row of the embedding table";
  let description = [{
    As `kiln.embed`, with the token id read from a buffer.

    Example:
    ```mlir
    step.embed ins(%token_embd, %tok : !kiln.qweight<"token_embd.weight", "q8_0", [256, 1024]>, memref<i32>) outs(%x : memref<256xf32>)
    ```
  }];
  let arguments = (ins In<Kiln_QWeightType, "table">:$table,
                       In<Step_I32Scalar>:$token, Out<Step_Buffer>:$output);
  let assemblyFormat = [{
    `ins` `(` $table `,` $token `:` qualified(type($table)) `,` type($token)
    `)` `outs` `(` $output `:` type($output) `)` attr-dict
  }];
  let hasVerifier = 1;
}

def Step_LinearOp : Step_ComputeOp<"linear", 1> {
  let summary = "mat-vec with a quantised weight";
  let description = [{
    As `kiln.linear`: dequantisation inside the product, f32 accumulation,
    plain `[K, N]` or stacked `[K, N, B]` weights.

    Example:
    ```mlir
    step.linear ins(%x, %w : memref<256xf32>, !kiln.qweight<"blk.0.attn_q_a.weight", "q8_0", [256, 128]>) outs(%y : memref<128xf32>)
    ```
  }];
  let arguments = (ins In<Step_Buffer>:$input,
                       In<Kiln_QWeightType, "weight">:$weight,
                       Out<Step_Buffer>:$output);
  let assemblyFormat = [{
    `ins` `(` $input `,` $weight `:` type($input) `,` qualified(type($weight))
    `)` `outs` `(` $output `:` type($output) `)` attr-dict
  }];
  let hasVerifier = 1;
}

def Step_FusedLinearOp : Step_ComputeOp<"fused_linear", 1> {
  let summary = "several projections of one input, as one mat-vec";
  let description = [{
    As `kiln.fused_linear`: the output is the segments of `segments`, in
    order, each computed with its own weight and format.

    `live_from` (optional, one entry per segment, set by
    `kiln-mark-live-rows`): segment i's rows are read only at steps whose
    `position` input is at least `live_from[i]`, so below that a backend
    may leave them unwritten (GLM-5: the indexer's query and head weights,
    which the indexer reads only past its top-k).

    Example:
    ```mlir
    step.fused_linear ins(%a, %q_a, %kv_a : memref<256xf32>, !kiln.qweight<...>, !kiln.qweight<...>) outs(%qkv : memref<208xf32>) {segments = [...]}
    ```
  }];
  let arguments = (ins In<Step_Buffer>:$input,
                       In<Variadic<Kiln_QWeightType>, "weights">:$weights,
                       TypedArrayAttrBase<Kiln_SegmentAttr,
                                          "segment map">:$segments,
                       Out<Step_Buffer>:$output,
                       OptionalAttr<DenseI64ArrayAttr>:$live_from);
  let assemblyFormat = [{
    `ins` `(` $input `,` $weights `:` type($input) `,`
    qualified(type($weights)) `)` `outs` `(` $output `:` type($output) `)`
    attr-dict
  }];
  let hasVerifier = 1;
}

def Step_RMSNormLinearOp : Step_ComputeOp<"rms_norm_linear", 1> {
  let summary = "RMS normalisation of a vector, then projections of it";
  let description = [{
    `output = fused_linear(rms_norm(input) * norm)`: the normalisation of
    `step.rms_norm` (epsilon `epsilon`) and the segments of
    `step.fused_linear`, in one op, so a backend may normalise the input
    inside the mat-vec instead of writing it out and launching again.
    Produced by `kiln-fuse-norm-linear` from an `rms_norm` whose output
    only the `fused_linear` right after it reads (GLM-5: the q_a norm and
    q_b with the indexer's query). `live_from` as for `step.fused_linear`.

    Example:
    ```mlir
    step.rms_norm_linear ins(%c, %q_a_norm, %q_b, %iq_b : memref<256xf32>, !kiln.qweight<"blk.0.attn_q_a_norm.weight", "f32", [256]>, !kiln.qweight<...>, !kiln.qweight<...>) outs(%q : memref<640xf32>) {epsilon = 1.0e-05 : f32, segments = [...]}
    ```
  }];
  let arguments = (ins In<Step_Buffer>:$input, In<Step_Param>:$norm,
                       In<Variadic<Kiln_QWeightType>, "weights">:$weights,
                       F32Attr:$epsilon,
                       TypedArrayAttrBase<Kiln_SegmentAttr,
                                          "segment map">:$segments,
                       Out<Step_Buffer>:$output,
                       OptionalAttr<DenseI64ArrayAttr>:$live_from);
  let assemblyFormat = [{
    `ins` `(` $input `,` $norm `,` $weights `:` type($input) `,`
    qualified(type($norm)) `,` qualified(type($weights)) `)`
    `outs` `(` $output `:` type($output) `)` attr-dict
  }];
  let hasVerifier = 1;
}

def Step_SwiGLULinearOp : Step_ComputeOp<"swiglu_linear", 1> {
  let summary = "silu(gate) * up, then a mat-vec of it";
  let description = [{
    `output = linear(swiglu(gate, up), weight)`: the product of
    `step.swiglu` and the mat-vec of `step.linear` (a vector and a 2-D
    weight) in one op, so a backend may form each input value inside the
    mat-vec instead of writing the product out and launching again.
    Produced by `kiln-fuse-swiglu-linear` from a `swiglu` whose output only
    the `linear` right after it reads (GLM-5: the shared expert's down
    projection, on the critical path of every MoE layer).

    Example:
    ```mlir
    step.swiglu_linear ins(%g, %u, %down : memref<128xf32>, memref<128xf32>, !kiln.qweight<"blk.3.ffn_down_shexp.weight", "q8_0", [128, 256]>) outs(%y : memref<256xf32>)
    ```
  }];
  let arguments = (ins In<Step_Buffer>:$gate, In<Step_Buffer>:$up,
                       In<Kiln_QWeightType, "weight">:$weight,
                       Out<Step_Buffer>:$output);
  let assemblyFormat = [{
    `ins` `(` $gate `,` $up `,` $weight `:` type($gate) `,` type($up) `,`
    qualified(type($weight)) `)` `outs` `(` $output `:` type($output) `)`
    attr-dict
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Attention and its state
//===----------------------------------------------------------------------===//

def Step_CacheAppendOp : Step_ComputeOp<"cache_append", 1> {
  let summary = "write this token's row of a cache";
  let description = [{
    Row `position` of `cache` becomes `entry` (converted to the cache's
    element type). The cache is this op's output: it declares the write.

    Example:
    ```mlir
    step.cache_append ins(%row, %pos : memref<80xf32>, memref<i32>) outs(%blk.0.kv_cache : memref<4096x80xf16>)
    ```
  }];
  let arguments = (ins In<Step_Buffer>:$entry, In<Step_I32Scalar>:$position,
                       Out<Step_Buffer, "cache">:$cache);
  let assemblyFormat = [{
    `ins` `(` $entry `,` $position `:` type($entry) `,` type($position) `)`
    `outs` `(` $cache `:` type($cache) `)` attr-dict
  }];
  let hasVerifier = 1;
}

def Step_NormRopeAppendOp : Step_ComputeOp<"norm_rope_append", 1> {
  let summary = "normalise, rotate and append this token's row of a cache";
  let description = [{
    The tail that writes an attention cache, in one op: with `y = entry`,
    `y[0, norm_dims)` becomes the normalisation of `entry[0, norm_dims)`
    (`norm = "rms"`: as `step.rms_norm` with `weight`; `norm = "layer"`: as
    `step.layer_norm` with `weight` and `bias`), then `y[offset, offset +
    dims)` is rotated as `step.rope` (style, theta), and row `position` of
    `cache` becomes `y`. The same math as those ops in that order, without
    writing the intermediate vectors or launching once per op.
    Produced by `kiln-fuse-cache-append` from a norm, rope (and concat)
    chain that ends in a `step.cache_append` (GLM-5: the latent cache's
    `[rms_norm(c) | rope(k_pe)]` and the indexer key's
    `rope(layer_norm(k))`).

    Example:
    ```mlir
    step.norm_rope_append ins(%kv, %kv_norm, %pos : memref<80xf32>, memref<64xf32>, memref<i32>) outs(%blk.0.kv_cache : memref<4096x80xf16>) {dims = 16 : i64, epsilon = 1.0e-05 : f32, norm = "rms", norm_dims = 64 : i64, offset = 64 : i64, style = "interleaved", theta = 1.0e+06 : f32}
    step.norm_rope_append ins(%k, %k_norm, %pos : memref<32xf32>, memref<32xf32>, memref<i32>) bias(%k_bias : memref<32xf32>) outs(%blk.0.index_cache : memref<4096x32xf16>) {dims = 16 : i64, epsilon = 1.0e-06 : f32, norm = "layer", norm_dims = 32 : i64, offset = 0 : i64, style = "interleaved", theta = 1.0e+06 : f32}
    ```
    The operands are stored in the order entry, weight, bias (when there
    is one), position, cache.
  }];
  let arguments = (ins In<Step_Buffer>:$entry, In<Step_Param>:$weight,
                       In<Optional<Step_Param>>:$bias,
                       In<Step_I32Scalar>:$position, StrAttr:$norm,
                       I64Attr:$norm_dims, F32Attr:$epsilon, StrAttr:$style,
                       F32Attr:$theta, I64Attr:$offset, I64Attr:$dims,
                       Out<Step_Buffer, "cache">:$cache);
  let assemblyFormat = [{
    `ins` `(` $entry `,` $weight `,` $position `:` type($entry) `,`
    qualified(type($weight)) `,` type($position) `)`
    (`bias` `(` $bias^ `:` qualified(type($bias)) `)`)?
    `outs` `(` $cache `:` type($cache) `)` attr-dict
  }];
  let hasVerifier = 1;
}

def Step_MLAAttentionOp : Step_ComputeOp<"mla_attention", 1,
    [AttrSizedOperandSegments]> {
  let summary = "absorbed MLA decode attention over the latent cache";
  let description = [{
    As `kiln.mla_attention`. The cache row is `[latent | rope]`; the latent
    width is `q_latent`'s innermost dimension and the rope width `q_rope`'s.
    The output is `[heads x latent]`, or with a `projection` (a stacked
    weight `[latent, N, heads]`, GLM-5's `attn_v_b`) `[heads x N]`: each
    head's latent output times that head's `N x latent` matrix, as a
    `step.linear` of the stack after the attention would give. Produced by
    `kiln-fuse-mla-projection` from that linear, so a backend can project
    each head inside the attention's own launch.

    Example:
    ```mlir
    step.mla_attention ins(%ql, %qr, %kv, %pos, %sel, %n : memref<8x64xf32>, memref<8x16xf32>, memref<4096x80xf16>, memref<i32>, memref<32xi32>, memref<i32>) outs(%o : memref<8x64xf32>) {scale = 0.144 : f32}
    step.mla_attention ins(%ql, %qr, %kv, %pos : memref<8x64xf32>, memref<8x16xf32>, memref<4096x80xf16>, memref<i32>) projection(%v_b : !kiln.qweight<"blk.0.attn_v_b.weight", "q8_0", [64, 32, 8]>) outs(%v : memref<8x32xf32>) {scale = 0.144 : f32}
    ```
  }];
  let arguments = (ins In<Step_Buffer>:$q_latent, In<Step_Buffer>:$q_rope,
                       In<Step_Buffer, "cache">:$cache,
                       In<Step_I32Scalar>:$position,
                       In<Optional<Step_Buffer>>:$selected,
                       In<Optional<Step_I32Scalar>>:$selected_count,
                       In<Optional<Kiln_QWeightType>, "weight">:$projection,
                       F32Attr:$scale, Out<Step_Buffer>:$output);
  let assemblyFormat = [{
    `ins` `(` $q_latent `,` $q_rope `,` $cache `,` $position
    (`,` $selected^ `,` $selected_count)? `:` type($q_latent) `,`
    type($q_rope) `,` type($cache) `,` type($position)
    (`,` type($selected)^ `,` type($selected_count))? `)`
    (`projection` `(` $projection^ `:` qualified(type($projection)) `)`)?
    `outs` `(` $output `:` type($output) `)` attr-dict
  }];
  let hasVerifier = 1;
}

def Step_DSAIndexerOp : Step_ComputeOp<"dsa_indexer", 2> {
  let summary = "DSA indexer: score cached tokens, select the top k";
  let description = [{
    As `kiln.dsa_indexer`: writes the selected positions (ascending, unused
    entries 0) and their count. With `rope_dims` (and `rope_offset`,
    `rope_style`, `rope_theta`, all four or none) each head's query is
    first rotated as `step.rope` at `position` would rotate it: produced by
    `kiln-fuse-indexer-rope` from the rope that fed the query, so the
    rotation costs no op of its own (and none at all where every position
    is selected, when no score is read). While `position + 1 <= top_k`
    every attended position is selected and neither the query nor the head
    weights are read (`kiln-mark-live-rows` relies on it).

    Example:
    ```mlir
    step.dsa_indexer ins(%q, %w, %ic, %pos : memref<4x32xf32>, memref<4xf32>, memref<4096x32xf16>, memref<i32>) outs(%sel, %n : memref<32xi32>, memref<i32>) {scale = 0.088 : f32, top_k = 32 : i64}
    step.dsa_indexer ins(%q, %w, %ic, %pos : memref<4x32xf32>, memref<4xf32>, memref<4096x32xf16>, memref<i32>) outs(%sel, %n : memref<32xi32>, memref<i32>) {rope_dims = 16 : i64, rope_offset = 0 : i64, rope_style = "interleaved", rope_theta = 1.0e+06 : f32, scale = 0.088 : f32, top_k = 32 : i64}
    ```
  }];
  let arguments = (ins In<Step_Buffer>:$query, In<Step_Buffer>:$head_weights,
                       In<Step_Buffer, "cache">:$cache,
                       In<Step_I32Scalar>:$position, I64Attr:$top_k,
                       F32Attr:$scale, OptionalAttr<StrAttr>:$rope_style,
                       OptionalAttr<F32Attr>:$rope_theta,
                       OptionalAttr<I64Attr>:$rope_offset,
                       OptionalAttr<I64Attr>:$rope_dims,
                       Out<Step_Buffer>:$selected,
                       Out<Step_I32Scalar>:$count);
  let assemblyFormat = [{
    `ins` `(` $query `,` $head_weights `,` $cache `,` $position `:`
    type($query) `,` type($head_weights) `,` type($cache) `,`
    type($position) `)` `outs` `(` $selected `,` $count `:`
    type($selected) `,` type($count) `)` attr-dict
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Mixture of experts
//===----------------------------------------------------------------------===//

def Step_MoERouterOp : Step_ComputeOp<"moe_router", 2> {
  let summary = "router: gate scores, bias-corrected top-k, weights";
  let description = [{
    As `kiln.moe_router`: writes the chosen expert ids and their weights.
    The logits are `gate . input` (f32); the choice after them is
    `step.moe_choose`'s.

    Example:
    ```mlir
    step.moe_router ins(%f, %gate, %bias : memref<256xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [256, 16]>, memref<16xf32>) outs(%ids, %w : memref<4xi32>, memref<4xf32>) {gating = "sigmoid", normalize = true, routed_scale = 2.5 : f32, top_k = 4 : i64}
    ```
  }];
  let arguments = (ins In<Step_Buffer>:$input,
                       In<Kiln_QWeightType, "gate">:$gate,
                       In<Optional<Step_Param>>:$bias, I64Attr:$top_k,
                       StrAttr:$gating, BoolAttr:$normalize,
                       F32Attr:$routed_scale, Out<Step_Buffer>:$ids,
                       Out<Step_Buffer>:$weights);
  let assemblyFormat = [{
    `ins` `(` $input `,` $gate (`,` $bias^)? `:` type($input) `,`
    qualified(type($gate)) (`,` qualified(type($bias))^)? `)` `outs` `(`
    $ids `,`
    $weights `:` type($ids) `,` type($weights) `)` attr-dict
  }];
  let hasVerifier = 1;
}

def Step_RMSNormRouterOp : Step_ComputeOp<"rms_norm_router", 3> {
  let summary = "RMS normalisation of a vector, written out, and its router";
  let description = [{
    `output = rms_norm(input) * norm` (epsilon `epsilon`), then
    `step.moe_router` of `output` into `ids` and `weights`, in one op: the
    router reads the whole vector anyway, so a backend may normalise it as
    it reads it, divide the logits by the rms and write `output` for the
    ops after it (the experts). Produced by `kiln-fuse-add-norm`'s
    `router-norms` where the norm after a collective's residual add feeds a
    router of an F32 gate: the collective takes the add alone
    (`step.all_reduce_add`) and no longer sums squares across its blocks
    (GLM-5: the collective after each MoE layer's attention).

    Example:
    ```mlir
    step.rms_norm_router ins(%h, %ffn_norm, %gate, %bias : memref<256xf32>, !kiln.qweight<"blk.1.ffn_norm.weight", "f32", [256]>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [256, 16]>, memref<16xf32>) outs(%f, %ids, %w : memref<256xf32>, memref<4xi32>, memref<4xf32>) {epsilon = 1.0e-05 : f32, gating = "sigmoid", normalize = true, routed_scale = 2.5 : f32, top_k = 4 : i64}
    ```
  }];
  let arguments = (ins In<Step_Buffer>:$input, In<Step_Param>:$norm,
                       In<Kiln_QWeightType, "gate">:$gate,
                       In<Optional<Step_Param>>:$bias, F32Attr:$epsilon,
                       I64Attr:$top_k, StrAttr:$gating, BoolAttr:$normalize,
                       F32Attr:$routed_scale, Out<Step_Buffer>:$output,
                       Out<Step_Buffer>:$ids, Out<Step_Buffer>:$weights);
  let assemblyFormat = [{
    `ins` `(` $input `,` $norm `,` $gate (`,` $bias^)? `:` type($input) `,`
    qualified(type($norm)) `,` qualified(type($gate))
    (`,` qualified(type($bias))^)? `)` `outs` `(` $output `,` $ids `,`
    $weights `:` type($output) `,` type($ids) `,` type($weights) `)`
    attr-dict
  }];
  let hasVerifier = 1;
}

def Step_RouterPartialOp : Step_ComputeOp<"router_partial", 1> {
  let summary = "one rank's share of the router's logits, before the sum";
  let description = [{
    `output[e] = sum_h gate[e][h] * norm[h] * (partial[h] + residual_scale
    * residual[h])` over the `n` values of `partial` and `residual` (f32),
    `gate` an F32 `[n, E]` weight (dims in ggml order, as `step.moe_router`'s
    gate) and `norm` the next norm's weight. With `residual_scale = 1/tp`
    the ranks' outputs sum to `gate . (norm * (residual + sum_r
    partial_r))`: the router's logits before the division by the norm's
    rms, which a `step.all_reduce_add_rms_norm` with `tail = E` reduces and
    divides (`kiln-fold-router`). Its output is that all-reduce's partial's
    last `E` values.

    Example:
    ```mlir
    step.router_partial ins(%p0, %x, %gate, %ffn_norm : memref<256xf32>, memref<256xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [256, 16]>, !kiln.qweight<"blk.1.ffn_norm.weight", "f32", [256]>) outs(%p1 : memref<16xf32>) {residual_scale = 5.000000e-01 : f32}
    ```
  }];
  let arguments = (ins In<Step_Buffer>:$partial, In<Step_Buffer>:$residual,
                       In<Kiln_QWeightType, "gate">:$gate,
                       In<Step_Param>:$norm, F32Attr:$residual_scale,
                       Out<Step_Buffer>:$output);
  let assemblyFormat = [{
    `ins` `(` $partial `,` $residual `,` $gate `,` $norm `:` type($partial)
    `,` type($residual) `,` qualified(type($gate)) `,`
    qualified(type($norm)) `)` `outs` `(` $output `:` type($output) `)`
    attr-dict
  }];
  let hasVerifier = 1;
}

def Step_LinearRouterOp : Step_ComputeOp<"linear_router", 1> {
  let summary = "a row-parallel mat-vec and its rank's share of the router";
  let description = [{
    `output[0, N) = weight . input`, exactly as `step.linear` writes it (a
    vector `input` of `K` values, a 2-D `weight` `[K, N]`, dims in ggml
    order), and `output[N + e]` for `e < E` this rank's share of the
    router's logits before the division by the next norm's rms:

    `sum_k M_r[e][k] * input[k] + sum_{j < N/R} C_r[e][j] * residual[r N/R
    + j]`

    with `M_r = gate . diag(norm) . weight` (`E x K`), `C_r[e][j] =
    gate[e][r N/R + j] * norm[r N/R + j]`, `R = ranks` and `r` the
    executing rank (the op knows it, as `step.distributed_argmax` does).
    `gate` is the router's F32 `[N, E]` weight and `norm` the next norm's
    F32 weight; both are read when the step is loaded, where a backend
    makes `M_r` and `C_r` once. With `weight` the rank's row-parallel part
    (`shard = 0 of R`) and `input` the rank's input, the ranks' shares sum
    to `gate . (norm * (residual + sum_r weight_r . input_r))`, the
    router's logits times the rms of that sum, which a
    `step.all_reduce_add_rms_norm` with `tail = E` reduces and divides:
    `output` is that all-reduce's whole partial. Produced by
    `kiln-fold-router{compose=true}` from the linear that wrote the
    partial (`kiln-compile --fold-router=composed`).

    Example:
    ```mlir
    step.linear_router ins(%o, %attn_output, %x, %gate, %ffn_norm : memref<128xf32>, !kiln.qweight<"blk.1.attn_output.weight", "q8_0", [128, 256], shard = 0 of 2>, memref<256xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [256, 16]>, !kiln.qweight<"blk.1.ffn_norm.weight", "f32", [256]>) outs(%p : memref<272xf32>) {ranks = 2 : i64}
    ```
  }];
  let arguments = (ins In<Step_Buffer>:$input,
                       In<Kiln_QWeightType, "weight">:$weight,
                       In<Step_Buffer>:$residual,
                       In<Kiln_QWeightType, "gate">:$gate,
                       In<Step_Param>:$norm, I64Attr:$ranks,
                       Out<Step_Buffer>:$output);
  let assemblyFormat = [{
    `ins` `(` $input `,` $weight `,` $residual `,` $gate `,` $norm `:`
    type($input) `,` qualified(type($weight)) `,` type($residual) `,`
    qualified(type($gate)) `,` qualified(type($norm)) `)` `outs` `(` $output
    `:` type($output) `)` attr-dict
  }];
  let hasVerifier = 1;
}

def Step_MoEChooseOp : Step_ComputeOp<"moe_choose", 2> {
  let summary = "the router's choice from its logits: top-k and weights";
  let description = [{
    What `step.moe_router` does after its logits, on logits given: `p =
    sigmoid(logits)` or `softmax(logits)` (`gating`), the `top_k` experts
    by `p + bias` (the bias, when there is one, only steers the choice;
    ties to the lower id), and their weights `p`, divided by their sum
    when `normalize`, times `routed_scale`. Produced by `kiln-fold-router`
    in place of a router whose logits a `step.all_reduce_add_rms_norm`
    with a tail computes.

    Example:
    ```mlir
    step.moe_choose ins(%logits, %bias : memref<16xf32>, !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [16]>) outs(%ids, %w : memref<4xi32>, memref<4xf32>) {gating = "sigmoid", normalize = true, routed_scale = 2.5 : f32, top_k = 4 : i64}
    ```
  }];
  let arguments = (ins In<Step_Buffer>:$logits,
                       In<Optional<Step_Param>>:$bias, I64Attr:$top_k,
                       StrAttr:$gating, BoolAttr:$normalize,
                       F32Attr:$routed_scale, Out<Step_Buffer>:$ids,
                       Out<Step_Buffer>:$weights);
  let assemblyFormat = [{
    `ins` `(` $logits (`,` $bias^)? `:` type($logits)
    (`,` qualified(type($bias))^)? `)` `outs` `(` $ids `,` $weights `:`
    type($ids) `,` type($weights) `)` attr-dict
  }];
  let hasVerifier = 1;
}

def Step_MoEExpertsOp : Step_ComputeOp<"moe_experts", 1,
    [AttrSizedOperandSegments]> {
  let summary = "weighted sum of the chosen experts' SwiGLU FFNs";
  let description = [{
    As `kiln.moe_experts`: reads only the chosen experts' blocks of
    `experts` (gate, up, down, or a fused gate_up and down). With `addend`,
    the output is the experts' sum plus `addend`, as a `step.add` of the
    two would write it (`kiln-fuse-expert-add`, from
    the add of the shared expert's output that follows the experts in
    GLM-5's MoE layers). With `shared` (gate and up `[hidden, F_s]`, down
    `[F_s, hidden]`, 2-D, any type) the op computes that shared expert too:
    the output is the experts' sum plus `down_s(silu(gate_s . x) *
    (up_s . x))`, added last, exactly as the addend would be
    (`kiln-fuse-shared-expert`, from the `step.fused_linear` and
    `step.swiglu_linear` that computed the addend), so a backend may run it
    as one more expert of weight 1. `shared` and `addend` exclude each
    other. The operands are stored in the order input, ids, weights, addend
    (when there is one), the expert weights, the shared expert's weights
    (when there are some), output.

    Example:
    ```mlir
    step.moe_experts ins(%f, %ids, %w, %gate, %up, %down : memref<256xf32>, memref<4xi32>, memref<4xf32>, !kiln.qweight<...>, !kiln.qweight<...>, !kiln.qweight<...>) outs(%y : memref<256xf32>)
    step.moe_experts ins(%f, %ids, %w, %gate, %up, %down : memref<256xf32>, memref<4xi32>, memref<4xf32>, !kiln.qweight<...>, !kiln.qweight<...>, !kiln.qweight<...>) addend(%shared : memref<256xf32>) outs(%y : memref<256xf32>)
    step.moe_experts ins(%f, %ids, %w, %gate, %up, %down : memref<256xf32>, memref<4xi32>, memref<4xf32>, !kiln.qweight<...>, !kiln.qweight<...>, !kiln.qweight<...>) shared(%gate_s, %up_s, %down_s : !kiln.qweight<"blk.1.ffn_gate_shexp.weight", "q5_k", [256, 128]>, !kiln.qweight<"blk.1.ffn_up_shexp.weight", "q5_k", [256, 128]>, !kiln.qweight<"blk.1.ffn_down_shexp.weight", "q8_0", [128, 256]>) outs(%y : memref<256xf32>)
    ```
  }];
  let arguments = (ins In<Step_Buffer>:$input, In<Step_Buffer>:$ids,
                       In<Step_Buffer>:$weights,
                       In<Optional<Step_Buffer>>:$addend,
                       In<Variadic<Kiln_QWeightType>, "experts">:$experts,
                       In<Variadic<Kiln_QWeightType>, "shared">:$shared,
                       Out<Step_Buffer>:$output);
  let assemblyFormat = [{
    `ins` `(` $input `,` $ids `,` $weights `,` $experts `:` type($input) `,`
    type($ids) `,` type($weights) `,` qualified(type($experts)) `)`
    (`addend` `(` $addend^ `:` type($addend) `)`)?
    (`shared` `(` $shared^ `:` qualified(type($shared)) `)`)?
    `outs` `(` $output `:` type($output) `)` attr-dict
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Collectives and decisions
//===----------------------------------------------------------------------===//

def Step_AllReduceOp : Step_ComputeOp<"all_reduce", 1> {
  let summary = "sum (or max) over the tensor-parallel ranks";
  let description = [{
    As `kiln.all_reduce`; may be in place.

    Example:
    ```mlir
    step.all_reduce ins(%p : memref<256xf32>) outs(%p : memref<256xf32>) {reduction = "sum"}
    ```
  }];
  let arguments = (ins In<Step_Buffer>:$input, StrAttr:$reduction,
                       Out<Step_Buffer>:$output);
  let assemblyFormat = [{
    `ins` `(` $input `:` type($input) `)` `outs` `(` $output `:`
    type($output) `)` attr-dict
  }];
  let hasVerifier = 1;
}

def Step_AllGatherOp : Step_ComputeOp<"all_gather", 1> {
  let summary = "every rank's part, concatenated in rank order";
  let description = [{
    As `kiln.all_gather`.

    Example:
    ```mlir
    step.all_gather ins(%part : memref<512xf32>) outs(%logits : memref<1024xf32>) {dim = 0 : i64, ranks = 2 : i64}
    ```
  }];
  let arguments = (ins In<Step_Buffer>:$input, I64Attr:$dim, I64Attr:$ranks,
                       Out<Step_Buffer>:$output);
  let assemblyFormat = [{
    `ins` `(` $input `:` type($input) `)` `outs` `(` $output `:`
    type($output) `)` attr-dict
  }];
  let hasVerifier = 1;
}

def Step_DistributedArgmaxOp : Step_ComputeOp<"distributed_argmax", 1,
    [AttrSizedOperandSegments]> {
  let summary = "argmax over every rank's part of a vector, or a draw";
  let description = [{
    As `kiln.distributed_argmax`; with `sampling` and `position` (the step's
    input slots), a draw.

    Example:
    ```mlir
    step.distributed_argmax ins(%part : memref<512xf32>) outs(%next : memref<i32>) {ranks = 2 : i64}
    step.distributed_argmax ins(%part : memref<512xf32>) sampled(%sampling, %pos : memref<4xi32>, memref<i32>) outs(%next : memref<i32>) {ranks = 2 : i64}
    ```
  }];
  let arguments = (ins In<Step_Buffer>:$input,
                       In<Optional<Step_Buffer>>:$sampling,
                       In<Optional<Step_I32Scalar>>:$position, I64Attr:$ranks,
                       Out<Step_I32Scalar>:$output);
  let assemblyFormat = [{
    `ins` `(` $input `:` type($input) `)`
    (`sampled` `(` $sampling^ `,` $position `:` type($sampling) `,`
     type($position) `)`)?
    `outs` `(` $output `:` type($output) `)` attr-dict
  }];
  let hasVerifier = 1;
}

def Step_ArgmaxOp : Step_ComputeOp<"argmax", 1, [AttrSizedOperandSegments]> {
  let summary = "index of the largest element, ties to the lowest, or a draw";
  let description = [{
    As `kiln.argmax`; with `sampling` and `position` (the step's input
    slots), a draw.

    Example:
    ```mlir
    step.argmax ins(%logits : memref<1024xf32>) outs(%next : memref<i32>)
    step.argmax ins(%logits : memref<1024xf32>) sampled(%sampling, %pos : memref<4xi32>, memref<i32>) outs(%next : memref<i32>)
    ```
  }];
  let arguments = (ins In<Step_Buffer>:$input,
                       In<Optional<Step_Buffer>>:$sampling,
                       In<Optional<Step_I32Scalar>>:$position,
                       Out<Step_I32Scalar>:$output);
  let assemblyFormat = [{
    `ins` `(` $input `:` type($input) `)`
    (`sampled` `(` $sampling^ `,` $position `:` type($sampling) `,`
     type($position) `)`)?
    `outs` `(` $output `:` type($output) `)` attr-dict
  }];
  let hasVerifier = 1;
}

#endif // STEP_OPS_TD
