// RUN: kiln-opt %s --split-input-file --verify-diagnostics

// Every verifier message of the kiln ops, pinned. Type mismatches that the
// traits catch (SameOperandsAndResultType, AllTypesMatch) are pinned too, so a
// change of trait that loosens a check shows up here.

func.func @norm_weight_width(%x: tensor<6144xf32>, %w: tensor<2048xf32>) -> tensor<6144xf32> {
  // expected-error @+1 {{'kiln.rms_norm' op weight has 2048 elements but the input's innermost dimension has 6144}}
  %n = kiln.rms_norm %x, %w {epsilon = 1.0e-05 : f32} : tensor<6144xf32>, tensor<2048xf32>
  return %n : tensor<6144xf32>
}

// -----

func.func @norm_weight_handle_rank(%x: tensor<64xf32>, %w: !kiln.qweight<"n.weight", "f32", [64, 2]>) -> tensor<64xf32> {
  // expected-error @+1 {{'kiln.rms_norm' op weight must be one-dimensional, got '!kiln.qweight<"n.weight", "f32", [64, 2]>'}}
  %n = kiln.rms_norm %x, %w {epsilon = 1.0e-05 : f32} : tensor<64xf32>, !kiln.qweight<"n.weight", "f32", [64, 2]>
  return %n : tensor<64xf32>
}

// -----

func.func @norm_weight_rank(%x: tensor<4x64xf32>, %w: tensor<4x64xf32>) -> tensor<4x64xf32> {
  // expected-error @+1 {{'kiln.rms_norm' op operand #1 must be float vector or one-dimensional weight, but got 'tensor<4x64xf32>'}}
  %n = kiln.rms_norm %x, %w {epsilon = 1.0e-05 : f32} : tensor<4x64xf32>, tensor<4x64xf32>
  return %n : tensor<4x64xf32>
}

// -----

func.func @norm_scalar(%x: tensor<f32>, %w: tensor<1xf32>) -> tensor<f32> {
  // expected-error @+1 {{'kiln.rms_norm' op input must have at least one dimension, got 'tensor<f32>'}}
  %n = kiln.rms_norm %x, %w {epsilon = 1.0e-05 : f32} : tensor<f32>, tensor<1xf32>
  return %n : tensor<f32>
}

// -----

func.func @norm_epsilon_zero(%x: tensor<64xf32>, %w: tensor<64xf32>) -> tensor<64xf32> {
  // expected-error @+1 {{'kiln.rms_norm' op epsilon must be positive and finite, got 0}}
  %n = kiln.rms_norm %x, %w {epsilon = 0.0 : f32} : tensor<64xf32>, tensor<64xf32>
  return %n : tensor<64xf32>
}

// -----

func.func @norm_epsilon_negative(%x: tensor<64xf32>, %w: tensor<64xf32>) -> tensor<64xf32> {
  // expected-error @+1 {{'kiln.rms_norm' op epsilon must be positive and finite, got -1}}
  %n = kiln.rms_norm %x, %w {epsilon = -1.0 : f32} : tensor<64xf32>, tensor<64xf32>
  return %n : tensor<64xf32>
}

// -----

func.func @norm_epsilon_missing(%x: tensor<64xf32>, %w: tensor<64xf32>) -> tensor<64xf32> {
  // expected-error @+1 {{'kiln.rms_norm' op requires attribute 'epsilon'}}
  %n = kiln.rms_norm %x, %w : tensor<64xf32>, tensor<64xf32>
  return %n : tensor<64xf32>
}

// -----

func.func @add_types_differ(%a: tensor<64xf32>, %b: tensor<64xf16>) -> tensor<64xf32> {
  // expected-error @+1 {{'kiln.add' op requires the same type for all operands and results}}
  %s = "kiln.add"(%a, %b) : (tensor<64xf32>, tensor<64xf16>) -> tensor<64xf32>
  return %s : tensor<64xf32>
}

// -----

func.func @swiglu_integer(%a: tensor<64xi32>, %b: tensor<64xi32>) -> tensor<64xi32> {
  // expected-error @+1 {{'kiln.swiglu' op operand #0 must be ranked tensor of 32-bit float or 16-bit float or bfloat16 type values}}
  %s = kiln.swiglu %a, %b : tensor<64xi32>
  return %s : tensor<64xi32>
}

// -----

func.func @argmax_rank(%x: tensor<2x8xf32>) -> tensor<i32> {
  // expected-error @+1 {{'kiln.argmax' op input must be one-dimensional, got 'tensor<2x8xf32>'}}
  %t = kiln.argmax %x : tensor<2x8xf32>
  return %t : tensor<i32>
}

// -----

func.func @argmax_empty(%x: tensor<0xf32>) -> tensor<i32> {
  // expected-error @+1 {{'kiln.argmax' op input must not be empty}}
  %t = kiln.argmax %x : tensor<0xf32>
  return %t : tensor<i32>
}

// -----

func.func @argmax_words(%x: tensor<8xf32>, %w: tensor<3xi32>, %p: tensor<i32>) -> tensor<i32> {
  // expected-error @+1 {{'kiln.argmax' op the sampling words must be tensor<8xi32>, tensor<4xi32> (a temperature only) or tensor<(16 + 3 n)xi32> (with n adjustments, n > 0), got 'tensor<3xi32>'}}
  %t = "kiln.argmax"(%x, %w, %p) {operandSegmentSizes = array<i32: 1, 1, 1>} : (tensor<8xf32>, tensor<3xi32>, tensor<i32>) -> tensor<i32>
  return %t : tensor<i32>
}

