//===- BlockCodecs.h - Per-block codecs behind QuantFormats.h ---*- C++ -*-===//
//
// Internal to KilnQuant. Each supported type has a function that decodes one
// block into blockSize floats and, where Kiln can write the type, one that
// encodes blockSize floats into one block. QuantFormats.cpp checks sizes and
// dispatches; the codecs trust their pointers.
//
// Every dequantiser reproduces gguf-py's float32 arithmetic operation by
// operation (the library is compiled with -ffp-contract=off so that
// `a * b - c` is never fused into one rounding), which is what makes the
// results bit-exact rather than merely close.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_QUANT_BLOCKCODECS_H
#define KILN_QUANT_BLOCKCODECS_H

#include "quant/FloatFormats.h"

#include <cstdint>

namespace kiln::codecs {

/// Values per super-block of the K-quants and IQ4_XS.
constexpr int kQK = 256;

// --- little-endian field access (GGUF is little-endian on every host) ------
inline uint16_t loadU16(const uint8_t *p) {
  return static_cast<uint16_t>(p[0] | p[1] << 8);
}
inline uint32_t loadU32(const uint8_t *p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}
inline void storeU16(uint8_t *p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
inline void storeU32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    p[i] = static_cast<uint8_t>(v >> (8 * i));
}
/// An fp16 field as float32 (the first step of every gguf-py dequantiser).
inline float loadHalf(const uint8_t *p) { return halfToFloat(loadU16(p)); }

/// The 16 signed levels of IQ4_NL and IQ4_XS (a non-uniform 4-bit grid).
extern const int8_t kIQ4Levels[16];

using DequantFn = void (*)(const uint8_t *block, float *out);
using QuantFn = void (*)(const float *in, uint8_t *block);

// FloatFormats.cpp
void dequantF32(const uint8_t *, float *);
void dequantF16(const uint8_t *, float *);
void dequantBF16(const uint8_t *, float *);
void quantF32(const float *, uint8_t *);
void quantF16(const float *, uint8_t *);
void quantBF16(const float *, uint8_t *);

// LegacyQuants.cpp (32-value blocks, one fp16 scale)
void dequantQ4_0(const uint8_t *, float *);
void dequantQ4_1(const uint8_t *, float *);
void dequantQ5_0(const uint8_t *, float *);
void dequantQ5_1(const uint8_t *, float *);
void dequantQ8_0(const uint8_t *, float *);
void quantQ4_0(const float *, uint8_t *);
void quantQ4_1(const float *, uint8_t *);
void quantQ5_0(const float *, uint8_t *);
void quantQ5_1(const float *, uint8_t *);
void quantQ8_0(const float *, uint8_t *);

// KQuants.cpp (256-value super-blocks of 16- or 32-value sub-blocks)
void dequantQ2_K(const uint8_t *, float *);
void dequantQ3_K(const uint8_t *, float *);
void dequantQ4_K(const uint8_t *, float *);
void dequantQ5_K(const uint8_t *, float *);
void dequantQ6_K(const uint8_t *, float *);
void quantQ2_K(const float *, uint8_t *);
void quantQ3_K(const float *, uint8_t *);
void quantQ4_K(const float *, uint8_t *);
void quantQ5_K(const float *, uint8_t *);
void quantQ6_K(const float *, uint8_t *);

// IQuants.cpp (the non-uniform 4-bit grid)
void dequantIQ4_NL(const uint8_t *, float *);
void dequantIQ4_XS(const uint8_t *, float *);
void quantIQ4_NL(const float *, uint8_t *);
void quantIQ4_XS(const float *, uint8_t *);

// --- ScaleFit.cpp: scale searches shared by the quantisers -----------------

/// `v` rounded half away from zero and clamped to [lo, hi] (clamped first,
/// so huge or tiny quotients are safe).
int roundClamp(float v, int lo, int hi);

/// fp16 bits of `v` with |v| clamped to the largest finite half, so a scale
/// field is never infinite (v must not be NaN).
uint16_t finiteHalf(float v);

/// Best scale s for x[i] ~ s * q[i] with integer q[i] in [qmin, qmax]: a few
/// candidate scales around "largest magnitude onto the widest level", each
/// refined by least squares for the levels it picks; the lowest squared
/// error wins. Returns 0 for an all-zero block.
float fitSymmetric(const float *x, int n, int qmin, int qmax);

/// Scale and offset of x[i] ~ scale * q[i] + offset with q[i] in [0, qmax].
struct AffineFit {
  float scale;
  float offset;
};
/// Candidate ranges refined by alternating rounding and a least-squares fit
/// of (scale, offset). With `offsetAtMostZero` (the K-quants store the
/// offset as a non-negative "min" that is subtracted) the offset is kept
/// <= 0. The scale is always >= 0.
AffineFit fitAffine(const float *x, int n, int qmax, bool offsetAtMostZero);

/// fp16 bits of a super-block scale d for sub-block scales s[0..n) that are
/// stored as integers l[j] in [lmin, lmax], d * l[j] ~ s[j]. Tries d =
/// max|s| / k for k from lmax / 2 to lmax and keeps the one that represents
/// the s[j] best: for small data d is an fp16 subnormal with few bits, and
/// the plain choice k = lmax can be several percent off.
uint16_t fitSuperScale(const float *s, int n, int lmin, int lmax);

/// Best scale s for x[i] ~ s * kIQ4Levels[k[i]] (searching both signs of s,
/// since the grid is not symmetric). Returns 0 for an all-zero block.
float fitIQ4(const float *x, int n);

/// Index of the grid level nearest to v (the lower one on a tie).
int nearestIQ4Level(float v);

} // namespace kiln::codecs

#endif // KILN_QUANT_BLOCKCODECS_H
