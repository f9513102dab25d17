// RUN: kiln-opt %s | FileCheck %s
// RUN: kiln-opt %s | kiln-opt | FileCheck %s
// RUN: kiln-opt %s --mlir-print-op-generic | kiln-opt | FileCheck %s

// Round trip of every kiln op through the custom assembly format, and through
// the generic form (which checks the parser against the printer's attributes).

// CHECK-LABEL: func.func @residual_norm
// CHECK-SAME: (%[[X:.+]]: tensor<6144xf32>, %[[D:.+]]: tensor<6144xf32>, %[[W:.+]]: tensor<6144xf32>)
func.func @residual_norm(%x: tensor<6144xf32>, %delta: tensor<6144xf32>,
                         %w: tensor<6144xf32>) -> tensor<6144xf32> {
  // CHECK: %[[SUM:.+]] = kiln.add %[[X]], %[[D]] : tensor<6144xf32>
  %sum = kiln.add %x, %delta : tensor<6144xf32>
  // CHECK: kiln.rms_norm %[[SUM]], %[[W]] {epsilon = 9.99999974E-6 : f32} : tensor<6144xf32>, tensor<6144xf32>
  %n = kiln.rms_norm %sum, %w {epsilon = 1.0e-05 : f32} : tensor<6144xf32>, tensor<6144xf32>
  return %n : tensor<6144xf32>
}

// CHECK-LABEL: func.func @norm_batched_bf16
// CHECK: kiln.rms_norm %{{.+}}, %{{.+}} {epsilon = 9.99999997E-7 : f32} : tensor<4x128xbf16>, tensor<128xbf16>
func.func @norm_batched_bf16(%x: tensor<4x128xbf16>, %w: tensor<128xbf16>) -> tensor<4x128xbf16> {
  %n = kiln.rms_norm %x, %w {epsilon = 1.0e-06 : f32} : tensor<4x128xbf16>, tensor<128xbf16>
  return %n : tensor<4x128xbf16>
}

// CHECK-LABEL: func.func @gate
// CHECK-SAME: (%[[G:.+]]: tensor<12288xf16>, %[[U:.+]]: tensor<12288xf16>)
// CHECK: kiln.swiglu %[[G]], %[[U]] : tensor<12288xf16>
func.func @gate(%g: tensor<12288xf16>, %u: tensor<12288xf16>) -> tensor<12288xf16> {
  %h = kiln.swiglu %g, %u : tensor<12288xf16>
  return %h : tensor<12288xf16>
}

// CHECK-LABEL: func.func @greedy
// CHECK: %[[T:.+]] = kiln.argmax %{{.+}} : tensor<154880xf32>
// CHECK: return %[[T]] : tensor<i32>
func.func @greedy(%logits: tensor<154880xf32>) -> tensor<i32> {
  %t = kiln.argmax %logits : tensor<154880xf32>
  return %t : tensor<i32>
}

// CHECK-LABEL: func.func @drawn
// CHECK: kiln.argmax %{{.+}} sampled %{{.+}} : tensor<8xi32> at %{{.+}} : tensor<154880xf32>
// CHECK: kiln.distributed_argmax %{{.+}} sampled %{{.+}} : tensor<8xi32> at %{{.+}} {ranks = 8 : i64} : tensor<19360xf32>
// The adjusting form: 16 words and 3 an adjusted token (DrawKey.h).
// CHECK: kiln.argmax %{{.+}} sampled %{{.+}} : tensor<25xi32> at %{{.+}} : tensor<154880xf32>
func.func @drawn(%logits: tensor<154880xf32>, %part: tensor<19360xf32>,
                 %words: tensor<8xi32>, %adjusting: tensor<25xi32>,
                 %pos: tensor<i32>) -> (tensor<i32>, tensor<i32>, tensor<i32>) {
  %t = kiln.argmax %logits sampled %words : tensor<8xi32> at %pos : tensor<154880xf32>
  %d = kiln.distributed_argmax %part sampled %words : tensor<8xi32> at %pos {ranks = 8 : i64} : tensor<19360xf32>
  %a = kiln.argmax %logits sampled %adjusting : tensor<25xi32> at %pos : tensor<154880xf32>
  return %t, %d, %a : tensor<i32>, tensor<i32>, tensor<i32>
}