// -----

// The adjusting form holds whole entries of three words, at least one.
func.func @argmax_adjusting_words(%x: tensor<8xf32>, %w: tensor<17xi32>, %p: tensor<i32>) -> tensor<i32> {
  // expected-error @+1 {{'kiln.argmax' op the sampling words must be tensor<8xi32>, tensor<4xi32> (a temperature only) or tensor<(16 + 3 n)xi32> (with n adjustments, n > 0), got 'tensor<17xi32>'}}
  %t = kiln.argmax %x sampled %w : tensor<17xi32> at %p : tensor<8xf32>
  return %t : tensor<i32>
}

// -----

func.func @argmax_no_adjustments(%x: tensor<8xf32>, %w: tensor<16xi32>, %p: tensor<i32>) -> tensor<i32> {
  // expected-error @+1 {{'kiln.argmax' op the sampling words must be tensor<8xi32>, tensor<4xi32> (a temperature only) or tensor<(16 + 3 n)xi32> (with n adjustments, n > 0), got 'tensor<16xi32>'}}
  %t = kiln.argmax %x sampled %w : tensor<16xi32> at %p : tensor<8xf32>
  return %t : tensor<i32>
}

// -----

func.func @argmax_draw_without_position(%x: tensor<8xf32>, %w: tensor<4xi32>) -> tensor<i32> {
  // expected-error @+1 {{'kiln.distributed_argmax' op a draw needs both its sampling words and its position}}
  %t = "kiln.distributed_argmax"(%x, %w) {ranks = 2 : i64, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<8xf32>, tensor<4xi32>) -> tensor<i32>
  return %t : tensor<i32>
}

// -----
// Types

// expected-error @+1 {{weight has an empty tensor name}}
func.func private @empty_name(!kiln.qweight<"", "q8_0", [32]>)

// -----

// expected-error @+1 {{weight 'w': unknown format 'q9_k' (expected a lower-case ggml type such as q4_k, q8_0, bf16, f32)}}
func.func private @bad_format(!kiln.qweight<"w", "q9_k", [256]>)

// -----

// expected-error @+1 {{weight 'w': unknown format 'Q4_K'}}
func.func private @upper_format(!kiln.qweight<"w", "Q4_K", [256]>)

// -----

// expected-error @+1 {{weight 'w' has 5 dims; GGUF tensors have 1 to 4}}
func.func private @five_dims(!kiln.qweight<"w", "f32", [1, 1, 1, 1, 1]>)

// -----

// expected-error @+1 {{weight 'w' has a non-positive dim 0}}
func.func private @zero_dim(!kiln.qweight<"w", "f32", [4, 0]>)

// -----

// attn_k_b rows are 192 long: never a K-quant.
// expected-error @+1 {{weight 'blk.0.attn_k_b.weight': ne[0] = 192 is not a multiple of q4_k's block of 256 values}}
func.func private @misaligned(!kiln.qweight<"blk.0.attn_k_b.weight", "q4_k", [192, 512, 64]>)

// -----

// expected-error @+1 {{latent cache sizes must be positive, got positions 0, latent 512, rope 64}}
func.func private @empty_cache(!kiln.latent_cache<0, 512, 64, f16>)

// -----

// expected-error @+1 {{index cache sizes must be positive, got positions 16, dim 0}}
func.func private @empty_index(!kiln.index_cache<16, 0, f16>)

// -----

// expected-error @+1 {{cache element type must be f32, f16 or bf16, got 'i8'}}
func.func private @int_cache(!kiln.latent_cache<16, 512, 64, i8>)

// -----
// Weights, state, dequant, embed

func.func @state_name() {
  // expected-error @+1 {{'kiln.state' op state name must not be empty}}
  %s = kiln.state "" : !kiln.index_cache<16, 32, f16>
  return
}

// -----

func.func @dequant_shape(%w: !kiln.qweight<"w", "f32", [256, 4]>) {
  // expected-error @+1 {{'kiln.dequant' op result must be 'tensor<4x256xf32>' (the weight's dims reversed), got 'tensor<256x4xf32>'}}
  %t = kiln.dequant %w : !kiln.qweight<"w", "f32", [256, 4]> -> tensor<256x4xf32>
  return
}

// -----

func.func @embed_table_rank(%w: !kiln.qweight<"token_embd.weight", "q8_0", [256, 8, 4]>, %t: tensor<i32>) {
  // expected-error @+1 {{'kiln.embed' op table must have dims [hidden, vocab], got 3 dims}}
  %x = kiln.embed %w[%t] : !kiln.qweight<"token_embd.weight", "q8_0", [256, 8, 4]> -> tensor<256xf32>
  return
}

// -----

func.func @embed_width(%w: !kiln.qweight<"token_embd.weight", "q8_0", [256, 1024]>, %t: tensor<i32>) {
  // expected-error @+1 {{'kiln.embed' op result has 128 values but table rows have 256}}
  %x = kiln.embed %w[%t] : !kiln.qweight<"token_embd.weight", "q8_0", [256, 1024]> -> tensor<128xf32>
  return
}

