//===- StepOpsTest.cpp - Decoding a step's ops once for every backend -----===//
//
// The decoder's checks of the ops the fusion passes add: swiglu_linear, a
// projection's live_from, and moe_experts' shared expert. An artifact is
// assembled by hand, so each bad field stands alone.
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

/// moe_experts over x [64] with 2 chosen of 4 experts (gate, up [64, 32,
/// 4], down [32, 64, 4]), then `shared` (bindings 3.., each [ne0, ne1]),
/// with an addend first when `addend`.
ka::Artifact experts(std::vector<std::vector<int64_t>> shared,
                     bool addend = false) {
  std::vector<ka::WeightBinding> weights = {q8("gate.weight", {64, 32, 4}),
                                            q8("up.weight", {64, 32, 4}),
                                            q8("down.weight", {32, 64, 4})};
  ka::Buffer ids = arena("ids", {2});
  ids.dtype = ka::DType::I32;
  std::vector<ka::Buffer> buffers = {arena("x", {64}), ids, arena("w", {2})};
  std::vector<int32_t> operands = {0, 1, 2};
  if (addend) {
    operands.push_back(int32_t(buffers.size()));
    buffers.push_back(arena("addend", {64}));
  }
  const char *names[] = {"gate", "up", "down", "gate_s", "up_s", "down_s"};
  for (size_t i = 0; i < 3 + shared.size(); ++i) {
    if (i >= 3)
      weights.push_back(q8(std::string(names[i]) + ".weight", shared[i - 3]));
    operands.push_back(int32_t(buffers.size()));
    buffers.push_back(weightBuffer(names[i], int32_t(i)));
  }
  operands.push_back(int32_t(buffers.size()));
  buffers.push_back(arena("y", {64}));
  return withOp(std::move(weights), std::move(buffers),
                opOf("moe_experts", std::move(operands)));
}

TEST(StepOps, MoeExpertsSharedDecodes) {
  Expected<StepOp> plain = decodeOnly(experts({}));
  ASSERT_TRUE(plain) << plain.error().message();
  EXPECT_FALSE(plain->hasShared);
  Expected<StepOp> d = decodeOnly(experts({{64, 48}, {64, 48}, {48, 64}}));
  ASSERT_TRUE(d) << d.error().message();
  EXPECT_TRUE(d->hasShared);
  EXPECT_EQ(d->sharedIndex, 6u);
  EXPECT_EQ(d->sharedFfn, 48);
  EXPECT_EQ(d->ffn, 32);
  EXPECT_EQ(d->experts, 4);
  EXPECT_FALSE(d->fusedGateUp);
}

TEST(StepOps, MoeExpertsSharedRefusesBadWeights) {
  auto fails = [](const ka::Artifact &a, const char *message) {
    Expected<StepOp> d = decodeOnly(a);
    ASSERT_FALSE(d) << message;
    EXPECT_NE(d.error().message().find(message), std::string::npos)
        << d.error().message();
  };
  fails(experts({{64, 48}, {64, 48}}), "(gate, up, down) 2-D weights");
  fails(experts({{64, 48}, {64, 48}, {48, 64}}, /*addend=*/true),
        "an addend or a shared expert, not both");
  fails(experts({{64, 48}, {64, 40}, {48, 64}}), "shared 'up_s.weight'");
  fails(experts({{32, 48}, {32, 48}, {48, 64}}), "shared 'gate_s.weight'");
  fails(experts({{64, 48}, {64, 48}, {64, 48}}), "shared down");
}

} // namespace
