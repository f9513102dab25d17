//===- TensorSynth.h - The bytes of a synthetic tensor ----------*- C++ -*-===//
#ifndef KILN_SYNTH_TENSORSYNTH_H
#define KILN_SYNTH_TENSORSYNTH_H

#include "support/Error.h"
#include "synth/GLM5Spec.h"
#include "support/Random.h"

#include <cstdint>
#include <span>
#include <vector>

namespace kiln::synth {

/// Values up to which every block is quantised from its own values.
inline constexpr uint64_t kFullyRandomValues = 1 << 20;
/// Values' worth of blocks in the pool larger tensors draw from.
inline constexpr uint64_t kPoolValues = 1 << 17;

/// Produces the bytes of one synthetic tensor front to back, in chunks of
/// whole blocks. The bytes are a function of (seed, name, type) only, never
/// of the chunking: shuffling tensors or splitting files never changes one.
///
/// Values are drawn as the tensor's InitKind says and quantised with the
/// reference quantisers. Tensors of at most kFullyRandomValues values are
/// quantised block by block from fresh values; larger ones pick each block at
/// random from a pool of about kPoolValues values' worth of quantised blocks,
/// so that multi-GB files are written at disk speed (the reference quantisers
/// search scales and are slow) while every row still differs.
class TensorSynthesizer {
public:
  /// Errors: a type the quantisers cannot write, or bad geometry; they name
  /// the tensor.
  static Expected<TensorSynthesizer> create(uint64_t seed,
                                            const SynthTensor &tensor);

  /// The next out.size() bytes (a whole number of blocks, not past the end).
  Status next(std::span<uint8_t> out);

  uint64_t totalBytes() const { return totalBytes_; }

private:
  TensorSynthesizer(const SynthTensor &tensor, uint64_t tensorSeed);
  Status quantiseFresh(uint64_t blocks, uint8_t *dst);

  const SynthTensor *tensor_;
  Rng rng_;
  double mean_ = 0.0, stddev_ = 1.0;
  uint64_t blockValues_ = 1, blockBytes_ = 1;
  uint64_t totalBytes_ = 0, producedBytes_ = 0;
  bool pooled_ = false;
  std::vector<uint8_t> pool_;
  std::vector<float> values_;
};

/// All bytes of `tensor` into `out` (exactly its size).
Status fillTensor(uint64_t seed, const SynthTensor &tensor,
                  std::span<uint8_t> out);

} // namespace kiln::synth

#endif // KILN_SYNTH_TENSORSYNTH_H
