//===- TensorSynth.cpp - Drawing and quantising synthetic tensors ----------===//
#include "synth/TensorSynth.h"

#include "quant/QuantFormats.h"
#include "support/CheckedMath.h"

#include <fmt/core.h>

#include <cmath>
#include <cstring>

namespace kiln::synth {
namespace {

/// Quantise this many blocks per call: amortises the call, bounds memory.
constexpr uint64_t kQuantiseBatchBlocks = 256;

} // namespace

TensorSynthesizer::TensorSynthesizer(const SynthTensor &tensor,
                                     uint64_t tensorSeed)
    : tensor_(&tensor), rng_(tensorSeed) {}

Expected<TensorSynthesizer> TensorSynthesizer::create(uint64_t seed,
                                                      const SynthTensor &t) {
  const GGMLTypeTraits &traits = traitsOf(t.type);
  Expected<TensorSize> size = sizeOf(t);
  if (!size)
    return size.error();
  const uint64_t elements = size->elements;
  if (!canQuantize(t.type))
    return Error("", t.name,
                 fmt::format("the synthesiser cannot write type {}; choose "
                             "another with --type {}=TYPE",
                             traits.name, roleOf(t.name)));

  // The seed of this tensor: (seed, name, type) and nothing else.
  uint64_t tensorSeed =
      fnv1a(t.name, fnv1a(fmt::format("{}:{}", seed, traits.name)));
  TensorSynthesizer s(t, tensorSeed);
  s.blockValues_ = traits.blockSize;
  s.blockBytes_ = traits.blockBytes;
  s.totalBytes_ = size->bytes;
  switch (t.init) {
  case InitKind::Projection:
    // Unit-variance inputs give unit-variance outputs: activations stay
    // O(1) through every layer, neither vanishing nor saturating.
    s.stddev_ = 1.0 / std::sqrt(double(t.dims[0]));
    break;
  case InitKind::Embedding:
    s.stddev_ = 1.0;
    break;
  case InitKind::NormWeight:
    s.mean_ = 1.0;
    s.stddev_ = 0.05;
    break;
  case InitKind::SmallBias:
    s.stddev_ = 0.05;
    break;
  }
  if (elements > kFullyRandomValues) {
    s.pooled_ = true;
    uint64_t poolBlocks = kPoolValues / s.blockValues_;
    s.pool_.resize(poolBlocks * s.blockBytes_);
    if (Status st = s.quantiseFresh(poolBlocks, s.pool_.data()); !st)
      return st.error();
  }
  return s;
}

Status TensorSynthesizer::quantiseFresh(uint64_t blocks, uint8_t *dst) {
  for (uint64_t first = 0; first < blocks; first += kQuantiseBatchBlocks) {
    uint64_t n = std::min(kQuantiseBatchBlocks, blocks - first);
    values_.resize(n * blockValues_);
    for (float &v : values_)
      v = float(mean_ + stddev_ * rng_.normal());
    Status s = quantize(
        tensor_->type, values_,
        std::span<uint8_t>(dst + first * blockBytes_, n * blockBytes_));
    if (!s)
      return Error("", tensor_->name, s.error().message());
  }
  return Status::ok();
}

Status TensorSynthesizer::next(std::span<uint8_t> out) {
  if (out.size() % blockBytes_ != 0 ||
      out.size() > totalBytes_ - producedBytes_)
    return Error("", tensor_->name,
                 fmt::format("chunk of {} bytes at {} does not fit blocks of {} "
                             "bytes in a tensor of {}",
                             out.size(), producedBytes_, blockBytes_,
                             totalBytes_));
  producedBytes_ += out.size();
  uint64_t blocks = out.size() / blockBytes_;
  if (!pooled_)
    return quantiseFresh(blocks, out.data());
  uint64_t poolBlocks = pool_.size() / blockBytes_;
  uint8_t *dst = out.data();
  for (uint64_t b = 0; b < blocks; ++b, dst += blockBytes_)
    std::memcpy(dst, pool_.data() + rng_.below(poolBlocks) * blockBytes_,
                blockBytes_);
  return Status::ok();
}

Status fillTensor(uint64_t seed, const SynthTensor &tensor,
                  std::span<uint8_t> out) {
  Expected<TensorSynthesizer> s = TensorSynthesizer::create(seed, tensor);
  if (!s)
    return s.error();
  if (out.size() != s->totalBytes())
    return Error("", tensor.name,
                 fmt::format("buffer of {} bytes for a tensor of {} bytes",
                             out.size(), s->totalBytes()));
  return s->next(out);
}

} // namespace kiln::synth
