// RUN: kiln-opt %s --kiln-fold-dequant | FileCheck %s --implicit-check-not=kiln.dequant
// RUN: kiln-opt %s --kiln-fold-dequant --kiln-lower-to-step | FileCheck %s --check-prefix=STEP --implicit-check-not=step.dequant

// Norm weights, norm biases and the router's selection bias are read by
// their ops from the weight handle: no dequantised copy is left. A dequant
// with another user keeps that user (and only that one).

// CHECK-LABEL: func.func @norms_and_router
func.func @norms_and_router(%x: tensor<256xf32>, %k: tensor<32xf32>)
    -> (tensor<256xf32>, tensor<32xf32>, tensor<4xi32>, tensor<4xf32>) {
  // CHECK: %[[NW:.+]] = kiln.weight : !kiln.qweight<"blk.0.attn_norm.weight", "f32", [256]>
  // CHECK: kiln.rms_norm %{{.+}}, %[[NW]] {epsilon = {{.+}}} : tensor<256xf32>, !kiln.qweight<"blk.0.attn_norm.weight", "f32", [256]>
  %nw = kiln.weight : !kiln.qweight<"blk.0.attn_norm.weight", "f32", [256]>
  %nwd = kiln.dequant %nw : !kiln.qweight<"blk.0.attn_norm.weight", "f32", [256]> -> tensor<256xf32>
  %n = kiln.rms_norm %x, %nwd {epsilon = 1.0e-05 : f32} : tensor<256xf32>, tensor<256xf32>
  // CHECK: kiln.layer_norm %{{.+}}, %[[KW:.+]], %[[KB:.+]] {epsilon = {{.+}}} : tensor<32xf32>, !kiln.qweight<"blk.0.indexer.k_norm.weight", "f32", [32]>, !kiln.qweight<"blk.0.indexer.k_norm.bias", "f32", [32]>
  %kw = kiln.weight : !kiln.qweight<"blk.0.indexer.k_norm.weight", "f32", [32]>
  %kwd = kiln.dequant %kw : !kiln.qweight<"blk.0.indexer.k_norm.weight", "f32", [32]> -> tensor<32xf32>
  %kb = kiln.weight : !kiln.qweight<"blk.0.indexer.k_norm.bias", "f32", [32]>
  %kbd = kiln.dequant %kb : !kiln.qweight<"blk.0.indexer.k_norm.bias", "f32", [32]> -> tensor<32xf32>
  %kn = kiln.layer_norm %k, %kwd, %kbd {epsilon = 1.0e-06 : f32} : tensor<32xf32>, tensor<32xf32>, tensor<32xf32>
  // CHECK: kiln.moe_router %{{.+}}, %{{.+}}, %{{.+}} {{.+}} : tensor<256xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [256, 16]>, !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [16]> -> tensor<4xi32>, tensor<4xf32>
  %gate = kiln.weight : !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [256, 16]>
  %bias = kiln.weight : !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [16]>
  %biasd = kiln.dequant %bias : !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [16]> -> tensor<16xf32>
  %ids, %w = kiln.moe_router %n, %gate, %biasd {gating = "sigmoid", normalize = true, routed_scale = 2.5 : f32, top_k = 4 : i64} : tensor<256xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [256, 16]>, tensor<16xf32> -> tensor<4xi32>, tensor<4xf32>
  return %n, %kn, %ids, %w : tensor<256xf32>, tensor<32xf32>, tensor<4xi32>, tensor<4xf32>
}

// A dequant also used as a value (here, added to the stream) stays for
// that use; the norm still reads the handle.
// CHECK-LABEL: func.func @other_use
// CHECK: %[[D:.+]] = kiln.dequant
// CHECK: kiln.rms_norm %{{.+}}, %{{.+}} {{.+}} : tensor<256xf32>, !kiln.qweight
// CHECK: kiln.add %{{.+}}, %[[D]]
func.func @other_use(%x: tensor<256xf32>) -> tensor<256xf32> {
  %nw = kiln.weight : !kiln.qweight<"blk.0.attn_norm.weight", "f32", [256]>
  %nwd = kiln.dequant %nw : !kiln.qweight<"blk.0.attn_norm.weight", "f32", [256]> -> tensor<256xf32>
  %n = kiln.rms_norm %x, %nwd {epsilon = 1.0e-05 : f32} : tensor<256xf32>, tensor<256xf32>
  %y = kiln.add %n, %nwd : tensor<256xf32>
  return %y : tensor<256xf32>
}

// STEP-LABEL: func.func @norms_and_router()
// STEP: step.rms_norm ins(%{{.+}}, %blk.0.attn_norm : memref<256xf32>, !kiln.qweight<"blk.0.attn_norm.weight", "f32", [256]>)
// STEP: step.layer_norm ins(%{{.+}}, %blk.0.indexer.k_norm, %blk.0.indexer.k_norm.bias : memref<32xf32>, !kiln.qweight<{{.+}}>, !kiln.qweight<{{.+}}>)
// STEP: step.moe_router ins(%{{.+}}, %blk.1.ffn_gate_inp, %blk.1.exp_probs_b.bias : {{.+}})
// STEP-LABEL: func.func @other_use()
// STEP: step.dequant