// -----
// Linear

func.func @linear_elements(%x: tensor<256xf32>, %w: !kiln.qweight<"w", "q8_0", [256, 128]>) {
  // expected-error @+1 {{'kiln.linear' op input and result element types differ: 'f32' vs 'f16'}}
  %y = kiln.linear %x, %w : tensor<256xf32>, !kiln.qweight<"w", "q8_0", [256, 128]> -> tensor<128xf16>
  return
}

// -----

func.func @linear_scalar(%x: tensor<f32>, %w: !kiln.qweight<"w", "q8_0", [256, 128]>) {
  // expected-error @+1 {{'kiln.linear' op input must have at least one dimension}}
  %y = kiln.linear %x, %w : tensor<f32>, !kiln.qweight<"w", "q8_0", [256, 128]> -> tensor<128xf32>
  return
}

// -----

// The fused-projection bug class: an input of the wrong width is refused.
func.func @linear_width(%x: tensor<2048xf32>, %w: !kiln.qweight<"blk.0.attn_q_a.weight", "q8_0", [6144, 2048]>) {
  // expected-error @+1 {{'kiln.linear' op input's innermost dimension is 2048 but the weight's ne[0] is 6144}}
  %y = kiln.linear %x, %w : tensor<2048xf32>, !kiln.qweight<"blk.0.attn_q_a.weight", "q8_0", [6144, 2048]> -> tensor<2048xf32>
  return
}

// -----

func.func @linear_result(%x: tensor<256xf32>, %w: !kiln.qweight<"w", "q8_0", [256, 128]>) {
  // expected-error @+1 {{'kiln.linear' op result must be 'tensor<128xf32>', got 'tensor<256xf32>'}}
  %y = kiln.linear %x, %w : tensor<256xf32>, !kiln.qweight<"w", "q8_0", [256, 128]> -> tensor<256xf32>
  return
}

// -----

func.func @linear_stacked_input(%x: tensor<4x32xf32>, %w: !kiln.qweight<"blk.0.attn_k_b.weight", "q8_0", [32, 64, 8]>) {
  // expected-error @+1 {{'kiln.linear' op a stacked weight [32, 64, 8] needs an input of shape [8, 32], got 'tensor<4x32xf32>'}}
  %y = kiln.linear %x, %w : tensor<4x32xf32>, !kiln.qweight<"blk.0.attn_k_b.weight", "q8_0", [32, 64, 8]> -> tensor<4x64xf32>
  return
}

// -----

func.func @linear_stacked_result(%x: tensor<8x32xf32>, %w: !kiln.qweight<"blk.0.attn_k_b.weight", "q8_0", [32, 64, 8]>) {
  // expected-error @+1 {{'kiln.linear' op result must be 'tensor<8x64xf32>', got 'tensor<8x32xf32>'}}
  %y = kiln.linear %x, %w : tensor<8x32xf32>, !kiln.qweight<"blk.0.attn_k_b.weight", "q8_0", [32, 64, 8]> -> tensor<8x32xf32>
  return
}

// -----

func.func @linear_vector_weight(%x: tensor<256xf32>, %w: !kiln.qweight<"w", "f32", [256]>) {
  // expected-error @+1 {{'kiln.linear' op weight must have 2 dims, or 3 for a stack of matrices, got 1}}
  %y = kiln.linear %x, %w : tensor<256xf32>, !kiln.qweight<"w", "f32", [256]> -> tensor<256xf32>
  return
}

// -----
// layer_norm, rope

func.func @layer_norm_scalar(%x: tensor<f32>, %w: tensor<1xf32>) {
  // expected-error @+1 {{'kiln.layer_norm' op input must have at least one dimension}}
  %y = kiln.layer_norm %x, %w, %w {epsilon = 1.0e-06 : f32} : tensor<f32>, tensor<1xf32>, tensor<1xf32>
  return
}

// -----

func.func @layer_norm_width(%x: tensor<128xf32>, %w: tensor<64xf32>) {
  // expected-error @+1 {{'kiln.layer_norm' op weight must have 128 values (the input's innermost dimension), got 'tensor<64xf32>'}}
  %y = kiln.layer_norm %x, %w, %w {epsilon = 1.0e-06 : f32} : tensor<128xf32>, tensor<64xf32>, tensor<64xf32>
  return
}

// -----

func.func @layer_norm_epsilon(%x: tensor<128xf32>, %w: tensor<128xf32>) {
  // expected-error @+1 {{'kiln.layer_norm' op epsilon must be positive and finite, got 0}}
  %y = kiln.layer_norm %x, %w, %w {epsilon = 0.0 : f32} : tensor<128xf32>, tensor<128xf32>, tensor<128xf32>
  return
}

// -----

func.func @rope_style(%x: tensor<64xf32>, %p: tensor<i32>) {
  // expected-error @+1 {{'kiln.rope' op style must be "interleaved" or "neox", got "yarn"}}
  %y = kiln.rope %x[%p] {style = "yarn", theta = 1.0e+06 : f32, offset = 0 : i64, dims = 64 : i64} : tensor<64xf32>
  return
}

// -----

