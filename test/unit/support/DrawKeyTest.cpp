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

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
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

TEST(DrawKey, EveryGumbelIsWithinItsBound) {
  // gumbel reads 23 of its bits: every value, against the bound that lets
  // bestKey skip tokens.
  float most = -INFINITY, least = INFINITY;
  for (uint32_t v = 0; v < (1u << 23); ++v) {
    const float g = gumbel(v << 9);
    most = std::max(most, g);
    least = std::min(least, g);
  }
  std::printf("gumbel over all 2^23 values: [%.7g, %.7g], bound %g\n", least,
              most, kGumbelBound);
  EXPECT_LE(most, kGumbelBound);
  EXPECT_GT(most, 16.0f); // the bound is near, not slack
}

TEST(DrawKey, BestKeySkipsOnlyTokensThatCannotWin) {
  // bestKey skips blocks whose bounds are below the largest logit's key:
  // against every key made and scanned, on seeded vocabularies of several
  // spreads, with NaN (at index 0 and elsewhere), infinities and cuts.
  uint64_t state = 0x5ca9;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 11;
  };
  std::printf("best key: seed %#llx\n", 0x5ca9ull);
  int cases = 0;
  for (int shape = 0; shape < 6; ++shape)
    for (int64_t n : {1, 300, 5000, 154880}) {
      std::vector<float> x(static_cast<size_t>(n));
      const double spread = shape == 1 ? 30 : shape == 2 ? 0.1 : 3;
      for (float &v : x)
        v = float((double(next()) * 0x1p-53 - 0.5) * spread * 4);
      if (shape == 3)
        x[0] = NAN;
      if (shape == 4 && n > 7) {
        x[size_t(n / 2)] = NAN;
        x[5] = -INFINITY;
        x[size_t(n - 1)] = INFINITY;
        x[7] = INFINITY;
      }
      if (shape == 5)
        for (float &v : x)
          v = float(next() % 4); // ties
      for (float t : {0.3f, 1.0f, 4.0f})
        for (uint32_t position : {0u, 11u}) {
          const float scale = 1.0f / t, top = nucleusTop(x.data(), n);
          const uint32_t cut = position == 11 && n > 1
                                   ? nucleusCutOf(x.data(), n, top, scale, 0.5f)
                                   : 0;
          int64_t want = 0;
          float wantKey = 0;
          for (int64_t i = 0; i < n; ++i) {
            float k = drawKey(x[size_t(i)], scale, 9, position, uint32_t(i));
            if (cut != 0 && weightBits(x[size_t(i)], top, scale) < cut)
              k = -INFINITY;
            if (i == 0 || k > wantKey) {
              want = i;
              wantKey = k;
            }
          }
          float key = 0;
          ASSERT_EQ(bestKey(x.data(), n, 0, scale, 9, position, key, top, cut),
                    want)
              << "shape " << shape << ", n " << n << ", T " << t;
          ASSERT_EQ(floatBits(key), floatBits(wantKey));
          ++cases;
        }
    }
  std::printf("best key: %d cases as every key's scan\n", cases);
}

