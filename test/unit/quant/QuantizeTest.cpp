//===- QuantizeTest.cpp - Quantisers, size errors and scale checks --------===//
#include "quant/QuantFormats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

using namespace kiln;

namespace {

constexpr uint32_t kSeed = 20250601;

/// Gaussian test data from a seeded Mersenne twister (Box-Muller written
/// out, since std::normal_distribution differs between standard libraries).
std::vector<float> gaussian(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; i += 2) {
    double u1 = (gen() + 1.0) / 4294967297.0, u2 = gen() / 4294967296.0;
    double r = std::sqrt(-2 * std::log(u1));
    out[i] = static_cast<float>(r * std::cos(2 * M_PI * u2));
    if (i + 1 < n)
      out[i + 1] = static_cast<float>(r * std::sin(2 * M_PI * u2));
  }
  return out;
}

/// Quantises then dequantises `x`; fails the test on any error.
std::vector<float> roundTrip(GGMLType type, const std::vector<float> &x) {
  std::vector<uint8_t> blocks(*rowBytes(type, x.size()));
  std::vector<float> y(x.size());
  Status q = quantize(type, x, blocks);
  EXPECT_TRUE(q.isOk()) << (q ? "" : q.error().message());
  EXPECT_TRUE(blockScalesFinite(type, blocks));
  Status d = dequantize(type, blocks, y);
  EXPECT_TRUE(d.isOk()) << (d ? "" : d.error().message());
  return y;
}

double relativeRms(const std::vector<float> &x, const std::vector<float> &y) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err +=
        (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
    norm += static_cast<double>(x[i]) * x[i];
  }
  return std::sqrt(err / norm);
}

struct Bound {
  GGMLType type;
  double rms; // Relative RMS error bound on N(0,1) data (see docs/quant.md).
};
// The measured errors plus about 30%: near the uniform-quantiser floor, so
// a broken scale search fails.
const Bound kBounds[] = {
    {GGMLType::F32, 0.0},     {GGMLType::F16, 3e-4},
    {GGMLType::BF16, 2.5e-3}, {GGMLType::Q8_0, 0.007},
    {GGMLType::Q6_K, 0.022},  {GGMLType::Q5_K, 0.045},
    {GGMLType::Q5_0, 0.05},   {GGMLType::Q5_1, 0.045},
    {GGMLType::Q4_K, 0.09},   {GGMLType::IQ4_NL, 0.09},
    {GGMLType::IQ4_XS, 0.09}, {GGMLType::Q4_0, 0.11},
    {GGMLType::Q4_1, 0.09},   {GGMLType::Q3_K, 0.19},
    {GGMLType::Q2_K, 0.34},
};

} // namespace

TEST(Quantize, SupportedTypes) {
  for (const Bound &b : kBounds) {
    EXPECT_TRUE(canQuantize(b.type)) << nameOf(b.type);
    EXPECT_TRUE(canDequantize(b.type)) << nameOf(b.type);
  }
  EXPECT_FALSE(canDequantize(GGMLType::IQ2_XXS));
  EXPECT_FALSE(canDequantize(GGMLType::MXFP4));
  EXPECT_FALSE(canQuantize(GGMLType::IQ2_XXS));
}

// Values that lie exactly on a Q2_K / Q3_K grid (integer levels times
// integer sub-block scales, d = dmin = 1, the largest scale and min at the
// top of their 4- or 6-bit range so the super-scale search lands on 1) must
// come back exactly: a level, scale or min packed into the wrong bits fails.
TEST(Quantize, LowBitKQuantsKeepValuesOnTheirGrid) {
  std::mt19937 gen(kSeed + 3);
  std::vector<float> q2(256), q3(256);
  for (int k = 0; k < 16; ++k) {
    int sc = k == 0 ? 15 : 1 + static_cast<int>(gen() % 15);
    int mn = k == 1 ? 15 : static_cast<int>(gen() % 16);
    int s3 = k == 2 ? 31 : static_cast<int>(gen() % 61) - 30;
    if (s3 == 0)
      s3 = 7;
    for (int t = 0; t < 16; ++t) {
      // Each sub-block uses its lowest and highest level at least once, so
      // the fits see its full range.
      int l2 = t == 0 ? 0 : t == 1 ? 3 : static_cast<int>(gen() % 4);
      int l3 = t == 0 ? -4 : t == 1 ? 3 : static_cast<int>(gen() % 8) - 4;
      q2[16 * k + t] = static_cast<float>(sc * l2 - mn);
      q3[16 * k + t] = static_cast<float>(s3 * l3);
    }
  }
  EXPECT_EQ(roundTrip(GGMLType::Q2_K, q2), q2);
  EXPECT_EQ(roundTrip(GGMLType::Q3_K, q3), q3);
}

TEST(Quantize, GaussianErrorWithinBounds) {
  std::printf("seed %u\n", kSeed);
  std::vector<float> x = gaussian(256 * 32, kSeed);
  for (const Bound &b : kBounds) {
    double err = relativeRms(x, roundTrip(b.type, x));
    std::printf("%s: relative RMS error %.5f (bound %g)\n",
                std::string(nameOf(b.type)).c_str(), err, b.rms);
    EXPECT_LE(err, b.rms) << nameOf(b.type);
  }
}

