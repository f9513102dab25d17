//===- StepOpsTest.cpp - Decoding a step's ops once for every backend -----===//
//
// The decoder's checks of the ops the fusion passes add: swiglu_linear, a
// projection's live_from, moe_experts' shared expert, and the router fold's
// router_partial, moe_choose, all-reduce tail and choice, and the composed
// fold's linear_router; and the weight slicer's gather of a binding's rows
// (a rank's part, cut per head). An artifact is assembled by hand, so each
// bad field stands alone.
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

ka::WeightBinding f32(std::string tensor, std::vector<int64_t> dims) {
  ka::WeightBinding w;
  w.tensor = std::move(tensor);
  w.type = GGMLType::F32;
  w.dims = std::move(dims);
  return w;
}

ka::Attr intAttr(std::string name, int64_t value,
                 ka::AttrKind kind = ka::AttrKind::Int) {
  ka::Attr a;
  a.name = std::move(name);
  a.kind = kind;
  a.intValue = value;
  return a;
}

ka::Attr floatAttr(std::string name, double value) {
  ka::Attr a;
  a.name = std::move(name);
  a.kind = ka::AttrKind::Float;
  a.floatValue = value;
  return a;
}

ka::Attr stringAttr(std::string name, std::string value) {
  ka::Attr a;
  a.name = std::move(name);
  a.kind = ka::AttrKind::String;
  a.stringValue = std::move(value);
  return a;
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
            std::vector<ka::Attr> attrs = {}, uint32_t numOuts = 1) {
  ka::Op op;
  op.kind = std::move(kind);
  op.operands = std::move(operands);
  op.numOuts = numOuts;
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

/// The error `a`'s op must be refused with, containing `message`.
void expectRefused(const ka::Artifact &a, const char *message) {
  Expected<StepOp> d = decodeOnly(a);
  ASSERT_FALSE(d) << message;
  EXPECT_NE(d.error().message().find(message), std::string::npos)
      << d.error().message();
}

/// router_partial over partial and residual [64], a `gate` weight
/// (binding 0), the norm [64] (binding 1) into output [out].
ka::Artifact routerPartial(ka::WeightBinding gate, int64_t out) {
  return withOp({std::move(gate), f32("ffn_norm.weight", {64})},
                {arena("p0", {64}), arena("x", {64}), weightBuffer("gate", 0),
                 weightBuffer("ffn_norm", 1), arena("p1", {out})},
                opOf("router_partial", {0, 1, 2, 3, 4},
                     {floatAttr("residual_scale", 0.25)}));
}

TEST(StepOps, RouterPartialDecodes) {
  Expected<StepOp> d =
      decodeOnly(routerPartial(f32("gate_inp.weight", {64, 16}), 16));
  ASSERT_TRUE(d) << d.error().message();
  EXPECT_EQ(d->kind, OpKind::RouterPartial);
  EXPECT_EQ(d->n, 64);
  EXPECT_EQ(d->experts, 16);
  EXPECT_EQ(d->residualScale, 0.25);
}

TEST(StepOps, RouterPartialRefusesBadShapes) {
  expectRefused(routerPartial(q8("gate_inp.weight", {64, 16}), 16),
                "must be an F32 [64, experts] weight");
  expectRefused(routerPartial(f32("gate_inp.weight", {32, 16}), 16),
                "must be an F32 [64, experts] weight");
  expectRefused(routerPartial(f32("gate_inp.weight", {64, 16}), 8),
                "must have the gate's 16 experts");
}

/// moe_choose of logits [experts] (with a bias [bias] when bias > 0) into
/// ids and weights [topK].
ka::Artifact moeChoose(int64_t experts, int64_t bias, int64_t topK) {
  ka::Buffer ids = arena("ids", {topK});
  ids.dtype = ka::DType::I32;
  std::vector<ka::Buffer> buffers = {arena("logits", {experts})};
  std::vector<int32_t> operands = {0};
  if (bias > 0) {
    operands.push_back(int32_t(buffers.size()));
    buffers.push_back(arena("bias", {bias}));
  }
  operands.push_back(int32_t(buffers.size()));
  buffers.push_back(ids);
  operands.push_back(int32_t(buffers.size()));
  buffers.push_back(arena("w", {topK}));
  return withOp({}, std::move(buffers),
                opOf("moe_choose", std::move(operands),
                     {intAttr("top_k", topK), stringAttr("gating", "sigmoid"),
                      intAttr("normalize", 1, ka::AttrKind::Bool),
                      floatAttr("routed_scale", 2.5)},
                     2));
}

TEST(StepOps, MoeChooseDecodes) {
  Expected<StepOp> d = decodeOnly(moeChoose(16, 16, 4));
  ASSERT_TRUE(d) << d.error().message();
  EXPECT_EQ(d->kind, OpKind::MoeChoose);
  EXPECT_EQ(d->experts, 16);
  EXPECT_EQ(d->topK, 4);
  EXPECT_TRUE(d->hasBias);
  EXPECT_FALSE(d->softmax);
  EXPECT_TRUE(d->normalize);
  EXPECT_EQ(d->routedScale, 2.5);
  Expected<StepOp> plain = decodeOnly(moeChoose(16, 0, 4));
  ASSERT_TRUE(plain) << plain.error().message();
  EXPECT_FALSE(plain->hasBias);
}

TEST(StepOps, MoeChooseRefusesBadShapes) {
  expectRefused(moeChoose(4, 0, 5), "top_k 5 is outside 1..4 experts");
  expectRefused(moeChoose(16, 8, 4), "bias 'bias' must have 16 values");
}

/// all_reduce_add_rms_norm with a router tail: partial [partial], residual,
/// sum and output [64], norm [64] (binding 0), logits [logits]; `tail`.
ka::Artifact allReduceTail(int64_t partial, int64_t logits, int64_t tail,
                           bool withLogits = true) {
  std::vector<ka::Buffer> buffers = {
      arena("p", {partial}), arena("x", {64}), weightBuffer("ffn_norm", 0),
      arena("h", {64}),      arena("y", {64}), arena("logits", {logits})};
  std::vector<int32_t> operands = {0, 1, 2, 3, 4};
  if (withLogits)
    operands.push_back(5);
  return withOp({f32("ffn_norm.weight", {64})}, std::move(buffers),
                opOf("all_reduce_add_rms_norm", std::move(operands),
                     {floatAttr("epsilon", 1e-5),
                      stringAttr("reduction", "sum"), intAttr("tail", tail)},
                     withLogits ? 3 : 2));
}

TEST(StepOps, AllReduceTailDecodes) {
  Expected<StepOp> d = decodeOnly(allReduceTail(80, 16, 16));
  ASSERT_TRUE(d) << d.error().message();
  EXPECT_EQ(d->kind, OpKind::AllReduceAddRmsNorm);
  EXPECT_EQ(d->n, 64);
  EXPECT_EQ(d->rows, 1);
  EXPECT_EQ(d->tail, 16);
  EXPECT_EQ(d->outs.size(), 3u);
}

/// all_reduce_add_rms_norm with a tail of 16 and the router's choice
/// (kiln-fuse-router-choice): allReduceTail's operands, then an optional
/// bias [16], ids [topK] (i32) and weights [weights].
ka::Artifact allReduceChoice(int64_t topK, bool bias, int64_t weights,
                             bool withTail = true) {
  ka::Buffer ids = arena("ids", {topK});
  ids.dtype = ka::DType::I32;
  std::vector<ka::Buffer> buffers = {arena("p", {withTail ? 80 : 64}),
                                     arena("x", {64}),
                                     weightBuffer("ffn_norm", 0),
                                     arena("h", {64}),
                                     arena("y", {64}),
                                     arena("logits", {16}),
                                     arena("bias", {16}),
                                     ids,
                                     arena("w", {weights})};
  std::vector<int32_t> operands = {0, 1, 2};
  if (bias)
    operands.push_back(6);
  for (int32_t o : {3, 4, 5, 7, 8})
    operands.push_back(o);
  std::vector<ka::Attr> attrs = {floatAttr("epsilon", 1e-5),
                                 stringAttr("reduction", "sum"),
                                 intAttr("top_k", topK),
                                 stringAttr("gating", "sigmoid"),
                                 intAttr("normalize", 1, ka::AttrKind::Bool),
                                 floatAttr("routed_scale", 2.5)};
  if (withTail)
    attrs.push_back(intAttr("tail", 16));
  return withOp({f32("ffn_norm.weight", {64})}, std::move(buffers),
                opOf("all_reduce_add_rms_norm", std::move(operands),
                     std::move(attrs), 5));
}

TEST(StepOps, AllReduceChoiceDecodes) {
  for (bool bias : {false, true}) {
    Expected<StepOp> d = decodeOnly(allReduceChoice(4, bias, 4));
    ASSERT_TRUE(d) << d.error().message();
    EXPECT_EQ(d->kind, OpKind::AllReduceAddRmsNorm);
    EXPECT_TRUE(d->hasChoice);
    EXPECT_EQ(d->hasBias, bias);
    EXPECT_EQ(d->tail, 16);
    EXPECT_EQ(d->experts, 16);
    EXPECT_EQ(d->topK, 4);
    EXPECT_TRUE(d->normalize);
    EXPECT_EQ(d->routedScale, 2.5);
    EXPECT_EQ(d->ins.size(), bias ? 4u : 3u);
    EXPECT_EQ(d->outs.size(), 5u);
  }
  Expected<StepOp> plain = decodeOnly(allReduceTail(80, 16, 16));
  ASSERT_TRUE(plain) << plain.error().message();
  EXPECT_FALSE(plain->hasChoice);
}

TEST(StepOps, AllReduceChoiceRefusesBadShapes) {
  expectRefused(allReduceChoice(20, true, 20),
                "top_k 20 is outside 1..16 experts");
  expectRefused(allReduceChoice(4, true, 3), "weights must have top_k values");
  expectRefused(allReduceChoice(4, false, 4, /*withTail=*/false),
                "a choice (top_k) needs a tail");
}

/// linear_router: input [k], the weight [k, 64] (binding 0), residual [64],
/// gate F32 [64, 8] (binding 1), norm [64] (binding 2, or an arena buffer
/// when `normBuffer`), output [out]; `ranks`.
ka::Artifact linearRouter(int64_t k, int64_t out, int64_t ranks,
                          bool normBuffer = false) {
  return withOp(
      {q8("attn_output.weight", {32, 64}), f32("gate.weight", {64, 8}),
       f32("ffn_norm.weight", {64})},
      {arena("o", {k}), weightBuffer("attn_output", 0), arena("x", {64}),
       weightBuffer("gate", 1),
       normBuffer ? arena("norm", {64}) : weightBuffer("ffn_norm", 2),
       arena("out", {out})},
      opOf("linear_router", {0, 1, 2, 3, 4, 5}, {intAttr("ranks", ranks)}));
}

TEST(StepOps, LinearRouterDecodes) {
  Expected<StepOp> d = decodeOnly(linearRouter(32, 72, 1));
  ASSERT_TRUE(d) << d.error().message();
  EXPECT_EQ(d->kind, OpKind::LinearRouter);
  EXPECT_EQ(d->n, 64);
  EXPECT_EQ(d->k, 32);
  EXPECT_EQ(d->experts, 8);
  EXPECT_EQ(d->ranks, 1);
  EXPECT_EQ(d->rows, 1);
}

TEST(StepOps, LinearRouterRefusesBadShapes) {
  expectRefused(linearRouter(16, 72, 1),
                "must be a vector of the weight's 32 values a row");
  expectRefused(linearRouter(32, 64, 1),
                "must hold the 64 rows and the gate's 8 experts");
  expectRefused(linearRouter(32, 72, 2), "ranks 2 must be the group's 1");
  expectRefused(linearRouter(32, 72, 1, /*normBuffer=*/true),
                "must be an F32 weight (read at load)");
}

TEST(StepOps, AllReduceTailRefusesBadShapes) {
  expectRefused(allReduceTail(64, 16, 16),
                "must hold the sum's 64 values and the tail's 16, has 64");
  expectRefused(allReduceTail(80, 8, 16), "must have the tail's 16 values");
  expectRefused(allReduceTail(80, 16, 16, /*withLogits=*/false),
                "expects 3 inputs and 3 outputs");
  expectRefused(allReduceTail(64, 16, 0), "tail must be positive");
}

/// all_reduce_add: partial [rows, n], residual [residual], sum [rows, n];
/// `reduction`.
ka::Artifact allReduceAdd(int64_t rows, int64_t n, int64_t residual,
                          std::string reduction = "sum") {
  return withOp(
      {},
      {arena("p", {rows, n}), arena("x", {residual}), arena("h", {rows, n})},
      opOf("all_reduce_add", {0, 1, 2},
           {stringAttr("reduction", std::move(reduction))}));
}

TEST(StepOps, AllReduceAddDecodes) {
  Expected<StepOp> d = decodeOnly(allReduceAdd(1, 64, 64));
  ASSERT_TRUE(d) << d.error().message();
  EXPECT_EQ(d->kind, OpKind::AllReduceAdd);
  EXPECT_EQ(d->n, 64);
  EXPECT_EQ(d->rows, 1);
  EXPECT_TRUE(d->sum);
  EXPECT_EQ(d->ins.size(), 2u);
  EXPECT_EQ(d->outs.size(), 1u);
}

TEST(StepOps, AllReduceAddRefusesBadShapes) {
  expectRefused(allReduceAdd(1, 64, 32), "'x' and 'h' differ in shape");
  expectRefused(allReduceAdd(1, 64, 64, "max"), "reduction must be 'sum'");
}

/// rms_norm_router: input and output [64], norm [norm] (binding 0), an
/// F32 gate [64, 16] (binding 1); ids and weights [4].
ka::Artifact rmsNormRouter(int64_t norm, int64_t output) {
  return withOp(
      {f32("ffn_norm.weight", {norm}), f32("ffn_gate_inp.weight", {64, 16})},
      {arena("h", {64}), weightBuffer("ffn_norm", 0), weightBuffer("gate", 1),
       arena("y", {output}), arena("ids", {4}), arena("w", {4})},
      opOf("rms_norm_router", {0, 1, 2, 3, 4, 5},
           {floatAttr("epsilon", 1e-5), intAttr("top_k", 4),
            stringAttr("gating", "sigmoid"),
            intAttr("normalize", 1, ka::AttrKind::Bool),
            floatAttr("routed_scale", 2.5)},
           3));
}

TEST(StepOps, RmsNormRouterDecodes) {
  ka::Artifact a = rmsNormRouter(64, 64);
  a.rankPlans[0].steps[0].buffers[4].dtype = ka::DType::I32;
  Expected<StepOp> d = decodeOnly(a);
  ASSERT_TRUE(d) << d.error().message();
  EXPECT_EQ(d->kind, OpKind::RmsNormRouter);
  EXPECT_EQ(d->k, 64);
  EXPECT_EQ(d->experts, 16);
  EXPECT_EQ(d->topK, 4);
  EXPECT_FALSE(d->hasBias);
  EXPECT_FLOAT_EQ(float(d->epsilon), 1e-5f);
}

TEST(StepOps, RmsNormRouterRefusesBadShapes) {
  ka::Artifact norm = rmsNormRouter(32, 64), output = rmsNormRouter(64, 32);
  for (ka::Artifact *a : {&norm, &output})
    a->rankPlans[0].steps[0].buffers[4].dtype = ka::DType::I32;
  expectRefused(norm, "norm");
  expectRefused(output, "'h' and 'y' differ in shape");
}

/// The file rows a binding of a [2, 12] f32 tensor (value = 100 * row +
/// column) holds, read back from sliceWeight's gather.
std::vector<int> gatheredRows(const ka::WeightBinding &b) {
  std::vector<float> file(24);
  for (int r = 0; r < 12; ++r)
    for (int c = 0; c < 2; ++c)
      file[size_t(r * 2 + c)] = float(100 * r + c);
  std::vector<std::vector<uint8_t>> store;
  Expected<HostWeight> w =
      sliceWeight(b, {file.data(), file.size() * sizeof(float)}, store);
  EXPECT_TRUE(bool(w)) << (w ? "" : w.error().message());
  std::vector<int> rows;
  if (!w)
    return rows;
  EXPECT_EQ(w->dims, ka::localDims(b));
  const float *v = reinterpret_cast<const float *>(w->data);
  for (int64_t r = 0; r < w->rows(); ++r) {
    EXPECT_EQ(v[2 * r + 1], v[2 * r] + 1) << "row " << r << " torn";
    rows.push_back(int(v[2 * r]) / 100);
  }
  return rows;
}

TEST(SliceWeight, RowCutOfEveryPeriod) {
  // Heads of 3 rows, rows 1 to 3 of each: the file's 1, 2, 4, 5, ...
  ka::WeightBinding b = f32("w", {2, 12});
  b.rowPeriod = 3;
  b.rowBegin = 1;
  b.rowEnd = 3;
  EXPECT_EQ(gatheredRows(b), (std::vector<int>{1, 2, 4, 5, 7, 8, 10, 11}));
}

TEST(SliceWeight, RowCutOfARanksPart) {
  // Rank 1 of 2 holds rows 6 .. 11 (heads 2 and 3); of each head's 3 rows
  // the first: file rows 6 and 9.
  ka::WeightBinding b = f32("w", {2, 12});
  b.sliceDim = 1;
  b.sliceBegin = 6;
  b.sliceEnd = 12;
  b.rowPeriod = 3;
  b.rowBegin = 0;
  b.rowEnd = 1;
  EXPECT_EQ(gatheredRows(b), (std::vector<int>{6, 9}));
  // Two groups of 6 (gate, up), rank 0 takes 0 .. 3 of each: rows 0, 1, 2
  // and 6, 7, 8; then rows 2 to 3 of every 3: 2 and 8.
  b.sliceGroups = 2;
  b.sliceBegin = 0;
  b.sliceEnd = 3;
  b.rowBegin = 2;
  b.rowEnd = 3;
  EXPECT_EQ(gatheredRows(b), (std::vector<int>{2, 8}));
}

TEST(SliceWeight, ValidateRefusesABadRowCut) {
  ka::Artifact a;
  a.target = "cpu";
  a.ranks = 1;
  a.rankPlans.resize(1);
  a.weights.push_back(f32("w", {2, 12}));
  ASSERT_TRUE(bool(ka::validate(a, "a.kiln")));
  a.weights[0].rowPeriod = 5; // does not divide 12 rows
  a.weights[0].rowEnd = 2;
  Status st = ka::validate(a, "a.kiln");
  ASSERT_FALSE(bool(st));
  EXPECT_NE(st.error().message().find(
                "weights[0] (w): has rows 0 to 2 of every 5, not a cut of "
                "whole periods of its 12 rows"),
            std::string::npos)
      << st.error().message();
  a.weights[0].rowPeriod = 4;
  a.weights[0].rowEnd = 5; // past its period
  EXPECT_FALSE(bool(ka::validate(a, "a.kiln")));
}

// firstInputsOwned: an all-reduce's input that it and its producer alone
// touch (the CUDA backend's direct slots place such inputs in its
// exchange). Buffers 0 a, 1 p, 2 r, 3 o; op 0 writes p from a, op 1 (the
// call) reads p and r and writes o; each case changes one thing.
struct OwnedStep {
  ka::Step step;
  std::vector<StepOp> ops;
  OwnedStep() {
    for (const char *n : {"a", "p", "r", "o"})
      step.buffers.push_back(arena(n, {64}));
    ops.push_back(stepOp({0}, {1}));
    ops.push_back(stepOp({1, 2}, {3}));
  }
  static StepOp stepOp(std::vector<int32_t> ins, std::vector<int32_t> outs) {
    StepOp op;
    op.ins = std::move(ins);
    op.outs = std::move(outs);
    return op;
  }
  bool owned(std::vector<int32_t> calls = {1}) const {
    std::vector<bool> got = firstInputsOwned(step, ops, calls);
    EXPECT_EQ(got.size(), calls.size());
    return !got.empty() && got[0];
  }
};

TEST(FirstInputsOwned, ProducerAndCallAlone) {
  OwnedStep s;
  EXPECT_TRUE(s.owned());
  // Op 0's input a has no producer: not owned.
  EXPECT_EQ(firstInputsOwned(s.step, s.ops, {1, 0}),
            (std::vector<bool>{true, false}));
}

TEST(FirstInputsOwned, ReadByAnotherOp) {
  OwnedStep s;
  s.ops.push_back(OwnedStep::stepOp({1}, {0}));
  EXPECT_FALSE(s.owned());
}

/// Buffer 4 a view of `first`, buffer 5 a view of buffer 4.
void viewChain(OwnedStep &s, int32_t first) {
  ka::Buffer v = arena("v", {32});
  v.kind = ka::BufferKind::View;
  v.base = first;
  s.step.buffers.push_back(v);
  v.base = 4;
  s.step.buffers.push_back(v);
}

TEST(FirstInputsOwned, AliasedByAViewOrAViewOfOne) {
  OwnedStep direct;
  viewChain(direct, 1); // 5 -> 4 -> p
  EXPECT_FALSE(direct.owned());
  OwnedStep other;
  viewChain(other, 3); // 5 -> 4 -> o: p unaliased
  EXPECT_TRUE(other.owned());
  OwnedStep isView;
  isView.step.buffers.push_back(arena("whole", {128})); // 4
  isView.step.buffers[1].kind = ka::BufferKind::View;   // p a view of it
  isView.step.buffers[1].base = 4;
  EXPECT_FALSE(isView.owned());
}

TEST(FirstInputsOwned, ProducerReadsOrWritesTwice) {
  OwnedStep s;
  s.ops[0].ins.push_back(1); // accumulates into p
  EXPECT_FALSE(s.owned());
  OwnedStep t;
  t.ops.insert(t.ops.begin(), OwnedStep::stepOp({0}, {1})); // p written twice
  EXPECT_FALSE(t.owned({2}));
  OwnedStep u;
  u.ops[1].outs.push_back(1); // the call writes its input too
  EXPECT_FALSE(u.owned());
}

TEST(FirstInputsOwned, NotArenaOrNotProducedBefore) {
  OwnedStep s;
  s.step.buffers[1].kind = ka::BufferKind::Input;
  EXPECT_FALSE(s.owned());
  OwnedStep t;
  std::swap(t.ops[0], t.ops[1]); // the call first, p written after it
  EXPECT_FALSE(t.owned({0}));
  OwnedStep u;
  EXPECT_FALSE(u.owned({7})); // no such op: false, no crash
  EXPECT_FALSE(u.owned({-1}));
  u.ops[1].ins[0] = 99; // no such buffer
  EXPECT_FALSE(u.owned());
}

} // namespace
