//===- CpuKernelsTest.cpp - CPU kernels against naive double math -------===//
//
// Every kernel is compared with a naive double-precision computation written
// here from the contract in CpuKernels.h. Weights are random floats quantised
// with kiln::quantize, and the naive side reads kiln::dequantize of the same
// bytes, so a tolerance only has to cover f32 rounding in the kernel. Where a
// tolerance is a rounding-error bound it is the standard first-order one:
// a sum of n products computed in f32 is within (n + 1) u of the exact sum of
// their absolute values, u = 2^-24 (moeExperts, two chained sums, uses the
// probabilistic sqrt(n) form instead; its test says why).
//
// Not checked here: bit-exactness of dequantisation itself (quant-tests and
// the Python tests own that) and speed.
//
//===----------------------------------------------------------------------===//
#include "cpu/CpuKernels.h"

#include "quant/FloatFormats.h"
#include "quant/QuantFormats.h"
#include "support/DrawKey.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

using namespace kiln;
using namespace kiln::cpu;

namespace {

constexpr uint32_t kSeed = 20250611;
/// Unit roundoff of f32.
constexpr double kU = 1.0 / (1 << 24);

/// A generator seeded with kSeed + salt; the test prints the seed on failure.
std::mt19937 generator(uint32_t salt) { return std::mt19937(kSeed + salt); }
std::string seedText(uint32_t salt) {
  return "seed " + std::to_string(kSeed + salt);
}

/// Uniform in [lo, hi), computed by hand so every standard library agrees.
float uniform(std::mt19937 &gen, float lo = -1.0f, float hi = 1.0f) {
  return lo + static_cast<float>(gen() / 4294967296.0) * (hi - lo);
}

std::vector<float> randomVector(std::mt19937 &gen, size_t n, float lo = -1.0f,
                                float hi = 1.0f) {
  std::vector<float> v(n);
  for (float &x : v)
    x = uniform(gen, lo, hi);
  return v;
}

/// A quantised weight and the f32 values its bytes dequantise to (row-major,
/// dims[0] fastest), which the naive computations read.
struct TestWeight {
  GGMLType type = GGMLType::F32;
  std::vector<int64_t> dims;
  std::string name;
  std::vector<uint8_t> bytes;
  std::vector<float> values;

  int64_t cols() const { return dims[0]; }
  float at(int64_t row, int64_t col) const {
    return values[row * cols() + col];
  }
  WeightView view() const {
    return WeightView{bytes.data(), bytes.size(), type, dims, name};
  }
};

TestWeight quantiseWeight(GGMLType type, std::vector<int64_t> dims,
                          std::string name, const std::vector<float> &source) {
  TestWeight w{type, std::move(dims), std::move(name), {}, {}};
  w.bytes.resize(*rowBytes(type, source.size()));
  Status q = quantize(type, source, w.bytes);
  EXPECT_TRUE(q.isOk()) << (q ? "" : q.error().message());
  w.values.resize(source.size());
  Status d = dequantize(type, w.bytes, w.values);
  EXPECT_TRUE(d.isOk()) << (d ? "" : d.error().message());
  return w;
}

TestWeight randomWeight(std::mt19937 &gen, GGMLType type,
                        std::vector<int64_t> dims, std::string name) {
  int64_t n = std::accumulate(dims.begin(), dims.end(), int64_t{1},
                              std::multiplies<>());
  return quantiseWeight(type, std::move(dims), std::move(name),
                        randomVector(gen, static_cast<size_t>(n)));
}

std::string errorText(const Status &s) {
  return s ? std::string("ok") : s.error().message();
}

/// Expects an error whose message contains every one of `parts`.
void expectError(const Status &s, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(s.isOk()) << "expected an error";
  for (const std::string &part : parts)
    EXPECT_NE(s.error().message().find(part), std::string::npos)
        << s.error().message() << " lacks '" << part << "'";
}

/// A cache of any type, holding `positions` rows of `width` values.
struct TestCache {
  CacheType type;
  int64_t positions, width;
  std::vector<uint32_t> storage; // f32 or 16-bit values, 4-byte aligned

  TestCache(CacheType t, int64_t p, int64_t w)
      : type(t), positions(p), width(w), storage(static_cast<size_t>(p * w)) {}
  CacheView view() { return CacheView{storage.data(), type, positions, width}; }
  void set(int64_t index, float v) {
    switch (type) {
    case CacheType::F32:
      reinterpret_cast<float *>(storage.data())[index] = v;
      break;
    case CacheType::F16:
      reinterpret_cast<uint16_t *>(storage.data())[index] = floatToHalf(v);
      break;
    case CacheType::BF16:
      reinterpret_cast<uint16_t *>(storage.data())[index] = floatToBf16(v);
      break;
    }
  }
  /// The value the kernel reads back, converted exactly.
  float get(int64_t index) const {
    switch (type) {
    case CacheType::F32:
      return reinterpret_cast<const float *>(storage.data())[index];
    case CacheType::F16:
      return halfToFloat(
          reinterpret_cast<const uint16_t *>(storage.data())[index]);
    case CacheType::BF16:
      return bf16ToFloat(
          reinterpret_cast<const uint16_t *>(storage.data())[index]);
    }
    return 0;
  }
};

const char *cacheName(CacheType t) {
  return t == CacheType::F32 ? "f32" : t == CacheType::F16 ? "f16" : "bf16";
}

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }
double silu(double v) { return v * sigmoid(v); }

const GGMLType kMatrixTypes[] = {GGMLType::F32,  GGMLType::F16,
                                 GGMLType::BF16, GGMLType::Q8_0,
                                 GGMLType::Q4_K, GGMLType::Q6_K};

} // namespace

//===----------------------------------------------------------------------===//
// ThreadPool
//===----------------------------------------------------------------------===//

TEST(ThreadPool, EveryIndexOnceInFixedContiguousChunks) {
  for (unsigned threads : {1u, 2u, 3u, 4u}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t n : {0, 1, 2, 3, 5, 17, 1000}) {
      SCOPED_TRACE(testing::Message() << threads << " threads, n " << n);
      auto chunksOf = [&] {
        std::mutex m;
        std::vector<std::pair<int64_t, int64_t>> chunks;
        pool.parallelFor(n, [&](int64_t b, int64_t e) {
          std::lock_guard<std::mutex> lock(m);
          chunks.emplace_back(b, e);
        });
        std::sort(chunks.begin(), chunks.end());
        return chunks;
      };
      std::vector<std::pair<int64_t, int64_t>> chunks = chunksOf();
      EXPECT_LE(chunks.size(), threads);
      int64_t next = 0; // chunks tile [0, n) with no gap or overlap
      for (auto [b, e] : chunks) {
        EXPECT_EQ(b, next);
        EXPECT_LT(b, e);
        next = e;
      }
      EXPECT_EQ(next, n);
      EXPECT_EQ(chunksOf(), chunks);
    }
  }
}

TEST(ThreadPool, NestedCallOnTheSamePoolRuns) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  pool.parallelFor(4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      pool.parallelFor(10, [&](int64_t b2, int64_t e2) { total += e2 - b2; });
  });
  EXPECT_EQ(total.load(), 40);
}

TEST(ThreadPool, ZeroThreadsMeansTheCallerAlone) {
  ThreadPool pool(0);
  EXPECT_EQ(pool.size(), 1u);
  int64_t covered = 0;
  pool.parallelFor(7, [&](int64_t b, int64_t e) { covered += e - b; });
  EXPECT_EQ(covered, 7);
}

//===----------------------------------------------------------------------===//
// embed, dequant
//===----------------------------------------------------------------------===//

TEST(Embed, RowOfTheTable) {
  SCOPED_TRACE(seedText(1));
  std::mt19937 gen = generator(1);
  for (GGMLType type : {GGMLType::F16, GGMLType::Q8_0, GGMLType::Q4_K}) {
    SCOPED_TRACE(nameOf(type));
    TestWeight table = randomWeight(gen, type, {256, 7}, "token_embd.weight");
    std::vector<float> out(256);
    for (int32_t token : {0, 3, 6}) {
      Status s = embed(table.view(), token, out.data());
      ASSERT_TRUE(s.isOk()) << errorText(s);
      // Same bytes, same dequantiser: exact.
      for (int64_t i = 0; i < 256; ++i)
        ASSERT_EQ(out[i], table.at(token, i)) << token << " " << i;
    }
  }
}

TEST(Embed, TokenOutsideTheVocabularyIsAnError) {
  SCOPED_TRACE(seedText(2));
  std::mt19937 gen = generator(2);
  TestWeight table =
      randomWeight(gen, GGMLType::Q8_0, {64, 5}, "token_embd.weight");
  std::vector<float> out(64);
  expectError(embed(table.view(), 5, out.data()),
              {"token_embd.weight", "token 5"});
  expectError(embed(table.view(), -1, out.data()),
              {"token_embd.weight", "token -1"});
}

