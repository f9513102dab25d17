// RUN: kiln-opt %s --split-input-file --kiln-fuse-indexer-rope | FileCheck %s
// RUN: kiln-opt %s --split-input-file --kiln-fuse-indexer-rope | kiln-opt --split-input-file | FileCheck %s

// The rope of the DSA indexer's query goes into the indexer (its rope_*
// attributes), which then reads the unrotated query; ops in between that
// write other buffers do not stop it. Not fused: the query's source
// written in between, a second reader of the rotated query, another
// position.

// CHECK-LABEL: func.func @indexer_query
// CHECK-NOT: step.rope
// CHECK-NOT: step.buffer "qr"
// CHECK: step.cache_append
// CHECK-NEXT: step.dsa_indexer ins(%q, %w, %keys, %pos : memref<4x32xf32>, memref<4xf32>, memref<64x32xf16>, memref<i32>) outs(%sel, %n : memref<16xi32>, memref<i32>) {rope_dims = 16 : i64, rope_offset = 0 : i64, rope_style = "interleaved", rope_theta = 1.000000e+06 : f32, scale = 1.250000e-01 : f32, top_k = 16 : i64}
func.func @indexer_query() {
  %q = step.input "q" : memref<4x32xf32>
  %w = step.input "w" : memref<4xf32>
  %k = step.input "k" : memref<32xf32>
  %pos = step.input "pos" : memref<i32>
  %sel = step.output "sel" : memref<16xi32>
  %n = step.output "n" : memref<i32>
  %keys = step.state "keys" : memref<64x32xf16>
  %qr = step.buffer "qr" : memref<4x32xf32>
  step.rope ins(%q, %pos : memref<4x32xf32>, memref<i32>) outs(%qr : memref<4x32xf32>) {dims = 16 : i64, offset = 0 : i64, style = "interleaved", theta = 1.0e+06 : f32}
  step.cache_append ins(%k, %pos : memref<32xf32>, memref<i32>) outs(%keys : memref<64x32xf16>)
  step.dsa_indexer ins(%qr, %w, %keys, %pos : memref<4x32xf32>, memref<4xf32>, memref<64x32xf16>, memref<i32>) outs(%sel, %n : memref<16xi32>, memref<i32>) {scale = 0.125 : f32, top_k = 16 : i64}
  return
}

// -----

// CHECK-LABEL: func.func @source_rewritten
// CHECK: step.rope
// CHECK: step.copy
// CHECK: step.dsa_indexer ins(%qr,
// CHECK-NOT: rope_dims
func.func @source_rewritten() {
  %q = step.input "q" : memref<4x32xf32>
  %q2 = step.input "q2" : memref<4x32xf32>
  %w = step.input "w" : memref<4xf32>
  %pos = step.input "pos" : memref<i32>
  %sel = step.output "sel" : memref<16xi32>
  %n = step.output "n" : memref<i32>
  %keys = step.state "keys" : memref<64x32xf16>
  %src = step.buffer "src" : memref<4x32xf32>
  step.copy ins(%q : memref<4x32xf32>) outs(%src : memref<4x32xf32>)
  %qr = step.buffer "qr" : memref<4x32xf32>
  step.rope ins(%src, %pos : memref<4x32xf32>, memref<i32>) outs(%qr : memref<4x32xf32>) {dims = 16 : i64, offset = 0 : i64, style = "interleaved", theta = 1.0e+06 : f32}
  step.copy ins(%q2 : memref<4x32xf32>) outs(%src : memref<4x32xf32>)
  step.dsa_indexer ins(%qr, %w, %keys, %pos : memref<4x32xf32>, memref<4xf32>, memref<64x32xf16>, memref<i32>) outs(%sel, %n : memref<16xi32>, memref<i32>) {scale = 0.125 : f32, top_k = 16 : i64}
  return
}

// -----

// CHECK-LABEL: func.func @second_reader
// CHECK: step.rope
// CHECK: step.dsa_indexer ins(%qr,
// CHECK-NOT: rope_dims
// CHECK: step.copy ins(%qr
func.func @second_reader() {
  %q = step.input "q" : memref<4x32xf32>
  %w = step.input "w" : memref<4xf32>
  %pos = step.input "pos" : memref<i32>
  %sel = step.output "sel" : memref<16xi32>
  %n = step.output "n" : memref<i32>
  %z = step.output "z" : memref<4x32xf32>
  %keys = step.state "keys" : memref<64x32xf16>
  %qr = step.buffer "qr" : memref<4x32xf32>
  step.rope ins(%q, %pos : memref<4x32xf32>, memref<i32>) outs(%qr : memref<4x32xf32>) {dims = 16 : i64, offset = 0 : i64, style = "interleaved", theta = 1.0e+06 : f32}
  step.dsa_indexer ins(%qr, %w, %keys, %pos : memref<4x32xf32>, memref<4xf32>, memref<64x32xf16>, memref<i32>) outs(%sel, %n : memref<16xi32>, memref<i32>) {scale = 0.125 : f32, top_k = 16 : i64}
  step.copy ins(%qr : memref<4x32xf32>) outs(%z : memref<4x32xf32>)
  return
}

// -----

// CHECK-LABEL: func.func @other_position
// CHECK: step.rope
// CHECK: step.dsa_indexer ins(%qr,
// CHECK-NOT: rope_dims
func.func @other_position() {
  %q = step.input "q" : memref<4x32xf32>
  %w = step.input "w" : memref<4xf32>
  %pos = step.input "pos" : memref<i32>
  %pos2 = step.input "pos2" : memref<i32>
  %sel = step.output "sel" : memref<16xi32>
  %n = step.output "n" : memref<i32>
  %keys = step.state "keys" : memref<64x32xf16>
  %qr = step.buffer "qr" : memref<4x32xf32>
  step.rope ins(%q, %pos2 : memref<4x32xf32>, memref<i32>) outs(%qr : memref<4x32xf32>) {dims = 16 : i64, offset = 0 : i64, style = "interleaved", theta = 1.0e+06 : f32}
  step.dsa_indexer ins(%qr, %w, %keys, %pos : memref<4x32xf32>, memref<4xf32>, memref<64x32xf16>, memref<i32>) outs(%sel, %n : memref<16xi32>, memref<i32>) {scale = 0.125 : f32, top_k = 16 : i64}
  return
}
