// RUN: kiln-opt %s --split-input-file --verify-diagnostics

// Every verifier message of the step ops, pinned, plus the type constraints
// (static identity-layout memrefs, 0-d i32 positions) that ODS checks.

func.func @buffer_name() {
  // expected-error @+1 {{'step.buffer' op buffer name must not be empty}}
  %b = step.buffer "" : memref<4xf32>
  return
}

// -----

func.func @buffer_offset() {
  // expected-error @+1 {{'step.buffer' op offset must not be negative, got -256}}
  %b = step.buffer "b" at -256 : memref<4xf32>
  return
}

// -----

func.func @buffer_layout() {
  // expected-error @+1 {{'step.buffer' op result #0 must be statically shaped memref with the identity layout}}
  %b = step.buffer "b" : memref<4xf32, strided<[2]>>
  return
}

// -----

func.func @view_type() {
  %b = step.buffer "b" : memref<4xf32>
  // expected-error @+1 {{'step.view' op a view keeps the element type: 'f32' vs 'f16'}}
  %v = step.view %b[0] : memref<4xf32> to memref<4xf16>
  return
}

// -----

func.func @view_range() {
  %b = step.buffer "b" : memref<4xf32>
  // expected-error @+1 {{'step.view' op elements [2, 5) are not inside the source's 4}}
  %v = step.view %b[2] : memref<4xf32> to memref<3xf32>
  return
}

// -----

func.func @state_name() {
  // expected-error @+1 {{'step.state' op state name must not be empty}}
  %s = step.state "" : memref<4x8xf16>
  return
}

// -----

func.func @state_rank() {
  // expected-error @+1 {{'step.state' op state must be a [positions x width] float buffer, got 'memref<8xf16>'}}
  %s = step.state "kv" : memref<8xf16>
  return
}

// -----

func.func @input_name() {
  // expected-error @+1 {{'step.input' op slot name must not be empty}}
  %s = step.input "" : memref<i32>
  return
}

// -----

func.func @output_name() {
  // expected-error @+1 {{'step.output' op slot name must not be empty}}
  %s = step.output "" : memref<i32>
  return
}

// -----

func.func @copy_types() {
  %a = step.buffer "a" : memref<4xf32>
  %b = step.buffer "b" : memref<8xf32>
  // expected-error @+1 {{'step.copy' op input and output types differ: 'memref<4xf32>' vs 'memref<8xf32>'}}
  step.copy ins(%a : memref<4xf32>) outs(%b : memref<8xf32>)
  return
}

// -----

func.func @slice_rank() {
  %a = step.buffer "a" : memref<4x8xf32>
  %b = step.buffer "b" : memref<8xf32>
  // expected-error @+1 {{'step.slice' op input, output and offsets must agree in rank and element type}}
  step.slice ins(%a : memref<4x8xf32>) outs(%b : memref<8xf32>) {offsets = array<i64: 0>}
  return
}

// -----

func.func @slice_range() {
  %a = step.buffer "a" : memref<4x8xf32>
  %b = step.buffer "b" : memref<4x4xf32>
  // expected-error @+1 {{'step.slice' op dimension 1: [6, 10) is not inside the input's 8}}
  step.slice ins(%a : memref<4x8xf32>) outs(%b : memref<4x4xf32>) {offsets = array<i64: 0, 6>}
  return
}

// -----

func.func @concat_sum() {
  %a = step.buffer "a" : memref<4xf32>
  %b = step.buffer "b" : memref<8xf32>
  step.concat ins(%a, %a : memref<4xf32>, memref<4xf32>) outs(%b : memref<8xf32>) {dim = 0 : i64}
  %c = step.buffer "c" : memref<9xf32>
  // expected-error @+1 {{'step.concat' op inputs add up to 8 along dim 0, the output has 9}}
  step.concat ins(%a, %a : memref<4xf32>, memref<4xf32>) outs(%c : memref<9xf32>) {dim = 0 : i64}
  return
}

// -----

func.func @concat_dim() {
  %a = step.buffer "a" : memref<4xf32>
  // expected-error @+1 {{'step.concat' op dim 1 is not a dimension of 'memref<4xf32>'}}
  step.concat ins(%a : memref<4xf32>) outs(%a : memref<4xf32>) {dim = 1 : i64}
  return
}

// -----

func.func @concat_other_dims() {
  %a = step.buffer "a" : memref<2x4xf32>
  %b = step.buffer "b" : memref<4x3xf32>
  // expected-error @+1 {{'step.concat' op input 'memref<2x4xf32>' differs from the output outside dim 0}}
  step.concat ins(%a, %a : memref<2x4xf32>, memref<2x4xf32>) outs(%b : memref<4x3xf32>) {dim = 0 : i64}
  return
}

// -----

func.func @add_types() {
  %a = step.buffer "a" : memref<4xf32>
  %b = step.buffer "b" : memref<4xf16>
  // expected-error @+1 {{'step.add' op operands and output must have one type, got 'memref<4xf32>', 'memref<4xf16>' -> 'memref<4xf32>'}}
  step.add ins(%a, %b : memref<4xf32>, memref<4xf16>) outs(%a : memref<4xf32>)
  return
}

// -----

func.func @swiglu_int() {
  %a = step.buffer "a" : memref<4xi32>
  // expected-error @+1 {{'step.swiglu' op operands must be float buffers}}
  step.swiglu ins(%a, %a : memref<4xi32>, memref<4xi32>) outs(%a : memref<4xi32>)
  return
}

// -----

func.func @rms_weight() {
  %a = step.buffer "a" : memref<4xf32>
  %w = step.buffer "w" : memref<8xf32>
  // expected-error @+1 {{'step.rms_norm' op weight must have shape [4], got 'memref<8xf32>'}}
  step.rms_norm ins(%a, %w : memref<4xf32>, memref<8xf32>) outs(%a : memref<4xf32>) {epsilon = 1.0e-05 : f32}
  return
}

// -----

func.func @rms_eps() {
  %a = step.buffer "a" : memref<4xf32>
  // expected-error @+1 {{'step.rms_norm' op epsilon must be positive and finite, got 0}}
  step.rms_norm ins(%a, %a : memref<4xf32>, memref<4xf32>) outs(%a : memref<4xf32>) {epsilon = 0.0 : f32}
  return
}

// -----

func.func @rms_out() {
  %a = step.buffer "a" : memref<4xf32>
  %o = step.buffer "o" : memref<4xf16>
  // expected-error @+1 {{'step.rms_norm' op output must have the input's type 'memref<4xf32>'}}
  step.rms_norm ins(%a, %a : memref<4xf32>, memref<4xf32>) outs(%o : memref<4xf16>) {epsilon = 1.0e-05 : f32}
  return
}

// -----

func.func @layer_norm_bias() {
  %a = step.buffer "a" : memref<4xf32>
  %b = step.buffer "b" : memref<2xf32>
  // expected-error @+1 {{'step.layer_norm' op bias must have shape [4], got 'memref<2xf32>'}}
  step.layer_norm ins(%a, %a, %b : memref<4xf32>, memref<4xf32>, memref<2xf32>) outs(%a : memref<4xf32>) {epsilon = 1.0e-06 : f32}
  return
}

// -----

func.func @rope_style() {
  %a = step.buffer "a" : memref<16xf32>
  %p = step.input "position" : memref<i32>
  // expected-error @+1 {{'step.rope' op style must be 'interleaved' or 'neox', got 'gptj'}}
  step.rope ins(%a, %p : memref<16xf32>, memref<i32>) outs(%a : memref<16xf32>) {dims = 16 : i64, offset = 0 : i64, style = "gptj", theta = 1.0e+06 : f32}
  return
}

// -----

func.func @rope_dims() {
  %a = step.buffer "a" : memref<16xf32>
  %p = step.input "position" : memref<i32>
  // expected-error @+1 {{'step.rope' op rotates [8, 24) (an even, positive width is needed) of an innermost dimension of 16}}
  step.rope ins(%a, %p : memref<16xf32>, memref<i32>) outs(%a : memref<16xf32>) {dims = 16 : i64, offset = 8 : i64, style = "neox", theta = 1.0e+06 : f32}
  return
}

// -----

func.func @rope_theta() {
  %a = step.buffer "a" : memref<16xf32>
  %p = step.input "position" : memref<i32>
  // expected-error @+1 {{'step.rope' op theta must be positive and finite, got -1}}
  step.rope ins(%a, %p : memref<16xf32>, memref<i32>) outs(%a : memref<16xf32>) {dims = 16 : i64, offset = 0 : i64, style = "neox", theta = -1.0 : f32}
  return
}

// -----

func.func @rope_position() {
  %a = step.buffer "a" : memref<16xf32>
  %p = step.input "position" : memref<2xi32>
  // expected-error @+1 {{'step.rope' op operand #1 must be 0-d i32 memref, but got 'memref<2xi32>'}}
  step.rope ins(%a, %p : memref<16xf32>, memref<2xi32>) outs(%a : memref<16xf32>) {dims = 16 : i64, offset = 0 : i64, style = "neox", theta = 1.0 : f32}
  return
}

// -----

func.func @dequant_shape() {
  %w = step.weight : !kiln.qweight<"n.weight", "f32", [8, 4]>
  %o = step.buffer "o" : memref<8x4xf32>
  // expected-error @+1 {{'step.dequant' op output must have shape [4, 8], got 'memref<8x4xf32>'}}
  step.dequant ins(%w : !kiln.qweight<"n.weight", "f32", [8, 4]>) outs(%o : memref<8x4xf32>)
  return
}

// -----

