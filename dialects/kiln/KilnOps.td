//===- KilnOps.td - Operations of the kiln dialect ---------*- tablegen -*-===//
#ifndef KILN_OPS_TD
#define KILN_OPS_TD

include "KilnAttrs.td"
include "KilnDialect.td"
include "KilnTypes.td"
include "mlir/IR/OpAsmInterface.td"
include "mlir/Interfaces/ControlFlowInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

// Token ids and positions: 0-d i32 tensors (buildable, so assembly formats
// need not spell them).
def Kiln_I32Scalar : 0DTensorOf<[I32]>,
    BuildableType<"::mlir::RankedTensorType::get({}, $_builder.getI32Type())">;
def Kiln_I32Vector : 1DTensorOf<[I32]>;
/// A draw's sampling words (utils/support/DrawKey.h): tensor<8xi32>,
/// tensor<4xi32> (the first form: a temperature, no nucleus), or the
/// adjusting form's tensor<(16 + 3 n)xi32>; printed, as the forms differ.
def Kiln_DrawWords : 1DTensorOf<[I32]>;
def Kiln_FloatVector : 1DTensorOf<[F32, F16, BF16]>;
/// A per-channel parameter (norm weight, bias): a float vector, or a
/// one-dimensional weight that the op reads (dequantising it) itself, so no
/// dequantised copy is ever materialised (--kiln-fold-dequant).
def Kiln_VectorParam : AnyTypeOf<[Kiln_FloatVector, Kiln_QWeightType],
    "float vector or one-dimensional weight">;

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
  let arguments = (ins Kiln_FloatTensor:$input, Kiln_VectorParam:$weight,
                       F32Attr:$epsilon);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $weight attr-dict `:` type($input) `,` qualified(type($weight))
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Decisions
//===----------------------------------------------------------------------===//

