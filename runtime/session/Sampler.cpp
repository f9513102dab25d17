//===- Sampler.cpp - Choosing the next token from logits -------------------===//
#include "session/Sampler.h"
#include "support/DrawKey.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

namespace kiln::runtime {

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best])
      best = int32_t(i);
  return best;
}

std::optional<KeyDraw> keyDraw(const SamplingOptions &options, int64_t vocab) {
  if (options.greedy() || !(options.topP > 0) || !(options.minP >= 0))
    return std::nullopt;
  const float t = float(options.temperature);
  if (!(t >= draw::kMinTemperature && t <= draw::kMaxTemperature))
    return std::nullopt;
  // A share that rounds to 1 in float keeps every token.
  const float p = options.topP < 1 ? float(options.topP) : 0.0f;
  // The Sampler's floor: min-p as a float, at most 1 (0: none).
  const float m = float(std::min(options.minP, 1.0));
  // top-k: none where it keeps every token (a count at least the
  // vocabulary's, which no vocabulary of 32-bit ids exceeds).
  const int32_t k =
      options.topK > 0 && options.topK < vocab && options.topK < INT32_MAX
          ? int32_t(options.topK)
          : 0;
  return KeyDraw{t, p < 1.0f ? p : 0.0f, m, k};
}

int32_t drawToken(std::span<const float> logits, KeyDraw draw, uint64_t seed,
                  int32_t position) {
  if (logits.empty())
    return -1;
  float key;
  return int32_t(draw::drawWhole(logits.data(), int64_t(logits.size()),
                                 draw.params(seed), uint32_t(position), key));
}

Sampler::Sampler(const SamplingOptions &options)
    : options_(options), rng_(options.seed) {}

namespace {

/// Bits that sort (ascending) as the logit does, largest first: its bits
/// made to sort as the value does (-0 as +0), inverted.
inline uint32_t orderBits(float logit) {
  uint32_t bits = std::bit_cast<uint32_t>(logit);
  bits = bits == 0x80000000u ? 0 : bits;
  // Negative values: every bit flipped; others: the sign bit set.
  const uint32_t flip = uint32_t(int32_t(bits) >> 31) | 0x80000000u;
  return ~(bits ^ flip);
}

} // namespace

