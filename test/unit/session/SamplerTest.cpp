//===- SamplerTest.cpp - The sampler's distribution and draws -------------===//
//
// The sampler weighs tokens by its own float exponential and orders only
// what a cut needs; what it draws from must be the distribution the plain
// definition gives: every allowed token sorted by logit (ties to the lower
// id), probabilities e^((l - top) / T) in double, then top-k, min-p and
// top-p in that order, renormalised. Checked on seeded random logits with
// ties, infinities and both zeros, with and without a mask, at small sizes
// and at GLM-5's vocabulary (its radix sort), and its draws must follow
// the probabilities it reports.
//
//===----------------------------------------------------------------------===//
#include "session/Sampler.h"

#include "support/DrawKey.h"
#include "support/Random.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <vector>

using namespace kiln;
using namespace kiln::runtime;

namespace {

/// The plain definition: token -> probability; `ambiguous` is set where a
/// cut's boundary lies within rounding of a token (the float weights may
/// then keep one token more or fewer than double arithmetic does).
std::map<int32_t, double> reference(const std::vector<float> &logits,
                                    const std::vector<uint8_t> &allowed,
                                    const SamplingOptions &o, bool &ambiguous) {
  ambiguous = false;
  std::vector<int32_t> order;
  for (size_t i = 0; i < logits.size(); ++i)
    if (allowed.empty() || allowed[i])
      order.push_back(int32_t(i));
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)];
  });
  const double top = logits[size_t(order[0])];
  // A token more than 87 temperatures below the best (a weight under
  // e^-87, 1.6e-38) has none: the sampler's stated range.
  std::vector<double> p;
  for (int32_t i : order) {
    const double x = (logits[size_t(i)] - top) / o.temperature;
    if (std::abs(x + 87) < 1e-3)
      ambiguous = true;
    if (x < -87)
      break;
    p.push_back(std::exp(x));
  }
  order.resize(p.size());
  size_t keep = p.size();
  if (o.topK > 0)
    keep = std::min(keep, size_t(o.topK));
  if (o.minP > 0) {
    size_t kept = 1;
    while (kept < keep && p[kept] >= o.minP * p[0])
      ++kept;
    for (size_t i = 0; i < keep; ++i)
      if (std::abs(p[i] - o.minP) <= 1e-5 * o.minP)
        ambiguous = true;
    keep = kept;
  }
  if (o.topP < 1) {
    double sum = 0, mass = 0;
    for (size_t i = 0; i < keep; ++i)
      sum += p[i];
    for (size_t i = 0; i < keep; ++i) {
      mass += p[i] / sum;
      if (std::abs(mass - o.topP) <= 1e-5)
        ambiguous = true;
      if (mass >= o.topP) {
        keep = i + 1;
        break;
      }
    }
  }
  std::map<int32_t, double> out;
  double sum = 0;
  for (size_t i = 0; i < keep; ++i)
    sum += p[i];
  for (size_t i = 0; i < keep; ++i)
    out[order[i]] = p[i] / sum;
  return out;
}

} // namespace

