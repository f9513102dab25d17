// RUN: kiln-opt %s --split-input-file --kiln-fuse-swiglu-linear | FileCheck %s
// RUN: kiln-opt %s --split-input-file --kiln-fuse-swiglu-linear | kiln-opt --split-input-file | FileCheck %s

// A swiglu whose product only the next compute op, a linear with a 2-D
// weight, reads (as its input) becomes one step.swiglu_linear, and the
// product's buffer goes. Not fused: an op in between, a second reader, a
// product into a slot, a stacked weight.

// CHECK-LABEL: func.func @shared_down
// CHECK-NOT: step.swiglu ins
// CHECK-NOT: step.buffer "h"
// CHECK: step.swiglu_linear ins(%g, %u, %blk.3.ffn_down_shexp : memref<128xf32>, memref<128xf32>, !kiln.qweight<"blk.3.ffn_down_shexp.weight", "q8_0", [128, 256]>) outs(%y : memref<256xf32>)
// CHECK-NOT: step.linear
func.func @shared_down() {
  %g = step.input "g" : memref<128xf32>
  %u = step.input "u" : memref<128xf32>
  %y = step.output "y" : memref<256xf32>
  %down = step.weight : !kiln.qweight<"blk.3.ffn_down_shexp.weight", "q8_0", [128, 256]>
  %h = step.buffer "h" : memref<128xf32>
  step.swiglu ins(%g, %u : memref<128xf32>, memref<128xf32>) outs(%h : memref<128xf32>)
  step.linear ins(%h, %down : memref<128xf32>, !kiln.qweight<"blk.3.ffn_down_shexp.weight", "q8_0", [128, 256]>) outs(%y : memref<256xf32>)
  return
}

// -----

// CHECK-LABEL: func.func @not_adjacent
// CHECK: step.swiglu ins
// CHECK: step.copy
// CHECK: step.linear ins(%h
// CHECK-NOT: step.swiglu_linear
func.func @not_adjacent() {
  %g = step.input "g" : memref<128xf32>
  %u = step.input "u" : memref<128xf32>
  %y = step.output "y" : memref<256xf32>
  %z = step.output "z" : memref<128xf32>
  %down = step.weight : !kiln.qweight<"down.weight", "q8_0", [128, 256]>
  %h = step.buffer "h" : memref<128xf32>
  step.swiglu ins(%g, %u : memref<128xf32>, memref<128xf32>) outs(%h : memref<128xf32>)
  step.copy ins(%g : memref<128xf32>) outs(%z : memref<128xf32>)
  step.linear ins(%h, %down : memref<128xf32>, !kiln.qweight<"down.weight", "q8_0", [128, 256]>) outs(%y : memref<256xf32>)
  return
}

// -----

// CHECK-LABEL: func.func @second_reader
// CHECK: step.swiglu ins
// CHECK: step.linear ins(%h
// CHECK: step.copy ins(%h
// CHECK-NOT: step.swiglu_linear
func.func @second_reader() {
  %g = step.input "g" : memref<128xf32>
  %u = step.input "u" : memref<128xf32>
  %y = step.output "y" : memref<256xf32>
  %z = step.output "z" : memref<128xf32>
  %down = step.weight : !kiln.qweight<"down.weight", "q8_0", [128, 256]>
  %h = step.buffer "h" : memref<128xf32>
  step.swiglu ins(%g, %u : memref<128xf32>, memref<128xf32>) outs(%h : memref<128xf32>)
  step.linear ins(%h, %down : memref<128xf32>, !kiln.qweight<"down.weight", "q8_0", [128, 256]>) outs(%y : memref<256xf32>)
  step.copy ins(%h : memref<128xf32>) outs(%z : memref<128xf32>)
  return
}

// -----

// The product is a step output: the caller reads it, so it stays.
// CHECK-LABEL: func.func @into_slot
// CHECK: step.swiglu ins
// CHECK: step.linear ins(%h
// CHECK-NOT: step.swiglu_linear
func.func @into_slot() {
  %g = step.input "g" : memref<128xf32>
  %u = step.input "u" : memref<128xf32>
  %y = step.output "y" : memref<256xf32>
  %h = step.output "h" : memref<128xf32>
  %down = step.weight : !kiln.qweight<"down.weight", "q8_0", [128, 256]>
  step.swiglu ins(%g, %u : memref<128xf32>, memref<128xf32>) outs(%h : memref<128xf32>)
  step.linear ins(%h, %down : memref<128xf32>, !kiln.qweight<"down.weight", "q8_0", [128, 256]>) outs(%y : memref<256xf32>)
  return
}

// -----

// A stack of matrices, one a row of the product: not a vector's mat-vec.
// CHECK-LABEL: func.func @stacked
// CHECK: step.swiglu ins
// CHECK: step.linear ins(%h
// CHECK-NOT: step.swiglu_linear
func.func @stacked() {
  %g = step.input "g" : memref<2x64xf32>
  %u = step.input "u" : memref<2x64xf32>
  %y = step.output "y" : memref<2x32xf32>
  %w = step.weight : !kiln.qweight<"w.weight", "q8_0", [64, 32, 2]>
  %h = step.buffer "h" : memref<2x64xf32>
  step.swiglu ins(%g, %u : memref<2x64xf32>, memref<2x64xf32>) outs(%h : memref<2x64xf32>)
  step.linear ins(%h, %w : memref<2x64xf32>, !kiln.qweight<"w.weight", "q8_0", [64, 32, 2]>) outs(%y : memref<2x32xf32>)
  return
}