void Sampler::narrow(bool byMass, double want) {
  // One pass over the weights, counting (or weighing) the tokens at or
  // above each of eight thresholds: in float within a block of 1,024
  // (exact for counts; a lane's 256 additions are within 1.6e-5 of the
  // sum) and in double across blocks. The set becomes the tokens at or above
  // the highest threshold that holds `want`, with a margin of 1e-4 for the
  // float sums: it contains every token keepBest keeps, because the
  // weights follow the order.
  static constexpr float kTau[8] = {0x1p-1f,  0x1p-2f,  0x1p-4f,  0x1p-8f,
                                    0x1p-16f, 0x1p-32f, 0x1p-64f, 0x1p-125f};
  if (!whole_)
    return;
  const float *w = weights_.data();
  const size_t n = weights_.size();
  // Four tokens at a time in the compiler's vector types (plain code where
  // the target has no vectors): a mask a threshold, and the weights (or
  // ones) it keeps added into that threshold's four lanes.
  typedef float Floats __attribute__((vector_size(16)));
  typedef int32_t Ints __attribute__((vector_size(16)));
  const Ints one = {0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000}; // 1.0f
  double total[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (size_t b = 0; b < n; b += 1024) {
    const size_t end = std::min(n, b + 1024);
    Floats lanes[8] = {};
    size_t i = b;
    for (; i + 4 <= end; i += 4) {
      Floats x;
      std::memcpy(&x, w + i, sizeof x);
      const Ints value = byMass ? std::bit_cast<Ints>(x) : one;
      for (int j = 0; j < 8; ++j) {
        const Ints keep = x >= kTau[j];
        const Ints kept = value & keep;
        lanes[j] += std::bit_cast<Floats>(kept);
      }
    }
    for (int j = 0; j < 8; ++j) {
      float rest = 0;
      for (size_t k = i; k < end; ++k)
        rest += w[k] >= kTau[j] ? (byMass ? w[k] : 1.0f) : 0.0f;
      total[j] += double((lanes[j][0] + lanes[j][1]) +
                         (lanes[j][2] + lanes[j][3]) + rest);
    }
  }
  const double enough = byMass ? want * (1 + 1e-4) : want;
  for (int j = 0; j < 8; ++j) {
    if (total[j] < enough)
      continue;
    // Each id written, the count advanced only past those kept: no branch.
    ids_.resize(n);
    size_t kept = 0;
    for (size_t i = 0; i < n; ++i) {
      ids_[kept] = int32_t(i);
      kept += w[i] >= kTau[j];
    }
    ids_.resize(kept);
    whole_ = false;
    return;
  }
}

void Sampler::keepBest(std::span<const float> logits, bool byMass,
                       double want) {
  // A radix selection on the order's bits, most significant digit first:
  // each pass sums the weight of the candidates by digit, finds the digit
  // where the weight of everything before it reaches `want`, and keeps
  // only the candidates with that digit. After the last digit the
  // candidates share the cut's logit; they are taken by id, as the order's
  // ties are. The set (every token with weight where whole_, else ids_) is
  // laid out once as ids, order bits and weights in id order; the first
  // pass and the last read those arrays, the others only the candidates'
  // places in them.
  if (whole_) {
    ids_.resize(weights_.size());
    size_t kept = 0;
    for (size_t i = 0; i < weights_.size(); ++i) {
      ids_[kept] = int32_t(i);
      kept += weights_[i] > 0;
    }
    ids_.resize(kept);
    whole_ = false;
  }
  const size_t n = ids_.size();
  setBits_.resize(n);
  setWeights_.resize(n);
  uint32_t lo = ~0u, hi = 0;
  for (size_t k = 0; k < n; ++k) {
    const size_t id = size_t(ids_[k]);
    setBits_[k] = orderBits(logits[id]);
    setWeights_[k] = byMass ? weights_[id] : 1.0f;
    lo = std::min(lo, setBits_[k]);
    hi = std::max(hi, setBits_[k]);
  }
  // The bits every token of the set shares need no pass: the digits start
  // below them, 11 bits at a time (so that a narrow set still spreads over
  // the tables).
  double before = 0; // the weight of the tokens ahead of the candidates
  uint32_t cut = lo;
  places_.clear();
  if (lo == hi) // one logit: the tokens by id
    for (size_t k = 0; k < n; ++k)
      places_.push_back(uint32_t(k));
  for (int high = lo == hi ? -1 : 31 - std::countl_zero(lo ^ hi); high >= 0;) {
    const int width = std::min(11, high + 1), shift = high + 1 - width;
    const bool first = places_.empty();
    high = shift - 1;
    const uint32_t mask = (1u << width) - 1;
    cut &= ~(mask << shift);
    digitWeight_.assign(size_t(mask) + 1, 0);
    if (first)
      for (size_t k = 0; k < n; ++k)
        digitWeight_[(setBits_[k] >> shift) & mask] += setWeights_[k];
    else
      for (uint32_t k : places_)
        digitWeight_[(setBits_[k] >> shift) & mask] += setWeights_[k];
    // The first digit at which `want` is reached; the last with weight if
    // rounding leaves it short.
    uint32_t digit = 0, last = 0;
    double run = before, runAtLast = before;
    bool found = false;
    for (uint32_t d = 0; d <= mask; ++d) {
      if (digitWeight_[d] == 0)
        continue;
      if (run + digitWeight_[d] >= want) {
        digit = d;
        found = true;
        break;
      }
      last = d;
      runAtLast = run;
      run += digitWeight_[d];
    }
    if (!found) {
      digit = last;
      run = runAtLast;
    }
    before = run;
    cut |= digit << shift;
    if (first) {
      for (size_t k = 0; k < n; ++k)
        if (((setBits_[k] >> shift) & mask) == digit)
          places_.push_back(uint32_t(k));
    } else {
      size_t kept = 0;
      for (uint32_t k : places_)
        if (((setBits_[k] >> shift) & mask) == digit)
          places_[kept++] = k;
      places_.resize(kept);
    }
  }
  size_t lastPlace = places_.empty() ? 0 : places_.back();
  for (uint32_t k : places_) {
    before += setWeights_[k];
    if (before >= want) {
      lastPlace = k;
      break;
    }
  }
  // The tokens ahead of the cut's logit, and those at it up to the last
  // place taken; written in place, the count advanced only past them.
  size_t kept = 0;
  for (size_t k = 0; k < n; ++k) {
    ids_[kept] = ids_[k];
    kept += setBits_[k] < cut || (setBits_[k] == cut && k <= lastPlace);
  }
  ids_.resize(kept);
}

std::vector<draw::Adjustment> makeAdjustments(const SamplingOptions &options,
                                              std::span<const int32_t> history,
                                              int64_t vocab) {
  return makeAdjustments(options.logitBias, penaltiesOf(options),
                         options.repeatWindow, history, vocab);
}

int64_t mostAdjustments(const SamplingOptions &options, int64_t vocab) {
  std::vector<int32_t> ids;
  for (auto [token, bias] : options.logitBias)
    if (token >= 0 && token < vocab)
      ids.push_back(token);
  std::sort(ids.begin(), ids.end());
  const int64_t biased = std::unique(ids.begin(), ids.end()) - ids.begin();
  return biased + (penaltiesOf(options) == draw::Penalties{}
                       ? 0
                       : std::max<int64_t>(options.repeatWindow, 0));
}

void adjustLogits(std::span<float> logits, const SamplingOptions &options,
                  std::span<const int32_t> history) {
  const draw::Penalties p = penaltiesOf(options);
  for (const draw::Adjustment &e :
       makeAdjustments(options, history, int64_t(logits.size())))
    logits[size_t(e.id)] =
        draw::adjustLogit(logits[size_t(e.id)], e.bias, e.count, p);
}

std::vector<draw::Adjustment>
makeAdjustments(std::span<const std::pair<int32_t, float>> logitBias,
                const draw::Penalties &penalties, int64_t repeatWindow,
                std::span<const int32_t> history, int64_t vocab) {
  std::vector<draw::Adjustment> entries;
  for (auto [token, bias] : logitBias)
    if (token >= 0 && token < vocab)
      entries.push_back({token, bias, 0});
  // The biases by id, each id's summed in the order given (a stable sort
  // keeps it).
  std::stable_sort(entries.begin(), entries.end(),
                   [](const draw::Adjustment &a, const draw::Adjustment &b) {
                     return a.id < b.id;
                   });
  size_t kept = 0;
  for (size_t i = 0; i < entries.size(); ++i)
    if (kept > 0 && entries[kept - 1].id == entries[i].id)
      entries[kept - 1].bias += entries[i].bias;
    else
      entries[kept++] = entries[i];
  entries.resize(kept);
  if (penalties == draw::Penalties{})
    return entries;
  // The window's tokens, sorted, so each distinct one comes as a run whose
  // length is its count: the work is the window's, not the vocabulary's.
  const size_t last = size_t(std::max<int64_t>(repeatWindow, 0));
  const size_t from = history.size() > last ? history.size() - last : 0;
  std::vector<int32_t> window(history.begin() + ptrdiff_t(from), history.end());
  std::sort(window.begin(), window.end());
  std::vector<draw::Adjustment> merged;
  merged.reserve(entries.size() + window.size());
  size_t b = 0;
  for (size_t i = 0; i < window.size();) {
    const int32_t t = window[i];
    int32_t count = 0;
    for (; i < window.size() && window[i] == t; ++i)
      ++count;
    if (t < 0 || t >= vocab)
      continue;
    for (; b < entries.size() && entries[b].id < t; ++b)
      merged.push_back(entries[b]);
    if (b < entries.size() && entries[b].id == t)
      merged.push_back({t, entries[b++].bias, count});
    else
      merged.push_back({t, 0.0f, count});
  }
  merged.insert(merged.end(), entries.begin() + ptrdiff_t(b), entries.end());
  return merged;
}

draw::Penalties penaltiesOf(const SamplingOptions &options) {
  return {options.repeatPenalty, options.frequencyPenalty,
          options.presencePenalty};
}

std::span<const float> Sampler::penalise(std::span<const float> input,
                                         std::span<const int32_t> history,
                                         std::span<const uint8_t> allowed,
                                         size_t &allowedCount) {
  allowedCount = 0;
  if (!options_.penalises() && allowed.empty())
    return input;
  penalised_.assign(input.begin(), input.end());
  adjustLogits(penalised_, options_, history);
  // The tokens not allowed get no weight, and no cut keeps them.
  for (size_t i = 0; i < penalised_.size(); ++i)
    if (i < allowed.size() && allowed[i])
      ++allowedCount;
    else if (!allowed.empty())
      penalised_[i] = -std::numeric_limits<float>::infinity();
  return penalised_;
}

int32_t Sampler::choose(std::span<const float> input,
                        std::span<const int32_t> history,
                        std::span<const uint8_t> allowed, bool draw) {
  size_t allowedCount = 0;
  std::span<const float> logits =
      penalise(input, history, allowed, allowedCount);
  whole_ = false;
  ids_.clear();
  if (!allowed.empty() && allowedCount == 0)
    return -1;
  // The largest logit of the tokens that may be chosen, ties to the lower
  // id (the disallowed ones are -infinity now, NaN never wins).
  int32_t best = -1;
  if (allowed.empty() && !logits.empty()) {
    // The largest value in eight lanes (a loop that vectorises; NaN never
    // wins), then its first token.
    float lane[8];
    std::fill(lane, lane + 8, -std::numeric_limits<float>::infinity());
    size_t i = 0;
    for (; i + 8 <= logits.size(); i += 8)
      for (size_t j = 0; j < 8; ++j)
        lane[j] = logits[i + j] > lane[j] ? logits[i + j] : lane[j];
    for (; i < logits.size(); ++i)
      lane[0] = logits[i] > lane[0] ? logits[i] : lane[0];
    const float most = *std::max_element(lane, lane + 8);
    best = 0; // every logit NaN or -infinity: the first, as argmax has it
    // Its first token: 64 at a time, each group tested whole (a loop that
    // vectorises), then the group that holds it token by token.
    constexpr size_t kGroup = 64;
    for (size_t g = 0, n = logits.size(); g < n; g += kGroup) {
      const size_t end = std::min(n, g + kGroup);
      bool here = false;
      for (size_t k = g; k < end; ++k)
        here |= logits[k] == most;
      if (!here)
        continue;
      for (size_t k = g; k < end; ++k)
        if (logits[k] == most) {
          best = int32_t(k);
          break;
        }
      break;
    }
  } else {
    for (size_t i = 0; i < logits.size(); ++i)
      if ((allowed.empty() || (i < allowed.size() && allowed[i])) &&
          (best < 0 || logits[i] > logits[size_t(best)]))
        best = int32_t(i);
  }
  const float top = best < 0 ? 0.0f : logits[size_t(best)];
  // Greedy, one token, or no finite best (weights would be 0 or NaN): the
  // best one.
  if (options_.greedy() || logits.size() <= 1 || best < 0 ||
      !std::isfinite(top)) {
    if (best >= 0 && !draw) {
      ids_.push_back(best);
      weights_.assign(logits.size(), 0.0f);
      weights_[size_t(best)] = 1;
    }
    return best;
  }
  // Weights e^((l - top) / T), the best token's exactly 1. A temperature so
  // small that 1 / T overflows a float keeps the best tokens alone.
  const float scale = float(std::min(
      1.0 / options_.temperature, double(std::numeric_limits<float>::max())));
  weights_.resize(logits.size());
  const float *__restrict in = logits.data();
  float *__restrict out = weights_.data();
  for (size_t i = 0, n = logits.size(); i < n; ++i)
    out[i] = draw::expNonPositive((in[i] - top) * scale);
  // The set is every token with weight, until a cut names its tokens.
  whole_ = true;
  // min-p keeps every token of weight at least minP (the best one's is 1):
  // a cut of the order itself, so it may come before top-k.
  if (options_.minP > 0) {
    const float least = float(std::min(options_.minP, 1.0));
    for (size_t i = 0, n = logits.size(); i < n; ++i)
      out[i] = out[i] >= least ? out[i] : 0.0f;
  }
  if (options_.topK > 0) {
    narrow(/*byMass=*/false, double(options_.topK));
    keepBest(logits, /*byMass=*/false, double(options_.topK));
  }
  if (options_.topP < 1) {
    // The set's mass in four lanes of double (a fixed order; over the whole
    // vocabulary a loop that vectorises, where one running sum waited on
    // each addition).
    double lane[4] = {0, 0, 0, 0};
    const float *w = weights_.data();
    const size_t n = whole_ ? weights_.size() : ids_.size();
    size_t i = 0;
    if (whole_) {
      for (; i + 4 <= n; i += 4)
        for (size_t j = 0; j < 4; ++j)
          lane[j] += double(w[i + j]);
    } else {
      for (; i + 4 <= n; i += 4)
        for (size_t j = 0; j < 4; ++j)
          lane[j] += double(w[size_t(ids_[i + j])]);
    }
    for (; i < n; ++i)
      lane[0] += double(w[whole_ ? i : size_t(ids_[i])]);
    const double total = (lane[0] + lane[1]) + (lane[2] + lane[3]);
    narrow(/*byMass=*/true, options_.topP * total);
    keepBest(logits, /*byMass=*/true, options_.topP * total);
  }
  return draw ? walk() : best;
}

int32_t Sampler::walk() {
  // Inverse transform: u uniform in [0, sum), the first token whose
  // weights so far exceed it; rounding past the end picks the last token
  // with weight.
  // The weights are summed a block of 1024 at a time (four lanes in
  // double, in a fixed order), and the walk skips whole blocks.
  constexpr size_t kBlock = 1024;
  const float *w = weights_.data();
  auto draw = [&](auto weightAt, auto idAt, size_t n) -> int32_t {
    blockSums_.clear();
    double sum = 0;
    for (size_t b = 0; b < n; b += kBlock) {
      const size_t end = std::min(n, b + kBlock);
      double lane[4] = {0, 0, 0, 0};
      size_t i = b;
      for (; i + 4 <= end; i += 4)
        for (size_t j = 0; j < 4; ++j)
          lane[j] += double(weightAt(i + j));
      for (; i < end; ++i)
        lane[0] += double(weightAt(i));
      sum += blockSums_.emplace_back((lane[0] + lane[1]) + (lane[2] + lane[3]));
    }
    double u = rng_.uniform() * sum;
    int32_t last = -1;
    for (size_t b = 0, block = 0; b < n; b += kBlock, ++block) {
      if (blockSums_[block] <= 0)
        continue;
      if (u >= blockSums_[block] && b + kBlock < n) {
        u -= blockSums_[block];
        continue;
      }
      // Within this block (or the last): rounding past its end picks its
      // last token with weight.
      for (size_t i = b, end = std::min(n, b + kBlock); i < end; ++i) {
        const float x = weightAt(i);
        if (x <= 0)
          continue;
        last = idAt(i);
        if (u < x)
          return last;
        u -= x;
      }
      return last;
    }
    return last;
  };
  if (whole_)
    return draw([&](size_t i) { return w[i]; },
                [](size_t i) { return int32_t(i); }, weights_.size());
  const int32_t *ids = ids_.data();
  return draw([&](size_t i) { return w[size_t(ids[i])]; },
              [&](size_t i) { return ids[i]; }, ids_.size());
}

int32_t Sampler::sample(std::span<const float> logits,
                        std::span<const int32_t> history,
                        std::span<const uint8_t> allowed) {
  return choose(logits, history, allowed, /*draw=*/true);
}

std::vector<std::pair<int32_t, double>>
Sampler::distribution(std::span<const float> logits,
                      std::span<const int32_t> history,
                      std::span<const uint8_t> allowed) {
  std::vector<std::pair<int32_t, double>> out;
  if (choose(logits, history, allowed, /*draw=*/false) < 0)
    return out;
  if (whole_) {
    for (size_t i = 0; i < weights_.size(); ++i)
      if (weights_[i] > 0)
        out.emplace_back(int32_t(i), weights_[i]);
  } else {
    for (int32_t id : ids_)
      out.emplace_back(id, weights_[size_t(id)]);
  }
  double sum = 0;
  for (auto &[id, w] : out)
    sum += w;
  for (auto &[id, w] : out)
    w /= sum;
  return out;
}

} // namespace kiln::runtime
