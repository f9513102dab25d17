// RUN: kiln-opt %s --split-input-file --kiln-fold-router | FileCheck %s
// RUN: kiln-opt %s --split-input-file --kiln-fold-router | kiln-opt --split-input-file | FileCheck %s
// RUN: kiln-opt %s --split-input-file --kiln-fold-router=compose=true | FileCheck %s --check-prefix=COMPOSE
// RUN: kiln-opt %s --split-input-file --kiln-fold-router=compose=true | kiln-opt --split-input-file | FileCheck %s --check-prefix=COMPOSE

// A moe_router reading a fused all-reduce's output, on a tensor-parallel
// step: the partial grows by the router's E values (its producer writes the
// first n through a view, a router_partial right after it the rest), the
// all-reduce takes `tail = E` and a logits buffer, and a moe_choose of them
// replaces the router where it was. The gate and norm weights declared
// after the producer move before it. Not folded: no kiln.tp or tp = 1, a
// router reading another buffer, the partial read by another op, a
// non-F32 gate, the residual written between the producer and the
// all-reduce, the norm's output written between the all-reduce and the
// router. Not checked here: the planner or capture verifier afterwards
// (glm5-partition.test).
//
// Composed (COMPOSE): the producing linear becomes a linear_router that
// writes the whole partial of n + E values (no views, no router_partial);
// the all-reduce and the choice as above. Not composed, and then not folded
// at all: a producer that is not a linear, a weight not cut by rows into
// tp parts, n not a multiple of tp. The cases above that the simpler fold
// leaves alone are not checked again for the composed form, which matches
// only a subset of what the simpler fold does.

// CHECK-LABEL: func.func @folded
// CHECK: %[[P:.+]] = step.buffer "part" : memref<72xf32>
// CHECK-NEXT: %[[P0:.+]] = step.view %[[P]][0] : memref<72xf32> to memref<64xf32>
// CHECK-NEXT: %[[P1:.+]] = step.view %[[P]][64] : memref<72xf32> to memref<8xf32>
// CHECK-NEXT: %blk.1.ffn_norm = step.weight
// CHECK-NEXT: %blk.1.ffn_gate_inp = step.weight
// CHECK-NEXT: step.linear ins(%o, %blk.1.attn_output : {{.+}}) outs(%[[P0]] : memref<64xf32>)
// CHECK-NEXT: step.router_partial ins(%[[P0]], %x, %blk.1.ffn_gate_inp, %blk.1.ffn_norm : memref<64xf32>, memref<64xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [64, 8]>, !kiln.qweight<"blk.1.ffn_norm.weight", "f32", [64]>) outs(%[[P1]] : memref<8xf32>) {residual_scale = 2.500000e-01 : f32}
// CHECK: %[[L:.+]] = step.buffer "blk.1.moe_router.logits" : memref<8xf32>
// CHECK-NEXT: step.all_reduce_add_rms_norm ins(%[[P]], %x, %blk.1.ffn_norm : memref<72xf32>, memref<64xf32>, !kiln.qweight<"blk.1.ffn_norm.weight", "f32", [64]>) outs(%h, %y, %[[L]] : memref<64xf32>, memref<64xf32>, memref<8xf32>) {epsilon = 9.99999974E-6 : f32, reduction = "sum", tail = 8 : i64}
// CHECK-NOT: step.moe_router
// CHECK: step.moe_choose ins(%[[L]], %blk.1.exp_probs_b.bias : memref<8xf32>, !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [8]>) outs(%blk.1.moe_router.ids, %w : memref<2xi32>, memref<2xf32>) {gating = "sigmoid", normalize = true, routed_scale = 2.500000e+00 : f32, top_k = 2 : i64}
// CHECK-NEXT: step.copy ins(%y
// CHECK-NEXT: return

