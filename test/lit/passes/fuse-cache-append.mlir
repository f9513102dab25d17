// RUN: kiln-opt %s --split-input-file --kiln-fuse-cache-append | FileCheck %s
// RUN: kiln-opt %s --split-input-file --kiln-fuse-cache-append | kiln-opt --split-input-file | FileCheck %s

// The chains that build a cache row right before its append become one
// step.norm_rope_append, and their buffers and views go: concat(rms_norm(
// s[0, n)), rope(s[n, n + m))) (the latent cache) and rope(layer_norm(k))
// (the indexer key). Not fused: an op in between, an intermediate read by
// another op, a rope at another position, parts that are not adjacent in
// one vector.

// CHECK-LABEL: func.func @latent
// CHECK-NOT: step.rms_norm ins
// CHECK-NOT: step.rope
// CHECK-NOT: step.concat
// CHECK-NOT: step.cache_append
// CHECK: step.norm_rope_append ins(%kv, %n, %pos : memref<80xf32>, memref<64xf32>, memref<i32>) outs(%cache : memref<16x80xf16>) {dims = 16 : i64, epsilon = 9.99999974E-6 : f32, norm = "rms", norm_dims = 64 : i64, offset = 64 : i64, style = "interleaved", theta = 1.000000e+06 : f32}
// CHECK-NEXT: return
func.func @latent() {
  %kv = step.input "kv" : memref<80xf32>
  %pos = step.input "pos" : memref<i32>
  %n = step.input "n" : memref<64xf32>
  %cache = step.state "cache" : memref<16x80xf16>
  %c = step.view %kv[0] : memref<80xf32> to memref<64xf32>
  %cn = step.buffer "cn" : memref<64xf32>
  step.rms_norm ins(%c, %n : memref<64xf32>, memref<64xf32>) outs(%cn : memref<64xf32>) {epsilon = 1.0e-05 : f32}
  %pe = step.view %kv[64] : memref<80xf32> to memref<16xf32>
  %per = step.buffer "per" : memref<16xf32>
  step.rope ins(%pe, %pos : memref<16xf32>, memref<i32>) outs(%per : memref<16xf32>) {dims = 16 : i64, offset = 0 : i64, style = "interleaved", theta = 1.0e+06 : f32}
  %row = step.buffer "row" : memref<80xf32>
  step.concat ins(%cn, %per : memref<64xf32>, memref<16xf32>) outs(%row : memref<80xf32>) {dim = 0 : i64}
  step.cache_append ins(%row, %pos : memref<80xf32>, memref<i32>) outs(%cache : memref<16x80xf16>)
  return
}

// -----

// The parts are a slice of a wider vector, rotated first: a view of the
// row is made at its offset.
// CHECK-LABEL: func.func @latent_in_wider
// CHECK: %[[ROW:.+]] = step.view %fused[8] : memref<96xf32> to memref<80xf32>
// CHECK-NEXT: step.norm_rope_append ins(%[[ROW]], %n, %pos : memref<80xf32>, memref<64xf32>, memref<i32>) outs(%cache : memref<16x80xf32>) {dims = 8 : i64, epsilon = 9.99999974E-6 : f32, norm = "rms", norm_dims = 64 : i64, offset = 72 : i64, style = "neox", theta = 1.000000e+04 : f32}
// CHECK-NEXT: return
func.func @latent_in_wider() {
  %fused = step.input "fused" : memref<96xf32>
  %pos = step.input "pos" : memref<i32>
  %n = step.input "n" : memref<64xf32>
  %cache = step.state "cache" : memref<16x80xf32>
  %pe = step.view %fused[72] : memref<96xf32> to memref<16xf32>
  %per = step.buffer "per" : memref<16xf32>
  step.rope ins(%pe, %pos : memref<16xf32>, memref<i32>) outs(%per : memref<16xf32>) {dims = 8 : i64, offset = 8 : i64, style = "neox", theta = 1.0e+04 : f32}
  %c = step.view %fused[8] : memref<96xf32> to memref<64xf32>
  %cn = step.buffer "cn" : memref<64xf32>
  step.rms_norm ins(%c, %n : memref<64xf32>, memref<64xf32>) outs(%cn : memref<64xf32>) {epsilon = 1.0e-05 : f32}
  %row = step.buffer "row" : memref<80xf32>
  step.concat ins(%cn, %per : memref<64xf32>, memref<16xf32>) outs(%row : memref<80xf32>) {dim = 0 : i64}
  step.cache_append ins(%row, %pos : memref<80xf32>, memref<i32>) outs(%cache : memref<16x80xf32>)
  return
}

