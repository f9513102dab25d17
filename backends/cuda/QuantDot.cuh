//===- QuantDot.cuh - One warp's dot of a GGUF weight row with x -*- CUDA -*-===//
//
// warpDotRow(type, row, x, cols): one warp computes the dot product of one
// weight row, in the file's own block layout, with x[cols] (f32), and every
// lane returns the sum. Q8_0, Q2_K to Q6_K, F32, F16 and BF16 have
// specialised routines that decode whole groups of values in registers;
// every other type (and any pointer too misaligned for the wide loads) takes
// the generic per-value loop of GenericMatVec.cu.
//
// Layout of the specialised routines. They keep x's loads contiguous across
// the warp: in each x load instruction lane l reads float4 number l of a
// 128-value step (512 contiguous bytes), and each lane reads the weight
// bytes of exactly those 4 values:
//   Q8_0 (34-byte blocks, rows 2-aligned): a step is 4 blocks; lane l takes
//     block l / 8 of the step, quants 4 (l % 8) .. +3 (two 2-byte loads) and
//     the block's d (a 2-byte load shared by its 8 lanes). Lane sums are
//     d * (q . x) per block.
//   Q4_K / Q5_K (144 / 176-byte blocks, 16-aligned): a warp pass is one
//     256-value block, two steps; lane l takes values 4l .. 4l+3 (sub-block
//     j = l / 8) and 128 + 4l .. (sub-block j + 4): one 16-byte load of the
//     block's d, dmin and 12 scale bytes (the same for all lanes), one
//     4-byte load of quants per step (nibble j % 2 of qs[32 (j/2) + 4 (l%8)
//     ..], + 64 for the second step) and, for Q5_K, one 4-byte load of qh
//     (bits j and j + 4 of qh[4 (l%8) ..]). The two scale/min pairs of a
//     lane share their three scale bytes. Lane sums are dl * (q . x) -
//     ml * sum(x) per sub-block.
//   Q6_K (210-byte blocks, only 2-aligned): a pass is one block, two steps
//     as above; lane l reads 4 bytes of ql at 64c + 4 (l%16), 4 of qh at
//     128 + 32c + 4 (l%8) (c = the step; aligned 4-byte words, shifted when
//     the block is 2 mod 4), the int8 scale 8c + l/4 and d. Lane sums are
//     (d * sc) * ((q - 32) . x).
//   Q2_K (84-byte blocks, rows 4-aligned): a pass is one block, two steps;
//     lane l reads the 4 bytes of qs at 16 + 32c + 4 (l%8) (step c; the
//     levels of values 128c + 4l .. +3 sit at bit 2 (l/8)), and the
//     sub-block's scale byte 8c + l/4 (low nibble scale, high min), with
//     d and dmin. Lane sums are dl * (q . x) - ml * sum(x) per step.
//   Q3_K (110-byte blocks, only 2-aligned): as Q2_K for the two low bits
//     (qs at 32 + 32c + 4 (l%8)), the third from hmask[4 (l%8) ..] at bit
//     4c + l/8 (aligned words, as Q6_K), the 6-bit scales of sub-blocks
//     l/4 and 8 + l/4 from scales[l/4] and scales[8 + (l/4)%4]. Lane sums
//     are (d * (sc - 32)) * ((q - 4) . x).
//   F32 / F16 / BF16: lane l takes value group l of each 128-value step (one
//     float4 of the row, or 8 bytes of halves); a scalar loop covers the
//     tail and rows or x that are not 16 / 8-aligned.
// Quants become floats exactly without integer conversions: a byte b under
// the exponent of 2^23 is the float 2^23 + b, and subtracting 2^23 + offset
// (exact) leaves b - offset.
//
// The values are gguf-py's up to float rounding (the factored forms and
// fused multiply-adds round differently from dequantise-then-multiply); the
// order of every sum is fixed by the lane layout and warpSum, so results
// are the same bits on every run.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_BACKENDS_CUDA_QUANTDOT_CUH
#define KILN_BACKENDS_CUDA_QUANTDOT_CUH

#include "GenericQuant.cuh"
#include "Warp.cuh"

#include "quant/QuantTypes.h"

#include <cuda_fp16.h>

#include <cstdint>

namespace kiln::cuda {

namespace quantdot {

/// 2^23: a float whose ulp is 1.
constexpr float kMagic = 8388608.f;

/// float(byte I of w) - (bias - 2^23), exactly.
template <int I>
__device__ __forceinline__ float byteValue(uint32_t w, float bias) {
  return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7540u | I)) - bias;
}

/// sum over i < 4 of (byte i of w - (bias - 2^23)) * x_i.
__device__ __forceinline__ float dot4(uint32_t w, float bias, float4 x) {
  float s = byteValue<0>(w, bias) * x.x;
  s = fmaf(byteValue<1>(w, bias), x.y, s);
  s = fmaf(byteValue<2>(w, bias), x.z, s);
  return fmaf(byteValue<3>(w, bias), x.w, s);
}

__device__ __forceinline__ float sum4(float4 x) {
  return (x.x + x.y) + (x.z + x.w);
}

/// float(v) for v < 2^23, exactly.
__device__ __forceinline__ float smallToFloat(uint32_t v) {
  return __uint_as_float(0x4B000000u | v) - kMagic;
}

__device__ __forceinline__ float halfBits(uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
}

/// Byte `index` (0..3) of w.
__device__ __forceinline__ uint32_t byteOf(uint32_t w, int index) {
  return __byte_perm(w, 0u, 0x4440u | uint32_t(index));
}

/// Four bytes at a 2-aligned address, from the aligned word(s) holding
/// them (the second word only when p is 2 mod 4; it ends 2 bytes past
/// p + 3, so callers keep 2 readable bytes after the group).
__device__ __forceinline__ uint32_t load4At2(const uint8_t *p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t *w = reinterpret_cast<const uint32_t *>(a & ~uintptr_t(3));
  const uint32_t lo = __ldg(w);
  const uint32_t hi = (a & 2) ? __ldg(w + 1) : 0u;
  return __funnelshift_r(lo, hi, uint32_t(a & 2) * 8);
}

/// Values per block and bytes per block of the types GenericQuant.cuh
/// decodes (1 and 0 for any other: never reached, checked on the host).
__device__ inline void blockShape(GGMLType type, int &values, int &bytes) {
  switch (type) {
  case GGMLType::F32: values = 1; bytes = 4; return;
  case GGMLType::F16:
  case GGMLType::BF16: values = 1; bytes = 2; return;
  case GGMLType::Q4_0:
  case GGMLType::IQ4_NL: values = 32; bytes = 18; return;
  case GGMLType::Q4_1: values = 32; bytes = 20; return;
  case GGMLType::Q5_0: values = 32; bytes = 22; return;
  case GGMLType::Q5_1: values = 32; bytes = 24; return;
  case GGMLType::Q8_0: values = 32; bytes = 34; return;
  case GGMLType::Q2_K: values = 256; bytes = 84; return;
  case GGMLType::Q3_K: values = 256; bytes = 110; return;
  case GGMLType::Q4_K: values = 256; bytes = 144; return;
  case GGMLType::Q5_K: values = 256; bytes = 176; return;
  case GGMLType::Q6_K: values = 256; bytes = 210; return;
  case GGMLType::IQ4_XS: values = 256; bytes = 136; return;
  default: values = 1; bytes = 0; return;
  }
}

/// Any type: lane l decodes values l, l + 32, ... one at a time.
__device__ inline float dotGeneric(GGMLType type, const uint8_t *row,
                                   const float *x, int64_t cols) {
  const int lane = threadIdx.x % kWarp;
  int values, bytes;
  blockShape(type, values, bytes);
  float acc = 0.f;
  for (int64_t col = lane; col < cols; col += kWarp) {
    const uint8_t *block = row + col / values * bytes;
    acc = fmaf(generic::value(type, block, int(col % values)), x[col], acc);
  }
  return warpSum(acc);
}

