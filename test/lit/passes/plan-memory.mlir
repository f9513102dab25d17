// RUN: kiln-opt %s --split-input-file --kiln-plan-memory | FileCheck %s
// RUN: kiln-opt %s --split-input-file --kiln-plan-memory=alignment=64 | FileCheck %s --check-prefix=ALIGN64
// RUN: kiln-opt %s --split-input-file --kiln-plan-memory --kiln-verify-capture -o /dev/null
// RUN: kiln-opt %s --split-input-file --kiln-plan-memory=reuse-distance=1 | FileCheck %s --check-prefix=HOLD1
// RUN: kiln-opt %s --split-input-file --kiln-plan-memory=reuse-distance=1 --kiln-verify-capture -o /dev/null

// The static memory plan: live intervals from declared effects (through
// views), placement largest first at the lowest aligned offset free of
// every buffer whose interval meets its own, and the step.plan figures.
// Every plan here must also pass the capture verifier (third RUN line).

// A residual %x live across a chain a -> b -> c: c reuses a's bytes, which
// are dead once b is written; nothing reuses x's.
// CHECK-LABEL: func.func @chain()
// CHECK-SAME: step.plan = #step.plan<arena_bytes = 3072, peak_live_bytes = 3072, alignment = 256, buffers = 4>
// CHECK: step.buffer "x" at 0 : memref<256xf32>
// CHECK: step.buffer "a" at 1024 : memref<256xf32>
// CHECK: step.buffer "b" at 2048 : memref<256xf32>
// CHECK: step.buffer "c" at 1024 : memref<256xf32>
// With a reuse distance of one op, a's bytes are still held when c is
// first written (the op right after a's last read): c takes new ones.
// HOLD1-LABEL: func.func @chain()
// HOLD1-SAME: step.plan = #step.plan<arena_bytes = 4096, peak_live_bytes = 3072, alignment = 256, buffers = 4>
// HOLD1: step.buffer "c" at 3072 : memref<256xf32>
func.func @chain() {
  %tok = step.input "token" : memref<i32>
  %out = step.output "out" : memref<256xf32>
  %emb = step.weight : !kiln.qweight<"token_embd.weight", "f32", [256, 16]>
  %w = step.weight : !kiln.qweight<"w.weight", "f32", [256, 256]>
  %x = step.buffer "x" : memref<256xf32>
  %a = step.buffer "a" : memref<256xf32>
  %b = step.buffer "b" : memref<256xf32>
  %c = step.buffer "c" : memref<256xf32>
  step.embed ins(%emb, %tok : !kiln.qweight<"token_embd.weight", "f32", [256, 16]>, memref<i32>) outs(%x : memref<256xf32>)
  step.linear ins(%x, %w : memref<256xf32>, !kiln.qweight<"w.weight", "f32", [256, 256]>) outs(%a : memref<256xf32>)
  step.linear ins(%a, %w : memref<256xf32>, !kiln.qweight<"w.weight", "f32", [256, 256]>) outs(%b : memref<256xf32>)
  step.linear ins(%b, %w : memref<256xf32>, !kiln.qweight<"w.weight", "f32", [256, 256]>) outs(%c : memref<256xf32>)
  step.add ins(%x, %c : memref<256xf32>, memref<256xf32>) outs(%out : memref<256xf32>)
  return
}

// -----

// A view keeps its source alive: %t, written while the tail of %big is
// still to be read through a view, cannot take big's bytes; %u, written
// after the last read, can. Odd sizes show the alignment.
// CHECK-LABEL: func.func @views()
// CHECK-SAME: step.plan = #step.plan<arena_bytes = 512, peak_live_bytes = 356, alignment = 256, buffers = 3>
// CHECK: step.buffer "big" at 0 : memref<64xf32>
// CHECK: step.buffer "t" at 256 : memref<25xf32>
// CHECK: step.buffer "u" at 0 : memref<25xf32>
// ALIGN64-LABEL: func.func @views()
// ALIGN64-SAME: step.plan = #step.plan<arena_bytes = 384, peak_live_bytes = 356, alignment = 64, buffers = 3>
// ALIGN64: step.buffer "big" at 0
// ALIGN64: step.buffer "t" at 256
// ALIGN64: step.buffer "u" at 0
func.func @views() {
  %out = step.output "out" : memref<25xf32>
  %w = step.weight : !kiln.qweight<"w.weight", "f32", [64]>
  %big = step.buffer "big" : memref<64xf32>
  %t = step.buffer "t" : memref<25xf32>
  %u = step.buffer "u" : memref<25xf32>
  %tail = step.view %big[39] : memref<64xf32> to memref<25xf32>
  step.dequant ins(%w : !kiln.qweight<"w.weight", "f32", [64]>) outs(%big : memref<64xf32>)
  step.copy ins(%tail : memref<25xf32>) outs(%t : memref<25xf32>)
  step.add ins(%t, %tail : memref<25xf32>, memref<25xf32>) outs(%t : memref<25xf32>)
  step.copy ins(%t : memref<25xf32>) outs(%u : memref<25xf32>)
  step.copy ins(%u : memref<25xf32>) outs(%out : memref<25xf32>)
  return
}

// -----

// Without arena buffers there is nothing to plan and no plan attribute.
// CHECK-LABEL: func.func @no_buffers()
// CHECK-NOT: step.plan
// CHECK: step.argmax
func.func @no_buffers() {
  %in = step.input "logits" : memref<16xf32>
  %out = step.output "next" : memref<i32>
  step.argmax ins(%in : memref<16xf32>) outs(%out : memref<i32>)
  return
}