TEST(DrawArgmax, ZeroTemperatureIsTheArgmaxAndBadWordsAreErrors) {
  SCOPED_TRACE(seedText(41));
  std::mt19937 gen = generator(41);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(1000);
  for (float &v : x)
    v = normal(gen);
  float key = 0;
  const int32_t greedy[4] = {0, 5, 6, 0};
  Expected<int32_t> best = drawArgmax(x.data(), 1000, 0, greedy, 4, 3, key);
  ASSERT_TRUE(bool(best));
  EXPECT_EQ(*best, argmax(x.data(), 1000));
  EXPECT_EQ(key, x[size_t(*best)]);
  // A draw's result is its best key's index; the key is the returned one.
  const float t = 0.5f;
  int32_t words[4] = {0, 5, 6, 0};
  std::memcpy(&words[0], &t, 4);
  best = drawArgmax(x.data(), 1000, 0, words, 4, 3, key);
  ASSERT_TRUE(bool(best));
  EXPECT_EQ(key, draw::drawKey(x[size_t(*best)], 2.0f, 0x0000000600000005ull, 3,
                               uint32_t(*best)));
  for (int64_t i = 0; i < 1000; ++i)
    ASSERT_LE(draw::drawKey(x[size_t(i)], 2.0f, 0x0000000600000005ull, 3,
                            uint32_t(i)),
              key);
  const float negative = -1.0f;
  std::memcpy(&words[0], &negative, 4);
  Expected<int32_t> refused = drawArgmax(x.data(), 1000, 0, words, 4, 3, key);
  ASSERT_FALSE(bool(refused));
  expectError(Status(refused.error()), {"sampling", "word 0", "0xbf800000"});
  std::memcpy(&words[0], &t, 4);
  words[3] = 1;
  refused = drawArgmax(x.data(), 1000, 0, words, 4, 3, key);
  ASSERT_FALSE(bool(refused));
  expectError(Status(refused.error()), {"sampling", "word 3"});
}

TEST(DrawArgmax, ANucleusIsCutFromTheWholeVocabulary) {
  SCOPED_TRACE(seedText(43));
  std::mt19937 gen = generator(43);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(2000);
  for (float &v : x)
    v = normal(gen);
  const float t = 1.0f, p = 0.5f;
  int32_t words[8] = {0, 5, 6, 0, 0, 0, 0, 0};
  std::memcpy(&words[0], &t, 4);
  std::memcpy(&words[3], &p, 4);
  // The draw is the best key among the tokens at or above the cut.
  const float top = draw::nucleusTop(x.data(), 2000);
  const uint32_t cut = draw::nucleusCutOf(x.data(), 2000, top, 1.0f, p);
  ASSERT_NE(cut, 0u);
  int kept = 0;
  for (int32_t position = 0; position < 50; ++position) {
    float key = 0;
    Expected<int32_t> best =
        drawArgmax(x.data(), 2000, 0, words, 8, position, key);
    ASSERT_TRUE(bool(best));
    EXPECT_GE(draw::weightBits(x[size_t(*best)], top, 1.0f), cut);
    for (int64_t i = 0; i < 2000; ++i) {
      if (draw::weightBits(x[size_t(i)], top, 1.0f) < cut)
        continue;
      ASSERT_LE(draw::drawKey(x[size_t(i)], 1.0f, 0x0000000600000005ull,
                              uint32_t(position), uint32_t(i)),
                key);
    }
    kept += *best == argmax(x.data(), 2000);
  }
  // Half the mass at N(0, 3) is a handful of tokens: the best one is drawn
  // often, but not always.
  EXPECT_GT(kept, 5);
  EXPECT_LT(kept, 50);
  // A part (base > 0) cannot cut it: an error, not a draw from the part.
  float key = 0;
  Expected<int32_t> part =
      drawArgmax(x.data() + 1000, 1000, 1000, words, 8, 0, key);
  ASSERT_FALSE(bool(part));
  expectError(Status(part.error()), {"sampling", "whole vocabulary"});
  // The first form (four words) has no nucleus: word 3 is reserved.
  Expected<int32_t> first = drawArgmax(x.data(), 2000, 0, words, 4, 0, key);
  ASSERT_FALSE(bool(first));
  expectError(Status(first.error()), {"sampling", "word 3"});
}

TEST(DrawArgmax, TopKDrawsAmongTheKLargest) {
  SCOPED_TRACE(seedText(44));
  std::mt19937 gen = generator(44);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(3000);
  for (float &v : x)
    v = normal(gen);
  // N(0, 1) at T = 2: the five largest logits hold a small share of the
  // mass, so a draw without the cut would leave them almost always.
  std::vector<float> sorted = x;
  std::sort(sorted.begin(), sorted.end(), std::greater<float>());
  const float t = 2.0f;
  int32_t words[8] = {0, 7, 8, 0, 5, 0, 0, 0};
  std::memcpy(&words[0], &t, 4);
  std::set<int32_t> drawn;
  for (int32_t position = 0; position < 200; ++position) {
    float key = 0;
    Expected<int32_t> best =
        drawArgmax(x.data(), 3000, 0, words, 8, position, key);
    ASSERT_TRUE(bool(best));
    EXPECT_GE(x[size_t(*best)], sorted[4]) << "position " << position;
    drawn.insert(*best);
  }
  // Every one of the five is drawn in 200 tries (each at least ~1/8 of
  // the time at these spreads: missing one has probability below 1e-11).
  EXPECT_EQ(drawn.size(), 5u);
  // A part cannot count them.
  float key = 0;
  Expected<int32_t> part =
      drawArgmax(x.data() + 1000, 2000, 1000, words, 8, 0, key);
  ASSERT_FALSE(bool(part));
  expectError(Status(part.error()), {"sampling", "whole vocabulary"});
}

TEST(Dequant, EveryValueRowMajor) {
  SCOPED_TRACE(seedText(3));
  std::mt19937 gen = generator(3);
  for (GGMLType type : kMatrixTypes) {
    SCOPED_TRACE(nameOf(type));
    TestWeight w = randomWeight(gen, type, {256, 2, 3}, "w");
    std::vector<float> out(w.values.size(), -99.0f);
    Status s = dequant(w.view(), out.data());
    ASSERT_TRUE(s.isOk()) << errorText(s);
    EXPECT_EQ(out, w.values); // exact: the same dequantiser, row by row
  }
}

TEST(Dequant, BytesThatDoNotMatchTheDimsAreAnError) {
  SCOPED_TRACE(seedText(4));
  std::mt19937 gen = generator(4);
  TestWeight w = randomWeight(gen, GGMLType::Q8_0, {64, 3}, "blk.0.ffn.weight");
  std::vector<float> out(w.values.size());
  WeightView shortView = w.view();
  shortView.bytes -= 1;
  expectError(dequant(shortView, out.data()), {"blk.0.ffn.weight", "bytes"});
  WeightView badRow = w.view(); // 48 is not a whole number of 32-value blocks
  badRow.dims = {48, 4};
  expectError(dequant(badRow, out.data()), {"blk.0.ffn.weight", "blocks"});
  WeightView zero = w.view();
  zero.dims = {64, 0};
  expectError(dequant(zero, out.data()), {"blk.0.ffn.weight", "positive"});
  WeightView table = w.view(); // embed wants a 2-D table
  table.dims = {64, 3, 1};
  expectError(embed(table, 0, out.data()), {"blk.0.ffn.weight", "dims"});
}

//===----------------------------------------------------------------------===//
// linear
//===----------------------------------------------------------------------===//

namespace {

/// Checks y[b][n] against the double dot product of x[b] and row
/// rowOf(b, n) of w, within the (K + 1) u bound on an f32 sum of K products.
template <typename RowOf>
void expectLinear(const std::vector<float> &x, int64_t batch,
                  const TestWeight &w, int64_t n, const std::vector<float> &y,
                  RowOf rowOf) {
  const int64_t k = w.cols();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t j = 0; j < n; ++j) {
      double exact = 0, absSum = 0;
      for (int64_t i = 0; i < k; ++i) {
        double term = static_cast<double>(x[b * k + i]) * w.at(rowOf(b, j), i);
        exact += term;
        absSum += std::abs(term);
      }
      ASSERT_NEAR(y[b * n + j], exact, (k + 1) * kU * absSum)
          << "batch " << b << " row " << j;
    }
}

} // namespace

TEST(Linear, MatVecEveryTypeBatchOneAndThree) {
  SCOPED_TRACE(seedText(5));
  std::mt19937 gen = generator(5);
  ThreadPool pool(3);
  const int64_t k = 256, n = 37; // 37 rows: chunks of unequal size
  for (GGMLType type : kMatrixTypes) {
    TestWeight w = randomWeight(gen, type, {k, n}, "blk.0.attn_q_a.weight");
    for (int64_t batch : {1, 3}) {
      SCOPED_TRACE(testing::Message() << nameOf(type) << " batch " << batch);
      std::vector<float> x = randomVector(gen, static_cast<size_t>(batch * k));
      std::vector<float> y(static_cast<size_t>(batch * n), -99.0f);
      Status s = linear(x.data(), batch, w.view(), y.data(), pool);
      ASSERT_TRUE(s.isOk()) << errorText(s);
      expectLinear(x, batch, w, n, y, [](int64_t, int64_t j) { return j; });
    }
  }
}

