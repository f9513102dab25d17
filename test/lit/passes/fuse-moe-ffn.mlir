// RUN: kiln-opt %s --split-input-file --kiln-fuse-moe-ffn | FileCheck %s
// RUN: kiln-opt %s --split-input-file --kiln-fuse-moe-ffn | kiln-opt --split-input-file | FileCheck %s

// The FFN half of an MoE layer as the lowering and the earlier fusions
// leave it (GLM-5: router, the shared expert's gate/up and down, the
// experts with the shared output as addend) becomes one step.moe_ffn where
// the experts were; the ids, the weights, the projection, its views and
// the shared output go. Not checked here: that the fused op computes what
// the four did (test_fusion.py compares the CPU backend's logits).

// CHECK-LABEL: func.func @moe_layer
// CHECK-NOT: step.moe_router
// CHECK-NOT: step.fused_linear
// CHECK-NOT: step.view
// CHECK-NOT: step.swiglu_linear
// CHECK-NOT: step.buffer
// CHECK: step.moe_ffn ins(%x : memref<64xf32>) router(%blk.1.ffn_gate_inp : {{.+}}) shared(%blk.1.ffn_gate_shexp, %blk.1.ffn_up_shexp, %blk.1.ffn_down_shexp : {{.+}}) experts(%blk.1.ffn_gate_exps, %blk.1.ffn_up_exps, %blk.1.ffn_down_exps : {{.+}}) bias(%blk.1.exp_probs_b.bias : !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [4]>) outs(%y : memref<64xf32>) {gating = "sigmoid", normalize = true, routed_scale = 2.500000e+00 : f32, top_k = 2 : i64}
// CHECK-NEXT: return
func.func @moe_layer() {
  %x = step.input "x" : memref<64xf32>
  %y = step.output "y" : memref<64xf32>
  %router = step.weight : !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [64, 4]>
  %bias = step.weight : !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [4]>
  %ge = step.weight : !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q8_0", [64, 32, 4]>
  %ue = step.weight : !kiln.qweight<"blk.1.ffn_up_exps.weight", "q8_0", [64, 32, 4]>
  %de = step.weight : !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [32, 64, 4]>
  %gs = step.weight : !kiln.qweight<"blk.1.ffn_gate_shexp.weight", "q8_0", [64, 32]>
  %us = step.weight : !kiln.qweight<"blk.1.ffn_up_shexp.weight", "q8_0", [64, 32]>
  %ds = step.weight : !kiln.qweight<"blk.1.ffn_down_shexp.weight", "q8_0", [32, 64]>
  %ids = step.buffer "ids" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  step.moe_router ins(%x, %router, %bias : memref<64xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [64, 4]>, !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [4]>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "sigmoid", normalize = true, routed_scale = 2.5 : f32, top_k = 2 : i64}
  %gu = step.buffer "gu" : memref<64xf32>
  step.fused_linear ins(%x, %gs, %us : memref<64xf32>, !kiln.qweight<"blk.1.ffn_gate_shexp.weight", "q8_0", [64, 32]>, !kiln.qweight<"blk.1.ffn_up_shexp.weight", "q8_0", [64, 32]>) outs(%gu : memref<64xf32>) {segments = [#kiln.segment<name = "blk.1.ffn_gate_shexp", offset = 0, rows = 32, format = "q8_0">, #kiln.segment<name = "blk.1.ffn_up_shexp", offset = 32, rows = 32, format = "q8_0">]}
  %g = step.view %gu[0] : memref<64xf32> to memref<32xf32>
  %u = step.view %gu[32] : memref<64xf32> to memref<32xf32>
  %s = step.buffer "s" : memref<64xf32>
  step.swiglu_linear ins(%g, %u, %ds : memref<32xf32>, memref<32xf32>, !kiln.qweight<"blk.1.ffn_down_shexp.weight", "q8_0", [32, 64]>) outs(%s : memref<64xf32>)
  step.moe_experts ins(%x, %ids, %w, %ge, %ue, %de : memref<64xf32>, memref<2xi32>, memref<2xf32>, !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"blk.1.ffn_up_exps.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [32, 64, 4]>) addend(%s : memref<64xf32>) outs(%y : memref<64xf32>)
  return
}

// -----

// A fused gate_up of the experts, no selection bias.
// CHECK-LABEL: func.func @fused_gate_up_no_bias
// CHECK: step.moe_ffn ins(%x : memref<64xf32>) router(%blk.1.ffn_gate_inp : {{.+}}) shared({{.+}}) experts(%blk.1.ffn_gate_up_exps, %blk.1.ffn_down_exps : !kiln.qweight<"blk.1.ffn_gate_up_exps.weight", "q8_0", [64, 64, 4]>, !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [32, 64, 4]>) outs(%y : memref<64xf32>) {gating
// CHECK-NEXT: return
func.func @fused_gate_up_no_bias() {
  %x = step.input "x" : memref<64xf32>
  %y = step.output "y" : memref<64xf32>
  %router = step.weight : !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [64, 4]>
  %gue = step.weight : !kiln.qweight<"blk.1.ffn_gate_up_exps.weight", "q8_0", [64, 64, 4]>
  %de = step.weight : !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [32, 64, 4]>
  %gs = step.weight : !kiln.qweight<"blk.1.ffn_gate_shexp.weight", "q8_0", [64, 32]>
  %us = step.weight : !kiln.qweight<"blk.1.ffn_up_shexp.weight", "q8_0", [64, 32]>
  %ds = step.weight : !kiln.qweight<"blk.1.ffn_down_shexp.weight", "q8_0", [32, 64]>
  %ids = step.buffer "ids" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  step.moe_router ins(%x, %router : memref<64xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [64, 4]>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "sigmoid", normalize = true, routed_scale = 2.5 : f32, top_k = 2 : i64}
  %gu = step.buffer "gu" : memref<64xf32>
  step.fused_linear ins(%x, %gs, %us : memref<64xf32>, !kiln.qweight<"blk.1.ffn_gate_shexp.weight", "q8_0", [64, 32]>, !kiln.qweight<"blk.1.ffn_up_shexp.weight", "q8_0", [64, 32]>) outs(%gu : memref<64xf32>) {segments = [#kiln.segment<name = "blk.1.ffn_gate_shexp", offset = 0, rows = 32, format = "q8_0">, #kiln.segment<name = "blk.1.ffn_up_shexp", offset = 32, rows = 32, format = "q8_0">]}
  %g = step.view %gu[0] : memref<64xf32> to memref<32xf32>
  %u = step.view %gu[32] : memref<64xf32> to memref<32xf32>
  %s = step.buffer "s" : memref<64xf32>
  step.swiglu_linear ins(%g, %u, %ds : memref<32xf32>, memref<32xf32>, !kiln.qweight<"blk.1.ffn_down_shexp.weight", "q8_0", [32, 64]>) outs(%s : memref<64xf32>)
  step.moe_experts ins(%x, %ids, %w, %gue, %de : memref<64xf32>, memref<2xi32>, memref<2xf32>, !kiln.qweight<"blk.1.ffn_gate_up_exps.weight", "q8_0", [64, 64, 4]>, !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [32, 64, 4]>) addend(%s : memref<64xf32>) outs(%y : memref<64xf32>)
  return
}

// -----

// Not fused: an intermediate another op reads (the ids, the shared
// expert's output, the projection, one of its halves).
// CHECK-LABEL: func.func @ids_read_again
// CHECK: step.moe_router
// CHECK: step.fused_linear
// CHECK: step.swiglu_linear
// CHECK: step.moe_experts
// CHECK-NOT: step.moe_ffn
func.func @ids_read_again() {
  %x = step.input "x" : memref<64xf32>
  %y = step.output "y" : memref<64xf32>
  %z = step.output "z" : memref<2xi32>
  %router = step.weight : !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [64, 4]>
  %bias = step.weight : !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [4]>
  %ge = step.weight : !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q8_0", [64, 32, 4]>
  %ue = step.weight : !kiln.qweight<"blk.1.ffn_up_exps.weight", "q8_0", [64, 32, 4]>
  %de = step.weight : !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [32, 64, 4]>
  %gs = step.weight : !kiln.qweight<"blk.1.ffn_gate_shexp.weight", "q8_0", [64, 32]>
  %us = step.weight : !kiln.qweight<"blk.1.ffn_up_shexp.weight", "q8_0", [64, 32]>
  %ds = step.weight : !kiln.qweight<"blk.1.ffn_down_shexp.weight", "q8_0", [32, 64]>
  %ids = step.buffer "ids" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  step.moe_router ins(%x, %router, %bias : memref<64xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [64, 4]>, !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [4]>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "sigmoid", normalize = true, routed_scale = 2.5 : f32, top_k = 2 : i64}
  %gu = step.buffer "gu" : memref<64xf32>
  step.fused_linear ins(%x, %gs, %us : memref<64xf32>, !kiln.qweight<"blk.1.ffn_gate_shexp.weight", "q8_0", [64, 32]>, !kiln.qweight<"blk.1.ffn_up_shexp.weight", "q8_0", [64, 32]>) outs(%gu : memref<64xf32>) {segments = [#kiln.segment<name = "blk.1.ffn_gate_shexp", offset = 0, rows = 32, format = "q8_0">, #kiln.segment<name = "blk.1.ffn_up_shexp", offset = 32, rows = 32, format = "q8_0">]}
  %g = step.view %gu[0] : memref<64xf32> to memref<32xf32>
  %u = step.view %gu[32] : memref<64xf32> to memref<32xf32>
  %s = step.buffer "s" : memref<64xf32>
  step.swiglu_linear ins(%g, %u, %ds : memref<32xf32>, memref<32xf32>, !kiln.qweight<"blk.1.ffn_down_shexp.weight", "q8_0", [32, 64]>) outs(%s : memref<64xf32>)
  step.moe_experts ins(%x, %ids, %w, %ge, %ue, %de : memref<64xf32>, memref<2xi32>, memref<2xf32>, !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"blk.1.ffn_up_exps.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [32, 64, 4]>) addend(%s : memref<64xf32>) outs(%y : memref<64xf32>)
  step.copy ins(%ids : memref<2xi32>) outs(%z : memref<2xi32>)
  return
}

// -----

// CHECK-LABEL: func.func @shared_read_again
// CHECK: step.moe_router
// CHECK: step.fused_linear
// CHECK: step.swiglu_linear
// CHECK: step.moe_experts
// CHECK-NOT: step.moe_ffn
func.func @shared_read_again() {
  %x = step.input "x" : memref<64xf32>
  %y = step.output "y" : memref<64xf32>
  %z = step.output "z" : memref<64xf32>
  %router = step.weight : !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [64, 4]>
  %bias = step.weight : !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [4]>
  %ge = step.weight : !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q8_0", [64, 32, 4]>
  %ue = step.weight : !kiln.qweight<"blk.1.ffn_up_exps.weight", "q8_0", [64, 32, 4]>
  %de = step.weight : !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [32, 64, 4]>
  %gs = step.weight : !kiln.qweight<"blk.1.ffn_gate_shexp.weight", "q8_0", [64, 32]>
  %us = step.weight : !kiln.qweight<"blk.1.ffn_up_shexp.weight", "q8_0", [64, 32]>
  %ds = step.weight : !kiln.qweight<"blk.1.ffn_down_shexp.weight", "q8_0", [32, 64]>
  %ids = step.buffer "ids" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  step.moe_router ins(%x, %router, %bias : memref<64xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [64, 4]>, !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [4]>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "sigmoid", normalize = true, routed_scale = 2.5 : f32, top_k = 2 : i64}
  %gu = step.buffer "gu" : memref<64xf32>
  step.fused_linear ins(%x, %gs, %us : memref<64xf32>, !kiln.qweight<"blk.1.ffn_gate_shexp.weight", "q8_0", [64, 32]>, !kiln.qweight<"blk.1.ffn_up_shexp.weight", "q8_0", [64, 32]>) outs(%gu : memref<64xf32>) {segments = [#kiln.segment<name = "blk.1.ffn_gate_shexp", offset = 0, rows = 32, format = "q8_0">, #kiln.segment<name = "blk.1.ffn_up_shexp", offset = 32, rows = 32, format = "q8_0">]}
  %g = step.view %gu[0] : memref<64xf32> to memref<32xf32>
  %u = step.view %gu[32] : memref<64xf32> to memref<32xf32>
  %s = step.buffer "s" : memref<64xf32>
  step.swiglu_linear ins(%g, %u, %ds : memref<32xf32>, memref<32xf32>, !kiln.qweight<"blk.1.ffn_down_shexp.weight", "q8_0", [32, 64]>) outs(%s : memref<64xf32>)
  step.moe_experts ins(%x, %ids, %w, %ge, %ue, %de : memref<64xf32>, memref<2xi32>, memref<2xf32>, !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"blk.1.ffn_up_exps.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [32, 64, 4]>) addend(%s : memref<64xf32>) outs(%y : memref<64xf32>)
  step.copy ins(%s : memref<64xf32>) outs(%z : memref<64xf32>)
  return
}

// -----

// CHECK-LABEL: func.func @projection_read_again
// CHECK: step.moe_router
// CHECK: step.fused_linear
// CHECK: step.swiglu_linear
// CHECK: step.moe_experts
// CHECK-NOT: step.moe_ffn
func.func @projection_read_again() {
  %x = step.input "x" : memref<64xf32>
  %y = step.output "y" : memref<64xf32>
  %z = step.output "z" : memref<64xf32>
  %router = step.weight : !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [64, 4]>
  %bias = step.weight : !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [4]>
  %ge = step.weight : !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q8_0", [64, 32, 4]>
  %ue = step.weight : !kiln.qweight<"blk.1.ffn_up_exps.weight", "q8_0", [64, 32, 4]>
  %de = step.weight : !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [32, 64, 4]>
  %gs = step.weight : !kiln.qweight<"blk.1.ffn_gate_shexp.weight", "q8_0", [64, 32]>
  %us = step.weight : !kiln.qweight<"blk.1.ffn_up_shexp.weight", "q8_0", [64, 32]>
  %ds = step.weight : !kiln.qweight<"blk.1.ffn_down_shexp.weight", "q8_0", [32, 64]>
  %ids = step.buffer "ids" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  step.moe_router ins(%x, %router, %bias : memref<64xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [64, 4]>, !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [4]>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "sigmoid", normalize = true, routed_scale = 2.5 : f32, top_k = 2 : i64}
  %gu = step.buffer "gu" : memref<64xf32>
  step.fused_linear ins(%x, %gs, %us : memref<64xf32>, !kiln.qweight<"blk.1.ffn_gate_shexp.weight", "q8_0", [64, 32]>, !kiln.qweight<"blk.1.ffn_up_shexp.weight", "q8_0", [64, 32]>) outs(%gu : memref<64xf32>) {segments = [#kiln.segment<name = "blk.1.ffn_gate_shexp", offset = 0, rows = 32, format = "q8_0">, #kiln.segment<name = "blk.1.ffn_up_shexp", offset = 32, rows = 32, format = "q8_0">]}
  %g = step.view %gu[0] : memref<64xf32> to memref<32xf32>
  %u = step.view %gu[32] : memref<64xf32> to memref<32xf32>
  %s = step.buffer "s" : memref<64xf32>
  step.swiglu_linear ins(%g, %u, %ds : memref<32xf32>, memref<32xf32>, !kiln.qweight<"blk.1.ffn_down_shexp.weight", "q8_0", [32, 64]>) outs(%s : memref<64xf32>)
  step.moe_experts ins(%x, %ids, %w, %ge, %ue, %de : memref<64xf32>, memref<2xi32>, memref<2xf32>, !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"blk.1.ffn_up_exps.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [32, 64, 4]>) addend(%s : memref<64xf32>) outs(%y : memref<64xf32>)
  step.copy ins(%gu : memref<64xf32>) outs(%z : memref<64xf32>)
  return
}

// -----

// CHECK-LABEL: func.func @half_read_again
// CHECK: step.moe_router
// CHECK: step.fused_linear
// CHECK: step.swiglu_linear
// CHECK: step.moe_experts
// CHECK-NOT: step.moe_ffn
func.func @half_read_again() {
  %x = step.input "x" : memref<64xf32>
  %y = step.output "y" : memref<64xf32>
  %z = step.output "z" : memref<32xf32>
  %router = step.weight : !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [64, 4]>
  %bias = step.weight : !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [4]>
  %ge = step.weight : !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q8_0", [64, 32, 4]>
  %ue = step.weight : !kiln.qweight<"blk.1.ffn_up_exps.weight", "q8_0", [64, 32, 4]>
  %de = step.weight : !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [32, 64, 4]>
  %gs = step.weight : !kiln.qweight<"blk.1.ffn_gate_shexp.weight", "q8_0", [64, 32]>
  %us = step.weight : !kiln.qweight<"blk.1.ffn_up_shexp.weight", "q8_0", [64, 32]>
  %ds = step.weight : !kiln.qweight<"blk.1.ffn_down_shexp.weight", "q8_0", [32, 64]>
  %ids = step.buffer "ids" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  step.moe_router ins(%x, %router, %bias : memref<64xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [64, 4]>, !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [4]>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "sigmoid", normalize = true, routed_scale = 2.5 : f32, top_k = 2 : i64}
  %gu = step.buffer "gu" : memref<64xf32>
  step.fused_linear ins(%x, %gs, %us : memref<64xf32>, !kiln.qweight<"blk.1.ffn_gate_shexp.weight", "q8_0", [64, 32]>, !kiln.qweight<"blk.1.ffn_up_shexp.weight", "q8_0", [64, 32]>) outs(%gu : memref<64xf32>) {segments = [#kiln.segment<name = "blk.1.ffn_gate_shexp", offset = 0, rows = 32, format = "q8_0">, #kiln.segment<name = "blk.1.ffn_up_shexp", offset = 32, rows = 32, format = "q8_0">]}
  %g = step.view %gu[0] : memref<64xf32> to memref<32xf32>
  %u = step.view %gu[32] : memref<64xf32> to memref<32xf32>
  %s = step.buffer "s" : memref<64xf32>
  step.swiglu_linear ins(%g, %u, %ds : memref<32xf32>, memref<32xf32>, !kiln.qweight<"blk.1.ffn_down_shexp.weight", "q8_0", [32, 64]>) outs(%s : memref<64xf32>)
  step.moe_experts ins(%x, %ids, %w, %ge, %ue, %de : memref<64xf32>, memref<2xi32>, memref<2xf32>, !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"blk.1.ffn_up_exps.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [32, 64, 4]>) addend(%s : memref<64xf32>) outs(%y : memref<64xf32>)
  step.copy ins(%u : memref<32xf32>) outs(%z : memref<32xf32>)
  return
}

// -----

// Not fused: the shared expert projects another input than the router and
// the experts read.
// CHECK-LABEL: func.func @other_input
// CHECK: step.moe_router
// CHECK: step.fused_linear
// CHECK: step.swiglu_linear
// CHECK: step.moe_experts
// CHECK-NOT: step.moe_ffn
func.func @other_input() {
  %x = step.input "x" : memref<64xf32>
  %y = step.output "y" : memref<64xf32>
  %x2 = step.input "x2" : memref<64xf32>
  %router = step.weight : !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [64, 4]>
  %bias = step.weight : !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [4]>
  %ge = step.weight : !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q8_0", [64, 32, 4]>
  %ue = step.weight : !kiln.qweight<"blk.1.ffn_up_exps.weight", "q8_0", [64, 32, 4]>
  %de = step.weight : !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [32, 64, 4]>
  %gs = step.weight : !kiln.qweight<"blk.1.ffn_gate_shexp.weight", "q8_0", [64, 32]>
  %us = step.weight : !kiln.qweight<"blk.1.ffn_up_shexp.weight", "q8_0", [64, 32]>
  %ds = step.weight : !kiln.qweight<"blk.1.ffn_down_shexp.weight", "q8_0", [32, 64]>
  %ids = step.buffer "ids" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  step.moe_router ins(%x, %router, %bias : memref<64xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [64, 4]>, !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [4]>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "sigmoid", normalize = true, routed_scale = 2.5 : f32, top_k = 2 : i64}
  %gu = step.buffer "gu" : memref<64xf32>
  step.fused_linear ins(%x2, %gs, %us : memref<64xf32>, !kiln.qweight<"blk.1.ffn_gate_shexp.weight", "q8_0", [64, 32]>, !kiln.qweight<"blk.1.ffn_up_shexp.weight", "q8_0", [64, 32]>) outs(%gu : memref<64xf32>) {segments = [#kiln.segment<name = "blk.1.ffn_gate_shexp", offset = 0, rows = 32, format = "q8_0">, #kiln.segment<name = "blk.1.ffn_up_shexp", offset = 32, rows = 32, format = "q8_0">]}
  %g = step.view %gu[0] : memref<64xf32> to memref<32xf32>
  %u = step.view %gu[32] : memref<64xf32> to memref<32xf32>
  %s = step.buffer "s" : memref<64xf32>
  step.swiglu_linear ins(%g, %u, %ds : memref<32xf32>, memref<32xf32>, !kiln.qweight<"blk.1.ffn_down_shexp.weight", "q8_0", [32, 64]>) outs(%s : memref<64xf32>)
  step.moe_experts ins(%x, %ids, %w, %ge, %ue, %de : memref<64xf32>, memref<2xi32>, memref<2xf32>, !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"blk.1.ffn_up_exps.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [32, 64, 4]>) addend(%s : memref<64xf32>) outs(%y : memref<64xf32>)
  return
}

// -----

// Not fused: gate and up swapped (up is the projection's first half).
// CHECK-LABEL: func.func @halves_swapped
// CHECK: step.moe_router
// CHECK: step.fused_linear
// CHECK: step.swiglu_linear
// CHECK: step.moe_experts
// CHECK-NOT: step.moe_ffn
func.func @halves_swapped() {
  %x = step.input "x" : memref<64xf32>
  %y = step.output "y" : memref<64xf32>
  %router = step.weight : !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [64, 4]>
  %bias = step.weight : !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [4]>
  %ge = step.weight : !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q8_0", [64, 32, 4]>
  %ue = step.weight : !kiln.qweight<"blk.1.ffn_up_exps.weight", "q8_0", [64, 32, 4]>
  %de = step.weight : !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [32, 64, 4]>
  %gs = step.weight : !kiln.qweight<"blk.1.ffn_gate_shexp.weight", "q8_0", [64, 32]>
  %us = step.weight : !kiln.qweight<"blk.1.ffn_up_shexp.weight", "q8_0", [64, 32]>
  %ds = step.weight : !kiln.qweight<"blk.1.ffn_down_shexp.weight", "q8_0", [32, 64]>
  %ids = step.buffer "ids" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  step.moe_router ins(%x, %router, %bias : memref<64xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [64, 4]>, !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [4]>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "sigmoid", normalize = true, routed_scale = 2.5 : f32, top_k = 2 : i64}
  %gu = step.buffer "gu" : memref<64xf32>
  step.fused_linear ins(%x, %gs, %us : memref<64xf32>, !kiln.qweight<"blk.1.ffn_gate_shexp.weight", "q8_0", [64, 32]>, !kiln.qweight<"blk.1.ffn_up_shexp.weight", "q8_0", [64, 32]>) outs(%gu : memref<64xf32>) {segments = [#kiln.segment<name = "blk.1.ffn_gate_shexp", offset = 0, rows = 32, format = "q8_0">, #kiln.segment<name = "blk.1.ffn_up_shexp", offset = 32, rows = 32, format = "q8_0">]}
  %g = step.view %gu[32] : memref<64xf32> to memref<32xf32>
  %u = step.view %gu[0] : memref<64xf32> to memref<32xf32>
  %s = step.buffer "s" : memref<64xf32>
  step.swiglu_linear ins(%g, %u, %ds : memref<32xf32>, memref<32xf32>, !kiln.qweight<"blk.1.ffn_down_shexp.weight", "q8_0", [32, 64]>) outs(%s : memref<64xf32>)
  step.moe_experts ins(%x, %ids, %w, %ge, %ue, %de : memref<64xf32>, memref<2xi32>, memref<2xf32>, !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"blk.1.ffn_up_exps.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [32, 64, 4]>) addend(%s : memref<64xf32>) outs(%y : memref<64xf32>)
  return
}

// -----

// Not fused: the input rewritten between the router and the experts, so
// the fused op, where the experts were, would read other values.
// CHECK-LABEL: func.func @input_rewritten
// CHECK: step.moe_router
// CHECK: step.fused_linear
// CHECK: step.swiglu_linear
// CHECK: step.moe_experts
// CHECK-NOT: step.moe_ffn
func.func @input_rewritten() {
  %x = step.buffer "xb" : memref<64xf32>
  %y = step.output "y" : memref<64xf32>
  %x0 = step.input "x0" : memref<64xf32>
  %router = step.weight : !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [64, 4]>
  %bias = step.weight : !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [4]>
  %ge = step.weight : !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q8_0", [64, 32, 4]>
  %ue = step.weight : !kiln.qweight<"blk.1.ffn_up_exps.weight", "q8_0", [64, 32, 4]>
  %de = step.weight : !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [32, 64, 4]>
  %gs = step.weight : !kiln.qweight<"blk.1.ffn_gate_shexp.weight", "q8_0", [64, 32]>
  %us = step.weight : !kiln.qweight<"blk.1.ffn_up_shexp.weight", "q8_0", [64, 32]>
  %ds = step.weight : !kiln.qweight<"blk.1.ffn_down_shexp.weight", "q8_0", [32, 64]>
  %ids = step.buffer "ids" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  step.moe_router ins(%x, %router, %bias : memref<64xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [64, 4]>, !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [4]>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "sigmoid", normalize = true, routed_scale = 2.5 : f32, top_k = 2 : i64}
  %gu = step.buffer "gu" : memref<64xf32>
  step.fused_linear ins(%x, %gs, %us : memref<64xf32>, !kiln.qweight<"blk.1.ffn_gate_shexp.weight", "q8_0", [64, 32]>, !kiln.qweight<"blk.1.ffn_up_shexp.weight", "q8_0", [64, 32]>) outs(%gu : memref<64xf32>) {segments = [#kiln.segment<name = "blk.1.ffn_gate_shexp", offset = 0, rows = 32, format = "q8_0">, #kiln.segment<name = "blk.1.ffn_up_shexp", offset = 32, rows = 32, format = "q8_0">]}
  %g = step.view %gu[0] : memref<64xf32> to memref<32xf32>
  %u = step.view %gu[32] : memref<64xf32> to memref<32xf32>
  %s = step.buffer "s" : memref<64xf32>
  step.swiglu_linear ins(%g, %u, %ds : memref<32xf32>, memref<32xf32>, !kiln.qweight<"blk.1.ffn_down_shexp.weight", "q8_0", [32, 64]>) outs(%s : memref<64xf32>)
  step.copy ins(%x0 : memref<64xf32>) outs(%x : memref<64xf32>)
  step.moe_experts ins(%x, %ids, %w, %ge, %ue, %de : memref<64xf32>, memref<2xi32>, memref<2xf32>, !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"blk.1.ffn_up_exps.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [32, 64, 4]>) addend(%s : memref<64xf32>) outs(%y : memref<64xf32>)
  return
}

// -----

// Not fused: the router's bias in a buffer (kiln-fold-dequant, which runs
// first in the pipeline, makes it a weight; the fused op reads a weight).
// CHECK-LABEL: func.func @bias_in_buffer
// CHECK: step.moe_router
// CHECK: step.fused_linear
// CHECK: step.swiglu_linear
// CHECK: step.moe_experts
// CHECK-NOT: step.moe_ffn
func.func @bias_in_buffer() {
  %x = step.input "x" : memref<64xf32>
  %y = step.output "y" : memref<64xf32>
  %router = step.weight : !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [64, 4]>
  %bias = step.input "bias" : memref<4xf32>
  %ge = step.weight : !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q8_0", [64, 32, 4]>
  %ue = step.weight : !kiln.qweight<"blk.1.ffn_up_exps.weight", "q8_0", [64, 32, 4]>
  %de = step.weight : !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [32, 64, 4]>
  %gs = step.weight : !kiln.qweight<"blk.1.ffn_gate_shexp.weight", "q8_0", [64, 32]>
  %us = step.weight : !kiln.qweight<"blk.1.ffn_up_shexp.weight", "q8_0", [64, 32]>
  %ds = step.weight : !kiln.qweight<"blk.1.ffn_down_shexp.weight", "q8_0", [32, 64]>
  %ids = step.buffer "ids" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  step.moe_router ins(%x, %router, %bias : memref<64xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [64, 4]>, memref<4xf32>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "sigmoid", normalize = true, routed_scale = 2.5 : f32, top_k = 2 : i64}
  %gu = step.buffer "gu" : memref<64xf32>
  step.fused_linear ins(%x, %gs, %us : memref<64xf32>, !kiln.qweight<"blk.1.ffn_gate_shexp.weight", "q8_0", [64, 32]>, !kiln.qweight<"blk.1.ffn_up_shexp.weight", "q8_0", [64, 32]>) outs(%gu : memref<64xf32>) {segments = [#kiln.segment<name = "blk.1.ffn_gate_shexp", offset = 0, rows = 32, format = "q8_0">, #kiln.segment<name = "blk.1.ffn_up_shexp", offset = 32, rows = 32, format = "q8_0">]}
  %g = step.view %gu[0] : memref<64xf32> to memref<32xf32>
  %u = step.view %gu[32] : memref<64xf32> to memref<32xf32>
  %s = step.buffer "s" : memref<64xf32>
  step.swiglu_linear ins(%g, %u, %ds : memref<32xf32>, memref<32xf32>, !kiln.qweight<"blk.1.ffn_down_shexp.weight", "q8_0", [32, 64]>) outs(%s : memref<64xf32>)
  step.moe_experts ins(%x, %ids, %w, %ge, %ue, %de : memref<64xf32>, memref<2xi32>, memref<2xf32>, !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"blk.1.ffn_up_exps.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [32, 64, 4]>) addend(%s : memref<64xf32>) outs(%y : memref<64xf32>)
  return
}
