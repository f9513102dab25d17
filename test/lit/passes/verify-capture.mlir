// RUN: kiln-opt %s --split-input-file --allow-unregistered-dialect --kiln-verify-capture --verify-diagnostics

// Every rule of the capture-safety verifier, one negative test each (and a
// few near misses that must pass). Offsets here are written by hand, as a
// planner bug or an edit would leave them: the verifier trusts none of them.

// Passes: an in-place residual add (the stream named in ins and outs), a
// buffer reusing bytes whose value is dead, a partial write through a view
// followed by a read of exactly that part.
func.func @safe() attributes {step.plan = #step.plan<arena_bytes = 4096, peak_live_bytes = 2048, alignment = 256, buffers = 3>} {
  %tok = step.input "token" : memref<i32>
  %out = step.output "out" : memref<128xf32>
  %emb = step.weight : !kiln.qweight<"token_embd.weight", "f32", [256, 16]>
  %w = step.weight : !kiln.qweight<"w.weight", "f32", [256, 256]>
  %x = step.buffer "x" at 0 : memref<256xf32>
  %a = step.buffer "a" at 1024 : memref<256xf32>
  %b = step.buffer "b" at 1024 : memref<256xf32>
  %half = step.view %b[128] : memref<256xf32> to memref<128xf32>
  step.embed ins(%emb, %tok : !kiln.qweight<"token_embd.weight", "f32", [256, 16]>, memref<i32>) outs(%x : memref<256xf32>)
  step.linear ins(%x, %w : memref<256xf32>, !kiln.qweight<"w.weight", "f32", [256, 256]>) outs(%a : memref<256xf32>)
  step.add ins(%x, %a : memref<256xf32>, memref<256xf32>) outs(%x : memref<256xf32>)
  step.copy ins(%x : memref<256xf32>) outs(%b : memref<256xf32>)
  step.add ins(%half, %half : memref<128xf32>, memref<128xf32>) outs(%out : memref<128xf32>)
  return
}

// -----

// Rule: every op in a step declares its effects. An opaque kernel does not.
func.func @unknown_effects() {
  %x = step.input "x" : memref<16xf32>
  // expected-error @+1 {{'vendor.kernel' op has unknown memory effects on %x: every op in a step must declare what it reads and writes}}
  "vendor.kernel"(%x) : (memref<16xf32>) -> ()
  return
}

// -----

func.func private @custom_rope(memref<16xf32>, memref<i32>)

// Rule: a call is opaque: its effects on the buffers it is given are unknown.
func.func @opaque_call() {
  %x = step.input "x" : memref<16xf32>
  %pos = step.input "position" : memref<i32>
  // expected-error @+1 {{'func.call' op has unknown memory effects on %x}}
  func.call @custom_rope(%x, %pos) : (memref<16xf32>, memref<i32>) -> ()
  return
}

// -----

// Rule: an op that declares effects must declare one on every buffer it is
// given.
func.func @undeclared_effect() {
  %x = step.input "x" : memref<16xf32>
  %c0 = arith.constant 0 : index
  // expected-error @+1 {{'memref.dim' op declares no memory effect on operand #0 (%x): a step op says whether it reads or writes each buffer}}
  %d = memref.dim %x, %c0 : memref<16xf32>
  return
}

// -----

// Rule: writes go only to buffers named as destinations (outs).
func.func @write_outside_outs() attributes {step.plan = #step.plan<arena_bytes = 256, peak_live_bytes = 64, alignment = 256, buffers = 1>} {
  %x = step.input "x" : memref<16xf32>
  %y = step.buffer "y" at 0 : memref<16xf32>
  // expected-error @+1 {{'memref.copy' op writes %y without naming it as a destination (outs); an in-place write names the buffer in both ins and outs}}
  memref.copy %x, %y : memref<16xf32> to memref<16xf32>
  return
}

// -----

// Rule: no allocation inside a step.
func.func @allocation() {
  %x = step.input "x" : memref<16xf32>
  %y = step.output "y" : memref<16xf32>
  step.copy ins(%x : memref<16xf32>) outs(%y : memref<16xf32>)
  // expected-error @+1 {{'memref.alloc' op allocates a buffer inside a step: every buffer must be declared and placed by the memory plan}}
  %t = memref.alloc() : memref<16xf32>
  return
}

// -----

