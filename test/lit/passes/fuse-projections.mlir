// RUN: kiln-opt %s --kiln-fuse-projections | FileCheck %s
// RUN: kiln-opt %s --kiln-fuse-projections | kiln-opt | FileCheck %s
// RUN: kiln-opt %s --kiln-fuse-projections --kiln-lower-to-step | FileCheck %s --check-prefix=STEP

// Projections of one input become one kiln.fused_linear whose segment map
// lists them in program order, each with its own format; consumers read
// contiguous slices (views after lowering). Not fused: a projection of
// another value, a stacked (3-D) weight, and a batched input.

// CHECK-LABEL: func.func @attention_inputs
func.func @attention_inputs(%a: tensor<256xf32>, %c: tensor<128xf32>, %h: tensor<8x32xf32>)
    -> (tensor<128xf32>, tensor<80xf32>, tensor<32xf32>, tensor<4xf32>, tensor<384xf32>, tensor<8x64xf32>) {
  // The later members' weight handles move above the fused op.
  // CHECK: %[[QA:.+]] = kiln.weight : !kiln.qweight<"blk.0.attn_q_a.weight", "q8_0", [256, 128]>
  // CHECK-NEXT: %[[KV:.+]] = kiln.weight : !kiln.qweight<"blk.0.attn_kv_a_mqa.weight", "q8_0", [256, 80]>
  // CHECK-NEXT: %[[IK:.+]] = kiln.weight : !kiln.qweight<"blk.0.indexer.attn_k.weight", "f16", [256, 32]>
  // CHECK-NEXT: %[[IP:.+]] = kiln.weight : !kiln.qweight<"blk.0.indexer.proj.weight", "f32", [256, 4]>
  // CHECK-NEXT: %[[F:.+]] = kiln.fused_linear %{{.+}} weights(%[[QA]], %[[KV]], %[[IK]], %[[IP]])
  // CHECK-SAME: segments = [#kiln.segment<name = "blk.0.attn_q_a", offset = 0, rows = 128, format = "q8_0">,
  // CHECK-SAME: #kiln.segment<name = "blk.0.attn_kv_a_mqa", offset = 128, rows = 80, format = "q8_0">,
  // CHECK-SAME: #kiln.segment<name = "blk.0.indexer.attn_k", offset = 208, rows = 32, format = "f16">,
  // CHECK-SAME: #kiln.segment<name = "blk.0.indexer.proj", offset = 240, rows = 4, format = "f32">]
  // CHECK-SAME: -> tensor<244xf32>
  // CHECK-NEXT: %[[S0:.+]] = tensor.extract_slice %[[F]][0] [128] [1] : tensor<244xf32> to tensor<128xf32>
  // CHECK-NEXT: %[[S1:.+]] = tensor.extract_slice %[[F]][128] [80] [1]
  // CHECK-NEXT: %[[S2:.+]] = tensor.extract_slice %[[F]][208] [32] [1]
  // CHECK-NEXT: %[[S3:.+]] = tensor.extract_slice %[[F]][240] [4] [1]
  %qa = kiln.weight : !kiln.qweight<"blk.0.attn_q_a.weight", "q8_0", [256, 128]>
  %q = kiln.linear %a, %qa : tensor<256xf32>, !kiln.qweight<"blk.0.attn_q_a.weight", "q8_0", [256, 128]> -> tensor<128xf32>
  // Another input: its own group (two members, so fused too).
  // CHECK: %[[QB:.+]] = kiln.weight : !kiln.qweight<"blk.0.attn_q_b.weight", "q8_0", [128, 384]>
  // CHECK: kiln.fused_linear %{{.+}} weights(%[[QB]], %{{.+}}) {segments = [#kiln.segment<name = "blk.0.attn_q_b", offset = 0, rows = 384, format = "q8_0">, #kiln.segment<name = "blk.0.indexer.attn_q_b", offset = 384, rows = 128, format = "f16">]}
  %qbw = kiln.weight : !kiln.qweight<"blk.0.attn_q_b.weight", "q8_0", [128, 384]>
  %qb = kiln.linear %c, %qbw : tensor<128xf32>, !kiln.qweight<"blk.0.attn_q_b.weight", "q8_0", [128, 384]> -> tensor<384xf32>
  %kvw = kiln.weight : !kiln.qweight<"blk.0.attn_kv_a_mqa.weight", "q8_0", [256, 80]>
  %kv = kiln.linear %a, %kvw : tensor<256xf32>, !kiln.qweight<"blk.0.attn_kv_a_mqa.weight", "q8_0", [256, 80]> -> tensor<80xf32>
  %iqw = kiln.weight : !kiln.qweight<"blk.0.indexer.attn_q_b.weight", "f16", [128, 128]>
  %iq = kiln.linear %c, %iqw : tensor<128xf32>, !kiln.qweight<"blk.0.indexer.attn_q_b.weight", "f16", [128, 128]> -> tensor<128xf32>
  %ikw = kiln.weight : !kiln.qweight<"blk.0.indexer.attn_k.weight", "f16", [256, 32]>
  %ik = kiln.linear %a, %ikw : tensor<256xf32>, !kiln.qweight<"blk.0.indexer.attn_k.weight", "f16", [256, 32]> -> tensor<32xf32>
  %ipw = kiln.weight : !kiln.qweight<"blk.0.indexer.proj.weight", "f32", [256, 4]>
  %ip = kiln.linear %a, %ipw : tensor<256xf32>, !kiln.qweight<"blk.0.indexer.proj.weight", "f32", [256, 4]> -> tensor<4xf32>
  // A stacked weight on a batched input stays a kiln.linear.
  // CHECK: kiln.linear %{{.+}}, %{{.+}} : tensor<8x32xf32>, !kiln.qweight<"blk.0.attn_k_b.weight"
  %kbw = kiln.weight : !kiln.qweight<"blk.0.attn_k_b.weight", "q8_0", [32, 64, 8]>
  %kb = kiln.linear %h, %kbw : tensor<8x32xf32>, !kiln.qweight<"blk.0.attn_k_b.weight", "q8_0", [32, 64, 8]> -> tensor<8x64xf32>
  // CHECK: return %[[S0]], %[[S1]], %[[S2]], %[[S3]], %{{.+}}, %{{.+}}
  return %q, %kv, %ik, %ip, %qb, %kb : tensor<128xf32>, tensor<80xf32>, tensor<32xf32>, tensor<4xf32>, tensor<384xf32>, tensor<8x64xf32>
}

// A single projection of an input is left alone.
// CHECK-LABEL: func.func @alone
// CHECK-NOT: fused_linear
// CHECK: kiln.linear
func.func @alone(%a: tensor<256xf32>) -> tensor<128xf32> {
  %w = kiln.weight : !kiln.qweight<"blk.0.attn_q_a.weight", "q8_0", [256, 128]>
  %q = kiln.linear %a, %w : tensor<256xf32>, !kiln.qweight<"blk.0.attn_q_a.weight", "q8_0", [256, 128]> -> tensor<128xf32>
  return %q : tensor<128xf32>
}

// After lowering: one step.fused_linear writing one buffer, and each part a
// view of it at its segment's offset.
// STEP-LABEL: func.func @attention_inputs()
// STEP: %[[FB:blk.0.attn_q_a.fused]] = step.buffer "blk.0.attn_q_a.fused" : memref<244xf32>
// STEP-NEXT: step.fused_linear ins(%{{.+}}, %blk.0.attn_q_a, %blk.0.attn_kv_a_mqa, %blk.0.indexer.attn_k, %blk.0.indexer.proj : {{.+}}) outs(%[[FB]] : memref<244xf32>)
// STEP: step.view %[[FB]][128] : memref<244xf32> to memref<80xf32>