// -----
// Weights, state and the model-level ops of a GLM-5 layer (tiny dims).

// CHECK-LABEL: func.func @weights_and_state
func.func @weights_and_state(%token: tensor<i32>, %pos: tensor<i32>) -> tensor<256xf32> {
  // CHECK: %[[EMB:token_embd]] = kiln.weight : !kiln.qweight<"token_embd.weight", "q8_0", [256, 1024]>
  %emb = kiln.weight : !kiln.qweight<"token_embd.weight", "q8_0", [256, 1024]>
  // CHECK: %[[X:.+]] = kiln.embed %[[EMB]][%{{.+}}] : !kiln.qweight<"token_embd.weight", "q8_0", [256, 1024]> -> tensor<256xf32>
  %x = kiln.embed %emb[%token] : !kiln.qweight<"token_embd.weight", "q8_0", [256, 1024]> -> tensor<256xf32>
  // CHECK: %[[NW:.+]] = kiln.weight : !kiln.qweight<"blk.0.attn_norm.weight", "f32", [256]>
  %nw = kiln.weight : !kiln.qweight<"blk.0.attn_norm.weight", "f32", [256]>
  // CHECK: kiln.dequant %[[NW]] : !kiln.qweight<"blk.0.attn_norm.weight", "f32", [256]> -> tensor<256xf32>
  %n = kiln.dequant %nw : !kiln.qweight<"blk.0.attn_norm.weight", "f32", [256]> -> tensor<256xf32>
  // CHECK: %[[KV:blk.0.kv_cache]] = kiln.state "blk.0.kv_cache" : !kiln.latent_cache<4096, 64, 16, f16>
  %kv = kiln.state "blk.0.kv_cache" : !kiln.latent_cache<4096, 64, 16, f16>
  // CHECK: kiln.state "blk.0.index_cache" : !kiln.index_cache<4096, 32, bf16>
  %ic = kiln.state "blk.0.index_cache" : !kiln.index_cache<4096, 32, bf16>
  // CHECK: kiln.layer 0 "dense"(%[[X]]) : tensor<256xf32> {
  // CHECK-NEXT: ^bb0(%[[H:x]]: tensor<256xf32>):
  %y = kiln.layer 0 "dense" (%x) : tensor<256xf32> {
  ^bb0(%h: tensor<256xf32>):
    // CHECK: kiln.yield %[[H]] : tensor<256xf32>
    kiln.yield %h : tensor<256xf32>
  }
  return %y : tensor<256xf32>
}

// CHECK-LABEL: func.func @projections
func.func @projections(%a: tensor<256xf32>, %q: tensor<8x32xf32>, %b: tensor<4x256xbf16>) -> (tensor<128xf32>, tensor<8x64xf32>, tensor<4x128xbf16>) {
  %wa = kiln.weight : !kiln.qweight<"blk.0.attn_q_a.weight", "q4_k", [256, 128]>
  // CHECK: kiln.linear %{{.+}}, %{{.+}} : tensor<256xf32>, !kiln.qweight<"blk.0.attn_q_a.weight", "q4_k", [256, 128]> -> tensor<128xf32>
  %y = kiln.linear %a, %wa : tensor<256xf32>, !kiln.qweight<"blk.0.attn_q_a.weight", "q4_k", [256, 128]> -> tensor<128xf32>
  %kb = kiln.weight : !kiln.qweight<"blk.0.attn_k_b.weight", "q5_0", [32, 64, 8]>
  // CHECK: kiln.linear %{{.+}}, %{{.+}} : tensor<8x32xf32>, !kiln.qweight<"blk.0.attn_k_b.weight", "q5_0", [32, 64, 8]> -> tensor<8x64xf32>
  %z = kiln.linear %q, %kb : tensor<8x32xf32>, !kiln.qweight<"blk.0.attn_k_b.weight", "q5_0", [32, 64, 8]> -> tensor<8x64xf32>
  // A batch of rows through one matrix.
  // CHECK: kiln.linear %{{.+}}, %{{.+}} : tensor<4x256xbf16>, !kiln.qweight<"blk.0.attn_q_a.weight", "q4_k", [256, 128]> -> tensor<4x128xbf16>
  %w = kiln.linear %b, %wa : tensor<4x256xbf16>, !kiln.qweight<"blk.0.attn_q_a.weight", "q4_k", [256, 128]> -> tensor<4x128xbf16>
  return %y, %z, %w : tensor<128xf32>, tensor<8x64xf32>, tensor<4x128xbf16>
}