TEST(Linear, StackedWeightHasOneMatrixPerBatchRow) {
  SCOPED_TRACE(seedText(6));
  std::mt19937 gen = generator(6);
  ThreadPool pool(2);
  const int64_t k = 64, n = 5, batches = 3;
  TestWeight w =
      randomWeight(gen, GGMLType::Q8_0, {k, n, batches}, "blk.0.attn_k_b");
  std::vector<float> x = randomVector(gen, static_cast<size_t>(batches * k));
  std::vector<float> y(static_cast<size_t>(batches * n), -99.0f);
  Status s = linear(x.data(), batches, w.view(), y.data(), pool);
  ASSERT_TRUE(s.isOk()) << errorText(s);
  expectLinear(x, batches, w, n, y,
               [&](int64_t b, int64_t j) { return b * n + j; });

  expectError(linear(x.data(), 2, w.view(), y.data(), pool),
              {"blk.0.attn_k_b", "batch 2"});
}

TEST(Linear, InconsistentWeightIsAnError) {
  SCOPED_TRACE(seedText(7));
  std::mt19937 gen = generator(7);
  ThreadPool pool(2);
  TestWeight w = randomWeight(gen, GGMLType::Q4_K, {256, 4}, "output.weight");
  std::vector<float> x(256), y(4);
  WeightView longView = w.view();
  longView.bytes += 144;
  expectError(linear(x.data(), 1, longView, y.data(), pool),
              {"output.weight", "bytes"});
  WeightView flat = w.view();
  flat.dims = {1024};
  expectError(linear(x.data(), 1, flat, y.data(), pool), {"output.weight"});
}

//===----------------------------------------------------------------------===//
// rmsNorm, layerNorm
//===----------------------------------------------------------------------===//

TEST(RmsNorm, MatchesTheFormulaAndMayRunInPlace) {
  SCOPED_TRACE(seedText(8));
  std::mt19937 gen = generator(8);
  const int64_t rows = 3, n = 64;
  const float eps = 0.05f; // large enough that dropping it would show
  std::vector<float> x = randomVector(gen, rows * n, -2.0f, 2.0f);
  std::vector<float> w = randomVector(gen, n, 0.5f, 1.5f);
  std::vector<float> y(rows * n);
  rmsNorm(x.data(), rows, n, w.data(), eps, y.data());
  for (int64_t r = 0; r < rows; ++r) {
    double sumSq = 0;
    for (int64_t i = 0; i < n; ++i)
      sumSq += static_cast<double>(x[r * n + i]) * x[r * n + i];
    double rms = std::sqrt(sumSq / n + eps);
    for (int64_t i = 0; i < n; ++i) {
      double exact = x[r * n + i] / rms * w[i];
      // A sum of n positive squares is good to n u; the sqrt halves that;
      // four more roundings. Twice that first-order bound.
      EXPECT_NEAR(y[r * n + i], exact, 2 * (n / 2 + 4) * kU * std::abs(exact))
          << r << " " << i;
    }
  }
  std::vector<float> inPlace = x;
  rmsNorm(inPlace.data(), rows, n, w.data(), eps, inPlace.data());
  EXPECT_EQ(inPlace, y);
}

TEST(RmsNorm, RmsIsWhatTheNormDividesBy) {
  // The router fold divides its logits by the norm's rms: the same bits.
  SCOPED_TRACE(seedText(27));
  std::mt19937 gen = generator(27);
  const int64_t n = 96;
  const float eps = 1e-5f;
  std::vector<float> x = randomVector(gen, n, -3.0f, 3.0f);
  std::vector<float> w(n, 1.0f), y(n);
  rmsNorm(x.data(), 1, n, w.data(), eps, y.data());
  const float divisor = rms(x.data(), n, eps);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(y[i], x[i] / divisor * 1.0f) << i;
}

TEST(LayerNorm, MatchesTheFormulaAndMayRunInPlace) {
  SCOPED_TRACE(seedText(9));
  std::mt19937 gen = generator(9);
  const int64_t rows = 3, n = 64;
  const float eps = 0.05f; // large enough that dropping it would show
  std::vector<float> w = randomVector(gen, n, 0.5f, 1.5f);
  std::vector<float> b = randomVector(gen, n);
  // Means far from zero, so a kernel that forgot to centre would fail; at
  // 100 a one-pass variance (E[x^2] - mean^2 in f32) loses about 5% and
  // fails too, while the two-pass one stays within the bound below.
  for (float centre : {3.0f, 100.0f}) {
    SCOPED_TRACE(testing::Message() << "mean near " << centre);
    std::vector<float> x = randomVector(gen, rows * n, centre - 1, centre + 1);
    std::vector<float> y(rows * n);
    layerNorm(x.data(), rows, n, w.data(), b.data(), eps, y.data());
    for (int64_t r = 0; r < rows; ++r) {
      double mean = 0, var = 0;
      for (int64_t i = 0; i < n; ++i)
        mean += x[r * n + i];
      mean /= n;
      for (int64_t i = 0; i < n; ++i)
        var += (x[r * n + i] - mean) * (x[r * n + i] - mean);
      double sd = std::sqrt(var / n + eps);
      for (int64_t i = 0; i < n; ++i) {
        double normed = (x[r * n + i] - mean) / sd;
        double exact = normed * w[i] + b[i];
        // The f32 mean is good to (n + 1) u |mean|, an error the centring
        // passes on divided by sd; the rest is a few roundings of O(1)
        // values. Twice that first-order bound.
        double centring = (n + 1) * kU * std::abs(mean) / sd;
        double tol = 2 * ((centring + (n + 8) * kU * (1 + std::abs(normed))) *
                              std::abs(w[i]) +
                          kU * std::abs(exact));
        EXPECT_NEAR(y[r * n + i], exact, tol) << r << " " << i;
      }
    }
    std::vector<float> inPlace = x;
    layerNorm(inPlace.data(), rows, n, w.data(), b.data(), eps, inPlace.data());
    EXPECT_EQ(inPlace, y);
  }
}

//===----------------------------------------------------------------------===//
// rope
//===----------------------------------------------------------------------===//

TEST(Rope, BothStylesMatchTheDirectFormula) {
  SCOPED_TRACE(seedText(10));
  std::mt19937 gen = generator(10);
  const int64_t rows = 2, n = 40, offset = 8, dims = 24;
  std::vector<float> x = randomVector(gen, rows * n);
  for (RopeStyle style : {RopeStyle::Interleaved, RopeStyle::NeoX})
    // 12345: a float angle would be off by ~1e-3 rad there, far above the
    // tolerance, so this pins the double angle.
    for (int32_t position : {0, 3, 12345})
      for (float theta : {10000.0f, 50000.0f}) {
        SCOPED_TRACE(testing::Message()
                     << (style == RopeStyle::NeoX ? "neox" : "interleaved")
                     << " position " << position << " theta " << theta);
        std::vector<float> y(rows * n, -99.0f);
        rope(x.data(), rows, n, position, style, theta, offset, dims, y.data());
        for (int64_t r = 0; r < rows; ++r) {
          const float *xr = x.data() + r * n;
          const float *yr = y.data() + r * n;
          std::vector<bool> rotated(n, false);
          for (int64_t i = 0; i < dims / 2; ++i) {
            int64_t p =
                style == RopeStyle::Interleaved ? offset + 2 * i : offset + i;
            int64_t q = style == RopeStyle::Interleaved ? offset + 2 * i + 1
                                                        : offset + i + dims / 2;
            rotated[p] = rotated[q] = true;
            double angle = position * std::pow(double(theta), -2.0 * i / dims);
            double a = xr[p], b = xr[q];
            // cos and sin rounded to f32, two products and a sum: within
            // 1.5 u (|a| + |b|); 3 u leaves room for libm's cos/sin.
            double tol = 3 * kU * (std::abs(a) + std::abs(b));
            EXPECT_NEAR(yr[p], a * std::cos(angle) - b * std::sin(angle), tol)
                << "row " << r << " pair " << i;
            EXPECT_NEAR(yr[q], a * std::sin(angle) + b * std::cos(angle), tol)
                << "row " << r << " pair " << i;
          }
          for (int64_t i = 0; i < n; ++i) {
            if (!rotated[i]) {
              EXPECT_EQ(yr[i], xr[i]) << "copied value " << i;
            }
          }
        }
        std::vector<float> inPlace = x;
        rope(inPlace.data(), rows, n, position, style, theta, offset, dims,
             inPlace.data());
        EXPECT_EQ(inPlace, y);
      }
}

//===----------------------------------------------------------------------===//
// add, swiglu, argmax
//===----------------------------------------------------------------------===//

TEST(Elementwise, AddIsCorrectlyRounded) {
  SCOPED_TRACE(seedText(11));
  std::mt19937 gen = generator(11);
  std::vector<float> a = randomVector(gen, 100, -10, 10);
  std::vector<float> b = randomVector(gen, 100, -10, 10);
  std::vector<float> y(100);
  add(a.data(), b.data(), 100, y.data());
  for (int i = 0; i < 100; ++i) // one f32 add: the double sum, rounded
    EXPECT_EQ(y[i], static_cast<float>(double(a[i]) + b[i])) << i;
  add(a.data(), b.data(), 100, a.data());
  EXPECT_EQ(a, y);
}

