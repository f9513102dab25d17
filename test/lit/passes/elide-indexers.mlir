// RUN: kiln-opt %s --kiln-elide-indexers | FileCheck %s

// A cache of 32 positions and a top-k of 32: every position is selected, so
// MLA attends 0 .. position without the selection, and the indexer, its
// key's append, the projections that fed only them, their weights and the
// key cache go. The latent cache and its append stay. The function counts
// what went, for kiln-compile --report.
// CHECK-LABEL: func.func @selects_all
// CHECK-SAME: attributes {kiln.elided_indexers = 1 : i64}
// CHECK-NOT: indexer
// CHECK-NOT: index_cache
// CHECK: kiln.cache_append %{{.+}}[%{{.+}}], %{{.+}} : !kiln.latent_cache<32, 64, 16, f16>
// CHECK: kiln.mla_attention %{{.+}}, %{{.+}}, %{{.+}}[%{{.+}}] {scale = 1.250000e-01 : f32} : tensor<8x64xf32>, tensor<8x16xf32>, !kiln.latent_cache<32, 64, 16, f16> -> tensor<8x64xf32>
// CHECK-NOT: indexer
// CHECK: return
func.func @selects_all(%x: tensor<256xf32>, %ql: tensor<8x64xf32>,
                       %qr: tensor<8x16xf32>, %row: tensor<80xf32>,
                       %pos: tensor<i32>) -> tensor<8x64xf32> {
  %kv = kiln.state "blk.0.kv_cache" : !kiln.latent_cache<32, 64, 16, f16>
  kiln.cache_append %kv[%pos], %row : !kiln.latent_cache<32, 64, 16, f16>, tensor<80xf32>
  %ic = kiln.state "blk.0.index_cache" : !kiln.index_cache<32, 32, f16>
  %wk = kiln.weight : !kiln.qweight<"blk.0.indexer.attn_k.weight", "f16", [256, 32]>
  %key = kiln.linear %x, %wk : tensor<256xf32>, !kiln.qweight<"blk.0.indexer.attn_k.weight", "f16", [256, 32]> -> tensor<32xf32>
  kiln.cache_append %ic[%pos], %key : !kiln.index_cache<32, 32, f16>, tensor<32xf32>
  %wq = kiln.weight : !kiln.qweight<"blk.0.indexer.attn_q_b.weight", "f16", [256, 128]>
  %q = kiln.linear %x, %wq : tensor<256xf32>, !kiln.qweight<"blk.0.indexer.attn_q_b.weight", "f16", [256, 128]> -> tensor<128xf32>
  %qi = tensor.expand_shape %q [[0, 1]] output_shape [4, 32] : tensor<128xf32> into tensor<4x32xf32>
  %ww = kiln.weight : !kiln.qweight<"blk.0.indexer.proj.weight", "f16", [256, 4]>
  %hw = kiln.linear %x, %ww : tensor<256xf32>, !kiln.qweight<"blk.0.indexer.proj.weight", "f16", [256, 4]> -> tensor<4xf32>
  %sel, %n = kiln.dsa_indexer %qi, %hw, %ic[%pos] {top_k = 32 : i64, scale = 0.0883883461 : f32} : tensor<4x32xf32>, tensor<4xf32>, !kiln.index_cache<32, 32, f16> -> tensor<32xi32>
  %o = kiln.mla_attention %ql, %qr, %kv[%pos] select(%sel, %n) {scale = 0.125 : f32} : tensor<8x64xf32>, tensor<8x16xf32>, !kiln.latent_cache<32, 64, 16, f16>, tensor<32xi32> -> tensor<8x64xf32>
  return %o : tensor<8x64xf32>
}