TEST(DrawKey, WordsOutsideTheRangeAreRefused) {
  auto words = [](float t, int32_t third) {
    std::vector<int32_t> w = {int32_t(floatBits(t)), 7, 9, third, 0, 0, 0, 0};
    return w;
  };
  auto share = [&](float t, float p) {
    return words(t, int32_t(floatBits(p)));
  };
  int bad = -1;
  for (int count : {kTemperatureWords, kDrawWords}) {
    EXPECT_TRUE(validWords(words(0.0f, 0).data(), count, bad));
    EXPECT_TRUE(validWords(words(-0.0f, 0).data(), count, bad)); // -0 == 0
    EXPECT_TRUE(validWords(words(0x1p-16f, 0).data(), count, bad));
    EXPECT_TRUE(validWords(words(0x1p16f, 0).data(), count, bad));
    for (float t : {-1.0f, 0x1p-17f, 0x1p17f, INFINITY, NAN}) {
      bad = -1;
      EXPECT_FALSE(validWords(words(t, 0).data(), count, bad)) << t;
      EXPECT_EQ(bad, 0) << t;
    }
  }
  // The first form: word 3 is reserved, a share included.
  bad = -1;
  EXPECT_FALSE(validWords(words(1.0f, 1).data(), kTemperatureWords, bad));
  EXPECT_EQ(bad, 3);
  EXPECT_FALSE(validWords(share(1.0f, 0.9f).data(), kTemperatureWords, bad));
  // Eight words: a share within (0, 1) with a temperature.
  DrawParams params;
  ASSERT_TRUE(readWords(share(0.5f, 0.9f).data(), kDrawWords, params, bad));
  EXPECT_EQ(params.temperature, 0.5f);
  EXPECT_EQ(params.topP, 0.9f);
  EXPECT_EQ(params.seed, 0x0000000900000007ull);
  EXPECT_TRUE(validWords(share(1.0f, 0x1p-149f).data(), kDrawWords, bad));
  EXPECT_TRUE(validWords(share(1.0f, 0.99999994f).data(), kDrawWords, bad));
  for (float p : {1.0f, -0.5f, -0.0f, 2.0f, NAN, INFINITY}) {
    bad = -1;
    EXPECT_FALSE(validWords(share(1.0f, p).data(), kDrawWords, bad)) << p;
    EXPECT_EQ(bad, 3) << p;
  }
  bad = -1;
  EXPECT_FALSE(validWords(share(0.0f, 0.9f).data(), kDrawWords, bad));
  EXPECT_EQ(bad, 3); // a nucleus needs a temperature
  // min-p (word 5): within (0, 1]; top-k (word 4): positive; each only
  // with a temperature. Values as the words' bits.
  auto with = [&](float t, int word, int32_t value) {
    std::vector<int32_t> w = words(t, 0);
    w[size_t(word)] = value;
    return w;
  };
  auto bitsOf = [](float v) { return int32_t(floatBits(v)); };
  for (const auto &[word, good, wrong] :
       {std::tuple{5, std::vector<int32_t>{bitsOf(0.05f), bitsOf(1.0f)},
                   std::vector<int32_t>{bitsOf(-0.1f), bitsOf(1.5f),
                                        bitsOf(NAN), bitsOf(-0.0f)}},
        std::tuple{4, std::vector<int32_t>{40, INT32_MAX},
                   std::vector<int32_t>{-1, INT32_MIN}}}) {
    for (int32_t v : good)
      EXPECT_TRUE(validWords(with(1.0f, word, v).data(), kDrawWords, bad))
          << "word " << word << ": " << v;
    for (int32_t v : wrong) {
      bad = -1;
      EXPECT_FALSE(validWords(with(1.0f, word, v).data(), kDrawWords, bad))
          << "word " << word << ": " << v;
      EXPECT_EQ(bad, word) << v;
    }
    bad = -1;
    EXPECT_FALSE(validWords(with(0.0f, word, good[0]).data(), kDrawWords, bad));
    EXPECT_EQ(bad, word); // a cut needs a temperature
  }
  ASSERT_TRUE(
      readWords(with(1.0f, 5, bitsOf(0.05f)).data(), kDrawWords, params, bad));
  EXPECT_EQ(params.minP, 0.05f);
  EXPECT_TRUE(params.cuts());
  EXPECT_EQ(params.cutWord(), 5);
  ASSERT_TRUE(readWords(with(1.0f, 4, 40).data(), kDrawWords, params, bad));
  EXPECT_EQ(params.topK, 40);
  EXPECT_TRUE(params.cuts());
  EXPECT_EQ(params.cutWord(), 4);
  // Words 6 and 7 are reserved.
  for (int reserved : {6, 7}) {
    std::vector<int32_t> w = words(1.0f, 0);
    w[size_t(reserved)] = 1;
    bad = -1;
    EXPECT_FALSE(validWords(w.data(), kDrawWords, bad));
    EXPECT_EQ(bad, reserved);
  }
}

