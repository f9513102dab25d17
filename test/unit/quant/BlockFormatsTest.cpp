//===- BlockFormatsTest.cpp - Hand-built blocks of every readable type ----===//
//
// Each test builds a block byte by byte from the layout in GLM5.md section 4
// (and ggml's block structs), with scales that are powers of two and small
// integers so every expected value is exact, and checks every output value.
// Bit-exactness on random blocks is test_quant_formats.py's job.
//
//===----------------------------------------------------------------------===//
#include "quant/QuantFormats.h"

#include <gtest/gtest.h>

#include <vector>

using namespace kiln;

namespace {

const int kIQ4[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                      1,    13,   25,  38,  53,  69,  89,  113};

std::vector<float> dequantOne(GGMLType type,
                              const std::vector<uint8_t> &block) {
  std::vector<float> out(traitsOf(type).blockSize);
  EXPECT_EQ(block.size(), traitsOf(type).blockBytes);
  Status s = dequantize(type, block, out);
  EXPECT_TRUE(s.isOk()) << (s ? "" : s.error().message());
  return out;
}

void putHalf(std::vector<uint8_t> &b, size_t at, uint16_t h) {
  b[at] = static_cast<uint8_t>(h);
  b[at + 1] = static_cast<uint8_t>(h >> 8);
}

constexpr uint16_t kQuarter = 0x3400, kHalf = 0x3800, kOne = 0x3C00,
                   kTwo = 0x4000, kThree = 0x4200, kMinusOne = 0xBC00;

/// 16 bytes whose low nibbles count up 0..15 and high nibbles down 15..0:
/// value l < 16 has level l, value 16 + l has level 15 - l.
void putNibbleRamp(std::vector<uint8_t> &b, size_t at) {
  for (int l = 0; l < 16; ++l)
    b[at + l] = static_cast<uint8_t>(l | (15 - l) << 4);
}
int rampLevel(int i) { return i < 16 ? i : 15 - (i - 16); }

} // namespace

TEST(BlockFormats, Q8_0) {
  std::vector<uint8_t> b(34);
  putHalf(b, 0, kHalf);
  for (int i = 0; i < 32; ++i)
    b[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(i - 16));
  std::vector<float> y = dequantOne(GGMLType::Q8_0, b);
  for (int i = 0; i < 32; ++i)
    EXPECT_EQ(y[i], 0.5f * (i - 16)) << i;
}

TEST(BlockFormats, Q4_0AndQ4_1) {
  std::vector<uint8_t> b(18);
  putHalf(b, 0, kTwo);
  putNibbleRamp(b, 2);
  std::vector<float> y = dequantOne(GGMLType::Q4_0, b);
  for (int i = 0; i < 32; ++i)
    EXPECT_EQ(y[i], 2.0f * (rampLevel(i) - 8)) << i;

  std::vector<uint8_t> b1(20);
  putHalf(b1, 0, kHalf);
  putHalf(b1, 2, kMinusOne);
  putNibbleRamp(b1, 4);
  y = dequantOne(GGMLType::Q4_1, b1);
  for (int i = 0; i < 32; ++i)
    EXPECT_EQ(y[i], 0.5f * rampLevel(i) - 1.0f) << i;
}

TEST(BlockFormats, Q5_0AndQ5_1) {
  // qh is a little-endian u32 with bit i the fifth bit of value i.
  std::vector<uint8_t> b(22);
  putHalf(b, 0, kOne);
  b[2] = b[3] = b[4] = b[5] = 0xF0; // values with i % 8 >= 4
  putNibbleRamp(b, 6);
  std::vector<float> y = dequantOne(GGMLType::Q5_0, b);
  for (int i = 0; i < 32; ++i)
    EXPECT_EQ(y[i], (rampLevel(i) | (i % 8 >= 4) << 4) - 16.0f) << i;

  std::vector<uint8_t> b1(24);
  putHalf(b1, 0, kQuarter);
  putHalf(b1, 2, kThree);
  b1[4] = b1[5] = 0xFF; // values 0..15
  putNibbleRamp(b1, 8);
  y = dequantOne(GGMLType::Q5_1, b1);
  for (int i = 0; i < 32; ++i)
    EXPECT_EQ(y[i], 0.25f * (rampLevel(i) | (i < 16) << 4) + 3.0f) << i;
}