/// Q8_0: d (f16), qs[32] (int8). Row 2-aligned, x 16-aligned.
__device__ inline float dotQ8_0(const uint8_t *row, const float *x,
                                int64_t cols) {
  const int lane = threadIdx.x % kWarp, t = lane % 8;
  const int blocks = int(cols / 32);
  const float4 *x4 = reinterpret_cast<const float4 *>(x) + t;
  float acc = 0.f;
#pragma unroll 4
  for (int b = lane / 8; b < blocks; b += 4) {
    const unsigned short *h =
        reinterpret_cast<const unsigned short *>(row + int64_t(b) * 34);
    const float d = halfBits(__ldg(h));
    // Quants 4t .. 4t+3 are bytes 2 + 4t .. 5 + 4t: halves 1 + 2t, 2 + 2t.
    const uint32_t q =
        uint32_t(__ldg(h + 1 + 2 * t)) | uint32_t(__ldg(h + 2 + 2 * t)) << 16;
    const float4 xv = __ldg(x4 + int64_t(b) * 8);
    // q + 128 as unsigned bytes, so the bias is 2^23 + 128.
    acc = fmaf(d, dot4(q ^ 0x80808080u, kMagic + 128.f, xv), acc);
  }
  return warpSum(acc);
}

/// The scale and min of sub-blocks j and j + 4 (j < 4) of a Q4_K / Q5_K
/// block, times d and dmin, from its first 16 bytes (d, dmin, scales[12]).
__device__ __forceinline__ void scalesK4(uint4 head, int j, float &dl0,
                                         float &ml0, float &dl1, float &ml1) {
  const float d = halfBits(head.x & 0xFFFFu), dmin = halfBits(head.x >> 16);
  const uint32_t a = byteOf(head.y, j), b = byteOf(head.z, j),
                 c = byteOf(head.w, j); // scales[j], [j + 4], [j + 8]
  dl0 = d * smallToFloat(a & 63);
  ml0 = dmin * smallToFloat(b & 63);
  dl1 = d * smallToFloat((c & 15) | (a >> 6) << 4);
  ml1 = dmin * smallToFloat((c >> 4) | (b >> 6) << 4);
}

/// Q4_K (kHigh = false): d, dmin, scales[12], qs[128]. Q5_K (kHigh): d,
/// dmin, scales[12], qh[32], qs[128]. Row 16-aligned, x 16-aligned.
template <bool kHigh>
__device__ inline float dotK45(const uint8_t *row, const float *x,
                               int64_t cols) {
  constexpr int kBlockBytes = kHigh ? 176 : 144, kQs = kHigh ? 48 : 16;
  const int lane = threadIdx.x % kWarp, j = lane / 8, t = lane % 8;
  const int shift = 4 * (j & 1), word = 8 * (j / 2) + t;
  const int blocks = int(cols / 256);
  const float4 *x4 = reinterpret_cast<const float4 *>(x) + lane;
  float acc = 0.f;
#pragma unroll 2
  for (int b = 0; b < blocks; ++b) {
    const uint8_t *block = row + int64_t(b) * kBlockBytes;
    const uint4 head = __ldg(reinterpret_cast<const uint4 *>(block));
    const uint32_t *qs = reinterpret_cast<const uint32_t *>(block + kQs);
    uint32_t qa = (__ldg(qs + word) >> shift) & 0x0F0F0F0Fu;
    uint32_t qb = (__ldg(qs + word + 16) >> shift) & 0x0F0F0F0Fu;
    if constexpr (kHigh) {
      const uint32_t h =
          __ldg(reinterpret_cast<const uint32_t *>(block + 16) + t);
      qa |= ((h >> j) & 0x01010101u) << 4;
      qb |= ((h >> (j + 4)) & 0x01010101u) << 4;
    }
    const float4 xa = __ldg(x4 + int64_t(b) * 64);
    const float4 xb = __ldg(x4 + int64_t(b) * 64 + 32);
    float dl0, ml0, dl1, ml1;
    scalesK4(head, j, dl0, ml0, dl1, ml1);
    acc = fmaf(dl0, dot4(qa, kMagic, xa), acc);
    acc = fmaf(-ml0, sum4(xa), acc);
    acc = fmaf(dl1, dot4(qb, kMagic, xb), acc);
    acc = fmaf(-ml1, sum4(xb), acc);
  }
  return warpSum(acc);
}

/// Q6_K: ql[128], qh[64], scales[16] (int8), d (f16). Row 2-aligned, x
/// 16-aligned. Every group read ends at least 2 bytes before the block's
/// end (qh ends at 192), as load4At2 needs.
__device__ inline float dotQ6_K(const uint8_t *row, const float *x,
                                int64_t cols) {
  const int lane = threadIdx.x % kWarp;
  const int low = 4 * (lane % 16), lowShift = 4 * (lane / 16);
  const int high = 128 + 4 * (lane % 8), highShift = 2 * (lane / 8);
  const int scale = 192 + lane / 4;
  const int blocks = int(cols / 256);
  const float4 *x4 = reinterpret_cast<const float4 *>(x) + lane;
  float acc = 0.f;
#pragma unroll 2
  for (int b = 0; b < blocks; ++b) {
    const uint8_t *block = row + int64_t(b) * 210;
    const uint32_t la = load4At2(block + low), lb = load4At2(block + 64 + low);
    const uint32_t ha = load4At2(block + high),
                   hb = load4At2(block + high + 32);
    const int sa = __ldg(reinterpret_cast<const signed char *>(block + scale));
    const int sb =
        __ldg(reinterpret_cast<const signed char *>(block + scale + 8));
    const float d =
        halfBits(__ldg(reinterpret_cast<const unsigned short *>(block + 208)));
    const float4 xa = __ldg(x4 + int64_t(b) * 64);
    const float4 xb = __ldg(x4 + int64_t(b) * 64 + 32);
    const uint32_t qa = ((la >> lowShift) & 0x0F0F0F0Fu) |
                        ((ha >> highShift) & 0x03030303u) << 4;
    const uint32_t qb = ((lb >> lowShift) & 0x0F0F0F0Fu) |
                        ((hb >> highShift) & 0x03030303u) << 4;
    // gguf-py's d * scale, then times q - 32.
    const float dla = d * (smallToFloat(uint32_t(sa + 128)) - 128.f);
    const float dlb = d * (smallToFloat(uint32_t(sb + 128)) - 128.f);
    acc = fmaf(dla, dot4(qa, kMagic + 32.f, xa), acc);
    acc = fmaf(dlb, dot4(qb, kMagic + 32.f, xb), acc);
  }
  return warpSum(acc);
}

/// Q2_K: scales[16] (scale | min << 4), qs[64], d, dmin (f16). R rows
/// (4-aligned), x 16-aligned: the layout above, R rows a block, each row's
/// lane sum added to acc[r] (R = 1 is warpDotRow's routine).
template <int R>
__device__ inline void dotQ2_KRows(const uint8_t *const (&rows)[R],
                                   const float *x, int64_t cols,
                                   float (&acc)[R]) {
  const int lane = threadIdx.x % kWarp;
  const int word = 16 + 4 * (lane % 8), shift = 2 * (lane / 8);
  const int scale = lane / 4;
  const int blocks = int(cols / 256);
  const float4 *x4 = reinterpret_cast<const float4 *>(x) + lane;
  for (int b = 0; b < blocks; ++b) {
    uint32_t qa[R], qb[R], sa[R], sb[R], dd[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint8_t *block = rows[r] + int64_t(b) * 84;
      qa[r] = __ldg(reinterpret_cast<const uint32_t *>(block + word));
      qb[r] = __ldg(reinterpret_cast<const uint32_t *>(block + word + 32));
      sa[r] = __ldg(block + scale);
      sb[r] = __ldg(block + scale + 8);
      dd[r] = __ldg(reinterpret_cast<const uint32_t *>(block + 80));
    }
    const float4 xa = __ldg(x4 + int64_t(b) * 64);
    const float4 xb = __ldg(x4 + int64_t(b) * 64 + 32);
    const float sumA = sum4(xa), sumB = sum4(xb);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float d = halfBits(dd[r] & 0xFFFFu), dmin = halfBits(dd[r] >> 16);
      // gguf-py's d * scale and dmin * min, each rounded on its own.
      acc[r] = fmaf(d * smallToFloat(sa[r] & 15),
                    dot4((qa[r] >> shift) & 0x03030303u, kMagic, xa), acc[r]);
      acc[r] = fmaf(-(dmin * smallToFloat(sa[r] >> 4)), sumA, acc[r]);
      acc[r] = fmaf(d * smallToFloat(sb[r] & 15),
                    dot4((qb[r] >> shift) & 0x03030303u, kMagic, xb), acc[r]);
      acc[r] = fmaf(-(dmin * smallToFloat(sb[r] >> 4)), sumB, acc[r]);
    }
  }
}

