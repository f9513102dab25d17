//===- Sampler.cpp - Choosing the next token from logits -------------------===//
#include "session/Sampler.h"

#include <algorithm>
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

Sampler::Sampler(const SamplingOptions &options)
    : options_(options), rng_(options.seed) {}

void Sampler::orderTokens(std::span<const float> logits,
                          std::span<const uint8_t> allowed) {
  // A key a token: its logit's bits made to sort as the value does, then
  // inverted (most likely first), above its id (ties to the lower id).
  keys_.clear();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!allowed.empty() && (i >= allowed.size() || !allowed[i]))
      continue;
    uint32_t bits;
    std::memcpy(&bits, &logits[i], sizeof bits);
    if (bits == 0x80000000u)
      bits = 0; // -0 ties with +0, as the comparison has it
    bits = bits & 0x80000000u ? ~bits : bits | 0x80000000u;
    keys_.push_back(uint64_t(~bits) << 32 | uint32_t(i));
  }
  // The keys are distinct (the ids are), so any sort gives one order. A
  // short list by comparisons; a long one (a vocabulary) by a stable
  // counting sort of the logit's 32 bits alone, 11 at a time from the
  // least significant (the keys were made in the ids' order, which ties
  // keep), a digit every key shares skipped.
  if (keys_.size() < 4096) {
    std::sort(keys_.begin(), keys_.end());
  } else {
    constexpr int kBits = 11;
    constexpr uint64_t kMask = (uint64_t(1) << kBits) - 1;
    spare_.resize(keys_.size());
    std::vector<uint32_t> &count = counts_;
    for (int shift = 32; shift < 64; shift += kBits) {
      count.assign(size_t(kMask) + 2, 0);
      for (uint64_t k : keys_)
        ++count[((k >> shift) & kMask) + 1];
      if (std::find(count.begin(), count.end(), keys_.size()) != count.end())
        continue;
      for (size_t d = 1; d < count.size(); ++d)
        count[d] += count[d - 1];
      for (uint64_t k : keys_)
        spare_[count[(k >> shift) & kMask]++] = k;
      keys_.swap(spare_);
    }
  }
  order_.resize(keys_.size());
  for (size_t i = 0; i < keys_.size(); ++i)
    order_[i] = int32_t(uint32_t(keys_[i]));
}

int32_t Sampler::sample(std::span<const float> input,
                        std::span<const int32_t> history,
                        std::span<const uint8_t> allowed) {
  std::span<const float> logits = input;
  size_t allowedCount = 0;
  if (options_.penalises() || !allowed.empty()) {
    penalised_.assign(input.begin(), input.end());
    for (auto [token, bias] : options_.logitBias)
      if (token >= 0 && size_t(token) < penalised_.size())
        penalised_[size_t(token)] += bias;
    // The window's tokens, sorted, so each distinct one comes as a run
    // whose length is its count: the work is the window's, not the
    // vocabulary's.
    size_t from = history.size() > size_t(options_.repeatWindow)
                      ? history.size() - size_t(options_.repeatWindow)
                      : 0;
    window_.assign(history.begin() + ptrdiff_t(from), history.end());
    std::sort(window_.begin(), window_.end());
    for (size_t i = 0; i < window_.size();) {
      const int32_t t = window_[i];
      size_t count = 0;
      for (; i < window_.size() && window_[i] == t; ++i)
        ++count;
      if (t < 0 || size_t(t) >= penalised_.size())
        continue;
      float &l = penalised_[size_t(t)];
      // llama.cpp's rule: a recent token's positive logit is divided by the
      // repeat penalty, a negative one multiplied, once however often it
      // occurred; then OpenAI's additive penalties.
      if (options_.repeatPenalty != 1)
        l = l > 0 ? float(l / options_.repeatPenalty)
                  : float(l * options_.repeatPenalty);
      if (options_.frequencyPenalty != 0 || options_.presencePenalty != 0)
        l = float(double(l) - options_.frequencyPenalty * double(count) -
                  options_.presencePenalty);
    }
    // The tokens not allowed sort after every allowed one (whose logits
    // are finite), and no cut keeps them.
    for (size_t i = 0; i < penalised_.size(); ++i)
      if (i < allowed.size() && allowed[i])
        ++allowedCount;
      else if (!allowed.empty())
        penalised_[i] = -std::numeric_limits<float>::infinity();
    if (!allowed.empty() && allowedCount == 0)
      return -1;
    logits = penalised_;
  }
  if (!allowed.empty() && (options_.greedy() || logits.size() <= 1)) {
    int32_t best = -1;
    for (size_t i = 0; i < logits.size(); ++i)
      if (i < allowed.size() && allowed[i] &&
          (best < 0 || logits[i] > logits[size_t(best)]))
        best = int32_t(i);
    return best;
  }
  if (options_.greedy() || logits.size() <= 1)
    return argmax(logits);
  orderTokens(logits, allowed);
  size_t keep = allowed.empty() ? order_.size() : allowedCount;
  if (options_.topK > 0)
    keep = std::min(keep, size_t(options_.topK));
  probs_.resize(keep);
  double top = logits[order_[0]], sum = 0;
  for (size_t i = 0; i < keep; ++i)
    sum += probs_[i] = std::exp((logits[order_[i]] - top) / options_.temperature);
  if (options_.minP > 0) {
    // probs_[0] is the most likely token's (unnormalised) probability.
    double floor = options_.minP * probs_[0];
    size_t kept = 1;
    while (kept < keep && probs_[kept] >= floor)
      ++kept;
    keep = kept;
    sum = 0;
    for (size_t i = 0; i < keep; ++i)
      sum += probs_[i];
  }
  if (options_.topP < 1) {
    double mass = 0;
    for (size_t i = 0; i < keep; ++i) {
      mass += probs_[i] / sum;
      if (mass >= options_.topP) {
        keep = i + 1;
        break;
      }
    }
    sum = 0;
    for (size_t i = 0; i < keep; ++i)
      sum += probs_[i];
  }
  double u = rng_.uniform() * sum;
  for (size_t i = 0; i < keep; ++i) {
    if (u < probs_[i])
      return order_[i];
    u -= probs_[i];
  }
  return order_[keep - 1];
}

} // namespace kiln::runtime