/// The adjusting form's words for `entries` (id, bias, count) and the
/// penalties, with room for `capacity`.
std::vector<int32_t> adjustingWords(int capacity, double repeat,
                                    double frequency, double presence,
                                    const std::vector<Adjustment> &entries) {
  std::vector<int32_t> w(size_t(kiln::draw::adjustingWords(capacity)), 0);
  w[0] = int32_t(floatBits(1.0f));
  w[6] = int32_t(entries.size());
  doubleWords(repeat, w.data() + 8);
  doubleWords(frequency, w.data() + 10);
  doubleWords(presence, w.data() + 12);
  for (size_t i = 0; i < entries.size(); ++i) {
    w[16 + 3 * i] = entries[i].id;
    w[17 + 3 * i] = int32_t(floatBits(entries[i].bias));
    w[18 + 3 * i] = entries[i].count;
  }
  return w;
}

TEST(DrawKey, AdjustingWordsOutsideTheirRulesAreRefused) {
  EXPECT_EQ(kiln::draw::adjustingWords(1), 19);
  EXPECT_EQ(adjustCapacity(19), 1);
  EXPECT_EQ(adjustCapacity(976), 320);
  for (int count : {kTemperatureWords, kDrawWords, 16, 17, 18, 20, 977})
    EXPECT_EQ(adjustCapacity(count), 0) << count;
  const std::vector<Adjustment> two = {{3, 1.5f, 0}, {9, 0.0f, 2}};
  int bad = -1;
  Penalties p;
  Adjustment e;
  std::vector<int32_t> w = adjustingWords(4, 1.3, 0.5, -0.25, two);
  // writeAdjustments lays the words out as written above.
  std::vector<int32_t> written(w.size(), -1);
  std::copy(w.begin(), w.begin() + kDrawWords, written.begin());
  writeAdjustments(written.data(), int(written.size()), {1.3, 0.5, -0.25},
                   two.data(), two.size());
  EXPECT_EQ(written, w);
  ASSERT_TRUE(validWords(w.data(), int(w.size()), bad));
  ASSERT_TRUE(readPenalties(w.data(), p, bad));
  EXPECT_EQ(p, (Penalties{1.3, 0.5, -0.25}));
  ASSERT_TRUE(readEntry(w.data(), 1, 10, e, bad));
  EXPECT_EQ(e, two[1]);
  // Word 6, the count: 0 .. the capacity (in the eight words it stays
  // reserved, as above).
  for (int32_t n : {-1, 5, INT32_MAX}) {
    std::vector<int32_t> v = w;
    v[6] = n;
    bad = -1;
    EXPECT_FALSE(validWords(v.data(), int(v.size()), bad)) << n;
    EXPECT_EQ(bad, 6) << n;
  }
  w[6] = 4;
  EXPECT_TRUE(validWords(w.data(), int(w.size()), bad));
  // The penalties: a repeat penalty finite and above 0, the others finite,
  // words 14 and 15 reserved.
  for (const auto &[at, value] :
       {std::pair{8, 0.0}, std::pair{8, -1.0}, std::pair{8, double(NAN)},
        std::pair{8, double(INFINITY)}, std::pair{8, 1e300},
        std::pair{8, 1e-300}, std::pair{10, double(NAN)},
        std::pair{10, -double(INFINITY)}, std::pair{12, double(INFINITY)}}) {
    std::vector<int32_t> v = adjustingWords(4, 1, 0, 0, two);
    doubleWords(value, v.data() + at);
    bad = -1;
    EXPECT_FALSE(readPenalties(v.data(), p, bad)) << at << ": " << value;
    EXPECT_EQ(bad, at) << value;
  }
  for (int reserved : {14, 15}) {
    std::vector<int32_t> v = adjustingWords(4, 1, 0, 0, two);
    v[size_t(reserved)] = 1;
    bad = -1;
    EXPECT_FALSE(readPenalties(v.data(), p, bad));
    EXPECT_EQ(bad, reserved);
  }
  // An entry: its id within the vocabulary (10 here) and above the one
  // before it, its bias finite, its count at least 0.
  for (const auto &[entries, word] :
       {std::pair{std::vector<Adjustment>{{-1, 0, 1}}, 16},
        std::pair{std::vector<Adjustment>{{10, 0, 1}}, 16},
        std::pair{std::vector<Adjustment>{{4, 0, 1}, {4, 1, 0}}, 19},
        std::pair{std::vector<Adjustment>{{4, 0, 1}, {2, 1, 0}}, 19},
        std::pair{std::vector<Adjustment>{{4, NAN, 1}}, 17},
        std::pair{std::vector<Adjustment>{{4, -INFINITY, 0}}, 17},
        std::pair{std::vector<Adjustment>{{1, 0, 0}, {4, 0, -1}}, 21}}) {
    std::vector<int32_t> v = adjustingWords(4, 1, 0, 0, entries);
    bool valid = true;
    bad = -1;
    for (int i = 0; valid && i < v[6]; ++i)
      valid = readEntry(v.data(), i, 10, e, bad);
    EXPECT_FALSE(valid) << "word " << word;
    EXPECT_EQ(bad, word);
    float y[10] = {};
    const float x[10] = {};
    bad = -1;
    EXPECT_FALSE(adjustPart(v.data(), int(v.size()), 10, x, 10, 0, y, bad));
    EXPECT_EQ(bad, word);
  }
  EXPECT_STREQ(wordRule(3), kWordsRule);
  EXPECT_STREQ(wordRule(9), kPenaltiesRule);
  EXPECT_STREQ(wordRule(40), kEntryRule);
}

