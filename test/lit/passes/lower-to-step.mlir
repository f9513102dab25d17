// RUN: kiln-opt %s --kiln-lower-to-step | FileCheck %s --implicit-check-not=" kiln." --implicit-check-not="= tensor."
// RUN: kiln-opt %s --kiln-lower-to-step | kiln-opt | FileCheck %s --implicit-check-not=" kiln."

// The kiln -> step lowering on a small program that uses each lowering
// rule: slots from kiln.slot, weights and state, one step op per kiln op,
// reshapes and contiguous slices as views, strided slices and concats as
// copies, a flattened layer whose buffers keep its index, a returned
// producer writing its output slot, and a returned layer result copied.
// Not checked here: offsets (plan-memory.mlir) and capture safety
// (verify-capture.mlir); this output has no offsets at all.

// CHECK-LABEL: func.func @decode_step()
// CHECK-SAME: kiln.config = "kept"
// CHECK-NEXT: %[[TOK:token]] = step.input "token" : memref<i32>
// CHECK-NEXT: %[[POS:position]] = step.input "position" : memref<i32>
// CHECK-NEXT: %[[NEXT:next_token]] = step.output "next_token" : memref<i32>
// CHECK-NEXT: %[[LOGITS:logits]] = step.output "logits" : memref<64xf32>
// CHECK-NEXT: %[[HID:hidden]] = step.output "hidden" : memref<32xf32>
func.func @decode_step(%token: tensor<i32> {kiln.slot = "token"},
                       %pos: tensor<i32> {kiln.slot = "position"})
    -> (tensor<i32> {kiln.slot = "next_token"},
        tensor<64xf32> {kiln.slot = "logits"},
        tensor<32xf32> {kiln.slot = "hidden"})
    attributes {kiln.config = "kept"} {
  // CHECK: %[[EMBW:token_embd]] = step.weight : !kiln.qweight<"token_embd.weight", "f32", [32, 64]>
  // CHECK: %[[EMB:embed]] = step.buffer "embed" : memref<32xf32>
  // CHECK: step.embed ins(%[[EMBW]], %[[TOK]] : {{.+}}) outs(%[[EMB]] : memref<32xf32>)
  %emb_w = kiln.weight : !kiln.qweight<"token_embd.weight", "f32", [32, 64]>
  %x0 = kiln.embed %emb_w[%token] : !kiln.qweight<"token_embd.weight", "f32", [32, 64]> -> tensor<32xf32>
  %x1 = kiln.layer 0 "dense" (%x0) : tensor<32xf32> {
  ^bb0(%x: tensor<32xf32>):
    // CHECK: %[[NW:blk.0.attn_norm]] = step.weight
    // CHECK: %[[NWD:blk.0.attn_norm.dequant]] = step.buffer "blk.0.attn_norm.dequant" : memref<32xf32>
    // CHECK: step.dequant ins(%[[NW]] : {{.+}}) outs(%[[NWD]] : memref<32xf32>)
    // CHECK: %[[N:blk.0.rms_norm]] = step.buffer "blk.0.rms_norm" : memref<32xf32>
    // CHECK: step.rms_norm ins(%[[EMB]], %[[NWD]] : memref<32xf32>, memref<32xf32>) outs(%[[N]] : memref<32xf32>)
    %nw = kiln.weight : !kiln.qweight<"blk.0.attn_norm.weight", "f32", [32]>
    %nwd = kiln.dequant %nw : !kiln.qweight<"blk.0.attn_norm.weight", "f32", [32]> -> tensor<32xf32>
    %n = kiln.rms_norm %x, %nwd {epsilon = 1.0e-05 : f32} : tensor<32xf32>, tensor<32xf32>
    // CHECK: %[[Q:blk.0.attn_q_b.out]] = step.buffer "blk.0.attn_q_b.out" : memref<24xf32>
    // CHECK: step.linear ins(%[[N]], %blk.0.attn_q_b : {{.+}}) outs(%[[Q]] : memref<24xf32>)
    %qw = kiln.weight : !kiln.qweight<"blk.0.attn_q_b.weight", "f32", [32, 24]>
    %q = kiln.linear %n, %qw : tensor<32xf32>, !kiln.qweight<"blk.0.attn_q_b.weight", "f32", [32, 24]> -> tensor<24xf32>
    // A reshape is a view; a strided slice is a copy.
    // CHECK: %[[HEADS:.+]] = step.view %[[Q]][0] : memref<24xf32> to memref<2x12xf32>
    // CHECK: %[[PE:blk.0.slice]] = step.buffer "blk.0.slice" : memref<2x4xf32>
    // CHECK: step.slice ins(%[[HEADS]] : memref<2x12xf32>) outs(%[[PE]] : memref<2x4xf32>) {offsets = array<i64: 0, 8>}
    %heads = tensor.expand_shape %q [[0, 1]] output_shape [2, 12] : tensor<24xf32> into tensor<2x12xf32>
    %pe = tensor.extract_slice %heads[0, 8] [2, 4] [1, 1] : tensor<2x12xf32> to tensor<2x4xf32>
    // A contiguous slice (the second head, or the tail of a vector) is a view.
    // CHECK: %[[HEAD1:.+]] = step.view %[[HEADS]][12] : memref<2x12xf32> to memref<12xf32>
    // CHECK: %[[TAIL:.+]] = step.view %[[Q]][20] : memref<24xf32> to memref<4xf32>
    %head1 = tensor.extract_slice %heads[1, 0] [1, 12] [1, 1] : tensor<2x12xf32> to tensor<12xf32>
    %tail = tensor.extract_slice %q[20] [4] [1] : tensor<24xf32> to tensor<4xf32>
    // CHECK: %[[ROPE:blk.0.rope]] = step.buffer "blk.0.rope" : memref<2x4xf32>
    // CHECK: step.rope ins(%[[PE]], %[[POS]] : memref<2x4xf32>, memref<i32>) outs(%[[ROPE]] : memref<2x4xf32>)
    %rope = kiln.rope %pe[%pos] {dims = 4 : i64, offset = 0 : i64, style = "interleaved", theta = 1.0e+06 : f32} : tensor<2x4xf32>
    // CHECK: %[[ROW:blk.0.concat]] = step.buffer "blk.0.concat" : memref<16xf32>
    // CHECK: step.concat ins(%[[HEAD1]], %[[TAIL]] : memref<12xf32>, memref<4xf32>) outs(%[[ROW]] : memref<16xf32>) {dim = 0 : i64}
    %row = tensor.concat dim(0) %head1, %tail : (tensor<12xf32>, tensor<4xf32>) -> tensor<16xf32>
    // CHECK: %[[KV:blk.0.kv_cache]] = step.state "blk.0.kv_cache" : memref<8x16xf16>
    // CHECK: step.cache_append ins(%[[ROW]], %[[POS]] : memref<16xf32>, memref<i32>) outs(%[[KV]] : memref<8x16xf16>)
    %kv = kiln.state "blk.0.kv_cache" : !kiln.latent_cache<8, 12, 4, f16>
    kiln.cache_append %kv[%pos], %row : !kiln.latent_cache<8, 12, 4, f16>, tensor<16xf32>
    // CHECK: %[[OW:blk.0.attn_output]] = step.weight
    // CHECK: %[[O:blk.0.attn_output.out]] = step.buffer "blk.0.attn_output.out" : memref<32xf32>
    // CHECK: step.linear ins(%[[ROW]], %[[OW]] : {{.+}}) outs(%[[O]] : memref<32xf32>)
    %ow = kiln.weight : !kiln.qweight<"blk.0.attn_output.weight", "f32", [16, 32]>
    %o = kiln.linear %row, %ow : tensor<16xf32>, !kiln.qweight<"blk.0.attn_output.weight", "f32", [16, 32]> -> tensor<32xf32>
    // CHECK: %[[X1:blk.0.add]] = step.buffer "blk.0.add" : memref<32xf32>
    // CHECK: step.add ins(%[[EMB]], %[[O]] : memref<32xf32>, memref<32xf32>) outs(%[[X1]] : memref<32xf32>)
    %out = kiln.add %x, %o : tensor<32xf32>
    kiln.yield %out : tensor<32xf32>
  }
  // The head writes the logits slot directly; argmax reads it back.
  // CHECK: step.linear ins(%[[X1]], %output : {{.+}}) outs(%[[LOGITS]] : memref<64xf32>)
  // CHECK: step.argmax ins(%[[LOGITS]] : memref<64xf32>) outs(%[[NEXT]] : memref<i32>)
  %head = kiln.weight : !kiln.qweight<"output.weight", "f32", [32, 64]>
  %logits = kiln.linear %x1, %head : tensor<32xf32>, !kiln.qweight<"output.weight", "f32", [32, 64]> -> tensor<64xf32>
  %next = kiln.argmax %logits : tensor<64xf32>
  // The layer's result is a buffer of its own: copied into its slot.
  // CHECK: step.copy ins(%[[X1]] : memref<32xf32>) outs(%[[HID]] : memref<32xf32>)
  // CHECK-NEXT: return{{$}}
  return %next, %logits, %x1 : tensor<i32>, tensor<64xf32>, tensor<32xf32>
}

// Functions without kiln ops are left alone.
// CHECK-LABEL: func.func @not_kiln(%{{.+}}: tensor<4xf32>) -> tensor<4xf32>
// CHECK-NEXT: return
func.func @not_kiln(%a: tensor<4xf32>) -> tensor<4xf32> {
  return %a : tensor<4xf32>
}
