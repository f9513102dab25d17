//===- StepOpsTest.cpp - Decoding a step's ops once for every backend -----===//
//
// The decoder's checks of the ops the fusion passes add: swiglu_linear,
// moe_ffn, and a projection's live_from. An artifact is assembled by hand, so
// each bad field stands alone.
//
//===----------------------------------------------------------------------===//
#include "common/StepOps.h"

#include <gtest/gtest.h>

using namespace kiln;
using namespace kiln::backend;
namespace ka = kiln::artifact;

namespace {

ka::Buffer arena(std::string name, std::vector<int64_t> shape) {
  ka::Buffer b;
  b.name = std::move(name);
  b.shape = std::move(shape);
  return b;
}

ka::Buffer weightBuffer(std::string name, int32_t binding) {
  ka::Buffer b;
  b.name = std::move(name);
  b.kind = ka::BufferKind::Weight;
  b.binding = binding;
  return b;
}

ka::WeightBinding q8(std::string tensor, std::vector<int64_t> dims) {
  ka::WeightBinding w;
  w.tensor = std::move(tensor);
  w.type = GGMLType::Q8_0;
  w.dims = std::move(dims);
  return w;
}

ka::Attr ints(std::string name, std::vector<int64_t> values) {
  ka::Attr a;
  a.name = std::move(name);
  a.kind = ka::AttrKind::Ints;
  a.ints = std::move(values);
  return a;
}

/// An artifact of one step holding `op` over `buffers`.
ka::Artifact withOp(std::vector<ka::WeightBinding> weights,
                    std::vector<ka::Buffer> buffers, ka::Op op) {
  ka::Artifact a;
  a.weights = std::move(weights);
  ka::RankPlan plan;
  ka::Step step;
  step.name = "decode_step";
  step.buffers = std::move(buffers);
  step.ops.push_back(std::move(op));
  plan.steps.push_back(std::move(step));
  a.rankPlans.push_back(std::move(plan));
  return a;
}

ka::Op opOf(std::string kind, std::vector<int32_t> operands,
            std::vector<ka::Attr> attrs = {}) {
  ka::Op op;
  op.kind = std::move(kind);
  op.operands = std::move(operands);
  op.numOuts = 1;
  op.attrs = std::move(attrs);
  return op;
}

Expected<StepOp> decodeOnly(const ka::Artifact &a) {
  return decodeOp(a, a.rankPlans[0].steps[0], 0, 1);
}

/// gate [k], up [up], the weight [k, n], output [out].
ka::Artifact swigluLinear(int64_t k, int64_t up, int64_t n, int64_t out) {
  return withOp({q8("down.weight", {k, n})},
                {arena("gate", {k}), arena("up", {up}), weightBuffer("down", 0),
                 arena("y", {out})},
                opOf("swiglu_linear", {0, 1, 2, 3}));
}

TEST(StepOps, SwigluLinearDecodes) {
  Expected<StepOp> d = decodeOnly(swigluLinear(128, 128, 64, 64));
  ASSERT_TRUE(d) << d.error().message();
  EXPECT_EQ(d->kind, OpKind::SwigluLinear);
  EXPECT_EQ(d->k, 128);
  EXPECT_EQ(d->n, 64);
}

TEST(StepOps, SwigluLinearRefusesMismatchedShapes) {
  Expected<StepOp> up = decodeOnly(swigluLinear(128, 64, 64, 64));
  ASSERT_FALSE(up);
  EXPECT_NE(up.error().message().find("'gate' and 'up' differ in shape"),
            std::string::npos)
      << up.error().message();
  Expected<StepOp> out = decodeOnly(swigluLinear(128, 128, 64, 32));
  ASSERT_FALSE(out);
  EXPECT_NE(out.error().message().find("not the weight's ne[1] values"),
            std::string::npos)
      << out.error().message();
  Expected<StepOp> k = decodeOnly(swigluLinear(96, 96, 64, 64));
  ASSERT_TRUE(k) << k.error().message(); // gate 96 = the weight's ne[0] 96
  Expected<StepOp> wrongK =
      decodeOnly(withOp({q8("down.weight", {128, 64})},
                        {arena("gate", {96}), arena("up", {96}),
                         weightBuffer("down", 0), arena("y", {64})},
                        opOf("swiglu_linear", {0, 1, 2, 3})));
  ASSERT_FALSE(wrongK);
  EXPECT_NE(wrongK.error().message().find("the weight's ne[0]"),
            std::string::npos)
      << wrongK.error().message();
}

/// A fused_linear of two Q8_0 parts [128, 64] and [128, 32].
ka::Artifact fused(std::vector<ka::Attr> attrs) {
  return withOp({q8("a.weight", {128, 64}), q8("b.weight", {128, 32})},
                {arena("x", {128}), weightBuffer("a", 0), weightBuffer("b", 1),
                 arena("y", {96})},
                opOf("fused_linear", {0, 1, 2, 3}, std::move(attrs)));
}

TEST(StepOps, LiveFromDecodes) {
  Expected<StepOp> none = decodeOnly(fused({ints("segments", {0, 64})}));
  ASSERT_TRUE(none) << none.error().message();
  EXPECT_TRUE(none->liveFrom.empty());
  Expected<StepOp> live = decodeOnly(
      fused({ints("segments", {0, 64}), ints("live_from", {0, 2048})}));
  ASSERT_TRUE(live) << live.error().message();
  EXPECT_EQ(live->liveFrom, (std::vector<int64_t>{0, 2048}));
}

TEST(StepOps, LiveFromRefusesBadPositions) {
  Expected<StepOp> count =
      decodeOnly(fused({ints("segments", {0, 64}), ints("live_from", {2048})}));
  ASSERT_FALSE(count);
  EXPECT_NE(count.error().message().find("one position per weight"),
            std::string::npos)
      << count.error().message();
  Expected<StepOp> negative = decodeOnly(
      fused({ints("segments", {0, 64}), ints("live_from", {0, -1})}));
  ASSERT_FALSE(negative);
  EXPECT_NE(negative.error().message().find("out of range"), std::string::npos)
      << negative.error().message();
}

ka::WeightBinding f32(std::string tensor, std::vector<int64_t> dims) {
  ka::WeightBinding w = q8(std::move(tensor), std::move(dims));
  w.type = GGMLType::F32;
  return w;
}

ka::Attr intAttr(std::string name, int64_t v) {
  ka::Attr a;
  a.name = std::move(name);
  a.intValue = v;
  return a;
}

/// A moe_ffn of hidden 64, 4 experts (2 chosen) of ffn 32, a shared expert
/// of `sharedFfn` (its down [downRows, 64]), separate or fused expert gate
/// and up, with or without the router's bias.
ka::Artifact moeFfn(bool fusedGateUp, bool bias, int64_t sharedFfn = 32,
                    int64_t downRows = 32, int64_t experts = 4) {
  std::vector<ka::WeightBinding> w = {f32("router.weight", {64, 4}),
                                      q8("gate_shexp.weight", {64, sharedFfn}),
                                      q8("up_shexp.weight", {64, sharedFfn}),
                                      q8("down_shexp.weight", {downRows, 64})};
  if (fusedGateUp) {
    w.push_back(q8("gate_up_exps.weight", {64, 64, experts}));
  } else {
    w.push_back(q8("gate_exps.weight", {64, 32, experts}));
    w.push_back(q8("up_exps.weight", {64, 32, experts}));
  }
  w.push_back(q8("down_exps.weight", {32, 64, experts}));
  if (bias)
    w.push_back(f32("exp_probs_b.bias", {4}));
  std::vector<ka::Buffer> buffers = {arena("x", {64})};
  std::vector<int32_t> operands = {0};
  for (size_t i = 0; i < w.size(); ++i) {
    buffers.push_back(weightBuffer(w[i].tensor, int32_t(i)));
    operands.push_back(int32_t(i + 1));
  }
  buffers.push_back(arena("y", {64}));
  operands.push_back(int32_t(buffers.size() - 1));
  ka::Attr gating;
  gating.name = "gating";
  gating.kind = ka::AttrKind::String;
  gating.stringValue = "sigmoid";
  ka::Attr scale;
  scale.name = "routed_scale";
  scale.kind = ka::AttrKind::Float;
  scale.floatValue = 2.5;
  return withOp(
      std::move(w), std::move(buffers),
      opOf("moe_ffn", std::move(operands),
           {intAttr("top_k", 2), gating, intAttr("normalize", 1), scale}));
}

TEST(StepOps, MoeFfnDecodes) {
  for (bool fusedGateUp : {false, true})
    for (bool bias : {false, true}) {
      Expected<StepOp> d = decodeOnly(moeFfn(fusedGateUp, bias));
      ASSERT_TRUE(d) << d.error().message();
      EXPECT_EQ(d->kind, OpKind::MoeFfn);
      EXPECT_EQ(d->n, 64);
      EXPECT_EQ(d->k, 64);
      EXPECT_EQ(d->experts, 4);
      EXPECT_EQ(d->topK, 2);
      EXPECT_EQ(d->ffn, 32);
      EXPECT_EQ(d->sharedFfn, 32);
      EXPECT_EQ(d->hasBias, bias);
      EXPECT_EQ(d->fusedGateUp, fusedGateUp);
      EXPECT_FALSE(d->softmax);
      EXPECT_TRUE(d->normalize);
      EXPECT_EQ(d->routedScale, 2.5);
    }
}

TEST(StepOps, MoeFfnRefusesMismatchedShapes) {
  Expected<StepOp> down = decodeOnly(moeFfn(false, true, 32, 64));
  ASSERT_FALSE(down);
  EXPECT_NE(down.error().message().find("shared down 'down_shexp.weight' is "
                                        "not [32, 64]"),
            std::string::npos)
      << down.error().message();
  Expected<StepOp> experts = decodeOnly(moeFfn(true, false, 32, 32, 8));
  ASSERT_FALSE(experts);
  EXPECT_NE(experts.error().message().find("the router scores 4 experts, the "
                                           "expert weights hold 8"),
            std::string::npos)
      << experts.error().message();
}

} // namespace
