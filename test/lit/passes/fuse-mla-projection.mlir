// RUN: kiln-opt %s --split-input-file --kiln-fuse-mla-projection | FileCheck %s
// RUN: kiln-opt %s --split-input-file --kiln-fuse-mla-projection | kiln-opt --split-input-file | FileCheck %s

// An MLA whose heads' outputs only the next compute op reads, a linear of a
// stack [latent, N, heads], becomes one step.mla_attention with that stack
// as its projection, writing the linear's output; the latent outputs'
// buffer goes. Not fused: an op in between, a second reader, an output
// slot, a 2-D weight.

// CHECK-LABEL: func.func @v_b
// CHECK-NOT: step.buffer "o"
// CHECK: step.mla_attention ins(%ql, %qr, %kv, %pos, %sel, %n : memref<8x64xf32>, memref<8x16xf32>, memref<4096x80xf16>, memref<i32>, memref<32xi32>, memref<i32>) projection(%blk.0.attn_v_b : !kiln.qweight<"blk.0.attn_v_b.weight", "q8_0", [64, 32, 8]>) outs(%v : memref<8x32xf32>) {scale = 1.440000e-01 : f32}
// CHECK-NOT: step.linear
func.func @v_b() {
  %ql = step.input "ql" : memref<8x64xf32>
  %qr = step.input "qr" : memref<8x16xf32>
  %pos = step.input "pos" : memref<i32>
  %sel = step.input "sel" : memref<32xi32>
  %n = step.input "n" : memref<i32>
  %kv = step.state "kv" : memref<4096x80xf16>
  %v = step.output "v" : memref<8x32xf32>
  %v_b = step.weight : !kiln.qweight<"blk.0.attn_v_b.weight", "q8_0", [64, 32, 8]>
  %o = step.buffer "o" : memref<8x64xf32>
  step.mla_attention ins(%ql, %qr, %kv, %pos, %sel, %n : memref<8x64xf32>, memref<8x16xf32>, memref<4096x80xf16>, memref<i32>, memref<32xi32>, memref<i32>) outs(%o : memref<8x64xf32>) {scale = 0.144 : f32}
  step.linear ins(%o, %v_b : memref<8x64xf32>, !kiln.qweight<"blk.0.attn_v_b.weight", "q8_0", [64, 32, 8]>) outs(%v : memref<8x32xf32>)
  return
}

// -----

// Without a selection; a K-quant stack is folded too (the backend decides
// how it runs).
// CHECK-LABEL: func.func @no_selection
// CHECK: step.mla_attention ins(%ql, %qr, %kv, %pos : memref<2x256xf32>, memref<2x16xf32>, memref<64x272xf16>, memref<i32>) projection(%w : !kiln.qweight<"w.weight", "q4_k", [256, 32, 2]>) outs(%v : memref<2x32xf32>)
// CHECK-NOT: step.linear
func.func @no_selection() {
  %ql = step.input "ql" : memref<2x256xf32>
  %qr = step.input "qr" : memref<2x16xf32>
  %pos = step.input "pos" : memref<i32>
  %kv = step.state "kv" : memref<64x272xf16>
  %v = step.output "v" : memref<2x32xf32>
  %w = step.weight : !kiln.qweight<"w.weight", "q4_k", [256, 32, 2]>
  %o = step.buffer "o" : memref<2x256xf32>
  step.mla_attention ins(%ql, %qr, %kv, %pos : memref<2x256xf32>, memref<2x16xf32>, memref<64x272xf16>, memref<i32>) outs(%o : memref<2x256xf32>) {scale = 0.125 : f32}
  step.linear ins(%o, %w : memref<2x256xf32>, !kiln.qweight<"w.weight", "q4_k", [256, 32, 2]>) outs(%v : memref<2x32xf32>)
  return
}

// -----

