//===- GenericQuant.cuh - Every GGUF block format, on the GPU --*- CUDA -*-===//
//
// One device function per supported ggml type decodes one block of the
// file's own layout into floats with gguf-py's float32 operations in
// gguf-py's order (this file's kernels are compiled with --fmad=false, so
// `d * q - m` is two roundings, as on the host): the same values, bit for
// bit, as kiln::dequantize. Formats as in utils/quant (GLM5.md section 4).
// Used by the generic mat-vec (any type, correctness first) and by the
// checks of the specialised layouts.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_BACKENDS_CUDA_GENERICQUANT_CUH
#define KILN_BACKENDS_CUDA_GENERICQUANT_CUH

#include "quant/QuantTypes.h"

#include <cuda_fp16.h>

#include <cstdint>

namespace kiln::cuda::generic {

__device__ inline uint16_t u16(const uint8_t *p) {
  return uint16_t(p[0] | p[1] << 8);
}
__device__ inline uint32_t u32(const uint8_t *p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 |
         uint32_t(p[3]) << 24;
}
/// fp16 to float32 is exact, on any hardware.
__device__ inline float f16(const uint8_t *p) {
  return __half2float(__ushort_as_half(u16(p)));
}
__device__ inline float bf16(const uint8_t *p) {
  return __uint_as_float(uint32_t(u16(p)) << 16);
}

__device__ const int8_t kIQ4Levels[16] = {
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

__device__ inline int nibble32(const uint8_t *qs, int i) {
  return i < 16 ? qs[i] & 0x0F : qs[i - 16] >> 4;
}
__device__ inline int k4Nibble(const uint8_t *qs, int i) {
  int c = i / 64, r = i % 64;
  return r < 32 ? qs[32 * c + r] & 15 : qs[32 * c + r - 32] >> 4;
}
__device__ inline void scaleMinK4(const uint8_t *s, int j, int &sc, int &m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
    m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
  }
}

/// Value i of a Q4_K block from its fields: head = d, dmin (f16), then
/// scales[12]; qs = its 128 quant bytes. Apart, so that the split layouts
/// (SplitLayout.h) decode with the same operations as the blocks.
__device__ inline float valueQ4K(const uint8_t *head, const uint8_t *qs,
                                 int i) {
  int sc, m;
  scaleMinK4(head + 4, i / 32, sc, m);
  float dl = f16(head) * float(sc), ml = f16(head + 2) * float(m);
  return dl * float(k4Nibble(qs, i)) - ml;
}

/// Value i of a Q5_K block: head as Q4_K, qh[32], qs[128].
__device__ inline float valueQ5K(const uint8_t *head, const uint8_t *qh,
                                 const uint8_t *qs, int i) {
  int sc, m, j = i / 32, l = i % 32;
  scaleMinK4(head + 4, j, sc, m);
  float dl = f16(head) * float(sc), ml = f16(head + 2) * float(m);
  int q = k4Nibble(qs, i) | ((qh[l] >> j) & 1) << 4;
  return dl * float(q) - ml;
}

/// Value i of a Q6_K block: ql[128], qh[64], int8 scales[16], d (f16).
__device__ inline float valueQ6K(const uint8_t *ql, const uint8_t *qh,
                                 const uint8_t *scales, const uint8_t *d,
                                 int i) {
  int c = i / 128, r = i % 128;
  int low = (ql[64 * c + r % 64] >> (4 * (r / 64))) & 15;
  int high = (qh[32 * c + r % 32] >> (2 * (r / 32))) & 3;
  float dl = f16(d) * float(int8_t(scales[i / 16]));
  return dl * float((low | high << 4) - 32);
}

/// Value i of a Q5_0 block from its fields: d (f16), qh (32 fifth bits,
/// little-endian), qs[16] (value j < 16 the low nibble of qs[j], j + 16 its
/// high nibble). Apart, as valueQ4K.
__device__ inline float valueQ5_0(const uint8_t *d, const uint8_t *qh,
                                  const uint8_t *qs, int i) {
  int q = nibble32(qs, i) | int((u32(qh) >> i) & 1) << 4;
  return f16(d) * float(q - 16);
}

/// Value i of a Q5_1 block: dm = d, m (f16), qh and qs as Q5_0.
__device__ inline float valueQ5_1(const uint8_t *dm, const uint8_t *qh,
                                  const uint8_t *qs, int i) {
  int q = nibble32(qs, i) | int((u32(qh) >> i) & 1) << 4;
  return f16(dm) * float(q) + f16(dm + 2);
}

/// Value i of an IQ4_NL block: d (f16), qs[16] (nibbles as Q5_0's).
__device__ inline float valueIQ4NL(const uint8_t *d, const uint8_t *qs, int i) {
  return f16(d) * float(kIQ4Levels[nibble32(qs, i)]);
}

/// Value i of an IQ4_XS block: head = d (f16), scales_h (u16), scales_l[4];
/// qs[128], 16 bytes per 32-value sub-block.
__device__ inline float valueIQ4XS(const uint8_t *head, const uint8_t *qs,
                                   int i) {
  int j = i / 32, l = i % 32;
  int low = (head[4 + j / 2] >> (4 * (j % 2))) & 15;
  int high = (u16(head + 2) >> (2 * j)) & 3;
  float dl = f16(head) * float((low | high << 4) - 32);
  return dl * float(kIQ4Levels[nibble32(qs + 16 * j, l)]);
}

/// Decodes value `i` of one block of `type` (i < the type's block size).
/// Per value, so callers may decode any subset without a buffer.
__device__ inline float value(GGMLType type, const uint8_t *b, int i) {
  switch (type) {
  case GGMLType::F32:
    return __uint_as_float(u32(b));
  case GGMLType::F16:
    return f16(b);
  case GGMLType::BF16:
    return bf16(b);
  case GGMLType::Q4_0:
    return f16(b) * float(nibble32(b + 2, i) - 8);
  case GGMLType::Q4_1:
    return f16(b) * float(nibble32(b + 4, i)) + f16(b + 2);
  case GGMLType::Q5_0:
    return valueQ5_0(b, b + 2, b + 6, i);
  case GGMLType::Q5_1:
    return valueQ5_1(b, b + 4, b + 8, i);
  case GGMLType::Q8_0:
    return float(int8_t(b[2 + i])) * f16(b);
  case GGMLType::Q2_K: {
    int c = i / 128, s = (i / 32) % 4, l = i % 32;
    int q = (b[16 + 32 * c + l] >> (2 * s)) & 3;
    uint8_t sm = b[i / 16];
    float dl = f16(b + 80) * float(sm & 15);
    float ml = f16(b + 82) * float(sm >> 4);
    return dl * float(q) - ml;
  }
  case GGMLType::Q3_K: {
    const uint8_t *s = b + 96;
    int k = i / 16;
    int low = k < 8 ? s[k] & 15 : s[k - 8] >> 4;
    int high = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
    float dl = f16(b + 108) * float((low | high << 4) - 32);
    int c = i / 128, sh = (i / 32) % 4, l = i % 32;
    int q = (b[32 + 32 * c + l] >> (2 * sh)) & 3;
    int hbit = (b[l] >> (i / 32)) & 1;
    return dl * float(q - (hbit ? 0 : 4));
  }
  case GGMLType::Q4_K:
    return valueQ4K(b, b + 16, i);
  case GGMLType::Q5_K:
    return valueQ5K(b, b + 16, b + 48, i);
  case GGMLType::Q6_K:
    return valueQ6K(b, b + 128, b + 192, b + 208, i);
  case GGMLType::IQ4_NL:
    return valueIQ4NL(b, b + 2, i);
  case GGMLType::IQ4_XS:
    return valueIQ4XS(b, b + 8, i);
  default:
    return __int_as_float(0x7fc00000); // never reached: checked on the host
  }
}

} // namespace kiln::cuda::generic

#endif // KILN_BACKENDS_CUDA_GENERICQUANT_CUH
