// RUN: kiln-opt %s | FileCheck %s
// RUN: kiln-opt %s | kiln-opt | FileCheck %s
// RUN: kiln-opt %s --mlir-print-op-generic | kiln-opt | FileCheck %s

// Every step op once, printed and parsed back. Also checks the printed SSA
// names come from the declarations. Not checked here: that the program is
// capture-safe (verify-capture.mlir) or planned (plan-memory.mlir).

// CHECK-LABEL: func.func @every_op()
// CHECK-SAME: step.plan = #step.plan<arena_bytes = 65536, peak_live_bytes = 1024, alignment = 256, buffers = 3>
func.func @every_op() attributes {step.plan = #step.plan<arena_bytes = 65536, peak_live_bytes = 1024, alignment = 256, buffers = 3>} {
  // CHECK: %token = step.input "token" : memref<i32>
  %tok = step.input "token" : memref<i32>
  // CHECK: %position = step.input "position" : memref<i32>
  %pos = step.input "position" : memref<i32>
  // CHECK: %sampling = step.input "sampling" : memref<4xi32>
  %words = step.input "sampling" : memref<4xi32>
  // CHECK: %logits = step.output "logits" : memref<1024xf32>
  %logits = step.output "logits" : memref<1024xf32>
  // CHECK: %next = step.output "next" : memref<i32>
  %next = step.output "next" : memref<i32>
  // CHECK: %token_embd = step.weight : !kiln.qweight<"token_embd.weight", "q8_0", [256, 1024]>
  %emb_w = step.weight : !kiln.qweight<"token_embd.weight", "q8_0", [256, 1024]>
  %norm_w = step.weight : !kiln.qweight<"blk.0.attn_norm.weight", "f32", [256]>
  %q_b = step.weight : !kiln.qweight<"blk.0.attn_q_b.weight", "q8_0", [256, 384]>
  %k_b = step.weight : !kiln.qweight<"blk.0.attn_k_b.weight", "q8_0", [32, 64, 8]>
  %gate = step.weight : !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [256, 16]>
  %g = step.weight : !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q4_k", [256, 256, 16]>
  %u = step.weight : !kiln.qweight<"blk.1.ffn_up_exps.weight", "q4_k", [256, 256, 16]>
  %d = step.weight : !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [256, 256, 16]>
  // CHECK: %blk.0.kv_cache = step.state "blk.0.kv_cache" : memref<4096x80xf16>
  %kv = step.state "blk.0.kv_cache" : memref<4096x80xf16>
  %ic = step.state "blk.0.index_cache" : memref<4096x32xf16>
  // CHECK: %x = step.buffer "x" at 0 : memref<256xf32>
  %x = step.buffer "x" at 0 : memref<256xf32>
  // CHECK: %y = step.buffer "y" : memref<256xf32>
  %y = step.buffer "y" : memref<256xf32>
  %q = step.buffer "q" at 1024 : memref<384xf32>
  // CHECK: %[[HEADS:.+]] = step.view %q[0] : memref<384xf32> to memref<8x48xf32>
  %heads = step.view %q[0] : memref<384xf32> to memref<8x48xf32>
  // CHECK: step.embed ins(%token_embd, %token : !kiln.qweight<"token_embd.weight", "q8_0", [256, 1024]>, memref<i32>) outs(%x : memref<256xf32>)
  step.embed ins(%emb_w, %tok : !kiln.qweight<"token_embd.weight", "q8_0", [256, 1024]>, memref<i32>) outs(%x : memref<256xf32>)
  // CHECK: step.dequant ins(%blk.0.attn_norm : !kiln.qweight<"blk.0.attn_norm.weight", "f32", [256]>) outs(%y : memref<256xf32>)
  step.dequant ins(%norm_w : !kiln.qweight<"blk.0.attn_norm.weight", "f32", [256]>) outs(%y : memref<256xf32>)
  // CHECK: step.rms_norm ins(%x, %y : memref<256xf32>, memref<256xf32>) outs(%x : memref<256xf32>) {epsilon = 9.99999974E-6 : f32}
  step.rms_norm ins(%x, %y : memref<256xf32>, memref<256xf32>) outs(%x : memref<256xf32>) {epsilon = 1.0e-05 : f32}
  // CHECK: step.layer_norm ins(%x, %y, %y : memref<256xf32>, memref<256xf32>, memref<256xf32>) outs(%y : memref<256xf32>) {epsilon = 9.99999997E-7 : f32}
  step.layer_norm ins(%x, %y, %y : memref<256xf32>, memref<256xf32>, memref<256xf32>) outs(%y : memref<256xf32>) {epsilon = 1.0e-06 : f32}
  // CHECK: step.linear ins(%x, %blk.0.attn_q_b : memref<256xf32>, !kiln.qweight<"blk.0.attn_q_b.weight", "q8_0", [256, 384]>) outs(%q : memref<384xf32>)
  step.linear ins(%x, %q_b : memref<256xf32>, !kiln.qweight<"blk.0.attn_q_b.weight", "q8_0", [256, 384]>) outs(%q : memref<384xf32>)
  %q_nope = step.buffer "q_nope" : memref<8x32xf32>
  %q_pe = step.buffer "q_pe" : memref<8x16xf32>
  // CHECK: step.slice ins(%[[HEADS]] : memref<8x48xf32>) outs(%q_pe : memref<8x16xf32>) {offsets = array<i64: 0, 32>}
  step.slice ins(%heads : memref<8x48xf32>) outs(%q_pe : memref<8x16xf32>) {offsets = array<i64: 0, 32>}
  step.slice ins(%heads : memref<8x48xf32>) outs(%q_nope : memref<8x32xf32>) {offsets = array<i64: 0, 0>}
  // CHECK: step.rope ins(%q_pe, %position : memref<8x16xf32>, memref<i32>) outs(%q_pe : memref<8x16xf32>) {dims = 16 : i64, offset = 0 : i64, style = "interleaved", theta = 1.000000e+06 : f32}
  step.rope ins(%q_pe, %pos : memref<8x16xf32>, memref<i32>) outs(%q_pe : memref<8x16xf32>) {dims = 16 : i64, offset = 0 : i64, style = "interleaved", theta = 1.0e+06 : f32}
  %lat = step.buffer "lat" : memref<64xf32>
  %pe = step.buffer "pe" : memref<16xf32>
  %row = step.buffer "row" : memref<80xf32>
  // CHECK: step.concat ins(%lat, %pe : memref<64xf32>, memref<16xf32>) outs(%row : memref<80xf32>) {dim = 0 : i64}
  step.concat ins(%lat, %pe : memref<64xf32>, memref<16xf32>) outs(%row : memref<80xf32>) {dim = 0 : i64}
  // CHECK: step.cache_append ins(%row, %position : memref<80xf32>, memref<i32>) outs(%blk.0.kv_cache : memref<4096x80xf16>)
  step.cache_append ins(%row, %pos : memref<80xf32>, memref<i32>) outs(%kv : memref<4096x80xf16>)
  %iq = step.buffer "iq" : memref<4x32xf32>
  %iw = step.buffer "iw" : memref<4xf32>
  %sel = step.buffer "sel" : memref<32xi32>
  %n = step.buffer "n" : memref<i32>
  // CHECK: step.dsa_indexer ins(%iq, %iw, %blk.0.index_cache, %position : memref<4x32xf32>, memref<4xf32>, memref<4096x32xf16>, memref<i32>) outs(%sel, %n : memref<32xi32>, memref<i32>) {scale = 0.0883883461 : f32, top_k = 32 : i64}
  step.dsa_indexer ins(%iq, %iw, %ic, %pos : memref<4x32xf32>, memref<4xf32>, memref<4096x32xf16>, memref<i32>) outs(%sel, %n : memref<32xi32>, memref<i32>) {scale = 0.0883883461 : f32, top_k = 32 : i64}
  %ql = step.buffer "ql" : memref<8x64xf32>
  // CHECK: step.linear ins(%q_nope, %blk.0.attn_k_b : memref<8x32xf32>, !kiln.qweight<"blk.0.attn_k_b.weight", "q8_0", [32, 64, 8]>) outs(%ql : memref<8x64xf32>)
  step.linear ins(%q_nope, %k_b : memref<8x32xf32>, !kiln.qweight<"blk.0.attn_k_b.weight", "q8_0", [32, 64, 8]>) outs(%ql : memref<8x64xf32>)
  %o = step.buffer "o" : memref<8x64xf32>
  // CHECK: step.mla_attention ins(%ql, %q_pe, %blk.0.kv_cache, %position, %sel, %n : memref<8x64xf32>, memref<8x16xf32>, memref<4096x80xf16>, memref<i32>, memref<32xi32>, memref<i32>) outs(%o : memref<8x64xf32>) {scale = 1.443380e-01 : f32}
  step.mla_attention ins(%ql, %q_pe, %kv, %pos, %sel, %n : memref<8x64xf32>, memref<8x16xf32>, memref<4096x80xf16>, memref<i32>, memref<32xi32>, memref<i32>) outs(%o : memref<8x64xf32>) {scale = 0.144338 : f32}
  // CHECK: step.mla_attention ins(%ql, %q_pe, %blk.0.kv_cache, %position : memref<8x64xf32>, memref<8x16xf32>, memref<4096x80xf16>, memref<i32>) outs(%o : memref<8x64xf32>)
  step.mla_attention ins(%ql, %q_pe, %kv, %pos : memref<8x64xf32>, memref<8x16xf32>, memref<4096x80xf16>, memref<i32>) outs(%o : memref<8x64xf32>) {scale = 0.144338 : f32}
  %v_b = step.weight : !kiln.qweight<"blk.0.attn_v_b.weight", "q8_0", [64, 32, 8]>
  %v = step.buffer "v" : memref<8x32xf32>
  // CHECK: step.mla_attention ins(%ql, %q_pe, %blk.0.kv_cache, %position, %sel, %n : memref<8x64xf32>, memref<8x16xf32>, memref<4096x80xf16>, memref<i32>, memref<32xi32>, memref<i32>) projection(%blk.0.attn_v_b : !kiln.qweight<"blk.0.attn_v_b.weight", "q8_0", [64, 32, 8]>) outs(%v : memref<8x32xf32>)
  step.mla_attention ins(%ql, %q_pe, %kv, %pos, %sel, %n : memref<8x64xf32>, memref<8x16xf32>, memref<4096x80xf16>, memref<i32>, memref<32xi32>, memref<i32>) projection(%v_b : !kiln.qweight<"blk.0.attn_v_b.weight", "q8_0", [64, 32, 8]>) outs(%v : memref<8x32xf32>) {scale = 0.144338 : f32}
  %ids = step.buffer "ids" : memref<4xi32>
  %rw = step.buffer "rw" : memref<4xf32>
  %bias = step.buffer "bias" : memref<16xf32>
  // CHECK: step.moe_router ins(%x, %blk.1.ffn_gate_inp, %bias : memref<256xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [256, 16]>, memref<16xf32>) outs(%ids, %rw : memref<4xi32>, memref<4xf32>)
  step.moe_router ins(%x, %gate, %bias : memref<256xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [256, 16]>, memref<16xf32>) outs(%ids, %rw : memref<4xi32>, memref<4xf32>) {gating = "sigmoid", normalize = true, routed_scale = 2.5 : f32, top_k = 4 : i64}
  // CHECK: step.moe_router ins(%x, %blk.1.ffn_gate_inp : memref<256xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [256, 16]>) outs(%ids, %rw : memref<4xi32>, memref<4xf32>)
  step.moe_router ins(%x, %gate : memref<256xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [256, 16]>) outs(%ids, %rw : memref<4xi32>, memref<4xf32>) {gating = "softmax", normalize = false, routed_scale = 1.0 : f32, top_k = 4 : i64}
  // The router folded into the all-reduce before it (kiln-fold-router):
  // this rank's share of the logits after its part of the projection, the
  // tail reduced and divided by the norm's rms, the choice after it.
  %ffn_norm = step.weight : !kiln.qweight<"blk.1.ffn_norm.weight", "f32", [256]>
  %pr = step.buffer "pr" : memref<272xf32>
  %p0 = step.view %pr[0] : memref<272xf32> to memref<256xf32>
  %p1 = step.view %pr[256] : memref<272xf32> to memref<16xf32>
  %h = step.buffer "h" : memref<256xf32>
  %rl = step.buffer "rl" : memref<16xf32>
  // CHECK: step.router_partial ins(%[[P0:.+]], %x, %blk.1.ffn_gate_inp, %blk.1.ffn_norm : memref<256xf32>, memref<256xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [256, 16]>, !kiln.qweight<"blk.1.ffn_norm.weight", "f32", [256]>) outs(%[[P1:.+]] : memref<16xf32>) {residual_scale = 5.000000e-01 : f32}
  step.router_partial ins(%p0, %x, %gate, %ffn_norm : memref<256xf32>, memref<256xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [256, 16]>, !kiln.qweight<"blk.1.ffn_norm.weight", "f32", [256]>) outs(%p1 : memref<16xf32>) {residual_scale = 0.5 : f32}
  // Composed (kiln-fold-router{compose=true}): the producer's linear and
  // the rank's share of the logits in one op writing the whole partial.
  %ao = step.buffer "ao" : memref<128xf32>
  %wo = step.weight : !kiln.qweight<"blk.1.attn_output.weight", "q8_0", [128, 256], shard = 0 of 2>
  // CHECK: step.linear_router ins(%ao, %blk.1.attn_output, %x, %blk.1.ffn_gate_inp, %blk.1.ffn_norm : memref<128xf32>, !kiln.qweight<"blk.1.attn_output.weight", "q8_0", [128, 256], shard = 0 of 2>, memref<256xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [256, 16]>, !kiln.qweight<"blk.1.ffn_norm.weight", "f32", [256]>) outs(%pr : memref<272xf32>) {ranks = 2 : i64}
  step.linear_router ins(%ao, %wo, %x, %gate, %ffn_norm : memref<128xf32>, !kiln.qweight<"blk.1.attn_output.weight", "q8_0", [128, 256], shard = 0 of 2>, memref<256xf32>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [256, 16]>, !kiln.qweight<"blk.1.ffn_norm.weight", "f32", [256]>) outs(%pr : memref<272xf32>) {ranks = 2 : i64}
  // CHECK: step.all_reduce_add_rms_norm ins(%pr, %x, %blk.1.ffn_norm : memref<272xf32>, memref<256xf32>, !kiln.qweight<"blk.1.ffn_norm.weight", "f32", [256]>) outs(%h, %y, %rl : memref<256xf32>, memref<256xf32>, memref<16xf32>) {epsilon = 9.99999974E-6 : f32, reduction = "sum", tail = 16 : i64}
  step.all_reduce_add_rms_norm ins(%pr, %x, %ffn_norm : memref<272xf32>, memref<256xf32>, !kiln.qweight<"blk.1.ffn_norm.weight", "f32", [256]>) outs(%h, %y, %rl : memref<256xf32>, memref<256xf32>, memref<16xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum", tail = 16 : i64}
  // CHECK: step.all_reduce_add_rms_norm ins(%y, %x, %blk.1.ffn_norm : memref<256xf32>, memref<256xf32>, !kiln.qweight<"blk.1.ffn_norm.weight", "f32", [256]>) outs(%h, %y : memref<256xf32>, memref<256xf32>) {epsilon = 9.99999974E-6 : f32, reduction = "sum"}
  step.all_reduce_add_rms_norm ins(%y, %x, %ffn_norm : memref<256xf32>, memref<256xf32>, !kiln.qweight<"blk.1.ffn_norm.weight", "f32", [256]>) outs(%h, %y : memref<256xf32>, memref<256xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum"}
  // CHECK: step.rms_norm_router ins(%x, %blk.1.ffn_norm, %blk.1.ffn_gate_inp, %bias : memref<256xf32>, !kiln.qweight<"blk.1.ffn_norm.weight", "f32", [256]>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [256, 16]>, memref<16xf32>) outs(%y, %ids, %rw : memref<256xf32>, memref<4xi32>, memref<4xf32>) {epsilon = 9.99999974E-6 : f32, gating = "sigmoid", normalize = true, routed_scale = 2.500000e+00 : f32, top_k = 4 : i64}
  step.rms_norm_router ins(%x, %ffn_norm, %gate, %bias : memref<256xf32>, !kiln.qweight<"blk.1.ffn_norm.weight", "f32", [256]>, !kiln.qweight<"blk.1.ffn_gate_inp.weight", "f32", [256, 16]>, memref<16xf32>) outs(%y, %ids, %rw : memref<256xf32>, memref<4xi32>, memref<4xf32>) {epsilon = 1.0e-05 : f32, gating = "sigmoid", normalize = true, routed_scale = 2.5 : f32, top_k = 4 : i64}
  // CHECK: step.all_reduce_add ins(%y, %x : memref<256xf32>, memref<256xf32>) outs(%h : memref<256xf32>) {reduction = "sum"}
  step.all_reduce_add ins(%y, %x : memref<256xf32>, memref<256xf32>) outs(%h : memref<256xf32>) {reduction = "sum"}
  // CHECK: step.moe_choose ins(%rl, %bias : memref<16xf32>, memref<16xf32>) outs(%ids, %rw : memref<4xi32>, memref<4xf32>) {gating = "sigmoid", normalize = true, routed_scale = 2.500000e+00 : f32, top_k = 4 : i64}
  step.moe_choose ins(%rl, %bias : memref<16xf32>, memref<16xf32>) outs(%ids, %rw : memref<4xi32>, memref<4xf32>) {gating = "sigmoid", normalize = true, routed_scale = 2.5 : f32, top_k = 4 : i64}
  // CHECK: step.moe_choose ins(%rl : memref<16xf32>) outs(%ids, %rw : memref<4xi32>, memref<4xf32>) {gating = "softmax", normalize = false, routed_scale = 1.000000e+00 : f32, top_k = 4 : i64}
  step.moe_choose ins(%rl : memref<16xf32>) outs(%ids, %rw : memref<4xi32>, memref<4xf32>) {gating = "softmax", normalize = false, routed_scale = 1.0 : f32, top_k = 4 : i64}
  // The choice made inside the all-reduce (kiln-fuse-router-choice), with
  // a bias buffer, a bias weight, and none.
  // CHECK: step.all_reduce_add_rms_norm ins(%pr, %x, %blk.1.ffn_norm : memref<272xf32>, memref<256xf32>, !kiln.qweight<"blk.1.ffn_norm.weight", "f32", [256]>) outs(%h, %y, %rl : memref<256xf32>, memref<256xf32>, memref<16xf32>) choose ins(%bias : memref<16xf32>) outs(%ids, %rw : memref<4xi32>, memref<4xf32>) {epsilon = 9.99999974E-6 : f32, gating = "sigmoid", normalize = true, reduction = "sum", routed_scale = 2.500000e+00 : f32, tail = 16 : i64, top_k = 4 : i64}
  step.all_reduce_add_rms_norm ins(%pr, %x, %ffn_norm : memref<272xf32>, memref<256xf32>, !kiln.qweight<"blk.1.ffn_norm.weight", "f32", [256]>) outs(%h, %y, %rl : memref<256xf32>, memref<256xf32>, memref<16xf32>) choose ins(%bias : memref<16xf32>) outs(%ids, %rw : memref<4xi32>, memref<4xf32>) {epsilon = 1.0e-05 : f32, gating = "sigmoid", normalize = true, reduction = "sum", routed_scale = 2.5 : f32, tail = 16 : i64, top_k = 4 : i64}
  %bias_w = step.weight : !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [16]>
  // CHECK: step.all_reduce_add_rms_norm ins(%pr, %x, %blk.1.ffn_norm : {{.+}}) outs(%h, %y, %rl : {{.+}}) choose ins(%blk.1.exp_probs_b.bias : !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [16]>) outs(%ids, %rw : memref<4xi32>, memref<4xf32>) {epsilon = 9.99999974E-6 : f32, gating = "sigmoid", normalize = true, reduction = "sum", routed_scale = 2.500000e+00 : f32, tail = 16 : i64, top_k = 4 : i64}
  step.all_reduce_add_rms_norm ins(%pr, %x, %ffn_norm : memref<272xf32>, memref<256xf32>, !kiln.qweight<"blk.1.ffn_norm.weight", "f32", [256]>) outs(%h, %y, %rl : memref<256xf32>, memref<256xf32>, memref<16xf32>) choose ins(%bias_w : !kiln.qweight<"blk.1.exp_probs_b.bias", "f32", [16]>) outs(%ids, %rw : memref<4xi32>, memref<4xf32>) {epsilon = 1.0e-05 : f32, gating = "sigmoid", normalize = true, reduction = "sum", routed_scale = 2.5 : f32, tail = 16 : i64, top_k = 4 : i64}
  // CHECK: step.all_reduce_add_rms_norm ins(%pr, %x, %blk.1.ffn_norm : {{.+}}) outs(%h, %y, %rl : {{.+}}) choose outs(%ids, %rw : memref<4xi32>, memref<4xf32>) {epsilon = 9.99999974E-6 : f32, gating = "softmax", normalize = false, reduction = "sum", routed_scale = 1.000000e+00 : f32, tail = 16 : i64, top_k = 4 : i64}
  step.all_reduce_add_rms_norm ins(%pr, %x, %ffn_norm : memref<272xf32>, memref<256xf32>, !kiln.qweight<"blk.1.ffn_norm.weight", "f32", [256]>) outs(%h, %y, %rl : memref<256xf32>, memref<256xf32>, memref<16xf32>) choose outs(%ids, %rw : memref<4xi32>, memref<4xf32>) {epsilon = 1.0e-05 : f32, gating = "softmax", normalize = false, reduction = "sum", routed_scale = 1.0 : f32, tail = 16 : i64, top_k = 4 : i64}
  // CHECK: step.moe_experts ins(%x, %ids, %rw, %blk.1.ffn_gate_exps, %blk.1.ffn_up_exps, %blk.1.ffn_down_exps : memref<256xf32>, memref<4xi32>, memref<4xf32>, {{.+}}) outs(%y : memref<256xf32>)
  step.moe_experts ins(%x, %ids, %rw, %g, %u, %d : memref<256xf32>, memref<4xi32>, memref<4xf32>, !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q4_k", [256, 256, 16]>, !kiln.qweight<"blk.1.ffn_up_exps.weight", "q4_k", [256, 256, 16]>, !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [256, 256, 16]>) outs(%y : memref<256xf32>)
  %sh = step.buffer "sh" : memref<256xf32>
  // CHECK: step.moe_experts ins(%x, %ids, %rw, %blk.1.ffn_gate_exps, %blk.1.ffn_up_exps, %blk.1.ffn_down_exps : memref<256xf32>, memref<4xi32>, memref<4xf32>, {{.+}}) addend(%sh : memref<256xf32>) outs(%y : memref<256xf32>)
  step.moe_experts ins(%x, %ids, %rw, %g, %u, %d : memref<256xf32>, memref<4xi32>, memref<4xf32>, !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q4_k", [256, 256, 16]>, !kiln.qweight<"blk.1.ffn_up_exps.weight", "q4_k", [256, 256, 16]>, !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [256, 256, 16]>) addend(%sh : memref<256xf32>) outs(%y : memref<256xf32>)
  // A shared expert inside (kiln-fuse-shared-expert), as one rank of two
  // holds it: gate and up split by rows, down by columns.
  %sg = step.weight : !kiln.qweight<"blk.1.ffn_gate_shexp.weight", "q5_k", [256, 128], shard = 1 of 2>
  %su = step.weight : !kiln.qweight<"blk.1.ffn_up_shexp.weight", "q5_k", [256, 128], shard = 1 of 2>
  %sd = step.weight : !kiln.qweight<"blk.1.ffn_down_shexp.weight", "q8_0", [128, 256], shard = 0 of 2>
  // CHECK: step.moe_experts ins(%x, %ids, %rw, %blk.1.ffn_gate_exps, %blk.1.ffn_up_exps, %blk.1.ffn_down_exps : memref<256xf32>, memref<4xi32>, memref<4xf32>, {{.+}}) shared(%blk.1.ffn_gate_shexp, %blk.1.ffn_up_shexp, %blk.1.ffn_down_shexp : !kiln.qweight<"blk.1.ffn_gate_shexp.weight", "q5_k", [256, 128], shard = 1 of 2>, !kiln.qweight<"blk.1.ffn_up_shexp.weight", "q5_k", [256, 128], shard = 1 of 2>, !kiln.qweight<"blk.1.ffn_down_shexp.weight", "q8_0", [128, 256], shard = 0 of 2>) outs(%y : memref<256xf32>)
  step.moe_experts ins(%x, %ids, %rw, %g, %u, %d : memref<256xf32>, memref<4xi32>, memref<4xf32>, !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q4_k", [256, 256, 16]>, !kiln.qweight<"blk.1.ffn_up_exps.weight", "q4_k", [256, 256, 16]>, !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [256, 256, 16]>) shared(%sg, %su, %sd : !kiln.qweight<"blk.1.ffn_gate_shexp.weight", "q5_k", [256, 128], shard = 1 of 2>, !kiln.qweight<"blk.1.ffn_up_shexp.weight", "q5_k", [256, 128], shard = 1 of 2>, !kiln.qweight<"blk.1.ffn_down_shexp.weight", "q8_0", [128, 256], shard = 0 of 2>) outs(%y : memref<256xf32>)
  // CHECK: step.add ins(%x, %y : memref<256xf32>, memref<256xf32>) outs(%x : memref<256xf32>)
  step.add ins(%x, %y : memref<256xf32>, memref<256xf32>) outs(%x : memref<256xf32>)
  // CHECK: step.swiglu ins(%x, %y : memref<256xf32>, memref<256xf32>) outs(%y : memref<256xf32>)
  step.swiglu ins(%x, %y : memref<256xf32>, memref<256xf32>) outs(%y : memref<256xf32>)
  // CHECK: step.all_reduce ins(%y : memref<256xf32>) outs(%y : memref<256xf32>) {reduction = "sum"}
  step.all_reduce ins(%y : memref<256xf32>) outs(%y : memref<256xf32>) {reduction = "sum"}
  // CHECK: step.copy ins(%y : memref<256xf32>) outs(%x : memref<256xf32>)
  step.copy ins(%y : memref<256xf32>) outs(%x : memref<256xf32>)
  // CHECK: step.argmax ins(%logits : memref<1024xf32>) outs(%next : memref<i32>)
  step.argmax ins(%logits : memref<1024xf32>) outs(%next : memref<i32>)
  // CHECK: step.argmax ins(%logits : memref<1024xf32>) sampled(%sampling, %position : memref<4xi32>, memref<i32>) outs(%next : memref<i32>)
  step.argmax ins(%logits : memref<1024xf32>) sampled(%words, %pos : memref<4xi32>, memref<i32>) outs(%next : memref<i32>)
  return
}