func.func @embed_shape() {
  %w = step.weight : !kiln.qweight<"token_embd.weight", "f32", [8, 100]>
  %t = step.input "token" : memref<i32>
  %o = step.buffer "o" : memref<100xf32>
  // expected-error @+1 {{'step.embed' op output must have shape [8], got 'memref<100xf32>'}}
  step.embed ins(%w, %t : !kiln.qweight<"token_embd.weight", "f32", [8, 100]>, memref<i32>) outs(%o : memref<100xf32>)
  return
}

// -----

func.func @linear_k() {
  %w = step.weight : !kiln.qweight<"w.weight", "f32", [8, 4]>
  %x = step.buffer "x" : memref<16xf32>
  %y = step.buffer "y" : memref<4xf32>
  // expected-error @+1 {{'step.linear' op input's innermost dimension is 16 but the weight's ne[0] is 8}}
  step.linear ins(%x, %w : memref<16xf32>, !kiln.qweight<"w.weight", "f32", [8, 4]>) outs(%y : memref<4xf32>)
  return
}

// -----

func.func @linear_n() {
  %w = step.weight : !kiln.qweight<"w.weight", "f32", [8, 4]>
  %x = step.buffer "x" : memref<8xf32>
  %y = step.buffer "y" : memref<8xf32>
  // expected-error @+1 {{'step.linear' op output must have shape [4], got 'memref<8xf32>'}}
  step.linear ins(%x, %w : memref<8xf32>, !kiln.qweight<"w.weight", "f32", [8, 4]>) outs(%y : memref<8xf32>)
  return
}

// -----

func.func @linear_stacked() {
  %w = step.weight : !kiln.qweight<"w.weight", "f32", [8, 4, 2]>
  %x = step.buffer "x" : memref<3x8xf32>
  %y = step.buffer "y" : memref<2x4xf32>
  // expected-error @+1 {{'step.linear' op input must have shape [2, 8], got 'memref<3x8xf32>'}}
  step.linear ins(%x, %w : memref<3x8xf32>, !kiln.qweight<"w.weight", "f32", [8, 4, 2]>) outs(%y : memref<2x4xf32>)
  return
}

// -----

func.func @cache_append_width() {
  %c = step.state "kv" : memref<16x80xf16>
  %e = step.buffer "e" : memref<64xf32>
  %p = step.input "position" : memref<i32>
  // expected-error @+1 {{'step.cache_append' op entry must have shape [80], got 'memref<64xf32>'}}
  step.cache_append ins(%e, %p : memref<64xf32>, memref<i32>) outs(%c : memref<16x80xf16>)
  return
}

// -----

func.func @mla_cache_width() {
  %c = step.state "kv" : memref<16x72xf16>
  %ql = step.buffer "ql" : memref<8x64xf32>
  %qr = step.buffer "qr" : memref<8x16xf32>
  %p = step.input "position" : memref<i32>
  // expected-error @+1 {{'step.mla_attention' op cache rows must be latent + rope = 80 wide, got 'memref<16x72xf16>'}}
  step.mla_attention ins(%ql, %qr, %c, %p : memref<8x64xf32>, memref<8x16xf32>, memref<16x72xf16>, memref<i32>) outs(%ql : memref<8x64xf32>) {scale = 1.0 : f32}
  return
}

// -----

func.func @mla_heads() {
  %c = step.state "kv" : memref<16x80xf16>
  %ql = step.buffer "ql" : memref<8x64xf32>
  %qr = step.buffer "qr" : memref<4x16xf32>
  %p = step.input "position" : memref<i32>
  // expected-error @+1 {{'step.mla_attention' op q_latent and q_rope must be [heads x width] with the same heads}}
  step.mla_attention ins(%ql, %qr, %c, %p : memref<8x64xf32>, memref<4x16xf32>, memref<16x80xf16>, memref<i32>) outs(%ql : memref<8x64xf32>) {scale = 1.0 : f32}
  return
}

// -----

func.func @mla_output() {
  %c = step.state "kv" : memref<16x80xf16>
  %ql = step.buffer "ql" : memref<8x64xf32>
  %qr = step.buffer "qr" : memref<8x16xf32>
  %p = step.input "position" : memref<i32>
  // expected-error @+1 {{'step.mla_attention' op output must have shape [8, 64], got 'memref<8x16xf32>'}}
  step.mla_attention ins(%ql, %qr, %c, %p : memref<8x64xf32>, memref<8x16xf32>, memref<16x80xf16>, memref<i32>) outs(%qr : memref<8x16xf32>) {scale = 1.0 : f32}
  return
}

// -----

func.func @mla_projection_heads() {
  %c = step.state "kv" : memref<16x80xf16>
  %ql = step.buffer "ql" : memref<8x64xf32>
  %qr = step.buffer "qr" : memref<8x16xf32>
  %o = step.buffer "o" : memref<8x32xf32>
  %p = step.input "position" : memref<i32>
  %w = step.weight : !kiln.qweight<"w.weight", "q8_0", [64, 32, 4]>
  // expected-error @+1 {{'step.mla_attention' op projection must be a stack [latent = 64, N, heads = 8], got '!kiln.qweight<"w.weight", "q8_0", [64, 32, 4]>'}}
  step.mla_attention ins(%ql, %qr, %c, %p : memref<8x64xf32>, memref<8x16xf32>, memref<16x80xf16>, memref<i32>) projection(%w : !kiln.qweight<"w.weight", "q8_0", [64, 32, 4]>) outs(%o : memref<8x32xf32>) {scale = 1.0 : f32}
  return
}

// -----

func.func @mla_projection_output() {
  %c = step.state "kv" : memref<16x80xf16>
  %ql = step.buffer "ql" : memref<8x64xf32>
  %qr = step.buffer "qr" : memref<8x16xf32>
  %p = step.input "position" : memref<i32>
  %w = step.weight : !kiln.qweight<"w.weight", "q8_0", [64, 32, 8]>
  // expected-error @+1 {{'step.mla_attention' op output must have shape [8, 32], got 'memref<8x64xf32>'}}
  step.mla_attention ins(%ql, %qr, %c, %p : memref<8x64xf32>, memref<8x16xf32>, memref<16x80xf16>, memref<i32>) projection(%w : !kiln.qweight<"w.weight", "q8_0", [64, 32, 8]>) outs(%ql : memref<8x64xf32>) {scale = 1.0 : f32}
  return
}

// -----

func.func @dsa_topk() {
  %c = step.state "ic" : memref<16x32xf16>
  %q = step.buffer "q" : memref<4x32xf32>
  %w = step.buffer "w" : memref<4xf32>
  %p = step.input "position" : memref<i32>
  %s = step.buffer "s" : memref<8xi32>
  %n = step.buffer "n" : memref<i32>
  // expected-error @+1 {{'step.dsa_indexer' op selected must be memref<4xi32>, got 'memref<8xi32>'}}
  step.dsa_indexer ins(%q, %w, %c, %p : memref<4x32xf32>, memref<4xf32>, memref<16x32xf16>, memref<i32>) outs(%s, %n : memref<8xi32>, memref<i32>) {scale = 1.0 : f32, top_k = 4 : i64}
  return
}

// -----

func.func @dsa_weights() {
  %c = step.state "ic" : memref<16x32xf16>
  %q = step.buffer "q" : memref<4x32xf32>
  %w = step.buffer "w" : memref<2xf32>
  %p = step.input "position" : memref<i32>
  %s = step.buffer "s" : memref<4xi32>
  %n = step.buffer "n" : memref<i32>
  // expected-error @+1 {{'step.dsa_indexer' op head_weights must have shape [4], got 'memref<2xf32>'}}
  step.dsa_indexer ins(%q, %w, %c, %p : memref<4x32xf32>, memref<2xf32>, memref<16x32xf16>, memref<i32>) outs(%s, %n : memref<4xi32>, memref<i32>) {scale = 1.0 : f32, top_k = 4 : i64}
  return
}

// -----

func.func @router_topk() {
  %g = step.weight : !kiln.qweight<"g.weight", "f32", [8, 4]>
  %x = step.buffer "x" : memref<8xf32>
  %i = step.buffer "i" : memref<5xi32>
  %w = step.buffer "w" : memref<5xf32>
  // expected-error @+1 {{'step.moe_router' op top_k must be in 1..4}}
  step.moe_router ins(%x, %g : memref<8xf32>, !kiln.qweight<"g.weight", "f32", [8, 4]>) outs(%i, %w : memref<5xi32>, memref<5xf32>) {gating = "sigmoid", normalize = true, routed_scale = 1.0 : f32, top_k = 5 : i64}
  return
}

// -----

func.func @router_gating() {
  %g = step.weight : !kiln.qweight<"g.weight", "f32", [8, 4]>
  %x = step.buffer "x" : memref<8xf32>
  %i = step.buffer "i" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  // expected-error @+1 {{'step.moe_router' op gating must be 'sigmoid' or 'softmax'}}
  step.moe_router ins(%x, %g : memref<8xf32>, !kiln.qweight<"g.weight", "f32", [8, 4]>) outs(%i, %w : memref<2xi32>, memref<2xf32>) {gating = "relu", normalize = true, routed_scale = 1.0 : f32, top_k = 2 : i64}
  return
}

// -----

func.func @experts_count() {
  %d = step.weight : !kiln.qweight<"d.weight", "f32", [4, 8, 2]>
  %x = step.buffer "x" : memref<8xf32>
  %i = step.buffer "i" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  // expected-error @+1 {{'step.moe_experts' op experts are (gate, up, down) or (gate_up, down), got 1 weights}}
  step.moe_experts ins(%x, %i, %w, %d : memref<8xf32>, memref<2xi32>, memref<2xf32>, !kiln.qweight<"d.weight", "f32", [4, 8, 2]>) outs(%x : memref<8xf32>)
  return
}

