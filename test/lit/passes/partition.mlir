// RUN: kiln-opt %s --kiln-partition=tp=2 | FileCheck %s

// The partitioner splits each weight as its kiln.weight says (tp_split,
// tp_groups) and knows no tensor names: these are not GLM-5's. A column-
// parallel matrix (tp_split 1) keeps its output split, the row-parallel one
// after it (tp_split 0) takes that split input and ends in a partial sum,
// made whole by an all_reduce before the return; the unmarked matrix stays
// whole on every rank. The split moves into each type and the attributes
// are dropped.

// CHECK-LABEL: func.func @mlp
// CHECK-SAME: kiln.tp = 2 : i64
func.func @mlp(%x: tensor<256xf32>) -> tensor<256xf32> {
  // CHECK: kiln.weight : !kiln.qweight<"up.weight", "q8_0", [256, 256], shard = 1 of 2>
  %up = kiln.weight {tp_split = 1 : i64} : !kiln.qweight<"up.weight", "q8_0", [256, 512]>
  // CHECK: kiln.weight : !kiln.qweight<"down.weight", "q8_0", [256, 256], shard = 0 of 2>
  %down = kiln.weight {tp_split = 0 : i64} : !kiln.qweight<"down.weight", "q8_0", [512, 256]>
  // CHECK: kiln.weight : !kiln.qweight<"mix.weight", "q8_0", [256, 256]>
  %mix = kiln.weight : !kiln.qweight<"mix.weight", "q8_0", [256, 256]>
  // CHECK: kiln.linear {{.*}} -> tensor<256xf32>
  %h = kiln.linear %x, %up : tensor<256xf32>, !kiln.qweight<"up.weight", "q8_0", [256, 512]> -> tensor<512xf32>
  // CHECK: %[[P:.+]] = kiln.linear {{.*}}"down.weight"{{.*}} -> tensor<256xf32>
  %y = kiln.linear %h, %down : tensor<512xf32>, !kiln.qweight<"down.weight", "q8_0", [512, 256]> -> tensor<256xf32>
  // CHECK: %[[W:.+]] = kiln.all_reduce %[[P]]
  // CHECK: kiln.linear %[[W]], {{.*}}"mix.weight"
  %z = kiln.linear %y, %mix : tensor<256xf32>, !kiln.qweight<"mix.weight", "q8_0", [256, 256]> -> tensor<256xf32>
  // CHECK-NOT: tp_split
  return %z : tensor<256xf32>
}
