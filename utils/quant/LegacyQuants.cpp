//===- LegacyQuants.cpp - Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 --------------------===//
//
// 32 values per block. In the 4- and 5-bit types byte l of qs holds value l
// in its low nibble and value l + 16 in its high nibble; the 5-bit types
// keep each value's fifth bit in the little-endian u32 qh (bit i for value
// i). Each dequantiser computes in float32 exactly what gguf-py does: the
// fp16 scale widened to float32, the integer level converted to float32,
// then one multiply (and for the _1 types one separate add).
//
//===----------------------------------------------------------------------===//
#include "quant/BlockCodecs.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kiln::codecs {
namespace {
constexpr int kBlock = 32;

/// The 4-bit field of value i (0..31) in a 16-byte nibble array.
int nibble(const uint8_t *qs, int i) {
  return i < 16 ? qs[i] & 0x0F : qs[i - 16] >> 4;
}

/// Packs 32 levels (low 4 bits used) into 16 bytes of nibbles.
void packNibbles(const int *q, uint8_t *qs) {
  for (int l = 0; l < 16; ++l)
    qs[l] = static_cast<uint8_t>((q[l] & 0x0F) | (q[l + 16] & 0x0F) << 4);
}

/// The fifth bits of 32 levels as the little-endian u32 qh.
uint32_t packHighBits(const int *q) {
  uint32_t qh = 0;
  for (int i = 0; i < kBlock; ++i)
    qh |= static_cast<uint32_t>((q[i] >> 4) & 1) << i;
  return qh;
}
} // namespace

// Q4_0: d f16, qs[16]. y = d * (q - 8).
void dequantQ4_0(const uint8_t *block, float *out) {
  float d = loadHalf(block);
  for (int i = 0; i < kBlock; ++i)
    out[i] = d * static_cast<float>(nibble(block + 2, i) - 8);
}

// Q4_1: d f16, m f16, qs[16]. y = d * q + m (two roundings, as numpy).
void dequantQ4_1(const uint8_t *block, float *out) {
  float d = loadHalf(block);
  float m = loadHalf(block + 2);
  for (int i = 0; i < kBlock; ++i)
    out[i] = d * static_cast<float>(nibble(block + 4, i)) + m;
}

// Q5_0: d f16, qh u32, qs[16]. y = d * (q - 16).
void dequantQ5_0(const uint8_t *block, float *out) {
  float d = loadHalf(block);
  uint32_t qh = loadU32(block + 2);
  for (int i = 0; i < kBlock; ++i) {
    int q = nibble(block + 6, i) | static_cast<int>((qh >> i) & 1) << 4;
    out[i] = d * static_cast<float>(q - 16);
  }
}

// Q5_1: d f16, m f16, qh u32, qs[16]. y = d * q + m.
void dequantQ5_1(const uint8_t *block, float *out) {
  float d = loadHalf(block);
  float m = loadHalf(block + 2);
  uint32_t qh = loadU32(block + 4);
  for (int i = 0; i < kBlock; ++i) {
    int q = nibble(block + 8, i) | static_cast<int>((qh >> i) & 1) << 4;
    out[i] = d * static_cast<float>(q) + m;
  }
}

// Q8_0: d f16, qs int8[32]. y = q * d.
void dequantQ8_0(const uint8_t *block, float *out) {
  float d = loadHalf(block);
  for (int i = 0; i < kBlock; ++i)
    out[i] = static_cast<float>(static_cast<int8_t>(block[2 + i])) * d;
}

// Q8_0: with 255 levels the max-magnitude scale is already near optimal, so
// no search: d = max|x| / 127, rounded to fp16 first so the levels are
// chosen against the scale that will actually be stored.
void quantQ8_0(const float *in, uint8_t *block) {
  float amax = 0;
  for (int i = 0; i < kBlock; ++i)
    amax = std::max(amax, std::fabs(in[i]));
  uint16_t dh = finiteHalf(amax / 127);
  storeU16(block, dh);
  float d = halfToFloat(dh);
  for (int i = 0; i < kBlock; ++i) {
    int q = d != 0 ? roundClamp(in[i] / d, -128, 127) : 0;
    block[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(q));
  }
}

void quantQ4_0(const float *in, uint8_t *block) {
  uint16_t dh = finiteHalf(fitSymmetric(in, kBlock, -8, 7));
  float d = halfToFloat(dh);
  int q[kBlock];
  for (int i = 0; i < kBlock; ++i)
    q[i] = (d != 0 ? roundClamp(in[i] / d, -8, 7) : 0) + 8;
  storeU16(block, dh);
  packNibbles(q, block + 2);
}

void quantQ4_1(const float *in, uint8_t *block) {
  AffineFit fit = fitAffine(in, kBlock, 15, /*offsetAtMostZero=*/false);
  uint16_t dh = finiteHalf(fit.scale), mh = finiteHalf(fit.offset);
  float d = halfToFloat(dh), m = halfToFloat(mh);
  int q[kBlock];
  for (int i = 0; i < kBlock; ++i)
    q[i] = d != 0 ? roundClamp((in[i] - m) / d, 0, 15) : 0;
  storeU16(block, dh);
  storeU16(block + 2, mh);
  packNibbles(q, block + 4);
}

void quantQ5_0(const float *in, uint8_t *block) {
  uint16_t dh = finiteHalf(fitSymmetric(in, kBlock, -16, 15));
  float d = halfToFloat(dh);
  int q[kBlock];
  for (int i = 0; i < kBlock; ++i)
    q[i] = (d != 0 ? roundClamp(in[i] / d, -16, 15) : 0) + 16;
  storeU16(block, dh);
  storeU32(block + 2, packHighBits(q));
  packNibbles(q, block + 6);
}

void quantQ5_1(const float *in, uint8_t *block) {
  AffineFit fit = fitAffine(in, kBlock, 31, /*offsetAtMostZero=*/false);
  uint16_t dh = finiteHalf(fit.scale), mh = finiteHalf(fit.offset);
  float d = halfToFloat(dh), m = halfToFloat(mh);
  int q[kBlock];
  for (int i = 0; i < kBlock; ++i)
    q[i] = d != 0 ? roundClamp((in[i] - m) / d, 0, 31) : 0;
  storeU16(block, dh);
  storeU16(block + 2, mh);
  storeU32(block + 4, packHighBits(q));
  packNibbles(q, block + 8);
}

} // namespace kiln::codecs
