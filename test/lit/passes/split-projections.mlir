// RUN: kiln-opt %s --kiln-split-projections | FileCheck %s
// RUN: kiln-opt %s --kiln-split-projections | kiln-opt | FileCheck %s
// RUN: kiln-opt %s --kiln-split-projections --kiln-fuse-projections --kiln-lower-to-step | FileCheck %s --check-prefix=STEP

// A projection read only in slices of its heads becomes one projection per
// slice, its weight's rows cut per head (`rows = A to B of P`); fused again,
// the slices are views. Left alone: a reader that is not such a slice,
// overlapping slices, one slice of every row, a stacked weight.

// CHECK-LABEL: func.func @q_b
// CHECK-SAME: attributes {kiln.split_projections = 1 : i64}
// STEP-LABEL: func.func @q_b
func.func @q_b(%c: tensor<64xf32>) -> (tensor<4x24xf32>, tensor<4x8xf32>, tensor<4x8xf32>) {
  // CHECK: %[[N:.+]] = kiln.weight : !kiln.qweight<"blk.0.attn_q_b.weight", "q8_0", [64, 96], shard = 1 of 2, rows = 0 to 24 of 32>
  // CHECK-NEXT: %[[LN:.+]] = kiln.linear %{{.+}}, %[[N]] {{.+}} -> tensor<96xf32>
  // CHECK-NEXT: %[[EN:.+]] = tensor.expand_shape %[[LN]] {{\[\[}}0, 1]] output_shape [4, 24] : tensor<96xf32> into tensor<4x24xf32>
  // CHECK-NEXT: %[[P:.+]] = kiln.weight : !kiln.qweight<"blk.0.attn_q_b.weight", "q8_0", [64, 32], shard = 1 of 2, rows = 24 to 32 of 32>
  // CHECK-NEXT: %[[LP:.+]] = kiln.linear %{{.+}}, %[[P]] {{.+}} -> tensor<32xf32>
  // CHECK-NEXT: %[[EP:.+]] = tensor.expand_shape %[[LP]] {{\[\[}}0, 1]] output_shape [4, 8] : tensor<32xf32> into tensor<4x8xf32>
  // CHECK-NOT: extract_slice
  // Two slices of one cut read one projection.
  // CHECK: return %[[EN]], %[[EP]], %[[EP]]
  // STEP: step.fused_linear ins(%{{.+}}, %[[N:.+]], %[[P:.+]] : {{.+}}) outs(%[[F:.+]] : memref<128xf32>)
  // STEP-SAME: #kiln.segment<name = "blk.0.attn_q_b", offset = 0, rows = 96, format = "q8_0">
  // STEP-SAME: #kiln.segment<name = "blk.0.attn_q_b", offset = 96, rows = 32, format = "q8_0">
  // STEP-NOT: step.slice
  // STEP: return
  %w = kiln.weight : !kiln.qweight<"blk.0.attn_q_b.weight", "q8_0", [64, 128], shard = 1 of 2>
  %q = kiln.linear %c, %w : tensor<64xf32>, !kiln.qweight<"blk.0.attn_q_b.weight", "q8_0", [64, 128], shard = 1 of 2> -> tensor<128xf32>
  %h = tensor.expand_shape %q [[0, 1]] output_shape [4, 32] : tensor<128xf32> into tensor<4x32xf32>
  %nope = tensor.extract_slice %h[0, 0] [4, 24] [1, 1] : tensor<4x32xf32> to tensor<4x24xf32>
  %pe = tensor.extract_slice %h[0, 24] [4, 8] [1, 1] : tensor<4x32xf32> to tensor<4x8xf32>
  %pe2 = tensor.extract_slice %h[0, 24] [4, 8] [1, 1] : tensor<4x32xf32> to tensor<4x8xf32>
  return %nope, %pe, %pe2 : tensor<4x24xf32>, tensor<4x8xf32>, tensor<4x8xf32>
}

