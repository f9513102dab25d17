// RUN: kiln-opt %s --split-input-file --kiln-fuse-add-norm="projection-norms=true" | FileCheck %s
// RUN: kiln-opt %s --split-input-file --kiln-fuse-add-norm="projection-norms=true" | kiln-opt --split-input-file | FileCheck %s
// RUN: kiln-opt %s --split-input-file --kiln-fuse-add-norm | FileCheck %s --check-prefix=OFF
// RUN: kiln-opt %s --split-input-file --kiln-fuse-add-norm="projection-norms=true" --kiln-fuse-norm-linear | FileCheck %s --check-prefix=LINEAR
// RUN: kiln-opt %s --split-input-file --kiln-fuse-add-norm="router-norms=true" | FileCheck %s --check-prefix=ROUTER
// RUN: kiln-opt %s --split-input-file --kiln-fuse-add-norm="router-norms=true" | kiln-opt --split-input-file | FileCheck %s --check-prefix=ROUTER

// A residual add whose sum the next compute op normalises becomes one
// step.add_rms_norm writing both. Not fused: a norm of something else, an
// op in between, a sum that is a slot.

// CHECK-LABEL: func.func @residual
// CHECK-NOT: step.add ins
// CHECK: step.add_rms_norm ins(%x, %attn, %blk.0.ffn_norm : memref<256xf32>, memref<256xf32>, !kiln.qweight<"blk.0.ffn_norm.weight", "f32", [256]>) outs(%x1, %f : memref<256xf32>, memref<256xf32>) {epsilon = 9.99999974E-6 : f32}
// CHECK-NOT: step.rms_norm
// CHECK: step.add ins(%x1, %f :
func.func @residual() {
  %x = step.input "x" : memref<256xf32>
  %attn = step.input "attn" : memref<256xf32>
  %out = step.output "out" : memref<256xf32>
  %w = step.weight : !kiln.qweight<"blk.0.ffn_norm.weight", "f32", [256]>
  %x1 = step.buffer "x1" : memref<256xf32>
  step.add ins(%x, %attn : memref<256xf32>, memref<256xf32>) outs(%x1 : memref<256xf32>)
  %f = step.buffer "f" : memref<256xf32>
  step.rms_norm ins(%x1, %w : memref<256xf32>, !kiln.qweight<"blk.0.ffn_norm.weight", "f32", [256]>) outs(%f : memref<256xf32>) {epsilon = 1.0e-05 : f32}
  step.add ins(%x1, %f : memref<256xf32>, memref<256xf32>) outs(%out : memref<256xf32>)
  return
}

// -----

// CHECK-LABEL: func.func @not_adjacent
// CHECK: step.add ins
// CHECK: step.copy
// CHECK: step.rms_norm
func.func @not_adjacent() {
  %x = step.input "x" : memref<256xf32>
  %out = step.output "out" : memref<256xf32>
  %w = step.input "w" : memref<256xf32>
  %s = step.buffer "s" : memref<256xf32>
  %c = step.buffer "c" : memref<256xf32>
  step.add ins(%x, %x : memref<256xf32>, memref<256xf32>) outs(%s : memref<256xf32>)
  step.copy ins(%s : memref<256xf32>) outs(%c : memref<256xf32>)
  step.rms_norm ins(%s, %w : memref<256xf32>, memref<256xf32>) outs(%out : memref<256xf32>) {epsilon = 1.0e-05 : f32}
  return
}

// -----

// CHECK-LABEL: func.func @other_input
// CHECK: step.add ins
// CHECK: step.rms_norm ins(%x,
func.func @other_input() {
  %x = step.input "x" : memref<256xf32>
  %out = step.output "out" : memref<256xf32>
  %w = step.input "w" : memref<256xf32>
  %s = step.buffer "s" : memref<256xf32>
  step.add ins(%x, %x : memref<256xf32>, memref<256xf32>) outs(%s : memref<256xf32>)
  step.rms_norm ins(%x, %w : memref<256xf32>, memref<256xf32>) outs(%out : memref<256xf32>) {epsilon = 1.0e-05 : f32}
  return
}