// CHECK-LABEL: func.func @norms_and_rope
func.func @norms_and_rope(%k: tensor<32xf32>, %w: tensor<32xf32>, %b: tensor<32xf32>, %q: tensor<8x48xf32>, %pos: tensor<i32>) -> (tensor<32xf32>, tensor<8x48xf32>) {
  // CHECK: kiln.layer_norm %{{.+}}, %{{.+}}, %{{.+}} {epsilon = 9.99999997E-7 : f32} : tensor<32xf32>, tensor<32xf32>, tensor<32xf32>
  %n = kiln.layer_norm %k, %w, %b {epsilon = 1.0e-06 : f32} : tensor<32xf32>, tensor<32xf32>, tensor<32xf32>
  // CHECK: kiln.rope %{{.+}}[%{{.+}}] {dims = 16 : i64, offset = 32 : i64, style = "interleaved", theta = 1.000000e+06 : f32} : tensor<8x48xf32>
  %r = kiln.rope %q[%pos] {style = "interleaved", theta = 1.0e+06 : f32, offset = 32 : i64, dims = 16 : i64} : tensor<8x48xf32>
  return %n, %r : tensor<32xf32>, tensor<8x48xf32>
}

// CHECK-LABEL: func.func @attention
func.func @attention(%entry: tensor<80xf32>, %key: tensor<32xf32>, %ql: tensor<8x64xf32>, %qr: tensor<8x16xf32>, %qi: tensor<4x32xf32>, %hw: tensor<4xf32>, %pos: tensor<i32>) -> (tensor<8x64xf32>, tensor<8x64xf32>) {
  %kv = kiln.state "blk.0.kv_cache" : !kiln.latent_cache<4096, 64, 16, f16>
  %ic = kiln.state "blk.0.index_cache" : !kiln.index_cache<4096, 32, f16>
  // CHECK: kiln.cache_append %{{.+}}[%{{.+}}], %{{.+}} : !kiln.latent_cache<4096, 64, 16, f16>, tensor<80xf32>
  kiln.cache_append %kv[%pos], %entry : !kiln.latent_cache<4096, 64, 16, f16>, tensor<80xf32>
  // CHECK: kiln.cache_append %{{.+}}[%{{.+}}], %{{.+}} : !kiln.index_cache<4096, 32, f16>, tensor<32xf32>
  kiln.cache_append %ic[%pos], %key : !kiln.index_cache<4096, 32, f16>, tensor<32xf32>
  // CHECK: %[[SEL:.+]], %[[N:.+]] = kiln.dsa_indexer %{{.+}}, %{{.+}}, %{{.+}}[%{{.+}}] {scale = 0.0883883461 : f32, top_k = 32 : i64} : tensor<4x32xf32>, tensor<4xf32>, !kiln.index_cache<4096, 32, f16> -> tensor<32xi32>
  %sel, %n = kiln.dsa_indexer %qi, %hw, %ic[%pos] {top_k = 32 : i64, scale = 0.0883883461 : f32} : tensor<4x32xf32>, tensor<4xf32>, !kiln.index_cache<4096, 32, f16> -> tensor<32xi32>
  // CHECK: kiln.mla_attention %{{.+}}, %{{.+}}, %{{.+}}[%{{.+}}] select(%[[SEL]], %[[N]]) {scale = 1.250000e-01 : f32} : tensor<8x64xf32>, tensor<8x16xf32>, !kiln.latent_cache<4096, 64, 16, f16>, tensor<32xi32> -> tensor<8x64xf32>
  %o = kiln.mla_attention %ql, %qr, %kv[%pos] select(%sel, %n) {scale = 0.125 : f32} : tensor<8x64xf32>, tensor<8x16xf32>, !kiln.latent_cache<4096, 64, 16, f16>, tensor<32xi32> -> tensor<8x64xf32>
  // Dense attention (no selection).
  // CHECK: kiln.mla_attention %{{.+}}, %{{.+}}, %{{.+}}[%{{.+}}] {scale = 1.250000e-01 : f32} : tensor<8x64xf32>, tensor<8x16xf32>, !kiln.latent_cache<4096, 64, 16, f16> -> tensor<8x64xf32>
  %d = kiln.mla_attention %ql, %qr, %kv[%pos] {scale = 0.125 : f32} : tensor<8x64xf32>, tensor<8x16xf32>, !kiln.latent_cache<4096, 64, 16, f16> -> tensor<8x64xf32>
  return %o, %d : tensor<8x64xf32>, tensor<8x64xf32>
}

