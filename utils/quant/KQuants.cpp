//===- KQuants.cpp - Q2_K to Q6_K super-blocks ----------------------------===//
//
// 256 values per super-block, split into sub-blocks of 16 or 32 values that
// each have a small integer scale (and, for Q2_K/Q4_K/Q5_K, a min) which is
// multiplied by the super-block's fp16 d (and dmin). The dequantisers
// follow gguf-py's order of float32 operations exactly: first the
// sub-block's d * scale (and dmin * min), then level * that, then the
// subtraction, each rounded to float32 on its own.
//
//===----------------------------------------------------------------------===//
#include "quant/BlockCodecs.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kiln::codecs {
namespace {

/// The 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes
/// of Q4_K/Q5_K (GLM5.md section 4): sub-blocks 0-3 use the low 6 bits of
/// bytes 0-3 (scales) and 4-7 (mins); sub-blocks 4-7 take their low nibbles
/// from bytes 8-11 and their top two bits from the top of bytes 0-7.
void unpackScaleMin(const uint8_t *s, int j, int &scale, int &min) {
  if (j < 4) {
    scale = s[j] & 63;
    min = s[j + 4] & 63;
  } else {
    scale = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
    min = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
  }
}

/// The inverse of unpackScaleMin for all eight sub-blocks.
void packScaleMin(const int *scale, const int *min, uint8_t *s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>(scale[j] | (scale[j + 4] >> 4) << 6);
    s[j + 4] = static_cast<uint8_t>(min[j] | (min[j + 4] >> 4) << 6);
    s[j + 8] =
        static_cast<uint8_t>((scale[j + 4] & 15) | (min[j + 4] & 15) << 4);
  }
}

/// The fp16 super-scales of a K-quant super-block.
struct SuperScales {
  uint16_t d, dmin;
};

/// A super-block of `n` sub-blocks of `len` values, each an affine fit
/// (levels 0..qmax, the offset kept <= 0 since it is stored as a subtracted
/// min), the fits' scales and mins as multiples in [0, lmax] of two fp16
/// super-scales (sc[n], mn[n]), and every level (q[n * len]) re-chosen
/// against the scale and min that dequantisation will form.
SuperScales quantAffineSubBlocks(const float *in, int n, int len, int qmax,
                                 int lmax, int *sc, int *mn, int *q) {
  float scale[16], min[16];
  for (int j = 0; j < n; ++j) {
    AffineFit fit =
        fitAffine(in + len * j, len, qmax, /*offsetAtMostZero=*/true);
    scale[j] = fit.scale;
    min[j] = -fit.offset;
  }
  SuperScales h{fitSuperScale(scale, n, 0, lmax),
                fitSuperScale(min, n, 0, lmax)};
  float d = halfToFloat(h.d), dmin = halfToFloat(h.dmin);
  for (int j = 0; j < n; ++j) {
    sc[j] = d != 0 ? roundClamp(scale[j] / d, 0, lmax) : 0;
    mn[j] = dmin != 0 ? roundClamp(min[j] / dmin, 0, lmax) : 0;
    // The same float32 products the dequantiser forms.
    float dl = d * static_cast<float>(sc[j]);
    float ml = dmin * static_cast<float>(mn[j]);
    for (int l = 0; l < len; ++l)
      q[len * j + l] =
          dl != 0 ? roundClamp((in[len * j + l] + ml) / dl, 0, qmax) : 0;
  }
  return h;
}

/// The symmetric twin: 16 sub-blocks of 16 values, each a symmetric fit
/// (levels qmin..qmax), the fits' scales as signed multiples in [lmin,
/// lmax] of one fp16 d (sc[16]), levels (q[256]) re-chosen against the
/// stored scales. Returns d's bits.
uint16_t quantSymmetricSubBlocks(const float *in, int qmin, int qmax, int lmin,
                                 int lmax, int *sc, int *q) {
  float scale[16];
  for (int k = 0; k < 16; ++k)
    scale[k] = fitSymmetric(in + 16 * k, 16, qmin, qmax);
  uint16_t dh = fitSuperScale(scale, 16, lmin, lmax);
  float d = halfToFloat(dh);
  for (int k = 0; k < 16; ++k) {
    sc[k] = d != 0 ? roundClamp(scale[k] / d, lmin, lmax) : 0;
    float dl = d * static_cast<float>(sc[k]);
    for (int t = 0; t < 16; ++t)
      q[16 * k + t] = dl != 0 ? roundClamp(in[16 * k + t] / dl, qmin, qmax) : 0;
  }
  return dh;
}

