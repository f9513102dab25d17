// RUN: kiln-opt %s --split-input-file --kiln-fuse-router-choice | FileCheck %s
// RUN: kiln-opt %s --split-input-file --kiln-fuse-router-choice | kiln-opt --split-input-file | FileCheck %s

// A moe_choose of the logits a fused all-reduce's router tail writes (after
// kiln-fold-router) moves into the all-reduce as its `choose` clause: the
// bias and the choice's ids and weights, declared after the all-reduce,
// move before it; the logits stay its output. An op in between that
// touches none of them does not stop it. Not fused: the logits read by
// another op too, or written in between; the choice's outputs read or
// written in between; its bias written in between; logits that no
// all-reduce's tail writes; an all-reduce that already chooses. Not
// checked here: the planner and the capture verifier afterwards, and the
// pass in the pipeline (glm5-partition.test).

// CHECK-LABEL: func.func @fused
// CHECK: %[[L:.+]] = step.buffer "blk.1.moe_router.logits" : memref<8xf32>
// CHECK: %blk.1.exp_probs_b.bias = step.weight
// CHECK-NEXT: %[[IDS:.+]] = step.buffer "blk.1.moe_router.ids" : memref<2xi32>
// CHECK-NEXT: %[[W:.+]] = step.buffer "blk.1.moe_router.weights" : memref<2xf32>
// CHECK-NEXT: step.all_reduce_add_rms_norm ins(%p, %x, %blk.1.ffn_norm : memref<72xf32>, memref<64xf32>, !kiln.qweight<"blk.1.ffn_norm.weight", "f32", [64]>) outs(%h, %y, %[[L]] : memref<64xf32>, memref<64xf32>, memref<8xf32>) choose ins(%blk.1.exp_probs_b.bias : !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [8]>) outs(%[[IDS]], %[[W]] : memref<2xi32>, memref<2xf32>) {epsilon = 9.99999974E-6 : f32, gating = "sigmoid", normalize = true, reduction = "sum", routed_scale = 2.500000e+00 : f32, tail = 8 : i64, top_k = 2 : i64}
// CHECK-NEXT: step.copy ins(%y : memref<64xf32>) outs(%z : memref<64xf32>)
// CHECK-NOT: step.moe_choose
// CHECK: return
func.func @fused() {
  %p = step.input "p" : memref<72xf32>
  %x = step.input "x" : memref<64xf32>
  %z = step.output "z" : memref<64xf32>
  %norm = step.weight : !kiln.qweight<"blk.1.ffn_norm.weight", "f32", [64]>
  %h = step.buffer "h" : memref<64xf32>
  %y = step.buffer "y" : memref<64xf32>
  %l = step.buffer "blk.1.moe_router.logits" : memref<8xf32>
  step.all_reduce_add_rms_norm ins(%p, %x, %norm : memref<72xf32>, memref<64xf32>, !kiln.qweight<"blk.1.ffn_norm.weight", "f32", [64]>) outs(%h, %y, %l : memref<64xf32>, memref<64xf32>, memref<8xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum", tail = 8 : i64}
  step.copy ins(%y : memref<64xf32>) outs(%z : memref<64xf32>)
  %bias = step.weight : !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [8]>
  %ids = step.buffer "blk.1.moe_router.ids" : memref<2xi32>
  %w = step.buffer "blk.1.moe_router.weights" : memref<2xf32>
  step.moe_choose ins(%l, %bias : memref<8xf32>, !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [8]>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "sigmoid", normalize = true, routed_scale = 2.5 : f32, top_k = 2 : i64}
  return
}

// -----

// Without a bias: no `ins` in the clause.

// CHECK-LABEL: func.func @fused_without_bias
// CHECK: step.all_reduce_add_rms_norm ins(%p, %x, %n : {{.+}}) outs(%h, %y, %l : {{.+}}) choose outs(%ids, %w : memref<2xi32>, memref<2xf32>) {epsilon = 9.99999974E-6 : f32, gating = "softmax", normalize = false, reduction = "sum", routed_scale = 1.000000e+00 : f32, tail = 8 : i64, top_k = 2 : i64}
// CHECK-NOT: step.moe_choose
func.func @fused_without_bias() {
  %p = step.input "p" : memref<72xf32>
  %x = step.input "x" : memref<64xf32>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [64]>
  %h = step.buffer "h" : memref<64xf32>
  %y = step.buffer "y" : memref<64xf32>
  %l = step.buffer "l" : memref<8xf32>
  %ids = step.buffer "ids" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  step.all_reduce_add_rms_norm ins(%p, %x, %n : memref<72xf32>, memref<64xf32>, !kiln.qweight<"n.weight", "f32", [64]>) outs(%h, %y, %l : memref<64xf32>, memref<64xf32>, memref<8xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum", tail = 8 : i64}
  step.moe_choose ins(%l : memref<8xf32>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "softmax", normalize = false, routed_scale = 1.0 : f32, top_k = 2 : i64}
  return
}

// -----

// The logits are read by another op as well (here a copy to an output
// slot): the choice stays where it is.

// CHECK-LABEL: func.func @logits_read_elsewhere
// CHECK: step.all_reduce_add_rms_norm {{.+}} {epsilon = 9.99999974E-6 : f32, reduction = "sum", tail = 8 : i64}
// CHECK: step.moe_choose ins(%l
func.func @logits_read_elsewhere() {
  %p = step.input "p" : memref<72xf32>
  %x = step.input "x" : memref<64xf32>
  %out = step.output "out" : memref<8xf32>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [64]>
  %h = step.buffer "h" : memref<64xf32>
  %y = step.buffer "y" : memref<64xf32>
  %l = step.buffer "l" : memref<8xf32>
  %ids = step.buffer "ids" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  step.all_reduce_add_rms_norm ins(%p, %x, %n : memref<72xf32>, memref<64xf32>, !kiln.qweight<"n.weight", "f32", [64]>) outs(%h, %y, %l : memref<64xf32>, memref<64xf32>, memref<8xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum", tail = 8 : i64}
  step.moe_choose ins(%l : memref<8xf32>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "softmax", normalize = false, routed_scale = 1.0 : f32, top_k = 2 : i64}
  step.copy ins(%l : memref<8xf32>) outs(%out : memref<8xf32>)
  return
}

// -----

// The logits are written between the all-reduce and the choice (through a
// view of their buffer): the choice reads other values than the
// all-reduce wrote.

// CHECK-LABEL: func.func @logits_written_between
// CHECK: %[[L:.+]] = step.view %all[0]
// CHECK: step.all_reduce_add_rms_norm {{.+}} {epsilon = 9.99999974E-6 : f32, reduction = "sum", tail = 8 : i64}
// CHECK: step.moe_choose ins(%[[L]] :
func.func @logits_written_between() {
  %p = step.input "p" : memref<72xf32>
  %x = step.input "x" : memref<64xf32>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [64]>
  %h = step.buffer "h" : memref<64xf32>
  %y = step.buffer "y" : memref<64xf32>
  %all = step.buffer "all" : memref<16xf32>
  %l = step.view %all[0] : memref<16xf32> to memref<8xf32>
  %other = step.view %all[4] : memref<16xf32> to memref<8xf32>
  %v = step.input "v" : memref<8xf32>
  %ids = step.buffer "ids" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  step.all_reduce_add_rms_norm ins(%p, %x, %n : memref<72xf32>, memref<64xf32>, !kiln.qweight<"n.weight", "f32", [64]>) outs(%h, %y, %l : memref<64xf32>, memref<64xf32>, memref<8xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum", tail = 8 : i64}
  step.copy ins(%v : memref<8xf32>) outs(%other : memref<8xf32>)
  step.moe_choose ins(%l : memref<8xf32>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "softmax", normalize = false, routed_scale = 1.0 : f32, top_k = 2 : i64}
  return
}

// -----

// The choice's weights are read between the all-reduce and the choice:
// written earlier, that read would see the new values.

// CHECK-LABEL: func.func @output_read_between
// CHECK: step.all_reduce_add_rms_norm {{.+}} {epsilon = 9.99999974E-6 : f32, reduction = "sum", tail = 8 : i64}
// CHECK: step.moe_choose ins(%l
func.func @output_read_between() {
  %p = step.input "p" : memref<72xf32>
  %x = step.input "x" : memref<64xf32>
  %out = step.output "out" : memref<2xf32>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [64]>
  %h = step.buffer "h" : memref<64xf32>
  %y = step.buffer "y" : memref<64xf32>
  %l = step.buffer "l" : memref<8xf32>
  %ids = step.buffer "ids" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  step.all_reduce_add_rms_norm ins(%p, %x, %n : memref<72xf32>, memref<64xf32>, !kiln.qweight<"n.weight", "f32", [64]>) outs(%h, %y, %l : memref<64xf32>, memref<64xf32>, memref<8xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum", tail = 8 : i64}
  step.copy ins(%w : memref<2xf32>) outs(%out : memref<2xf32>)
  step.moe_choose ins(%l : memref<8xf32>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "softmax", normalize = false, routed_scale = 1.0 : f32, top_k = 2 : i64}
  return
}

// -----

// The choice's weights are written between the all-reduce and the choice:
// that write would come after the choice's.

// CHECK-LABEL: func.func @output_written_between
// CHECK: step.all_reduce_add_rms_norm {{.+}} {epsilon = 9.99999974E-6 : f32, reduction = "sum", tail = 8 : i64}
// CHECK: step.moe_choose ins(%l
func.func @output_written_between() {
  %p = step.input "p" : memref<72xf32>
  %x = step.input "x" : memref<64xf32>
  %v = step.input "v" : memref<2xf32>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [64]>
  %h = step.buffer "h" : memref<64xf32>
  %y = step.buffer "y" : memref<64xf32>
  %l = step.buffer "l" : memref<8xf32>
  %ids = step.buffer "ids" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  step.all_reduce_add_rms_norm ins(%p, %x, %n : memref<72xf32>, memref<64xf32>, !kiln.qweight<"n.weight", "f32", [64]>) outs(%h, %y, %l : memref<64xf32>, memref<64xf32>, memref<8xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum", tail = 8 : i64}
  step.copy ins(%v : memref<2xf32>) outs(%w : memref<2xf32>)
  step.moe_choose ins(%l : memref<8xf32>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "softmax", normalize = false, routed_scale = 1.0 : f32, top_k = 2 : i64}
  return
}

// -----

// The bias is a buffer written between the all-reduce and the choice: at
// the all-reduce it does not hold what the choice reads.

// CHECK-LABEL: func.func @bias_written_between
// CHECK: step.all_reduce_add_rms_norm {{.+}} {epsilon = 9.99999974E-6 : f32, reduction = "sum", tail = 8 : i64}
// CHECK: step.moe_choose ins(%l, %bias
func.func @bias_written_between() {
  %p = step.input "p" : memref<72xf32>
  %x = step.input "x" : memref<64xf32>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [64]>
  %bw = step.weight : !kiln.qweight<"b.bias", "f32", [8]>
  %h = step.buffer "h" : memref<64xf32>
  %y = step.buffer "y" : memref<64xf32>
  %l = step.buffer "l" : memref<8xf32>
  %ids = step.buffer "ids" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  step.all_reduce_add_rms_norm ins(%p, %x, %n : memref<72xf32>, memref<64xf32>, !kiln.qweight<"n.weight", "f32", [64]>) outs(%h, %y, %l : memref<64xf32>, memref<64xf32>, memref<8xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum", tail = 8 : i64}
  %bias = step.buffer "bias" : memref<8xf32>
  step.dequant ins(%bw : !kiln.qweight<"b.bias", "f32", [8]>) outs(%bias : memref<8xf32>)
  step.moe_choose ins(%l, %bias : memref<8xf32>, memref<8xf32>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "sigmoid", normalize = true, routed_scale = 1.0 : f32, top_k = 2 : i64}
  return
}

// -----

// Logits that no all-reduce's tail writes (a linear's here, beside an
// all-reduce without a tail): nothing to fuse into.

// CHECK-LABEL: func.func @no_tail
// CHECK: step.all_reduce_add_rms_norm {{.+}} {epsilon = 9.99999974E-6 : f32, reduction = "sum"}
// CHECK: step.moe_choose ins(%l
func.func @no_tail() {
  %p = step.input "p" : memref<64xf32>
  %x = step.input "x" : memref<64xf32>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [64]>
  %gate = step.weight : !kiln.qweight<"gate.weight", "f32", [64, 8]>
  %h = step.buffer "h" : memref<64xf32>
  %y = step.buffer "y" : memref<64xf32>
  %l = step.buffer "l" : memref<8xf32>
  %ids = step.buffer "ids" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  step.all_reduce_add_rms_norm ins(%p, %x, %n : memref<64xf32>, memref<64xf32>, !kiln.qweight<"n.weight", "f32", [64]>) outs(%h, %y : memref<64xf32>, memref<64xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum"}
  step.linear ins(%y, %gate : memref<64xf32>, !kiln.qweight<"gate.weight", "f32", [64, 8]>) outs(%l : memref<8xf32>)
  step.moe_choose ins(%l : memref<8xf32>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "softmax", normalize = false, routed_scale = 1.0 : f32, top_k = 2 : i64}
  return
}

// -----

// An all-reduce that already chooses keeps its choice; a second choice
// from its logits stays a moe_choose.

// CHECK-LABEL: func.func @already_chosen
// CHECK: step.all_reduce_add_rms_norm {{.+}} choose outs(%ids, %w : {{.+}})
// CHECK: step.moe_choose ins(%l : memref<8xf32>) outs(%ids2, %w2
func.func @already_chosen() {
  %p = step.input "p" : memref<72xf32>
  %x = step.input "x" : memref<64xf32>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [64]>
  %h = step.buffer "h" : memref<64xf32>
  %y = step.buffer "y" : memref<64xf32>
  %l = step.buffer "l" : memref<8xf32>
  %ids = step.buffer "ids" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  %ids2 = step.buffer "ids2" : memref<2xi32>
  %w2 = step.buffer "w2" : memref<2xf32>
  step.all_reduce_add_rms_norm ins(%p, %x, %n : memref<72xf32>, memref<64xf32>, !kiln.qweight<"n.weight", "f32", [64]>) outs(%h, %y, %l : memref<64xf32>, memref<64xf32>, memref<8xf32>) choose outs(%ids, %w : memref<2xi32>, memref<2xf32>) {epsilon = 1.0e-05 : f32, gating = "softmax", normalize = false, reduction = "sum", routed_scale = 1.0 : f32, tail = 8 : i64, top_k = 2 : i64}
  step.moe_choose ins(%l : memref<8xf32>) outs(%ids2, %w2 : memref<2xi32>, memref<2xf32>) {gating = "softmax", normalize = false, routed_scale = 1.0 : f32, top_k = 2 : i64}
  return
}
