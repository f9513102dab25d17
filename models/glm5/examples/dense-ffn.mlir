// The elementwise skeleton of a GLM-5 dense FFN block (layers 0-2) written in
// the kiln ops that exist today: residual add, RMSNorm, SwiGLU. The gate, up
// and down projections (kiln.linear over quantised GGUF weights) arrive with
// the full op set; here their outputs are function arguments.
func.func @dense_ffn_tail(%x: tensor<6144xf32>, %attn_out: tensor<6144xf32>,
                          %ffn_norm: tensor<6144xf32>,
                          %gate: tensor<12288xf32>, %up: tensor<12288xf32>)
    -> (tensor<6144xf32>, tensor<12288xf32>) {
  %h = kiln.add %x, %attn_out : tensor<6144xf32>
  %f = kiln.rms_norm %h, %ffn_norm {epsilon = 1.0e-05 : f32} : tensor<6144xf32>, tensor<6144xf32>
  %act = kiln.swiglu %gate, %up : tensor<12288xf32>
  return %f, %act : tensor<6144xf32>, tensor<12288xf32>
}
