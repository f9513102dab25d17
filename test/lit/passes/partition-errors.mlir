// RUN: kiln-opt %s --split-input-file --verify-diagnostics --kiln-partition=tp=2 -o /dev/null

// A weight whose rows are cut per head (kiln-split-projections) is already
// a rank's rows: partition, which runs first, refuses to split it again.
func.func @cut_then_partition(%c: tensor<64xf32>) -> tensor<96xf32> {
  // expected-error @+1 {{'kiln.weight' op tensor 'w.weight' has its rows cut: kiln-split-projections runs after kiln-partition, not before}}
  %w = kiln.weight {tp_split = 1 : i64} : !kiln.qweight<"w.weight", "q8_0", [64, 96], rows = 0 to 24 of 32>
  %q = kiln.linear %c, %w : tensor<64xf32>, !kiln.qweight<"w.weight", "q8_0", [64, 96], rows = 0 to 24 of 32> -> tensor<96xf32>
  return %q : tensor<96xf32>
}
