//===- SamplerTest.cpp - The sampler's order of tokens
//---------------------===//
//
// The sampler walks the tokens most likely first, ties to the lower id;
// its radix sort must give exactly the order a stable comparison sort by
// logit gives (so that a seed picks the same token as before), on seeded
// random logits with ties, infinities and both zeros, with and without a
// mask; and a sampled choice must follow the probabilities.
//
//===----------------------------------------------------------------------===//
#include "session/Sampler.h"

#include "support/Random.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

using namespace kiln;
using namespace kiln::runtime;

namespace {

/// The token a walk over `order` picks for u in [0, 1), as Sampler does
/// (probabilities exp((l - top) / T), summed in the walk's order).
int32_t pick(const std::vector<float> &logits, std::vector<int32_t> order,
             double t, double u) {
  double top = logits[size_t(order[0])], sum = 0;
  std::vector<double> p;
  for (int32_t i : order)
    sum += p.emplace_back(std::exp((logits[size_t(i)] - top) / t));
  u *= sum;
  for (size_t i = 0; i < order.size(); ++i) {
    if (u < p[i])
      return order[i];
    u -= p[i];
  }
  return order.back();
}

} // namespace

TEST(Sampler, SameChoiceAsTheComparisonOrder) {
  const uint64_t seed = 77;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  Rng rng(seed);
  const float inf = std::numeric_limits<float>::infinity();
  for (int round = 0; round < 200; ++round) {
    // The last rounds at GLM-5's vocabulary size: the radix sort.
    const size_t n = round < 197 ? 2 + rng.below(300) : 154880 - size_t(round);
    std::vector<float> logits(n);
    for (float &l : logits) {
      switch (rng.below(8)) {
      case 0: // ties
        l = float(int(rng.below(5)) - 2);
        break;
      case 1:
        l = rng.below(2) ? 0.0f : -0.0f;
        break;
      case 2:
        l = -inf;
        break;
      default:
        l = float(rng.normal() * 4);
      }
    }
    std::vector<uint8_t> allowed;
    if (round % 3 == 1) {
      allowed.resize(n);
      for (auto &a : allowed)
        a = rng.below(3) != 0;
      allowed[rng.below(n)] = 1;
    }
    // The reference: a stable sort by logit of the allowed ids.
    std::vector<int32_t> order;
    for (size_t i = 0; i < n; ++i)
      if (allowed.empty() || allowed[i])
        order.push_back(int32_t(i));
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return logits[size_t(a)] > logits[size_t(b)];
    });
    if (std::isinf(logits[size_t(order[0])]))
      continue; // no token has a finite logit: nothing to compare
    SamplingOptions o;
    o.temperature = 0.7 + double(round % 5) / 2;
    o.seed = seed + uint64_t(round);
    Sampler s(o);
    Rng draws(o.seed); // the sampler's own stream: one draw a choice
    for (int k = 0; k < 5; ++k) {
      const double u = draws.uniform();
      EXPECT_EQ(s.sample(logits, {}, allowed),
                pick(logits, order, o.temperature, u))
          << "round " << round << " draw " << k;
    }
  }
}

TEST(Sampler, ChoicesFollowTheProbabilities) {
  // Three tokens with probabilities 1/2, 1/3, 1/6 at T = 1: 60,000 draws
  // within 4 standard deviations of each (binomial).
  const std::vector<float> logits = {float(std::log(3.0)), float(std::log(2.0)),
                                     0.0f};
  SamplingOptions o;
  o.temperature = 1;
  o.seed = 5;
  Sampler s(o);
  std::vector<int> counts(3, 0);
  const int n = 60000;
  for (int i = 0; i < n; ++i)
    ++counts[size_t(s.sample(logits))];
  const double p[3] = {0.5, 1.0 / 3, 1.0 / 6};
  for (int i = 0; i < 3; ++i)
    EXPECT_NEAR(counts[size_t(i)], n * p[i],
                4 * std::sqrt(n * p[i] * (1 - p[i])))
        << i;
}
