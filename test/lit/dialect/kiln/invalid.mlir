// RUN: kiln-opt %s --split-input-file --verify-diagnostics

// Every verifier message of the kiln ops, pinned. Type mismatches that the
// traits catch (SameOperandsAndResultType, AllTypesMatch) are pinned too, so a
// change of trait that loosens a check shows up here.

func.func @norm_weight_width(%x: tensor<6144xf32>, %w: tensor<2048xf32>) -> tensor<6144xf32> {
  // expected-error @+1 {{'kiln.rms_norm' op weight has 2048 elements but the input's innermost dimension has 6144}}
  %n = kiln.rms_norm %x, %w {epsilon = 1.0e-05 : f32} : tensor<6144xf32>, tensor<2048xf32>
  return %n : tensor<6144xf32>
}

// -----

func.func @norm_weight_rank(%x: tensor<4x64xf32>, %w: tensor<4x64xf32>) -> tensor<4x64xf32> {
  // expected-error @+1 {{'kiln.rms_norm' op weight must be one-dimensional, got 'tensor<4x64xf32>'}}
  %n = kiln.rms_norm %x, %w {epsilon = 1.0e-05 : f32} : tensor<4x64xf32>, tensor<4x64xf32>
  return %n : tensor<4x64xf32>
}

// -----

func.func @norm_scalar(%x: tensor<f32>, %w: tensor<1xf32>) -> tensor<f32> {
  // expected-error @+1 {{'kiln.rms_norm' op input must have at least one dimension, got 'tensor<f32>'}}
  %n = kiln.rms_norm %x, %w {epsilon = 1.0e-05 : f32} : tensor<f32>, tensor<1xf32>
  return %n : tensor<f32>
}

// -----

func.func @norm_epsilon_zero(%x: tensor<64xf32>, %w: tensor<64xf32>) -> tensor<64xf32> {
  // expected-error @+1 {{'kiln.rms_norm' op epsilon must be positive and finite, got 0}}
  %n = kiln.rms_norm %x, %w {epsilon = 0.0 : f32} : tensor<64xf32>, tensor<64xf32>
  return %n : tensor<64xf32>
}

// -----

func.func @norm_epsilon_negative(%x: tensor<64xf32>, %w: tensor<64xf32>) -> tensor<64xf32> {
  // expected-error @+1 {{'kiln.rms_norm' op epsilon must be positive and finite, got -1}}
  %n = kiln.rms_norm %x, %w {epsilon = -1.0 : f32} : tensor<64xf32>, tensor<64xf32>
  return %n : tensor<64xf32>
}

// -----

func.func @norm_epsilon_missing(%x: tensor<64xf32>, %w: tensor<64xf32>) -> tensor<64xf32> {
  // expected-error @+1 {{'kiln.rms_norm' op requires attribute 'epsilon'}}
  %n = kiln.rms_norm %x, %w : tensor<64xf32>, tensor<64xf32>
  return %n : tensor<64xf32>
}

// -----

func.func @add_types_differ(%a: tensor<64xf32>, %b: tensor<64xf16>) -> tensor<64xf32> {
  // expected-error @+1 {{'kiln.add' op requires the same type for all operands and results}}
  %s = "kiln.add"(%a, %b) : (tensor<64xf32>, tensor<64xf16>) -> tensor<64xf32>
  return %s : tensor<64xf32>
}

// -----

func.func @swiglu_integer(%a: tensor<64xi32>, %b: tensor<64xi32>) -> tensor<64xi32> {
  // expected-error @+1 {{'kiln.swiglu' op operand #0 must be ranked tensor of 32-bit float or 16-bit float or bfloat16 type values}}
  %s = kiln.swiglu %a, %b : tensor<64xi32>
  return %s : tensor<64xi32>
}

// -----

func.func @argmax_rank(%x: tensor<2x8xf32>) -> tensor<i32> {
  // expected-error @+1 {{'kiln.argmax' op input must be one-dimensional, got 'tensor<2x8xf32>'}}
  %t = kiln.argmax %x : tensor<2x8xf32>
  return %t : tensor<i32>
}

// -----

func.func @argmax_empty(%x: tensor<0xf32>) -> tensor<i32> {
  // expected-error @+1 {{'kiln.argmax' op input must not be empty}}
  %t = kiln.argmax %x : tensor<0xf32>
  return %t : tensor<i32>
}