// Rule: no host synchronisation: reading a buffer into a host value.
func.func @host_sync() {
  %pos = step.input "position" : memref<i32>
  // expected-error @+1 {{'memref.load' op reads %position into a host value: a host synchronisation inside a step (a graph replay cannot return data to the host mid-step)}}
  %p = memref.load %pos[] : memref<i32>
  return
}

// -----

// Rule: no control flow (a host decision) inside a step.
func.func @control_flow() {
  %x = step.input "x" : memref<16xf32>
  %y = step.output "y" : memref<16xf32>
  step.copy ins(%x : memref<16xf32>) outs(%y : memref<16xf32>)
  // expected-error @+1 {{'vendor.if' op has regions: a step is straight-line code, with no control flow the host would have to decide}}
  "vendor.if"() ({
    "vendor.yield"() : () -> ()
  }) : () -> ()
  return
}

// -----

// Rule: a buffer result must not alias an operand without a declaration.
// A select between two buffers is such an alias.
func.func @select_alias() {
  %x = step.input "x" : memref<16xf32>
  %y = step.input "y" : memref<16xf32>
  %c = arith.constant true
  // expected-error @+1 {{'arith.select' op result #0 may alias %x without an in-place declaration: step ops write through outs, and views are step.view}}
  %z = arith.select %c, %x, %y : memref<16xf32>
  return
}

// -----

// Upstream views are aliases the plan cannot see; step.view is the one way.
func.func @upstream_view() {
  %x = step.input "x" : memref<16xf32>
  // expected-error @+1 {{'memref.subview' op result #0 may alias %x without an in-place declaration}}
  %v = memref.subview %x[0] [8] [1] : memref<16xf32> to memref<8xf32, strided<[1]>>
  return
}

// -----

// Rule: a read of an arena buffer that nothing in the step wrote.
func.func @read_unwritten() attributes {step.plan = #step.plan<arena_bytes = 4096, peak_live_bytes = 2048, alignment = 256, buffers = 3>} {
  %out = step.output "out" : memref<256xf32>
  %a = step.buffer "a" at 0 : memref<256xf32>
  // expected-error @+1 {{'step.copy' op reads %a, which nothing in the step wrote before}}
  step.copy ins(%a : memref<256xf32>) outs(%out : memref<256xf32>)
  return
}

// -----

// An output slot holds nothing at the start of a step either.
func.func @read_output_slot() {
  %logits = step.output "logits" : memref<64xf32>
  %next = step.output "next" : memref<i32>
  // expected-error @+1 {{'step.argmax' op reads %logits, which nothing in the step wrote before}}
  step.argmax ins(%logits : memref<64xf32>) outs(%next : memref<i32>)
  return
}

// -----

// Half written through a view is not all written.
func.func @read_partly_written() attributes {step.plan = #step.plan<arena_bytes = 4096, peak_live_bytes = 2048, alignment = 256, buffers = 3>} {
  %in = step.input "in" : memref<128xf32>
  %out = step.output "out" : memref<256xf32>
  %a = step.buffer "a" at 0 : memref<256xf32>
  %lo = step.view %a[0] : memref<256xf32> to memref<128xf32>
  step.copy ins(%in : memref<128xf32>) outs(%lo : memref<128xf32>)
  // expected-error @+1 {{'step.copy' op reads %a, which nothing in the step wrote before}}
  step.copy ins(%a : memref<256xf32>) outs(%out : memref<256xf32>)
  return
}

// -----

// Input slots (and weights) are read-only.
func.func @write_input() {
  %pos = step.input "position" : memref<i32>
  %q = step.input "q" : memref<16xf32>
  // expected-error @+1 {{'step.rope' op writes %q, a read-only input slot}}
  step.rope ins(%q, %pos : memref<16xf32>, memref<i32>) outs(%q : memref<16xf32>) {dims = 16 : i64, offset = 0 : i64, style = "interleaved", theta = 1.0e+06 : f32}
  return
}

// -----