// One position more than the top-k: the indexer chooses, and stays.
// CHECK-LABEL: func.func @chooses
// CHECK: kiln.cache_append %{{.+}}[%{{.+}}], %{{.+}} : !kiln.index_cache<33, 32, f16>
// CHECK: %[[SEL:.+]], %[[N:.+]] = kiln.dsa_indexer
// CHECK: kiln.mla_attention %{{.+}}, %{{.+}}, %{{.+}}[%{{.+}}] select(%[[SEL]], %[[N]])
func.func @chooses(%qi: tensor<4x32xf32>, %hw: tensor<4xf32>,
                   %ql: tensor<8x64xf32>, %qr: tensor<8x16xf32>,
                   %key: tensor<32xf32>, %pos: tensor<i32>) -> tensor<8x64xf32> {
  %kv = kiln.state "blk.1.kv_cache" : !kiln.latent_cache<33, 64, 16, f16>
  %ic = kiln.state "blk.1.index_cache" : !kiln.index_cache<33, 32, f16>
  kiln.cache_append %ic[%pos], %key : !kiln.index_cache<33, 32, f16>, tensor<32xf32>
  %sel, %n = kiln.dsa_indexer %qi, %hw, %ic[%pos] {top_k = 32 : i64, scale = 0.0883883461 : f32} : tensor<4x32xf32>, tensor<4xf32>, !kiln.index_cache<33, 32, f16> -> tensor<32xi32>
  %o = kiln.mla_attention %ql, %qr, %kv[%pos] select(%sel, %n) {scale = 0.125 : f32} : tensor<8x64xf32>, tensor<8x16xf32>, !kiln.latent_cache<33, 64, 16, f16>, tensor<32xi32> -> tensor<8x64xf32>
  return %o : tensor<8x64xf32>
}

// A selection read by something other than MLA (here, returned) keeps its
// indexer, and so its key cache's append.
// CHECK-LABEL: func.func @other_reader
// CHECK: kiln.cache_append %{{.+}}[%{{.+}}], %{{.+}} : !kiln.index_cache<16, 32, f16>
// CHECK: kiln.dsa_indexer
// CHECK: kiln.mla_attention %{{.+}}, %{{.+}}, %{{.+}}[%{{.+}}] select(
func.func @other_reader(%qi: tensor<4x32xf32>, %hw: tensor<4xf32>,
                        %ql: tensor<8x64xf32>, %qr: tensor<8x16xf32>,
                        %key: tensor<32xf32>, %pos: tensor<i32>)
    -> (tensor<8x64xf32>, tensor<32xi32>) {
  %kv = kiln.state "blk.2.kv_cache" : !kiln.latent_cache<16, 64, 16, f16>
  %ic = kiln.state "blk.2.index_cache" : !kiln.index_cache<16, 32, f16>
  kiln.cache_append %ic[%pos], %key : !kiln.index_cache<16, 32, f16>, tensor<32xf32>
  %sel, %n = kiln.dsa_indexer %qi, %hw, %ic[%pos] {top_k = 32 : i64, scale = 0.0883883461 : f32} : tensor<4x32xf32>, tensor<4xf32>, !kiln.index_cache<16, 32, f16> -> tensor<32xi32>
  %o = kiln.mla_attention %ql, %qr, %kv[%pos] select(%sel, %n) {scale = 0.125 : f32} : tensor<8x64xf32>, tensor<8x16xf32>, !kiln.latent_cache<16, 64, 16, f16>, tensor<32xi32> -> tensor<8x64xf32>
  return %o, %sel : tensor<8x64xf32>, tensor<32xi32>
}

// A key cache that an indexer of another function still reads (states of
// one name are one state) keeps its append here, though this function's
// indexer goes.
// CHECK-LABEL: func.func @shared_cache_writer
// CHECK: kiln.cache_append %{{.+}}[%{{.+}}], %{{.+}} : !kiln.index_cache<16, 32, f16>
// CHECK-NOT: kiln.dsa_indexer
// CHECK: kiln.mla_attention %{{.+}}, %{{.+}}, %{{.+}}[%{{.+}}] {scale
func.func @shared_cache_writer(%qi: tensor<4x32xf32>, %hw: tensor<4xf32>,
                               %ql: tensor<8x64xf32>, %qr: tensor<8x16xf32>,
                               %key: tensor<32xf32>, %pos: tensor<i32>)
    -> tensor<8x64xf32> {
  %kv = kiln.state "blk.2.kv_cache" : !kiln.latent_cache<16, 64, 16, f16>
  %ic = kiln.state "blk.2.index_cache" : !kiln.index_cache<16, 32, f16>
  kiln.cache_append %ic[%pos], %key : !kiln.index_cache<16, 32, f16>, tensor<32xf32>
  %sel, %n = kiln.dsa_indexer %qi, %hw, %ic[%pos] {top_k = 32 : i64, scale = 0.0883883461 : f32} : tensor<4x32xf32>, tensor<4xf32>, !kiln.index_cache<16, 32, f16> -> tensor<32xi32>
  %o = kiln.mla_attention %ql, %qr, %kv[%pos] select(%sel, %n) {scale = 0.125 : f32} : tensor<8x64xf32>, tensor<8x16xf32>, !kiln.latent_cache<16, 64, 16, f16>, tensor<32xi32> -> tensor<8x64xf32>
  return %o : tensor<8x64xf32>
}