// A gap between the slices: its rows are never read, so no handle holds
// them.
// CHECK-LABEL: func.func @gap
func.func @gap(%c: tensor<64xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  // CHECK: !kiln.qweight<"w.weight", "f16", [64, 32], rows = 0 to 8 of 32>
  // CHECK: !kiln.qweight<"w.weight", "f16", [64, 32], rows = 16 to 24 of 32>
  %w = kiln.weight : !kiln.qweight<"w.weight", "f16", [64, 128]>
  %q = kiln.linear %c, %w : tensor<64xf32>, !kiln.qweight<"w.weight", "f16", [64, 128]> -> tensor<128xf32>
  %h = tensor.expand_shape %q [[0, 1]] output_shape [4, 32] : tensor<128xf32> into tensor<4x32xf32>
  %a = tensor.extract_slice %h[0, 0] [4, 8] [1, 1] : tensor<4x32xf32> to tensor<4x8xf32>
  %b = tensor.extract_slice %h[0, 16] [4, 8] [1, 1] : tensor<4x32xf32> to tensor<4x8xf32>
  return %a, %b : tensor<4x8xf32>, tensor<4x8xf32>
}

// CHECK-LABEL: func.func @left_alone
func.func @left_alone(%c: tensor<64xf32>, %pos: tensor<i32>) -> (tensor<4x8xf32>, tensor<4x32xf32>, tensor<4x24xf32>, tensor<4x16xf32>, tensor<4x32xf32>, tensor<2x32xf32>) {
  // CHECK-NOT: rows =
  // CHECK: return
  // Another reader of the heads.
  %w = kiln.weight : !kiln.qweight<"a.weight", "f32", [64, 128]>
  %q = kiln.linear %c, %w : tensor<64xf32>, !kiln.qweight<"a.weight", "f32", [64, 128]> -> tensor<128xf32>
  %h = tensor.expand_shape %q [[0, 1]] output_shape [4, 32] : tensor<128xf32> into tensor<4x32xf32>
  %s = tensor.extract_slice %h[0, 0] [4, 8] [1, 1] : tensor<4x32xf32> to tensor<4x8xf32>
  %r = kiln.rope %s[%pos] {dims = 8 : i64, offset = 0 : i64, style = "interleaved", theta = 1.0e+04 : f32} : tensor<4x8xf32>
  // Overlapping slices.
  %w2 = kiln.weight : !kiln.qweight<"b.weight", "f32", [64, 128]>
  %q2 = kiln.linear %c, %w2 : tensor<64xf32>, !kiln.qweight<"b.weight", "f32", [64, 128]> -> tensor<128xf32>
  %h2 = tensor.expand_shape %q2 [[0, 1]] output_shape [4, 32] : tensor<128xf32> into tensor<4x32xf32>
  %o1 = tensor.extract_slice %h2[0, 0] [4, 24] [1, 1] : tensor<4x32xf32> to tensor<4x24xf32>
  %o2 = tensor.extract_slice %h2[0, 16] [4, 16] [1, 1] : tensor<4x32xf32> to tensor<4x16xf32>
  // One slice of every row.
  %w3 = kiln.weight : !kiln.qweight<"c.weight", "f32", [64, 128]>
  %q3 = kiln.linear %c, %w3 : tensor<64xf32>, !kiln.qweight<"c.weight", "f32", [64, 128]> -> tensor<128xf32>
  %h3 = tensor.expand_shape %q3 [[0, 1]] output_shape [4, 32] : tensor<128xf32> into tensor<4x32xf32>
  %all = tensor.extract_slice %h3[0, 0] [4, 32] [1, 1] : tensor<4x32xf32> to tensor<4x32xf32>
  // Not every head.
  %w4 = kiln.weight : !kiln.qweight<"d.weight", "f32", [64, 128]>
  %q4 = kiln.linear %c, %w4 : tensor<64xf32>, !kiln.qweight<"d.weight", "f32", [64, 128]> -> tensor<128xf32>
  %h4 = tensor.expand_shape %q4 [[0, 1]] output_shape [4, 32] : tensor<128xf32> into tensor<4x32xf32>
  %two = tensor.extract_slice %h4[0, 0] [2, 32] [1, 1] : tensor<4x32xf32> to tensor<2x32xf32>
  return %r, %h, %o1, %o2, %all, %two : tensor<4x8xf32>, tensor<4x32xf32>, tensor<4x24xf32>, tensor<4x16xf32>, tensor<4x32xf32>, tensor<2x32xf32>
}