TEST(Quantize, ZerosAndConstants) {
  for (const Bound &b : kBounds) {
    SCOPED_TRACE(std::string(nameOf(b.type)));
    std::vector<float> zeros(512, 0.0f);
    for (float v : roundTrip(b.type, zeros))
      ASSERT_EQ(v, 0.0f);
    for (float c : {0.37f, -2.5f, 1e-3f}) {
      std::vector<float> y = roundTrip(b.type, std::vector<float>(512, c));
      for (float v : y)
        ASSERT_NEAR(v, c, 0.02 * std::fabs(c)) << "constant " << c;
    }
  }
}

TEST(Quantize, HugeValuesGiveFiniteScales) {
  // 1e6 is beyond fp16; the scale fields must clamp, not overflow.
  std::vector<float> x = gaussian(512, kSeed + 1);
  for (float &v : x)
    v *= 1e6f;
  for (const Bound &b : kBounds) {
    if (b.type == GGMLType::F16)
      continue; // A plain F16 tensor rounds 1e6 to infinity, as IEEE says.
    std::vector<float> y = roundTrip(b.type, x);
    for (float v : y)
      ASSERT_TRUE(std::isfinite(v)) << nameOf(b.type);
  }
}

TEST(Quantize, Deterministic) {
  std::vector<float> x = gaussian(512, kSeed + 2);
  std::vector<uint8_t> a(*rowBytes(GGMLType::Q4_K, 512)), b(a.size());
  ASSERT_TRUE(quantize(GGMLType::Q4_K, x, a).isOk());
  ASSERT_TRUE(quantize(GGMLType::Q4_K, x, b).isOk());
  EXPECT_EQ(a, b);
}

TEST(Quantize, NonFiniteInputIsAnError) {
  std::vector<float> x(32, 1.0f);
  x[7] = std::numeric_limits<float>::infinity();
  std::vector<uint8_t> blocks(34);
  Status s = quantize(GGMLType::Q8_0, x, blocks);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.error().message().find("Q8_0: value 7 is not finite"),
            std::string::npos)
      << s.error().message();
}

TEST(Sizes, Errors) {
  std::vector<uint8_t> blocks(144);
  std::vector<float> out(256);
  EXPECT_TRUE(dequantize(GGMLType::Q4_K, blocks, out).isOk());

  std::vector<float> ragged(100);
  Status s = dequantize(GGMLType::Q4_K, blocks, ragged);
  ASSERT_FALSE(s.isOk());
  EXPECT_EQ(s.error().message(),
            "Q4_K: 100 values is not a multiple of the block size 256");

  std::vector<uint8_t> shortBlocks(143);
  s = dequantize(GGMLType::Q4_K, shortBlocks, out);
  ASSERT_FALSE(s.isOk());
  EXPECT_EQ(s.error().message(), "Q4_K: 256 values take 144 bytes, got 143");

  s = quantize(GGMLType::Q6_K, out, blocks);
  ASSERT_FALSE(s.isOk());
  EXPECT_EQ(s.error().message(), "Q6_K: 256 values take 210 bytes, got 144");

  s = dequantize(GGMLType::IQ2_XXS, std::vector<uint8_t>(66), out);
  ASSERT_FALSE(s.isOk());
  EXPECT_EQ(s.error().message(), "unsupported type IQ2_XXS");
  std::vector<uint8_t> iq2(66);
  s = quantize(GGMLType::IQ2_XXS, out, iq2);
  ASSERT_FALSE(s.isOk());
  EXPECT_EQ(s.error().message(), "unsupported type IQ2_XXS for quantisation");

  // Empty input is zero blocks, not an error.
  EXPECT_TRUE(dequantize(GGMLType::Q4_K, {}, {}).isOk());
}

TEST(ScalesFinite, FindsFirstBadBlock) {
  // Three Q6_K blocks (d at byte 208); the second and third get inf / NaN.
  std::vector<uint8_t> blocks(3 * 210, 0);
  uint64_t bad = 99;
  EXPECT_TRUE(blockScalesFinite(GGMLType::Q6_K, blocks, &bad));
  EXPECT_EQ(bad, 99u);
  blocks[210 + 208] = 0x00, blocks[210 + 209] = 0x7C; // +inf
  blocks[420 + 208] = 0x01, blocks[420 + 209] = 0x7E; // NaN
  EXPECT_FALSE(blockScalesFinite(GGMLType::Q6_K, blocks, &bad));
  EXPECT_EQ(bad, 1u);

  // Q4_K's dmin (bytes 2-3) counts as well as d.
  std::vector<uint8_t> q4k(144, 0);
  q4k[3] = 0xFC; // dmin = -inf
  EXPECT_FALSE(blockScalesFinite(GGMLType::Q4_K, q4k, &bad));
  EXPECT_EQ(bad, 0u);

  // Plain floats check every value; integer types have no scales.
  std::vector<uint8_t> f32 = {0, 0, 0x80, 0x3F, 0, 0, 0xC0, 0x7F};
  EXPECT_FALSE(blockScalesFinite(GGMLType::F32, f32, &bad));
  EXPECT_EQ(bad, 1u);
  EXPECT_TRUE(blockScalesFinite(GGMLType::I32, f32));
}