/// Q3_K: hmask[32], qs[64], scales[12], d (f16). R rows (2-aligned), x
/// 16-aligned, as dotQ2_KRows. Every 4-byte group read ends at least 2
/// bytes before the block's end (qs ends at 96), as load4At2 needs.
template <int R>
__device__ inline void dotQ3_KRows(const uint8_t *const (&rows)[R],
                                   const float *x, int64_t cols,
                                   float (&acc)[R]) {
  const int lane = threadIdx.x % kWarp;
  const int group = 4 * (lane % 8), shift = 2 * (lane / 8), bit = lane / 8;
  const int k = lane / 4; // sub-block of step 0; step 1's is 8 + k
  const int blocks = int(cols / 256);
  const float4 *x4 = reinterpret_cast<const float4 *>(x) + lane;
  for (int b = 0; b < blocks; ++b) {
    uint32_t h[R], la[R], lb[R], lowBits[R], highBits[R], dh[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint8_t *block = rows[r] + int64_t(b) * 110;
      h[r] = load4At2(block + group);
      la[r] = load4At2(block + 32 + group);
      lb[r] = load4At2(block + 64 + group);
      lowBits[r] = __ldg(block + 96 + k);
      highBits[r] = __ldg(block + 104 + k % 4);
      dh[r] = __ldg(reinterpret_cast<const unsigned short *>(block + 108));
    }
    const float4 xa = __ldg(x4 + int64_t(b) * 64);
    const float4 xb = __ldg(x4 + int64_t(b) * 64 + 32);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      // Levels + 4: two bits from qs, the third from hmask.
      const uint32_t qa = ((la[r] >> shift) & 0x03030303u) |
                          ((h[r] >> bit) & 0x01010101u) << 2;
      const uint32_t qb = ((lb[r] >> shift) & 0x03030303u) |
                          ((h[r] >> (bit + 4)) & 0x01010101u) << 2;
      const uint32_t sa = (lowBits[r] & 15) |
                          ((highBits[r] >> (2 * (k / 4))) & 3) << 4;
      const uint32_t sb = (lowBits[r] >> 4) |
                          ((highBits[r] >> (2 * (2 + k / 4))) & 3) << 4;
      const float d = halfBits(dh[r]);
      // gguf-py's d * (scale - 32), then times q - 4.
      acc[r] = fmaf(d * (smallToFloat(sa) - 32.f),
                    dot4(qa, kMagic + 4.f, xa), acc[r]);
      acc[r] = fmaf(d * (smallToFloat(sb) - 32.f),
                    dot4(qb, kMagic + 4.f, xb), acc[r]);
    }
  }
}

/// One row of Q2_K (4-aligned) or Q3_K (2-aligned) with x (16-aligned).
template <bool kQ3>
__device__ inline float dotLowBitK(const uint8_t *row, const float *x,
                                   int64_t cols) {
  const uint8_t *rows[1] = {row};
  float acc[1] = {0.f};
  if constexpr (kQ3)
    dotQ3_KRows<1>(rows, x, cols, acc);
  else
    dotQ2_KRows<1>(rows, x, cols, acc);
  return warpSum(acc[0]);
}

/// F32: row 4-aligned. The float4 path when row and x are 16-aligned.
__device__ inline float dotF32(const uint8_t *row, const float *x,
                               int64_t cols) {
  const int lane = threadIdx.x % kWarp;
  const float *w = reinterpret_cast<const float *>(row);
  float acc = 0.f;
  int64_t done = 0;
  if (((reinterpret_cast<uintptr_t>(row) | reinterpret_cast<uintptr_t>(x)) &
       15) == 0) {
    const float4 *w4 = reinterpret_cast<const float4 *>(row);
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
    const int64_t groups = cols / 4;
#pragma unroll 4
    for (int64_t i = lane; i < groups; i += kWarp) {
      const float4 a = __ldg(w4 + i), v = __ldg(x4 + i);
      acc = fmaf(a.x, v.x, acc);
      acc = fmaf(a.y, v.y, acc);
      acc = fmaf(a.z, v.z, acc);
      acc = fmaf(a.w, v.w, acc);
    }
    done = groups * 4;
  }
  for (int64_t i = done + lane; i < cols; i += kWarp)
    acc = fmaf(__ldg(w + i), __ldg(x + i), acc);
  return warpSum(acc);
}

/// The float of the low / high half of a word of two f16 or bf16 values.
template <bool kBf16> __device__ __forceinline__ float lowHalf(uint32_t w) {
  return kBf16 ? __uint_as_float(w << 16) : halfBits(w & 0xFFFFu);
}
template <bool kBf16> __device__ __forceinline__ float highHalf(uint32_t w) {
  return kBf16 ? __uint_as_float(w & 0xFFFF0000u) : halfBits(w >> 16);
}

/// F16 / BF16: row 2-aligned. 8 bytes of the row and a float4 of x per
/// lane when the row is 8-aligned and x 16-aligned.
template <bool kBf16>
__device__ inline float dotHalves(const uint8_t *row, const float *x,
                                  int64_t cols) {
  const int lane = threadIdx.x % kWarp;
  const unsigned short *w = reinterpret_cast<const unsigned short *>(row);
  float acc = 0.f;
  int64_t done = 0;
  if ((reinterpret_cast<uintptr_t>(row) & 7) == 0 &&
      (reinterpret_cast<uintptr_t>(x) & 15) == 0) {
    const uint2 *w2 = reinterpret_cast<const uint2 *>(row);
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
    const int64_t groups = cols / 4;
#pragma unroll 4
    for (int64_t i = lane; i < groups; i += kWarp) {
      const uint2 a = __ldg(w2 + i);
      const float4 v = __ldg(x4 + i);
      acc = fmaf(lowHalf<kBf16>(a.x), v.x, acc);
      acc = fmaf(highHalf<kBf16>(a.x), v.y, acc);
      acc = fmaf(lowHalf<kBf16>(a.y), v.z, acc);
      acc = fmaf(highHalf<kBf16>(a.y), v.w, acc);
    }
    done = groups * 4;
  }
  for (int64_t i = done + lane; i < cols; i += kWarp)
    acc = fmaf(lowHalf<kBf16>(__ldg(w + i)), __ldg(x + i), acc);
  return warpSum(acc);
}

} // namespace quantdot

