// RUN: kiln-opt %s --split-input-file --allow-unregistered-dialect --kiln-verify-capture --verify-diagnostics

// The bug from the field, as the IR of a step would have carried it: GLM-5
// on vLLM gave correct text in eager mode and garbage under CUDA-graph
// replay because a fused add + RMSNorm kernel also updated its residual
// input in place, while the graph (and the buffer reuse around it) was
// built from a declaration that said it only read the residual.
//
// Each case below is that kernel as a step could contain it. The verifier
// must reject every one before a backend sees it, naming the kernel and the
// residual buffer.

// The kernel as an opaque op: nothing says what it does to its operands.
func.func @opaque_fused_add_rms_norm() attributes {step.plan = #step.plan<arena_bytes = 3072, peak_live_bytes = 3072, alignment = 256, buffers = 3>} {
  %w = step.weight : !kiln.qweight<"blk.0.ffn_norm.weight", "f32", [256]>
  %x = step.input "attn_out" : memref<256xf32>
  %residual = step.buffer "residual" at 0 : memref<256xf32>
  %normed = step.buffer "normed" at 1024 : memref<256xf32>
  %out = step.output "out" : memref<256xf32>
  step.copy ins(%x : memref<256xf32>) outs(%residual : memref<256xf32>)
  // expected-error @+1 {{'vllm.fused_add_rms_norm' op has unknown memory effects on %residual: every op in a step must declare what it reads and writes}}
  "vllm.fused_add_rms_norm"(%residual, %x, %w, %normed) : (memref<256xf32>, memref<256xf32>, !kiln.qweight<"blk.0.ffn_norm.weight", "f32", [256]>, memref<256xf32>) -> ()
  step.add ins(%residual, %normed : memref<256xf32>, memref<256xf32>) outs(%out : memref<256xf32>)
  return
}

// -----

// The kernel as a call to a registered custom op (the vLLM shape of it).
func.func private @fused_add_rms_norm(memref<256xf32>, memref<256xf32>, memref<256xf32>)

func.func @custom_op_call() attributes {step.plan = #step.plan<arena_bytes = 2048, peak_live_bytes = 2048, alignment = 256, buffers = 2>} {
  %x = step.input "attn_out" : memref<256xf32>
  %residual = step.buffer "residual" at 0 : memref<256xf32>
  %normed = step.buffer "normed" at 1024 : memref<256xf32>
  %out = step.output "out" : memref<256xf32>
  step.copy ins(%x : memref<256xf32>) outs(%residual : memref<256xf32>)
  // expected-error @+1 {{'func.call' op has unknown memory effects on %residual}}
  func.call @fused_add_rms_norm(%residual, %x, %normed) : (memref<256xf32>, memref<256xf32>, memref<256xf32>) -> ()
  step.add ins(%residual, %normed : memref<256xf32>, memref<256xf32>) outs(%out : memref<256xf32>)
  return
}

// -----

// The in-place update spelled out, but not as a destination: the write to
// the residual is invisible to anything that reads only the outs lists.
func.func @in_place_not_in_outs() attributes {step.plan = #step.plan<arena_bytes = 2048, peak_live_bytes = 2048, alignment = 256, buffers = 2>} {
  %x = step.input "attn_out" : memref<256xf32>
  %residual = step.buffer "residual" at 0 : memref<256xf32>
  %normed = step.buffer "normed" at 1024 : memref<256xf32>
  %out = step.output "out" : memref<256xf32>
  step.copy ins(%x : memref<256xf32>) outs(%residual : memref<256xf32>)
  step.copy ins(%x : memref<256xf32>) outs(%normed : memref<256xf32>)
  // expected-error @+1 {{'memref.copy' op writes %residual without naming it as a destination (outs); an in-place write names the buffer in both ins and outs}}
  memref.copy %normed, %residual : memref<256xf32> to memref<256xf32>
  step.add ins(%residual, %normed : memref<256xf32>, memref<256xf32>) outs(%out : memref<256xf32>)
  return
}

// -----

// The kernel "returns" the updated residual as a new value that is really
// the same memory: the result aliases its input without saying so.
func.func @result_aliases_residual() attributes {step.plan = #step.plan<arena_bytes = 1024, peak_live_bytes = 1024, alignment = 256, buffers = 1>} {
  %x = step.input "attn_out" : memref<256xf32>
  %residual = step.buffer "residual" at 0 : memref<256xf32>
  step.copy ins(%x : memref<256xf32>) outs(%residual : memref<256xf32>)
  // expected-error @+1 {{'memref.cast' op result #0 may alias %residual without an in-place declaration}}
  %updated = memref.cast %residual : memref<256xf32> to memref<?xf32>
  return
}

// -----

// The same update in Kiln's form passes: an in-place add names the
// residual in ins and outs, so the plan keeps it alive and the graph
// orders every later read after the write.
func.func @declared_in_place() attributes {step.plan = #step.plan<arena_bytes = 2048, peak_live_bytes = 2048, alignment = 256, buffers = 2>} {
  %w = step.input "ffn_norm" : memref<256xf32>
  %x = step.input "attn_out" : memref<256xf32>
  %residual = step.buffer "residual" at 0 : memref<256xf32>
  %normed = step.buffer "normed" at 1024 : memref<256xf32>
  %out = step.output "out" : memref<256xf32>
  step.copy ins(%x : memref<256xf32>) outs(%residual : memref<256xf32>)
  step.add ins(%residual, %x : memref<256xf32>, memref<256xf32>) outs(%residual : memref<256xf32>)
  step.rms_norm ins(%residual, %w : memref<256xf32>, memref<256xf32>) outs(%normed : memref<256xf32>) {epsilon = 1.0e-05 : f32}
  step.add ins(%residual, %normed : memref<256xf32>, memref<256xf32>) outs(%out : memref<256xf32>)
  return
}