// -----

// CHECK-LABEL: func.func @sum_in_slot
// CHECK: step.add ins
// CHECK: step.rms_norm
func.func @sum_in_slot() {
  %x = step.input "x" : memref<256xf32>
  %s = step.output "s" : memref<256xf32>
  %out = step.output "out" : memref<256xf32>
  %w = step.input "w" : memref<256xf32>
  step.add ins(%x, %x : memref<256xf32>, memref<256xf32>) outs(%s : memref<256xf32>)
  step.rms_norm ins(%s, %w : memref<256xf32>, memref<256xf32>) outs(%out : memref<256xf32>) {epsilon = 1.0e-05 : f32}
  return
}

// -----

// After partitioning: the all_reduce whose result only the fused add+norm
// reads joins it; the reduced buffer disappears.
// CHECK-LABEL: func.func @collective
// CHECK-NOT: step.all_reduce ins
// CHECK-NOT: "r"
// CHECK: step.all_reduce_add_rms_norm ins(%partial, %x, %w : memref<256xf32>, memref<256xf32>, memref<256xf32>) outs(%s, %out : memref<256xf32>, memref<256xf32>) {epsilon = 9.99999974E-6 : f32, reduction = "sum"}
func.func @collective() {
  %x = step.input "x" : memref<256xf32>
  %partial = step.input "partial" : memref<256xf32>
  %w = step.input "w" : memref<256xf32>
  %out = step.output "out" : memref<256xf32>
  %r = step.buffer "r" : memref<256xf32>
  step.all_reduce ins(%partial : memref<256xf32>) outs(%r : memref<256xf32>) {reduction = "sum"}
  %s = step.buffer "s" : memref<256xf32>
  step.add ins(%x, %r : memref<256xf32>, memref<256xf32>) outs(%s : memref<256xf32>)
  step.rms_norm ins(%s, %w : memref<256xf32>, memref<256xf32>) outs(%out : memref<256xf32>) {epsilon = 1.0e-05 : f32}
  return
}

// -----

// A reduced value read elsewhere too stays a separate all_reduce.
// CHECK-LABEL: func.func @collective_other_reader
// CHECK: step.all_reduce ins
// CHECK: step.add_rms_norm
func.func @collective_other_reader() {
  %x = step.input "x" : memref<256xf32>
  %partial = step.input "partial" : memref<256xf32>
  %w = step.input "w" : memref<256xf32>
  %out = step.output "out" : memref<256xf32>
  %out2 = step.output "out2" : memref<256xf32>
  %r = step.buffer "r" : memref<256xf32>
  step.all_reduce ins(%partial : memref<256xf32>) outs(%r : memref<256xf32>) {reduction = "sum"}
  %s = step.buffer "s" : memref<256xf32>
  step.add ins(%x, %r : memref<256xf32>, memref<256xf32>) outs(%s : memref<256xf32>)
  step.rms_norm ins(%s, %w : memref<256xf32>, memref<256xf32>) outs(%out : memref<256xf32>) {epsilon = 1.0e-05 : f32}
  step.copy ins(%r : memref<256xf32>) outs(%out2 : memref<256xf32>)
  return
}

// -----