func.func @rope_theta(%x: tensor<64xf32>, %p: tensor<i32>) {
  // expected-error @+1 {{'kiln.rope' op theta must be positive and finite, got -1}}
  %y = kiln.rope %x[%p] {style = "interleaved", theta = -1.0 : f32, offset = 0 : i64, dims = 64 : i64} : tensor<64xf32>
  return
}

// -----

func.func @rope_odd(%x: tensor<64xf32>, %p: tensor<i32>) {
  // expected-error @+1 {{'kiln.rope' op dims must be positive and even, got 63}}
  %y = kiln.rope %x[%p] {style = "interleaved", theta = 1.0e+06 : f32, offset = 0 : i64, dims = 63 : i64} : tensor<64xf32>
  return
}

// -----

func.func @rope_scalar(%x: tensor<f32>, %p: tensor<i32>) {
  // expected-error @+1 {{'kiln.rope' op input must have at least one dimension}}
  %y = kiln.rope %x[%p] {style = "interleaved", theta = 1.0e+06 : f32, offset = 0 : i64, dims = 2 : i64} : tensor<f32>
  return
}

// -----

// MLA ropes the last 64 of each 256-wide q head: offset 192 + 64 fits, 200 does not.
func.func @rope_range(%x: tensor<64x256xf32>, %p: tensor<i32>) {
  // expected-error @+1 {{'kiln.rope' op rotated values [200, 264) do not fit the innermost dimension of 256}}
  %y = kiln.rope %x[%p] {style = "interleaved", theta = 1.0e+06 : f32, offset = 200 : i64, dims = 64 : i64} : tensor<64x256xf32>
  return
}

// -----
// State and attention

func.func @append_width(%e: tensor<512xf32>, %p: tensor<i32>) {
  %kv = kiln.state "kv" : !kiln.latent_cache<16, 512, 64, f16>
  // expected-error @+1 {{'kiln.cache_append' op entry has 512 values but the cache stores 576 per token}}
  kiln.cache_append %kv[%p], %e : !kiln.latent_cache<16, 512, 64, f16>, tensor<512xf32>
  return
}

// -----

func.func @mla_latent(%ql: tensor<8x32xf32>, %qr: tensor<8x16xf32>, %p: tensor<i32>) {
  %kv = kiln.state "kv" : !kiln.latent_cache<16, 64, 16, f16>
  // expected-error @+1 {{'kiln.mla_attention' op q_latent must be [heads, 64] (the cache's latent width), got 'tensor<8x32xf32>'}}
  %o = kiln.mla_attention %ql, %qr, %kv[%p] {scale = 0.125 : f32} : tensor<8x32xf32>, tensor<8x16xf32>, !kiln.latent_cache<16, 64, 16, f16> -> tensor<8x32xf32>
  return
}

// -----

func.func @mla_rope(%ql: tensor<8x64xf32>, %qr: tensor<4x16xf32>, %p: tensor<i32>) {
  %kv = kiln.state "kv" : !kiln.latent_cache<16, 64, 16, f16>
  // expected-error @+1 {{'kiln.mla_attention' op q_rope must be [8, 16], got 'tensor<4x16xf32>'}}
  %o = kiln.mla_attention %ql, %qr, %kv[%p] {scale = 0.125 : f32} : tensor<8x64xf32>, tensor<4x16xf32>, !kiln.latent_cache<16, 64, 16, f16> -> tensor<8x64xf32>
  return
}

// -----

func.func @mla_result(%ql: tensor<8x64xf32>, %qr: tensor<8x16xf32>, %p: tensor<i32>) {
  %kv = kiln.state "kv" : !kiln.latent_cache<16, 64, 16, f16>
  // expected-error @+1 {{'kiln.mla_attention' op result must have q_latent's type 'tensor<8x64xf32>', got 'tensor<8x64xf16>'}}
  %o = kiln.mla_attention %ql, %qr, %kv[%p] {scale = 0.125 : f32} : tensor<8x64xf32>, tensor<8x16xf32>, !kiln.latent_cache<16, 64, 16, f16> -> tensor<8x64xf16>
  return
}

// -----

func.func @mla_scale(%ql: tensor<8x64xf32>, %qr: tensor<8x16xf32>, %p: tensor<i32>) {
  %kv = kiln.state "kv" : !kiln.latent_cache<16, 64, 16, f16>
  // expected-error @+1 {{'kiln.mla_attention' op scale must be positive and finite, got 0}}
  %o = kiln.mla_attention %ql, %qr, %kv[%p] {scale = 0.0 : f32} : tensor<8x64xf32>, tensor<8x16xf32>, !kiln.latent_cache<16, 64, 16, f16> -> tensor<8x64xf32>
  return
}

// -----

func.func @dsa_query(%q: tensor<4x16xf32>, %w: tensor<4xf32>, %p: tensor<i32>) {
  %ic = kiln.state "ic" : !kiln.index_cache<64, 32, f16>
  // expected-error @+1 {{'kiln.dsa_indexer' op query must be [heads, 32] (the cache's key width), got 'tensor<4x16xf32>'}}
  %s, %n = kiln.dsa_indexer %q, %w, %ic[%p] {top_k = 8 : i64, scale = 0.1 : f32} : tensor<4x16xf32>, tensor<4xf32>, !kiln.index_cache<64, 32, f16> -> tensor<8xi32>
  return
}

// -----