/// Levels of Q4_K (qmax 15) or Q5_K (qmax 31) for one super-block, and the
/// d, dmin and packed 6-bit scales of its eight 32-value sub-blocks.
void quantAffineSuperBlock(const float *in, int qmax, uint8_t *dAndScales,
                           int *q) {
  int sc[8], mn[8];
  SuperScales h = quantAffineSubBlocks(in, 8, 32, qmax, 63, sc, mn, q);
  storeU16(dAndScales, h.d);
  storeU16(dAndScales + 2, h.dmin);
  packScaleMin(sc, mn, dAndScales + 4);
}

/// The 2-bit levels of 256 values packed as Q2_K and Q3_K keep them: byte
/// l of 32-byte chunk c holds value 128c + 32s + l at bit 2s.
void packK2Crumbs(const int *q, uint8_t *qs) {
  std::memset(qs, 0, 64);
  for (int i = 0; i < kQK; ++i)
    qs[32 * (i / 128) + i % 32] |=
        static_cast<uint8_t>((q[i] & 3) << (2 * ((i / 32) % 4)));
}

/// Packs 256 levels' low nibbles: byte l of chunk c holds value 64c + l low
/// and value 64c + 32 + l high.
void packK4Nibbles(const int *q, uint8_t *qs) {
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l)
      qs[32 * c + l] = static_cast<uint8_t>((q[64 * c + l] & 15) |
                                            (q[64 * c + 32 + l] & 15) << 4);
}

int k4Nibble(const uint8_t *qs, int i) {
  int c = i / 64, h = (i / 32) % 2, l = i % 32;
  return (qs[32 * c + l] >> (4 * h)) & 15;
}

} // namespace

// Q2_K: scales u8[16] (low nibble scale, high nibble min, one per 16
// values), qs[64], d f16, dmin f16. Byte l of 32-byte chunk c holds the
// 2-bit levels of values 128c + 32s + l at bit 2s.
void dequantQ2_K(const uint8_t *block, float *out) {
  const uint8_t *scales = block, *qs = block + 16;
  float d = loadHalf(block + 80), dmin = loadHalf(block + 82);
  for (int i = 0; i < kQK; ++i) {
    int c = i / 128, s = (i / 32) % 4, l = i % 32;
    int q = (qs[32 * c + l] >> (2 * s)) & 3;
    uint8_t sm = scales[i / 16];
    float dl = d * static_cast<float>(sm & 15);
    float ml = dmin * static_cast<float>(sm >> 4);
    out[i] = dl * static_cast<float>(q) - ml;
  }
}

// Q3_K: hmask[32], qs[64], scales[12], d f16. 16 sub-blocks of 16 with
// 6-bit scales biased by 32: low nibbles from bytes 0-7 (sub-blocks 0-7 low
// nibble, 8-15 high nibble), top two bits from bytes 8-11 (sub-block k at
// bit 2*(k/4) of byte 8 + k%4). A level is 2 bits from qs (as Q2_K) minus 4
// unless its hmask bit (bit i/32 of hmask[i%32]) is set.
void dequantQ3_K(const uint8_t *block, float *out) {
  const uint8_t *hmask = block, *qs = block + 32, *s = block + 96;
  float d = loadHalf(block + 108);
  for (int i = 0; i < kQK; ++i) {
    int k = i / 16;
    int low = k < 8 ? s[k] & 15 : s[k - 8] >> 4;
    int high = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
    float dl = d * static_cast<float>((low | high << 4) - 32);
    int c = i / 128, sh = (i / 32) % 4, l = i % 32;
    int q = (qs[32 * c + l] >> (2 * sh)) & 3;
    int hbit = (hmask[l] >> (i / 32)) & 1;
    out[i] = dl * static_cast<float>(q - (hbit ? 0 : 4));
  }
}

// Q4_K: d f16, dmin f16, scales[12], qs[128]. y = (d*sc)*q - (dmin*m).
void dequantQ4_K(const uint8_t *block, float *out) {
  float d = loadHalf(block), dmin = loadHalf(block + 2);
  const uint8_t *scales = block + 4, *qs = block + 16;
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    unpackScaleMin(scales, j, sc, m);
    float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l)
      out[32 * j + l] = dl * static_cast<float>(k4Nibble(qs, 32 * j + l)) - ml;
  }
}

// Q5_K: as Q4_K plus qh[32] before qs: bit j of qh[l] is the fifth bit of
// value 32j + l.
void dequantQ5_K(const uint8_t *block, float *out) {
  float d = loadHalf(block), dmin = loadHalf(block + 2);
  const uint8_t *scales = block + 4, *qh = block + 16, *qs = block + 48;
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    unpackScaleMin(scales, j, sc, m);
    float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) {
      int q = k4Nibble(qs, 32 * j + l) | ((qh[l] >> j) & 1) << 4;
      out[32 * j + l] = dl * static_cast<float>(q) - ml;
    }
  }
}