// Rule: a write must not land on bytes another buffer still needs. Here
// the plan was edited by hand so %a shares %x's bytes while %x is still to
// be read by the add.
func.func @overwrite_live() attributes {step.plan = #step.plan<arena_bytes = 4096, peak_live_bytes = 2048, alignment = 256, buffers = 3>} {
  %tok = step.input "token" : memref<i32>
  %out = step.output "out" : memref<256xf32>
  %emb = step.weight : !kiln.qweight<"token_embd.weight", "f32", [256, 16]>
  %w = step.weight : !kiln.qweight<"w.weight", "f32", [256, 256]>
  %x = step.buffer "x" at 0 : memref<256xf32>
  %a = step.buffer "a" at 512 : memref<256xf32>
  step.embed ins(%emb, %tok : !kiln.qweight<"token_embd.weight", "f32", [256, 16]>, memref<i32>) outs(%x : memref<256xf32>)
  // expected-error @+1 {{'step.linear' op writes %a at arena bytes [512, 1536), over %x at [0, 1024), which is still to be read}}
  step.linear ins(%x, %w : memref<256xf32>, !kiln.qweight<"w.weight", "f32", [256, 256]>) outs(%a : memref<256xf32>)
  step.add ins(%x, %a : memref<256xf32>, memref<256xf32>) outs(%out : memref<256xf32>)
  return
}

// -----

// Two outputs of one op on the same bytes.
func.func @overlapping_outputs() attributes {step.plan = #step.plan<arena_bytes = 4096, peak_live_bytes = 2048, alignment = 256, buffers = 3>} {
  %pos = step.input "position" : memref<i32>
  %q = step.input "q" : memref<4x32xf32>
  %hw = step.input "hw" : memref<4xf32>
  %ic = step.state "blk.0.index_cache" : memref<64x32xf16>
  %sel = step.buffer "sel" at 0 : memref<32xi32>
  %n = step.buffer "n" at 0 : memref<i32>
  // expected-error @+1 {{'step.dsa_indexer' op writes %sel at arena bytes [0, 128), over %n at [0, 4), which the same op also writes}}
  step.dsa_indexer ins(%q, %hw, %ic, %pos : memref<4x32xf32>, memref<4xf32>, memref<64x32xf16>, memref<i32>) outs(%sel, %n : memref<32xi32>, memref<i32>) {scale = 1.0 : f32, top_k = 32 : i64}
  return
}

// -----

// Placement: every arena buffer needs an offset from the plan.
func.func @unplanned() attributes {step.plan = #step.plan<arena_bytes = 4096, peak_live_bytes = 2048, alignment = 256, buffers = 3>} {
  // expected-error @+1 {{'step.buffer' op buffer %a has no arena offset: run --kiln-plan-memory first}}
  %a = step.buffer "a" : memref<256xf32>
  return
}

// -----

func.func @no_plan() {
  // expected-error @+1 {{'step.buffer' op buffer %a has an offset but @no_plan has no step.plan}}
  %a = step.buffer "a" at 0 : memref<256xf32>
  return
}

// -----

func.func @misaligned() attributes {step.plan = #step.plan<arena_bytes = 4096, peak_live_bytes = 2048, alignment = 256, buffers = 3>} {
  // expected-error @+1 {{'step.buffer' op buffer %a at 128 is not aligned to the plan's 256 bytes}}
  %a = step.buffer "a" at 128 : memref<256xf32>
  return
}

// -----

func.func @outside_arena() attributes {step.plan = #step.plan<arena_bytes = 4096, peak_live_bytes = 2048, alignment = 256, buffers = 3>} {
  // expected-error @+1 {{'step.buffer' op buffer %a occupies [3584, 4608) but the arena has 4096 bytes}}
  %a = step.buffer "a" at 3584 : memref<256xf32>
  return
}

// -----

// A step hands results over in output slots, not by returning buffers.
func.func @returns_buffer() -> memref<16xf32> {
  %x = step.input "x" : memref<16xf32>
  %pos = step.input "position" : memref<i32>
  %y = step.output "y" : memref<16xf32>
  step.rope ins(%x, %pos : memref<16xf32>, memref<i32>) outs(%y : memref<16xf32>) {dims = 16 : i64, offset = 0 : i64, style = "interleaved", theta = 1.0e+06 : f32}
  // expected-error @+1 {{'func.return' op a step returns nothing: its results are written to step.output slots}}
  return %y : memref<16xf32>
}

// -----

// Every buffer comes from a declaration, not from a function argument.
func.func @undeclared_buffer(%x: memref<16xf32>) {
  %y = step.output "y" : memref<16xf32>
  // expected-error @+1 {{'step.copy' op touches block argument #0, which is not rooted in a step declaration}}
  step.copy ins(%x : memref<16xf32>) outs(%y : memref<16xf32>)
  return
}