TEST(Elementwise, SwigluMatchesSiluTimesUp) {
  SCOPED_TRACE(seedText(12));
  std::mt19937 gen = generator(12);
  std::vector<float> g = randomVector(gen, 100, -8, 8);
  std::vector<float> u = randomVector(gen, 100, -3, 3);
  g[0] = -100.0f; // exp(100) overflows f32: silu must still be ~0, not NaN
  g[1] = 100.0f;
  std::vector<float> y(100);
  swiglu(g.data(), u.data(), 100, y.data());
  for (int i = 0; i < 100; ++i) {
    double exact = silu(g[i]) * u[i];
    // exp (under 1 ulp in glibc), the add, divide and multiply: about 4 u
    // relative; 8 u, and an absolute floor for results that underflow.
    EXPECT_NEAR(y[i], exact, 8 * kU * std::abs(exact) + 1e-30) << i;
  }
  swiglu(g.data(), u.data(), 100, g.data());
  EXPECT_EQ(g, y);
}

TEST(SwigluFfn, SameBitsAsFusedLinearThenSwigluLinear) {
  // A shared expert inside moe_experts must give what the fused_linear of
  // gate and up, then the swiglu_linear, gave.
  SCOPED_TRACE(seedText(26));
  std::mt19937 gen = generator(26);
  ThreadPool pool(3);
  const int64_t hidden = 64, ffn = 40;
  TestWeight gate = randomWeight(gen, GGMLType::Q8_0, {hidden, ffn}, "gate");
  TestWeight up = randomWeight(gen, GGMLType::F16, {hidden, ffn}, "up");
  TestWeight down = randomWeight(gen, GGMLType::F16, {ffn, hidden}, "down");
  std::vector<float> x = randomVector(gen, hidden);
  std::vector<float> gu(2 * ffn), product(ffn), want(hidden);
  ASSERT_TRUE(linear(x.data(), 1, gate.view(), gu.data(), pool).isOk());
  ASSERT_TRUE(linear(x.data(), 1, up.view(), gu.data() + ffn, pool).isOk());
  swiglu(gu.data(), gu.data() + ffn, ffn, product.data());
  ASSERT_TRUE(linear(product.data(), 1, down.view(), want.data(), pool).isOk());

  std::vector<float> scratch(3 * ffn, -99.0f), y(hidden, -99.0f);
  Status s =
      swigluFfn(x.data(), gate.view(), up.view(), down.view(), scratch.data(),
                scratch.data() + 2 * ffn, y.data(), pool);
  ASSERT_TRUE(s.isOk()) << errorText(s);
  EXPECT_EQ(y, want);

  expectError(swigluFfn(x.data(), gate.view(), up.view(), gate.view(),
                        scratch.data(), scratch.data() + 2 * ffn, y.data(),
                        pool),
              {"shared expert", "[64, 40]"});
}

TEST(Argmax, TiesGoToTheLowestIndex) {
  const float a[] = {1, 3, 3, 2};
  EXPECT_EQ(argmax(a, 4), 1);
  const float same[] = {-5, -5, -5};
  EXPECT_EQ(argmax(same, 3), 0);
  const float last[] = {-3, -2, -1, 7};
  EXPECT_EQ(argmax(last, 4), 3);
  const float first[] = {9, 7, 9};
  EXPECT_EQ(argmax(first, 3), 0);
}

//===----------------------------------------------------------------------===//
// cacheAppend
//===----------------------------------------------------------------------===//

TEST(CacheAppend, WritesOneRowRoundedToNearestEven) {
  SCOPED_TRACE(seedText(13));
  std::mt19937 gen = generator(13);
  const int64_t positions = 4, width = 8;
  std::vector<float> entry = randomVector(gen, width);
  // Exactly halfway between two f16 (resp. bf16) values: ties to even.
  entry[0] = 1.0f + 0x1p-11f;     // f16 -> 1.0
  entry[1] = 1.0f + 3 * 0x1p-11f; // f16 -> 1 + 2^-9
  entry[2] = 1.0f + 0x1p-8f;      // bf16 -> 1.0
  for (CacheType type : {CacheType::F32, CacheType::F16, CacheType::BF16}) {
    SCOPED_TRACE(cacheName(type));
    TestCache cache(type, positions, width);
    std::fill(cache.storage.begin(), cache.storage.end(), 0xABABABABu);
    Status s = cacheAppend(entry.data(), 2, cache.view());
    ASSERT_TRUE(s.isOk()) << errorText(s);
    const auto *halves =
        reinterpret_cast<const uint16_t *>(cache.storage.data());
    for (int64_t j = 0; j < width; ++j) {
      if (type == CacheType::F32)
        EXPECT_EQ(cache.get(2 * width + j), entry[j]) << j;
      else if (type == CacheType::F16)
        EXPECT_EQ(halves[2 * width + j], floatToHalf(entry[j])) << j;
      else
        EXPECT_EQ(halves[2 * width + j], floatToBf16(entry[j])) << j;
    }
    if (type == CacheType::F16) {
      EXPECT_EQ(halves[2 * width + 0], 0x3C00);
      EXPECT_EQ(halves[2 * width + 1], 0x3C02);
    }
    if (type == CacheType::BF16) {
      EXPECT_EQ(halves[2 * width + 2], 0x3F80);
    }
    // Every other row untouched.
    const size_t bytesPerRow = width * (type == CacheType::F32 ? 4 : 2),
                 rowStart = 2 * bytesPerRow;
    const auto *raw = reinterpret_cast<const uint8_t *>(cache.storage.data());
    for (size_t i = 0; i < positions * bytesPerRow; ++i) {
      if (i < rowStart || i >= rowStart + bytesPerRow) {
        ASSERT_EQ(raw[i], 0xAB) << "byte " << i;
      }
    }
  }
}

TEST(CacheAppend, PositionPastTheEndIsContextFull) {
  TestCache cache(CacheType::F16, 4, 8);
  std::vector<float> entry(8, 1.0f);
  expectError(cacheAppend(entry.data(), 4, cache.view()),
              {"position 4", "context is full"});
  expectError(cacheAppend(entry.data(), -1, cache.view()), {"position -1"});
  Status s = cacheAppend(entry.data(), 3, cache.view());
  EXPECT_TRUE(s.isOk()) << errorText(s);
}

//===----------------------------------------------------------------------===//
// normRopeAppend
//===----------------------------------------------------------------------===//

// The fused op is the three ops it replaces, bit for bit: GLM-5's latent row
// (rms norm of the first part, the rope part rotated unnormalised) and its
// indexer key (layer norm of all, then a rotation of the first values).
TEST(NormRopeAppend, IsTheNormRopeAndAppendItReplaces) {
  SCOPED_TRACE(seedText(17));
  std::mt19937 gen = generator(17);
  const int64_t positions = 6;
  const int32_t position = 4;
  struct Case {
    bool layer;
    int64_t width, normDims, offset, dims;
    RopeStyle style;
  };
  for (const Case &c : {Case{false, 80, 64, 64, 16, RopeStyle::Interleaved},
                        Case{true, 32, 32, 0, 16, RopeStyle::Interleaved},
                        Case{true, 40, 24, 8, 24, RopeStyle::NeoX}}) {
    SCOPED_TRACE(c.layer ? "layer" : "rms");
    std::vector<float> entry = randomVector(gen, c.width),
                       w = randomVector(gen, c.normDims),
                       b = randomVector(gen, c.normDims);
    // Unfused: the norm into a row of its own, the rope over the row, the
    // append.
    std::vector<float> row = entry;
    if (c.layer)
      layerNorm(entry.data(), 1, c.normDims, w.data(), b.data(), 1e-5f,
                row.data());
    else
      rmsNorm(entry.data(), 1, c.normDims, w.data(), 1e-5f, row.data());
    rope(row.data(), 1, c.width, position, c.style, 1e4f, c.offset, c.dims,
         row.data());
    TestCache want(CacheType::F32, positions, c.width),
        got(CacheType::F32, positions, c.width);
    ASSERT_TRUE(cacheAppend(row.data(), position, want.view()).isOk());
    Status s = normRopeAppend(entry.data(), c.normDims, w.data(),
                              c.layer ? b.data() : nullptr, 1e-5f, position,
                              c.style, 1e4f, c.offset, c.dims, got.view());
    ASSERT_TRUE(s.isOk()) << errorText(s);
    EXPECT_EQ(got.storage, want.storage);
  }
}

TEST(NormRopeAppend, PositionPastTheEndIsContextFullNamingTheOp) {
  TestCache cache(CacheType::F16, 4, 8);
  std::vector<float> entry(8, 1.0f), w(6, 1.0f);
  expectError(normRopeAppend(entry.data(), 6, w.data(), nullptr, 1e-5f, 4,
                             RopeStyle::Interleaved, 1e4f, 6, 2, cache.view()),
              {"norm_rope_append", "position 4", "context is full"});
  expectError(normRopeAppend(entry.data(), 9, w.data(), nullptr, 1e-5f, 0,
                             RopeStyle::Interleaved, 1e4f, 6, 2, cache.view()),
              {"norm of 9", "row of 8"});
}