// -----

// CHECK-LABEL: func.func @index_key
// CHECK-NOT: step.layer_norm
// CHECK: step.norm_rope_append ins(%k, %blk.0.indexer.k_norm, %pos : memref<32xf32>, !kiln.qweight<"blk.0.indexer.k_norm.weight", "f32", [32]>, memref<i32>) bias(%blk.0.indexer.k_norm.bias : !kiln.qweight<"blk.0.indexer.k_norm.bias", "f32", [32]>) outs(%cache : memref<16x32xbf16>) {dims = 16 : i64, epsilon = 9.99999997E-7 : f32, norm = "layer", norm_dims = 32 : i64, offset = 0 : i64, style = "interleaved", theta = 1.000000e+06 : f32}
// CHECK-NEXT: return
func.func @index_key() {
  %k = step.input "k" : memref<32xf32>
  %pos = step.input "pos" : memref<i32>
  %w = step.weight : !kiln.qweight<"blk.0.indexer.k_norm.weight", "f32", [32]>
  %b = step.weight : !kiln.qweight<"blk.0.indexer.k_norm.bias", "f32", [32]>
  %cache = step.state "cache" : memref<16x32xbf16>
  %kn = step.buffer "kn" : memref<32xf32>
  step.layer_norm ins(%k, %w, %b : memref<32xf32>, !kiln.qweight<"blk.0.indexer.k_norm.weight", "f32", [32]>, !kiln.qweight<"blk.0.indexer.k_norm.bias", "f32", [32]>) outs(%kn : memref<32xf32>) {epsilon = 1.0e-06 : f32}
  %kr = step.buffer "kr" : memref<32xf32>
  step.rope ins(%kn, %pos : memref<32xf32>, memref<i32>) outs(%kr : memref<32xf32>) {dims = 16 : i64, offset = 0 : i64, style = "interleaved", theta = 1.0e+06 : f32}
  step.cache_append ins(%kr, %pos : memref<32xf32>, memref<i32>) outs(%cache : memref<16x32xbf16>)
  return
}

// -----

// CHECK-LABEL: func.func @op_in_between
// CHECK: step.layer_norm
// CHECK: step.copy
// CHECK: step.rope
// CHECK: step.cache_append
// CHECK-NOT: step.norm_rope_append
func.func @op_in_between() {
  %k = step.input "k" : memref<32xf32>
  %z = step.output "z" : memref<32xf32>
  %pos = step.input "pos" : memref<i32>
  %w = step.input "w" : memref<32xf32>
  %b = step.input "b" : memref<32xf32>
  %cache = step.state "cache" : memref<16x32xf16>
  %kn = step.buffer "kn" : memref<32xf32>
  step.layer_norm ins(%k, %w, %b : memref<32xf32>, memref<32xf32>, memref<32xf32>) outs(%kn : memref<32xf32>) {epsilon = 1.0e-06 : f32}
  step.copy ins(%k : memref<32xf32>) outs(%z : memref<32xf32>)
  %kr = step.buffer "kr" : memref<32xf32>
  step.rope ins(%kn, %pos : memref<32xf32>, memref<i32>) outs(%kr : memref<32xf32>) {dims = 16 : i64, offset = 0 : i64, style = "interleaved", theta = 1.0e+06 : f32}
  step.cache_append ins(%kr, %pos : memref<32xf32>, memref<i32>) outs(%cache : memref<16x32xf16>)
  return
}

// -----