func.func @dsa_heads(%q: tensor<4x32xf32>, %w: tensor<32xf32>, %p: tensor<i32>) {
  %ic = kiln.state "ic" : !kiln.index_cache<64, 32, f16>
  // expected-error @+1 {{'kiln.dsa_indexer' op head_weights has 32 values for 4 heads}}
  %s, %n = kiln.dsa_indexer %q, %w, %ic[%p] {top_k = 8 : i64, scale = 0.1 : f32} : tensor<4x32xf32>, tensor<32xf32>, !kiln.index_cache<64, 32, f16> -> tensor<8xi32>
  return
}

// -----

func.func @dsa_top_k(%q: tensor<4x32xf32>, %w: tensor<4xf32>, %p: tensor<i32>) {
  %ic = kiln.state "ic" : !kiln.index_cache<64, 32, f16>
  // expected-error @+1 {{'kiln.dsa_indexer' op top_k must be positive, got 0}}
  %s, %n = kiln.dsa_indexer %q, %w, %ic[%p] {top_k = 0 : i64, scale = 0.1 : f32} : tensor<4x32xf32>, tensor<4xf32>, !kiln.index_cache<64, 32, f16> -> tensor<8xi32>
  return
}

// -----

func.func @dsa_selected(%q: tensor<4x32xf32>, %w: tensor<4xf32>, %p: tensor<i32>) {
  %ic = kiln.state "ic" : !kiln.index_cache<64, 32, f16>
  // expected-error @+1 {{'kiln.dsa_indexer' op selected must have top_k = 16 entries, got 'tensor<8xi32>'}}
  %s, %n = kiln.dsa_indexer %q, %w, %ic[%p] {top_k = 16 : i64, scale = 0.1 : f32} : tensor<4x32xf32>, tensor<4xf32>, !kiln.index_cache<64, 32, f16> -> tensor<8xi32>
  return
}

// -----

func.func @dsa_scale(%q: tensor<4x32xf32>, %w: tensor<4xf32>, %p: tensor<i32>) {
  %ic = kiln.state "ic" : !kiln.index_cache<64, 32, f16>
  // expected-error @+1 {{'kiln.dsa_indexer' op scale must be positive and finite, got -5.000000e-01}}
  %s, %n = kiln.dsa_indexer %q, %w, %ic[%p] {top_k = 8 : i64, scale = -0.5 : f32} : tensor<4x32xf32>, tensor<4xf32>, !kiln.index_cache<64, 32, f16> -> tensor<8xi32>
  return
}

// -----
// Mixture of experts

func.func @router_gate(%f: tensor<256xf32>, %g: !kiln.qweight<"g", "f32", [128, 16]>) {
  // expected-error @+1 {{'kiln.moe_router' op gate must have dims [256, experts], got '!kiln.qweight<"g", "f32", [128, 16]>'}}
  %i, %w = kiln.moe_router %f, %g {top_k = 4 : i64, gating = "sigmoid", normalize = true, routed_scale = 2.5 : f32} : tensor<256xf32>, !kiln.qweight<"g", "f32", [128, 16]> -> tensor<4xi32>, tensor<4xf32>
  return
}

// -----

func.func @router_bias(%f: tensor<256xf32>, %g: !kiln.qweight<"g", "f32", [256, 16]>, %b: tensor<8xf32>) {
  // expected-error @+1 {{'kiln.moe_router' op bias has 8 values for 16 experts}}
  %i, %w = kiln.moe_router %f, %g, %b {top_k = 4 : i64, gating = "sigmoid", normalize = true, routed_scale = 2.5 : f32} : tensor<256xf32>, !kiln.qweight<"g", "f32", [256, 16]>, tensor<8xf32> -> tensor<4xi32>, tensor<4xf32>
  return
}

// -----

func.func @router_top_k(%f: tensor<256xf32>, %g: !kiln.qweight<"g", "f32", [256, 16]>) {
  // expected-error @+1 {{'kiln.moe_router' op top_k must be between 1 and the 16 experts, got 17}}
  %i, %w = kiln.moe_router %f, %g {top_k = 17 : i64, gating = "sigmoid", normalize = true, routed_scale = 2.5 : f32} : tensor<256xf32>, !kiln.qweight<"g", "f32", [256, 16]> -> tensor<17xi32>, tensor<17xf32>
  return
}

// -----

func.func @router_gating(%f: tensor<256xf32>, %g: !kiln.qweight<"g", "f32", [256, 16]>) {
  // expected-error @+1 {{'kiln.moe_router' op gating must be "sigmoid" or "softmax", got "relu"}}
  %i, %w = kiln.moe_router %f, %g {top_k = 4 : i64, gating = "relu", normalize = true, routed_scale = 2.5 : f32} : tensor<256xf32>, !kiln.qweight<"g", "f32", [256, 16]> -> tensor<4xi32>, tensor<4xf32>
  return
}

// -----

func.func @router_results(%f: tensor<256xf32>, %g: !kiln.qweight<"g", "f32", [256, 16]>) {
  // expected-error @+1 {{'kiln.moe_router' op results must have top_k = 4 entries, got 'tensor<8xi32>'}}
  %i, %w = kiln.moe_router %f, %g {top_k = 4 : i64, gating = "sigmoid", normalize = true, routed_scale = 2.5 : f32} : tensor<256xf32>, !kiln.qweight<"g", "f32", [256, 16]> -> tensor<8xi32>, tensor<4xf32>
  return
}