TEST(Sampler, DistributionIsThePlainDefinition) {
  const uint64_t seed = 77;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  Rng rng(seed);
  const float inf = std::numeric_limits<float>::infinity();
  int compared = 0, skipped = 0;
  for (int round = 0; round < 400; ++round) {
    // The last rounds at GLM-5's vocabulary size: top-p's radix sort.
    const bool large = round >= 394;
    const size_t n = large ? 154880 - size_t(round) : 2 + rng.below(300);
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
    SamplingOptions o;
    const double temperatures[] = {0.3, 0.7, 1.0, 2.5};
    o.temperature = temperatures[round % 4];
    const int64_t ks[] = {0, 1, 5, 50};
    o.topK = ks[(round / 4) % 4];
    o.minP = (round / 16) % 2 ? 0.05 : 0;
    const double ps[] = {1, 0.9, 0.5};
    o.topP = large ? 0.9 : ps[(round / 32) % 3];
    o.seed = seed + uint64_t(round);
    Sampler s(o);
    std::vector<std::pair<int32_t, double>> got =
        s.distribution(logits, {}, allowed);
    // The best allowed logit: without a finite one, the best token alone.
    int32_t best = -1;
    for (size_t i = 0; i < n; ++i)
      if ((allowed.empty() || allowed[i]) &&
          (best < 0 || logits[i] > logits[size_t(best)]))
        best = int32_t(i);
    ASSERT_GE(best, 0);
    if (!std::isfinite(logits[size_t(best)])) {
      ASSERT_EQ(got.size(), 1u) << "round " << round;
      EXPECT_EQ(got[0].first, best);
      EXPECT_EQ(s.sample(logits, {}, allowed), best);
      continue;
    }
    bool ambiguous = false;
    std::map<int32_t, double> want = reference(logits, allowed, o, ambiguous);
    if (ambiguous) {
      ++skipped;
      continue;
    }
    ++compared;
    ASSERT_EQ(got.size(), want.size())
        << "round " << round << " T " << o.temperature << " k " << o.topK
        << " min-p " << o.minP << " top-p " << o.topP;
    // A weight is e^x within 5e-7 (the exponential's bound) for x in float,
    // where x = (l - top) x (1 / T) took three roundings (2^-24 each): a
    // probability is within 3e-6 + 3 |x| 2^-24 of its double value,
    // relatively (the sum it is divided by moves less).
    const double top = logits[size_t(best)];
    for (auto [id, p] : got) {
      auto it = want.find(id);
      ASSERT_NE(it, want.end()) << "round " << round << " token " << id;
      const double x = std::abs((logits[size_t(id)] - top) / o.temperature);
      EXPECT_NEAR(p, it->second, it->second * (3e-6 + 3 * x * 0x1p-24))
          << "round " << round << " token " << id;
    }
    // The draw walks its set by id.
    for (size_t i = 1; i < got.size(); ++i)
      EXPECT_LT(got[i - 1].first, got[i].first) << "round " << round;
  }
  std::printf("%d rounds compared, %d skipped at a cut's rounding\n", compared,
              skipped);
  EXPECT_GT(compared, 300);
}

