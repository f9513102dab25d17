//===- Sampler.h - Choosing the next token from logits ----------*- C++ -*-===//
#ifndef KILN_RUNTIME_SESSION_SAMPLER_H
#define KILN_RUNTIME_SESSION_SAMPLER_H

#include "support/Random.h"

#include <cstdint>
#include <span>
#include <vector>

namespace kiln::runtime {

struct SamplingOptions {
  double temperature = 0; ///< 0: greedy (argmax, ties to the lowest id)
  int64_t topK = 0;       ///< keep the k most likely; 0: all
  double topP = 1;        ///< keep the smallest set with this much mass
  uint64_t seed = 0;

  bool greedy() const { return temperature <= 0; }
};

/// Deterministic sampling: the same options, seed and logits give the same
/// tokens on every machine (the generator and the arithmetic are fixed:
/// xoshiro256** seeded by splitmix64, softmax in double).
class Sampler {
public:
  explicit Sampler(const SamplingOptions &options);
  int32_t sample(std::span<const float> logits);

private:
  SamplingOptions options_;
  Rng rng_;
  std::vector<int32_t> order_;
  std::vector<double> probs_;
};

/// Index of the largest logit; ties to the lowest index.
int32_t argmax(std::span<const float> logits);

} // namespace kiln::runtime

#endif // KILN_RUNTIME_SESSION_SAMPLER_H
