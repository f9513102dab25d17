//===- TensorSynth.cpp - Drawing and quantising synthetic tensors ----------===//
#include "synth/TensorSynth.h"

#include "quant/QuantFormats.h"
#include "support/CheckedMath.h"
#include "synth/Random.h"

#include <fmt/core.h>

#include <cstring>
#include <vector>

namespace kiln::synth {
namespace {

struct Distribution {
  double mean = 0.0;
  double stddev = 1.0;
};

Distribution distributionOf(const SynthTensor &t) {
  switch (t.init) {
  case InitKind::Projection:
    // Unit-variance inputs give unit-variance outputs: activations stay
    // O(1) through every layer, neither vanishing nor saturating.
    return {0.0, 1.0 / std::sqrt(double(t.dims[0]))};
  case InitKind::Embedding:
    return {0.0, 1.0};
  case InitKind::NormWeight:
    return {1.0, 0.05};
  case InitKind::SmallBias:
    return {0.0, 0.05};
  }
  return {};
}

} // namespace

Status fillTensor(uint64_t seed, const SynthTensor &t, std::span<uint8_t> out) {
  const GGMLTypeTraits &traits = traitsOf(t.type);
  uint64_t elements = 1;
  for (uint64_t d : t.dims) {
    auto e = checkedMul(elements, d);
    if (!e)
      return Error("", t.name, "element count overflows");
    elements = *e;
  }
  auto bytes = rowBytes(t.type, elements);
  if (!bytes || *bytes != out.size())
    return Error("", t.name,
                 fmt::format("buffer of {} bytes for a tensor of {} bytes",
                             out.size(), bytes ? *bytes : 0));
  if (!canQuantize(t.type))
    return Error("", t.name,
                 fmt::format("the synthesiser cannot write type {}; choose "
                             "another with --type {}=TYPE",
                             traits.name, roleOf(t.name)));

  // The seed of this tensor: (seed, name, type) and nothing else.
  uint64_t tensorSeed = fnv1a(t.name, fnv1a(fmt::format("{}:{}", seed,
                                                        traits.name)));
  Rng rng(tensorSeed);
  Distribution dist = distributionOf(t);
  const uint64_t blockValues = traits.blockSize;
  const uint64_t blockBytes = traits.blockBytes;
  const uint64_t blocks = elements / blockValues;

  // Quantise `count` blocks of fresh values into `dst`, a block row at a time.
  std::vector<float> values;
  auto quantiseFresh = [&](uint64_t count, uint8_t *dst) -> Status {
    constexpr uint64_t kChunkBlocks = 256;
    for (uint64_t first = 0; first < count; first += kChunkBlocks) {
      uint64_t n = std::min(kChunkBlocks, count - first);
      values.resize(n * blockValues);
      for (float &v : values)
        v = float(dist.mean + dist.stddev * rng.normal());
      Status s = quantize(t.type, values,
                          std::span<uint8_t>(dst + first * blockBytes,
                                             n * blockBytes));
      if (!s)
        return Error("", t.name, s.error().message());
    }
    return Status::ok();
  };

  if (elements <= kFullyRandomValues)
    return quantiseFresh(blocks, out.data());

  const uint64_t poolBlocks = kPoolValues / blockValues;
  std::vector<uint8_t> pool(poolBlocks * blockBytes);
  if (Status s = quantiseFresh(poolBlocks, pool.data()); !s)
    return s;
  uint8_t *dst = out.data();
  for (uint64_t b = 0; b < blocks; ++b, dst += blockBytes)
    std::memcpy(dst, pool.data() + rng.below(poolBlocks) * blockBytes,
                blockBytes);
  return Status::ok();
}

} // namespace kiln::synth