TEST(Sampler, ExponentialWithinItsBound) {
  // Two tokens at logits 0 and -x, T = 1: the second's probability over the
  // first's is the sampler's e^-x, for x across its whole range.
  SamplingOptions o;
  o.temperature = 1;
  double worst = 0;
  for (int step = 0; step < 87000; ++step) {
    const float x = float(step) / 1000;
    Sampler s(o);
    std::vector<float> logits = {0.0f, -x};
    auto d = s.distribution(logits);
    ASSERT_EQ(d.size(), 2u) << x;
    ASSERT_EQ(d[0].first, 0);
    const double ratio = d[1].second / d[0].second;
    const double exact = std::exp(-double(x));
    worst = std::max(worst, std::abs(ratio - exact) / exact);
  }
  std::printf("largest relative error of e^-x over [0, 87): %.3g\n", worst);
  // Truncation 1.3e-7 and the rounding of six float steps: 2.4e-7 was
  // measured; a coefficient off by one part in 120 reaches 7e-7.
  EXPECT_LT(worst, 5e-7);
  // At and below -87: no weight, never drawn.
  Sampler s(o);
  EXPECT_EQ(s.distribution(std::vector<float>{0.0f, -87.0f}).size(), 1u);
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

TEST(Sampler, DrawsFollowTheReportedDistribution) {
  // Each cut's set drawn 40,000 times: every count within 4.5 standard
  // deviations of its binomial mean (a false failure ~1e-5 a token).
  const uint64_t seed = 91;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  Rng rng(seed);
  std::vector<float> logits(40);
  for (float &l : logits)
    l = float(rng.normal() * 1.5);
  SamplingOptions cases[4];
  cases[0].temperature = 0.9;
  cases[1].temperature = 1.3;
  cases[1].topK = 6;
  cases[2].temperature = 1;
  cases[2].topP = 0.8;
  cases[3].temperature = 1;
  cases[3].minP = 0.1;
  for (SamplingOptions &o : cases) {
    o.seed = seed;
    Sampler s(o);
    std::vector<std::pair<int32_t, double>> d = s.distribution(logits);
    std::map<int32_t, int> counts;
    const int n = 40000;
    for (int i = 0; i < n; ++i)
      ++counts[s.sample(logits)];
    double mass = 0;
    for (auto [id, p] : d) {
      mass += p;
      EXPECT_NEAR(counts[id], n * p, 4.5 * std::sqrt(n * p * (1 - p)) + 1)
          << "T " << o.temperature << " token " << id;
      counts.erase(id);
    }
    EXPECT_NEAR(mass, 1, 1e-12);
    EXPECT_TRUE(counts.empty()) << "a token outside the set was drawn";
  }
}

TEST(Sampler, TheStepsNucleusIsTheSamplersTopP) {
  // The keys' draw cuts its own nucleus (DrawKey.h): the tokens of weight
  // at or above a cut found in integer masses. Without ties at the cut and
  // away from a boundary that rounding decides (the reference's
  // `ambiguous`; for top-k, the k-th and the next weight equal), it keeps
  // the Sampler's top-p set exactly, and with min-p and top-k their sets
  // (alone and under a top-p).
  const uint64_t seed = 0x70b1;
  std::printf("seed %#llx\n", (unsigned long long)seed);
  Rng rng(seed);
  int compared = 0, skipped = 0;
  for (int64_t vocab : {1000, 154880})
    for (double sigma : {1.0, 3.0})
      for (double t : {0.7, 1.0})
        for (double m : {0.0, 0.05})
          for (int32_t k : {0, 40})
            for (double p : {0.5, 0.9, 0.95, 1.0}) {
              if (m == 0 && p == 1 && k == 0)
                continue; // no cut
              if (k != 0 && p != 0.9 && p != 1.0)
                continue; // top-k with two shares
              std::vector<float> logits(static_cast<size_t>(vocab));
              for (float &x : logits)
                x = float(rng.normal() * sigma);
              SamplingOptions o;
              o.temperature = t;
              o.topP = p;
              o.minP = m;
              o.topK = k;
              bool ambiguous = false;
              const std::map<int32_t, double> want =
                  reference(logits, {}, o, ambiguous);
              const float scale = 1.0f / float(t);
              const float top = draw::nucleusTop(logits.data(), vocab);
              if (k != 0) {
                std::vector<uint32_t> w;
                for (float x : logits)
                  w.push_back(draw::weightBits(x, top, scale));
                std::nth_element(w.begin(), w.begin() + k, w.end(),
                                 std::greater<uint32_t>());
                const uint32_t kth =
                    *std::min_element(w.begin(), w.begin() + k);
                ambiguous = ambiguous || kth == w[size_t(k)];
              }
              if (ambiguous) {
                ++skipped;
                continue;
              }
              const uint32_t cut = draw::nucleusCutOf(
                  logits.data(), vocab, top, scale, p < 1 ? float(p) : 0.0f,
                  draw::floatBits(float(m)), k);
              std::vector<int32_t> kept;
              for (int64_t i = 0; i < vocab; ++i)
                if (draw::weightBits(logits[size_t(i)], top, scale) >= cut)
                  kept.push_back(int32_t(i));
              std::vector<int32_t> sampler;
              for (const auto &[id, prob] : want)
                sampler.push_back(id);
              ASSERT_EQ(kept, sampler)
                  << "vocab " << vocab << ", sigma " << sigma << ", T " << t
                  << ", p " << p << ", min-p " << m << ", top-k " << k;
              ++compared;
            }
  std::printf("%d cuts equal to the Sampler's top-p, top-k and min-p, %d at "
              "a rounding boundary skipped\n",
              compared, skipped);
  EXPECT_GE(compared, 50);
}