// COMPOSE-LABEL: func.func @folded
// COMPOSE: %[[P:.+]] = step.buffer "part" : memref<72xf32>
// COMPOSE-NEXT: %blk.1.ffn_norm = step.weight
// COMPOSE-NEXT: %blk.1.ffn_gate_inp = step.weight
// COMPOSE-NEXT: step.linear_router ins(%o, %blk.1.attn_output, %x, %blk.1.ffn_gate_inp, %blk.1.ffn_norm : memref<32xf32>, !kiln.qweight<"blk.1.attn_output.weight", "q8_0", [32, 64], shard = 0 of 4>, memref<64xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [64, 8]>, !kiln.qweight<"blk.1.ffn_norm.weight", "f32", [64]>) outs(%[[P]] : memref<72xf32>) {ranks = 4 : i64}
// COMPOSE-NOT: step.linear ins
// COMPOSE-NOT: step.view
// COMPOSE-NOT: step.router_partial
// COMPOSE: %[[L:.+]] = step.buffer "blk.1.moe_router.logits" : memref<8xf32>
// COMPOSE-NEXT: step.all_reduce_add_rms_norm ins(%[[P]], %x, %blk.1.ffn_norm : memref<72xf32>, memref<64xf32>, !kiln.qweight<"blk.1.ffn_norm.weight", "f32", [64]>) outs(%h, %y, %[[L]] : memref<64xf32>, memref<64xf32>, memref<8xf32>) {epsilon = 9.99999974E-6 : f32, reduction = "sum", tail = 8 : i64}
// COMPOSE-NOT: step.moe_router
// COMPOSE: step.moe_choose ins(%[[L]], %blk.1.exp_probs_b.bias : memref<8xf32>, !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [8]>) outs(%blk.1.moe_router.ids, %w : memref<2xi32>, memref<2xf32>) {gating = "sigmoid", normalize = true, routed_scale = 2.500000e+00 : f32, top_k = 2 : i64}
// COMPOSE-NEXT: step.copy ins(%y
// COMPOSE-NEXT: return
func.func @folded() attributes {kiln.tp = 4 : i64} {
  %o = step.input "o" : memref<32xf32>
  %x = step.input "x" : memref<64xf32>
  %z = step.output "z" : memref<64xf32>
  %wo = step.weight : !kiln.qweight<"blk.1.attn_output.weight", "q8_0", [32, 64], shard = 0 of 4>
  %p = step.buffer "part" : memref<64xf32>
  step.linear ins(%o, %wo : memref<32xf32>, !kiln.qweight<"blk.1.attn_output.weight", "q8_0", [32, 64], shard = 0 of 4>) outs(%p : memref<64xf32>)
  %h = step.buffer "h" : memref<64xf32>
  %norm = step.weight : !kiln.qweight<"blk.1.ffn_norm.weight", "f32", [64]>
  %y = step.buffer "y" : memref<64xf32>
  step.all_reduce_add_rms_norm ins(%p, %x, %norm : memref<64xf32>, memref<64xf32>, !kiln.qweight<"blk.1.ffn_norm.weight", "f32", [64]>) outs(%h, %y : memref<64xf32>, memref<64xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum"}
  %gate = step.weight : !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [64, 8]>
  %bias = step.weight : !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [8]>
  %ids = step.buffer "blk.1.moe_router.ids" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  step.moe_router ins(%y, %gate, %bias : memref<64xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [64, 8]>, !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [8]>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "sigmoid", normalize = true, routed_scale = 2.5 : f32, top_k = 2 : i64}
  step.copy ins(%y : memref<64xf32>) outs(%z : memref<64xf32>)
  return
}

// -----

// Without tensor parallelism (no kiln.tp) nothing is folded.

// CHECK-LABEL: func.func @no_tp
// CHECK-NOT: step.router_partial
// CHECK: step.moe_router
func.func @no_tp() {
  %o = step.input "o" : memref<32xf32>
  %x = step.input "x" : memref<64xf32>
  %wo = step.weight : !kiln.qweight<"wo.weight", "q8_0", [32, 64]>
  %norm = step.weight : !kiln.qweight<"norm.weight", "f32", [64]>
  %gate = step.weight : !kiln.qweight<"gate.weight", "f32", [64, 8]>
  %p = step.buffer "part" : memref<64xf32>
  step.linear ins(%o, %wo : memref<32xf32>, !kiln.qweight<"wo.weight", "q8_0", [32, 64]>) outs(%p : memref<64xf32>)
  %h = step.buffer "h" : memref<64xf32>
  %y = step.buffer "y" : memref<64xf32>
  step.all_reduce_add_rms_norm ins(%p, %x, %norm : memref<64xf32>, memref<64xf32>, !kiln.qweight<"norm.weight", "f32", [64]>) outs(%h, %y : memref<64xf32>, memref<64xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum"}
  %ids = step.output "ids" : memref<2xi32>
  %w = step.output "w" : memref<2xf32>
  step.moe_router ins(%y, %gate : memref<64xf32>, !kiln.qweight<"gate.weight", "f32", [64, 8]>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "softmax", normalize = false, routed_scale = 1.0 : f32, top_k = 2 : i64}
  return
}

// -----

// CHECK-LABEL: func.func @tp_one
// CHECK-NOT: step.router_partial
// CHECK: step.moe_router
func.func @tp_one() attributes {kiln.tp = 1 : i64} {
  %o = step.input "o" : memref<32xf32>
  %x = step.input "x" : memref<64xf32>
  %wo = step.weight : !kiln.qweight<"wo.weight", "q8_0", [32, 64]>
  %norm = step.weight : !kiln.qweight<"norm.weight", "f32", [64]>
  %gate = step.weight : !kiln.qweight<"gate.weight", "f32", [64, 8]>
  %p = step.buffer "part" : memref<64xf32>
  step.linear ins(%o, %wo : memref<32xf32>, !kiln.qweight<"wo.weight", "q8_0", [32, 64]>) outs(%p : memref<64xf32>)
  %h = step.buffer "h" : memref<64xf32>
  %y = step.buffer "y" : memref<64xf32>
  step.all_reduce_add_rms_norm ins(%p, %x, %norm : memref<64xf32>, memref<64xf32>, !kiln.qweight<"norm.weight", "f32", [64]>) outs(%h, %y : memref<64xf32>, memref<64xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum"}
  %ids = step.output "ids" : memref<2xi32>
  %w = step.output "w" : memref<2xf32>
  step.moe_router ins(%y, %gate : memref<64xf32>, !kiln.qweight<"gate.weight", "f32", [64, 8]>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "softmax", normalize = false, routed_scale = 1.0 : f32, top_k = 2 : i64}
  return
}

// -----

// The router reads the residual, not the all-reduce's output.

// CHECK-LABEL: func.func @router_reads_another
// CHECK-NOT: step.router_partial
// CHECK: step.all_reduce_add_rms_norm ins(%part, %x, %norm : memref<64xf32>, memref<64xf32>, {{.+}}) outs(%h, %y : memref<64xf32>, memref<64xf32>) {epsilon = 9.99999974E-6 : f32, reduction = "sum"}
// CHECK: step.moe_router ins(%x
func.func @router_reads_another() attributes {kiln.tp = 2 : i64} {
  %o = step.input "o" : memref<32xf32>
  %x = step.input "x" : memref<64xf32>
  %wo = step.weight : !kiln.qweight<"wo.weight", "q8_0", [32, 64]>
  %norm = step.weight : !kiln.qweight<"norm.weight", "f32", [64]>
  %gate = step.weight : !kiln.qweight<"gate.weight", "f32", [64, 8]>
  %p = step.buffer "part" : memref<64xf32>
  step.linear ins(%o, %wo : memref<32xf32>, !kiln.qweight<"wo.weight", "q8_0", [32, 64]>) outs(%p : memref<64xf32>)
  %h = step.buffer "h" : memref<64xf32>
  %y = step.output "y" : memref<64xf32>
  step.all_reduce_add_rms_norm ins(%p, %x, %norm : memref<64xf32>, memref<64xf32>, !kiln.qweight<"norm.weight", "f32", [64]>) outs(%h, %y : memref<64xf32>, memref<64xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum"}
  %ids = step.output "ids" : memref<2xi32>
  %w = step.output "w" : memref<2xf32>
  step.moe_router ins(%x, %gate : memref<64xf32>, !kiln.qweight<"gate.weight", "f32", [64, 8]>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "softmax", normalize = false, routed_scale = 1.0 : f32, top_k = 2 : i64}
  return
}

// -----

// The partial is read by another op too: it cannot grow.

// CHECK-LABEL: func.func @partial_read_again
// CHECK-NOT: step.router_partial
// CHECK: step.all_reduce_add_rms_norm ins(%part
// CHECK-NOT: tail
// CHECK: step.moe_router ins(%y
// CHECK: step.copy ins(%part
func.func @partial_read_again() attributes {kiln.tp = 2 : i64} {
  %o = step.input "o" : memref<32xf32>
  %x = step.input "x" : memref<64xf32>
  %z = step.output "z" : memref<64xf32>
  %wo = step.weight : !kiln.qweight<"wo.weight", "q8_0", [32, 64]>
  %norm = step.weight : !kiln.qweight<"norm.weight", "f32", [64]>
  %gate = step.weight : !kiln.qweight<"gate.weight", "f32", [64, 8]>
  %p = step.buffer "part" : memref<64xf32>
  step.linear ins(%o, %wo : memref<32xf32>, !kiln.qweight<"wo.weight", "q8_0", [32, 64]>) outs(%p : memref<64xf32>)
  %h = step.buffer "h" : memref<64xf32>
  %y = step.buffer "y" : memref<64xf32>
  step.all_reduce_add_rms_norm ins(%p, %x, %norm : memref<64xf32>, memref<64xf32>, !kiln.qweight<"norm.weight", "f32", [64]>) outs(%h, %y : memref<64xf32>, memref<64xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum"}
  %ids = step.output "ids" : memref<2xi32>
  %w = step.output "w" : memref<2xf32>
  step.moe_router ins(%y, %gate : memref<64xf32>, !kiln.qweight<"gate.weight", "f32", [64, 8]>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "softmax", normalize = false, routed_scale = 1.0 : f32, top_k = 2 : i64}
  step.copy ins(%p : memref<64xf32>) outs(%z : memref<64xf32>)
  return
}

// -----

// A quantised gate: its dots stay with the router.

// CHECK-LABEL: func.func @quantised_gate
// CHECK-NOT: step.router_partial
// CHECK: step.moe_router
func.func @quantised_gate() attributes {kiln.tp = 2 : i64} {
  %o = step.input "o" : memref<32xf32>
  %x = step.input "x" : memref<64xf32>
  %wo = step.weight : !kiln.qweight<"wo.weight", "q8_0", [32, 64]>
  %norm = step.weight : !kiln.qweight<"norm.weight", "f32", [64]>
  %gate = step.weight : !kiln.qweight<"gate.weight", "q8_0", [64, 8]>
  %p = step.buffer "part" : memref<64xf32>
  step.linear ins(%o, %wo : memref<32xf32>, !kiln.qweight<"wo.weight", "q8_0", [32, 64]>) outs(%p : memref<64xf32>)
  %h = step.buffer "h" : memref<64xf32>
  %y = step.buffer "y" : memref<64xf32>
  step.all_reduce_add_rms_norm ins(%p, %x, %norm : memref<64xf32>, memref<64xf32>, !kiln.qweight<"norm.weight", "f32", [64]>) outs(%h, %y : memref<64xf32>, memref<64xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum"}
  %ids = step.output "ids" : memref<2xi32>
  %w = step.output "w" : memref<2xf32>
  step.moe_router ins(%y, %gate : memref<64xf32>, !kiln.qweight<"gate.weight", "q8_0", [64, 8]>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "softmax", normalize = false, routed_scale = 1.0 : f32, top_k = 2 : i64}
  return
}

// -----

// The residual is written between the producer and the all-reduce: a
// share taken after the producer would read another residual.

// CHECK-LABEL: func.func @residual_written_between
// CHECK-NOT: step.router_partial
// CHECK: step.moe_router
func.func @residual_written_between() attributes {kiln.tp = 2 : i64} {
  %o = step.input "o" : memref<32xf32>
  %x0 = step.input "x0" : memref<64xf32>
  %x1 = step.input "x1" : memref<64xf32>
  %wo = step.weight : !kiln.qweight<"wo.weight", "q8_0", [32, 64]>
  %norm = step.weight : !kiln.qweight<"norm.weight", "f32", [64]>
  %gate = step.weight : !kiln.qweight<"gate.weight", "f32", [64, 8]>
  %x = step.buffer "x" : memref<64xf32>
  step.copy ins(%x0 : memref<64xf32>) outs(%x : memref<64xf32>)
  %p = step.buffer "part" : memref<64xf32>
  step.linear ins(%o, %wo : memref<32xf32>, !kiln.qweight<"wo.weight", "q8_0", [32, 64]>) outs(%p : memref<64xf32>)
  step.copy ins(%x1 : memref<64xf32>) outs(%x : memref<64xf32>)
  %h = step.buffer "h" : memref<64xf32>
  %y = step.buffer "y" : memref<64xf32>
  step.all_reduce_add_rms_norm ins(%p, %x, %norm : memref<64xf32>, memref<64xf32>, !kiln.qweight<"norm.weight", "f32", [64]>) outs(%h, %y : memref<64xf32>, memref<64xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum"}
  %ids = step.output "ids" : memref<2xi32>
  %w = step.output "w" : memref<2xf32>
  step.moe_router ins(%y, %gate : memref<64xf32>, !kiln.qweight<"gate.weight", "f32", [64, 8]>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "softmax", normalize = false, routed_scale = 1.0 : f32, top_k = 2 : i64}
  return
}

// -----

// The norm's output is written between the all-reduce and the router: the
// router does not read what the all-reduce normalised.

// CHECK-LABEL: func.func @output_written_between
// CHECK-NOT: step.router_partial
// CHECK: step.moe_router
func.func @output_written_between() attributes {kiln.tp = 2 : i64} {
  %o = step.input "o" : memref<32xf32>
  %x = step.input "x" : memref<64xf32>
  %v = step.input "v" : memref<64xf32>
  %wo = step.weight : !kiln.qweight<"wo.weight", "q8_0", [32, 64]>
  %norm = step.weight : !kiln.qweight<"norm.weight", "f32", [64]>
  %gate = step.weight : !kiln.qweight<"gate.weight", "f32", [64, 8]>
  %p = step.buffer "part" : memref<64xf32>
  step.linear ins(%o, %wo : memref<32xf32>, !kiln.qweight<"wo.weight", "q8_0", [32, 64]>) outs(%p : memref<64xf32>)
  %h = step.buffer "h" : memref<64xf32>
  %y = step.buffer "y" : memref<64xf32>
  step.all_reduce_add_rms_norm ins(%p, %x, %norm : memref<64xf32>, memref<64xf32>, !kiln.qweight<"norm.weight", "f32", [64]>) outs(%h, %y : memref<64xf32>, memref<64xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum"}
  step.copy ins(%v : memref<64xf32>) outs(%y : memref<64xf32>)
  %ids = step.output "ids" : memref<2xi32>
  %w = step.output "w" : memref<2xf32>
  step.moe_router ins(%y, %gate : memref<64xf32>, !kiln.qweight<"gate.weight", "f32", [64, 8]>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "softmax", normalize = false, routed_scale = 1.0 : f32, top_k = 2 : i64}
  return
}

// -----

// The partial is a copy, not a linear's output: the simpler fold takes
// it, the composed one has no weight to compose and leaves the router.

// CHECK-LABEL: func.func @compose_not_linear
// CHECK: step.router_partial
// CHECK-SAME: residual_scale = 5.000000e-01
// CHECK-NOT: step.moe_router
// COMPOSE-LABEL: func.func @compose_not_linear
// COMPOSE-NOT: step.linear_router
// COMPOSE-NOT: tail
// COMPOSE: step.moe_router
func.func @compose_not_linear() attributes {kiln.tp = 2 : i64} {
  %o = step.input "o" : memref<32xf32>
  %x = step.input "x" : memref<64xf32>
  %v = step.input "v" : memref<64xf32>
  %p = step.buffer "part" : memref<64xf32>
  step.copy ins(%v : memref<64xf32>) outs(%p : memref<64xf32>)
  %norm = step.weight : !kiln.qweight<"norm.weight", "f32", [64]>
  %gate = step.weight : !kiln.qweight<"gate.weight", "f32", [64, 8]>
  %h = step.buffer "h" : memref<64xf32>
  %y = step.buffer "y" : memref<64xf32>
  step.all_reduce_add_rms_norm ins(%p, %x, %norm : memref<64xf32>, memref<64xf32>, !kiln.qweight<"norm.weight", "f32", [64]>) outs(%h, %y : memref<64xf32>, memref<64xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum"}
  %ids = step.output "ids" : memref<2xi32>
  %w = step.output "w" : memref<2xf32>
  step.moe_router ins(%y, %gate : memref<64xf32>, !kiln.qweight<"gate.weight", "f32", [64, 8]>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "softmax", normalize = false, routed_scale = 1.0 : f32, top_k = 2 : i64}
  return
}

// -----

// The linear's weight is whole at tp = 2 (not cut by rows): each rank's
// product would be the whole sum's, not its part, so nothing composes.

// CHECK-LABEL: func.func @compose_not_row_parallel
// CHECK: step.router_partial
// CHECK-SAME: residual_scale = 5.000000e-01
// CHECK-NOT: step.moe_router
// COMPOSE-LABEL: func.func @compose_not_row_parallel
// COMPOSE-NOT: step.linear_router
// COMPOSE-NOT: tail
// COMPOSE: step.moe_router
func.func @compose_not_row_parallel() attributes {kiln.tp = 2 : i64} {
  %o = step.input "o" : memref<32xf32>
  %x = step.input "x" : memref<64xf32>
  %wo = step.weight : !kiln.qweight<"wo.weight", "q8_0", [32, 64]>
  %p = step.buffer "part" : memref<64xf32>
  step.linear ins(%o, %wo : memref<32xf32>, !kiln.qweight<"wo.weight", "q8_0", [32, 64]>) outs(%p : memref<64xf32>)
  %norm = step.weight : !kiln.qweight<"norm.weight", "f32", [64]>
  %gate = step.weight : !kiln.qweight<"gate.weight", "f32", [64, 8]>
  %h = step.buffer "h" : memref<64xf32>
  %y = step.buffer "y" : memref<64xf32>
  step.all_reduce_add_rms_norm ins(%p, %x, %norm : memref<64xf32>, memref<64xf32>, !kiln.qweight<"norm.weight", "f32", [64]>) outs(%h, %y : memref<64xf32>, memref<64xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum"}
  %ids = step.output "ids" : memref<2xi32>
  %w = step.output "w" : memref<2xf32>
  step.moe_router ins(%y, %gate : memref<64xf32>, !kiln.qweight<"gate.weight", "f32", [64, 8]>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "softmax", normalize = false, routed_scale = 1.0 : f32, top_k = 2 : i64}
  return
}

// -----

// n = 64 at tp = 3: the residual's columns do not share out evenly over
// the ranks, so nothing composes.

// CHECK-LABEL: func.func @compose_uneven
// CHECK: step.router_partial
// CHECK-SAME: residual_scale = 0.333333343
// CHECK-NOT: step.moe_router
// COMPOSE-LABEL: func.func @compose_uneven
// COMPOSE-NOT: step.linear_router
// COMPOSE-NOT: tail
// COMPOSE: step.moe_router
func.func @compose_uneven() attributes {kiln.tp = 3 : i64} {
  %o = step.input "o" : memref<32xf32>
  %x = step.input "x" : memref<64xf32>
  %wo = step.weight : !kiln.qweight<"wo.weight", "q8_0", [32, 64], shard = 0 of 3>
  %p = step.buffer "part" : memref<64xf32>
  step.linear ins(%o, %wo : memref<32xf32>, !kiln.qweight<"wo.weight", "q8_0", [32, 64], shard = 0 of 3>) outs(%p : memref<64xf32>)
  %norm = step.weight : !kiln.qweight<"norm.weight", "f32", [64]>
  %gate = step.weight : !kiln.qweight<"gate.weight", "f32", [64, 8]>
  %h = step.buffer "h" : memref<64xf32>
  %y = step.buffer "y" : memref<64xf32>
  step.all_reduce_add_rms_norm ins(%p, %x, %norm : memref<64xf32>, memref<64xf32>, !kiln.qweight<"norm.weight", "f32", [64]>) outs(%h, %y : memref<64xf32>, memref<64xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum"}
  %ids = step.output "ids" : memref<2xi32>
  %w = step.output "w" : memref<2xf32>
  step.moe_router ins(%y, %gate : memref<64xf32>, !kiln.qweight<"gate.weight", "f32", [64, 8]>) outs(%ids, %w : memref<2xi32>, memref<2xf32>) {gating = "softmax", normalize = false, routed_scale = 1.0 : f32, top_k = 2 : i64}
  return
}
