// RUN: kiln-opt %s --split-input-file --kiln-fuse-norm-linear | FileCheck %s
// RUN: kiln-opt %s --split-input-file --kiln-fuse-norm-linear | kiln-opt --split-input-file | FileCheck %s

// An RMS norm whose output only the next compute op, a fused_linear, reads
// (as its input) becomes one step.rms_norm_linear, and the normalised
// buffer goes. Not fused: an op in between, a second reader, a norm into a
// slot, a norm feeding something else.

// CHECK-LABEL: func.func @q_b
// CHECK-NOT: step.rms_norm ins
// CHECK-NOT: step.buffer "c_q"
// CHECK: step.rms_norm_linear ins(%c, %blk.0.attn_q_a_norm, %blk.0.attn_q_b, %blk.0.indexer.attn_q_b : memref<256xf32>, !kiln.qweight<"blk.0.attn_q_a_norm.weight", "f32", [256]>, !kiln.qweight<"blk.0.attn_q_b.weight", "q8_0", [256, 128]>, !kiln.qweight<"blk.0.indexer.attn_q_b.weight", "q8_0", [256, 64]>) outs(%y : memref<192xf32>) {epsilon = 9.99999974E-6 : f32, segments = [#kiln.segment<name = "blk.0.attn_q_b", offset = 0, rows = 128, format = "q8_0">, #kiln.segment<name = "blk.0.indexer.attn_q_b", offset = 128, rows = 64, format = "q8_0">]}
// CHECK-NOT: step.fused_linear
func.func @q_b() {
  %c = step.input "c" : memref<256xf32>
  %y = step.output "y" : memref<192xf32>
  %n = step.weight : !kiln.qweight<"blk.0.attn_q_a_norm.weight", "f32", [256]>
  %q_b = step.weight : !kiln.qweight<"blk.0.attn_q_b.weight", "q8_0", [256, 128]>
  %iq_b = step.weight : !kiln.qweight<"blk.0.indexer.attn_q_b.weight", "q8_0", [256, 64]>
  %c_q = step.buffer "c_q" : memref<256xf32>
  step.rms_norm ins(%c, %n : memref<256xf32>, !kiln.qweight<"blk.0.attn_q_a_norm.weight", "f32", [256]>) outs(%c_q : memref<256xf32>) {epsilon = 1.0e-05 : f32}
  step.fused_linear ins(%c_q, %q_b, %iq_b : memref<256xf32>, !kiln.qweight<"blk.0.attn_q_b.weight", "q8_0", [256, 128]>, !kiln.qweight<"blk.0.indexer.attn_q_b.weight", "q8_0", [256, 64]>) outs(%y : memref<192xf32>) {segments = [#kiln.segment<name = "blk.0.attn_q_b", offset = 0, rows = 128, format = "q8_0">, #kiln.segment<name = "blk.0.indexer.attn_q_b", offset = 128, rows = 64, format = "q8_0">]}
  return
}

// -----

// CHECK-LABEL: func.func @not_adjacent
// CHECK: step.rms_norm ins
// CHECK: step.copy
// CHECK: step.fused_linear
// CHECK-NOT: step.rms_norm_linear
func.func @not_adjacent() {
  %c = step.input "c" : memref<256xf32>
  %y = step.output "y" : memref<192xf32>
  %z = step.output "z" : memref<256xf32>
  %n = step.input "n" : memref<256xf32>
  %q_b = step.weight : !kiln.qweight<"q_b.weight", "q8_0", [256, 128]>
  %iq_b = step.weight : !kiln.qweight<"iq_b.weight", "q8_0", [256, 64]>
  %c_q = step.buffer "c_q" : memref<256xf32>
  step.rms_norm ins(%c, %n : memref<256xf32>, memref<256xf32>) outs(%c_q : memref<256xf32>) {epsilon = 1.0e-05 : f32}
  step.copy ins(%c : memref<256xf32>) outs(%z : memref<256xf32>)
  step.fused_linear ins(%c_q, %q_b, %iq_b : memref<256xf32>, !kiln.qweight<"q_b.weight", "q8_0", [256, 128]>, !kiln.qweight<"iq_b.weight", "q8_0", [256, 64]>) outs(%y : memref<192xf32>) {segments = [#kiln.segment<name = "q_b", offset = 0, rows = 128, format = "q8_0">, #kiln.segment<name = "iq_b", offset = 128, rows = 64, format = "q8_0">]}
  return
}

// -----

// CHECK-LABEL: func.func @second_reader
// CHECK: step.rms_norm ins
// CHECK: step.fused_linear
// CHECK: step.copy ins(%c_q
// CHECK-NOT: step.rms_norm_linear
func.func @second_reader() {
  %c = step.input "c" : memref<256xf32>
  %y = step.output "y" : memref<192xf32>
  %z = step.output "z" : memref<256xf32>
  %n = step.input "n" : memref<256xf32>
  %q_b = step.weight : !kiln.qweight<"q_b.weight", "q8_0", [256, 128]>
  %iq_b = step.weight : !kiln.qweight<"iq_b.weight", "q8_0", [256, 64]>
  %c_q = step.buffer "c_q" : memref<256xf32>
  step.rms_norm ins(%c, %n : memref<256xf32>, memref<256xf32>) outs(%c_q : memref<256xf32>) {epsilon = 1.0e-05 : f32}
  step.fused_linear ins(%c_q, %q_b, %iq_b : memref<256xf32>, !kiln.qweight<"q_b.weight", "q8_0", [256, 128]>, !kiln.qweight<"iq_b.weight", "q8_0", [256, 64]>) outs(%y : memref<192xf32>) {segments = [#kiln.segment<name = "q_b", offset = 0, rows = 128, format = "q8_0">, #kiln.segment<name = "iq_b", offset = 128, rows = 64, format = "q8_0">]}
  step.copy ins(%c_q : memref<256xf32>) outs(%z : memref<256xf32>)
  return
}

// -----

// CHECK-LABEL: func.func @into_slot
// CHECK: step.rms_norm ins
// CHECK: step.fused_linear
// CHECK-NOT: step.rms_norm_linear
func.func @into_slot() {
  %c = step.input "c" : memref<256xf32>
  %y = step.output "y" : memref<192xf32>
  %c_q = step.output "c_q" : memref<256xf32>
  %n = step.input "n" : memref<256xf32>
  %q_b = step.weight : !kiln.qweight<"q_b.weight", "q8_0", [256, 128]>
  %iq_b = step.weight : !kiln.qweight<"iq_b.weight", "q8_0", [256, 64]>
  step.rms_norm ins(%c, %n : memref<256xf32>, memref<256xf32>) outs(%c_q : memref<256xf32>) {epsilon = 1.0e-05 : f32}
  step.fused_linear ins(%c_q, %q_b, %iq_b : memref<256xf32>, !kiln.qweight<"q_b.weight", "q8_0", [256, 128]>, !kiln.qweight<"iq_b.weight", "q8_0", [256, 64]>) outs(%y : memref<192xf32>) {segments = [#kiln.segment<name = "q_b", offset = 0, rows = 128, format = "q8_0">, #kiln.segment<name = "iq_b", offset = 128, rows = 64, format = "q8_0">]}
  return
}

// -----

// CHECK-LABEL: func.func @feeds_other
// CHECK: step.rms_norm ins
// CHECK: step.concat
// CHECK-NOT: step.rms_norm_linear
func.func @feeds_other() {
  %c = step.input "c" : memref<256xf32>
  %y = step.output "y" : memref<512xf32>
  %n = step.input "n" : memref<256xf32>
  %c_q = step.buffer "c_q" : memref<256xf32>
  step.rms_norm ins(%c, %n : memref<256xf32>, memref<256xf32>) outs(%c_q : memref<256xf32>) {epsilon = 1.0e-05 : f32}
  step.concat ins(%c_q, %c : memref<256xf32>, memref<256xf32>) outs(%y : memref<512xf32>) {dim = 0 : i64}
  return
}
