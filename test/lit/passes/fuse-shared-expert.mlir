// RUN: kiln-opt %s --split-input-file --kiln-fuse-shared-expert | FileCheck %s
// RUN: kiln-opt %s --split-input-file --kiln-fuse-shared-expert | kiln-opt --split-input-file | FileCheck %s

// A moe_experts whose addend is the shared expert (a swiglu_linear of the two
// halves of a fused_linear of gate and up over the experts' own input, or of
// two linears of it) takes that expert's three weights as `shared(...)` where
// it was; the fused_linear, its views, the swiglu_linear and their buffers
// go. Not fused: the shared output or the gate/up buffer read by another op,
// the input written between the projections and the experts. Not checked
// here: the planner or capture verifier afterwards (glm5-step.test).

// CHECK-LABEL: func.func @fused_halves
// CHECK-NOT: step.fused_linear
// CHECK-NOT: step.view
// CHECK-NOT: step.swiglu_linear
// CHECK-NOT: step.buffer "gu"
// CHECK-NOT: step.buffer "s"
// CHECK: step.moe_experts ins(%f, %ids, %w, %blk.1.ffn_gate_exps, %blk.1.ffn_up_exps, %blk.1.ffn_down_exps : {{.+}}) shared(%blk.1.ffn_gate_shexp, %blk.1.ffn_up_shexp, %blk.1.ffn_down_shexp : !kiln.qweight<"blk.1.ffn_gate_shexp.weight", "q8_0", [64, 32]>, !kiln.qweight<"blk.1.ffn_up_shexp.weight", "q8_0", [64, 32]>, !kiln.qweight<"blk.1.ffn_down_shexp.weight", "q8_0", [32, 64]>) outs(%y : memref<64xf32>)
// CHECK-NOT: addend
// CHECK-NEXT: return
func.func @fused_halves() {
  %f = step.input "f" : memref<64xf32>
  %ids = step.input "ids" : memref<2xi32>
  %w = step.input "w" : memref<2xf32>
  %y = step.output "y" : memref<64xf32>
  %gate = step.weight : !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q8_0", [64, 32, 4]>
  %up = step.weight : !kiln.qweight<"blk.1.ffn_up_exps.weight", "q8_0", [64, 32, 4]>
  %down = step.weight : !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [32, 64, 4]>
  %sg = step.weight : !kiln.qweight<"blk.1.ffn_gate_shexp.weight", "q8_0", [64, 32]>
  %su = step.weight : !kiln.qweight<"blk.1.ffn_up_shexp.weight", "q8_0", [64, 32]>
  %gu = step.buffer "gu" : memref<64xf32>
  step.fused_linear ins(%f, %sg, %su : memref<64xf32>, !kiln.qweight<"blk.1.ffn_gate_shexp.weight", "q8_0", [64, 32]>, !kiln.qweight<"blk.1.ffn_up_shexp.weight", "q8_0", [64, 32]>) outs(%gu : memref<64xf32>) {segments = [#kiln.segment<name = "blk.1.ffn_gate_shexp", offset = 0, rows = 32, format = "q8_0">, #kiln.segment<name = "blk.1.ffn_up_shexp", offset = 32, rows = 32, format = "q8_0">]}
  %g = step.view %gu[0] : memref<64xf32> to memref<32xf32>
  %u = step.view %gu[32] : memref<64xf32> to memref<32xf32>
  %sd = step.weight : !kiln.qweight<"blk.1.ffn_down_shexp.weight", "q8_0", [32, 64]>
  %s = step.buffer "s" : memref<64xf32>
  step.swiglu_linear ins(%g, %u, %sd : memref<32xf32>, memref<32xf32>, !kiln.qweight<"blk.1.ffn_down_shexp.weight", "q8_0", [32, 64]>) outs(%s : memref<64xf32>)
  step.moe_experts ins(%f, %ids, %w, %gate, %up, %down : memref<64xf32>, memref<2xi32>, memref<2xf32>, !kiln.qweight<"blk.1.ffn_gate_exps.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"blk.1.ffn_up_exps.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"blk.1.ffn_down_exps.weight", "q8_0", [32, 64, 4]>) addend(%s : memref<64xf32>) outs(%y : memref<64xf32>)
  return
}

// -----

// Gate and up as two linears (no fuse-projections), fused gate_up experts.

// CHECK-LABEL: func.func @two_linears
// CHECK-NOT: step.linear
// CHECK-NOT: step.swiglu_linear
// CHECK: step.moe_experts ins(%f, %ids, %w, %gate_up, %down : {{.+}}) shared(%sg, %su, %sd : {{.+}}) outs(%y : memref<64xf32>)
// CHECK-NEXT: return
func.func @two_linears() {
  %f = step.input "f" : memref<64xf32>
  %ids = step.input "ids" : memref<2xi32>
  %w = step.input "w" : memref<2xf32>
  %y = step.output "y" : memref<64xf32>
  %gu = step.weight : !kiln.qweight<"gate_up.weight", "q8_0", [64, 64, 4]>
  %down = step.weight : !kiln.qweight<"down.weight", "q8_0", [32, 64, 4]>
  %sg = step.weight : !kiln.qweight<"sg.weight", "q8_0", [64, 32]>
  %su = step.weight : !kiln.qweight<"su.weight", "q8_0", [64, 32]>
  %sd = step.weight : !kiln.qweight<"sd.weight", "q8_0", [32, 64]>
  %g = step.buffer "g" : memref<32xf32>
  step.linear ins(%f, %sg : memref<64xf32>, !kiln.qweight<"sg.weight", "q8_0", [64, 32]>) outs(%g : memref<32xf32>)
  %u = step.buffer "u" : memref<32xf32>
  step.linear ins(%f, %su : memref<64xf32>, !kiln.qweight<"su.weight", "q8_0", [64, 32]>) outs(%u : memref<32xf32>)
  %s = step.buffer "s" : memref<64xf32>
  step.swiglu_linear ins(%g, %u, %sd : memref<32xf32>, memref<32xf32>, !kiln.qweight<"sd.weight", "q8_0", [32, 64]>) outs(%s : memref<64xf32>)
  step.moe_experts ins(%f, %ids, %w, %gu, %down : memref<64xf32>, memref<2xi32>, memref<2xf32>, !kiln.qweight<"gate_up.weight", "q8_0", [64, 64, 4]>, !kiln.qweight<"down.weight", "q8_0", [32, 64, 4]>) addend(%s : memref<64xf32>) outs(%y : memref<64xf32>)
  return
}

// -----

// CHECK-LABEL: func.func @shared_read_again
// CHECK: step.fused_linear
// CHECK: step.swiglu_linear
// CHECK: step.moe_experts {{.+}} addend(%s
// CHECK-NOT: shared(
// CHECK: step.copy ins(%s
func.func @shared_read_again() {
  %f = step.input "f" : memref<64xf32>
  %ids = step.input "ids" : memref<2xi32>
  %w = step.input "w" : memref<2xf32>
  %y = step.output "y" : memref<64xf32>
  %z = step.output "z" : memref<64xf32>
  %gate = step.weight : !kiln.qweight<"gate.weight", "q8_0", [64, 32, 4]>
  %up = step.weight : !kiln.qweight<"up.weight", "q8_0", [64, 32, 4]>
  %down = step.weight : !kiln.qweight<"down.weight", "q8_0", [32, 64, 4]>
  %sg = step.weight : !kiln.qweight<"sg.weight", "q8_0", [64, 32]>
  %su = step.weight : !kiln.qweight<"su.weight", "q8_0", [64, 32]>
  %gu = step.buffer "gu" : memref<64xf32>
  step.fused_linear ins(%f, %sg, %su : memref<64xf32>, !kiln.qweight<"sg.weight", "q8_0", [64, 32]>, !kiln.qweight<"su.weight", "q8_0", [64, 32]>) outs(%gu : memref<64xf32>) {segments = [#kiln.segment<name = "sg", offset = 0, rows = 32, format = "q8_0">, #kiln.segment<name = "su", offset = 32, rows = 32, format = "q8_0">]}
  %g = step.view %gu[0] : memref<64xf32> to memref<32xf32>
  %u = step.view %gu[32] : memref<64xf32> to memref<32xf32>
  %sd = step.weight : !kiln.qweight<"sd.weight", "q8_0", [32, 64]>
  %s = step.buffer "s" : memref<64xf32>
  step.swiglu_linear ins(%g, %u, %sd : memref<32xf32>, memref<32xf32>, !kiln.qweight<"sd.weight", "q8_0", [32, 64]>) outs(%s : memref<64xf32>)
  step.moe_experts ins(%f, %ids, %w, %gate, %up, %down : memref<64xf32>, memref<2xi32>, memref<2xf32>, !kiln.qweight<"gate.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"up.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"down.weight", "q8_0", [32, 64, 4]>) addend(%s : memref<64xf32>) outs(%y : memref<64xf32>)
  step.copy ins(%s : memref<64xf32>) outs(%z : memref<64xf32>)
  return
}

// -----

// CHECK-LABEL: func.func @gate_up_read_again
// CHECK: step.fused_linear
// CHECK: step.swiglu_linear
// CHECK: step.moe_experts {{.+}} addend(%s
// CHECK-NOT: shared(
// CHECK: step.copy ins(%gu
func.func @gate_up_read_again() {
  %f = step.input "f" : memref<64xf32>
  %ids = step.input "ids" : memref<2xi32>
  %w = step.input "w" : memref<2xf32>
  %y = step.output "y" : memref<64xf32>
  %z = step.output "z" : memref<64xf32>
  %gate = step.weight : !kiln.qweight<"gate.weight", "q8_0", [64, 32, 4]>
  %up = step.weight : !kiln.qweight<"up.weight", "q8_0", [64, 32, 4]>
  %down = step.weight : !kiln.qweight<"down.weight", "q8_0", [32, 64, 4]>
  %sg = step.weight : !kiln.qweight<"sg.weight", "q8_0", [64, 32]>
  %su = step.weight : !kiln.qweight<"su.weight", "q8_0", [64, 32]>
  %gu = step.buffer "gu" : memref<64xf32>
  step.fused_linear ins(%f, %sg, %su : memref<64xf32>, !kiln.qweight<"sg.weight", "q8_0", [64, 32]>, !kiln.qweight<"su.weight", "q8_0", [64, 32]>) outs(%gu : memref<64xf32>) {segments = [#kiln.segment<name = "sg", offset = 0, rows = 32, format = "q8_0">, #kiln.segment<name = "su", offset = 32, rows = 32, format = "q8_0">]}
  %g = step.view %gu[0] : memref<64xf32> to memref<32xf32>
  %u = step.view %gu[32] : memref<64xf32> to memref<32xf32>
  %sd = step.weight : !kiln.qweight<"sd.weight", "q8_0", [32, 64]>
  %s = step.buffer "s" : memref<64xf32>
  step.swiglu_linear ins(%g, %u, %sd : memref<32xf32>, memref<32xf32>, !kiln.qweight<"sd.weight", "q8_0", [32, 64]>) outs(%s : memref<64xf32>)
  step.moe_experts ins(%f, %ids, %w, %gate, %up, %down : memref<64xf32>, memref<2xi32>, memref<2xf32>, !kiln.qweight<"gate.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"up.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"down.weight", "q8_0", [32, 64, 4]>) addend(%s : memref<64xf32>) outs(%y : memref<64xf32>)
  step.copy ins(%gu : memref<64xf32>) outs(%z : memref<64xf32>)
  return
}

// -----

// CHECK-LABEL: func.func @input_rewritten
// CHECK: step.fused_linear
// CHECK: step.swiglu_linear
// CHECK: step.moe_experts {{.+}} addend(%s
// CHECK-NOT: shared(
func.func @input_rewritten() {
  %f0 = step.input "f0" : memref<64xf32>
  %h = step.input "h" : memref<64xf32>
  %ids = step.input "ids" : memref<2xi32>
  %w = step.input "w" : memref<2xf32>
  %y = step.output "y" : memref<64xf32>
  %gate = step.weight : !kiln.qweight<"gate.weight", "q8_0", [64, 32, 4]>
  %up = step.weight : !kiln.qweight<"up.weight", "q8_0", [64, 32, 4]>
  %down = step.weight : !kiln.qweight<"down.weight", "q8_0", [32, 64, 4]>
  %sg = step.weight : !kiln.qweight<"sg.weight", "q8_0", [64, 32]>
  %su = step.weight : !kiln.qweight<"su.weight", "q8_0", [64, 32]>
  %f = step.buffer "f" : memref<64xf32>
  step.copy ins(%f0 : memref<64xf32>) outs(%f : memref<64xf32>)
  %gu = step.buffer "gu" : memref<64xf32>
  step.fused_linear ins(%f, %sg, %su : memref<64xf32>, !kiln.qweight<"sg.weight", "q8_0", [64, 32]>, !kiln.qweight<"su.weight", "q8_0", [64, 32]>) outs(%gu : memref<64xf32>) {segments = [#kiln.segment<name = "sg", offset = 0, rows = 32, format = "q8_0">, #kiln.segment<name = "su", offset = 32, rows = 32, format = "q8_0">]}
  %g = step.view %gu[0] : memref<64xf32> to memref<32xf32>
  %u = step.view %gu[32] : memref<64xf32> to memref<32xf32>
  %sd = step.weight : !kiln.qweight<"sd.weight", "q8_0", [32, 64]>
  %s = step.buffer "s" : memref<64xf32>
  step.swiglu_linear ins(%g, %u, %sd : memref<32xf32>, memref<32xf32>, !kiln.qweight<"sd.weight", "q8_0", [32, 64]>) outs(%s : memref<64xf32>)
  step.copy ins(%h : memref<64xf32>) outs(%f : memref<64xf32>)
  step.moe_experts ins(%f, %ids, %w, %gate, %up, %down : memref<64xf32>, memref<2xi32>, memref<2xf32>, !kiln.qweight<"gate.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"up.weight", "q8_0", [64, 32, 4]>, !kiln.qweight<"down.weight", "q8_0", [32, 64, 4]>) addend(%s : memref<64xf32>) outs(%y : memref<64xf32>)
  return
}