/// The dot product of one weight row of `type` (GGUF block layout, cols
/// values, cols a multiple of the type's block size) with x[cols], computed
/// by the whole warp (all 32 lanes must call it together) and returned in
/// every lane. Wide paths need x 16-aligned and the row 2-aligned (Q8_0,
/// Q3_K, Q6_K, F16, BF16), 4-aligned (F32, Q2_K) or 16-aligned (Q4_K,
/// Q5_K); otherwise,
/// and for every other type, the generic per-value loop runs.
__device__ inline float warpDotRow(GGMLType type, const uint8_t *row,
                                   const float *x, int64_t cols) {
  const uintptr_t r = reinterpret_cast<uintptr_t>(row);
  const bool x16 = (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  switch (type) {
  case GGMLType::F32:
    if ((r & 3) == 0)
      return quantdot::dotF32(row, x, cols);
    break;
  case GGMLType::F16:
    if ((r & 1) == 0)
      return quantdot::dotHalves<false>(row, x, cols);
    break;
  case GGMLType::BF16:
    if ((r & 1) == 0)
      return quantdot::dotHalves<true>(row, x, cols);
    break;
  case GGMLType::Q8_0:
    if ((r & 1) == 0 && x16)
      return quantdot::dotQ8_0(row, x, cols);
    break;
  case GGMLType::Q4_K:
    if ((r & 15) == 0 && x16)
      return quantdot::dotK45<false>(row, x, cols);
    break;
  case GGMLType::Q5_K:
    if ((r & 15) == 0 && x16)
      return quantdot::dotK45<true>(row, x, cols);
    break;
  case GGMLType::Q6_K:
    if ((r & 1) == 0 && x16)
      return quantdot::dotQ6_K(row, x, cols);
    break;
  case GGMLType::Q2_K:
    if ((r & 3) == 0 && x16)
      return quantdot::dotLowBitK<false>(row, x, cols);
    break;
  case GGMLType::Q3_K:
    if ((r & 1) == 0 && x16)
      return quantdot::dotLowBitK<true>(row, x, cols);
    break;
  default:
    break;
  }
  return quantdot::dotGeneric(type, row, x, cols);
}


//===----------------------------------------------------------------------===//
// Several rows per warp. warpDotRows<R> dots R rows (row0 + r * stride, r <
// R; rows past nrows repeat row nrows - 1, whose dot the caller ignores)
// with the same x, so every x load serves R rows, and issues all R rows'
// weight loads of a pass before any of the pass's math: R times the bytes
// in flight of one row. Q8_0, Q2_K to Q6_K have such routines; every
// other type takes warpDotRow with R = 1 (hasMultiRowDot tells callers), and
// rows or x off the wide loads' alignment the per-value loop. Lane layouts:
//   Q8_0, Q2_K, Q3_K, Q6_K: as warpDotRow's (above), R rows per pass.
//   Q4_K / Q5_K: a warp pass is 4 blocks of each row, 8 lanes a block:
//     lane l takes block g = l / 8 of the pass and quant bytes qs[16 t ..
//     16 t + 15] (t = l % 8, one 16-byte load), i.e. with c = t / 2, h = t
//     % 2 the values i = 16 h .. 16 h + 15 of sub-block 2c (low nibbles,
//     x[64c + 16h + i']) and of sub-block 2c + 1 (high nibbles, x[64c + 32
//     + 16h + i']); for Q5_K also qh[16 h .. 16 h + 15] (bits 2c and 2c +
//     1; one 16-byte load), and the block's first 16 bytes (d, dmin,
//     scales; one 16-byte load shared by the 8 lanes). The lane's 32 x
//     values (8 float4) and their two sums are loaded once for all rows.
//     Lane sums are dl * (q . x) - ml * sum(x) per sub-block.
// The weights are streamed once, so their 16-byte loads skip L1
// (ld.global.nc.L1::no_allocate; each is used whole by one instruction);
// x stays cached. Every row's lane sum is fixed by the layout and reduced
// by one warpSum at the end: deterministic.
//===----------------------------------------------------------------------===//

namespace quantdot {

/// A 16-byte read-only load that does not allocate in L1.
__device__ __forceinline__ uint4 loadStream(const uint8_t *p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

/// acc + sum over i < 4 of (byte i of w - (bias - 2^23)) * x_i, one chain.
__device__ __forceinline__ float dot4Acc(uint32_t w, float bias, float4 x,
                                         float acc) {
  acc = fmaf(byteValue<0>(w, bias), x.x, acc);
  acc = fmaf(byteValue<1>(w, bias), x.y, acc);
  acc = fmaf(byteValue<2>(w, bias), x.z, acc);
  return fmaf(byteValue<3>(w, bias), x.w, acc);
}

/// Scale and min of sub-block s (0..7) of a Q4_K / Q5_K block, times d and
/// dmin, from its first 16 bytes (gguf-py's get_scale_min).
__device__ __forceinline__ void scaleMinK(uint4 head, int s, float &dl,
                                          float &ml) {
  const float d = halfBits(head.x & 0xFFFFu), dmin = halfBits(head.x >> 16);
  const int j = s & 3;
  const uint32_t a = byteOf(head.y, j), b = byteOf(head.z, j),
                 c = byteOf(head.w, j); // scales[j], [j + 4], [j + 8]
  const uint32_t sc = s < 4 ? a & 63 : (c & 15) | (a >> 6) << 4;
  const uint32_t m = s < 4 ? b & 63 : (c >> 4) | (b >> 6) << 4;
  dl = d * smallToFloat(sc);
  ml = dmin * smallToFloat(m);
}

/// The x share of a Q4_K / Q5_K lane (see above): the 16 values of the low
/// nibbles, the 16 of the high nibbles, and their sums. x4 points at the
/// block's first float4.
struct K45X {
  float4 lo[4], hi[4];
  float sumLo, sumHi;
};

/// The loads of loadK45X alone (the sums left unset), so that a caller can
/// have them in flight with others before it uses them (sumK45X).
__device__ __forceinline__ void loadK45Values(const float4 *x4, int t,
                                              K45X &v) {
  const float4 *p = x4 + 16 * (t / 2) + 4 * (t % 2);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    v.lo[k] = __ldg(p + k);
    v.hi[k] = __ldg(p + 8 + k);
  }
}

__device__ __forceinline__ void sumK45X(K45X &v) {
  v.sumLo = (sum4(v.lo[0]) + sum4(v.lo[1])) + (sum4(v.lo[2]) + sum4(v.lo[3]));
  v.sumHi = (sum4(v.hi[0]) + sum4(v.hi[1])) + (sum4(v.hi[2]) + sum4(v.hi[3]));
}

__device__ __forceinline__ K45X loadK45X(const float4 *x4, int t) {
  K45X v;
  loadK45Values(x4, t, v);
  sumK45X(v);
  return v;
}

/// One lane's sum for one Q4_K / Q5_K block: head = its first 16 bytes, qs
/// = quant bytes 16 t .., qh (Q5_K) = qh[16 (t % 2) ..].
template <bool kHigh>
__device__ __forceinline__ float k45Lane(uint4 head, uint4 qs, uint4 qh,
                                         int t, const K45X &x) {
  const int c = t / 2;
  const uint32_t q[4] = {qs.x, qs.y, qs.z, qs.w};
  const uint32_t hb[4] = {qh.x, qh.y, qh.z, qh.w};
  float lo = 0.f, hi = 0.f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    uint32_t ql = q[k] & 0x0F0F0F0Fu, qu = (q[k] >> 4) & 0x0F0F0F0Fu;
    if constexpr (kHigh) {
      ql |= ((hb[k] >> (2 * c)) & 0x01010101u) << 4;
      qu |= ((hb[k] >> (2 * c + 1)) & 0x01010101u) << 4;
    }
    lo = dot4Acc(ql, kMagic, x.lo[k], lo);
    hi = dot4Acc(qu, kMagic, x.hi[k], hi);
  }
  float dl0, ml0, dl1, ml1;
  scaleMinK(head, 2 * c, dl0, ml0);
  scaleMinK(head, 2 * c + 1, dl1, ml1);
  float s = fmaf(dl0, lo, -ml0 * x.sumLo);
  s = fmaf(dl1, hi, s);
  return fmaf(-ml1, x.sumHi, s);
}

//===----------------------------------------------------------------------===//
// Q2_K and Q3_K in a Q4_K lane's share (the routed experts' bulk-copy
// kernels, StepMatVec.cu). Value v of a 256-value block sits in quant byte
// 32 (v / 128) + v % 32 at bit pair (v / 32) % 4; its sub-block is v / 16.
// Lane t's two runs of K45X, values 64 c + 16 h .. + 15 (lo) and 64 c + 32
// + 16 h .. + 15 (hi) for c = t / 2 and h = t % 2, are then the 16 bytes
// at 32 (c / 2) + 16 h of the quants, bit pairs 2 (c % 2) (lo) and 2 (c %
// 2) + 1 (hi), sub-blocks 4 c + h and 4 c + 2 + h. Q3_K's third bit of
// value v is bit v / 32 of hmask byte v % 32: bits 2 c and 2 c + 1 of
// hmask bytes 16 h .. + 15.
//===----------------------------------------------------------------------===//

/// 16 bytes at a 2-aligned address, from the five aligned words holding
/// them (the fifth ends 2 bytes past p + 15 when p is 2 mod 4; callers
/// keep 4 readable bytes after the group). For blocks in shared memory.
__device__ __forceinline__ uint4 load16At2(const uint8_t *p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t *w = reinterpret_cast<const uint32_t *>(a & ~uintptr_t(3));
  const uint32_t s = uint32_t(a & 2) * 8;
  const uint32_t w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3], w4 = w[4];
  return {__funnelshift_r(w0, w1, s), __funnelshift_r(w1, w2, s),
          __funnelshift_r(w2, w3, s), __funnelshift_r(w3, w4, s)};
}

