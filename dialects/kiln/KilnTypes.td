//===- KilnTypes.td - Types of the kiln dialect ------------*- tablegen -*-===//
//
// Quantised weight handles and the model's typed state.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_TYPES_TD
#define KILN_TYPES_TD

include "KilnDialect.td"
include "mlir/IR/AttrTypeBase.td"

class Kiln_Type<string name, string typeMnemonic, list<Trait> traits = []>
    : TypeDef<Kiln_Dialect, name, traits> {
  let mnemonic = typeMnemonic;
}

def Kiln_QWeightType : Kiln_Type<"QWeight", "qweight"> {
  let summary = "a quantised weight: a GGUF tensor, its block format, its dims";
  let description = [{
    A handle to one weight tensor of the model's GGUF file(s): the tensor's
    name, its ggml block format (lower case, as `kiln-gguf types` spells
    them: `q4_k`, `q8_0`, `bf16`, `f32`, ...) and its dims in GGUF order,
    innermost (`ne[0]`, the contiguous, block-quantised dimension) first.
    A PyTorch `[out, in]` matrix is `[in, out]` here. Nothing depends on
    where the tensor sits in a file.

    The verifier checks the format is a ggml type, the dims are 1 to 4
    positive sizes, and `ne[0]` is a whole number of the format's blocks.

    After tensor-parallel partitioning a handle may name one rank's part:
    `shard = D of N` says the dims are the local ones and dim `D` of the
    file's tensor is `N` times as large; rank `r` binds part `r` of it. A
    part of `ne[0]` must still be a whole number of blocks. With
    `groups = G`, dim `D` is `G` equal groups (a fused gate/up: gate rows,
    then up rows) and the rank takes part `r` of each group, in group order.

    `rows = A to B of P` says the handle holds, of every `P` consecutive
    rows of dim 1 (`ne[1]`, a matrix's output rows) of the tensor or of the
    rank's part, rows `A` to `B`: one slice of every head of a projection
    whose heads are `P` rows each (kiln-split-projections). dims[1] is then
    the cut rows, a whole number of `B - A`.

    Example:
    ```mlir
    !kiln.qweight<"blk.3.ffn_up_exps.weight", "q4_k", [6144, 2048, 256]>
    !kiln.qweight<"blk.3.ffn_down_exps.weight", "q4_k", [256, 6144, 256], shard = 0 of 8>
    !kiln.qweight<"blk.3.attn_q_b.weight", "q8_0", [2048, 1536], shard = 1 of 8, rows = 0 to 192 of 256>
    ```
  }];
  let parameters = (ins StringRefParameter<"GGUF tensor name">:$name,
                        StringRefParameter<"ggml block format">:$format,
                        ArrayRefParameter<"int64_t", "GGUF dims">:$dims,
                        DefaultValuedParameter<"int64_t", "-1",
                            "split dim (-1: whole tensor)">:$shard_dim,
                        DefaultValuedParameter<"int64_t", "1",
                            "parts the split dim is cut into">:$shard_parts,
                        DefaultValuedParameter<"int64_t", "1",
                            "equal groups of the split dim, each cut alike">:
                            $shard_groups,
                        DefaultValuedParameter<"int64_t", "0",
                            "first row held of each period">:$rows_begin,
                        DefaultValuedParameter<"int64_t", "0",
                            "row after the last held of each period">:
                            $rows_end,
                        DefaultValuedParameter<"int64_t", "0",
                            "rows of dim 1 per period (0: every row)">:
                            $rows_period);
  // The optional parts in a custom directive: several begin with a comma,
  // which the generated optional groups cannot tell apart.
  let assemblyFormat = [{
    `<` $name `,` $format `,` `[` $dims `]` ``
    custom<WeightParts>($shard_dim, $shard_parts, $shard_groups, $rows_begin,
                        $rows_end, $rows_period) `>`
  }];
  let builders = [
    TypeBuilder<(ins "::llvm::StringRef":$name, "::llvm::StringRef":$format,
                     "::llvm::ArrayRef<int64_t>":$dims), [{
      return $_get($_ctxt, name, format, dims, -1, 1, 1, 0, 0, 0);
    }]>,
    TypeBuilder<(ins "::llvm::StringRef":$name, "::llvm::StringRef":$format,
                     "::llvm::ArrayRef<int64_t>":$dims, "int64_t":$shardDim,
                     "int64_t":$shardParts), [{
      return $_get($_ctxt, name, format, dims, shardDim, shardParts, 1, 0, 0,
                   0);
    }]>
  ];
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// The dims of the whole tensor in the file (the local dims with the
    /// row cut and the split dim multiplied back).
    ::llvm::SmallVector<int64_t> getFullDims() const;
    /// Whether the handle holds a cut of dim 1's rows (`rows = ...`).
    bool hasRowCut() const { return getRowsPeriod() > 0; }
    /// The tensor's name without ".weight" (a segment's name).
    ::llvm::StringRef getStem() const;
    /// The name a handle's value prints as: its stem, and with a row cut
    /// `.rowsAtoB`.
    std::string getValueName() const;
    /// Values of the tensor (product of dims).
    int64_t getNumElements() const;
    /// The dequantised value type: dims reversed (row-major, ne[0] last).
    ::mlir::RankedTensorType getDequantizedType(::mlir::Type element) const;
  }];
}

def Kiln_LatentCacheType : Kiln_Type<"LatentCache", "latent_cache"> {
  let summary = "per-layer MLA latent cache: [latent | rope key] per token";
  let description = [{
    The only per-token state of MLA attention: for each of `positions`
    positions, `latent` compressed key/value values (the normalised c_kv)
    followed by `rope` rotated key values, stored as `element`. GLM-5: 512 +
    64 = 576 values per token per layer.

    Example:
    ```mlir
    !kiln.latent_cache<202752, 512, 64, f16>
    ```
  }];
  let parameters = (ins "int64_t":$positions, "int64_t":$latent,
                        "int64_t":$rope, "::mlir::Type":$element);
  let assemblyFormat = "`<` $positions `,` $latent `,` $rope `,` $element `>`";
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// Values stored per token.
    int64_t getWidth() const { return getLatent() + getRope(); }
  }];
}

def Kiln_IndexCacheType : Kiln_Type<"IndexCache", "index_cache"> {
  let summary = "per-layer DSA indexer key cache";
  let description = [{
    For each of `positions` positions, the indexer's `dim` key values
    (layer-normalised and roped), stored as `element`. GLM-5: 128 per token
    per layer.

    Example:
    ```mlir
    !kiln.index_cache<202752, 128, f16>
    ```
  }];
  let parameters = (ins "int64_t":$positions, "int64_t":$dim,
                        "::mlir::Type":$element);
  let assemblyFormat = "`<` $positions `,` $dim `,` $element `>`";
  let genVerifyDecl = 1;
}

def Kiln_AnyCache : AnyTypeOf<[Kiln_LatentCacheType, Kiln_IndexCacheType]>;

#endif // KILN_TYPES_TD
