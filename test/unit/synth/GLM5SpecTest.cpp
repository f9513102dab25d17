//===- GLM5SpecTest.cpp - Presets, mixes and the synthetic tensor list -----===//
#include "synth/GLM5Spec.h"
#include "synth/SynthTokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

using namespace kiln;
using namespace kiln::synth;

namespace {

std::vector<SynthTensor> tensorsOf(std::string_view preset, std::string_view mix,
                                   LayoutOptions layout = {}) {
  Expected<GLM5Dims> dims = presetDims(preset);
  EXPECT_TRUE(dims);
  Expected<Mix> m = namedMix(mix);
  EXPECT_TRUE(m);
  Expected<std::vector<SynthTensor>> t = glm5Tensors(*dims, *m, layout);
  EXPECT_TRUE(t) << (t ? "" : t.error().message());
  return t ? *t : std::vector<SynthTensor>{};
}

const SynthTensor *find(const std::vector<SynthTensor> &ts,
                        std::string_view name) {
  for (const SynthTensor &t : ts)
    if (t.name == name)
      return &t;
  return nullptr;
}

} // namespace

TEST(GLM5Spec, RealDimensionsMatchGLM5) {
  auto ts = tensorsOf("glm5", "ud-q4_k_xl");
  // GLM5.md section 3's table.
  struct Row {
    const char *name;
    std::vector<uint64_t> dims;
  } rows[] = {
      {"token_embd.weight", {6144, 154880}},
      {"output.weight", {6144, 154880}},
      {"blk.0.attn_q_a.weight", {6144, 2048}},
      {"blk.0.attn_q_b.weight", {2048, 16384}},
      {"blk.0.attn_kv_a_mqa.weight", {6144, 576}},
      {"blk.0.attn_k_b.weight", {192, 512, 64}},
      {"blk.0.attn_v_b.weight", {512, 256, 64}},
      {"blk.0.attn_output.weight", {16384, 6144}},
      {"blk.0.indexer.attn_q_b.weight", {2048, 4096}},
      {"blk.0.indexer.attn_k.weight", {6144, 128}},
      {"blk.0.indexer.proj.weight", {6144, 32}},
      {"blk.2.ffn_gate.weight", {6144, 12288}},
      {"blk.2.ffn_down.weight", {12288, 6144}},
      {"blk.3.ffn_gate_inp.weight", {6144, 256}},
      {"blk.3.exp_probs_b.bias", {256}},
      {"blk.3.ffn_gate_exps.weight", {6144, 2048, 256}},
      {"blk.77.ffn_down_exps.weight", {2048, 6144, 256}},
      {"blk.77.ffn_down_shexp.weight", {2048, 6144}},
      {"blk.78.nextn.eh_proj.weight", {12288, 6144}},
  };
  for (const Row &r : rows) {
    const SynthTensor *t = find(ts, r.name);
    ASSERT_NE(t, nullptr) << r.name;
    EXPECT_EQ(t->dims, r.dims) << r.name;
  }
  EXPECT_EQ(find(ts, "blk.3.ffn_gate.weight"), nullptr) << "layer 3 is MoE";
  EXPECT_EQ(find(ts, "blk.79.attn_norm.weight"), nullptr);
  // attn_k_b rows are 192 long: never a K-quant.
  EXPECT_EQ(find(ts, "blk.0.attn_k_b.weight")->type, GGMLType::Q8_0);
  EXPECT_EQ(find(ts, "blk.5.ffn_up_exps.weight")->type, GGMLType::Q4_K);
  EXPECT_EQ(find(ts, "blk.5.ffn_norm.weight")->type, GGMLType::F32);
}

TEST(GLM5Spec, NamesAreUnique) {
  for (const char *preset : {"tiny", "small", "glm5"}) {
    auto ts = tensorsOf(preset, "q8_0");
    std::set<std::string> names;
    for (const SynthTensor &t : ts)
      EXPECT_TRUE(names.insert(t.name).second) << preset << " " << t.name;
  }
}

TEST(GLM5Spec, FusedGateUpReplacesGateAndUp) {
  auto ts = tensorsOf("tiny", "tiny", LayoutOptions{true});
  EXPECT_EQ(find(ts, "blk.1.ffn_gate_exps.weight"), nullptr);
  const SynthTensor *fused = find(ts, "blk.1.ffn_gate_up_exps.weight");
  ASSERT_NE(fused, nullptr);
  EXPECT_EQ(fused->dims, (std::vector<uint64_t>{256, 512, 16}));
}

// The presets promise block-aligned tensor-parallel slices: row-parallel
// tensors are cut along ne[0] into tp pieces, each a whole number of blocks.
TEST(GLM5Spec, RowParallelSlicesStayBlockAligned) {
  std::pair<const char *, const char *> cases[] = {{"tiny", "tiny"},
                                                   {"small", "ud-q4_k_xl"},
                                                   {"glm5", "ud-q4_k_xl"},
                                                   {"small", "ud-q2_k_xl"},
                                                   {"glm5", "ud-q2_k_xl"}};
  for (auto [preset, mix] : cases) {
    for (const SynthTensor &t : tensorsOf(preset, mix)) {
      std::string role = roleOf(t.name);
      bool rowParallel = role == "attn_output" || role == "ffn_down" ||
                         role == "ffn_down_exps" || role == "ffn_down_shexp";
      if (!rowParallel)
        continue;
      for (uint64_t tp : {1, 2, 4, 8}) {
        ASSERT_EQ(t.dims[0] % tp, 0u) << preset << " " << t.name;
        EXPECT_EQ((t.dims[0] / tp) % traitsOf(t.type).blockSize, 0u)
            << preset << " " << t.name << " tp=" << tp;
      }
    }
  }
}