// -----

func.func @shared_count() {
  %g = step.weight : !kiln.qweight<"g.weight", "f32", [8, 4, 2]>
  %u = step.weight : !kiln.qweight<"u.weight", "f32", [8, 4, 2]>
  %d = step.weight : !kiln.qweight<"d.weight", "f32", [4, 8, 2]>
  %x = step.buffer "x" : memref<8xf32>
  %i = step.buffer "i" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  %sg = step.weight : !kiln.qweight<"sg.weight", "f32", [8, 6]>
  %su = step.weight : !kiln.qweight<"su.weight", "f32", [8, 6]>
  // expected-error @+1 {{'step.moe_experts' op shared is (gate, up, down), got 2 weights}}
  step.moe_experts ins(%x, %i, %w, %g, %u, %d : memref<8xf32>, memref<2xi32>, memref<2xf32>, !kiln.qweight<"g.weight", "f32", [8, 4, 2]>, !kiln.qweight<"u.weight", "f32", [8, 4, 2]>, !kiln.qweight<"d.weight", "f32", [4, 8, 2]>) shared(%sg, %su : !kiln.qweight<"sg.weight", "f32", [8, 6]>, !kiln.qweight<"su.weight", "f32", [8, 6]>) outs(%x : memref<8xf32>)
  return
}

// -----

func.func @shared_and_addend() {
  %g = step.weight : !kiln.qweight<"g.weight", "f32", [8, 4, 2]>
  %u = step.weight : !kiln.qweight<"u.weight", "f32", [8, 4, 2]>
  %d = step.weight : !kiln.qweight<"d.weight", "f32", [4, 8, 2]>
  %x = step.buffer "x" : memref<8xf32>
  %i = step.buffer "i" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  %sg = step.weight : !kiln.qweight<"sg.weight", "f32", [8, 6]>
  %su = step.weight : !kiln.qweight<"su.weight", "f32", [8, 6]>
  %sd = step.weight : !kiln.qweight<"sd.weight", "f32", [6, 8]>
  %a = step.buffer "a" : memref<8xf32>
  // expected-error @+1 {{'step.moe_experts' op takes an addend or a shared expert, not both}}
  step.moe_experts ins(%x, %i, %w, %g, %u, %d : memref<8xf32>, memref<2xi32>, memref<2xf32>, !kiln.qweight<"g.weight", "f32", [8, 4, 2]>, !kiln.qweight<"u.weight", "f32", [8, 4, 2]>, !kiln.qweight<"d.weight", "f32", [4, 8, 2]>) addend(%a : memref<8xf32>) shared(%sg, %su, %sd : !kiln.qweight<"sg.weight", "f32", [8, 6]>, !kiln.qweight<"su.weight", "f32", [8, 6]>, !kiln.qweight<"sd.weight", "f32", [6, 8]>) outs(%x : memref<8xf32>)
  return
}

// -----

func.func @shared_rank() {
  %g = step.weight : !kiln.qweight<"g.weight", "f32", [8, 4, 2]>
  %u = step.weight : !kiln.qweight<"u.weight", "f32", [8, 4, 2]>
  %d = step.weight : !kiln.qweight<"d.weight", "f32", [4, 8, 2]>
  %x = step.buffer "x" : memref<8xf32>
  %i = step.buffer "i" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  %sg = step.weight : !kiln.qweight<"sg.weight", "f32", [8, 6]>
  %su = step.weight : !kiln.qweight<"su.weight", "f32", [8, 6]>
  %s3 = step.weight : !kiln.qweight<"s3.weight", "f32", [8, 6, 2]>
  // expected-error @+1 {{'step.moe_experts' op shared weights must be 2-D}}
  step.moe_experts ins(%x, %i, %w, %g, %u, %d : memref<8xf32>, memref<2xi32>, memref<2xf32>, !kiln.qweight<"g.weight", "f32", [8, 4, 2]>, !kiln.qweight<"u.weight", "f32", [8, 4, 2]>, !kiln.qweight<"d.weight", "f32", [4, 8, 2]>) shared(%sg, %su, %s3 : !kiln.qweight<"sg.weight", "f32", [8, 6]>, !kiln.qweight<"su.weight", "f32", [8, 6]>, !kiln.qweight<"s3.weight", "f32", [8, 6, 2]>) outs(%x : memref<8xf32>)
  return
}

// -----

func.func @shared_up_rows() {
  %g = step.weight : !kiln.qweight<"g.weight", "f32", [8, 4, 2]>
  %u = step.weight : !kiln.qweight<"u.weight", "f32", [8, 4, 2]>
  %d = step.weight : !kiln.qweight<"d.weight", "f32", [4, 8, 2]>
  %x = step.buffer "x" : memref<8xf32>
  %i = step.buffer "i" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  %sg = step.weight : !kiln.qweight<"sg.weight", "f32", [8, 6]>
  %uw = step.weight : !kiln.qweight<"uw.weight", "f32", [8, 5]>
  %sd = step.weight : !kiln.qweight<"sd.weight", "f32", [6, 8]>
  // expected-error @+1 {{'step.moe_experts' op shared gate and up must both be [8, ffn] (hidden matching the input), got [8, 6] and [8, 5]}}
  step.moe_experts ins(%x, %i, %w, %g, %u, %d : memref<8xf32>, memref<2xi32>, memref<2xf32>, !kiln.qweight<"g.weight", "f32", [8, 4, 2]>, !kiln.qweight<"u.weight", "f32", [8, 4, 2]>, !kiln.qweight<"d.weight", "f32", [4, 8, 2]>) shared(%sg, %uw, %sd : !kiln.qweight<"sg.weight", "f32", [8, 6]>, !kiln.qweight<"uw.weight", "f32", [8, 5]>, !kiln.qweight<"sd.weight", "f32", [6, 8]>) outs(%x : memref<8xf32>)
  return
}

// -----

func.func @shared_gate_hidden() {
  %g = step.weight : !kiln.qweight<"g.weight", "f32", [8, 4, 2]>
  %u = step.weight : !kiln.qweight<"u.weight", "f32", [8, 4, 2]>
  %d = step.weight : !kiln.qweight<"d.weight", "f32", [4, 8, 2]>
  %x = step.buffer "x" : memref<8xf32>
  %i = step.buffer "i" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  %gh = step.weight : !kiln.qweight<"gh.weight", "f32", [4, 6]>
  %su = step.weight : !kiln.qweight<"su.weight", "f32", [8, 6]>
  %sd = step.weight : !kiln.qweight<"sd.weight", "f32", [6, 8]>
  // expected-error @+1 {{'step.moe_experts' op shared gate and up must both be [8, ffn] (hidden matching the input), got [4, 6] and [8, 6]}}
  step.moe_experts ins(%x, %i, %w, %g, %u, %d : memref<8xf32>, memref<2xi32>, memref<2xf32>, !kiln.qweight<"g.weight", "f32", [8, 4, 2]>, !kiln.qweight<"u.weight", "f32", [8, 4, 2]>, !kiln.qweight<"d.weight", "f32", [4, 8, 2]>) shared(%gh, %su, %sd : !kiln.qweight<"gh.weight", "f32", [4, 6]>, !kiln.qweight<"su.weight", "f32", [8, 6]>, !kiln.qweight<"sd.weight", "f32", [6, 8]>) outs(%x : memref<8xf32>)
  return
}

// -----

func.func @shared_down() {
  %g = step.weight : !kiln.qweight<"g.weight", "f32", [8, 4, 2]>
  %u = step.weight : !kiln.qweight<"u.weight", "f32", [8, 4, 2]>
  %d = step.weight : !kiln.qweight<"d.weight", "f32", [4, 8, 2]>
  %x = step.buffer "x" : memref<8xf32>
  %i = step.buffer "i" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  %sg = step.weight : !kiln.qweight<"sg.weight", "f32", [8, 6]>
  %su = step.weight : !kiln.qweight<"su.weight", "f32", [8, 6]>
  %dt = step.weight : !kiln.qweight<"dt.weight", "f32", [8, 6]>
  // expected-error @+1 {{'step.moe_experts' op shared down must be [6, 8] (ffn, hidden), got [8, 6]}}
  step.moe_experts ins(%x, %i, %w, %g, %u, %d : memref<8xf32>, memref<2xi32>, memref<2xf32>, !kiln.qweight<"g.weight", "f32", [8, 4, 2]>, !kiln.qweight<"u.weight", "f32", [8, 4, 2]>, !kiln.qweight<"d.weight", "f32", [4, 8, 2]>) shared(%sg, %su, %dt : !kiln.qweight<"sg.weight", "f32", [8, 6]>, !kiln.qweight<"su.weight", "f32", [8, 6]>, !kiln.qweight<"dt.weight", "f32", [8, 6]>) outs(%x : memref<8xf32>)
  return
}

// -----

func.func @all_reduce_kind() {
  %a = step.buffer "a" : memref<4xf32>
  // expected-error @+1 {{'step.all_reduce' op reduction must be 'sum' or 'max'}}
  step.all_reduce ins(%a : memref<4xf32>) outs(%a : memref<4xf32>) {reduction = "mean"}
  return
}

// -----

func.func @argmax_rank() {
  %a = step.buffer "a" : memref<2x4xf32>
  %o = step.output "next" : memref<i32>
  // expected-error @+1 {{'step.argmax' op input must be a non-empty vector, got 'memref<2x4xf32>'}}
  step.argmax ins(%a : memref<2x4xf32>) outs(%o : memref<i32>)
  return
}

// -----

