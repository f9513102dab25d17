// RUN: kiln-opt %s --split-input-file --kiln-fuse-expert-add | FileCheck %s
// RUN: kiln-opt %s --split-input-file --kiln-fuse-expert-add | kiln-opt --split-input-file | FileCheck %s

// An add of the routed experts' sum and another buffer (GLM-5: the shared
// expert's output, computed after the experts) becomes the experts op with
// that buffer as its addend, where the add was; either operand order. Not
// fused: the sum read by another op, the experts' input written between.

// CHECK-LABEL: func.func @shared_expert
// CHECK-NOT: step.add
// CHECK: step.linear ins(%f, %blk.1.ffn_shexp
// CHECK-NEXT: step.moe_experts ins(%f, %ids, %w, %blk.1.ffn_gate_exps, %blk.1.ffn_up_exps, %blk.1.ffn_down_exps : {{.+}}) addend(%s : memref<64xf32>) outs(%y : memref<64xf32>)
// CHECK-NEXT: return
func.func @shared_expert() {
  %f = step.input "f" : memref<64xf32>
  %ids = step.input "ids" : memref<2xi32>
  %w = step.input "w" : memref<2xf32>
  %y = step.output "y" : memref<64xf32>
  %gate = step.weight : !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q8_0", [64, 32, 4]>
  %up = step.weight : !kiln.qweight<"blk.1.ffn_up_exps.weight", "q8_0", [64, 32, 4]>
  %down = step.weight : !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [32, 64, 4]>
  %sh = step.weight : !kiln.qweight<"blk.1.ffn_shexp.weight", "q8_0", [64, 64]>
  %m = step.buffer "m" : memref<64xf32>
  step.moe_experts ins(%f, %ids, %w, %gate, %up, %down : memref<64xf32>, memref<2xi32>, memref<2xf32>, !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"blk.1.ffn_up_exps.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [32, 64, 4]>) outs(%m : memref<64xf32>)
  %s = step.buffer "s" : memref<64xf32>
  step.linear ins(%f, %sh : memref<64xf32>, !kiln.qweight<"blk.1.ffn_shexp.weight", "q8_0", [64, 64]>) outs(%s : memref<64xf32>)
  step.add ins(%s, %m : memref<64xf32>, memref<64xf32>) outs(%y : memref<64xf32>)
  return
}

// -----

// CHECK-LABEL: func.func @sum_read_again
// CHECK: step.moe_experts
// CHECK-NOT: addend
// CHECK: step.add
// CHECK: step.copy ins(%m
func.func @sum_read_again() {
  %f = step.input "f" : memref<64xf32>
  %s = step.input "s" : memref<64xf32>
  %ids = step.input "ids" : memref<2xi32>
  %w = step.input "w" : memref<2xf32>
  %y = step.output "y" : memref<64xf32>
  %z = step.output "z" : memref<64xf32>
  %gu = step.weight : !kiln.qweight<"gate_up.weight", "q8_0", [64, 64, 4]>
  %down = step.weight : !kiln.qweight<"down.weight", "q8_0", [32, 64, 4]>
  %m = step.buffer "m" : memref<64xf32>
  step.moe_experts ins(%f, %ids, %w, %gu, %down : memref<64xf32>, memref<2xi32>, memref<2xf32>, !kiln.qweight<"gate_up.weight", "q8_0", [64, 64, 4]>, !kiln.qweight<"down.weight", "q8_0", [32, 64, 4]>) outs(%m : memref<64xf32>)
  step.add ins(%m, %s : memref<64xf32>, memref<64xf32>) outs(%y : memref<64xf32>)
  step.copy ins(%m : memref<64xf32>) outs(%z : memref<64xf32>)
  return
}

// -----

// CHECK-LABEL: func.func @input_rewritten
// CHECK: step.moe_experts
// CHECK-NOT: addend
// CHECK: step.add
func.func @input_rewritten() {
  %f0 = step.input "f0" : memref<64xf32>
  %g = step.input "g" : memref<64xf32>
  %s = step.input "s" : memref<64xf32>
  %ids = step.input "ids" : memref<2xi32>
  %w = step.input "w" : memref<2xf32>
  %y = step.output "y" : memref<64xf32>
  %gu = step.weight : !kiln.qweight<"gate_up.weight", "q8_0", [64, 64, 4]>
  %down = step.weight : !kiln.qweight<"down.weight", "q8_0", [32, 64, 4]>
  %f = step.buffer "f" : memref<64xf32>
  step.copy ins(%f0 : memref<64xf32>) outs(%f : memref<64xf32>)
  %m = step.buffer "m" : memref<64xf32>
  step.moe_experts ins(%f, %ids, %w, %gu, %down : memref<64xf32>, memref<2xi32>, memref<2xf32>, !kiln.qweight<"gate_up.weight", "q8_0", [64, 64, 4]>, !kiln.qweight<"down.weight", "q8_0", [32, 64, 4]>) outs(%m : memref<64xf32>)
  step.copy ins(%g : memref<64xf32>) outs(%f : memref<64xf32>)
  step.add ins(%m, %s : memref<64xf32>, memref<64xf32>) outs(%y : memref<64xf32>)
  return
}