//===----------------------------------------------------------------------===//
// mlaAttention
//===----------------------------------------------------------------------===//

namespace {

struct MlaProblem {
  int64_t heads = 4, latent = 32, rope = 8, positions = 10;
  int32_t position = 6;
  float scale = 0;
  std::vector<float> qLatent, qRope;
  TestCache cache;

  MlaProblem(std::mt19937 &gen, CacheType type, int64_t heads = 4)
      : heads(heads), cache(type, 10, 40) {
    scale = 1.0f / std::sqrt(static_cast<float>(latent + rope));
    qLatent = randomVector(gen, heads * latent);
    qRope = randomVector(gen, heads * rope);
    for (int64_t t = 0; t < positions; ++t)
      for (int64_t j = 0; j < latent + rope; ++j)
        // Rows after `position` are large: reading one would show.
        cache.set(t * (latent + rope) + j, t > position ? 50.0f : uniform(gen));
  }

  /// out[h] by the contract's formula in double over `attended`, and a
  /// bound per head on the kernel's f32 error.
  struct Naive {
    std::vector<double> out, bound;
  };
  Naive naive(const std::vector<int32_t> &attended) const {
    Naive r{std::vector<double>(heads * latent, 0.0),
            std::vector<double>(heads, 0.0)};
    const int64_t width = latent + rope;
    const auto count = static_cast<int64_t>(attended.size());
    for (int64_t h = 0; h < heads; ++h) {
      std::vector<double> s;
      double scoreError = 0, rowMax = 0;
      for (int32_t t : attended) {
        double dot = 0, absSum = 0;
        for (int64_t j = 0; j < width; ++j) {
          double q = j < latent ? qLatent[h * latent + j]
                                : qRope[h * rope + j - latent];
          dot += q * cache.get(t * width + j);
          absSum += std::abs(q * cache.get(t * width + j));
          if (j < latent)
            rowMax =
                std::max(rowMax, std::abs(double(cache.get(t * width + j))));
        }
        s.push_back(dot * scale);
        scoreError = std::max(scoreError, (width + 2) * kU * absSum * scale);
      }
      double m = *std::max_element(s.begin(), s.end()), sum = 0;
      for (double &v : s)
        sum += (v = std::exp(v - m));
      for (int64_t i = 0; i < count; ++i)
        for (int64_t j = 0; j < latent; ++j)
          r.out[h * latent + j] +=
              s[i] / sum * cache.get(attended[i] * width + j);
      // A score error e changes a weight by at most a factor exp(2e) after
      // normalisation; exp, the sum of `count` weights and the weighted sum
      // of `count` rows add (2 count + 8) u. Doubled.
      r.bound[h] = 2 * (2 * scoreError + (2 * count + 8) * kU) * rowMax;
    }
    return r;
  }
};

void expectAttention(const std::vector<float> &out, const MlaProblem &p,
                     const std::vector<int32_t> &attended) {
  MlaProblem::Naive exact = p.naive(attended);
  for (int64_t h = 0; h < p.heads; ++h)
    for (int64_t j = 0; j < p.latent; ++j)
      ASSERT_NEAR(out[h * p.latent + j], exact.out[h * p.latent + j],
                  exact.bound[h])
          << "head " << h << " value " << j;
}

} // namespace

TEST(MlaAttention, DenseAttendsZeroThroughPosition) {
  SCOPED_TRACE(seedText(14));
  std::mt19937 gen = generator(14);
  ThreadPool pool(3);
  for (CacheType type : {CacheType::F32, CacheType::F16, CacheType::BF16}) {
    SCOPED_TRACE(cacheName(type));
    MlaProblem p(gen, type);
    std::vector<float> out(p.heads * p.latent, -99.0f);
    Status s = mlaAttention(p.qLatent.data(), p.qRope.data(), p.heads, p.latent,
                            p.rope, p.cache.view(), p.position, nullptr,
                            nullptr, p.scale, out.data(), pool);
    ASSERT_TRUE(s.isOk()) << errorText(s);
    std::vector<int32_t> all(p.position + 1);
    std::iota(all.begin(), all.end(), 0);
    expectAttention(out, p, all);
  }
}

TEST(MlaAttention, SelectionAttendsOnlyTheChosenRows) {
  SCOPED_TRACE(seedText(15));
  std::mt19937 gen = generator(15);
  ThreadPool pool(2);
  MlaProblem p(gen, CacheType::F16);
  // count 4: the fifth entry is padding and must not be read.
  const std::vector<int32_t> selected = {5, 1, 6, 2, 999};
  const int32_t count = 4;
  std::vector<float> out(p.heads * p.latent, -99.0f);
  Status s = mlaAttention(p.qLatent.data(), p.qRope.data(), p.heads, p.latent,
                          p.rope, p.cache.view(), p.position, selected.data(),
                          &count, p.scale, out.data(), pool);
  ASSERT_TRUE(s.isOk()) << errorText(s);
  expectAttention(out, p, {5, 1, 6, 2});
}

TEST(MlaAttention, PositionsOutsideTheCacheAreErrors) {
  SCOPED_TRACE(seedText(16));
  std::mt19937 gen = generator(16);
  ThreadPool pool(2);
  MlaProblem p(gen, CacheType::F16);
  std::vector<float> out(p.heads * p.latent);
  auto run = [&](int32_t position, const std::vector<int32_t> *selected,
                 const int32_t *count) {
    return mlaAttention(p.qLatent.data(), p.qRope.data(), p.heads, p.latent,
                        p.rope, p.cache.view(), position,
                        selected ? selected->data() : nullptr, count, p.scale,
                        out.data(), pool);
  };
  const std::vector<int32_t> past = {1, 10, 2}, negative = {0, -3};
  const int32_t three = 3, two = 2;
  expectError(run(p.position, &past, &three), {"selected", "position 10"});
  expectError(run(p.position, &negative, &two), {"selected", "position -3"});
  expectError(run(10, nullptr, nullptr), {"position 10"});
  expectError(run(-1, nullptr, nullptr), {"position -1"});
  expectError(run(p.position, &past, nullptr), {"count"});
  expectError(mlaAttention(p.qLatent.data(), p.qRope.data(), p.heads, p.latent,
                           p.rope - 1, p.cache.view(), p.position, nullptr,
                           nullptr, p.scale, out.data(), pool),
              {"cache"});
}

//===----------------------------------------------------------------------===//
// dsaIndexer
//===----------------------------------------------------------------------===//

namespace {

struct IndexerProblem {
  int64_t heads = 4, dim = 16, positions = 24;
  float scale = 0.25f;
  std::vector<float> q, w;
  TestCache cache{CacheType::F16, 24, 16};

  explicit IndexerProblem(std::mt19937 &gen) {
    q = randomVector(gen, heads * dim);
    w = randomVector(gen, heads, 0.1f, 1.0f);
    for (int64_t i = 0; i < positions * dim; ++i)
      cache.set(i, uniform(gen));
  }
  std::vector<double> naiveScores(int32_t position) const {
    std::vector<double> scores;
    for (int64_t t = 0; t <= position; ++t) {
      double sum = 0;
      for (int64_t h = 0; h < heads; ++h) {
        double d = 0;
        for (int64_t j = 0; j < dim; ++j)
          d += double(q[h * dim + j]) * cache.get(t * dim + j);
        sum += w[h] * std::max(d, 0.0);
      }
      scores.push_back(scale * sum);
    }
    return scores;
  }
  /// Positions by descending score, ties to the lower position.
  static std::vector<int32_t> ranking(const std::vector<double> &scores) {
    std::vector<int32_t> order(scores.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return scores[a] > scores[b];
    });
    return order;
  }
};

} // namespace

