//===- IQuants.cpp - IQ4_NL and IQ4_XS blocks -----------------------------===//
//
// Both types store 4-bit indices into one fixed, non-uniform grid of 16
// signed levels (denser near zero, where weights cluster). IQ4_NL has 32
// values and one fp16 scale per block; IQ4_XS has 256 values, an fp16 d
// and a 6-bit signed scale (biased by 32) per 32-value sub-block.
//
//===----------------------------------------------------------------------===//
#include "quant/BlockCodecs.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kiln::codecs {

const int8_t kIQ4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                               1,    13,   25,  38,  53,  69,  89,  113};

// IQ4_NL: d f16, qs[16] (byte l: index of value l low, value l + 16 high).
// y = d * level.
void dequantIQ4_NL(const uint8_t *block, float *out) {
  float d = loadHalf(block);
  const uint8_t *qs = block + 2;
  for (int i = 0; i < 32; ++i) {
    int k = i < 16 ? qs[i] & 15 : qs[i - 16] >> 4;
    out[i] = d * static_cast<float>(kIQ4Levels[k]);
  }
}

// IQ4_XS: d f16, scales_h u16 (bits 2j..2j+1: top bits of sub-block j's
// scale), scales_l[4] (nibble j%2 of byte j/2: low bits), qs[128] (16 bytes
// per sub-block, nibbles as IQ4_NL). y = (d * (scale - 32)) * level.
void dequantIQ4_XS(const uint8_t *block, float *out) {
  float d = loadHalf(block);
  uint16_t scalesH = loadU16(block + 2);
  const uint8_t *scalesL = block + 4, *qs = block + 8;
  for (int j = 0; j < 8; ++j) {
    int low = (scalesL[j / 2] >> (4 * (j % 2))) & 15;
    int high = (scalesH >> (2 * j)) & 3;
    float dl = d * static_cast<float>((low | high << 4) - 32);
    const uint8_t *sub = qs + 16 * j;
    for (int l = 0; l < 32; ++l) {
      int k = l < 16 ? sub[l] & 15 : sub[l - 16] >> 4;
      out[32 * j + l] = dl * static_cast<float>(kIQ4Levels[k]);
    }
  }
}

namespace {
/// Grid indices of 32 values against the effective scale `d`, packed as
/// 16 bytes of nibbles.
void packIQ4(const float *in, float d, uint8_t *qs) {
  int k[32];
  for (int i = 0; i < 32; ++i)
    k[i] = d != 0 ? nearestIQ4Level(in[i] / d) : nearestIQ4Level(0);
  for (int l = 0; l < 16; ++l)
    qs[l] = static_cast<uint8_t>(k[l] | k[l + 16] << 4);
}
} // namespace

void quantIQ4_NL(const float *in, uint8_t *block) {
  uint16_t dh = finiteHalf(fitIQ4(in, 32));
  storeU16(block, dh);
  packIQ4(in, halfToFloat(dh), block + 2);
}

// IQ4_XS: a grid fit per sub-block, the fits' scales as signed 6-bit
// multiples of one fp16 d, then indices re-chosen against the stored scale.
void quantIQ4_XS(const float *in, uint8_t *block) {
  float scale[8];
  for (int j = 0; j < 8; ++j)
    scale[j] = fitIQ4(in + 32 * j, 32);
  uint16_t dh = fitSuperScale(scale, 8, -32, 31);
  float d = halfToFloat(dh);
  uint16_t scalesH = 0;
  uint8_t *scalesL = block + 4;
  std::memset(scalesL, 0, 4);
  for (int j = 0; j < 8; ++j) {
    int ls = (d != 0 ? roundClamp(scale[j] / d, -32, 31) : 0) + 32;
    scalesL[j / 2] |= static_cast<uint8_t>((ls & 15) << (4 * (j % 2)));
    scalesH |= static_cast<uint16_t>((ls >> 4) << (2 * j));
    float dl = d * static_cast<float>(ls - 32);
    packIQ4(in + 32 * j, dl, block + 8 + 16 * j);
  }
  storeU16(block, dh);
  storeU16(block + 2, scalesH);
}

} // namespace kiln::codecs