TEST(DrawKey, AdjustedLogitsAreTheirDefinitionOnEveryPart) {
  // Seeded random logits (both zeros, infinities, a NaN), biases and
  // recent-token counts; adjustLogit against the rule written out here
  // (the repeat penalty as a float, OpenAI's penalties in double), and
  // adjustPart
  // over the vocabulary split into parts against the whole.
  const uint64_t seed = 20261206;
  std::printf("adjusted logits: seed %llu\n", (unsigned long long)seed);
  uint64_t state = seed;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return uint32_t(state >> 33);
  };
  auto uniform = [&] { return double(next()) / 2147483648.0 - 1.0; };
  int checked = 0;
  for (int round = 0; round < 200; ++round) {
    const int vocab = 1 + int(next() % 300);
    std::vector<float> x(static_cast<size_t>(vocab));
    for (float &v : x)
      v = float(uniform() * 20);
    const float odd[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN};
    for (int i = 0; i < 3; ++i)
      x[next() % uint32_t(vocab)] = odd[next() % 5];
    const Penalties p{round % 4 == 0 ? 1.0 : 0.5 + 2 * (uniform() + 1),
                      round % 3 == 0 ? 0.0 : 2 * uniform(),
                      round % 5 == 0 ? 0.0 : 2 * uniform()};
    std::vector<Adjustment> entries;
    for (int id = 0; id < vocab; ++id)
      if (next() % 4 == 0)
        entries.push_back({id, next() % 3 == 0 ? 0.0f : float(uniform() * 50),
                           int32_t(next() % 3 == 0 ? 0 : next() % 7)});
    const int capacity = int(entries.size()) + int(next() % 3);
    if (capacity == 0)
      continue;
    const std::vector<int32_t> w =
        adjustingWords(capacity, p.repeat, p.frequency, p.presence, entries);
    std::vector<float> want = x;
    for (const Adjustment &e : entries) {
      float l = want[size_t(e.id)];
      if (e.bias != 0.0f || std::signbit(e.bias))
        l = l + e.bias;
      if (e.count > 0) {
        if (p.repeat != 1)
          l = l > 0 ? l / float(p.repeat) : l * float(p.repeat);
        if (p.frequency != 0 || p.presence != 0) {
          const double d = double(l) - p.frequency * double(e.count);
          l = float(d - p.presence);
        }
      }
      want[size_t(e.id)] = l;
    }
    // The whole, then parts of every size from 1 (each rank its own).
    for (int part : {vocab, 1 + int(next() % uint32_t(vocab))}) {
      std::vector<float> got(static_cast<size_t>(vocab));
      int bad = -1;
      for (int base = 0; base < vocab; base += part) {
        const int n = std::min(part, vocab - base);
        ASSERT_TRUE(adjustPart(w.data(), int(w.size()), vocab, x.data() + base,
                               n, base, got.data() + base, bad))
            << "word " << bad;
      }
      for (int i = 0; i < vocab; ++i) {
        ASSERT_EQ(floatBits(got[size_t(i)]), floatBits(want[size_t(i)]))
            << "round " << round << ", token " << i << ", parts of " << part;
        ++checked;
      }
    }
  }
  std::printf("adjusted logits: %d values the same bits\n", checked);
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