TEST(DsaIndexer, ChoosesTheNaiveTopKInAscendingOrder) {
  SCOPED_TRACE(seedText(17));
  std::mt19937 gen = generator(17);
  IndexerProblem p(gen);
  const int32_t position = 15;
  const int64_t topK = 6;
  // Make a tie straddle the cut: copy the key of the last chosen position
  // to one that is not chosen. Exactly equal keys give exactly equal f32
  // scores, and only the lower of the two positions may be chosen.
  std::vector<int32_t> order = IndexerProblem::ranking(p.naiveScores(position));
  const int32_t last = order[topK - 1], other = order[topK + 2];
  for (int64_t j = 0; j < p.dim; ++j)
    p.cache.set(other * p.dim + j, p.cache.get(last * p.dim + j));
  // Rows after `position` score far above the rest if read.
  for (int64_t t = position + 1; t < p.positions; ++t)
    for (int64_t j = 0; j < p.dim; ++j)
      p.cache.set(t * p.dim + j, 40.0f * p.q[j]);

  std::vector<double> scores = p.naiveScores(position);
  order = IndexerProblem::ranking(scores);
  // f32 and double rankings agree only where scores are well apart: the
  // seeded data is checked to have no near-tie except the deliberate one.
  for (int64_t r = 0; r + 1 < static_cast<int64_t>(order.size()); ++r) {
    if (scores[order[r]] != scores[order[r + 1]]) {
      ASSERT_GT(scores[order[r]] - scores[order[r + 1]], 1e-4) << r;
    }
  }
  std::vector<int32_t> expected(order.begin(), order.begin() + topK);
  std::sort(expected.begin(), expected.end());
  ASSERT_TRUE(
      std::count(expected.begin(), expected.end(), std::min(last, other)) ==
          1 &&
      std::count(expected.begin(), expected.end(), std::max(last, other)) == 0);

  std::vector<int32_t> selected(topK, -7);
  int32_t count = -7;
  Status s = dsaIndexer(p.q.data(), p.heads, p.dim, p.w.data(), p.cache.view(),
                        position, topK, p.scale, selected.data(), &count);
  ASSERT_TRUE(s.isOk()) << errorText(s);
  EXPECT_EQ(count, topK);
  EXPECT_EQ(selected, expected);
}

TEST(DsaIndexer, FewerPositionsThanTopKArePaddedWithZeros) {
  SCOPED_TRACE(seedText(18));
  std::mt19937 gen = generator(18);
  IndexerProblem p(gen);
  std::vector<int32_t> selected(8, -7);
  int32_t count = -7;
  Status s = dsaIndexer(p.q.data(), p.heads, p.dim, p.w.data(), p.cache.view(),
                        3, 8, p.scale, selected.data(), &count);
  ASSERT_TRUE(s.isOk()) << errorText(s);
  EXPECT_EQ(count, 4);
  EXPECT_EQ(selected, (std::vector<int32_t>{0, 1, 2, 3, 0, 0, 0, 0}));
}

TEST(DsaIndexer, PositionOutsideTheCacheIsAnError) {
  SCOPED_TRACE(seedText(19));
  std::mt19937 gen = generator(19);
  IndexerProblem p(gen);
  std::vector<int32_t> selected(4);
  int32_t count = 0;
  expectError(dsaIndexer(p.q.data(), p.heads, p.dim, p.w.data(), p.cache.view(),
                         24, 4, p.scale, selected.data(), &count),
              {"position 24"});
  expectError(dsaIndexer(p.q.data(), p.heads, p.dim + 1, p.w.data(),
                         p.cache.view(), 3, 4, p.scale, selected.data(),
                         &count),
              {"cache"});
}

//===----------------------------------------------------------------------===//
// moeRouter
//===----------------------------------------------------------------------===//

namespace {

struct RouterProblem {
  int64_t hidden = 64, experts = 16;
  std::vector<float> x;
  TestWeight gate;
  std::vector<double> logits, absSums;

  RouterProblem(std::mt19937 &gen, GGMLType type) {
    x = randomVector(gen, hidden);
    gate = randomWeight(gen, type, {hidden, experts}, "blk.3.ffn_gate_inp");
    for (int64_t e = 0; e < experts; ++e) {
      double l = 0, a = 0;
      for (int64_t i = 0; i < hidden; ++i) {
        l += double(x[i]) * gate.at(e, i);
        a += std::abs(double(x[i]) * gate.at(e, i));
      }
      logits.push_back(l);
      absSums.push_back(a);
    }
  }
  /// Bound on |p_f32 - p| for expert e: the logit's (hidden + 1) u bound
  /// (sigmoid and softmax have slope at most 1) plus a few roundings.
  double tolerance(int64_t e) const {
    return (hidden + 1) * kU * absSums[e] + 8 * kU;
  }
};

/// The ids the contract chooses: the topK of `score`, descending, ties to
/// the lower id.
std::vector<int32_t> naiveChoice(const std::vector<double> &score,
                                 int64_t topK) {
  std::vector<int32_t> ids = IndexerProblem::ranking(score);
  ids.resize(topK);
  return ids;
}

} // namespace

TEST(MoeRouter, SigmoidBiasChangesTheChoiceNotTheWeights) {
  SCOPED_TRACE(seedText(20));
  std::mt19937 gen = generator(20);
  RouterProblem r(gen, GGMLType::F16);
  const int64_t topK = 4;
  const float routedScale = 2.5f;
  std::vector<double> p;
  for (double l : r.logits)
    p.push_back(sigmoid(l));

  // Without bias: the topK by p, with weights p * routedScale.
  std::vector<int32_t> ids(topK);
  std::vector<float> weights(topK);
  Status s = moeRouter(r.x.data(), r.hidden, r.gate.view(), nullptr, topK,
                       Gating::Sigmoid, false, routedScale, ids.data(),
                       weights.data());
  ASSERT_TRUE(s.isOk()) << errorText(s);
  std::vector<int32_t> expected = naiveChoice(p, topK);
  EXPECT_EQ(ids, expected);
  for (int64_t k = 0; k < topK; ++k)
    EXPECT_NEAR(weights[k], p[expected[k]] * routedScale,
                routedScale * r.tolerance(expected[k]))
        << k;

  // A bias that lifts the least likely expert to first place and ranks the
  // rest by p + bias; its weight is still its own p.
  std::vector<float> bias = randomVector(gen, r.experts, -0.05f, 0.05f);
  const int32_t least =
      static_cast<int32_t>(std::min_element(p.begin(), p.end()) - p.begin());
  bias[least] = 1.0f;
  std::vector<double> biased(p);
  for (int64_t e = 0; e < r.experts; ++e)
    biased[e] += bias[e];
  expected = naiveChoice(biased, topK);
  ASSERT_EQ(expected[0], least);
  // Scores apart by far more than f32 error, so the choice is well defined.
  std::vector<int32_t> all = naiveChoice(biased, r.experts);
  for (int64_t e = 0; e + 1 < r.experts; ++e)
    ASSERT_GT(biased[all[e]] - biased[all[e + 1]], 1e-4) << e;
  s = moeRouter(r.x.data(), r.hidden, r.gate.view(), bias.data(), topK,
                Gating::Sigmoid, true, routedScale, ids.data(), weights.data());
  ASSERT_TRUE(s.isOk()) << errorText(s);
  EXPECT_EQ(ids, expected);
  double sum = 0;
  for (int32_t e : expected)
    sum += p[e];
  for (int64_t k = 0; k < topK; ++k)
    // Normalised: relative errors of p add up over the topK weights.
    EXPECT_NEAR(weights[k], p[expected[k]] / sum * routedScale,
                routedScale * 4 * (topK + 2) * r.tolerance(expected[k]) / sum)
        << k;
}

TEST(MoeRouter, SoftmaxWithTiesToTheLowerId) {
  SCOPED_TRACE(seedText(21));
  std::mt19937 gen = generator(21);
  RouterProblem r(gen, GGMLType::Q8_0);
  std::vector<double> p(r.logits.size());
  double m = *std::max_element(r.logits.begin(), r.logits.end()), sum = 0;
  for (size_t e = 0; e < p.size(); ++e)
    sum += (p[e] = std::exp(r.logits[e] - m));
  for (double &v : p)
    v /= sum;
  const int64_t topK = 3;
  std::vector<int32_t> ids(topK);
  std::vector<float> weights(topK);
  Status s =
      moeRouter(r.x.data(), r.hidden, r.gate.view(), nullptr, topK,
                Gating::Softmax, false, 1.0f, ids.data(), weights.data());
  ASSERT_TRUE(s.isOk()) << errorText(s);
  std::vector<int32_t> expected = naiveChoice(p, topK);
  EXPECT_EQ(ids, expected);
  for (int64_t k = 0; k < topK; ++k)
    // Softmax: each p carries the error of every logit through the sum.
    EXPECT_NEAR(weights[k], p[expected[k]],
                4 * r.tolerance(expected[k]) + (r.experts + 4) * kU)
        << k;

  // Two identical best rows tie exactly: the lower id comes first, and
  // normalising two equal weights gives exactly one half each.
  std::vector<float> rows(4 * 32, 0.0f), x(32, 0.0f);
  x[0] = 1.0f;
  rows[0 * 32] = 0.5f;
  rows[1 * 32] = 2.0f;
  rows[2 * 32] = -1.0f;
  rows[3 * 32] = 2.0f;
  TestWeight tied = quantiseWeight(GGMLType::F32, {32, 4}, "tied", rows);
  std::vector<int32_t> two(2);
  std::vector<float> twoWeights(2);
  s = moeRouter(x.data(), 32, tied.view(), nullptr, 2, Gating::Softmax, true,
                1.0f, two.data(), twoWeights.data());
  ASSERT_TRUE(s.isOk()) << errorText(s);
  EXPECT_EQ(two, (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(twoWeights, (std::vector<float>{0.5f, 0.5f}));
}

TEST(MoeRouter, NormalisingDividesByAtLeastTheFloor) {
  // Logits of -20: sigmoid ~2e-9 each, their sum far under 6.1035e-5.
  std::vector<float> rows(2 * 32, 0.0f), x(32, 0.0f);
  x[0] = 1.0f;
  rows[0 * 32] = -20.0f;
  rows[1 * 32] = -21.0f;
  TestWeight gate = quantiseWeight(GGMLType::F32, {32, 2}, "gate", rows);
  std::vector<int32_t> ids(2);
  std::vector<float> weights(2);
  Status s = moeRouter(x.data(), 32, gate.view(), nullptr, 2, Gating::Sigmoid,
                       true, 3.0f, ids.data(), weights.data());
  ASSERT_TRUE(s.isOk()) << errorText(s);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1}));
  const double floorValue = 6.1035e-5f;
  // Relative 1e-6: sigmoid of an exactly represented logit plus two
  // roundings.
  EXPECT_NEAR(weights[0], sigmoid(-20) / floorValue * 3,
              1e-6 * sigmoid(-20) / floorValue * 3);
  EXPECT_NEAR(weights[1], sigmoid(-21) / floorValue * 3,
              1e-6 * sigmoid(-21) / floorValue * 3);
}