// CHECK-LABEL: func.func @not_adjacent
// CHECK: step.mla_attention ins(%ql, %qr, %kv, %pos : {{.+}}) outs(%o :
// CHECK: step.copy
// CHECK: step.linear ins(%o
func.func @not_adjacent() {
  %ql = step.input "ql" : memref<2x64xf32>
  %qr = step.input "qr" : memref<2x16xf32>
  %pos = step.input "pos" : memref<i32>
  %kv = step.state "kv" : memref<64x80xf16>
  %v = step.output "v" : memref<2x32xf32>
  %z = step.output "z" : memref<2x16xf32>
  %w = step.weight : !kiln.qweight<"w.weight", "q8_0", [64, 32, 2]>
  %o = step.buffer "o" : memref<2x64xf32>
  step.mla_attention ins(%ql, %qr, %kv, %pos : memref<2x64xf32>, memref<2x16xf32>, memref<64x80xf16>, memref<i32>) outs(%o : memref<2x64xf32>) {scale = 0.125 : f32}
  step.copy ins(%qr : memref<2x16xf32>) outs(%z : memref<2x16xf32>)
  step.linear ins(%o, %w : memref<2x64xf32>, !kiln.qweight<"w.weight", "q8_0", [64, 32, 2]>) outs(%v : memref<2x32xf32>)
  return
}

// -----

// CHECK-LABEL: func.func @second_reader
// CHECK: step.mla_attention ins(%ql, %qr, %kv, %pos : {{.+}}) outs(%o :
// CHECK: step.linear ins(%o
// CHECK: step.copy ins(%o
func.func @second_reader() {
  %ql = step.input "ql" : memref<2x64xf32>
  %qr = step.input "qr" : memref<2x16xf32>
  %pos = step.input "pos" : memref<i32>
  %kv = step.state "kv" : memref<64x80xf16>
  %v = step.output "v" : memref<2x32xf32>
  %z = step.output "z" : memref<2x64xf32>
  %w = step.weight : !kiln.qweight<"w.weight", "q8_0", [64, 32, 2]>
  %o = step.buffer "o" : memref<2x64xf32>
  step.mla_attention ins(%ql, %qr, %kv, %pos : memref<2x64xf32>, memref<2x16xf32>, memref<64x80xf16>, memref<i32>) outs(%o : memref<2x64xf32>) {scale = 0.125 : f32}
  step.linear ins(%o, %w : memref<2x64xf32>, !kiln.qweight<"w.weight", "q8_0", [64, 32, 2]>) outs(%v : memref<2x32xf32>)
  step.copy ins(%o : memref<2x64xf32>) outs(%z : memref<2x64xf32>)
  return
}

// -----

// The heads' outputs are a step output: the caller reads them, so they stay.
// CHECK-LABEL: func.func @into_slot
// CHECK: step.mla_attention ins(%ql, %qr, %kv, %pos : {{.+}}) outs(%o :
// CHECK: step.linear ins(%o
func.func @into_slot() {
  %ql = step.input "ql" : memref<2x64xf32>
  %qr = step.input "qr" : memref<2x16xf32>
  %pos = step.input "pos" : memref<i32>
  %kv = step.state "kv" : memref<64x80xf16>
  %v = step.output "v" : memref<2x32xf32>
  %o = step.output "o" : memref<2x64xf32>
  %w = step.weight : !kiln.qweight<"w.weight", "q8_0", [64, 32, 2]>
  step.mla_attention ins(%ql, %qr, %kv, %pos : memref<2x64xf32>, memref<2x16xf32>, memref<64x80xf16>, memref<i32>) outs(%o : memref<2x64xf32>) {scale = 0.125 : f32}
  step.linear ins(%o, %w : memref<2x64xf32>, !kiln.qweight<"w.weight", "q8_0", [64, 32, 2]>) outs(%v : memref<2x32xf32>)
  return
}

// -----

// One matrix for all heads (a 2-D weight): not a per-head projection.
// CHECK-LABEL: func.func @plain_matrix
// CHECK: step.mla_attention ins(%ql, %qr, %kv, %pos : {{.+}}) outs(%o :
// CHECK: step.linear ins(%o
func.func @plain_matrix() {
  %ql = step.input "ql" : memref<2x64xf32>
  %qr = step.input "qr" : memref<2x16xf32>
  %pos = step.input "pos" : memref<i32>
  %kv = step.state "kv" : memref<64x80xf16>
  %v = step.output "v" : memref<2x32xf32>
  %w = step.weight : !kiln.qweight<"w.weight", "q8_0", [64, 32]>
  %o = step.buffer "o" : memref<2x64xf32>
  step.mla_attention ins(%ql, %qr, %kv, %pos : memref<2x64xf32>, memref<2x16xf32>, memref<64x80xf16>, memref<i32>) outs(%o : memref<2x64xf32>) {scale = 0.125 : f32}
  step.linear ins(%o, %w : memref<2x64xf32>, !kiln.qweight<"w.weight", "q8_0", [64, 32]>) outs(%v : memref<2x32xf32>)
  return
}
