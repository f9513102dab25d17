// RUN: kiln-opt %s | FileCheck %s
// RUN: kiln-opt %s | kiln-opt | FileCheck %s
// RUN: kiln-opt %s --mlir-print-op-generic | kiln-opt | FileCheck %s

// Round trip of every kiln op through the custom assembly format, and through
// the generic form (which checks the parser against the printer's attributes).

// CHECK-LABEL: func.func @residual_norm
// CHECK-SAME: (%[[X:.+]]: tensor<6144xf32>, %[[D:.+]]: tensor<6144xf32>, %[[W:.+]]: tensor<6144xf32>)
func.func @residual_norm(%x: tensor<6144xf32>, %delta: tensor<6144xf32>,
                         %w: tensor<6144xf32>) -> tensor<6144xf32> {
  // CHECK: %[[SUM:.+]] = kiln.add %[[X]], %[[D]] : tensor<6144xf32>
  %sum = kiln.add %x, %delta : tensor<6144xf32>
  // CHECK: kiln.rms_norm %[[SUM]], %[[W]] {epsilon = 9.99999974E-6 : f32} : tensor<6144xf32>, tensor<6144xf32>
  %n = kiln.rms_norm %sum, %w {epsilon = 1.0e-05 : f32} : tensor<6144xf32>, tensor<6144xf32>
  return %n : tensor<6144xf32>
}

// CHECK-LABEL: func.func @norm_batched_bf16
// CHECK: kiln.rms_norm %{{.+}}, %{{.+}} {epsilon = 9.99999997E-7 : f32} : tensor<4x128xbf16>, tensor<128xbf16>
func.func @norm_batched_bf16(%x: tensor<4x128xbf16>, %w: tensor<128xbf16>) -> tensor<4x128xbf16> {
  %n = kiln.rms_norm %x, %w {epsilon = 1.0e-06 : f32} : tensor<4x128xbf16>, tensor<128xbf16>
  return %n : tensor<4x128xbf16>
}

// CHECK-LABEL: func.func @gate
// CHECK-SAME: (%[[G:.+]]: tensor<12288xf16>, %[[U:.+]]: tensor<12288xf16>)
// CHECK: kiln.swiglu %[[G]], %[[U]] : tensor<12288xf16>
func.func @gate(%g: tensor<12288xf16>, %u: tensor<12288xf16>) -> tensor<12288xf16> {
  %h = kiln.swiglu %g, %u : tensor<12288xf16>
  return %h : tensor<12288xf16>
}

// CHECK-LABEL: func.func @greedy
// CHECK: %[[T:.+]] = kiln.argmax %{{.+}} : tensor<154880xf32>
// CHECK: return %[[T]] : tensor<i32>
func.func @greedy(%logits: tensor<154880xf32>) -> tensor<i32> {
  %t = kiln.argmax %logits : tensor<154880xf32>
  return %t : tensor<i32>
}
