//===- FloatFormatsTest.cpp - Exact fp16 and bf16 conversions -------------===//
#include "quant/FloatFormats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

using namespace kiln;

namespace {
uint32_t bitsOf(float f) { return floatBits(f); }
} // namespace

TEST(FloatFormats, HalfToFloatSpecialValues) {
  EXPECT_EQ(bitsOf(halfToFloat(0x0000)), 0x00000000u);
  EXPECT_EQ(bitsOf(halfToFloat(0x8000)), 0x80000000u); // -0 keeps its sign
  EXPECT_EQ(halfToFloat(0x3C00), 1.0f);
  EXPECT_EQ(halfToFloat(0xC000), -2.0f);
  EXPECT_EQ(halfToFloat(0x7BFF), 65504.0f);              // largest finite
  EXPECT_EQ(halfToFloat(0x0400), std::ldexp(1.0f, -14)); // smallest normal
  EXPECT_EQ(halfToFloat(0x0001), std::ldexp(1.0f, -24)); // smallest subnormal
  EXPECT_EQ(halfToFloat(0x03FF), std::ldexp(1023.0f, -24)); // largest subnormal
  EXPECT_EQ(halfToFloat(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(halfToFloat(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(halfToFloat(0xFC00), -std::numeric_limits<float>::infinity());
  // NaNs keep sign and payload, quiet bit unchanged (as numpy).
  EXPECT_EQ(bitsOf(halfToFloat(0x7C01)), 0x7F802000u);
  EXPECT_EQ(bitsOf(halfToFloat(0x7E00)), 0x7FC00000u);
  EXPECT_EQ(bitsOf(halfToFloat(0xFD55)), 0xFFAAA000u);
}

TEST(FloatFormats, FloatToHalfRoundsToNearestEven) {
  EXPECT_EQ(floatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(floatToHalf(-0.0f), 0x8000);
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties go to even (1).
  EXPECT_EQ(floatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  // 1 + 3 * 2^-11 is halfway between odd 0x3C01 and even 0x3C02.
  EXPECT_EQ(floatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  // Just above a tie rounds up.
  EXPECT_EQ(floatToHalf(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)),
            0x3C01);
  EXPECT_EQ(floatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(floatToHalf(65519.0f), 0x7BFF); // below the tie with 65536
  EXPECT_EQ(floatToHalf(65520.0f), 0x7C00); // the tie rounds to "even" inf
  EXPECT_EQ(floatToHalf(1e30f), 0x7C00);
  EXPECT_EQ(floatToHalf(-1e30f), 0xFC00);
}

TEST(FloatFormats, FloatToHalfSubnormals) {
  float tiny = std::ldexp(1.0f, -24);
  EXPECT_EQ(floatToHalf(tiny), 0x0001);
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -25)), 0x0000); // tie to even zero
  EXPECT_EQ(floatToHalf(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(floatToHalf(1.5f * tiny), 0x0002); // tie: 1 is odd, 2 even
  EXPECT_EQ(floatToHalf(2.5f * tiny), 0x0002); // tie: 2 is even
  EXPECT_EQ(floatToHalf(-3.0f * tiny), 0x8003);
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -30)), 0x0000);
  EXPECT_EQ(floatToHalf(-std::ldexp(1.0f, -30)), 0x8000);
  EXPECT_EQ(floatToHalf(std::numeric_limits<float>::denorm_min()), 0x0000);
  // Largest subnormal plus a bit more than half a step carries into the
  // smallest normal.
  EXPECT_EQ(floatToHalf(1023.75f * tiny), 0x0400);
}

TEST(FloatFormats, FloatToHalfNaN) {
  EXPECT_EQ(floatToHalf(floatFromBits(0x7FC00000)), 0x7E00);
  EXPECT_EQ(floatToHalf(floatFromBits(0xFFC00000)), 0xFE00);
  // A payload only in the low 13 bits would vanish: it stays a NaN.
  EXPECT_EQ(floatToHalf(floatFromBits(0x7F800001)), 0x7C01);
}

TEST(FloatFormats, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    uint16_t back = floatToHalf(halfToFloat(static_cast<uint16_t>(h)));
    ASSERT_EQ(back, h) << "half " << std::hex << h;
  }
}

TEST(FloatFormats, Bf16) {
  EXPECT_EQ(bf16ToFloat(0x3F80), 1.0f);
  EXPECT_EQ(bitsOf(bf16ToFloat(0x8000)), 0x80000000u);
  EXPECT_EQ(floatToBf16(1.0f), 0x3F80);
  // Ties to even on the 16 dropped bits.
  EXPECT_EQ(floatToBf16(floatFromBits(0x3F808000)), 0x3F80);
  EXPECT_EQ(floatToBf16(floatFromBits(0x3F818000)), 0x3F82);
  EXPECT_EQ(floatToBf16(floatFromBits(0x3F808001)), 0x3F81);
  // The largest finite float rounds up to infinity, as IEEE says.
  EXPECT_EQ(floatToBf16(floatFromBits(0x7F7FFFFF)), 0x7F80);
  EXPECT_EQ(floatToBf16(std::numeric_limits<float>::infinity()), 0x7F80);
  // NaNs are made quiet so the truncation cannot yield infinity.
  EXPECT_EQ(floatToBf16(floatFromBits(0x7F800001)), 0x7FC0);
  EXPECT_EQ(floatToBf16(floatFromBits(0xFF812345)), 0xFFC1);
  for (uint32_t b = 0; b < 0x10000; ++b) {
    float f = bf16ToFloat(static_cast<uint16_t>(b));
    if (std::isnan(f))
      continue;
    ASSERT_EQ(floatToBf16(f), b) << "bf16 " << std::hex << b;
  }
}