TEST(MoeRouter, BadShapesAreErrors) {
  SCOPED_TRACE(seedText(22));
  std::mt19937 gen = generator(22);
  RouterProblem r(gen, GGMLType::F16);
  std::vector<int32_t> ids(17);
  std::vector<float> weights(17);
  expectError(moeRouter(r.x.data(), r.hidden, r.gate.view(), nullptr, 17,
                        Gating::Sigmoid, true, 1.0f, ids.data(),
                        weights.data()),
              {"blk.3.ffn_gate_inp", "top k 17"});
  expectError(moeRouter(r.x.data(), 32, r.gate.view(), nullptr, 2,
                        Gating::Sigmoid, true, 1.0f, ids.data(),
                        weights.data()),
              {"blk.3.ffn_gate_inp", "hidden"});
}

TEST(MoeChoose, IsMoeRouterAfterItsDots) {
  // moeRouter's logits are f32 dots with k ascending: given those logits,
  // moeChoose makes the same choice, bit for bit.
  SCOPED_TRACE(seedText(28));
  std::mt19937 gen = generator(28);
  RouterProblem r(gen, GGMLType::F32);
  std::vector<float> logits(r.experts);
  for (int64_t e = 0; e < r.experts; ++e) {
    float sum = 0.0f;
    for (int64_t i = 0; i < r.hidden; ++i)
      sum += r.x[i] * r.gate.at(e, i);
    logits[e] = sum;
  }
  std::vector<float> bias = randomVector(gen, r.experts, -0.1f, 0.1f);
  const int64_t topK = 4;
  for (Gating g : {Gating::Sigmoid, Gating::Softmax})
    for (const float *b : {static_cast<const float *>(nullptr),
                           static_cast<const float *>(bias.data())})
      for (bool normalize : {false, true}) {
        std::vector<int32_t> ids(topK), chosenIds(topK);
        std::vector<float> weights(topK), chosenWeights(topK);
        Status s = moeRouter(r.x.data(), r.hidden, r.gate.view(), b, topK, g,
                             normalize, 2.5f, ids.data(), weights.data());
        ASSERT_TRUE(s.isOk()) << errorText(s);
        s = moeChoose(logits.data(), r.experts, b, topK, g, normalize, 2.5f,
                      chosenIds.data(), chosenWeights.data());
        ASSERT_TRUE(s.isOk()) << errorText(s);
        EXPECT_EQ(chosenIds, ids);
        EXPECT_EQ(chosenWeights, weights);
      }
}

TEST(MoeChoose, MatchesTheNaiveChoice) {
  SCOPED_TRACE(seedText(29));
  std::mt19937 gen = generator(29);
  const int64_t experts = 32, topK = 6;
  const float routedScale = 2.5f;
  std::vector<float> logits = randomVector(gen, experts, -4.0f, 4.0f);
  std::vector<float> bias = randomVector(gen, experts, -0.5f, 0.5f);
  std::vector<double> p(experts), score(experts);
  for (int64_t e = 0; e < experts; ++e) {
    p[e] = sigmoid(logits[e]);
    score[e] = p[e] + bias[e];
  }
  // Scores apart by far more than f32 error, so the choice is well defined.
  std::vector<int32_t> all = naiveChoice(score, experts);
  for (int64_t e = 0; e + 1 < topK + 1; ++e)
    ASSERT_GT(score[all[e]] - score[all[e + 1]], 1e-5) << e;
  std::vector<int32_t> expected = naiveChoice(score, topK);
  double sum = 0;
  for (int32_t e : expected)
    sum += p[e];
  std::vector<int32_t> ids(topK);
  std::vector<float> weights(topK);
  Status s =
      moeChoose(logits.data(), experts, bias.data(), topK, Gating::Sigmoid,
                true, routedScale, ids.data(), weights.data());
  ASSERT_TRUE(s.isOk()) << errorText(s);
  EXPECT_EQ(ids, expected);
  for (int64_t k = 0; k < topK; ++k)
    // Each p is within a few u of the exact sigmoid of its f32 logit; the
    // sum of topK of them adds topK u, the division and scale two more.
    EXPECT_NEAR(weights[k], p[expected[k]] / sum * routedScale,
                (topK + 8) * kU * p[expected[k]] / sum * routedScale)
        << k;

  expectError(moeChoose(logits.data(), experts, nullptr, experts + 1,
                        Gating::Sigmoid, true, 1.0f, ids.data(),
                        weights.data()),
              {"moe_choose", "top k 33"});
}

TEST(RouterPartial, MatchesTheNaiveShareAndTheRanksSumToTheLogits) {
  SCOPED_TRACE(seedText(30));
  std::mt19937 gen = generator(30);
  const int64_t hidden = 128, experts = 16, ranks = 4;
  const float scale = 1.0f / ranks;
  TestWeight gate =
      randomWeight(gen, GGMLType::F32, {hidden, experts}, "blk.3.ffn_gate_inp");
  std::vector<float> norm = randomVector(gen, hidden, 0.5f, 1.5f);
  std::vector<float> residual = randomVector(gen, hidden, -2.0f, 2.0f);
  std::vector<std::vector<float>> partials;
  for (int64_t r = 0; r < ranks; ++r)
    partials.push_back(randomVector(gen, hidden));

  std::vector<double> total(experts, 0.0), totalAbs(experts, 0.0);
  for (const std::vector<float> &partial : partials) {
    std::vector<float> out(experts);
    Status s = routerPartial(partial.data(), residual.data(), hidden,
                             gate.view(), norm.data(), scale, out.data());
    ASSERT_TRUE(s.isOk()) << errorText(s);
    for (int64_t e = 0; e < experts; ++e) {
      double exact = 0, abs = 0;
      for (int64_t h = 0; h < hidden; ++h) {
        const double v = double(norm[h]) *
                         (double(partial[h]) + double(scale) * residual[h]);
        exact += gate.at(e, h) * v;
        abs += std::abs(double(gate.at(e, h))) * std::abs(double(norm[h])) *
               (std::abs(double(partial[h])) +
                std::abs(double(scale) * residual[h]));
      }
      // Each v[h] has three roundings (the scale's product, the sum, the
      // norm's product), within 3 u of the sum of absolute terms; the dot
      // of hidden products adds (hidden + 1) u.
      EXPECT_NEAR(out[e], exact, (hidden + 4) * kU * abs) << e;
      total[e] += out[e];
      totalAbs[e] += abs;
    }
  }
  // In real arithmetic the ranks' shares sum to gate . (norm * (residual +
  // sum of the partials)): the router's logits times the norm's rms.
  for (int64_t e = 0; e < experts; ++e) {
    double logit = 0;
    for (int64_t h = 0; h < hidden; ++h) {
      double sumOfParts = residual[h];
      for (const std::vector<float> &partial : partials)
        sumOfParts += partial[h];
      logit += gate.at(e, h) * double(norm[h]) * sumOfParts;
    }
    // The shares are added in double here: only each share's bound counts.
    EXPECT_NEAR(total[e], logit, (hidden + 4) * kU * totalAbs[e]) << e;
  }

  std::vector<float> out(experts);
  expectError(routerPartial(partials[0].data(), residual.data(), 64,
                            gate.view(), norm.data(), scale, out.data()),
              {"router_partial", "blk.3.ffn_gate_inp", "hidden"});
}

//===----------------------------------------------------------------------===//
// moeExperts
//===----------------------------------------------------------------------===//

namespace {

struct ExpertsProblem {
  int64_t hidden = 256, ffn = 64, experts = 6;
  std::vector<float> x;
  TestWeight gate, up, down, gateUp;
  std::vector<int32_t> ids = {4, 0, 2};
  std::vector<float> weights;