func.func @argmax_words() {
  %a = step.buffer "a" : memref<8xf32>
  %w = step.input "sampling" : memref<2xi32>
  %p = step.input "position" : memref<i32>
  %o = step.output "next" : memref<i32>
  // expected-error @+1 {{'step.argmax' op the sampling words must be memref<8xi32>, memref<4xi32> (a temperature only) or memref<(16 + 3 n)xi32> (with n adjustments, n > 0), got 'memref<2xi32>'}}
  step.argmax ins(%a : memref<8xf32>) sampled(%w, %p : memref<2xi32>, memref<i32>) outs(%o : memref<i32>)
  return
}

// -----

func.func @plan_alignment() attributes {
  // expected-error @+1 {{plan alignment must be a power of two, got 100}}
  step.plan = #step.plan<arena_bytes = 0, peak_live_bytes = 0, alignment = 100, buffers = 0>} {
  return
}

// -----

func.func @plan_peak() attributes {
  // expected-error @+1 {{peak live bytes (512) cannot exceed the arena (256)}}
  step.plan = #step.plan<arena_bytes = 256, peak_live_bytes = 512, alignment = 256, buffers = 1>} {
  return
}

// -----

func.func @fused_linear_output() {
  %x = step.buffer "x" : memref<256xf32>
  %y = step.buffer "y" : memref<200xf32>
  %w1 = step.weight : !kiln.qweight<"q.weight", "q8_0", [256, 128]>
  %w2 = step.weight : !kiln.qweight<"kv.weight", "q8_0", [256, 80]>
  // expected-error @+1 {{'step.fused_linear' op output must have shape [208], got 'memref<200xf32>'}}
  step.fused_linear ins(%x, %w1, %w2 : memref<256xf32>, !kiln.qweight<"q.weight", "q8_0", [256, 128]>, !kiln.qweight<"kv.weight", "q8_0", [256, 80]>) outs(%y : memref<200xf32>) {segments = [#kiln.segment<name = "q", offset = 0, rows = 128, format = "q8_0">, #kiln.segment<name = "kv", offset = 128, rows = 80, format = "q8_0">]}
  return
}

// -----

func.func @rms_norm_linear_norm_width() {
  %x = step.buffer "x" : memref<256xf32>
  %y = step.buffer "y" : memref<208xf32>
  %n = step.weight : !kiln.qweight<"q_a_norm.weight", "f32", [128]>
  %w1 = step.weight : !kiln.qweight<"q.weight", "q8_0", [256, 128]>
  %w2 = step.weight : !kiln.qweight<"kv.weight", "q8_0", [256, 80]>
  // expected-error @+1 {{'step.rms_norm_linear' op norm}}
  step.rms_norm_linear ins(%x, %n, %w1, %w2 : memref<256xf32>, !kiln.qweight<"q_a_norm.weight", "f32", [128]>, !kiln.qweight<"q.weight", "q8_0", [256, 128]>, !kiln.qweight<"kv.weight", "q8_0", [256, 80]>) outs(%y : memref<208xf32>) {epsilon = 1.0e-05 : f32, segments = [#kiln.segment<name = "q", offset = 0, rows = 128, format = "q8_0">, #kiln.segment<name = "kv", offset = 128, rows = 80, format = "q8_0">]}
  return
}

// -----

func.func @rms_norm_linear_epsilon() {
  %x = step.buffer "x" : memref<256xf32>
  %y = step.buffer "y" : memref<128xf32>
  %n = step.weight : !kiln.qweight<"q_a_norm.weight", "f32", [256]>
  %w1 = step.weight : !kiln.qweight<"q.weight", "q8_0", [256, 128]>
  // expected-error @+1 {{'step.rms_norm_linear' op epsilon}}
  step.rms_norm_linear ins(%x, %n, %w1 : memref<256xf32>, !kiln.qweight<"q_a_norm.weight", "f32", [256]>, !kiln.qweight<"q.weight", "q8_0", [256, 128]>) outs(%y : memref<128xf32>) {epsilon = 0.0 : f32, segments = [#kiln.segment<name = "q", offset = 0, rows = 128, format = "q8_0">]}
  return
}

// -----

func.func @live_from_count() {
  %x = step.buffer "x" : memref<256xf32>
  %y = step.buffer "y" : memref<192xf32>
  %w1 = step.weight : !kiln.qweight<"q.weight", "q8_0", [256, 128]>
  %w2 = step.weight : !kiln.qweight<"iq.weight", "q8_0", [256, 64]>
  // expected-error @+1 {{'step.fused_linear' op live_from needs one position per weight (2), got 1}}
  step.fused_linear ins(%x, %w1, %w2 : memref<256xf32>, !kiln.qweight<"q.weight", "q8_0", [256, 128]>, !kiln.qweight<"iq.weight", "q8_0", [256, 64]>) outs(%y : memref<192xf32>) {live_from = array<i64: 0>, segments = [#kiln.segment<name = "q", offset = 0, rows = 128, format = "q8_0">, #kiln.segment<name = "iq", offset = 128, rows = 64, format = "q8_0">]}
  return
}

// -----

func.func @live_from_negative() {
  %x = step.buffer "x" : memref<256xf32>
  %y = step.buffer "y" : memref<192xf32>
  %n = step.weight : !kiln.qweight<"q_a_norm.weight", "f32", [256]>
  %w1 = step.weight : !kiln.qweight<"q.weight", "q8_0", [256, 128]>
  %w2 = step.weight : !kiln.qweight<"iq.weight", "q8_0", [256, 64]>
  // expected-error @+1 {{'step.rms_norm_linear' op live_from positions must not be negative, got -1}}
  step.rms_norm_linear ins(%x, %n, %w1, %w2 : memref<256xf32>, !kiln.qweight<"q_a_norm.weight", "f32", [256]>, !kiln.qweight<"q.weight", "q8_0", [256, 128]>, !kiln.qweight<"iq.weight", "q8_0", [256, 64]>) outs(%y : memref<192xf32>) {epsilon = 1.0e-05 : f32, live_from = array<i64: 0, -1>, segments = [#kiln.segment<name = "q", offset = 0, rows = 128, format = "q8_0">, #kiln.segment<name = "iq", offset = 128, rows = 64, format = "q8_0">]}
  return
}

// -----

func.func @swiglu_linear_width() {
  %g = step.buffer "g" : memref<128xf32>
  %u = step.buffer "u" : memref<128xf32>
  %y = step.buffer "y" : memref<256xf32>
  %w = step.weight : !kiln.qweight<"down.weight", "q8_0", [64, 256]>
  // expected-error @+1 {{'step.swiglu_linear' op gate and up have 128 values but the weight's ne[0] is 64}}
  step.swiglu_linear ins(%g, %u, %w : memref<128xf32>, memref<128xf32>, !kiln.qweight<"down.weight", "q8_0", [64, 256]>) outs(%y : memref<256xf32>)
  return
}

// -----

func.func @swiglu_linear_up_type() {
  %g = step.buffer "g" : memref<128xf32>
  %u = step.buffer "u" : memref<64xf32>
  %y = step.buffer "y" : memref<256xf32>
  %w = step.weight : !kiln.qweight<"down.weight", "q8_0", [128, 256]>
  // expected-error @+1 {{'step.swiglu_linear' op operands and output must have one type}}
  step.swiglu_linear ins(%g, %u, %w : memref<128xf32>, memref<64xf32>, !kiln.qweight<"down.weight", "q8_0", [128, 256]>) outs(%y : memref<256xf32>)
  return
}

// -----

func.func @swiglu_linear_output() {
  %g = step.buffer "g" : memref<128xf32>
  %u = step.buffer "u" : memref<128xf32>
  %y = step.buffer "y" : memref<128xf32>
  %w = step.weight : !kiln.qweight<"down.weight", "q8_0", [128, 256]>
  // expected-error @+1 {{'step.swiglu_linear' op output must have shape [256]}}
  step.swiglu_linear ins(%g, %u, %w : memref<128xf32>, memref<128xf32>, !kiln.qweight<"down.weight", "q8_0", [128, 256]>) outs(%y : memref<128xf32>)
  return
}

// -----

func.func @swiglu_linear_matrix() {
  %g = step.buffer "g" : memref<2x64xf32>
  %u = step.buffer "u" : memref<2x64xf32>
  %y = step.buffer "y" : memref<2x32xf32>
  %w = step.weight : !kiln.qweight<"w.weight", "q8_0", [64, 32, 2]>
  // expected-error @+1 {{'step.swiglu_linear' op gate and up must be vectors}}
  step.swiglu_linear ins(%g, %u, %w : memref<2x64xf32>, memref<2x64xf32>, !kiln.qweight<"w.weight", "q8_0", [64, 32, 2]>) outs(%y : memref<2x32xf32>)
  return
}

// -----

func.func @norm_rope_append_kind() {
  %x = step.buffer "x" : memref<80xf32>
  %n = step.buffer "n" : memref<64xf32>
  %p = step.buffer "p" : memref<i32>
  %c = step.state "c" : memref<16x80xf16>
  // expected-error @+1 {{'step.norm_rope_append' op norm must be 'rms' or 'layer', got 'batch'}}
  step.norm_rope_append ins(%x, %n, %p : memref<80xf32>, memref<64xf32>, memref<i32>) outs(%c : memref<16x80xf16>) {dims = 16 : i64, epsilon = 1.0e-05 : f32, norm = "batch", norm_dims = 64 : i64, offset = 64 : i64, style = "interleaved", theta = 1.0e+06 : f32}
  return
}

// -----

func.func @norm_rope_append_layer_without_bias() {
  %x = step.buffer "x" : memref<80xf32>
  %n = step.buffer "n" : memref<64xf32>
  %p = step.buffer "p" : memref<i32>
  %c = step.state "c" : memref<16x80xf16>
  // expected-error @+1 {{'step.norm_rope_append' op a layer norm needs a bias}}
  step.norm_rope_append ins(%x, %n, %p : memref<80xf32>, memref<64xf32>, memref<i32>) outs(%c : memref<16x80xf16>) {dims = 16 : i64, epsilon = 1.0e-05 : f32, norm = "layer", norm_dims = 64 : i64, offset = 64 : i64, style = "interleaved", theta = 1.0e+06 : f32}
  return
}

// -----

func.func @norm_rope_append_weight_width() {
  %x = step.buffer "x" : memref<80xf32>
  %n = step.buffer "n" : memref<80xf32>
  %p = step.buffer "p" : memref<i32>
  %c = step.state "c" : memref<16x80xf16>
  // expected-error @+1 {{'step.norm_rope_append' op weight must have shape [64]}}
  step.norm_rope_append ins(%x, %n, %p : memref<80xf32>, memref<80xf32>, memref<i32>) outs(%c : memref<16x80xf16>) {dims = 16 : i64, epsilon = 1.0e-05 : f32, norm = "rms", norm_dims = 64 : i64, offset = 64 : i64, style = "interleaved", theta = 1.0e+06 : f32}
  return
}

// -----

func.func @norm_rope_append_rope_range() {
  %x = step.buffer "x" : memref<80xf32>
  %n = step.buffer "n" : memref<64xf32>
  %p = step.buffer "p" : memref<i32>
  %c = step.state "c" : memref<16x80xf16>
  // expected-error @+1 {{'step.norm_rope_append' op rotates [72, 88) (an even, positive width is needed) of a row of 80}}
  step.norm_rope_append ins(%x, %n, %p : memref<80xf32>, memref<64xf32>, memref<i32>) outs(%c : memref<16x80xf16>) {dims = 16 : i64, epsilon = 1.0e-05 : f32, norm = "rms", norm_dims = 64 : i64, offset = 72 : i64, style = "interleaved", theta = 1.0e+06 : f32}
  return
}

// -----

func.func @norm_rope_append_entry_width() {
  %x = step.buffer "x" : memref<64xf32>
  %n = step.buffer "n" : memref<64xf32>
  %p = step.buffer "p" : memref<i32>
  %c = step.state "c" : memref<16x80xf16>
  // expected-error @+1 {{'step.norm_rope_append' op entry must have shape [80]}}
  step.norm_rope_append ins(%x, %n, %p : memref<64xf32>, memref<64xf32>, memref<i32>) outs(%c : memref<16x80xf16>) {dims = 16 : i64, epsilon = 1.0e-05 : f32, norm = "rms", norm_dims = 64 : i64, offset = 64 : i64, style = "interleaved", theta = 1.0e+06 : f32}
  return
}

// -----

func.func @dsa_indexer_partial_rope() {
  %q = step.buffer "q" : memref<4x32xf32>
  %w = step.buffer "w" : memref<4xf32>
  %p = step.buffer "p" : memref<i32>
  %k = step.state "k" : memref<64x32xf16>
  %s = step.buffer "s" : memref<16xi32>
  %n = step.buffer "n" : memref<i32>
  // expected-error @+1 {{'step.dsa_indexer' op rope_style, rope_theta, rope_offset and rope_dims come together}}
  step.dsa_indexer ins(%q, %w, %k, %p : memref<4x32xf32>, memref<4xf32>, memref<64x32xf16>, memref<i32>) outs(%s, %n : memref<16xi32>, memref<i32>) {rope_dims = 16 : i64, scale = 0.125 : f32, top_k = 16 : i64}
  return
}

// -----

func.func @dsa_indexer_rope_range() {
  %q = step.buffer "q" : memref<4x32xf32>
  %w = step.buffer "w" : memref<4xf32>
  %p = step.buffer "p" : memref<i32>
  %k = step.state "k" : memref<64x32xf16>
  %s = step.buffer "s" : memref<16xi32>
  %n = step.buffer "n" : memref<i32>
  // expected-error @+1 {{'step.dsa_indexer' op rotates [24, 40) (an even, positive width is needed) of a query row of 32}}
  step.dsa_indexer ins(%q, %w, %k, %p : memref<4x32xf32>, memref<4xf32>, memref<64x32xf16>, memref<i32>) outs(%s, %n : memref<16xi32>, memref<i32>) {rope_dims = 16 : i64, rope_offset = 24 : i64, rope_style = "interleaved", rope_theta = 1.0e+06 : f32, scale = 0.125 : f32, top_k = 16 : i64}
  return
}

// -----

func.func @router_partial_residual() {
  %p = step.buffer "p" : memref<8xf32>
  %x = step.buffer "x" : memref<4xf32>
  %g = step.weight : !kiln.qweight<"g.weight", "f32", [8, 4]>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [8]>
  %o = step.buffer "o" : memref<4xf32>
  // expected-error @+1 {{'step.router_partial' op residual must have the partial's type 'memref<8xf32>', got 'memref<4xf32>'}}
  step.router_partial ins(%p, %x, %g, %n : memref<8xf32>, memref<4xf32>, !kiln.qweight<"g.weight", "f32", [8, 4]>, !kiln.qweight<"n.weight", "f32", [8]>) outs(%o : memref<4xf32>) {residual_scale = 0.5 : f32}
  return
}

// -----

func.func @router_partial_gate_format() {
  %p = step.buffer "p" : memref<32xf32>
  %g = step.weight : !kiln.qweight<"g.weight", "q8_0", [32, 4]>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [32]>
  %o = step.buffer "o" : memref<4xf32>
  // expected-error @+1 {{'step.router_partial' op gate must be an f32 [32, experts] weight, got '!kiln.qweight<"g.weight", "q8_0", [32, 4]>'}}
  step.router_partial ins(%p, %p, %g, %n : memref<32xf32>, memref<32xf32>, !kiln.qweight<"g.weight", "q8_0", [32, 4]>, !kiln.qweight<"n.weight", "f32", [32]>) outs(%o : memref<4xf32>) {residual_scale = 0.5 : f32}
  return
}

// -----

func.func @router_partial_gate_rows() {
  %p = step.buffer "p" : memref<8xf32>
  %g = step.weight : !kiln.qweight<"g.weight", "f32", [16, 4]>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [8]>
  %o = step.buffer "o" : memref<4xf32>
  // expected-error @+1 {{'step.router_partial' op gate must be an f32 [8, experts] weight, got '!kiln.qweight<"g.weight", "f32", [16, 4]>'}}
  step.router_partial ins(%p, %p, %g, %n : memref<8xf32>, memref<8xf32>, !kiln.qweight<"g.weight", "f32", [16, 4]>, !kiln.qweight<"n.weight", "f32", [8]>) outs(%o : memref<4xf32>) {residual_scale = 0.5 : f32}
  return
}

// -----

func.func @router_partial_norm() {
  %p = step.buffer "p" : memref<8xf32>
  %g = step.weight : !kiln.qweight<"g.weight", "f32", [8, 4]>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [4]>
  %o = step.buffer "o" : memref<4xf32>
  // expected-error @+1 {{'step.router_partial' op norm must have 8 values, got '!kiln.qweight<"n.weight", "f32", [4]>'}}
  step.router_partial ins(%p, %p, %g, %n : memref<8xf32>, memref<8xf32>, !kiln.qweight<"g.weight", "f32", [8, 4]>, !kiln.qweight<"n.weight", "f32", [4]>) outs(%o : memref<4xf32>) {residual_scale = 0.5 : f32}
  return
}

// -----

func.func @router_partial_output() {
  %p = step.buffer "p" : memref<8xf32>
  %g = step.weight : !kiln.qweight<"g.weight", "f32", [8, 4]>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [8]>
  %o = step.buffer "o" : memref<8xf32>
  // expected-error @+1 {{'step.router_partial' op output must have shape [4], got 'memref<8xf32>'}}
  step.router_partial ins(%p, %p, %g, %n : memref<8xf32>, memref<8xf32>, !kiln.qweight<"g.weight", "f32", [8, 4]>, !kiln.qweight<"n.weight", "f32", [8]>) outs(%o : memref<8xf32>) {residual_scale = 0.5 : f32}
  return
}

// -----

func.func @router_partial_scale() {
  %p = step.buffer "p" : memref<8xf32>
  %g = step.weight : !kiln.qweight<"g.weight", "f32", [8, 4]>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [8]>
  %o = step.buffer "o" : memref<4xf32>
  // expected-error @+1 {{'step.router_partial' op residual_scale must be positive and finite, got 0}}
  step.router_partial ins(%p, %p, %g, %n : memref<8xf32>, memref<8xf32>, !kiln.qweight<"g.weight", "f32", [8, 4]>, !kiln.qweight<"n.weight", "f32", [8]>) outs(%o : memref<4xf32>) {residual_scale = 0.0 : f32}
  return
}

// -----

func.func @linear_router_weight_dims() {
  %i = step.buffer "i" : memref<32xf32>
  %w = step.weight : !kiln.qweight<"w.weight", "q8_0", [32, 8, 2]>
  %x = step.buffer "x" : memref<8xf32>
  %g = step.weight : !kiln.qweight<"g.weight", "f32", [8, 4]>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [8]>
  %o = step.buffer "o" : memref<12xf32>
  // expected-error @+1 {{'step.linear_router' op weight must be a 2-D [K, N] matrix, got '!kiln.qweight<"w.weight", "q8_0", [32, 8, 2]>'}}
  step.linear_router ins(%i, %w, %x, %g, %n : memref<32xf32>, !kiln.qweight<"w.weight", "q8_0", [32, 8, 2]>, memref<8xf32>, !kiln.qweight<"g.weight", "f32", [8, 4]>, !kiln.qweight<"n.weight", "f32", [8]>) outs(%o : memref<12xf32>) {ranks = 2 : i64}
  return
}

// -----

func.func @linear_router_input() {
  %i = step.buffer "i" : memref<16xf32>
  %w = step.weight : !kiln.qweight<"w.weight", "q8_0", [32, 8], shard = 0 of 2>
  %x = step.buffer "x" : memref<8xf32>
  %g = step.weight : !kiln.qweight<"g.weight", "f32", [8, 4]>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [8]>
  %o = step.buffer "o" : memref<12xf32>
  // expected-error @+1 {{'step.linear_router' op input must be memref<32xf32> (the weight's ne[0]), got 'memref<16xf32>'}}
  step.linear_router ins(%i, %w, %x, %g, %n : memref<16xf32>, !kiln.qweight<"w.weight", "q8_0", [32, 8], shard = 0 of 2>, memref<8xf32>, !kiln.qweight<"g.weight", "f32", [8, 4]>, !kiln.qweight<"n.weight", "f32", [8]>) outs(%o : memref<12xf32>) {ranks = 2 : i64}
  return
}

// -----

func.func @linear_router_residual() {
  %i = step.buffer "i" : memref<32xf32>
  %w = step.weight : !kiln.qweight<"w.weight", "q8_0", [32, 8], shard = 0 of 2>
  %x = step.buffer "x" : memref<16xf32>
  %g = step.weight : !kiln.qweight<"g.weight", "f32", [8, 4]>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [8]>
  %o = step.buffer "o" : memref<12xf32>
  // expected-error @+1 {{'step.linear_router' op residual must be memref<8xf32> (the weight's ne[1]), got 'memref<16xf32>'}}
  step.linear_router ins(%i, %w, %x, %g, %n : memref<32xf32>, !kiln.qweight<"w.weight", "q8_0", [32, 8], shard = 0 of 2>, memref<16xf32>, !kiln.qweight<"g.weight", "f32", [8, 4]>, !kiln.qweight<"n.weight", "f32", [8]>) outs(%o : memref<12xf32>) {ranks = 2 : i64}
  return
}

// -----

func.func @linear_router_gate_format() {
  %i = step.buffer "i" : memref<32xf32>
  %w = step.weight : !kiln.qweight<"w.weight", "q8_0", [32, 32], shard = 0 of 2>
  %x = step.buffer "x" : memref<32xf32>
  %g = step.weight : !kiln.qweight<"g.weight", "q8_0", [32, 4]>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [32]>
  %o = step.buffer "o" : memref<36xf32>
  // expected-error @+1 {{'step.linear_router' op gate must be a whole f32 [32, experts] weight, got '!kiln.qweight<"g.weight", "q8_0", [32, 4]>'}}
  step.linear_router ins(%i, %w, %x, %g, %n : memref<32xf32>, !kiln.qweight<"w.weight", "q8_0", [32, 32], shard = 0 of 2>, memref<32xf32>, !kiln.qweight<"g.weight", "q8_0", [32, 4]>, !kiln.qweight<"n.weight", "f32", [32]>) outs(%o : memref<36xf32>) {ranks = 2 : i64}
  return
}

// -----

func.func @linear_router_gate_sharded() {
  %i = step.buffer "i" : memref<32xf32>
  %w = step.weight : !kiln.qweight<"w.weight", "q8_0", [32, 8], shard = 0 of 2>
  %x = step.buffer "x" : memref<8xf32>
  %g = step.weight : !kiln.qweight<"g.weight", "f32", [8, 2], shard = 1 of 2>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [8]>
  %o = step.buffer "o" : memref<12xf32>
  // expected-error @+1 {{'step.linear_router' op gate must be a whole f32 [8, experts] weight, got '!kiln.qweight<"g.weight", "f32", [8, 2], shard = 1 of 2>'}}
  step.linear_router ins(%i, %w, %x, %g, %n : memref<32xf32>, !kiln.qweight<"w.weight", "q8_0", [32, 8], shard = 0 of 2>, memref<8xf32>, !kiln.qweight<"g.weight", "f32", [8, 2], shard = 1 of 2>, !kiln.qweight<"n.weight", "f32", [8]>) outs(%o : memref<12xf32>) {ranks = 2 : i64}
  return
}

// -----

func.func @linear_router_norm_buffer() {
  %i = step.buffer "i" : memref<32xf32>
  %w = step.weight : !kiln.qweight<"w.weight", "q8_0", [32, 8], shard = 0 of 2>
  %x = step.buffer "x" : memref<8xf32>
  %g = step.weight : !kiln.qweight<"g.weight", "f32", [8, 4]>
  %n = step.buffer "n" : memref<8xf32>
  %o = step.buffer "o" : memref<12xf32>
  // expected-error @+1 {{'step.linear_router' op norm must be an f32 weight of 8 values (read at load), got 'memref<8xf32>'}}
  step.linear_router ins(%i, %w, %x, %g, %n : memref<32xf32>, !kiln.qweight<"w.weight", "q8_0", [32, 8], shard = 0 of 2>, memref<8xf32>, !kiln.qweight<"g.weight", "f32", [8, 4]>, memref<8xf32>) outs(%o : memref<12xf32>) {ranks = 2 : i64}
  return
}

// -----

func.func @linear_router_norm_size() {
  %i = step.buffer "i" : memref<32xf32>
  %w = step.weight : !kiln.qweight<"w.weight", "q8_0", [32, 8], shard = 0 of 2>
  %x = step.buffer "x" : memref<8xf32>
  %g = step.weight : !kiln.qweight<"g.weight", "f32", [8, 4]>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [4]>
  %o = step.buffer "o" : memref<12xf32>
  // expected-error @+1 {{'step.linear_router' op norm must be an f32 weight of 8 values (read at load), got '!kiln.qweight<"n.weight", "f32", [4]>'}}
  step.linear_router ins(%i, %w, %x, %g, %n : memref<32xf32>, !kiln.qweight<"w.weight", "q8_0", [32, 8], shard = 0 of 2>, memref<8xf32>, !kiln.qweight<"g.weight", "f32", [8, 4]>, !kiln.qweight<"n.weight", "f32", [4]>) outs(%o : memref<12xf32>) {ranks = 2 : i64}
  return
}

// -----

func.func @linear_router_ranks() {
  %i = step.buffer "i" : memref<32xf32>
  %w = step.weight : !kiln.qweight<"w.weight", "q8_0", [32, 8], shard = 0 of 2>
  %x = step.buffer "x" : memref<8xf32>
  %g = step.weight : !kiln.qweight<"g.weight", "f32", [8, 4]>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [8]>
  %o = step.buffer "o" : memref<12xf32>
  // expected-error @+1 {{'step.linear_router' op ranks must be at least 1 and divide the 8 outputs, got 3}}
  step.linear_router ins(%i, %w, %x, %g, %n : memref<32xf32>, !kiln.qweight<"w.weight", "q8_0", [32, 8], shard = 0 of 2>, memref<8xf32>, !kiln.qweight<"g.weight", "f32", [8, 4]>, !kiln.qweight<"n.weight", "f32", [8]>) outs(%o : memref<12xf32>) {ranks = 3 : i64}
  return
}

// -----

func.func @linear_router_no_ranks() {
  %i = step.buffer "i" : memref<32xf32>
  %w = step.weight : !kiln.qweight<"w.weight", "q8_0", [32, 8], shard = 0 of 2>
  %x = step.buffer "x" : memref<8xf32>
  %g = step.weight : !kiln.qweight<"g.weight", "f32", [8, 4]>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [8]>
  %o = step.buffer "o" : memref<12xf32>
  // expected-error @+1 {{'step.linear_router' op ranks must be at least 1 and divide the 8 outputs, got 0}}
  step.linear_router ins(%i, %w, %x, %g, %n : memref<32xf32>, !kiln.qweight<"w.weight", "q8_0", [32, 8], shard = 0 of 2>, memref<8xf32>, !kiln.qweight<"g.weight", "f32", [8, 4]>, !kiln.qweight<"n.weight", "f32", [8]>) outs(%o : memref<12xf32>) {ranks = 0 : i64}
  return
}

// -----

func.func @linear_router_output() {
  %i = step.buffer "i" : memref<32xf32>
  %w = step.weight : !kiln.qweight<"w.weight", "q8_0", [32, 8], shard = 0 of 2>
  %x = step.buffer "x" : memref<8xf32>
  %g = step.weight : !kiln.qweight<"g.weight", "f32", [8, 4]>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [8]>
  %o = step.buffer "o" : memref<8xf32>
  // expected-error @+1 {{'step.linear_router' op output must have shape [12], got 'memref<8xf32>'}}
  step.linear_router ins(%i, %w, %x, %g, %n : memref<32xf32>, !kiln.qweight<"w.weight", "q8_0", [32, 8], shard = 0 of 2>, memref<8xf32>, !kiln.qweight<"g.weight", "f32", [8, 4]>, !kiln.qweight<"n.weight", "f32", [8]>) outs(%o : memref<8xf32>) {ranks = 2 : i64}
  return
}

// -----

func.func @choose_logits() {
  %l = step.buffer "l" : memref<2x4xf32>
  %i = step.buffer "i" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  // expected-error @+1 {{'step.moe_choose' op logits must be a vector of f32, got 'memref<2x4xf32>'}}
  step.moe_choose ins(%l : memref<2x4xf32>) outs(%i, %w : memref<2xi32>, memref<2xf32>) {gating = "sigmoid", normalize = true, routed_scale = 1.0 : f32, top_k = 2 : i64}
  return
}

// -----

func.func @choose_topk() {
  %l = step.buffer "l" : memref<4xf32>
  %i = step.buffer "i" : memref<5xi32>
  %w = step.buffer "w" : memref<5xf32>
  // expected-error @+1 {{'step.moe_choose' op top_k must be in 1..4}}
  step.moe_choose ins(%l : memref<4xf32>) outs(%i, %w : memref<5xi32>, memref<5xf32>) {gating = "sigmoid", normalize = true, routed_scale = 1.0 : f32, top_k = 5 : i64}
  return
}

// -----

func.func @choose_bias() {
  %l = step.buffer "l" : memref<4xf32>
  %b = step.weight : !kiln.qweight<"b.bias", "f32", [8]>
  %i = step.buffer "i" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  // expected-error @+1 {{'step.moe_choose' op bias must have 4 values, got '!kiln.qweight<"b.bias", "f32", [8]>'}}
  step.moe_choose ins(%l, %b : memref<4xf32>, !kiln.qweight<"b.bias", "f32", [8]>) outs(%i, %w : memref<2xi32>, memref<2xf32>) {gating = "sigmoid", normalize = true, routed_scale = 1.0 : f32, top_k = 2 : i64}
  return
}

// -----

func.func @choose_weights() {
  %l = step.buffer "l" : memref<4xf32>
  %i = step.buffer "i" : memref<2xi32>
  %w = step.buffer "w" : memref<3xf32>
  // expected-error @+1 {{'step.moe_choose' op weights must have shape [2], got 'memref<3xf32>'}}
  step.moe_choose ins(%l : memref<4xf32>) outs(%i, %w : memref<2xi32>, memref<3xf32>) {gating = "softmax", normalize = false, routed_scale = 1.0 : f32, top_k = 2 : i64}
  return
}

// -----

func.func @all_reduce_tail_without_logits() {
  %p = step.buffer "p" : memref<12xf32>
  %x = step.buffer "x" : memref<8xf32>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [8]>
  %h = step.buffer "h" : memref<8xf32>
  %y = step.buffer "y" : memref<8xf32>
  // expected-error @+1 {{'step.all_reduce_add_rms_norm' op a tail and its logits output come together}}
  step.all_reduce_add_rms_norm ins(%p, %x, %n : memref<12xf32>, memref<8xf32>, !kiln.qweight<"n.weight", "f32", [8]>) outs(%h, %y : memref<8xf32>, memref<8xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum", tail = 4 : i64}
  return
}

// -----

func.func @all_reduce_logits_without_tail() {
  %p = step.buffer "p" : memref<12xf32>
  %x = step.buffer "x" : memref<8xf32>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [8]>
  %h = step.buffer "h" : memref<8xf32>
  %y = step.buffer "y" : memref<8xf32>
  %l = step.buffer "l" : memref<4xf32>
  // expected-error @+1 {{'step.all_reduce_add_rms_norm' op a tail and its logits output come together}}
  step.all_reduce_add_rms_norm ins(%p, %x, %n : memref<12xf32>, memref<8xf32>, !kiln.qweight<"n.weight", "f32", [8]>) outs(%h, %y, %l : memref<8xf32>, memref<8xf32>, memref<4xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum"}
  return
}

// -----

func.func @all_reduce_tail_zero() {
  %p = step.buffer "p" : memref<8xf32>
  %x = step.buffer "x" : memref<8xf32>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [8]>
  %h = step.buffer "h" : memref<8xf32>
  %y = step.buffer "y" : memref<8xf32>
  %l = step.buffer "l" : memref<4xf32>
  // expected-error @+1 {{'step.all_reduce_add_rms_norm' op tail must be positive, got 0}}
  step.all_reduce_add_rms_norm ins(%p, %x, %n : memref<8xf32>, memref<8xf32>, !kiln.qweight<"n.weight", "f32", [8]>) outs(%h, %y, %l : memref<8xf32>, memref<8xf32>, memref<4xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum", tail = 0 : i64}
  return
}

// -----

func.func @all_reduce_tail_partial() {
  %p = step.buffer "p" : memref<8xf32>
  %x = step.buffer "x" : memref<8xf32>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [8]>
  %h = step.buffer "h" : memref<8xf32>
  %y = step.buffer "y" : memref<8xf32>
  %l = step.buffer "l" : memref<4xf32>
  // expected-error @+1 {{'step.all_reduce_add_rms_norm' op with a tail of 4 the partial must be memref<12xf32> (the sum's 8 values, then the tail's), got 'memref<8xf32>'}}
  step.all_reduce_add_rms_norm ins(%p, %x, %n : memref<8xf32>, memref<8xf32>, !kiln.qweight<"n.weight", "f32", [8]>) outs(%h, %y, %l : memref<8xf32>, memref<8xf32>, memref<4xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum", tail = 4 : i64}
  return
}

// -----

func.func @all_reduce_tail_logits() {
  %p = step.buffer "p" : memref<12xf32>
  %x = step.buffer "x" : memref<8xf32>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [8]>
  %h = step.buffer "h" : memref<8xf32>
  %y = step.buffer "y" : memref<8xf32>
  %l = step.buffer "l" : memref<3xf32>
  // expected-error @+1 {{'step.all_reduce_add_rms_norm' op logits must be memref<4xf32>, got 'memref<3xf32>'}}
  step.all_reduce_add_rms_norm ins(%p, %x, %n : memref<12xf32>, memref<8xf32>, !kiln.qweight<"n.weight", "f32", [8]>) outs(%h, %y, %l : memref<8xf32>, memref<8xf32>, memref<3xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum", tail = 4 : i64}
  return
}

// -----

func.func @all_reduce_tail_rows() {
  %p = step.buffer "p" : memref<20xf32>
  %x = step.buffer "x" : memref<2x8xf32>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [8]>
  %h = step.buffer "h" : memref<2x8xf32>
  %y = step.buffer "y" : memref<2x8xf32>
  %l = step.buffer "l" : memref<4xf32>
  // expected-error @+1 {{'step.all_reduce_add_rms_norm' op with a tail the sum must be a vector of f32, got 'memref<2x8xf32>'}}
  step.all_reduce_add_rms_norm ins(%p, %x, %n : memref<20xf32>, memref<2x8xf32>, !kiln.qweight<"n.weight", "f32", [8]>) outs(%h, %y, %l : memref<2x8xf32>, memref<2x8xf32>, memref<4xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum", tail = 4 : i64}
  return
}

// -----

func.func @all_reduce_choice_without_tail() {
  %p = step.buffer "p" : memref<8xf32>
  %x = step.buffer "x" : memref<8xf32>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [8]>
  %h = step.buffer "h" : memref<8xf32>
  %y = step.buffer "y" : memref<8xf32>
  %i = step.buffer "i" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  // expected-error @+1 {{'step.all_reduce_add_rms_norm' op a choice needs a tail: it chooses from the tail's logits}}
  step.all_reduce_add_rms_norm ins(%p, %x, %n : memref<8xf32>, memref<8xf32>, !kiln.qweight<"n.weight", "f32", [8]>) outs(%h, %y : memref<8xf32>, memref<8xf32>) choose outs(%i, %w : memref<2xi32>, memref<2xf32>) {epsilon = 1.0e-05 : f32, gating = "sigmoid", normalize = true, reduction = "sum", routed_scale = 1.0 : f32, top_k = 2 : i64}
  return
}

// -----

func.func @all_reduce_choice_incomplete() {
  %p = step.buffer "p" : memref<12xf32>
  %x = step.buffer "x" : memref<8xf32>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [8]>
  %h = step.buffer "h" : memref<8xf32>
  %y = step.buffer "y" : memref<8xf32>
  %l = step.buffer "l" : memref<4xf32>
  %i = step.buffer "i" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  // expected-error @+1 {{'step.all_reduce_add_rms_norm' op a choice needs its ids and weights outputs and top_k, gating, normalize and routed_scale}}
  step.all_reduce_add_rms_norm ins(%p, %x, %n : memref<12xf32>, memref<8xf32>, !kiln.qweight<"n.weight", "f32", [8]>) outs(%h, %y, %l : memref<8xf32>, memref<8xf32>, memref<4xf32>) choose outs(%i, %w : memref<2xi32>, memref<2xf32>) {epsilon = 1.0e-05 : f32, reduction = "sum", tail = 4 : i64, top_k = 2 : i64}
  return
}

// -----

func.func @all_reduce_choice_attributes_only() {
  %p = step.buffer "p" : memref<12xf32>
  %x = step.buffer "x" : memref<8xf32>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [8]>
  %h = step.buffer "h" : memref<8xf32>
  %y = step.buffer "y" : memref<8xf32>
  %l = step.buffer "l" : memref<4xf32>
  // expected-error @+1 {{'step.all_reduce_add_rms_norm' op a choice needs its ids and weights outputs and top_k, gating, normalize and routed_scale}}
  step.all_reduce_add_rms_norm ins(%p, %x, %n : memref<12xf32>, memref<8xf32>, !kiln.qweight<"n.weight", "f32", [8]>) outs(%h, %y, %l : memref<8xf32>, memref<8xf32>, memref<4xf32>) {epsilon = 1.0e-05 : f32, gating = "sigmoid", normalize = true, reduction = "sum", routed_scale = 1.0 : f32, tail = 4 : i64, top_k = 2 : i64}
  return
}

// -----

// A bias without a choice: the assembly cannot say it, the generic form can.
func.func @all_reduce_bias_without_choice() {
  %p = step.buffer "p" : memref<12xf32>
  %x = step.buffer "x" : memref<8xf32>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [8]>
  %h = step.buffer "h" : memref<8xf32>
  %y = step.buffer "y" : memref<8xf32>
  %l = step.buffer "l" : memref<4xf32>
  %b = step.weight : !kiln.qweight<"b.bias", "f32", [4]>
  // expected-error @+1 {{'step.all_reduce_add_rms_norm' op a bias comes only with a choice}}
  "step.all_reduce_add_rms_norm"(%p, %x, %n, %b, %h, %y, %l) <{epsilon = 1.0e-05 : f32, operandSegmentSizes = array<i32: 1, 1, 1, 1, 1, 1, 1, 0, 0>, reduction = "sum", tail = 4 : i64}> : (memref<12xf32>, memref<8xf32>, !kiln.qweight<"n.weight", "f32", [8]>, !kiln.qweight<"b.bias", "f32", [4]>, memref<8xf32>, memref<8xf32>, memref<4xf32>) -> ()
  return
}

// -----

func.func @all_reduce_choice_topk() {
  %p = step.buffer "p" : memref<12xf32>
  %x = step.buffer "x" : memref<8xf32>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [8]>
  %h = step.buffer "h" : memref<8xf32>
  %y = step.buffer "y" : memref<8xf32>
  %l = step.buffer "l" : memref<4xf32>
  %i = step.buffer "i" : memref<5xi32>
  %w = step.buffer "w" : memref<5xf32>
  // expected-error @+1 {{'step.all_reduce_add_rms_norm' op top_k must be in 1..4}}
  step.all_reduce_add_rms_norm ins(%p, %x, %n : memref<12xf32>, memref<8xf32>, !kiln.qweight<"n.weight", "f32", [8]>) outs(%h, %y, %l : memref<8xf32>, memref<8xf32>, memref<4xf32>) choose outs(%i, %w : memref<5xi32>, memref<5xf32>) {epsilon = 1.0e-05 : f32, gating = "sigmoid", normalize = true, reduction = "sum", routed_scale = 1.0 : f32, tail = 4 : i64, top_k = 5 : i64}
  return
}

// -----

func.func @all_reduce_choice_bias() {
  %p = step.buffer "p" : memref<12xf32>
  %x = step.buffer "x" : memref<8xf32>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [8]>
  %h = step.buffer "h" : memref<8xf32>
  %y = step.buffer "y" : memref<8xf32>
  %l = step.buffer "l" : memref<4xf32>
  %b = step.weight : !kiln.qweight<"b.bias", "f32", [8]>
  %i = step.buffer "i" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  // expected-error @+1 {{'step.all_reduce_add_rms_norm' op bias must have 4 values, got '!kiln.qweight<"b.bias", "f32", [8]>'}}
  step.all_reduce_add_rms_norm ins(%p, %x, %n : memref<12xf32>, memref<8xf32>, !kiln.qweight<"n.weight", "f32", [8]>) outs(%h, %y, %l : memref<8xf32>, memref<8xf32>, memref<4xf32>) choose ins(%b : !kiln.qweight<"b.bias", "f32", [8]>) outs(%i, %w : memref<2xi32>, memref<2xf32>) {epsilon = 1.0e-05 : f32, gating = "sigmoid", normalize = true, reduction = "sum", routed_scale = 1.0 : f32, tail = 4 : i64, top_k = 2 : i64}
  return
}

// -----

func.func @all_reduce_choice_ids() {
  %p = step.buffer "p" : memref<12xf32>
  %x = step.buffer "x" : memref<8xf32>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [8]>
  %h = step.buffer "h" : memref<8xf32>
  %y = step.buffer "y" : memref<8xf32>
  %l = step.buffer "l" : memref<4xf32>
  %i = step.buffer "i" : memref<3xi32>
  %w = step.buffer "w" : memref<2xf32>
  // expected-error @+1 {{'step.all_reduce_add_rms_norm' op ids must be memref<2xi32>, got 'memref<3xi32>'}}
  step.all_reduce_add_rms_norm ins(%p, %x, %n : memref<12xf32>, memref<8xf32>, !kiln.qweight<"n.weight", "f32", [8]>) outs(%h, %y, %l : memref<8xf32>, memref<8xf32>, memref<4xf32>) choose outs(%i, %w : memref<3xi32>, memref<2xf32>) {epsilon = 1.0e-05 : f32, gating = "sigmoid", normalize = true, reduction = "sum", routed_scale = 1.0 : f32, tail = 4 : i64, top_k = 2 : i64}
  return
}

// -----

func.func @all_reduce_choice_weights() {
  %p = step.buffer "p" : memref<12xf32>
  %x = step.buffer "x" : memref<8xf32>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [8]>
  %h = step.buffer "h" : memref<8xf32>
  %y = step.buffer "y" : memref<8xf32>
  %l = step.buffer "l" : memref<4xf32>
  %i = step.buffer "i" : memref<2xi32>
  %w = step.buffer "w" : memref<1x2xf32>
  // expected-error @+1 {{'step.all_reduce_add_rms_norm' op weights must have shape [2], got 'memref<1x2xf32>'}}
  step.all_reduce_add_rms_norm ins(%p, %x, %n : memref<12xf32>, memref<8xf32>, !kiln.qweight<"n.weight", "f32", [8]>) outs(%h, %y, %l : memref<8xf32>, memref<8xf32>, memref<4xf32>) choose outs(%i, %w : memref<2xi32>, memref<1x2xf32>) {epsilon = 1.0e-05 : f32, gating = "sigmoid", normalize = true, reduction = "sum", routed_scale = 1.0 : f32, tail = 4 : i64, top_k = 2 : i64}
  return
}

// -----

func.func @all_reduce_choice_weights_type() {
  %p = step.buffer "p" : memref<12xf32>
  %x = step.buffer "x" : memref<8xf32>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [8]>
  %h = step.buffer "h" : memref<8xf32>
  %y = step.buffer "y" : memref<8xf32>
  %l = step.buffer "l" : memref<4xf32>
  %i = step.buffer "i" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf16>
  // expected-error @+1 {{'step.all_reduce_add_rms_norm' op weights must be f32, got 'memref<2xf16>'}}
  step.all_reduce_add_rms_norm ins(%p, %x, %n : memref<12xf32>, memref<8xf32>, !kiln.qweight<"n.weight", "f32", [8]>) outs(%h, %y, %l : memref<8xf32>, memref<8xf32>, memref<4xf32>) choose outs(%i, %w : memref<2xi32>, memref<2xf16>) {epsilon = 1.0e-05 : f32, gating = "sigmoid", normalize = true, reduction = "sum", routed_scale = 1.0 : f32, tail = 4 : i64, top_k = 2 : i64}
  return
}

// -----

func.func @all_reduce_add_max() {
  %p = step.buffer "p" : memref<8xf32>
  %x = step.buffer "x" : memref<8xf32>
  %h = step.buffer "h" : memref<8xf32>
  // expected-error @+1 {{'step.all_reduce_add' op only a sum can feed a residual add}}
  step.all_reduce_add ins(%p, %x : memref<8xf32>, memref<8xf32>) outs(%h : memref<8xf32>) {reduction = "max"}
  return
}

// -----

func.func @all_reduce_add_shapes() {
  %p = step.buffer "p" : memref<8xf32>
  %x = step.buffer "x" : memref<4xf32>
  %h = step.buffer "h" : memref<8xf32>
  // expected-error @+1 {{'step.all_reduce_add' op operands and output must have one type, got 'memref<8xf32>', 'memref<4xf32>' -> 'memref<8xf32>'}}
  step.all_reduce_add ins(%p, %x : memref<8xf32>, memref<4xf32>) outs(%h : memref<8xf32>) {reduction = "sum"}
  return
}

// -----

func.func @rms_norm_router_norm_size() {
  %x = step.buffer "x" : memref<8xf32>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [4]>
  %gate = step.weight : !kiln.qweight<"g.weight", "f32", [8, 4]>
  %y = step.buffer "y" : memref<8xf32>
  %ids = step.buffer "ids" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  // expected-error @+1 {{'step.rms_norm_router' op norm}}
  step.rms_norm_router ins(%x, %n, %gate : memref<8xf32>, !kiln.qweight<"n.weight", "f32", [4]>, !kiln.qweight<"g.weight", "f32", [8, 4]>) outs(%y, %ids, %w : memref<8xf32>, memref<2xi32>, memref<2xf32>) {epsilon = 1.0e-05 : f32, gating = "sigmoid", normalize = true, routed_scale = 1.0 : f32, top_k = 2 : i64}
  return
}

// -----

func.func @rms_norm_router_output() {
  %x = step.buffer "x" : memref<8xf32>
  %n = step.weight : !kiln.qweight<"n.weight", "f32", [8]>
  %gate = step.weight : !kiln.qweight<"g.weight", "f32", [8, 4]>
  %y = step.buffer "y" : memref<4xf32>
  %ids = step.buffer "ids" : memref<2xi32>
  %w = step.buffer "w" : memref<2xf32>
  // expected-error @+1 {{'step.rms_norm_router' op output must have the input's type 'memref<8xf32>'}}
  step.rms_norm_router ins(%x, %n, %gate : memref<8xf32>, !kiln.qweight<"n.weight", "f32", [8]>, !kiln.qweight<"g.weight", "f32", [8, 4]>) outs(%y, %ids, %w : memref<4xf32>, memref<2xi32>, memref<2xf32>) {epsilon = 1.0e-05 : f32, gating = "sigmoid", normalize = true, routed_scale = 1.0 : f32, top_k = 2 : i64}
  return
}
