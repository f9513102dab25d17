//===- FloatFormats.cpp - fp16/bf16 conversion, plain float types ---------===//
#include "quant/FloatFormats.h"

#include "quant/BlockCodecs.h"

#include <cstring>

namespace kiln {

uint32_t floatBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

float floatFromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

float halfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0x1f) // Infinity or NaN: payload moves to the top of the float.
    return floatFromBits(sign | 0x7f800000 | (mant << 13));
  if (exp == 0) {
    if (mant == 0)
      return floatFromBits(sign);
    // Subnormal half: every one is a normal float. Shift the leading one up
    // to the implicit bit position, lowering the exponent as we go.
    int32_t e = -14;
    while (!(mant & 0x400)) {
      mant <<= 1;
      --e;
    }
    mant &= 0x3ff;
    return floatFromBits(sign | static_cast<uint32_t>(e + 127) << 23 |
                         mant << 13);
  }
  return floatFromBits(sign | (exp - 15 + 127) << 23 | mant << 13);
}

uint16_t floatToHalf(float f) {
  uint32_t bits = floatBits(f);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  uint32_t exp = (bits >> 23) & 0xff;
  uint32_t mant = bits & 0x7fffff;
  if (exp == 0xff) {
    if (mant == 0)
      return sign | 0x7c00;
    uint16_t payload = static_cast<uint16_t>(mant >> 13);
    return sign | 0x7c00 | (payload ? payload : 1);
  }
  // Zero and float subnormals (< 2^-126) are far below half's smallest
  // subnormal (2^-24), so they round to a signed zero.
  if (exp == 0)
    return sign;
  int32_t e = static_cast<int32_t>(exp) - 127;
  if (e > 15)
    return sign | 0x7c00;
  if (e >= -14) {
    // Normal half: keep the top 10 mantissa bits, round the 13 dropped ones
    // to nearest even. A carry out of the mantissa correctly bumps the
    // exponent (and may give infinity).
    uint32_t result = static_cast<uint32_t>(e + 15) << 10 | mant >> 13;
    uint32_t rest = mant & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (result & 1)))
      ++result;
    return static_cast<uint16_t>(sign | result);
  }
  // Subnormal half: the value in units of 2^-24 is sig * 2^(e + 1), with sig
  // the 24-bit significand; shift right by -(e + 1) >= 14 and round to
  // nearest even. Past a shift of 24 the value is below 2^-25, half the
  // smallest subnormal, and rounds to zero.
  uint32_t sig = mant | 0x800000;
  uint32_t shift = static_cast<uint32_t>(-(e + 1));
  if (shift > 24)
    return sign;
  uint32_t result = sig >> shift;
  uint32_t rest = sig & ((1u << shift) - 1);
  uint32_t halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (result & 1)))
    ++result; // 0x3ff + 1 = 0x400 is the smallest normal: still right.
  return static_cast<uint16_t>(sign | result);
}

float bf16ToFloat(uint16_t b) {
  return floatFromBits(static_cast<uint32_t>(b) << 16);
}

uint16_t floatToBf16(float f) {
  uint32_t bits = floatBits(f);
  if ((bits & 0x7fffffff) > 0x7f800000) // NaN: keep it NaN, make it quiet.
    return static_cast<uint16_t>(((bits & 0xffff0000) | 0x00400000) >> 16);
  // Round to nearest even on the 16 dropped bits; 64-bit so no wrap.
  uint64_t rounded = static_cast<uint64_t>(bits) + 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(rounded >> 16);
}

namespace codecs {

void dequantF32(const uint8_t *block, float *out) {
  *out = floatFromBits(loadU32(block));
}
void quantF32(const float *in, uint8_t *block) {
  storeU32(block, floatBits(*in));
}

void dequantF16(const uint8_t *block, float *out) {
  *out = halfToFloat(loadU16(block));
}
void quantF16(const float *in, uint8_t *block) {
  storeU16(block, floatToHalf(*in));
}

void dequantBF16(const uint8_t *block, float *out) {
  *out = bf16ToFloat(loadU16(block));
}
void quantBF16(const float *in, uint8_t *block) {
  storeU16(block, floatToBf16(*in));
}

} // namespace codecs
} // namespace kiln