// Q6_K: ql[128], qh[64], scales int8[16], d f16. Value i = 128c + 64h + m
// has its low nibble in ql[64c + m] at bit 4h; value i = 128c + 32s + l has
// its top two bits in qh[32c + l] at bit 2s. y = (d*scale)*(q - 32).
void dequantQ6_K(const uint8_t *block, float *out) {
  const uint8_t *ql = block, *qh = block + 128, *scales = block + 192;
  float d = loadHalf(block + 208);
  for (int i = 0; i < kQK; ++i) {
    int c = i / 128, r = i % 128;
    int low = (ql[64 * c + r % 64] >> (4 * (r / 64))) & 15;
    int high = (qh[32 * c + r % 32] >> (2 * (r / 32))) & 3;
    float dl = d * static_cast<float>(static_cast<int8_t>(scales[i / 16]));
    out[i] = dl * static_cast<float>((low | high << 4) - 32);
  }
}

// Q2_K: 16 affine sub-blocks of 16 values (levels 0..3) with 4-bit scales
// and mins, packed scale | min << 4.
void quantQ2_K(const float *in, uint8_t *block) {
  int sc[16], mn[16], q[kQK];
  SuperScales h = quantAffineSubBlocks(in, 16, 16, 3, 15, sc, mn, q);
  for (int k = 0; k < 16; ++k)
    block[k] = static_cast<uint8_t>(sc[k] | mn[k] << 4);
  packK2Crumbs(q, block + 16);
  storeU16(block + 80, h.d);
  storeU16(block + 82, h.dmin);
}

// Q3_K: 16 symmetric sub-blocks of 16 values (levels -4..3) with 6-bit
// signed scales stored biased by 32 (low nibbles in bytes 0-7, sub-blocks
// 8-15 in the high halves; top two bits in bytes 8-11). A level q is kept
// as q + 4: its low two bits in qs (as Q2_K), its third bit in hmask.
void quantQ3_K(const float *in, uint8_t *block) {
  int sc[16], q[kQK];
  uint16_t dh = quantSymmetricSubBlocks(in, -4, 3, -32, 31, sc, q);
  uint8_t *hmask = block, *s = block + 96;
  std::memset(hmask, 0, 32);
  std::memset(s, 0, 12);
  for (int k = 0; k < 16; ++k) {
    int biased = sc[k] + 32;
    s[k % 8] |= static_cast<uint8_t>((biased & 15) << (4 * (k / 8)));
    s[8 + k % 4] |= static_cast<uint8_t>((biased >> 4) << (2 * (k / 4)));
  }
  for (int i = 0; i < kQK; ++i) {
    q[i] += 4;
    hmask[i % 32] |= static_cast<uint8_t>((q[i] >> 2) << (i / 32));
  }
  packK2Crumbs(q, block + 32);
  storeU16(block + 108, dh);
}

void quantQ4_K(const float *in, uint8_t *block) {
  int q[kQK];
  quantAffineSuperBlock(in, 15, block, q);
  packK4Nibbles(q, block + 16);
}

void quantQ5_K(const float *in, uint8_t *block) {
  int q[kQK];
  quantAffineSuperBlock(in, 31, block, q);
  uint8_t *qh = block + 16;
  std::memset(qh, 0, 32);
  for (int i = 0; i < kQK; ++i)
    qh[i % 32] |= static_cast<uint8_t>(((q[i] >> 4) & 1) << (i / 32));
  packK4Nibbles(q, block + 48);
}

// Q6_K: 16 symmetric sub-blocks of 16 values (levels -32..31) with int8
// scales; a level is kept as q + 32, its low nibble in ql and its top two
// bits in qh.
void quantQ6_K(const float *in, uint8_t *block) {
  int sc[16], q[kQK];
  uint16_t dh = quantSymmetricSubBlocks(in, -32, 31, -128, 127, sc, q);
  uint8_t *ql = block, *qh = block + 128, *scales = block + 192;
  std::memset(block, 0, 192);
  for (int k = 0; k < 16; ++k)
    scales[k] = static_cast<uint8_t>(static_cast<int8_t>(sc[k]));
  for (int i = 0; i < kQK; ++i) {
    int u = q[i] + 32, c = i / 128, r = i % 128;
    ql[64 * c + r % 64] |= static_cast<uint8_t>((u & 15) << (4 * (r / 64)));
    qh[32 * c + r % 32] |= static_cast<uint8_t>((u >> 4) << (2 * (r / 32)));
  }
  storeU16(block + 208, dh);
}

} // namespace kiln::codecs