// -----

func.func @router_scale(%f: tensor<256xf32>, %g: !kiln.qweight<"g", "f32", [256, 16]>) {
  // expected-error @+1 {{'kiln.moe_router' op routed_scale must be positive and finite, got 0}}
  %i, %w = kiln.moe_router %f, %g {top_k = 4 : i64, gating = "sigmoid", normalize = true, routed_scale = 0.0 : f32} : tensor<256xf32>, !kiln.qweight<"g", "f32", [256, 16]> -> tensor<4xi32>, tensor<4xf32>
  return
}

// -----

func.func @experts_weights(%f: tensor<256xf32>, %i: tensor<4xi32>, %w: tensor<2xf32>, %gu: !kiln.qweight<"gu", "q8_0", [256, 512, 16]>, %d: !kiln.qweight<"d", "q8_0", [256, 256, 16]>) {
  // expected-error @+1 {{'kiln.moe_experts' op weights has 2 entries for 4 ids}}
  %y = kiln.moe_experts %f, %i, %w experts(%gu, %d) : tensor<256xf32>, tensor<4xi32>, tensor<2xf32>, !kiln.qweight<"gu", "q8_0", [256, 512, 16]>, !kiln.qweight<"d", "q8_0", [256, 256, 16]> -> tensor<256xf32>
  return
}

// -----

func.func @experts_result(%f: tensor<256xf32>, %i: tensor<4xi32>, %w: tensor<4xf32>, %gu: !kiln.qweight<"gu", "q8_0", [256, 512, 16]>, %d: !kiln.qweight<"d", "q8_0", [256, 256, 16]>) {
  // expected-error @+1 {{'kiln.moe_experts' op result must have the input's type}}
  %y = kiln.moe_experts %f, %i, %w experts(%gu, %d) : tensor<256xf32>, tensor<4xi32>, tensor<4xf32>, !kiln.qweight<"gu", "q8_0", [256, 512, 16]>, !kiln.qweight<"d", "q8_0", [256, 256, 16]> -> tensor<128xf32>
  return
}

// -----

func.func @experts_count(%f: tensor<256xf32>, %i: tensor<4xi32>, %w: tensor<4xf32>, %d: !kiln.qweight<"d", "q8_0", [256, 256, 16]>) {
  // expected-error @+1 {{'kiln.moe_experts' op experts must be (gate, up, down) or (gate_up, down), got 1 weights}}
  %y = kiln.moe_experts %f, %i, %w experts(%d) : tensor<256xf32>, tensor<4xi32>, tensor<4xf32>, !kiln.qweight<"d", "q8_0", [256, 256, 16]> -> tensor<256xf32>
  return
}

// -----

func.func @experts_down(%f: tensor<256xf32>, %i: tensor<4xi32>, %w: tensor<4xf32>, %gu: !kiln.qweight<"gu", "q8_0", [256, 512, 16]>, %d: !kiln.qweight<"d", "q8_0", [256, 128, 16]>) {
  // expected-error @+1 {{'kiln.moe_experts' op down must have dims [ff, 256, experts], got '!kiln.qweight<"d", "q8_0", [256, 128, 16]>'}}
  %y = kiln.moe_experts %f, %i, %w experts(%gu, %d) : tensor<256xf32>, tensor<4xi32>, tensor<4xf32>, !kiln.qweight<"gu", "q8_0", [256, 512, 16]>, !kiln.qweight<"d", "q8_0", [256, 128, 16]> -> tensor<256xf32>
  return
}

// -----

func.func @experts_too_many_ids(%f: tensor<256xf32>, %i: tensor<4xi32>, %w: tensor<4xf32>, %gu: !kiln.qweight<"gu", "q8_0", [256, 512, 2]>, %d: !kiln.qweight<"d", "q8_0", [256, 256, 2]>) {
  // expected-error @+1 {{'kiln.moe_experts' op 4 ids for 2 experts}}
  %y = kiln.moe_experts %f, %i, %w experts(%gu, %d) : tensor<256xf32>, tensor<4xi32>, tensor<4xf32>, !kiln.qweight<"gu", "q8_0", [256, 512, 2]>, !kiln.qweight<"d", "q8_0", [256, 256, 2]> -> tensor<256xf32>
  return
}

// -----

// A fused gate-up tensor must hold both halves: [H, 2F, E].
func.func @experts_gate_up(%f: tensor<256xf32>, %i: tensor<4xi32>, %w: tensor<4xf32>, %gu: !kiln.qweight<"blk.1.ffn_gate_up_exps.weight", "q8_0", [256, 256, 16]>, %d: !kiln.qweight<"d", "q8_0", [256, 256, 16]>) {
  // expected-error @+1 {{'kiln.moe_experts' op blk.1.ffn_gate_up_exps.weight must have dims [256, 512, 16], got '!kiln.qweight<"blk.1.ffn_gate_up_exps.weight", "q8_0", [256, 256, 16]>'}}
  %y = kiln.moe_experts %f, %i, %w experts(%gu, %d) : tensor<256xf32>, tensor<4xi32>, tensor<4xf32>, !kiln.qweight<"blk.1.ffn_gate_up_exps.weight", "q8_0", [256, 256, 16]>, !kiln.qweight<"d", "q8_0", [256, 256, 16]> -> tensor<256xf32>
  return
}

