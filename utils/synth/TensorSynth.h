//===- TensorSynth.h - The bytes of a synthetic tensor ----------*- C++ -*-===//
#ifndef KILN_SYNTH_TENSORSYNTH_H
#define KILN_SYNTH_TENSORSYNTH_H

#include "support/Error.h"
#include "synth/GLM5Spec.h"

#include <cstdint>
#include <span>

namespace kiln::synth {

/// Bytes of `tensor` (exactly its size in `out`), a function of (seed, name,
/// type) only: shuffling tensors or splitting files never changes a tensor.
///
/// Values are drawn as InitKind says and quantised with the reference
/// quantisers. Tensors of at most kFullyRandomValues values are quantised
/// block by block from fresh values; larger ones pick each block at random
/// from a pool of about kPoolValues values' worth of quantised blocks, so
/// that multi-GB files are written at memory speed (the reference
/// quantisers search scales and are slow) while every row still differs.
Status fillTensor(uint64_t seed, const SynthTensor &tensor,
                  std::span<uint8_t> out);

/// Values up to which every block is quantised from its own values.
inline constexpr uint64_t kFullyRandomValues = 1 << 20;
/// Values' worth of blocks in the pool larger tensors draw from.
inline constexpr uint64_t kPoolValues = 1 << 17;

} // namespace kiln::synth

#endif // KILN_SYNTH_TENSORSYNTH_H