TEST(BlockFormats, Q2_K) {
  // scales[k]: scale k in the low nibble, min 15 - k in the high nibble.
  // qs bytes 0xE4 hold levels 0, 1, 2, 3 at bits 0, 2, 4, 6, so value
  // 128c + 32s + l has level s.
  std::vector<uint8_t> b(84);
  for (int k = 0; k < 16; ++k)
    b[k] = static_cast<uint8_t>(k | (15 - k) << 4);
  for (int i = 0; i < 64; ++i)
    b[16 + i] = 0xE4;
  putHalf(b, 80, kHalf);
  putHalf(b, 82, kQuarter);
  std::vector<float> y = dequantOne(GGMLType::Q2_K, b);
  for (int i = 0; i < 256; ++i) {
    int k = i / 16, level = (i / 32) % 4;
    EXPECT_EQ(y[i], 0.5f * k * level - 0.25f * (15 - k)) << i;
  }
}

TEST(BlockFormats, Q3_K) {
  // hmask 0x55: the high bit (bit i/32 of hmask[i%32]) is set for even
  // i/32, and a set bit means no -4 offset. Scales: low nibble 1 for
  // sub-blocks 0-7, 2 for 8-15 (bytes 0x21); top bits k/4 (bytes 0xE4).
  std::vector<uint8_t> b(110);
  for (int l = 0; l < 32; ++l)
    b[l] = 0x55;
  for (int i = 0; i < 64; ++i)
    b[32 + i] = 0xE4;
  for (int k = 0; k < 8; ++k)
    b[96 + k] = 0x21;
  for (int k = 8; k < 12; ++k)
    b[96 + k] = 0xE4;
  putHalf(b, 108, kOne);
  std::vector<float> y = dequantOne(GGMLType::Q3_K, b);
  for (int i = 0; i < 256; ++i) {
    int k = i / 16;
    int scale = ((k < 8 ? 1 : 2) | (k / 4) << 4) - 32;
    int level = (i / 32) % 4 - ((i / 32) % 2 == 0 ? 0 : 4);
    EXPECT_EQ(y[i], static_cast<float>(scale * level)) << i;
  }
}

namespace {
// Q4_K/Q5_K packed scales, unpacked by hand with GLM5.md's rule:
//   j < 4:  scale = s[j] & 63, min = s[j+4] & 63
//   j >= 4: scale = (s[j+4] & 15) | (s[j-4] >> 6) << 4,
//           min = (s[j+4] >> 4) | (s[j] >> 6) << 4
const uint8_t kPackedScales[12] = {0xC1, 0x02, 0x43, 0x84, 0x40, 0x01,
                                   0xFF, 0x05, 0x21, 0x3F, 0x00, 0xA7};
const int kScales[8] = {1, 2, 3, 4, 1 | 3 << 4, 15, 0 | 1 << 4, 7 | 2 << 4};
const int kMins[8] = {0, 1, 63, 5, 2 | 1 << 4, 3, 0 | 3 << 4, 10};

/// Q4_K/Q5_K nibbles: byte l of chunk c holds value 64c + l (low) and
/// 64c + 32 + l (high); the ramp gives value 64c + l level l % 16 and value
/// 64c + 32 + l level 15 - l % 16.
void putK4Ramp(std::vector<uint8_t> &b, size_t at) {
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l)
      b[at + 32 * c + l] = static_cast<uint8_t>(l % 16 | (15 - l % 16) << 4);
}
int k4RampLevel(int i) { return (i % 64) < 32 ? i % 16 : 15 - i % 16; }
} // namespace

TEST(BlockFormats, Q4_KScaleMinUnpacking) {
  std::vector<uint8_t> b(144);
  putHalf(b, 0, kOne);
  putHalf(b, 2, kHalf);
  std::copy(kPackedScales, kPackedScales + 12, b.begin() + 4);
  putK4Ramp(b, 16);
  std::vector<float> y = dequantOne(GGMLType::Q4_K, b);
  for (int i = 0; i < 256; ++i) {
    int j = i / 32;
    EXPECT_EQ(y[i], 1.0f * kScales[j] * k4RampLevel(i) - 0.5f * kMins[j])
        << "value " << i << " sub-block " << j;
  }
}