// CHECK-LABEL: func.func @moe
func.func @moe(%f: tensor<256xf32>, %bias: tensor<16xf32>) -> (tensor<256xf32>, tensor<256xf32>, tensor<256xf32>) {
  %gi = kiln.weight : !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [256, 16]>
  // CHECK: %[[IDS:.+]], %[[W:.+]] = kiln.moe_router %{{.+}}, %{{.+}}, %{{.+}} {gating = "sigmoid", normalize = true, routed_scale = 2.500000e+00 : f32, top_k = 4 : i64} : tensor<256xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [256, 16]>, tensor<16xf32> -> tensor<4xi32>, tensor<4xf32>
  %ids, %w = kiln.moe_router %f, %gi, %bias {top_k = 4 : i64, gating = "sigmoid", normalize = true, routed_scale = 2.5 : f32} : tensor<256xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [256, 16]>, tensor<16xf32> -> tensor<4xi32>, tensor<4xf32>
  // Without the selection bias.
  // CHECK: kiln.moe_router %{{.+}}, %{{.+}} {gating = "softmax", normalize = false, routed_scale = 1.000000e+00 : f32, top_k = 4 : i64} : tensor<256xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [256, 16]> -> tensor<4xi32>, tensor<4xf32>
  %ids2, %w2 = kiln.moe_router %f, %gi {top_k = 4 : i64, gating = "softmax", normalize = false, routed_scale = 1.0 : f32} : tensor<256xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [256, 16]> -> tensor<4xi32>, tensor<4xf32>
  %g = kiln.weight : !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q4_k", [256, 256, 16]>
  %u = kiln.weight : !kiln.qweight<"blk.1.ffn_up_exps.weight", "q4_k", [256, 256, 16]>
  %d = kiln.weight : !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [256, 256, 16]>
  // CHECK: kiln.moe_experts %{{.+}}, %[[IDS]], %[[W]] experts(%{{.+}}, %{{.+}}, %{{.+}}) : tensor<256xf32>, tensor<4xi32>, tensor<4xf32>, !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q4_k", [256, 256, 16]>, !kiln.qweight<"blk.1.ffn_up_exps.weight", "q4_k", [256, 256, 16]>, !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [256, 256, 16]> -> tensor<256xf32>
  %y = kiln.moe_experts %f, %ids, %w experts(%g, %u, %d) : tensor<256xf32>, tensor<4xi32>, tensor<4xf32>, !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q4_k", [256, 256, 16]>, !kiln.qweight<"blk.1.ffn_up_exps.weight", "q4_k", [256, 256, 16]>, !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [256, 256, 16]> -> tensor<256xf32>
  %gu = kiln.weight : !kiln.qweight<"blk.1.ffn_gate_up_exps.weight", "q4_k", [256, 512, 16]>
  // The fused gate-up form.
  // CHECK: kiln.moe_experts {{.+}} experts(%{{.+}}, %{{.+}}) : {{.+}}"blk.1.ffn_gate_up_exps.weight", "q4_k", [256, 512, 16]>
  %z = kiln.moe_experts %f, %ids, %w experts(%gu, %d) : tensor<256xf32>, tensor<4xi32>, tensor<4xf32>, !kiln.qweight<"blk.1.ffn_gate_up_exps.weight", "q4_k", [256, 512, 16]>, !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [256, 256, 16]> -> tensor<256xf32>
  // CHECK: kiln.all_reduce %{{.+}} {reduction = "sum"} : tensor<256xf32>
  %r = kiln.all_reduce %y {reduction = "sum"} : tensor<256xf32>
  return %y, %z, %r : tensor<256xf32>, tensor<256xf32>, tensor<256xf32>
}