// A sum over ranks whose norm feeds a projection of Q8_0 weights (the
// next op, its only reader): the collective takes the add alone
// (step.all_reduce_add) and the norm is left for kiln-fuse-norm-linear
// (projection-norms). Without the option the collective takes the norm.
// CHECK-LABEL: func.func @norm_for_projection
// CHECK-NOT: step.all_reduce ins
// CHECK-NOT: "r"
// CHECK: step.all_reduce_add ins(%partial, %x : memref<256xf32>, memref<256xf32>) outs(%s : memref<256xf32>) {reduction = "sum"}
// CHECK-NEXT: %n = step.buffer
// CHECK-NEXT: step.rms_norm ins(%s, %w
// CHECK-NEXT: step.fused_linear ins(%n,
// OFF-LABEL: func.func @norm_for_projection
// OFF: step.all_reduce_add_rms_norm ins(%partial, %x, %w
// OFF-NOT: step.all_reduce_add ins
// LINEAR-LABEL: func.func @norm_for_projection
// LINEAR: step.all_reduce_add ins(%partial, %x
// LINEAR-NEXT: step.rms_norm_linear ins(%s, %w, %blk.1.attn_q_a, %blk.1.attn_kv_a_mqa :
func.func @norm_for_projection() {
  %x = step.input "x" : memref<256xf32>
  %partial = step.input "partial" : memref<256xf32>
  %w = step.input "w" : memref<256xf32>
  %q_a = step.weight : !kiln.qweight<"blk.1.attn_q_a.weight", "q8_0", [256, 128]>
  %kv_a = step.weight : !kiln.qweight<"blk.1.attn_kv_a_mqa.weight", "q8_0", [256, 64]>
  %out = step.output "out" : memref<192xf32>
  %r = step.buffer "r" : memref<256xf32>
  step.all_reduce ins(%partial : memref<256xf32>) outs(%r : memref<256xf32>) {reduction = "sum"}
  %s = step.buffer "s" : memref<256xf32>
  step.add ins(%r, %x : memref<256xf32>, memref<256xf32>) outs(%s : memref<256xf32>)
  %n = step.buffer "n" : memref<256xf32>
  step.rms_norm ins(%s, %w : memref<256xf32>, memref<256xf32>) outs(%n : memref<256xf32>) {epsilon = 1.0e-05 : f32}
  step.fused_linear ins(%n, %q_a, %kv_a : memref<256xf32>, !kiln.qweight<"blk.1.attn_q_a.weight", "q8_0", [256, 128]>, !kiln.qweight<"blk.1.attn_kv_a_mqa.weight", "q8_0", [256, 64]>) outs(%out : memref<192xf32>) {segments = [#kiln.segment<name = "blk.1.attn_q_a", offset = 0, rows = 128, format = "q8_0">, #kiln.segment<name = "blk.1.attn_kv_a_mqa", offset = 128, rows = 64, format = "q8_0">]}
  return
}

// -----

// Q8_0 and F32 weights (GLM-5's q_a run with the indexer's head weights).
// CHECK-LABEL: func.func @norm_for_q8_0_and_f32
// CHECK: step.all_reduce_add ins(%partial, %x
// CHECK-NOT: step.all_reduce_add_rms_norm
func.func @norm_for_q8_0_and_f32() {
  %x = step.input "x" : memref<256xf32>
  %partial = step.input "partial" : memref<256xf32>
  %w = step.input "w" : memref<256xf32>
  %q_a = step.weight : !kiln.qweight<"blk.1.attn_q_a.weight", "q8_0", [256, 128]>
  %proj = step.weight : !kiln.qweight<"blk.1.indexer.proj.weight", "f32", [256, 8]>
  %out = step.output "out" : memref<136xf32>
  %r = step.buffer "r" : memref<256xf32>
  step.all_reduce ins(%partial : memref<256xf32>) outs(%r : memref<256xf32>) {reduction = "sum"}
  %s = step.buffer "s" : memref<256xf32>
  step.add ins(%x, %r : memref<256xf32>, memref<256xf32>) outs(%s : memref<256xf32>)
  %n = step.buffer "n" : memref<256xf32>
  step.rms_norm ins(%s, %w : memref<256xf32>, memref<256xf32>) outs(%n : memref<256xf32>) {epsilon = 1.0e-05 : f32}
  step.fused_linear ins(%n, %q_a, %proj : memref<256xf32>, !kiln.qweight<"blk.1.attn_q_a.weight", "q8_0", [256, 128]>, !kiln.qweight<"blk.1.indexer.proj.weight", "f32", [256, 8]>) outs(%out : memref<136xf32>) {segments = [#kiln.segment<name = "blk.1.attn_q_a", offset = 0, rows = 128, format = "q8_0">, #kiln.segment<name = "blk.1.indexer.proj", offset = 128, rows = 8, format = "f32">]}
  return
}

// -----

// A projection with a weight of another type (the CUDA backend would run
// the norm's own kernel before it), or a norm that something else reads
// too: the collective keeps the norm.
// CHECK-LABEL: func.func @norm_for_q5_k
// CHECK: step.all_reduce_add_rms_norm
// CHECK-NOT: step.all_reduce_add ins
// LINEAR-LABEL: func.func @norm_for_q5_k
// LINEAR: step.all_reduce_add_rms_norm
// LINEAR-NOT: step.rms_norm_linear
func.func @norm_for_q5_k() {
  %x = step.input "x" : memref<256xf32>
  %partial = step.input "partial" : memref<256xf32>
  %w = step.input "w" : memref<256xf32>
  %gate = step.weight : !kiln.qweight<"blk.0.ffn_gate.weight", "q5_k", [256, 256]>
  %out = step.output "out" : memref<256xf32>
  %r = step.buffer "r" : memref<256xf32>
  step.all_reduce ins(%partial : memref<256xf32>) outs(%r : memref<256xf32>) {reduction = "sum"}
  %s = step.buffer "s" : memref<256xf32>
  step.add ins(%x, %r : memref<256xf32>, memref<256xf32>) outs(%s : memref<256xf32>)
  %n = step.buffer "n" : memref<256xf32>
  step.rms_norm ins(%s, %w : memref<256xf32>, memref<256xf32>) outs(%n : memref<256xf32>) {epsilon = 1.0e-05 : f32}
  step.linear ins(%n, %gate : memref<256xf32>, !kiln.qweight<"blk.0.ffn_gate.weight", "q5_k", [256, 256]>) outs(%out : memref<256xf32>)
  return
}

// -----

// CHECK-LABEL: func.func @norm_read_twice
// CHECK: step.all_reduce_add_rms_norm
// CHECK-NOT: step.all_reduce_add ins
func.func @norm_read_twice() {
  %x = step.input "x" : memref<256xf32>
  %partial = step.input "partial" : memref<256xf32>
  %w = step.input "w" : memref<256xf32>
  %q_a = step.weight : !kiln.qweight<"blk.1.attn_q_a.weight", "q8_0", [256, 128]>
  %out = step.output "out" : memref<128xf32>
  %out2 = step.output "out2" : memref<256xf32>
  %r = step.buffer "r" : memref<256xf32>
  step.all_reduce ins(%partial : memref<256xf32>) outs(%r : memref<256xf32>) {reduction = "sum"}
  %s = step.buffer "s" : memref<256xf32>
  step.add ins(%x, %r : memref<256xf32>, memref<256xf32>) outs(%s : memref<256xf32>)
  %n = step.buffer "n" : memref<256xf32>
  step.rms_norm ins(%s, %w : memref<256xf32>, memref<256xf32>) outs(%n : memref<256xf32>) {epsilon = 1.0e-05 : f32}
  step.linear ins(%n, %q_a : memref<256xf32>, !kiln.qweight<"blk.1.attn_q_a.weight", "q8_0", [256, 128]>) outs(%out : memref<128xf32>)
  step.copy ins(%n : memref<256xf32>) outs(%out2 : memref<256xf32>)
  return
}

// -----

// router-norms: the norm of a collective's sum feeds a router of an F32
// gate right after it (and the experts after that): the collective takes
// the add alone and the norm and the router become one
// step.rms_norm_router, which still writes the normalised vector the
// experts read. Not with a Q8_0 gate, and not without the option.
// ROUTER-LABEL: func.func @norm_for_router
// ROUTER: step.all_reduce_add ins(%partial, %x : memref<256xf32>, memref<256xf32>) outs(%s : memref<256xf32>) {reduction = "sum"}
// ROUTER-NOT: step.rms_norm ins
// ROUTER: step.rms_norm_router ins(%s, %w, %blk.1.ffn_gate_inp, %bias : memref<256xf32>, memref<256xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [256, 16]>, memref<16xf32>) outs(%n, %ids, %rw : memref<256xf32>, memref<4xi32>, memref<4xf32>) {epsilon = 9.99999974E-6 : f32, gating = "sigmoid", normalize = true, routed_scale = 2.500000e+00 : f32, top_k = 4 : i64}
// ROUTER-NEXT: step.copy ins(%n
// CHECK-LABEL: func.func @norm_for_router
// CHECK: step.all_reduce_add_rms_norm
// CHECK: step.moe_router
func.func @norm_for_router() {
  %x = step.input "x" : memref<256xf32>
  %partial = step.input "partial" : memref<256xf32>
  %w = step.input "w" : memref<256xf32>
  %bias = step.input "bias" : memref<16xf32>
  %gate = step.weight : !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [256, 16]>
  %out = step.output "out" : memref<256xf32>
  %ids = step.output "ids" : memref<4xi32>
  %rw = step.output "rw" : memref<4xf32>
  %r = step.buffer "r" : memref<256xf32>
  step.all_reduce ins(%partial : memref<256xf32>) outs(%r : memref<256xf32>) {reduction = "sum"}
  %s = step.buffer "s" : memref<256xf32>
  step.add ins(%x, %r : memref<256xf32>, memref<256xf32>) outs(%s : memref<256xf32>)
  %n = step.buffer "n" : memref<256xf32>
  step.rms_norm ins(%s, %w : memref<256xf32>, memref<256xf32>) outs(%n : memref<256xf32>) {epsilon = 1.0e-05 : f32}
  step.moe_router ins(%n, %gate, %bias : memref<256xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [256, 16]>, memref<16xf32>) outs(%ids, %rw : memref<4xi32>, memref<4xf32>) {gating = "sigmoid", normalize = true, routed_scale = 2.5 : f32, top_k = 4 : i64}
  step.copy ins(%n : memref<256xf32>) outs(%out : memref<256xf32>)
  return
}

// -----

// ROUTER-LABEL: func.func @norm_for_q8_0_router
// ROUTER: step.all_reduce_add_rms_norm
// ROUTER-NOT: step.rms_norm_router
func.func @norm_for_q8_0_router() {
  %x = step.input "x" : memref<256xf32>
  %partial = step.input "partial" : memref<256xf32>
  %w = step.input "w" : memref<256xf32>
  %gate = step.weight : !kiln.qweight<"blk.1.ffn_gate_inp.weight", "q8_0", [256, 16]>
  %ids = step.output "ids" : memref<4xi32>
  %rw = step.output "rw" : memref<4xf32>
  %r = step.buffer "r" : memref<256xf32>
  step.all_reduce ins(%partial : memref<256xf32>) outs(%r : memref<256xf32>) {reduction = "sum"}
  %s = step.buffer "s" : memref<256xf32>
  step.add ins(%x, %r : memref<256xf32>, memref<256xf32>) outs(%s : memref<256xf32>)
  %n = step.buffer "n" : memref<256xf32>
  step.rms_norm ins(%s, %w : memref<256xf32>, memref<256xf32>) outs(%n : memref<256xf32>) {epsilon = 1.0e-05 : f32}
  step.moe_router ins(%n, %gate : memref<256xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "q8_0", [256, 16]>) outs(%ids, %rw : memref<4xi32>, memref<4xf32>) {gating = "sigmoid", normalize = true, routed_scale = 2.5 : f32, top_k = 4 : i64}
  return
}