def Kiln_ArgmaxOp : Kiln_Op<"argmax",
    [Pure, AttrSizedOperandSegments,
     DeclareOpInterfaceMethods<InferTypeOpInterface>]> {
  let summary = "index of the largest element (greedy decoding), or a draw";
  let description = [{
    The index of the largest element of a one-dimensional, non-empty tensor
    as a 0-d `i32` tensor; ties go to the lowest index, so every
    implementation (and every tensor-parallel rank) picks the same token.

    With `sampled %sampling : type at %position`, the index of the largest key
    `input[v] * (1 / T) + G(seed, position, v)` instead, G a Gumbel variable
    from a hash of the seed, the position and v: a draw from
    `softmax(input / T)` (utils/support/DrawKey.h defines every operation,
    so every backend draws the same token). `%sampling` is i32 words in one
    of DrawKey.h's forms: four (the temperature T's float bits, 0 for the
    plain argmax, the seed's low and high 32 bits, and 0); eight (with
    top-p, top-k and min-p cut before the draw); or 16 + 3 n, the adjusting
    form, whose n entries adjust the logits first (logit_bias and the
    penalties over the recent tokens). Words outside their rules are an
    error when the step runs.

    Example:
    ```mlir
    %token = kiln.argmax %logits : tensor<154880xf32>
    %drawn = kiln.argmax %logits sampled %sampling : tensor<8xi32> at %pos : tensor<154880xf32>
    ```
  }];
  let arguments = (ins Kiln_FloatTensor:$input,
                       Optional<Kiln_DrawWords>:$sampling,
                       Optional<Kiln_I32Scalar>:$position);
  let results = (outs 0DTensorOf<[I32]>:$result);
  let assemblyFormat = [{
    $input (`sampled` $sampling^ `:` type($sampling) `at` $position)?
    attr-dict `:` type($input)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Weights and state
//===----------------------------------------------------------------------===//

def Kiln_WeightOp : Kiln_Op<"weight",
    [Pure, DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmResultNames"]>]> {
  let summary = "a handle to one weight tensor of the model file";
  let description = [{
    Names a GGUF tensor (its name, format and dims are the result's type).
    The handle is bound to the file's bytes when the program is loaded; the
    printer names the result after the tensor.

    `tp_split`, set by the model's builder, is the dim along which tensor
    parallelism splits the tensor (absent: every rank holds all of it), and
    `tp_groups` how many groups that dim holds that are cut alike (a fused
    gate/up: 2; default 1). `--kiln-partition` reads them, records the
    split in the result's type (`shard = i of n`, `groups = g`) and drops
    them; it knows no tensor names itself.

    Example:
    ```mlir
    %blk.0.attn_q_a = kiln.weight : !kiln.qweight<"blk.0.attn_q_a.weight", "q8_0", [6144, 2048]>
    %blk.0.attn_output = kiln.weight {tp_split = 0 : i64} : !kiln.qweight<"blk.0.attn_output.weight", "q8_0", [16384, 6144]>
    ```
  }];
  let arguments = (ins OptionalAttr<I64Attr>:$tp_split,
                       OptionalAttr<I64Attr>:$tp_groups);
  let results = (outs Kiln_QWeightType:$result);
  let assemblyFormat = "attr-dict `:` qualified(type($result))";
  let hasVerifier = 1;
}

def Kiln_StateOp : Kiln_Op<"state",
    [Pure, DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmResultNames"]>]> {
  let summary = "a handle to one piece of the model's persistent state";
  let description = [{
    Names a cache that lives across decode steps. The handle itself reads
    and writes nothing; the ops that take it declare their effects on it
    (`kiln.cache_append` writes, `kiln.mla_attention` and `kiln.dsa_indexer`
    read). Two handles with the same name are the same state.

    Example:
    ```mlir
    %blk.0.kv_cache = kiln.state "blk.0.kv_cache" : !kiln.latent_cache<4096, 64, 16, f16>
    ```
  }];
  let arguments = (ins StrAttr:$state_name);
  let results = (outs Kiln_AnyCache:$result);
  let assemblyFormat = "$state_name attr-dict `:` qualified(type($result))";
  let hasVerifier = 1;
}

def Kiln_DequantOp : Kiln_Op<"dequant", [Pure]> {
  let summary = "a whole weight dequantised to a float tensor";
  let description = [{
    The weight's values, dims reversed (row-major, `ne[0]` last), in the
    result's float type. Used for small tensors (norm weights, biases);
    matrices are consumed by `kiln.linear`, which dequantises inside the
    mat-vec and never materialises the weight.

    Example:
    ```mlir
    %w = kiln.dequant %blk.0.attn_norm : !kiln.qweight<"blk.0.attn_norm.weight", "f32", [6144]> -> tensor<6144xf32>
    ```
  }];
  let arguments = (ins Kiln_QWeightType:$weight);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = [{
    $weight attr-dict `:` qualified(type($weight)) `->` type($result)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Projections
//===----------------------------------------------------------------------===//

def Kiln_EmbedOp : Kiln_Op<"embed", [Pure]> {
  let summary = "one row of the embedding table";
  let description = [{
    Row `token` of a `[hidden, vocab]` table, dequantised: a
    `tensor<hidden x f32>`. A token outside the vocabulary is an error at run
    time, never a read out of bounds.

    Example:
    ```mlir
    %x = kiln.embed %token_embd[%token] : !kiln.qweight<"token_embd.weight", "q4_k", [6144, 154880]> -> tensor<6144xf32>
    ```
  }];
  let arguments = (ins Kiln_QWeightType:$table, Kiln_I32Scalar:$token);
  let results = (outs Kiln_FloatVector:$result);
  let assemblyFormat = [{
    $table `[` $token `]` attr-dict `:` qualified(type($table)) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Kiln_LinearOp : Kiln_Op<"linear", [Pure]> {
  let summary = "mat-vec with a quantised weight (dequantised in the product)";
  let description = [{
    With a weight of dims `[K, N]` (GGUF order): `y[..., n] = sum_k x[..., k]
    * W[n][k]`, the input's innermost dimension K, the result's N.
    With a stacked weight `[K, N, B]` (one matrix per head or expert), the
    input is `[B, K]` and each row uses its own matrix: the result is
    `[B, N]` (GLM-5's `attn_k_b` and `attn_v_b`). Dequantisation happens
    inside the product; accumulation is in f32.

    Example:
    ```mlir
    %q_a = kiln.linear %a, %blk.0.attn_q_a : tensor<6144xf32>, !kiln.qweight<"blk.0.attn_q_a.weight", "q8_0", [6144, 2048]> -> tensor<2048xf32>
    ```
  }];
  let arguments = (ins Kiln_FloatTensor:$input, Kiln_QWeightType:$weight);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $weight attr-dict `:` type($input) `,` qualified(type($weight))
    `->` type($result)
  }];
  let hasVerifier = 1;
}

def Kiln_FusedLinearOp : Kiln_Op<"fused_linear", [Pure]> {
  let summary = "several projections of one input, as one mat-vec";
  let description = [{
    `y[s.offset + n] = sum_k x[k] * W_s[n][k]` for every segment `s` of
    `segments` and its weight (the i-th segment belongs to the i-th weight):
    the projections that share an input, concatenated in the order of the
    segment map. Each segment keeps its own format (a Q8_0 q_a next to an
    F16 indexer key). Consumers take their part with a slice at the
    segment's offset; nothing depends on where the tensors sit in a file.
    The input is one vector; weights are `[K, N_s]` with the input's K.

    Example:
    ```mlir
    %qkv = kiln.fused_linear %a weights(%q_a, %kv_a) {segments = [
        #kiln.segment<name = "blk.0.attn_q_a", offset = 0, rows = 2048, format = "q8_0">,
        #kiln.segment<name = "blk.0.attn_kv_a_mqa", offset = 2048, rows = 576, format = "q8_0">]}
        : tensor<6144xf32>, !kiln.qweight<...>, !kiln.qweight<...> -> tensor<2624xf32>
    ```
  }];
  let arguments = (ins Kiln_FloatVector:$input,
                       Variadic<Kiln_QWeightType>:$weights,
                       TypedArrayAttrBase<Kiln_SegmentAttr,
                                          "segment map">:$segments);
  let results = (outs Kiln_FloatVector:$result);
  let assemblyFormat = [{
    $input `weights` `(` $weights `)` attr-dict `:` type($input) `,`
    qualified(type($weights)) `->` type($result)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Normalisation and position
//===----------------------------------------------------------------------===//

def Kiln_LayerNormOp : Kiln_Op<"layer_norm",
    [Pure, AllTypesMatch<["input", "result"]>]> {
  let summary = "layer normalisation over the innermost dimension";
  let description = [{
    `(x - mean(x)) / sqrt(var(x) + epsilon) * weight + bias` along the
    innermost dimension, in f32. GLM-5's indexer normalises its key with
    epsilon 1e-6.

    Example:
    ```mlir
    %k = kiln.layer_norm %k_raw, %w, %b {epsilon = 1.0e-06 : f32} : tensor<128xf32>, tensor<128xf32>, tensor<128xf32>
    ```
  }];
  let arguments = (ins Kiln_FloatTensor:$input, Kiln_VectorParam:$weight,
                       Kiln_VectorParam:$bias, F32Attr:$epsilon);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $weight `,` $bias attr-dict `:` type($input) `,`
    qualified(type($weight)) `,` qualified(type($bias))
  }];
  let hasVerifier = 1;
}

def Kiln_RopeOp : Kiln_Op<"rope", [Pure, AllTypesMatch<["input", "result"]>]> {
  let summary = "rotary position embedding of a slice of the innermost dim";
  let description = [{
    Rotates values `offset` to `offset + dims` of the innermost dimension by
    position `position`; other values pass through. Pair `i` (of `dims / 2`)
    turns by `position * theta^(-2i / dims)`. `style` says which values pair:
    `interleaved` pairs (2i, 2i+1) (GLM-5, everywhere), `neox` pairs
    (i, i + dims/2). Style and theta are explicit at each use, so no pass or
    backend can apply a default that differs.

    Example (the rope part of each MLA query head):
    ```mlir
    %q = kiln.rope %q_heads[%pos] {style = "interleaved", theta = 1.0e+06 : f32, offset = 192 : i64, dims = 64 : i64} : tensor<64x256xf32>
    ```
  }];
  let arguments = (ins Kiln_FloatTensor:$input, Kiln_I32Scalar:$position,
                       StrAttr:$style, F32Attr:$theta, I64Attr:$offset,
                       I64Attr:$dims);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = "$input `[` $position `]` attr-dict `:` type($input)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Attention and its state
//===----------------------------------------------------------------------===//

def Kiln_CacheAppendOp : Kiln_Op<"cache_append"> {
  let summary = "write this token's entry into a cache at its position";
  let description = [{
    Stores `entry` (converted to the cache's element type) as position
    `position` of `cache`. The only op that writes state; it declares a
    write effect on the cache, so no analysis may move a read of the cache
    across it. A position at or past the cache's context is an error at run
    time.

    Example:
    ```mlir
    kiln.cache_append %blk.0.kv_cache[%pos], %entry : !kiln.latent_cache<4096, 64, 16, f16>, tensor<80xf32>
    ```
  }];
  let arguments = (ins Arg<Kiln_AnyCache, "the cache", [MemWrite]>:$cache,
                       Kiln_I32Scalar:$position, Kiln_FloatVector:$entry);
  let assemblyFormat = [{
    $cache `[` $position `]` `,` $entry attr-dict `:` qualified(type($cache))
    `,` type($entry)
  }];
  let hasVerifier = 1;
}

def Kiln_MLAAttentionOp : Kiln_Op<"mla_attention", [AttrSizedOperandSegments]> {
  let summary = "absorbed MLA decode attention over the latent cache";
  let description = [{
    For each head h, over the cached positions t (all of 0..position, or the
    first `selected_count` entries of `selected` when DSA selection is
    given):
    `s[h,t] = (q_latent[h] . latent[t] + q_rope[h] . rope[t]) * scale`,
    `p = softmax_t(s)`, `result[h] = sum_t p[h,t] * latent[t]`.
    `q_latent` is the query already absorbed through `attn_k_b`; the result
    is the latent output that `attn_v_b` expands. The cache is read once for
    all heads; the op declares a read effect on it.

    Example:
    ```mlir
    %o = kiln.mla_attention %q_lat, %q_pe, %kv[%pos] select(%sel, %n) {scale = 6.250000e-02 : f32}
        : tensor<64x512xf32>, tensor<64x64xf32>, !kiln.latent_cache<202752, 512, 64, f16>, tensor<2048xi32> -> tensor<64x512xf32>
    ```
  }];
  let arguments = (ins Kiln_FloatTensor:$q_latent, Kiln_FloatTensor:$q_rope,
                       Arg<Kiln_LatentCacheType, "the latent cache",
                           [MemRead]>:$cache,
                       Kiln_I32Scalar:$position,
                       Optional<Kiln_I32Vector>:$selected,
                       Optional<Kiln_I32Scalar>:$selected_count,
                       F32Attr:$scale);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = [{
    $q_latent `,` $q_rope `,` $cache `[` $position `]`
    (`select` `(` $selected^ `,` $selected_count `)`)? attr-dict `:`
    type($q_latent) `,` type($q_rope) `,` qualified(type($cache))
    (`,` type($selected)^)? `->` type($result)
  }];
  let hasVerifier = 1;
}

def Kiln_DSAIndexerOp : Kiln_Op<"dsa_indexer"> {
  let summary = "DSA indexer: score cached tokens, select the top k";
  let description = [{
    For each cached position t in 0..position:
    `score[t] = scale * sum_h head_weights[h] * relu(query[h] . key[t])`,
    then the `top_k` highest scores (ties to the lower position). Results:
    the selected positions in ascending order, and how many are valid
    (`min(top_k, position + 1)`); entries past the count are 0, a valid
    position, so no consumer can read out of bounds. Every
    implementation must select identically (tensor-parallel ranks replicate
    this op). Declares a read effect on the key cache.

    Example:
    ```mlir
    %sel, %n = kiln.dsa_indexer %qI, %w, %blk.0.index_cache[%pos] {top_k = 2048 : i64, scale = 1.562500e-02 : f32}
        : tensor<32x128xf32>, tensor<32xf32>, !kiln.index_cache<202752, 128, f16> -> tensor<2048xi32>
    ```
  }];
  let arguments = (ins Kiln_FloatTensor:$query, Kiln_FloatVector:$head_weights,
                       Arg<Kiln_IndexCacheType, "the indexer key cache",
                           [MemRead]>:$cache,
                       Kiln_I32Scalar:$position, I64Attr:$top_k,
                       F32Attr:$scale);
  let results = (outs Kiln_I32Vector:$selected, Kiln_I32Scalar:$count);
  let assemblyFormat = [{
    $query `,` $head_weights `,` $cache `[` $position `]` attr-dict `:`
    type($query) `,` type($head_weights) `,` qualified(type($cache)) `->`
    type($selected)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Mixture of experts
//===----------------------------------------------------------------------===//

def Kiln_MoERouterOp : Kiln_Op<"moe_router", [Pure]> {
  let summary = "router: gate scores, bias-corrected top-k, renormalised weights";
  let description = [{
    `p = gating(input . W_gate)` over the experts (`sigmoid` for GLM-5, or
    `softmax`), in f32. The `bias`, when given, is added to `p` only to
    choose the `top_k` experts (ties to the lower id); the weights are the
    chosen `p`, divided by `max(sum, 6.1035e-5)` when `normalize` is set, then
    multiplied by `routed_scale`. Results: expert ids (always valid ids) and
    their weights.

    Example:
    ```mlir
    %ids, %w = kiln.moe_router %f, %gate_inp, %bias {top_k = 8 : i64, gating = "sigmoid", normalize = true, routed_scale = 2.500000e+00 : f32}
        : tensor<6144xf32>, !kiln.qweight<"blk.3.ffn_gate_inp.weight", "f32", [6144, 256]>, tensor<256xf32> -> tensor<8xi32>, tensor<8xf32>
    ```
  }];
  let arguments = (ins Kiln_FloatVector:$input, Kiln_QWeightType:$gate,
                       Optional<Kiln_VectorParam>:$bias, I64Attr:$top_k,
                       StrAttr:$gating, BoolAttr:$normalize,
                       F32Attr:$routed_scale);
  let results = (outs Kiln_I32Vector:$ids, Kiln_FloatVector:$weights);
  let assemblyFormat = [{
    $input `,` $gate (`,` $bias^)? attr-dict `:` type($input) `,`
    qualified(type($gate)) (`,` qualified(type($bias))^)? `->` type($ids) `,`
    type($weights)
  }];
  let hasVerifier = 1;
}

def Kiln_MoEExpertsOp : Kiln_Op<"moe_experts", [Pure]> {
  let summary = "weighted sum of the chosen experts' SwiGLU FFNs";
  let description = [{
    `sum_k weights[k] * down_e(silu(gate_e . x) * (up_e . x))` with
    `e = ids[k]`, reading only the chosen experts' weights. `experts` is
    either (gate, up, down) with dims `[H, F, E]`, `[H, F, E]`, `[F, H, E]`,
    or (gate_up, down) with a fused `[H, 2F, E]` whose first F rows of each
    expert are the gate and the next F the up projection (the layout is
    fixed here, not taken from the file's order).

    Example:
    ```mlir
    %y = kiln.moe_experts %f, %ids, %w experts(%gate, %up, %down)
        : tensor<6144xf32>, tensor<8xi32>, tensor<8xf32>, !kiln.qweight<...>, !kiln.qweight<...>, !kiln.qweight<...> -> tensor<6144xf32>
    ```
  }];
  let arguments = (ins Kiln_FloatVector:$input, Kiln_I32Vector:$ids,
                       Kiln_FloatVector:$weights,
                       Variadic<Kiln_QWeightType>:$experts);
  let results = (outs Kiln_FloatVector:$result);
  let assemblyFormat = [{
    $input `,` $ids `,` $weights `experts` `(` $experts `)` attr-dict `:`
    type($input) `,` type($ids) `,` type($weights) `,`
    qualified(type($experts)) `->` type($result)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Collectives
//===----------------------------------------------------------------------===//

def Kiln_AllReduceOp : Kiln_Op<"all_reduce",
    [AllTypesMatch<["input", "result"]>]> {
  let summary = "sum (or max) of a tensor over the tensor-parallel ranks";
  let description = [{
    Every rank contributes `input` and receives the element-wise `reduction`
    (`sum` or `max`) over all ranks, in a fixed rank order so every rank
    gets bit-identical results. Not pure: it communicates, and must not be
    removed, duplicated or reordered against another collective.

    Example:
    ```mlir
    %y = kiln.all_reduce %partial {reduction = "sum"} : tensor<6144xf32>
    ```
  }];
  let arguments = (ins Kiln_FloatTensor:$input, StrAttr:$reduction);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input)";
  let hasVerifier = 1;
}

def Kiln_DistributedArgmaxOp : Kiln_Op<"distributed_argmax",
    [AttrSizedOperandSegments]> {
  let summary = "argmax over every rank's part of a vector, without gathering it";
  let description = [{
    Each of `ranks` ranks holds a part of a vector split in rank order
    (the vocabulary-split logits); every rank receives the index, in the
    whole vector, of its largest element, ties to the lowest index. Only
    each rank's best value and index travel, not the parts. Not pure: it
    communicates. With `sampled %sampling : type at %position`, the largest key,
    as `kiln.argmax` (each key is made from its index in the whole vector).

    Example:
    ```mlir
    %next = kiln.distributed_argmax %part {ranks = 8 : i64} : tensor<19360xf32>
    ```
  }];
  let arguments = (ins Kiln_FloatVector:$input,
                       Optional<Kiln_DrawWords>:$sampling,
                       Optional<Kiln_I32Scalar>:$position, I64Attr:$ranks);
  let results = (outs Kiln_I32Scalar:$result);
  let assemblyFormat = [{
    $input (`sampled` $sampling^ `:` type($sampling) `at` $position)?
    attr-dict `:` type($input)
  }];
  let hasVerifier = 1;
}

def Kiln_AllGatherOp : Kiln_Op<"all_gather"> {
  let summary = "every rank's part of a tensor, concatenated in rank order";
  let description = [{
    Each of `ranks` ranks contributes `input`, its part of a tensor split
    along `dim`; every rank receives the whole tensor, the parts in rank
    order. The partitioner inserts it where a split value (the
    vocabulary-split logits) must be whole. Not pure: it communicates.

    Example:
    ```mlir
    %logits = kiln.all_gather %part {dim = 0 : i64, ranks = 8 : i64} : tensor<19360xf32> -> tensor<154880xf32>
    ```
  }];
  let arguments = (ins Kiln_FloatTensor:$input, I64Attr:$dim, I64Attr:$ranks);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Structure
//===----------------------------------------------------------------------===//

def Kiln_LayerOp : Kiln_Op<"layer", [
    SingleBlock, AllTypesMatch<["input", "result"]>,
    DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmBlockArgumentNames"]>]> {
  let summary = "one decoder layer, as a region over the residual stream";
  let description = [{
    Groups the ops of decoder layer `index` so the printed program reads one
    layer at a time. The region's argument is the residual stream entering
    the layer; `kiln.yield` gives the stream leaving it. `kind` is `dense`,
    `moe` or `mtp`. Values from outside (token, position) may be used inside.

    Example:
    ```mlir
    %x1 = kiln.layer 0 "dense" (%x0) : tensor<6144xf32> {
    ^bb0(%x: tensor<6144xf32>):
      ...
      kiln.yield %out : tensor<6144xf32>
    }
    ```
  }];
  let arguments = (ins I64Attr:$index, StrAttr:$kind, Kiln_FloatVector:$input);
  let results = (outs Kiln_FloatVector:$result);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    $index $kind `(` $input `)` attr-dict `:` type($input) $body
  }];
  let hasVerifier = 1;
}

def Kiln_YieldOp : Kiln_Op<"yield",
    [Pure, ReturnLike, Terminator, HasParent<"LayerOp">]> {
  let summary = "the residual stream leaving a layer";
  let description = [{
    Terminates a `kiln.layer` region with the layer's output.

    Example:
    ```mlir
    kiln.yield %out : tensor<6144xf32>
    ```
  }];
  let arguments = (ins Kiln_FloatVector:$value);
  let assemblyFormat = "$value attr-dict `:` type($value)";
}

#endif // KILN_OPS_TD