// -----
// Collectives and structure

func.func @all_reduce_kind(%x: tensor<64xf32>) {
  // expected-error @+1 {{'kiln.all_reduce' op reduction must be "sum" or "max", got "mean"}}
  %y = kiln.all_reduce %x {reduction = "mean"} : tensor<64xf32>
  return
}

// -----

func.func @layer_kind(%x: tensor<64xf32>) {
  // expected-error @+1 {{'kiln.layer' op kind must be "dense", "moe" or "mtp", got "sparse"}}
  %y = kiln.layer 0 "sparse" (%x) : tensor<64xf32> {
  ^bb0(%h: tensor<64xf32>):
    kiln.yield %h : tensor<64xf32>
  }
  return
}

// -----

func.func @layer_argument(%x: tensor<64xf32>) {
  // expected-error @+1 {{'kiln.layer' op body must take one argument of type 'tensor<64xf32>'}}
  %y = kiln.layer 0 "dense" (%x) : tensor<64xf32> {
  ^bb0(%h: tensor<32xf32>):
    kiln.yield %x : tensor<64xf32>
  }
  return
}

// -----

func.func @layer_terminator(%x: tensor<64xf32>) {
  // expected-error @+1 {{'kiln.layer' op body must end with kiln.yield}}
  %y = kiln.layer 0 "dense" (%x) : tensor<64xf32> {
  ^bb0(%h: tensor<64xf32>):
    func.return
  }
  return
}

// -----

func.func @layer_yield_type(%x: tensor<64xf32>, %z: tensor<32xf32>) {
  // expected-error @+1 {{'kiln.layer' op yields 'tensor<32xf32>' but the layer returns 'tensor<64xf32>'}}
  %y = kiln.layer 0 "dense" (%x) : tensor<64xf32> {
  ^bb0(%h: tensor<64xf32>):
    kiln.yield %z : tensor<32xf32>
  }
  return
}

// -----

func.func @yield_outside(%x: tensor<64xf32>) {
  // expected-error @+1 {{'kiln.yield' op expects parent op 'kiln.layer'}}
  kiln.yield %x : tensor<64xf32>
}

// -----