/// The nucleus by its definition, without the radix passes: every
/// distinct weight as a candidate cut, largest first, the first whose
/// tokens' masses reach want.
/// With min-p's floor (weight bits), the tokens below it hold no mass; with
/// top-k the floor is at least the k-th largest weight (none where k is at
/// least the count); with p = 0 the cut is the floor.
uint32_t cutByDefinition(const std::vector<float> &x, float scale, float p,
                         uint32_t floor = 0, int32_t k = 0) {
  const float top = nucleusTop(x.data(), int64_t(x.size()));
  if (k != 0 && size_t(k) < x.size()) {
    std::vector<uint32_t> sorted;
    for (float v : x)
      sorted.push_back(weightBits(v, top, scale));
    std::sort(sorted.begin(), sorted.end(), std::greater<uint32_t>());
    floor = std::max(floor, sorted[size_t(k) - 1]);
  }
  if (p == 0.0f)
    return std::isfinite(top) ? floor : 0;
  std::vector<std::pair<uint32_t, uint64_t>> weights; // bits, mass
  uint64_t total = 0;
  for (float v : x) {
    const uint32_t bits = weightBits(v, top, scale);
    const uint64_t mass = bits >= floor ? weightMass(bits) : 0;
    weights.emplace_back(bits, mass);
    total += mass;
  }
  if (total == 0)
    return 0;
  const uint64_t want =
      std::min<uint64_t>(total, uint64_t(std::ceil(double(p) * double(total))));
  std::sort(weights.begin(), weights.end(),
            [](auto a, auto b) { return a.first > b.first; });
  uint64_t held = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    held += weights[i].second;
    // A cut keeps every token of its weight: reached after the last one.
    if ((i + 1 == weights.size() || weights[i + 1].first != weights[i].first) &&
        held >= want)
      return weights[i].first;
  }
  return 0;
}

TEST(DrawKey, NucleusCutIsItsDefinition) {
  // Seeded vocabularies: N(0, sigma) logits of several spreads, a peaked
  // head, repeated values (ties at every cut), and shares from the best
  // token alone to nearly all; the radix passes against the definition.
  uint64_t state = 0x5eed;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 11;
  };
  auto normal = [&] {
    // Sum of 12 uniforms, less 6: close enough to a normal for a test.
    double s = 0;
    for (int i = 0; i < 12; ++i)
      s += double(next()) * 0x1p-53;
    return s - 6;
  };
  std::printf("nucleus: seed %#llx\n", 0x5eedull);
  int cases = 0;
  for (int shape = 0; shape < 4; ++shape)
    for (int64_t n : {1, 7, 1000, 50000}) {
      std::vector<float> x(static_cast<size_t>(n));
      for (float &v : x)
        v = shape == 0   ? float(normal())
            : shape == 1 ? float(4 * normal())
            : shape == 2 ? float(next() % 6) * 0.75f
                         : float(normal()) - 20.0f;
      if (shape == 3)
        for (int i = 0; i < 5 && i < n; ++i)
          x[size_t(next() % uint64_t(n))] = 3.0f + float(i);
      for (float t : {0.5f, 1.0f, 2.0f})
        for (float m : {0.0f, 0.01f, 0.3f})
          for (int32_t k : {0, 1, 40})
            for (float p :
                 {0.0f, 1e-6f, 0.3f, 0.9f, 0.95f, 0.999f, 0.99999994f}) {
              if (p == 0.0f && m == 0.0f && k == 0)
                continue; // no cut at all
              if (k != 0 && p != 0.0f && p != 0.9f && p != 0.999f)
                continue; // top-k with three shares
              const uint32_t floor = floatBits(m);
              const float top = nucleusTop(x.data(), n);
              const uint32_t got =
                  nucleusCutOf(x.data(), n, top, 1.0f / t, p, floor, k);
              ASSERT_EQ(got, cutByDefinition(x, 1.0f / t, p, floor, k))
                  << "shape " << shape << ", n " << n << ", T " << t << ", p "
                  << p << ", min-p " << m << ", top-k " << k;
              // The host's faster draw is the masked keys' argmax.
              std::vector<uint32_t> bits, places;
              for (uint32_t position : {0u, 9u}) {
                float want = 0, fast = 0;
                const int64_t a = bestKey(x.data(), n, 0, 1.0f / t, 3, position,
                                          want, top, got);
                const int64_t b =
                    nucleusDraw(x.data(), n, 1.0f / t, p, 3, position, fast,
                                bits, places, floor, k);
                ASSERT_EQ(a, b) << "shape " << shape << ", n " << n;
                ASSERT_EQ(floatBits(want), floatBits(fast));
              }
              ++cases;
            }
    }
  std::printf("nucleus: %d cuts as defined\n", cases);
}