TEST(BlockFormats, Q5_K) {
  // qh[l] = l: the fifth bit of value 32j + l is bit j of l.
  std::vector<uint8_t> b(176);
  putHalf(b, 0, kHalf);
  putHalf(b, 2, kTwo);
  std::copy(kPackedScales, kPackedScales + 12, b.begin() + 4);
  for (int l = 0; l < 32; ++l)
    b[16 + l] = static_cast<uint8_t>(l);
  putK4Ramp(b, 48);
  std::vector<float> y = dequantOne(GGMLType::Q5_K, b);
  for (int i = 0; i < 256; ++i) {
    int j = i / 32, l = i % 32;
    int level = k4RampLevel(i) | ((l >> j) & 1) << 4;
    EXPECT_EQ(y[i], 0.5f * kScales[j] * level - 2.0f * kMins[j]) << i;
  }
}

TEST(BlockFormats, Q6_K) {
  // ql[64c + m]: low nibble is value 128c + m, high nibble value
  // 128c + 64 + m. qh[32c + l] bits 2s..2s+1: top bits of value
  // 128c + 32s + l (0xE4 gives s). Scales int8 k - 8.
  std::vector<uint8_t> b(210);
  for (int c = 0; c < 2; ++c)
    for (int m = 0; m < 64; ++m)
      b[64 * c + m] = static_cast<uint8_t>(m % 16 | (15 - m % 16) << 4);
  for (int i = 0; i < 64; ++i)
    b[128 + i] = 0xE4;
  for (int k = 0; k < 16; ++k)
    b[192 + k] = static_cast<uint8_t>(static_cast<int8_t>(k - 8));
  putHalf(b, 208, kHalf);
  std::vector<float> y = dequantOne(GGMLType::Q6_K, b);
  for (int i = 0; i < 256; ++i) {
    int r = i % 128;
    int low = r < 64 ? r % 16 : 15 - r % 16;
    int level = (low | (r / 32) << 4) - 32;
    EXPECT_EQ(y[i], 0.5f * (i / 16 - 8) * level) << i;
  }
}

TEST(BlockFormats, IQ4_NLAndIQ4_XS) {
  std::vector<uint8_t> b(18);
  putHalf(b, 0, kHalf);
  putNibbleRamp(b, 2);
  std::vector<float> y = dequantOne(GGMLType::IQ4_NL, b);
  for (int i = 0; i < 32; ++i)
    EXPECT_EQ(y[i], 0.5f * kIQ4[rampLevel(i)]) << i;

  // Sub-block j: low scale bits j (nibble j % 2 of scales_l[j / 2]), high
  // bits j % 4 (bits 2j of scales_h = 0xE4E4); scale biased by 32.
  std::vector<uint8_t> x(136);
  putHalf(x, 0, kQuarter);
  putHalf(x, 2, 0xE4E4);
  const uint8_t low[4] = {0x10, 0x32, 0x54, 0x76};
  std::copy(low, low + 4, x.begin() + 4);
  for (int j = 0; j < 8; ++j)
    putNibbleRamp(x, 8 + 16 * j);
  y = dequantOne(GGMLType::IQ4_XS, x);
  for (int i = 0; i < 256; ++i) {
    int j = i / 32;
    int scale = (j | (j % 4) << 4) - 32;
    EXPECT_EQ(y[i], 0.25f * scale * kIQ4[rampLevel(i % 32)]) << i;
  }
}

TEST(BlockFormats, PlainFloats) {
  std::vector<uint8_t> f32 = {0x00, 0x00, 0xC0, 0xBF}; // -1.5f
  EXPECT_EQ(dequantOne(GGMLType::F32, f32)[0], -1.5f);
  std::vector<uint8_t> f16 = {0x00, 0x3E}; // 1.5
  EXPECT_EQ(dequantOne(GGMLType::F16, f16)[0], 1.5f);
  std::vector<uint8_t> bf16 = {0xC0, 0x3F}; // 1.5
  EXPECT_EQ(dequantOne(GGMLType::BF16, bf16)[0], 1.5f);
}