func.func @fused_one_weight(%a: tensor<256xf32>, %w: !kiln.qweight<"q.weight", "q8_0", [256, 128]>) -> tensor<128xf32> {
  // expected-error @+1 {{'kiln.fused_linear' op fuses at least 2 projections, got 1}}
  %y = kiln.fused_linear %a weights(%w) {segments = [#kiln.segment<name = "q", offset = 0, rows = 128, format = "q8_0">]} : tensor<256xf32>, !kiln.qweight<"q.weight", "q8_0", [256, 128]> -> tensor<128xf32>
  return %y : tensor<128xf32>
}

// -----

func.func @fused_name(%a: tensor<256xf32>, %w1: !kiln.qweight<"q.weight", "q8_0", [256, 128]>, %w2: !kiln.qweight<"kv.weight", "q8_0", [256, 80]>) -> tensor<208xf32> {
  // expected-error @+1 {{'kiln.fused_linear' op segment 1 is named 'q' but weight 1 is 'kv.weight'}}
  %y = kiln.fused_linear %a weights(%w1, %w2) {segments = [#kiln.segment<name = "q", offset = 0, rows = 128, format = "q8_0">, #kiln.segment<name = "q", offset = 128, rows = 80, format = "q8_0">]} : tensor<256xf32>, !kiln.qweight<"q.weight", "q8_0", [256, 128]>, !kiln.qweight<"kv.weight", "q8_0", [256, 80]> -> tensor<208xf32>
  return %y : tensor<208xf32>
}

// -----

// The map must follow the weights: a file-order swap of the offsets is refused.
func.func @fused_offsets(%a: tensor<256xf32>, %w1: !kiln.qweight<"q.weight", "q8_0", [256, 128]>, %w2: !kiln.qweight<"kv.weight", "q8_0", [256, 80]>) -> tensor<208xf32> {
  // expected-error @+1 {{'kiln.fused_linear' op segment 0 must cover rows [0, 128), got [80, 208)}}
  %y = kiln.fused_linear %a weights(%w1, %w2) {segments = [#kiln.segment<name = "q", offset = 80, rows = 128, format = "q8_0">, #kiln.segment<name = "kv", offset = 0, rows = 80, format = "q8_0">]} : tensor<256xf32>, !kiln.qweight<"q.weight", "q8_0", [256, 128]>, !kiln.qweight<"kv.weight", "q8_0", [256, 80]> -> tensor<208xf32>
  return %y : tensor<208xf32>
}

// -----

func.func @fused_format(%a: tensor<256xf32>, %w1: !kiln.qweight<"q.weight", "q8_0", [256, 128]>, %w2: !kiln.qweight<"kv.weight", "f16", [256, 80]>) -> tensor<208xf32> {
  // expected-error @+1 {{'kiln.fused_linear' op segment 1 says format 'q8_0' but its weight is 'f16'}}
  %y = kiln.fused_linear %a weights(%w1, %w2) {segments = [#kiln.segment<name = "q", offset = 0, rows = 128, format = "q8_0">, #kiln.segment<name = "kv", offset = 128, rows = 80, format = "q8_0">]} : tensor<256xf32>, !kiln.qweight<"q.weight", "q8_0", [256, 128]>, !kiln.qweight<"kv.weight", "f16", [256, 80]> -> tensor<208xf32>
  return %y : tensor<208xf32>
}

// -----

func.func @fused_k(%a: tensor<256xf32>, %w1: !kiln.qweight<"q.weight", "q8_0", [256, 128]>, %w2: !kiln.qweight<"kv.weight", "q8_0", [128, 80]>) -> tensor<208xf32> {
  // expected-error @+1 {{'kiln.fused_linear' op weight 1 must be [256, N], got '!kiln.qweight<"kv.weight", "q8_0", [128, 80]>'}}
  %y = kiln.fused_linear %a weights(%w1, %w2) {segments = [#kiln.segment<name = "q", offset = 0, rows = 128, format = "q8_0">, #kiln.segment<name = "kv", offset = 128, rows = 80, format = "q8_0">]} : tensor<256xf32>, !kiln.qweight<"q.weight", "q8_0", [256, 128]>, !kiln.qweight<"kv.weight", "q8_0", [128, 80]> -> tensor<208xf32>
  return %y : tensor<208xf32>
}

// -----

func.func @fused_result(%a: tensor<256xf32>, %w1: !kiln.qweight<"q.weight", "q8_0", [256, 128]>, %w2: !kiln.qweight<"kv.weight", "q8_0", [256, 80]>) -> tensor<200xf32> {
  // expected-error @+1 {{'kiln.fused_linear' op result must be 'tensor<208xf32>', got 'tensor<200xf32>'}}
  %y = kiln.fused_linear %a weights(%w1, %w2) {segments = [#kiln.segment<name = "q", offset = 0, rows = 128, format = "q8_0">, #kiln.segment<name = "kv", offset = 128, rows = 80, format = "q8_0">]} : tensor<256xf32>, !kiln.qweight<"q.weight", "q8_0", [256, 128]>, !kiln.qweight<"kv.weight", "q8_0", [256, 80]> -> tensor<200xf32>
  return %y : tensor<200xf32>
}

// -----

// A negative top_k is refused, not read as a huge unsigned count.
func.func @router_negative_top_k(%x: tensor<256xf32>, %g: !kiln.qweight<"g.weight", "f32", [256, 16]>) -> (tensor<4xi32>, tensor<4xf32>) {
  // expected-error @+1 {{'kiln.moe_router' op top_k must be between 1 and the 16 experts, got -1}}
  %ids, %w = kiln.moe_router %x, %g {gating = "sigmoid", normalize = true, routed_scale = 1.0 : f32, top_k = -1 : i64} : tensor<256xf32>, !kiln.qweight<"g.weight", "f32", [256, 16]> -> tensor<4xi32>, tensor<4xf32>
  return %ids, %w : tensor<4xi32>, tensor<4xf32>
}

// -----

// tp_split names one of the tensor's dims.
func.func @weight_split_dim() {
  // expected-error @+1 {{'kiln.weight' op tensor 'w.weight': tp_split 2 is not one of its 2 dims}}
  %w = kiln.weight {tp_split = 2 : i64} : !kiln.qweight<"w.weight", "q8_0", [256, 128]>
  return
}

// -----

func.func @weight_groups_without_split() {
  // expected-error @+1 {{'kiln.weight' op tp_groups without tp_split}}
  %w = kiln.weight {tp_groups = 2 : i64} : !kiln.qweight<"w.weight", "q8_0", [256, 128]>
  return
}

// -----

func.func @weight_groups_positive() {
  // expected-error @+1 {{'kiln.weight' op tensor 'w.weight': tp_groups 0 is not a positive count}}
  %w = kiln.weight {tp_split = 1 : i64, tp_groups = 0 : i64} : !kiln.qweight<"w.weight", "q8_0", [256, 128]>
  return
}

// -----

// A part already split carries no split still to make.
func.func @weight_split_twice() {
  // expected-error @+1 {{'kiln.weight' op tensor 'w.weight' is already split (shard = 1 of 2) and still carries tp_split}}
  %w = kiln.weight {tp_split = 1 : i64} : !kiln.qweight<"w.weight", "q8_0", [256, 64], shard = 1 of 2>
  return
}

// -----

// A row cut must be inside its period and whole periods of dim 1.
func.func @weight_bad_row_cut() {
  // expected-error @+1 {{weight 'w.weight': rows 0 to 24 of 32 is not a cut of every period of dim 1 that divides its 100 rows}}
  %w = kiln.weight : !kiln.qweight<"w.weight", "f32", [64, 100], rows = 0 to 24 of 32>
  return
}

// -----

func.func @weight_row_cut_past_period() {
  // expected-error @+1 {{rows 16 to 40 of 32 is not a cut}}
  %w = kiln.weight : !kiln.qweight<"w.weight", "f32", [64, 96], rows = 16 to 40 of 32>
  return
}

// -----

// The optional parts are the three the type has.
func.func @weight_unknown_part() {
  // expected-error @+1 {{expected 'shard', 'groups' or 'rows'}}
  %w = kiln.weight : !kiln.qweight<"w.weight", "f32", [64, 96], cols = 1>
  return
}
