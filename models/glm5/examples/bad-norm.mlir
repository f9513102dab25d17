// An attention norm whose weight belongs to the q_a latent (2048) applied to
// the hidden state (6144): the kind of mistake the verifiers exist to catch.
func.func @bad(%x: tensor<6144xf32>, %q_a_norm: tensor<2048xf32>) -> tensor<6144xf32> {
  %a = kiln.rms_norm %x, %q_a_norm {epsilon = 1.0e-05 : f32} : tensor<6144xf32>, tensor<2048xf32>
  return %a : tensor<6144xf32>
}
