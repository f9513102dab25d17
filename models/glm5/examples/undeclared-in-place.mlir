// The field bug as a step would carry it: a fused add + RMSNorm kernel that
// also updates its residual input in place, called as an opaque op that
// declares nothing. `kiln-opt --allow-unregistered-dialect
// --kiln-verify-capture` rejects it, naming the kernel and the residual.
func.func @decode_step() attributes {step.plan = #step.plan<arena_bytes = 3072, peak_live_bytes = 3072, alignment = 256, buffers = 3>} {
  %w = step.weight : !kiln.qweight<"blk.0.ffn_norm.weight", "f32", [256]>
  %x = step.input "attn_out" : memref<256xf32>
  %residual = step.buffer "residual" at 0 : memref<256xf32>
  %normed = step.buffer "normed" at 1024 : memref<256xf32>
  %out = step.output "out" : memref<256xf32>
  step.copy ins(%x : memref<256xf32>) outs(%residual : memref<256xf32>)
  "vllm.fused_add_rms_norm"(%residual, %x, %w, %normed) : (memref<256xf32>, memref<256xf32>, !kiln.qweight<"blk.0.ffn_norm.weight", "f32", [256]>, memref<256xf32>) -> ()
  step.add ins(%residual, %normed : memref<256xf32>, memref<256xf32>) outs(%out : memref<256xf32>)
  return
}
