//===- ModelShapesTest.cpp - The CUDA kernels' shapes are GLM-5's ---------===//
//
// backends/cuda/ModelShapes.h names the shapes some kernels are compiled
// for. They must be GLM-5's, as the synthesiser's glm5 preset has them
// (the GLM-5 benchmarks are compiled from it, and GLM5SpecTest checks it
// against GLM5.md). A list that drifted would not give wrong results (the
// general kernels run for any other shape), only lose its kernels
// silently.
//
//===----------------------------------------------------------------------===//
#include "cuda/ModelShapes.h"
#include "synth/GLM5Spec.h"

#include <gtest/gtest.h>

#include <set>
#include <utility>

using namespace kiln;
namespace glm5 = kiln::cuda::glm5;

namespace {

template <int... kValues>
std::set<uint64_t> setOf(std::integer_sequence<int, kValues...>) {
  return {uint64_t(kValues)...};
}

} // namespace

TEST(ModelShapes, AreTheGLM5Preset) {
  Expected<synth::GLM5Dims> d = synth::presetDims("glm5");
  ASSERT_TRUE(d) << d.error().message();
  EXPECT_EQ(uint64_t(glm5::kHidden), d->hidden);
  EXPECT_EQ(uint64_t(glm5::kQLoraRank), d->qLoraRank);
  EXPECT_EQ(uint64_t(glm5::kLatent), d->kvLoraRank);
  EXPECT_EQ(uint64_t(glm5::kRope), d->qkRopeDim);
  EXPECT_EQ(uint64_t(glm5::kNope), d->qkNopeDim);
  EXPECT_EQ(uint64_t(glm5::kHeads), d->heads);
  EXPECT_EQ(uint64_t(glm5::kVHead), d->vHeadDim);
  EXPECT_EQ(uint64_t(glm5::kSharedFfn), d->expertFF * d->sharedExperts);
  EXPECT_EQ(uint64_t(glm5::kExpertFfn), d->expertFF);
  EXPECT_EQ(uint64_t(glm5::kExperts), d->experts);
  EXPECT_EQ(uint64_t(glm5::kTopK), d->expertsUsed);
  EXPECT_EQ(uint64_t(glm5::kIndexDim), d->indexerDim);
}

TEST(ModelShapes, ListEveryDegreesWidths) {
  // What a rank at tp = 1, 2, 4, 8 multiplies: heads, the shared and
  // routed experts' widths split; q_a, q_b, attn_k_b and attn_v_b whole.
  Expected<synth::GLM5Dims> d = synth::presetDims("glm5");
  ASSERT_TRUE(d) << d.error().message();
  const std::set<uint64_t> plain = setOf(glm5::Q8PlainWidths{}),
                           norm = setOf(glm5::Q8NormWidths{}),
                           swiglu = setOf(glm5::Q8SwigluWidths{}),
                           experts = setOf(glm5::ExpertFfnWidths{}),
                           heads = setOf(glm5::MlaHeadCounts{});
  for (uint64_t tp : {1, 2, 4, 8}) {
    SCOPED_TRACE(tp);
    EXPECT_TRUE(plain.count(d->heads * d->vHeadDim / tp)); // attn_output
    EXPECT_TRUE(swiglu.count(d->expertFF * d->sharedExperts / tp));
    EXPECT_TRUE(experts.count(d->expertFF / tp));
    EXPECT_TRUE(heads.count(d->heads / tp));
  }
  for (uint64_t whole : {d->hidden, d->qkNopeDim, d->kvLoraRank})
    EXPECT_TRUE(plain.count(whole)) << whole;
  EXPECT_TRUE(norm.count(d->qLoraRank));
  EXPECT_TRUE(norm.count(d->hidden));
}

// KILN_CUDA_SPECIALISED's values: the plugin turns nullopt into an error
// naming the variable, so every malformed list must give nullopt, not a
// partial mask.
TEST(ModelShapes, ShapeFamilyLists) {
  using kiln::cuda::parseShapeFamilies;
  using kiln::cuda::ShapeFamily;
  EXPECT_EQ(parseShapeFamilies("1"), kiln::cuda::kAllShapeFamilies);
  EXPECT_EQ(parseShapeFamilies("0"), 0u);
  EXPECT_EQ(parseShapeFamilies("experts,mla"),
            unsigned(ShapeFamily::Experts) | unsigned(ShapeFamily::Mla));
  EXPECT_EQ(parseShapeFamilies("indexer"), unsigned(ShapeFamily::Indexer));
  EXPECT_EQ(parseShapeFamilies("router,allreduce"),
            unsigned(ShapeFamily::Router) | unsigned(ShapeFamily::AllReduce));
  EXPECT_EQ(parseShapeFamilies("q8,experts,mla,indexer,router,allreduce"),
            kiln::cuda::kAllShapeFamilies);
  EXPECT_NE(parseShapeFamilies("q8,experts,mla,indexer"),
            kiln::cuda::kAllShapeFamilies);
  EXPECT_EQ(parseShapeFamilies("mla,mla"), unsigned(ShapeFamily::Mla));
  for (const char *bad :
       {"", "2", "yes", "q8,", ",q8", "q8,,mla", "Q8", "experts mla",
        "experts;mla", "mla,bogus", "all-reduce"})
    EXPECT_EQ(parseShapeFamilies(bad), std::nullopt) << "'" << bad << "'";
}