// The 2-bit mix lowers the routed experts only: Q2_K gate/up, Q3_K down,
// every other tensor typed as in ud-q4_k_xl.
TEST(GLM5Spec, TwoBitMixLowersOnlyTheRoutedExperts) {
  auto low = tensorsOf("small", "ud-q2_k_xl");
  auto base = tensorsOf("small", "ud-q4_k_xl");
  ASSERT_EQ(low.size(), base.size());
  int lowered = 0;
  for (size_t i = 0; i < low.size(); ++i) {
    ASSERT_EQ(low[i].name, base[i].name);
    std::string role = roleOf(low[i].name);
    if (role == "ffn_gate_exps" || role == "ffn_up_exps") {
      EXPECT_EQ(low[i].type, GGMLType::Q2_K) << low[i].name;
      ++lowered;
    } else if (role == "ffn_down_exps") {
      EXPECT_EQ(low[i].type, GGMLType::Q3_K) << low[i].name;
      ++lowered;
    } else {
      EXPECT_EQ(low[i].type, base[i].type) << low[i].name;
    }
  }
  // Three routed tensors in each MoE layer, the MTP block's included.
  EXPECT_GT(lowered, 0);
  EXPECT_EQ(lowered % 3, 0);
}

TEST(GLM5Spec, MisalignedTypeIsRefusedWithTheTensorName) {
  Expected<GLM5Dims> dims = presetDims("tiny");
  Expected<Mix> mix = namedMix("tiny");
  ASSERT_TRUE(overrideMixRole(*mix, "attn_k_b=q4_k"));
  auto ts = glm5Tensors(*dims, *mix, {});
  ASSERT_FALSE(ts);
  EXPECT_EQ(ts.error().field(), "blk.0.attn_k_b.weight");
  EXPECT_NE(ts.error().problem().find("not a multiple of Q4_K's block of 256"),
            std::string::npos)
      << ts.error().message();
}

TEST(GLM5Spec, OverridesAndErrors) {
  GLM5Dims d = *presetDims("glm5");
  ASSERT_TRUE(overrideDim(d, "layers", "4"));
  EXPECT_EQ(d.layers, 4u);
  EXPECT_FALSE(overrideDim(d, "layers", "four"));
  EXPECT_FALSE(overrideDim(d, "layers", "-1"));
  EXPECT_EQ(overrideDim(d, "bogus", "1").error().field(), "--bogus");
  EXPECT_FALSE(presetDims("huge"));
  EXPECT_FALSE(namedMix("q3"));
  Mix m = *namedMix("q8_0");
  EXPECT_FALSE(overrideMixRole(m, "ffn_down"));
  EXPECT_FALSE(overrideMixRole(m, "ffn_down=q9_k"));

  GLM5Dims bad = *presetDims("tiny");
  bad.expertsUsed = bad.experts + 1;
  EXPECT_EQ(validateDims(bad).error().field(), "--experts-used");
  bad = *presetDims("tiny");
  bad.vocab = 300;
  EXPECT_EQ(validateDims(bad).error().field(), "--vocab");
}

TEST(GLM5Spec, RoleOfStripsBlockAndSuffix) {
  EXPECT_EQ(roleOf("blk.12.ffn_down_exps.weight"), "ffn_down_exps");
  EXPECT_EQ(roleOf("blk.0.indexer.k_norm.bias"), "indexer.k_norm");
  EXPECT_EQ(roleOf("token_embd.weight"), "token_embd");
}

TEST(SynthTokenizer, MergesJoinExistingTokens) {
  for (uint64_t vocab : {512u, 1024u, 4096u}) {
    SynthTokenizer tok = makeTokenizer(vocab);
    ASSERT_EQ(tok.tokens.size(), vocab);
    ASSERT_EQ(tok.types.size(), vocab);
    std::set<std::string> known;
    for (size_t i = 0; i < 256; ++i)
      known.insert(tok.tokens[i]);
    EXPECT_EQ(known.size(), 256u) << "byte tokens must be distinct";
    EXPECT_GT(tok.merges.size(), 100u);
    for (size_t r = 0; r < tok.merges.size(); ++r) {
      const std::string &m = tok.merges[r];
      size_t space = m.find(' ');
      ASSERT_NE(space, std::string::npos);
      std::string left = m.substr(0, space), right = m.substr(space + 1);
      EXPECT_TRUE(known.count(left) && known.count(right)) << m;
      // Merge r creates token 256 + r.
      EXPECT_EQ(tok.tokens[256 + r], left + right);
      known.insert(left + right);
    }
    EXPECT_EQ(tok.tokens[tok.eosId], "<|endoftext|>");
    EXPECT_EQ(tok.tokens[tok.eotId], "<|user|>");
    EXPECT_EQ(tok.types[tok.eosId], TokenType::Control);
  }
}

TEST(SynthTokenizer, SpecialIdsMatchGLM5AtFullVocabulary) {
  SynthTokenizer tok = makeTokenizer(154880);
  EXPECT_EQ(tok.eosId, 154820u);
  EXPECT_EQ(tok.eotId, 154827u);
  EXPECT_EQ(tok.tokens[154829], "<|observation|>");
}

TEST(SynthTokenizer, ByteLevelSpelling) {
  EXPECT_EQ(byteLevelEncode("a"), "a");
  EXPECT_EQ(byteLevelEncode(" "), "\xc4\xa0");  // U+0120
  EXPECT_EQ(byteLevelEncode("\n"), "\xc4\x8a"); // U+010A
}