/// 4 bytes at a 2-aligned address, as load16At2 (keeps 2 readable bytes).
__device__ __forceinline__ uint32_t load4At2Plain(const uint8_t *p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t *w = reinterpret_cast<const uint32_t *>(a & ~uintptr_t(3));
  return __funnelshift_r(w[0], (a & 2) ? w[1] : 0u, uint32_t(a & 2) * 8);
}

/// Lane t's sum for one Q2_K block (4-aligned; scales[16] with the min in
/// the high nibble, qs[64], d, dmin) with x's share (K45X, sums set): per
/// run, d * scale times the levels' dot, less dmin * min times the run's
/// sum, each product of two scales rounded on its own as gguf-py's.
__device__ __forceinline__ float q2KLane(const uint8_t *block, int t,
                                         const K45X &x) {
  const int c = t / 2, h = t % 2, shift = 4 * (c % 2);
  const uint32_t *w = reinterpret_cast<const uint32_t *>(block);
  const uint32_t scales = w[c], dd = w[20];
  const uint32_t sl = byteOf(scales, h), sh = byteOf(scales, 2 + h);
  const uint32_t *q = w + 4 + 8 * (c / 2) + 4 * h; // 4-aligned words
  float lo = 0.f, hi = 0.f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    lo = dot4Acc((q[k] >> shift) & 0x03030303u, kMagic, x.lo[k], lo);
    hi = dot4Acc((q[k] >> (shift + 2)) & 0x03030303u, kMagic, x.hi[k], hi);
  }
  const float d = halfBits(dd & 0xFFFFu), dmin = halfBits(dd >> 16);
  float s = fmaf(d * smallToFloat(sl & 15), lo,
                 -(dmin * smallToFloat(sl >> 4)) * x.sumLo);
  s = fmaf(d * smallToFloat(sh & 15), hi, s);
  return fmaf(-(dmin * smallToFloat(sh >> 4)), x.sumHi, s);
}

/// Lane t's sum for one Q3_K block (2-aligned; hmask[32], qs[64],
/// scales[12], d) with x's share: levels (2 bits | hmask bit << 2) - 4,
/// scales of 6 bits less 32 (the low nibble of scales[j % 8], nibble j / 8;
/// the top two bits at 2 (j / 4) of scales[8 + j % 4]).
__device__ __forceinline__ float q3KLane(const uint8_t *block, int t,
                                         const K45X &x) {
  const int c = t / 2, h = t % 2, shift = 4 * (c % 2);
  const uint4 hm = load16At2(block + 16 * h);
  const uint4 qs = load16At2(block + 32 + 32 * (c / 2) + 16 * h);
  const uint32_t low = load4At2Plain(block + 96 + 4 * (c % 2));
  const uint32_t top = load4At2Plain(block + 104);
  const uint32_t dh = *reinterpret_cast<const uint16_t *>(block + 108);
  const uint32_t sl = ((byteOf(low, h) >> (4 * (c / 2))) & 15) |
                      ((byteOf(top, h) >> (2 * c)) & 3) << 4;
  const uint32_t sh = ((byteOf(low, 2 + h) >> (4 * (c / 2))) & 15) |
                      ((byteOf(top, 2 + h) >> (2 * c)) & 3) << 4;
  const uint32_t q[4] = {qs.x, qs.y, qs.z, qs.w};
  const uint32_t m[4] = {hm.x, hm.y, hm.z, hm.w};
  float lo = 0.f, hi = 0.f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t ql = ((q[k] >> shift) & 0x03030303u) |
                        ((m[k] >> (2 * c)) & 0x01010101u) << 2;
    const uint32_t qu = ((q[k] >> (shift + 2)) & 0x03030303u) |
                        ((m[k] >> (2 * c + 1)) & 0x01010101u) << 2;
    lo = dot4Acc(ql, kMagic + 4.f, x.lo[k], lo);
    hi = dot4Acc(qu, kMagic + 4.f, x.hi[k], hi);
  }
  const float d = halfBits(dh);
  // gguf-py's d * (scale - 32), then times the levels' dot.
  return fmaf(d * (smallToFloat(sl) - 32.f), lo,
              d * (smallToFloat(sh) - 32.f) * hi);
}

/// Q4_K / Q5_K, R rows (16-aligned), x 16-aligned: lane sums in acc.
template <bool kHigh, int R>
__device__ inline void dotK45Rows(const uint8_t *const (&rows)[R],
                                  const float *x, int64_t cols,
                                  float (&acc)[R]) {
  constexpr int kBlockBytes = kHigh ? 176 : 144, kQs = kHigh ? 48 : 16;
  const int lane = threadIdx.x % kWarp, t = lane % 8;
  const int blocks = int(cols / 256);
  const float4 *x4 = reinterpret_cast<const float4 *>(x);
  // Not unrolled: R rows' loads are already in flight per pass, and split
  // segments are mostly one or two passes long.
  for (int b = lane / 8; b < blocks; b += 4) {
    // Every row's loads first, then x (L1), then the math.
    uint4 head[R], qs[R], qh[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint8_t *block = rows[r] + int64_t(b) * kBlockBytes;
      head[r] = loadStream(block);
      qs[r] = loadStream(block + kQs + 16 * t);
      qh[r] = kHigh ? loadStream(block + 16 + 16 * (t % 2)) : uint4{};
    }
    const K45X xv = loadK45X(x4 + int64_t(b) * 64, t);
#pragma unroll
    for (int r = 0; r < R; ++r)
      acc[r] += k45Lane<kHigh>(head[r], qs[r], qh[r], t, xv);
  }
}

/// Q8_0, R rows (2-aligned), x 16-aligned: warpDotRow's layout (lane l:
/// block l / 8 of each 4-block step, quants 4 (l % 8) .. +3), R rows a
/// step, two steps' loads in flight.
template <int R>
__device__ inline void dotQ8_0Rows(const uint8_t *const (&rows)[R],
                                   const float *x, int64_t cols,
                                   float (&acc)[R]) {
  const int lane = threadIdx.x % kWarp, t = lane % 8;
  const int blocks = int(cols / 32);
  const float4 *x4 = reinterpret_cast<const float4 *>(x) + t;
#pragma unroll 2
  for (int b = lane / 8; b < blocks; b += 4) {
    uint32_t dh[R], q[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const unsigned short *h =
          reinterpret_cast<const unsigned short *>(rows[r] + int64_t(b) * 34);
      dh[r] = __ldg(h);
      q[r] = uint32_t(__ldg(h + 1 + 2 * t)) | uint32_t(__ldg(h + 2 + 2 * t))
                                                  << 16;
    }
    const float4 xv = __ldg(x4 + int64_t(b) * 8);
#pragma unroll
    for (int r = 0; r < R; ++r)
      acc[r] = fmaf(halfBits(dh[r]),
                    dot4(q[r] ^ 0x80808080u, kMagic + 128.f, xv), acc[r]);
  }
}