// CHECK-LABEL: func.func @second_reader
// CHECK: step.layer_norm
// CHECK: step.rope
// CHECK: step.cache_append
// CHECK: step.copy ins(%kr
// CHECK-NOT: step.norm_rope_append
func.func @second_reader() {
  %k = step.input "k" : memref<32xf32>
  %z = step.output "z" : memref<32xf32>
  %pos = step.input "pos" : memref<i32>
  %w = step.input "w" : memref<32xf32>
  %b = step.input "b" : memref<32xf32>
  %cache = step.state "cache" : memref<16x32xf16>
  %kn = step.buffer "kn" : memref<32xf32>
  step.layer_norm ins(%k, %w, %b : memref<32xf32>, memref<32xf32>, memref<32xf32>) outs(%kn : memref<32xf32>) {epsilon = 1.0e-06 : f32}
  %kr = step.buffer "kr" : memref<32xf32>
  step.rope ins(%kn, %pos : memref<32xf32>, memref<i32>) outs(%kr : memref<32xf32>) {dims = 16 : i64, offset = 0 : i64, style = "interleaved", theta = 1.0e+06 : f32}
  step.cache_append ins(%kr, %pos : memref<32xf32>, memref<i32>) outs(%cache : memref<16x32xf16>)
  step.copy ins(%kr : memref<32xf32>) outs(%z : memref<32xf32>)
  return
}

// -----

// CHECK-LABEL: func.func @other_position
// CHECK: step.rope
// CHECK: step.cache_append
// CHECK-NOT: step.norm_rope_append
func.func @other_position() {
  %k = step.input "k" : memref<32xf32>
  %pos = step.input "pos" : memref<i32>
  %pos2 = step.input "pos2" : memref<i32>
  %w = step.input "w" : memref<32xf32>
  %cache = step.state "cache" : memref<16x32xf16>
  %kn = step.buffer "kn" : memref<32xf32>
  step.rms_norm ins(%k, %w : memref<32xf32>, memref<32xf32>) outs(%kn : memref<32xf32>) {epsilon = 1.0e-06 : f32}
  %kr = step.buffer "kr" : memref<32xf32>
  step.rope ins(%kn, %pos2 : memref<32xf32>, memref<i32>) outs(%kr : memref<32xf32>) {dims = 16 : i64, offset = 0 : i64, style = "interleaved", theta = 1.0e+06 : f32}
  step.cache_append ins(%kr, %pos : memref<32xf32>, memref<i32>) outs(%cache : memref<16x32xf16>)
  return
}

// -----

// The rotated part is not right after the normalised one in the vector.
// CHECK-LABEL: func.func @parts_apart
// CHECK: step.concat
// CHECK: step.cache_append
// CHECK-NOT: step.norm_rope_append
func.func @parts_apart() {
  %kv = step.input "kv" : memref<96xf32>
  %pos = step.input "pos" : memref<i32>
  %n = step.input "n" : memref<64xf32>
  %cache = step.state "cache" : memref<16x80xf16>
  %c = step.view %kv[0] : memref<96xf32> to memref<64xf32>
  %cn = step.buffer "cn" : memref<64xf32>
  step.rms_norm ins(%c, %n : memref<64xf32>, memref<64xf32>) outs(%cn : memref<64xf32>) {epsilon = 1.0e-05 : f32}
  %pe = step.view %kv[80] : memref<96xf32> to memref<16xf32>
  %per = step.buffer "per" : memref<16xf32>
  step.rope ins(%pe, %pos : memref<16xf32>, memref<i32>) outs(%per : memref<16xf32>) {dims = 16 : i64, offset = 0 : i64, style = "interleaved", theta = 1.0e+06 : f32}
  %row = step.buffer "row" : memref<80xf32>
  step.concat ins(%cn, %per : memref<64xf32>, memref<16xf32>) outs(%row : memref<80xf32>) {dim = 0 : i64}
  step.cache_append ins(%row, %pos : memref<80xf32>, memref<i32>) outs(%cache : memref<16x80xf16>)
  return
}