  explicit ExpertsProblem(std::mt19937 &gen) {
    x = randomVector(gen, hidden);
    gate = randomWeight(gen, GGMLType::Q4_K, {hidden, ffn, experts},
                        "blk.3.ffn_gate_exps");
    up = randomWeight(gen, GGMLType::Q4_K, {hidden, ffn, experts},
                      "blk.3.ffn_up_exps");
    down = randomWeight(gen, GGMLType::Q8_0, {ffn, hidden, experts},
                        "blk.3.ffn_down_exps");
    weights = randomVector(gen, ids.size(), 0.1f, 1.0f);
    // gate_up: per expert its F gate rows, then its F up rows, byte for
    // byte (rows are whole blocks, so this is the same quantised data).
    gateUp = gate;
    gateUp.name = "blk.3.ffn_gate_up_exps";
    gateUp.dims = {hidden, 2 * ffn, experts};
    gateUp.bytes.clear();
    gateUp.values.clear();
    const size_t rowB = *rowBytes(GGMLType::Q4_K, hidden);
    for (int64_t e = 0; e < experts; ++e)
      for (const TestWeight *w : {&gate, &up}) {
        auto first = w->bytes.begin() + e * ffn * rowB;
        gateUp.bytes.insert(gateUp.bytes.end(), first, first + ffn * rowB);
        auto v = w->values.begin() + e * ffn * hidden;
        gateUp.values.insert(gateUp.values.end(), v, v + ffn * hidden);
      }
  }
};

} // namespace

TEST(MoeExperts, SeparateAndFusedMatchTheNaiveSum) {
  SCOPED_TRACE(seedText(23));
  std::mt19937 gen = generator(23);
  ExpertsProblem p(gen);
  ThreadPool pool(3);
  const WeightView g = p.gate.view(), u = p.up.view(), d = p.down.view(),
                   gu = p.gateUp.view();
  std::vector<float> separate(p.hidden, -99.0f), fused(p.hidden, -99.0f);
  Status s = moeExperts(p.x.data(), p.hidden, p.ids.data(), p.weights.data(), 3,
                        {&g, &u, &d}, separate.data(), pool);
  ASSERT_TRUE(s.isOk()) << errorText(s);
  s = moeExperts(p.x.data(), p.hidden, p.ids.data(), p.weights.data(), 3,
                 {&gu, &d}, fused.data(), pool);
  ASSERT_TRUE(s.isOk()) << errorText(s);
  // Same rows, same arithmetic: the same bits.
  EXPECT_EQ(std::memcmp(separate.data(), fused.data(),
                        separate.size() * sizeof(float)),
            0);

  // Naive: out[h] = sum_k w_k sum_f Wd[h][f] silu(g_f) u_f in double, with
  // a first-order bound on the kernel's f32 error: g and u are sums of
  // `hidden` products (error gammaH times their absolute sums gAbs, uAbs);
  // silu has slope at most 1.1; the down sum adds gammaF of its absolute
  // terms; exp and the final k-sum add a few u. Doubled. gamma_n is Higham
  // and Mary's probabilistic 4 sqrt(n) u (it models rounding errors as
  // independent), not the worst case (n + 1) u: over two chained sums the
  // worst case is loose enough to miss a dropped term of the down sum. The
  // data is seeded, and the measured error sits ~700x below this bound.
  std::vector<double> exact(p.hidden, 0.0), bound(p.hidden, 0.0);
  const double gammaH = 4 * std::sqrt(p.hidden + 1.0) * kU,
               gammaF = 4 * std::sqrt(p.ffn + 1.0) * kU;
  for (size_t k = 0; k < p.ids.size(); ++k) {
    const int64_t e = p.ids[k];
    std::vector<double> act(p.ffn), actError(p.ffn);
    for (int64_t f = 0; f < p.ffn; ++f) {
      double gv = 0, uv = 0, gAbs = 0, uAbs = 0;
      for (int64_t i = 0; i < p.hidden; ++i) {
        gv += double(p.x[i]) * p.gate.at(e * p.ffn + f, i);
        uv += double(p.x[i]) * p.up.at(e * p.ffn + f, i);
        gAbs += std::abs(double(p.x[i]) * p.gate.at(e * p.ffn + f, i));
        uAbs += std::abs(double(p.x[i]) * p.up.at(e * p.ffn + f, i));
      }
      act[f] = silu(gv) * uv;
      actError[f] =
          gammaH * (1.1 * gAbs * std::abs(uv) + std::abs(silu(gv)) * uAbs) +
          8 * kU * std::abs(act[f]);
    }
    for (int64_t h = 0; h < p.hidden; ++h) {
      double sum = 0, absSum = 0, propagated = 0;
      for (int64_t f = 0; f < p.ffn; ++f) {
        sum += p.down.at(e * p.hidden + h, f) * act[f];
        absSum += std::abs(p.down.at(e * p.hidden + h, f) * act[f]);
        propagated += std::abs(p.down.at(e * p.hidden + h, f)) * actError[f];
      }
      exact[h] += p.weights[k] * sum;
      bound[h] += p.weights[k] *
                  (gammaF * absSum + propagated + 4 * kU * std::abs(sum));
    }
  }
  for (int64_t h = 0; h < p.hidden; ++h)
    ASSERT_NEAR(separate[h], exact[h], 2 * bound[h]) << h;
}

TEST(MoeExperts, BadIdsAndShapesAreErrors) {
  SCOPED_TRACE(seedText(24));
  std::mt19937 gen = generator(24);
  ExpertsProblem p(gen);
  ThreadPool pool(2);
  const WeightView g = p.gate.view(), u = p.up.view(), d = p.down.view(),
                   gu = p.gateUp.view();
  std::vector<float> out(p.hidden);
  for (int32_t bad : {6, -1}) {
    std::vector<int32_t> ids = {1, bad, 2};
    expectError(moeExperts(p.x.data(), p.hidden, ids.data(), p.weights.data(),
                           3, {&g, &u, &d}, out.data(), pool),
                {"blk.3.ffn_down_exps", "expert id " + std::to_string(bad)});
  }
  // A fused tensor passed where a gate is expected has 2F rows, not F.
  expectError(moeExperts(p.x.data(), p.hidden, p.ids.data(), p.weights.data(),
                         3, {&gu, &u, &d}, out.data(), pool),
              {"blk.3.ffn_gate_up_exps", "dims"});
  expectError(moeExperts(p.x.data(), p.hidden, p.ids.data(), p.weights.data(),
                         3, {&g, &d}, out.data(), pool),
              {"blk.3.ffn_gate_exps", "dims"});
  expectError(moeExperts(p.x.data(), 128, p.ids.data(), p.weights.data(), 3,
                         {&g, &u, &d}, out.data(), pool),
              {"blk.3.ffn_down_exps", "hidden"});
  expectError(moeExperts(p.x.data(), p.hidden, p.ids.data(), p.weights.data(),
                         3, {&d}, out.data(), pool),
              {"gate"});
  WeightView shortDown = d;
  shortDown.bytes -= 34;
  expectError(moeExperts(p.x.data(), p.hidden, p.ids.data(), p.weights.data(),
                         3, {&g, &u, &shortDown}, out.data(), pool),
              {"blk.3.ffn_down_exps", "bytes"});
}

//===----------------------------------------------------------------------===//
// Determinism across thread counts
//===----------------------------------------------------------------------===//

namespace {
bool sameBits(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
} // namespace

TEST(Determinism, OneAndThreeThreadsGiveTheSameBits) {
  SCOPED_TRACE(seedText(25));
  std::mt19937 gen = generator(25);
  ThreadPool one(1), three(3);

  TestWeight w = randomWeight(gen, GGMLType::Q4_K, {256, 37}, "w");
  TestWeight stacked = randomWeight(gen, GGMLType::Q8_0, {64, 7, 2}, "s");
  std::vector<float> x = randomVector(gen, 2 * 256);
  auto runLinear = [&](const TestWeight &weight, ThreadPool &pool) {
    std::vector<float> y(2 * weight.dims[1]);
    Status s = linear(x.data(), 2, weight.view(), y.data(), pool);
    EXPECT_TRUE(s.isOk()) << errorText(s);
    return y;
  };
  EXPECT_TRUE(sameBits(runLinear(w, one), runLinear(w, three)));
  EXPECT_TRUE(sameBits(runLinear(stacked, one), runLinear(stacked, three)));

  MlaProblem m(gen, CacheType::BF16, 5);
  auto runAttention = [&](ThreadPool &pool) {
    std::vector<float> out(m.heads * m.latent);
    Status s = mlaAttention(m.qLatent.data(), m.qRope.data(), m.heads, m.latent,
                            m.rope, m.cache.view(), m.position, nullptr,
                            nullptr, m.scale, out.data(), pool);
    EXPECT_TRUE(s.isOk()) << errorText(s);
    return out;
  };
  EXPECT_TRUE(sameBits(runAttention(one), runAttention(three)));

  ExpertsProblem e(gen);
  auto runExperts = [&](ThreadPool &pool) {
    const WeightView gu = e.gateUp.view(), d = e.down.view();
    std::vector<float> out(e.hidden);
    Status s = moeExperts(e.x.data(), e.hidden, e.ids.data(), e.weights.data(),
                          3, {&gu, &d}, out.data(), pool);
    EXPECT_TRUE(s.isOk()) << errorText(s);
    return out;
  };
  EXPECT_TRUE(sameBits(runExperts(one), runExperts(three)));
}
