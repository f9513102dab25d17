//===- Passes.td - Kiln's compiler passes ------------------*- tablegen -*-===//
#ifndef KILN_COMPILER_PASSES_TD
#define KILN_COMPILER_PASSES_TD

include "mlir/Pass/PassBase.td"

def FuseProjections : Pass<"kiln-fuse-projections", "::mlir::func::FuncOp"> {
  let summary = "Fuse the projections that share an input into one mat-vec";
  let description = [{
    In each block, every `kiln.linear` of a one-dimensional input with a
    `[K, N]` weight is grouped with the others of the same input value; a
    group of two or more becomes one `kiln.fused_linear` at the place of its
    first member, whose segment map lists the members in program order (each
    keeping its own format). Each member's result becomes a contiguous
    `tensor.extract_slice` of the fused result, which the step lowering
    turns into a view: no copy, and a layout fixed by the program, never by
    a file. In GLM-5 that fuses q_a, kv_a_mqa and the indexer's key and
    head-weight projections (all of the attention norm's output), q_b with
    the indexer's query (of c_q), the dense FFN's gate and up, and the
    shared expert's gate and up. Stacked weights and batched inputs are left
    alone.
  }];
  let dependentDialects = ["::mlir::tensor::TensorDialect"];
}

def Partition : Pass<"kiln-partition", "::mlir::func::FuncOp"> {
  let summary = "Partition a kiln program for tensor parallelism over N ranks";
  let description = [{
    Rewrites a kiln function into what each of `tp` ranks runs (the same
    program on every rank; each binds its own part of the split weights):

    - split by heads: `attn_q_b` (output rows, head-major), `attn_k_b` and
      `attn_v_b` (their per-head stack), and hence the query heads and the
      attention itself;
    - split on the intermediate dimension: the dense FFN's and the shared
      expert's gate and up (rows) and down (`ne[0]`), every routed expert's
      gate and up (rows) and down (`ne[0]`);
    - split by vocabulary: `output` (rows), the logits gathered in rank
      order before the argmax and the return;
    - replicated: embedding, norms, `attn_q_a`, `attn_kv_a_mqa`, the latent
      cache, the whole DSA indexer and its cache, the router.

    A projection whose input is split on its reduction dimension (`o_proj`,
    the FFN and expert downs) leaves a partial sum; the pass inserts one
    `kiln.all_reduce` where a partial value must be whole (after the
    attention output and after the FFN, experts plus shared expert, of each
    layer: two per layer). A split that does not divide a dim evenly, or
    that would cut a quantisation block of `ne[0]`, is refused with the
    tensor, its format and the sizes named. `tp = 1` changes nothing.
  }];
  let options = [
    Option<"tp", "tp", "int64_t", /*default=*/"1",
           "Tensor-parallel ranks">
  ];
}

def ElideIndexers : Pass<"kiln-elide-indexers", "::mlir::ModuleOp"> {
  let summary = "Leave out DSA indexers that select every position";
  let description = [{
    A `kiln.dsa_indexer` whose key cache holds no more positions than its
    `top_k` selects positions 0 .. position in ascending order at every
    position the step can run at (the position is below the cache's size:
    an append past it fails at run time). Where MLA is the only reader of
    its selection, MLA attends 0 .. position without it (the same entries
    in the same order) and the indexer goes. A key cache that no indexer of
    the module reads then loses its appends, and the ops that fed only them
    go too: the indexer's query and head-weight projections, its key's
    projection, norm and rope, and their weights and states. GLM-5 compiled
    for 2,048 positions (its top-k) so runs no indexer and keeps no
    indexer cache. The first pass of the step pipeline (kiln-compile
    `--elide-indexers`, on by default).
  }];
}

def SplitProjections
    : Pass<"kiln-split-projections", "::mlir::func::FuncOp"> {
  let summary = "Cut a projection read only in slices of its heads into "
                "one projection per slice";
  let description = [{
    A `kiln.linear` of a one-dimensional input and a `[K, H * P]` weight
    whose result is only reshaped to `[H, P]` (heads of `P` rows) and read
    there only through slices `[0, A] [H, B - A]` that do not overlap
    becomes one `kiln.linear` per slice, whose weight handle holds rows `A`
    to `B` of every head (`rows = A to B of P` in its type: the rows are
    gathered at load, once). Each slice is then that projection's own
    output, and kiln-fuse-projections puts the parts back into one mat-vec
    whose segments are the slices one after another: what the slices
    copied out becomes views, and no row is read twice. In GLM-5 that is
    `attn_q_b` of every layer, whose 256 rows per head are 192 without
    position (read by `attn_k_b`) and 64 with it (read by the rope). Runs
    after kiln-partition (a cut is of the rank's rows) and before
    kiln-fuse-projections (kiln-compile `--split-projections`, on by
    default).
  }];
  let dependentDialects = ["::mlir::tensor::TensorDialect"];
}

def FoldDequant : Pass<"kiln-fold-dequant", "::mlir::func::FuncOp"> {
  let summary = "Let norms and the router read their weights themselves";
  let description = [{
    Replaces each use of a one-dimensional `kiln.dequant` by a norm's weight
    or bias, or the router's selection bias, with the weight handle itself,
    and removes dequants left without uses: the op then dequantises while it
    reads (a backend may also convert such small weights once at load), and
    no dequantised copy of a weight is materialised in a step. In GLM-5 that
    is every dequant (544 ops of the 78-layer step).
  }];
}

def LowerToStep : Pass<"kiln-lower-to-step", "::mlir::ModuleOp"> {
  let summary = "Lower kiln programs (tensors) to step programs (buffers)";
  let description = [{
    Rewrites every function written in the `kiln` dialect into a step
    function of the same name in destination-passing style, one step op per
    kiln op. Each tensor value becomes a buffer: an unplanned arena
    `step.buffer`, a contiguous `step.view` of another buffer (reshapes and
    contiguous slices), or, for returned values, the step's output slot.
    Function arguments become input slots and results output slots, named by
    their `kiln.slot` attributes; weights and caches become `step.weight`
    and `step.state`. Layers are flattened; buffer names keep the layer.
    Strided slices and concatenations become copies (`step.slice`,
    `step.concat`); fusion removes them later.
  }];
  let dependentDialects = ["::mlir::step::StepDialect",
                           "::mlir::memref::MemRefDialect"];
}

def FuseAddNorm : Pass<"kiln-fuse-add-norm", "::mlir::func::FuncOp"> {
  let summary = "Fuse a residual add with the RMS norm of its sum";
  let description = [{
    On a step function before planning: a `step.add` writing an arena
    buffer that the next compute op normalises with `step.rms_norm`
    becomes one `step.add_rms_norm` writing the sum and the normalised
    value, one pass over the stream instead of two. In GLM-5 that is both
    residual updates of every layer (the second feeds the next layer's
    attention norm, the last one the output norm). After partitioning, an
    all_reduce whose result only that fused op reads joins it too:
    `step.all_reduce_add_rms_norm`, the collective, the residual add and the
    next norm in one op (GLM-5: the collective after each layer's
    attention, whose norm feeds the router and the experts).

    With `projection-norms` (off by default: level to slower on the GPU, docs/perf.md), where the norm of such a sum
    feeds a projection of Q8_0 and F32 weights that `kiln-fuse-norm-linear`
    folds it into, the collective and the add become `step.all_reduce_add`
    instead and the norm is left to that pass: the projection normalises its
    input as it reads it, and the collective no longer sums squares across
    its blocks (GLM-5: the collective that ends each layer, whose norm feeds
    the next layer's q_a run, with the indexer's F32 head weights beside it
    where the indexers run). Only those types: the CUDA backend's mat-vecs
    of them normalise inside; for other types it runs the norm's own kernel
    first, a launch more on the path (the dense layers' Q5_K feed-forward
    and the Q6_K output head keep the collective's norm).

    With `router-norms` (off by default, as `projection-norms`), where that
    norm feeds a router of an F32 gate right after it, the collective takes
    the add alone too and the norm and the router become one
    `step.rms_norm_router`, which writes the normalised vector for the
    experts (GLM-5: the collective after each MoE layer's attention).
  }];
  let options = [
    Option<"projectionNorms", "projection-norms", "bool", /*default=*/"false",
           "Leave the norm after a collective's residual add to the "
           "projection that reads it (step.all_reduce_add), where "
           "kiln-fuse-norm-linear can fold it there">,
    Option<"routerNorms", "router-norms", "bool", /*default=*/"false",
           "Leave the norm after a collective's residual add to the F32 "
           "router that reads it (step.all_reduce_add, then "
           "step.rms_norm_router)">
  ];
}

def FuseNormLinear : Pass<"kiln-fuse-norm-linear", "::mlir::func::FuncOp"> {
  let summary = "Fold an RMS norm into the fused projection that reads it";
  let description = [{
    On a step function before planning: a `step.rms_norm` of a vector into
    an arena buffer that only the next compute op reads, a
    `step.fused_linear` or a `step.linear` with a `[K, N]` weight (one
    segment), as its input, becomes one `step.rms_norm_linear`; the
    normalised vector is never written out, and a backend may normalise
    inside the mat-vec (the CUDA backend does, for its split layouts). In
    GLM-5 that is the q_a norm feeding q_b and the indexer's query (q_b
    alone where kiln-elide-indexers left the indexer out), on the critical
    path of every layer. The latent-cache norm feeds a concat and
    stays.
  }];
}

def FuseSwigluLinear
    : Pass<"kiln-fuse-swiglu-linear", "::mlir::func::FuncOp"> {
  let summary = "Fold a swiglu into the mat-vec that reads it";
  let description = [{
    On a step function before planning: a `step.swiglu` of two vectors into
    an arena buffer that only the next compute op reads, a `step.linear`
    with a 2-D weight, as its input, becomes one `step.swiglu_linear`; the
    product is never written out, and a backend may form it inside the
    mat-vec (the CUDA backend does, for the q8_0-split layout). In GLM-5
    that is the shared expert's down projection, the longer of the two
    branches after every MoE layer's all-reduce.
  }];
}

def FuseMlaProjection
    : Pass<"kiln-fuse-mla-projection", "::mlir::func::FuncOp"> {
  let summary = "Fold MLA's output projection into the attention";
  let description = [{
    On a step function before planning: a `step.mla_attention` into an
    arena buffer that only the next compute op reads, a `step.linear` of a
    stacked weight `[latent, N, heads]`, as its input, becomes one
    `step.mla_attention` with that weight as its `projection`, writing the
    linear's output; the heads' latent outputs are never written out, and a
    backend may project each head inside the attention's launch (the CUDA
    backend does, for Q8_0 in the q8_0-split layout). In GLM-5 that is
    `attn_v_b`, right after the attention on every layer's critical path.
  }];
}

def MarkLiveRows : Pass<"kiln-mark-live-rows", "::mlir::func::FuncOp"> {
  let summary = "Mark the projection rows only a DSA indexer reads";
  let description = [{
    On a step function after fusion: a `step.fused_linear` or
    `step.rms_norm_linear` segment whose rows only a `step.dsa_indexer`
    reads, as its query or its head weights (through views, nothing else
    reading those elements), at the step's `position` input, gets
    `live_from[i] = top_k`: the indexer reads neither while `position + 1 <=
    top_k`, when it selects every position, so below that a backend may
    leave the rows unwritten. In GLM-5 the indexer's query, 4,096 of q_b's
    6,144 rows at tp=8 (8.9 MB of Q8_0 a layer, a ninth of a step's bytes),
    and its head weights, read by no one below 2,048 positions. The CUDA
    backend's q8_0-split and F32 kernels skip them; the CPU backend computes
    every row.
  }];
}

def FuseCacheAppend : Pass<"kiln-fuse-cache-append", "::mlir::func::FuncOp"> {
  let summary = "Fold the norm, rope and concat that build a cache row into its append";
  let description = [{
    On a step function before planning: a `step.cache_append` whose entry
    is made right before it by `rope(norm(x))` (an RMS or layer norm of the
    whole row, then a rotation of part of it), or by
    `concat(norm(s[a, a + n)), rope(s[a + n, a + n + m)))` (a normalised
    part and a rotated part of one vector), becomes one
    `step.norm_rope_append` reading `x` (or `s` from `a`); the
    intermediate buffers must be arena buffers that only the chain reads,
    and its ops must run back to back, so the source still holds the same
    values where the fused op reads it. In GLM-5 these are the latent
    cache's row and the indexer key: four and three short ops of every
    layer, each a launch on the path to attention, become one each.
  }];
}

def FuseExpertAdd : Pass<"kiln-fuse-expert-add", "::mlir::func::FuncOp"> {
  let summary = "Fold an add of the routed experts' sum into the experts op";
  let description = [{
    On a step function before planning: a `step.add` one of whose operands
    is the output of a `step.moe_experts` that nothing else reads becomes
    that op with the other operand as its `addend`, placed where the add
    was (what the experts read must not be written in between). In GLM-5's
    MoE layers that is the shared expert's output joining the routed
    experts' sum: one op fewer on every MoE layer's path to the next
    all-reduce; the CUDA backend adds it in the down kernel's last write.
  }];
}

def FuseSharedExpert
    : Pass<"kiln-fuse-shared-expert", "::mlir::func::FuncOp"> {
  let summary = "Move a MoE layer's shared expert inside its routed experts' op";
  let description = [{
    On a step function before planning, after `kiln-fuse-expert-add`: a
    `step.moe_experts` whose `addend` is the output of a
    `step.swiglu_linear` (the shared expert's down) whose gate and up are
    the two halves of a `step.fused_linear` of two 2-D weights over the
    experts' own input (or two `step.linear`s of it) becomes that op with
    `shared(gate, up, down)` in place of the addend, where it was; the
    fused_linear, its views, the swiglu_linear and their buffers go. The
    intermediate buffers must be read by nothing else and the input must
    not be written in between. In the default pipeline
    (`kiln-compile --fuse-shared-expert=false` leaves it out): the CUDA
    backend runs the shared expert as one more expert of weight 1 in the
    routed experts' launches; the CPU backend computes it exactly as the
    three ops did.
  }];
}

def FoldRouter : Pass<"kiln-fold-router", "::mlir::func::FuncOp"> {
  let summary = "Fold a MoE router's dots into the all-reduce before it";
  let description = [{
    On a tensor-parallel step function (`kiln.tp` > 1) before planning,
    after `kiln-fuse-add-norm`: a `step.all_reduce_add_rms_norm` whose
    output `y = rms_norm(h) * g` (`h = x + sum_r p_r`) a `step.moe_router`
    with an F32 gate `[n, E]` reads, whose partial `p` is an arena buffer
    that one op writes before it and nothing else reads. The partial grows
    to `n + E` values: its producer writes the first `n` (a view), a
    `step.router_partial` right after it the last `E`, `G (g * (p_r + x /
    tp))`; the all-reduce, with `tail = E`, sums all `n + E` and writes
    the tail divided by its rms into a new `logits` buffer, and a
    `step.moe_choose` of those logits replaces the router where it was
    (`kiln-fuse-router-choice` then moves it into the all-reduce).
    Equal to the router's logits in real arithmetic; in f32 the sums run
    in another order. The residual and the norm's weight must not be
    written between the producer and the all-reduce, nor `y` between the
    all-reduce and the router. Opt-in (`kiln-compile --fold-router`): the
    router's dots leave the path after the all-reduce, but each rank does
    them all, and the all-reduce carries `E` more values.

    With `compose`, the producer must be a `step.linear` (batch 1, not
    stacked) of a row-parallel weight (`shard = 0`) `[K, n]`, `n` a
    multiple of `tp`, and the norm's weight an F32 weight: the partial
    becomes a buffer of `n + E` (same name) that one `step.linear_router`
    writes whole in the linear's place, its tail `M_r . in_r + C_r .
    x[r n/tp, (r+1) n/tp)` from matrices a backend composes at load (`M_r
    = G diag(g) W_r`, `C_r` the gate's and norm's columns of the rank's
    share of the residual); no view, no `router_partial`. The all-reduce
    and the choice as above. A layer whose producer is not such a linear
    keeps its router (not the simpler fold: a step holds one form or the
    other, so a measurement of the composed form is of it alone;
    `kiln-compile --fold-router=composed`).
  }];
  let options = [
    Option<"compose", "compose", "bool", /*default=*/"false",
           "Compose the router into the producing linear's weight "
           "(step.linear_router) instead of a step.router_partial">
  ];
}

def FuseRouterChoice
    : Pass<"kiln-fuse-router-choice", "::mlir::func::FuncOp"> {
  let summary = "Make the router's choice inside the all-reduce of its logits";
  let description = [{
    On a step function before planning, after `kiln-fold-router`: a
    `step.moe_choose` whose logits are the `logits` output of a
    `step.all_reduce_add_rms_norm` with a tail and no choice yet, read by
    nothing but the choice, moves into the all-reduce as its `choose`
    clause (the bias, `ids` and `weights` operands and the choice's
    attributes), and the `moe_choose` goes. Nothing between the two ops may
    write the logits or the bias, nor read or write the choice's `ids` and
    `weights`; their declarations move before the all-reduce when they
    come after it. The all-reduce still writes the logits. The same bits:
    the op is defined as the all-reduce, then `step.moe_choose` of its
    logits. A backend can then choose where the reduced tail is, instead of
    in a separate op after the collective on every MoE layer's path (on the
    GPU a one-block kernel and its launch). In the default pipeline
    whenever the router is folded (`kiln-compile --fuse-router-choice=false`
    keeps the separate `moe_choose`).
  }];
}

def FuseIndexerRope : Pass<"kiln-fuse-indexer-rope", "::mlir::func::FuncOp"> {
  let summary = "Fold the rope of the DSA indexer's query into the indexer";
  let description = [{
    On a step function before planning: a `step.rope` into an arena buffer
    that only a later `step.dsa_indexer` reads, as its query, at the same
    position, with nothing in between writing the rope's input or the
    position, goes; the indexer reads the unrotated query and rotates it
    itself (its `rope_*` attributes). In GLM-5 that rope sat between q_b
    and the indexer on every layer's path to attention, and below 2,048
    positions, where every position is selected and no score is read, it
    was work for nothing.
  }];
}

def PlanMemory : Pass<"kiln-plan-memory", "::mlir::func::FuncOp"> {
  let summary = "Place every arena buffer of a step at a fixed offset";
  let description = [{
    Computes, for every `step.buffer`, the interval of ops during which it
    holds a value (first write to last read, through views), and places the
    buffers in one arena, largest first, each at the lowest aligned offset
    that overlaps no buffer whose interval meets its own. With
    `reuse-distance=N` a buffer's bytes stay its own for N more ops after
    its last access: a write to reused bytes must wait for every earlier
    reader of them, which orders ops that could otherwise run side by side
    on a backend's parallel branches. Writes each
    buffer's `at` offset and the function's `step.plan` (arena bytes, peak
    live bytes, alignment, buffer count). Functions without step buffers
    are left alone.
  }];
  let options = [
    Option<"alignment", "alignment", "int64_t", /*default=*/"256",
           "Byte alignment of every buffer offset (a power of two)">,
    Option<"reuseDistance", "reuse-distance", "int64_t", /*default=*/"0",
           "Ops after a buffer's last access before another buffer may "
           "take its bytes (0: at once)">
  ];
}

def VerifyCapture : Pass<"kiln-verify-capture", "::mlir::func::FuncOp"> {
  let summary = "Prove a planned step is safe to capture as one CUDA graph";
  let description = [{
    Rejects, with a message naming the op and the buffer: an op with unknown
    or undeclared memory effects on a buffer, or one that writes a buffer it
    does not list as an output; an allocation or a host synchronisation in
    the step; a read of a buffer that nothing in the step (or its inputs,
    weights and state) wrote before; a write to a weight or an input slot;
    a write whose arena range overlaps another buffer that is still to be
    read, computed from the plan's offsets themselves; a result that may
    alias an operand without a view or in-place declaration; a buffer
    without an offset or outside the arena. Runs on every function that
    contains step ops; changes nothing.
  }];
}

#endif // KILN_COMPILER_PASSES_TD
