// RUN: kiln-opt %s --split-input-file --kiln-mark-live-rows | FileCheck %s
// RUN: kiln-opt %s --split-input-file --kiln-mark-live-rows | kiln-opt --split-input-file | FileCheck %s

// A projection segment that only a dsa_indexer reads, as its query or its
// head weights, at the step's position input, is live from the indexer's
// top_k; the other segments from 0. Not marked: a segment something else
// also reads, a view across two segments, an indexer at another position.

// CHECK-LABEL: func.func @indexer_query
// CHECK: step.fused_linear ins(%x, %q_b, %iq_b : {{.+}}) outs(%q : memref<256xf32>) {live_from = array<i64: 0, 32>, segments =
// CHECK: step.fused_linear ins(%x, %k, %iw : {{.+}}) outs(%kw : memref<36xf32>) {live_from = array<i64: 0, 32>, segments =
func.func @indexer_query() {
  %x = step.input "x" : memref<128xf32>
  %pos = step.input "position" : memref<i32>
  %y = step.output "y" : memref<128xf32>
  %z = step.output "z" : memref<32xf32>
  %sel = step.output "sel" : memref<32xi32>
  %n = step.output "n" : memref<i32>
  %q_b = step.weight : !kiln.qweight<"q_b.weight", "q8_0", [128, 128]>
  %iq_b = step.weight : !kiln.qweight<"iq_b.weight", "q8_0", [128, 128]>
  %k = step.weight : !kiln.qweight<"k.weight", "f16", [128, 32]>
  %iw = step.weight : !kiln.qweight<"iw.weight", "f32", [128, 4]>
  %ic = step.state "ic" : memref<4096x32xf16>
  %q = step.buffer "q" : memref<256xf32>
  %kw = step.buffer "kw" : memref<36xf32>
  step.fused_linear ins(%x, %q_b, %iq_b : memref<128xf32>, !kiln.qweight<"q_b.weight", "q8_0", [128, 128]>, !kiln.qweight<"iq_b.weight", "q8_0", [128, 128]>) outs(%q : memref<256xf32>) {segments = [#kiln.segment<name = "q_b", offset = 0, rows = 128, format = "q8_0">, #kiln.segment<name = "iq_b", offset = 128, rows = 128, format = "q8_0">]}
  step.fused_linear ins(%x, %k, %iw : memref<128xf32>, !kiln.qweight<"k.weight", "f16", [128, 32]>, !kiln.qweight<"iw.weight", "f32", [128, 4]>) outs(%kw : memref<36xf32>) {segments = [#kiln.segment<name = "k", offset = 0, rows = 32, format = "f16">, #kiln.segment<name = "iw", offset = 32, rows = 4, format = "f32">]}
  %kk = step.view %kw[0] : memref<36xf32> to memref<32xf32>
  %w = step.view %kw[32] : memref<36xf32> to memref<4xf32>
  %qn = step.view %q[0] : memref<256xf32> to memref<128xf32>
  %qi = step.view %q[128] : memref<256xf32> to memref<128xf32>
  %qh = step.view %qi[0] : memref<128xf32> to memref<4x32xf32>
  step.copy ins(%qn : memref<128xf32>) outs(%y : memref<128xf32>)
  step.copy ins(%kk : memref<32xf32>) outs(%z : memref<32xf32>)
  step.dsa_indexer ins(%qh, %w, %ic, %pos : memref<4x32xf32>, memref<4xf32>, memref<4096x32xf16>, memref<i32>) outs(%sel, %n : memref<32xi32>, memref<i32>) {scale = 0.088 : f32, top_k = 32 : i64}
  return
}

// -----

// CHECK-LABEL: func.func @second_reader
// CHECK-NOT: live_from
func.func @second_reader() {
  %x = step.input "x" : memref<128xf32>
  %pos = step.input "position" : memref<i32>
  %w = step.input "w" : memref<4xf32>
  %y = step.output "y" : memref<128xf32>
  %sel = step.output "sel" : memref<32xi32>
  %n = step.output "n" : memref<i32>
  %q_b = step.weight : !kiln.qweight<"q_b.weight", "q8_0", [128, 128]>
  %iq_b = step.weight : !kiln.qweight<"iq_b.weight", "q8_0", [128, 128]>
  %ic = step.state "ic" : memref<4096x32xf16>
  %q = step.buffer "q" : memref<256xf32>
  step.fused_linear ins(%x, %q_b, %iq_b : memref<128xf32>, !kiln.qweight<"q_b.weight", "q8_0", [128, 128]>, !kiln.qweight<"iq_b.weight", "q8_0", [128, 128]>) outs(%q : memref<256xf32>) {segments = [#kiln.segment<name = "q_b", offset = 0, rows = 128, format = "q8_0">, #kiln.segment<name = "iq_b", offset = 128, rows = 128, format = "q8_0">]}
  %qi = step.view %q[128] : memref<256xf32> to memref<128xf32>
  %qh = step.view %qi[0] : memref<128xf32> to memref<4x32xf32>
  %tail = step.view %q[96] : memref<256xf32> to memref<128xf32>
  step.copy ins(%tail : memref<128xf32>) outs(%y : memref<128xf32>)
  step.dsa_indexer ins(%qh, %w, %ic, %pos : memref<4x32xf32>, memref<4xf32>, memref<4096x32xf16>, memref<i32>) outs(%sel, %n : memref<32xi32>, memref<i32>) {scale = 0.088 : f32, top_k = 32 : i64}
  return
}

// -----

// The query spans both segments.
// CHECK-LABEL: func.func @across_segments
// CHECK-NOT: live_from
func.func @across_segments() {
  %x = step.input "x" : memref<128xf32>
  %pos = step.input "position" : memref<i32>
  %w = step.input "w" : memref<4xf32>
  %sel = step.output "sel" : memref<32xi32>
  %n = step.output "n" : memref<i32>
  %a = step.weight : !kiln.qweight<"a.weight", "q8_0", [128, 64]>
  %b = step.weight : !kiln.qweight<"b.weight", "q8_0", [128, 64]>
  %ic = step.state "ic" : memref<4096x32xf16>
  %q = step.buffer "q" : memref<128xf32>
  step.fused_linear ins(%x, %a, %b : memref<128xf32>, !kiln.qweight<"a.weight", "q8_0", [128, 64]>, !kiln.qweight<"b.weight", "q8_0", [128, 64]>) outs(%q : memref<128xf32>) {segments = [#kiln.segment<name = "a", offset = 0, rows = 64, format = "q8_0">, #kiln.segment<name = "b", offset = 64, rows = 64, format = "q8_0">]}
  %qh = step.view %q[0] : memref<128xf32> to memref<4x32xf32>
  step.dsa_indexer ins(%qh, %w, %ic, %pos : memref<4x32xf32>, memref<4xf32>, memref<4096x32xf16>, memref<i32>) outs(%sel, %n : memref<32xi32>, memref<i32>) {scale = 0.088 : f32, top_k = 32 : i64}
  return
}

// -----

// The indexer's position is not the step's position input.
// CHECK-LABEL: func.func @other_position
// CHECK-NOT: live_from
func.func @other_position() {
  %x = step.input "x" : memref<128xf32>
  %pos = step.input "other" : memref<i32>
  %w = step.input "w" : memref<4xf32>
  %sel = step.output "sel" : memref<32xi32>
  %n = step.output "n" : memref<i32>
  %q_b = step.weight : !kiln.qweight<"q_b.weight", "q8_0", [128, 128]>
  %iq_b = step.weight : !kiln.qweight<"iq_b.weight", "q8_0", [128, 128]>
  %ic = step.state "ic" : memref<4096x32xf16>
  %q = step.buffer "q" : memref<256xf32>
  step.fused_linear ins(%x, %q_b, %iq_b : memref<128xf32>, !kiln.qweight<"q_b.weight", "q8_0", [128, 128]>, !kiln.qweight<"iq_b.weight", "q8_0", [128, 128]>) outs(%q : memref<256xf32>) {segments = [#kiln.segment<name = "q_b", offset = 0, rows = 128, format = "q8_0">, #kiln.segment<name = "iq_b", offset = 128, rows = 128, format = "q8_0">]}
  %qi = step.view %q[128] : memref<256xf32> to memref<128xf32>
  %qh = step.view %qi[0] : memref<128xf32> to memref<4x32xf32>
  step.dsa_indexer ins(%qh, %w, %ic, %pos : memref<4x32xf32>, memref<4xf32>, memref<4096x32xf16>, memref<i32>) outs(%sel, %n : memref<32xi32>, memref<i32>) {scale = 0.088 : f32, top_k = 32 : i64}
  return
}
