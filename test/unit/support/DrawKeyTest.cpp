//===- DrawKeyTest.cpp - The step's draw: its logarithm and its distribution
//===//
//
// DrawKey.h's argmax of keys must be a draw from softmax(logits / T): its
// frequencies over many positions are compared with the softmax by a
// chi-square statistic. Its logarithm is compared with the C library's in
// double. The bits the CPU and the GPU share are compared with numpy's
// float32 in test_draw.py.
//
//===----------------------------------------------------------------------===//
#include "support/DrawKey.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

using namespace kiln::draw;

namespace {

TEST(DrawKey, LogIsCloseToTheLibrarys) {
  // Every argument the draw takes: U in [2^-24, 1) and -ln U in (0, 16.7],
  // swept by a fixed multiplicative step, plus the ends and powers of two.
  std::vector<float> xs = {0x1p-24f, 1.0f - 0x1p-24f, 1.0f,        0.5f,
                           2.0f,     1.41421354f,     1.41421366f, 16.635532f};
  for (double x = 0x1p-24; x < 17.0; x *= 1.0001)
    xs.push_back(float(x));
  double worst = 0;
  for (float x : xs) {
    const double want = std::log(double(x));
    const double got = drawLog(x);
    // The series' truncation (below 8e-10) and a few float roundings of the
    // result's size: 3 ulps of max(|ln x|, 2^-24 ... ) relative, which is
    // 3 x 2^-24 |ln x| plus 2^-24 times ln 2 for the exponent's part.
    const double bound = 3 * 0x1p-24 * std::fabs(want) + 1e-9;
    worst = std::max(worst, std::fabs(got - want) / (std::fabs(want) + 1e-30));
    ASSERT_LE(std::fabs(got - want), bound) << "x = " << x;
  }
  std::printf("drawLog: %zu arguments, worst relative error %.3g\n", xs.size(),
              worst);
}

TEST(DrawKey, UniformIsInsideTheOpenInterval) {
  EXPECT_EQ(drawUniform(0), 0x1p-24f);
  EXPECT_EQ(drawUniform(0xffffffffu), 1.0f - 0x1p-24f);
  EXPECT_GT(gumbel(0xffffffffu), -3.0f); // -ln(-ln(1 - 2^-24)) = 16.6
  EXPECT_LT(gumbel(0), -2.0f);           // -ln(-ln 2^-24) = -2.81
}

TEST(DrawKey, WordsOutsideTheRangeAreRefused) {
  auto words = [](float t, int32_t last) {
    std::vector<int32_t> w = {int32_t(floatBits(t)), 7, 9, last};
    return w;
  };
  int bad = -1;
  EXPECT_TRUE(validWords(words(0.0f, 0).data(), bad));
  EXPECT_TRUE(validWords(words(-0.0f, 0).data(), bad)); // -0 == 0
  EXPECT_TRUE(validWords(words(0x1p-16f, 0).data(), bad));
  EXPECT_TRUE(validWords(words(0x1p16f, 0).data(), bad));
  for (float t : {-1.0f, 0x1p-17f, 0x1p17f, INFINITY, NAN}) {
    bad = -1;
    EXPECT_FALSE(validWords(words(t, 0).data(), bad)) << t;
    EXPECT_EQ(bad, 0) << t;
  }
  bad = -1;
  EXPECT_FALSE(validWords(words(1.0f, 1).data(), bad));
  EXPECT_EQ(bad, 3);
  const int32_t seeded[4] = {0, int32_t(0x89abcdefu), 0x01234567, 0};
  EXPECT_EQ(drawSeed(seeded), 0x0123456789abcdefull);
}

/// Chi-square of `counts` against `probabilities` over `draws`.
double chiSquare(const std::vector<int64_t> &counts,
                 const std::vector<double> &probabilities, int64_t draws) {
  double chi = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double expected = probabilities[i] * double(draws);
    chi += (double(counts[i]) - expected) * (double(counts[i]) - expected) /
           expected;
  }
  return chi;
}

TEST(DrawKey, ArgmaxOfKeysFollowsTheSoftmax) {
  // Six logits, spread so that every token is expected at least ~1,800
  // times; one draw per position, under a seed printed for reproduction.
  const std::vector<float> logits = {1.0f, -0.5f, 2.0f, 0.25f, 2.0f, -1.5f};
  const int64_t draws = 120000;
  for (float t : {0.7f, 1.0f, 1.6f}) {
    for (uint64_t seed : {1ull, 0xfeedfacecafebeefull}) {
      std::vector<double> p(logits.size());
      double sum = 0;
      for (size_t i = 0; i < logits.size(); ++i)
        sum += p[i] = std::exp(double(logits[i]) / double(t));
      for (double &v : p)
        v /= sum;
      std::vector<int64_t> counts(logits.size(), 0);
      // Parts of 2 and 4 tokens with their bases, as two ranks take them:
      // each part's best key, the later part winning only when larger.
      for (int64_t position = 0; position < draws; ++position) {
        float first = 0, second = 0;
        const int64_t a = bestKey(logits.data(), 2, 0, 1.0f / t, seed,
                                  uint32_t(position), first);
        const int64_t b = bestKey(logits.data() + 2, 4, 2, 1.0f / t, seed,
                                  uint32_t(position), second);
        float whole = 0;
        const int64_t w = bestKey(logits.data(), 6, 0, 1.0f / t, seed,
                                  uint32_t(position), whole);
        const int64_t split = second > first ? 2 + b : a;
        ASSERT_EQ(split, w) << "position " << position;
        ++counts[size_t(w)];
      }
      const double chi = chiSquare(counts, p, draws);
      std::printf("T = %g, seed %#llx: chi-square %.2f (5 degrees)\n", t,
                  (unsigned long long)seed, chi);
      // 5 degrees of freedom: P(chi-square > 25.7) = 1e-4, so a correct
      // draw fails one of these six runs about once in 1,700; a Gumbel of
      // the wrong sign or scale, or a hash with structure, gives hundreds.
      EXPECT_LT(chi, 25.7) << "T = " << t << ", seed " << seed;
    }
  }
}

TEST(DrawKey, PositionsAndSeedsGiveOtherDraws) {
  // The same logits at two positions, or under two seeds, are
  // independent draws: over 2,000 pairs of a flat 64-token distribution,
  // equal picks should be ~1/64 of them.
  std::vector<float> flat(64, 0.0f);
  int sameAcrossPositions = 0, sameAcrossSeeds = 0;
  for (uint32_t p = 0; p < 2000; ++p) {
    float k;
    const int64_t here = bestKey(flat.data(), 64, 0, 1.0f, 5, p, k);
    sameAcrossPositions +=
        here == bestKey(flat.data(), 64, 0, 1.0f, 5, p + 1, k);
    sameAcrossSeeds += here == bestKey(flat.data(), 64, 0, 1.0f, 6, p, k);
  }
  // Binomial(2000, 1/64): mean 31, sd 5.5; 70 is 7 sd above.
  EXPECT_LT(sameAcrossPositions, 70);
  EXPECT_LT(sameAcrossSeeds, 70);
}

} // namespace
