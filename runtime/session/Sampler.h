//===- Sampler.h - Choosing the next token from logits ----------*- C++ -*-===//
#ifndef KILN_RUNTIME_SESSION_SAMPLER_H
#define KILN_RUNTIME_SESSION_SAMPLER_H

#include "support/DrawKey.h"
#include "support/Random.h"

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace kiln::runtime {

struct SamplingOptions {
  double temperature = 0; ///< 0: greedy (argmax, ties to the lowest id)
  int64_t topK = 0;       ///< keep the k most likely; 0: all
  double topP = 1;        ///< keep the smallest set with this much mass
  double minP = 0;        ///< keep tokens at least minP x the top one's
                          ///< probability
  double repeatPenalty = 1; ///< > 1 discourages the last repeatWindow tokens
  /// OpenAI's additive penalties over the same window: a token's logit less
  /// frequencyPenalty times its count there, and presencePenalty once if it
  /// occurs there at all.
  double frequencyPenalty = 0;
  double presencePenalty = 0;
  /// Added to the logits of these token ids before anything else (OpenAI's
  /// logit_bias).
  std::vector<std::pair<int32_t, float>> logitBias;
  int64_t repeatWindow = 64;
  uint64_t seed = 0;

  bool greedy() const { return temperature <= 0; }
  /// Whether the choice needs the logits on the host (anything but plain
  /// greedy, which the step's own argmax answers).
  bool needsLogits() const { return !greedy() || penalises(); }
  bool penalises() const {
    return repeatPenalty != 1 || frequencyPenalty != 0 ||
           presencePenalty != 0 || !logitBias.empty();
  }
};

/// Deterministic sampling: the same options, seed and logits give the same
/// tokens on every machine (xoshiro256** seeded by splitmix64; each token's
/// weight e^((l - max) / T) by the sampler's own float exponential, built
/// without fused multiply-adds; sums in double in a fixed order). It makes
/// the cuts, penalties, biases and constrained choices; a plain temperature
/// and its cuts without penalties are the keys' draw (keyDraw and
/// drawToken below, DrawKey.h), the step's own where it can make it.
///
/// A sampled choice costs a few passes over the vocabulary and no sort: the
/// draw walks its tokens by id. min-p is a threshold on the weights; top-k
/// and top-p keep the smallest set of the most likely tokens (ties to the
/// lower id) that holds k tokens or that share of the mass, found by a
/// radix selection on the logits' bits that sums counts or weights a digit
/// at a time.
class Sampler {
public:
  explicit Sampler(const SamplingOptions &options);
  /// The next token given the logits and the tokens so far (prompt and
  /// generated; only the last repeatWindow matter to the penalties). With
  /// `allowed` (one byte a token, non-zero: may be chosen), the choice is
  /// among those tokens alone, as if the others' logits were -infinity
  /// after the penalties; -1 when none is allowed. Where no allowed token
  /// has a finite logit, the largest one's (ties to the lower id).
  int32_t sample(std::span<const float> logits,
                 std::span<const int32_t> history = {},
                 std::span<const uint8_t> allowed = {});

  /// What `sample` draws from, without drawing: each token it may pick with
  /// its probability (summing to 1), by id. Empty where
  /// `sample` would return -1.
  std::vector<std::pair<int32_t, double>>
  distribution(std::span<const float> logits,
               std::span<const int32_t> history = {},
               std::span<const uint8_t> allowed = {});

private:
  SamplingOptions options_;
  std::vector<float> penalised_;
  Rng rng_;
  std::vector<float> weights_;          // a token's, by id
  std::vector<int32_t> ids_;            // the set a draw walks
  std::vector<uint32_t> setBits_, places_; // keepBest's
  std::vector<float> setWeights_;
  bool whole_ = false;                  // ... or every token by id
  std::vector<double> digitWeight_;     // keepBest's radix selection
  std::vector<double> blockSums_;       // walk's
  /// The logits after the bias, the penalties and the mask (disallowed
  /// tokens -infinity): `input` itself where none applies.
  std::span<const float> penalise(std::span<const float> input,
                                  std::span<const int32_t> history,
                                  std::span<const uint8_t> allowed,
                                  size_t &allowedCount);
  /// Fills weights_ and the set (ids_, or whole_) and returns a draw from
  /// it, or without `draw` the best token (-1: none allowed).
  int32_t choose(std::span<const float> logits,
                 std::span<const int32_t> history,
                 std::span<const uint8_t> allowed, bool draw);
  /// A draw from the set by its weights.
  int32_t walk();
  /// Where the set is whole_, makes it the tokens at or above the highest
  /// of a few weight thresholds whose tokens' count (or weight) reaches
  /// `want`: a superset of what keepBest keeps, found in one pass.
  void narrow(bool byMass, double want);
  /// Keeps of the set (whole_, or ids_ in id order) the most likely tokens,
  /// ties to the lower id, until their count (or, `byMass`, their weight)
  /// reaches `want`; they are ids_ after it.
  void keepBest(std::span<const float> logits, bool byMass, double want);
};

/// The adjustments (DrawKey.h) `options` make after `history` over a
/// vocabulary of `vocab` tokens: an entry a token that has a bias or, where
/// a penalty is set, is among the last repeatWindow tokens; ids ascending,
/// those outside the vocabulary left out, a bias given twice summed in
/// order. The Sampler applies them (penalise) and a step that adjusts
/// makes them from its sampling slot, so both adjust alike.
std::vector<draw::Adjustment>
makeAdjustments(std::span<const std::pair<int32_t, float>> logitBias,
                const draw::Penalties &penalties, int64_t repeatWindow,
                std::span<const int32_t> history, int64_t vocab);
std::vector<draw::Adjustment> makeAdjustments(const SamplingOptions &options,
                                              std::span<const int32_t> history,
                                              int64_t vocab);
/// The penalties' part of `options`.
draw::Penalties penaltiesOf(const SamplingOptions &options);
/// The most entries makeAdjustments can make for `options` over `vocab`
/// tokens, whatever the history: the distinct biased ids within the
/// vocabulary, and with a penalty the window's length.
int64_t mostAdjustments(const SamplingOptions &options, int64_t vocab);
/// `logits` adjusted in place as makeAdjustments and DrawKey.h's
/// adjustLogit make them (the step's adjusting form, on the host).
void adjustLogits(std::span<float> logits, const SamplingOptions &options,
                  std::span<const int32_t> history);

/// Index of the largest logit; ties to the lowest index.
int32_t argmax(std::span<const float> logits);

/// A sampling that the argmax of DrawKey.h's keys makes: a draw from
/// softmax(logits / T), over the tokens min-p keeps where minP is not 0,
/// then the topK most likely of them where topK is not 0, then over the
/// nucleus of top-p where topP is not 0.
struct KeyDraw {
  float temperature = 0;
  float topP = 0;   ///< 0: the whole vocabulary
  float minP = 0;   ///< 0: no floor
  int32_t topK = 0; ///< 0: every token
  /// The draw's words' parameters under `seed` (Session::setDraw).
  draw::DrawParams params(uint64_t seed) const {
    return {temperature, seed, topP, minP, topK};
  }
  /// Whether it cuts the vocabulary (the step's eight words).
  bool cuts() const { return params(0).cuts(); }
  bool operator==(const KeyDraw &) const = default;
};

/// The key draw of a sampling over `vocab` tokens that is a temperature
/// (within DrawKey.h's range) and at most a top-p, a top-k and a min-p;
/// none for greedy decoding and for a choice the Sampler must make. Its
/// penalties and biases, where it has any, are not part of it: they are
/// adjustments made to the logits first (adjustLogits, or the step's
/// adjusting form).
std::optional<KeyDraw> keyDraw(const SamplingOptions &options, int64_t vocab);

/// The token the step's draw picks from `logits` at `position` (the
/// position of the step that made them): the same token, bit for bit, as
/// every backend's drawing argmax.
int32_t drawToken(std::span<const float> logits, KeyDraw draw, uint64_t seed,
                  int32_t position);

} // namespace kiln::runtime

#endif // KILN_RUNTIME_SESSION_SAMPLER_H