TEST(DrawKey, NucleusDrawFollowsItsSoftmax) {
  // Eight logits at T = 1, p = 0.8: the nucleus is the tokens of weight at
  // least the cut; draws follow the softmax renormalised over them, and
  // never leave them. Split over two parts, the cut is the whole's (sums
  // of the parts' passes) and so is the draw.
  const std::vector<float> logits = {2.0f, 0.1f, 1.5f,  -1.0f,
                                     1.0f, 0.7f, -3.0f, 0.0f};
  const float scale = 1.0f, p = 0.8f;
  const float top = nucleusTop(logits.data(), 8);
  const uint32_t cut = nucleusCutOf(logits.data(), 8, top, scale, p);
  // Two parts' passes added: the same cut.
  NucleusCut split;
  uint64_t bins[kNucleusBins];
  for (int pass = 0; pass < kNucleusPasses; ++pass) {
    std::fill(bins, bins + kNucleusBins, 0);
    nucleusHistogram(logits.data(), 3, top, scale, split, pass, bins);
    nucleusHistogram(logits.data() + 3, 5, top, scale, split, pass, bins);
    nucleusStep(bins, pass, p, 0, split);
  }
  ASSERT_EQ(nucleusBits(split), cut);
  std::vector<double> prob(8, 0);
  double sum = 0;
  int kept = 0;
  for (size_t i = 0; i < 8; ++i)
    if (weightBits(logits[i], top, scale) >= cut) {
      sum += prob[i] = std::exp(double(logits[i] - top));
      ++kept;
    }
  // 2.0, 1.5, 1.0, 0.7 hold 0.83 of the mass; without 0.7, 0.75.
  ASSERT_EQ(kept, 4);
  for (double &v : prob)
    v /= sum;
  const int64_t draws = 100000;
  const uint64_t seed = 0xabcdef12345ull;
  std::vector<int64_t> counts(8, 0);
  for (int64_t position = 0; position < draws; ++position) {
    float key;
    const int64_t w = bestKey(logits.data(), 8, 0, scale, seed,
                              uint32_t(position), key, top, cut);
    ASSERT_GT(prob[size_t(w)], 0) << "drew token " << w << " outside the "
                                  << "nucleus at position " << position;
    ++counts[size_t(w)];
  }
  std::vector<int64_t> keptCounts;
  std::vector<double> keptProb;
  for (size_t i = 0; i < 8; ++i)
    if (prob[i] > 0) {
      keptCounts.push_back(counts[i]);
      keptProb.push_back(prob[i]);
    }
  const double chi = chiSquare(keptCounts, keptProb, draws);
  std::printf("nucleus T = 1, p = 0.8, seed %#llx: chi-square %.2f (3 "
              "degrees)\n",
              (unsigned long long)seed, chi);
  // 3 degrees of freedom: P(chi-square > 21.1) = 1e-4.
  EXPECT_LT(chi, 21.1);
}

} // namespace
