//===- KilnAttrs.td - Attributes of the kiln dialect -------*- tablegen -*-===//
#ifndef KILN_ATTRS_TD
#define KILN_ATTRS_TD

include "KilnDialect.td"
include "mlir/IR/AttrTypeBase.td"

def Kiln_GLM5ConfigAttr : AttrDef<Kiln_Dialect, "GLM5Config"> {
  let mnemonic = "glm5_config";
  let summary = "hyper-parameters of a GLM-5-shaped model";
  let description = [{
    The hyper-parameters a decode step was built from (GLM5.md section 1),
    attached to the step function as `kiln.config`, so that every later stage
    and the artifact read them from the program rather than from a file.

    Example (abridged):
    ```mlir
    #kiln.glm5_config<hidden = 6144, layers = 78, mtp_layers = 1, ...>
    ```
  }];
  let parameters = (ins
    "int64_t":$hidden, "int64_t":$layers, "int64_t":$mtp_layers,
    "int64_t":$dense_layers, "int64_t":$vocab, "int64_t":$dense_ff,
    "int64_t":$expert_ff, "int64_t":$experts, "int64_t":$experts_used,
    "int64_t":$shared_experts, "int64_t":$heads, "int64_t":$q_lora_rank,
    "int64_t":$kv_lora_rank, "int64_t":$qk_nope_dim, "int64_t":$qk_rope_dim,
    "int64_t":$v_head_dim, "int64_t":$indexer_heads, "int64_t":$indexer_dim,
    "int64_t":$indexer_top_k, "int64_t":$context_length,
    "::mlir::FloatAttr":$rope_theta, "::mlir::FloatAttr":$rms_eps,
    "::mlir::FloatAttr":$routed_scale);
  let assemblyFormat = "`<` struct(params) `>`";
}

def Kiln_SegmentAttr : AttrDef<Kiln_Dialect, "Segment"> {
  let mnemonic = "segment";
  let summary = "one part of a fused projection: its weight, rows and format";
  let description = [{
    A fused projection's output is its segments one after another: segment
    `name` (the GGUF tensor, without `.weight`) fills rows `offset` to
    `offset + rows` and is stored as `format`. The order is the program's,
    chosen by the fusion pass, never the order tensors appear in a file;
    weight packing and every consumer's slice read the same map.

    Example:
    ```mlir
    #kiln.segment<name = "blk.0.attn_q_a", offset = 0, rows = 2048, format = "q8_0">
    ```
  }];
  let parameters = (ins StringRefParameter<"tensor name">:$name,
                        "int64_t":$offset, "int64_t":$rows,
                        StringRefParameter<"ggml block format">:$format);
  let assemblyFormat = "`<` struct(params) `>`";
}

#endif // KILN_ATTRS_TD