/// Q6_K, R rows (2-aligned), x 16-aligned: warpDotRow's layout, R rows a
/// block.
template <int R>
__device__ inline void dotQ6_KRows(const uint8_t *const (&rows)[R],
                                   const float *x, int64_t cols,
                                   float (&acc)[R]) {
  const int lane = threadIdx.x % kWarp;
  const int low = 4 * (lane % 16), lowShift = 4 * (lane / 16);
  const int high = 128 + 4 * (lane % 8), highShift = 2 * (lane / 8);
  const int scale = 192 + lane / 4;
  const int blocks = int(cols / 256);
  const float4 *x4 = reinterpret_cast<const float4 *>(x) + lane;
  for (int b = 0; b < blocks; ++b) {
    uint32_t la[R], lb[R], ha[R], hb[R];
    int sa[R], sb[R];
    uint32_t dh[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint8_t *block = rows[r] + int64_t(b) * 210;
      la[r] = load4At2(block + low);
      lb[r] = load4At2(block + 64 + low);
      ha[r] = load4At2(block + high);
      hb[r] = load4At2(block + high + 32);
      sa[r] = __ldg(reinterpret_cast<const signed char *>(block + scale));
      sb[r] = __ldg(reinterpret_cast<const signed char *>(block + scale + 8));
      dh[r] = __ldg(reinterpret_cast<const unsigned short *>(block + 208));
    }
    const float4 xa = __ldg(x4 + int64_t(b) * 64);
    const float4 xb = __ldg(x4 + int64_t(b) * 64 + 32);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint32_t qa = ((la[r] >> lowShift) & 0x0F0F0F0Fu) |
                          ((ha[r] >> highShift) & 0x03030303u) << 4;
      const uint32_t qb = ((lb[r] >> lowShift) & 0x0F0F0F0Fu) |
                          ((hb[r] >> highShift) & 0x03030303u) << 4;
      const float d = halfBits(dh[r]);
      const float dla = d * (smallToFloat(uint32_t(sa[r] + 128)) - 128.f);
      const float dlb = d * (smallToFloat(uint32_t(sb[r] + 128)) - 128.f);
      acc[r] = fmaf(dla, dot4(qa, kMagic + 32.f, xa), acc[r]);
      acc[r] = fmaf(dlb, dot4(qb, kMagic + 32.f, xb), acc[r]);
    }
  }
}

} // namespace quantdot

/// Values a split segment of a row of `type` should be a multiple of, so
/// that every segment starts on a block boundary, 16-aligned in x, and
/// fills whole passes of warpDotRows' layout (4 blocks for Q4_K / Q5_K).
inline int32_t segmentUnitValues(GGMLType type, int32_t blockValues) {
  if (type == GGMLType::Q4_K || type == GGMLType::Q5_K)
    return 1024;
  return blockValues > 128 ? blockValues : 128;
}

/// Whether warpDotRows has a multi-row routine for `type` (else R rows cost
/// R single-row dots, and callers should prefer one row per warp).
__host__ __device__ inline bool hasMultiRowDot(GGMLType type) {
  return type == GGMLType::Q8_0 || type == GGMLType::Q4_K ||
         type == GGMLType::Q5_K || type == GGMLType::Q6_K ||
         type == GGMLType::Q2_K || type == GGMLType::Q3_K;
}

/// The dots of rows row0 + r * stride (r < R; r >= nrows repeats row nrows
/// - 1, nrows >= 1) with x[cols], each in out[r] of every lane. The whole
/// warp calls it together.
template <int R>
__device__ inline void warpDotRows(GGMLType type, const uint8_t *row0,
                                   uint64_t stride, int nrows, const float *x,
                                   int64_t cols, float (&out)[R]) {
  const uint8_t *rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r)
    rows[r] = row0 + uint64_t(r < nrows ? r : nrows - 1) * stride;
  const uintptr_t a = reinterpret_cast<uintptr_t>(row0) | uintptr_t(stride);
  const bool x16 = (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r)
    acc[r] = 0.f;
  bool done = true;
  if (R > 1 && type == GGMLType::Q8_0 && (a & 1) == 0 && x16)
    quantdot::dotQ8_0Rows<R>(rows, x, cols, acc);
  else if (R > 1 && type == GGMLType::Q4_K && (a & 15) == 0 && x16)
    quantdot::dotK45Rows<false, R>(rows, x, cols, acc);
  else if (R > 1 && type == GGMLType::Q5_K && (a & 15) == 0 && x16)
    quantdot::dotK45Rows<true, R>(rows, x, cols, acc);
  else if (R > 1 && type == GGMLType::Q6_K && (a & 1) == 0 && x16)
    quantdot::dotQ6_KRows<R>(rows, x, cols, acc);
  else if (R > 1 && type == GGMLType::Q2_K && (a & 3) == 0 && x16)
    quantdot::dotQ2_KRows<R>(rows, x, cols, acc);
  else if (R > 1 && type == GGMLType::Q3_K && (a & 1) == 0 && x16)
    quantdot::dotQ3_KRows<R>(rows, x, cols, acc);
  else
    done = false;
  if (done) {
#pragma unroll
    for (int r = 0; r < R; ++r)
      out[r] = warpSum(acc[r]);
    return;
  }
  // Row by row; a repeated row is not computed again. With R > 1 only the
  // per-value loop: callers take several rows a warp only for the types
  // above (hasMultiRowDot), whose rows always meet their alignment, so this
  // is never the hot path there, and the R-row kernels stay free of R
  // inlined copies of every single-row routine (registers).
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (r > 0 && r >= nrows)
      out[r] = out[0];
    else if constexpr (R == 1)
      out[r] = warpDotRow(type, rows[r], x, cols);
    else
      out[r] = quantdot::dotGeneric(type, rows[r], x, cols);
  }
}

/// Rows of exactly one Q4_K / Q5_K block (256 values; the routed experts'
/// down rows at F = 256), row0 + r * stride for r < 4 N (16-aligned; r >=
/// nrows repeats row nrows - 1), all dotted with the same x[256]
/// (16-aligned). Lane group g = l / 8 takes rows g, g + 4, ..., g + 4 (N -
/// 1), lane l % 8 = t the block share of dotK45Rows; x is loaded once. Each
/// row's sum is reduced over its 8 lanes (a fixed butterfly) and lane 8 g
/// writes row g + 4 n's dot to dst[g + 4 n].
template <bool kHigh, int N>
__device__ inline void warpDotOneBlockRowsK45(const uint8_t *row0,
                                              uint64_t stride, int nrows,
                                              const float *x, float *dst) {
  constexpr int kQs = kHigh ? 48 : 16;
  const int lane = threadIdx.x % kWarp, g = lane / 8, t = lane % 8;
  uint4 head[N], qs[N], qh[N];
#pragma unroll
  for (int n = 0; n < N; ++n) {
    const int r = g + 4 * n;
    const uint8_t *block = row0 + uint64_t(r < nrows ? r : nrows - 1) * stride;
    head[n] = quantdot::loadStream(block);
    qs[n] = quantdot::loadStream(block + kQs + 16 * t);
    qh[n] = kHigh ? quantdot::loadStream(block + 16 + 16 * (t % 2)) : uint4{};
  }
  const quantdot::K45X xv =
      quantdot::loadK45X(reinterpret_cast<const float4 *>(x), t);
#pragma unroll
  for (int n = 0; n < N; ++n) {
    float v = quantdot::k45Lane<kHigh>(head[n], qs[n], qh[n], t, xv);
    for (int offset = 4; offset > 0; offset /= 2)
      v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (t == 0)
      dst[g + 4 * n] = v;
  }
}

//===----------------------------------------------------------------------===//
// Prescaled x (the routed experts' Q4_K / Q5_K kernels, StepMatVec.cu). A
// lane that dots many rows with the same 32 x values (its share of one
// 256-value block in dotK45Rows' layout: t = lane % 8, c = t / 2, h = t %
// 2; values 16 h .. 16 h + 15 of sub-blocks 2c, "lo", and 2c + 1, "hi")
// keeps them in registers, scaled once so that each quant costs one
// integer op and one fused multiply-add:
//   A quant q isolated in place by a mask, at bit offset p with p + 5 <=
//   24, is the float q * 2^(p - 149) (a subnormal, or the smallest normal
//   binade, where the value of a bit pattern below 2^24 is exactly the
//   pattern times 2^-149). Times x * 2^(149 - p - E), prescaled, the
//   product is exactly q * x * 2^-E, so a row's sums over its sub-blocks
//   are the plain ones times 2^-E; the lane multiplies them back by 2^E
//   (two powers of two) when it adds the mins. E = e + 22, e the binary
//   exponent of the lane's largest |x|, keeps every prescaled x finite
//   (below 2^128) and every product with a large x normal: products lose
//   bits only where q * x is 2^-100 below the largest |x|. The fused
//   multiply-adds are written in PTX without .ftz so that the subnormal
//   quants survive any flush-to-zero setting.
// Bit offsets per value 4 k + j of the lane's 16 (qs word k, byte j):
//   Q4_K lo: w & 0xF << 8j for j < 3 (p = 0, 8, 16); hi: w & 0xF0 << 8j
//     for j < 3, w >> 28 for j = 3 (p = 4, 12, 20, 0); lo j = 3 is byte 3
//     (w >> 24) less 16 times hi j = 3, one exact multiply-add on the idle
//     float pipe instead of a second integer op (p = 0).
//   Q5_K: the qh bits of the lane's two sub-blocks are rotated next to the
//     nibbles (bit 4 of each byte) and merged into a word of four 5-bit
//     values for lo and one for hi; then & 0x1F << 8j for j < 3, >> 24 for
//     j = 3 (p = 0, 8, 16, 0).
// The scale and min bytes of the lane's two sub-blocks are decoded two at
// a time (bytes j, j + 1 of scales[0..11], shifted and masked together).
// Summation orders are fixed (four chains per row, then the sub-blocks'
// scales), so results are the same bits on every run.
//===----------------------------------------------------------------------===//

namespace quantdot {

/// a * b + c, rounded once, subnormal inputs and results kept.
__device__ __forceinline__ float fmaKeep(float a, float b, float c) {
  float r;
  asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));
  return r;
}

/// 2^e, e in [-126, 127].
__device__ __forceinline__ float pow2(int e) {
  return __uint_as_float(uint32_t(e + 127) << 23);
}

/// The bit offset of value 4 k + j of a lane's lo / hi share (above).
__host__ __device__ constexpr int loOffset(int j) { return j == 3 ? 0 : 8 * j; }
template <bool kHigh> __host__ __device__ constexpr int hiOffset(int j) {
  return kHigh ? loOffset(j) : (j == 3 ? 0 : 8 * j + 4);
}

/// A lane's prescaled x: lo[i] = x_lo[i] * 2^(149 - E - p_i), likewise hi,
/// the unscaled sums of each, and 2^E = backA * backB.
struct K45Prescaled {
  float lo[16], hi[16];
  float sumLo, sumHi;
  float backA, backB;
};

/// Lane t's share of a 256-value block, loaded by loadK45Values (v's sums
/// unset), prescaled.
template <bool kHigh>
__device__ inline void prescaleK45(K45X v, K45Prescaled &s) {
  sumK45X(v);
  s.sumLo = v.sumLo;
  s.sumHi = v.sumHi;
  float m = 0.f;
#pragma unroll
  for (int k = 0; k < 4; ++k)
    m = fmaxf(m, fmaxf(fmaxf(fmaxf(fabsf(v.lo[k].x), fabsf(v.lo[k].y)),
                             fmaxf(fabsf(v.lo[k].z), fabsf(v.lo[k].w))),
                       fmaxf(fmaxf(fabsf(v.hi[k].x), fabsf(v.hi[k].y)),
                             fmaxf(fabsf(v.hi[k].z), fabsf(v.hi[k].w)))));
  // |x| < 2^(e + 1); e = -127 for zero or subnormal maxima, and an
  // infinite one counts as 2^127 (its products are infinite or NaN anyway).
  int e = int((__float_as_uint(m) >> 23) & 0xFFu) - 127;
  e = e < 127 ? e : 127;
  // x * 2^(127 - e - p) as (x * 2^a) * 2^(b - p): a, b in [0, 127].
  const int f = 127 - e, fa = f >> 1, fb = f - fa;
  const float scaleA = pow2(fa);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float lo[4] = {v.lo[k].x, v.lo[k].y, v.lo[k].z, v.lo[k].w};
    const float hi[4] = {v.hi[k].x, v.hi[k].y, v.hi[k].z, v.hi[k].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      s.lo[4 * k + j] = lo[j] * scaleA * pow2(fb - loOffset(j));
      s.hi[4 * k + j] = hi[j] * scaleA * pow2(fb - hiOffset<kHigh>(j));
    }
  }
  // E = e + 22 in [-105, 149], as two powers in range.
  const int back = e + 22, backA = back >> 1;
  s.backA = pow2(backA);
  s.backB = pow2(back - backA);
}

/// The scales (sc) and mins (mn) of sub-blocks 2c and 2c + 1 of a Q4_K /
/// Q5_K block (get_scale_min_k4), as bytes 0 and 1 of each, from its first
/// 16 bytes: j = 2c % 4 and j + 1; for 2c < 4 the low 6 bits of scales[j] /
/// scales[j + 4], else the nibbles of scales[j + 8] below the top 2 bits of
/// scales[j] / scales[j + 4].
__device__ __forceinline__ void scaleMinPairK(uint4 head, int c, uint32_t &sc,
                                              uint32_t &mn) {
  const bool upper = c >= 2;
  const int sh = 16 * (c & 1);
  const uint32_t low = upper ? 0x0F0Fu : 0x3F3Fu, top = upper ? 0x3030u : 0u;
  sc = (((upper ? head.w : head.y) >> sh) & low) | ((head.y >> (sh + 2)) & top);
  mn = (((upper ? head.w : head.z) >> (upper ? sh + 4 : sh)) & low) |
       ((head.z >> (sh + 2)) & top);
}

/// Lane t's sum for one Q4_K / Q5_K block of a row with the prescaled x:
/// head = the block's first 16 bytes (d, dmin, scales), qs = its quant
/// bytes 16 t .. 16 t + 15, qh (Q5_K) = qh[16 (t % 2) ..].
template <bool kHigh>
__device__ __forceinline__ float
k45PrescaledLane(uint4 head, uint4 qs, uint4 qh, int t, const K45Prescaled &s) {
  const int c = t / 2;
  uint32_t sc, mn;
  scaleMinPairK(head, c, sc, mn);
  const float d = halfBits(head.x & 0xFFFFu), dmin = halfBits(head.x >> 16);
  // d * sc as fma(d, 2^23 + sc, -d * 2^23): one rounding, as d * sc.
  const float nd = d * -kMagic, nm = dmin * -kMagic;
  const float dl0 =
      fmaf(d, __uint_as_float(__byte_perm(sc, 0x4B000000u, 0x7540u)), nd);
  const float dl1 =
      fmaf(d, __uint_as_float(__byte_perm(sc, 0x4B000000u, 0x7541u)), nd);
  const float ml0 =
      fmaf(dmin, __uint_as_float(__byte_perm(mn, 0x4B000000u, 0x7540u)), nm);
  const float ml1 =
      fmaf(dmin, __uint_as_float(__byte_perm(mn, 0x4B000000u, 0x7541u)), nm);

  const uint32_t q[4] = {qs.x, qs.y, qs.z, qs.w};
  const uint32_t hb[4] = {qh.x, qh.y, qh.z, qh.w};
  float lo[2] = {0.f, 0.f}, hi[2] = {0.f, 0.f};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    float &l = lo[k & 1], &u = hi[k & 1];
    const float *xl = s.lo + 4 * k, *xh = s.hi + 4 * k;
    if constexpr (kHigh) {
      // qh bits 2c and 2c + 1 of each byte to bits 4 and 5.
      const uint32_t r =
          __funnelshift_l(hb[k], hb[k], uint32_t(4 - 2 * c) & 31);
      const uint32_t w5 = (q[k] & 0x0F0F0F0Fu) | (r & 0x10101010u);
      const uint32_t u5 =
          ((q[k] >> 4) & 0x0F0F0F0Fu) | ((r >> 1) & 0x10101010u);
      l = fmaKeep(__uint_as_float(w5 & 0x1Fu), xl[0], l);
      u = fmaKeep(__uint_as_float(u5 & 0x1Fu), xh[0], u);
      l = fmaKeep(__uint_as_float(w5 & 0x1F00u), xl[1], l);
      u = fmaKeep(__uint_as_float(u5 & 0x1F00u), xh[1], u);
      l = fmaKeep(__uint_as_float(w5 & 0x1F0000u), xl[2], l);
      u = fmaKeep(__uint_as_float(u5 & 0x1F0000u), xh[2], u);
      l = fmaKeep(__uint_as_float(w5 >> 24), xl[3], l);
      u = fmaKeep(__uint_as_float(u5 >> 24), xh[3], u);
    } else {
      const uint32_t w = q[k];
      l = fmaKeep(__uint_as_float(w & 0xFu), xl[0], l);
      u = fmaKeep(__uint_as_float(w & 0xF0u), xh[0], u);
      l = fmaKeep(__uint_as_float(w & 0xF00u), xl[1], l);
      u = fmaKeep(__uint_as_float(w & 0xF000u), xh[1], u);
      l = fmaKeep(__uint_as_float(w & 0xF0000u), xl[2], l);
      u = fmaKeep(__uint_as_float(w & 0xF00000u), xh[2], u);
      const float hi3 = __uint_as_float(w >> 28);
      const float lo3 = fmaKeep(-16.f, hi3, __uint_as_float(w >> 24));
      l = fmaKeep(lo3, xl[3], l);
      u = fmaKeep(hi3, xh[3], u);
    }
  }
  const float dots = fmaf(dl0, lo[0] + lo[1], dl1 * (hi[0] + hi[1]));
  const float mins = fmaf(ml0, s.sumLo, ml1 * s.sumHi);
  return fmaf(dots * s.backA, s.backB, -mins);
}

//===----------------------------------------------------------------------===//
// Int8 x (KILN_CUDA_EXPERTS_INT8_X=1, a timing probe; StepMatVec.cu). The
// lane of dotK45Rows' layout holds its 16 lo and 16 hi x values rounded to
// an int8 grid, each group of 16 with its own scale (int8Scale), packed
// four to a word, so that a quant costs a quarter of a `dp4a` and its
// nibble's share of two integer ops instead of an integer op and a fused
// multiply-add. The row's dot is then exactly W . x' in real arithmetic, x'
// = d q the rounded input (int8RoundGroups, on the host too), rounded in
// f32 in another order than the CPU's.
//===----------------------------------------------------------------------===//

/// The scale of a group whose largest |x| is `amax`: amax / 127 (0 for an
/// all-zero group).
__host__ __device__ inline float int8Scale(float amax) { return amax / 127.f; }

/// What a group's values are multiplied by before rounding: 1 / d (0 for
/// d = 0). One division a group, then a multiply a value, the same IEEE
/// operations on the host and the device.
__host__ __device__ inline float int8Inverse(float d) {
  return d > 0.f ? 1.f / d : 0.f;
}

/// x's value on the grid whose inverse scale is `inv`, as an integer in
/// [-127, 127] (round to nearest, ties to even, as `rintf` on both sides).
__host__ __device__ inline int int8Round(float x, float inv) {
  return int(rintf(x * inv));
}

/// x rounded in place to x' = d q, group by group of `group` values (the
/// host's reference for the probe's kernels).
__host__ inline void int8RoundGroups(float *x, int64_t n, int group) {
  for (int64_t g = 0; g < n; g += group) {
    const int64_t end = g + group < n ? g + group : n;
    float amax = 0.f;
    for (int64_t i = g; i < end; ++i)
      amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    const float d = int8Scale(amax), inv = int8Inverse(d);
    for (int64_t i = g; i < end; ++i)
      x[i] = d * float(int8Round(x[i], inv));
  }
}

/// A lane's x share (K45X) on the int8 grid: words lo[k] / hi[k] hold
/// values 4 k .. 4 k + 3 of each group of 16, dLo / dHi their scales, and
/// sumLo / sumHi d times the sum of the group's integers.
struct K45Int8X {
  int lo[4], hi[4];
  float dLo, dHi;
  float sumLo, sumHi;
};

/// One group of 16 values rounded and packed; returns the scale.
__device__ __forceinline__ float int8Group(const float4 (&v)[4], int (&q)[4],
                                           float &sum) {
  float amax = 0.f;
#pragma unroll
  for (int k = 0; k < 4; ++k)
    amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v[k].x), fabsf(v[k].y)),
                             fmaxf(fabsf(v[k].z), fabsf(v[k].w))));
  const float d = int8Scale(amax), inv = int8Inverse(d);
  int total = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int a = int8Round(v[k].x, inv), b = int8Round(v[k].y, inv),
              c = int8Round(v[k].z, inv), e = int8Round(v[k].w, inv);
    total += (a + b) + (c + e);
    q[k] = int(__byte_perm(__byte_perm(uint32_t(a), uint32_t(b), 0x0040u),
                           __byte_perm(uint32_t(c), uint32_t(e), 0x0040u),
                           0x5410u));
  }
  sum = d * float(total);
  return d;
}

/// Lane t's share (loadK45Values) rounded to the int8 grid.
__device__ inline void int8K45(const K45X &v, K45Int8X &s) {
  s.dLo = int8Group(v.lo, s.lo, s.sumLo);
  s.dHi = int8Group(v.hi, s.hi, s.sumHi);
}

/// k45PrescaledLane with the int8 x: the same scales and mins, the quants'
/// products summed exactly as integers by `dp4a`.
template <bool kHigh>
__device__ __forceinline__ float k45Int8Lane(uint4 head, uint4 qs, uint4 qh,
                                             int t, const K45Int8X &s) {
  const int c = t / 2;
  uint32_t sc, mn;
  scaleMinPairK(head, c, sc, mn);
  const float d = halfBits(head.x & 0xFFFFu), dmin = halfBits(head.x >> 16);
  const uint32_t q[4] = {qs.x, qs.y, qs.z, qs.w};
  const uint32_t hb[4] = {qh.x, qh.y, qh.z, qh.w};
  int lo = 0, hi = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    uint32_t w = q[k] & 0x0F0F0F0Fu, u = (q[k] >> 4) & 0x0F0F0F0Fu;
    if constexpr (kHigh) {
      // qh bits 2c and 2c + 1 of each byte to bits 4 and 5.
      const uint32_t r =
          __funnelshift_l(hb[k], hb[k], uint32_t(4 - 2 * c) & 31);
      w |= r & 0x10101010u;
      u |= (r >> 1) & 0x10101010u;
    }
    lo = __dp4a(int(w), s.lo[k], lo);
    hi = __dp4a(int(u), s.hi[k], hi);
  }
  const float dl0 = d * smallToFloat(sc & 0xFFu),
              dl1 = d * smallToFloat((sc >> 8) & 0xFFu);
  const float ml0 = dmin * smallToFloat(mn & 0xFFu),
              ml1 = dmin * smallToFloat((mn >> 8) & 0xFFu);
  const float dots =
      fmaf(dl0 * s.dLo, float(lo), (dl1 * s.dHi) * float(hi));
  return dots - fmaf(ml0, s.sumLo, ml1 * s.sumHi);
}

/// Sums each of a lane's N values over the 2 * O lanes that differ from it
/// in bits O, O / 2, ..., 1 (O a power of two, N <= 2 * O), leaving every
/// lane with one sum: value number ((lane & (2 O - 1)) >> s) of the N,
/// where s = log2(2 O / N) (the lane's bits below it hold copies). Each
/// halving step gives away the half the lane does not keep and adds the
/// partner's copy of the half it keeps, so N values cost N - 1 + log2(2 O
/// / N) shuffles instead of N log2(2 O); the order of every sum is fixed.
template <int N, int O>
__device__ __forceinline__ float spreadSums(const float (&v)[N], int lane) {
  if constexpr (N == 1) {
    float sum = v[0];
#pragma unroll
    for (int o = O; o > 0; o /= 2)
      sum += __shfl_xor_sync(0xffffffffu, sum, o);
    return sum;
  } else {
    const bool upperHalf = (lane & O) != 0;
    float kept[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const float give = upperHalf ? v[i] : v[i + N / 2];
      const float keep = upperHalf ? v[i + N / 2] : v[i];
      kept[i] = keep + __shfl_xor_sync(0xffffffffu, give, O);
    }
    return spreadSums<N / 2, O / 2>(kept, lane);
  }
}

} // namespace quantdot

} // namespace kiln::cuda

#endif // KILN_BACKENDS_CUDA_QUANTDOT_CUH
