//===- QuantTypesTest.cpp - The ggml type table ----------------------------===//
#include "quant/QuantTypes.h"

#include <gtest/gtest.h>

using namespace kiln;

TEST(QuantTypes, KnownGeometry) {
  // The formats GLM-5 quantisations use (GLM5.md section 4).
  struct Row {
    GGMLType type;
    uint32_t block, bytes;
  } rows[] = {{GGMLType::Q8_0, 32, 34},   {GGMLType::Q4_K, 256, 144},
              {GGMLType::Q5_K, 256, 176}, {GGMLType::Q6_K, 256, 210},
              {GGMLType::IQ4_XS, 256, 136}, {GGMLType::BF16, 1, 2}};
  for (const Row &r : rows) {
    SCOPED_TRACE(std::string(nameOf(r.type)));
    EXPECT_EQ(traitsOf(r.type).blockSize, r.block);
    EXPECT_EQ(traitsOf(r.type).blockBytes, r.bytes);
  }
}

TEST(QuantTypes, RetiredAndUnknownIdsAreRejected) {
  EXPECT_FALSE(lookupGGMLType(4));  // Q4_2, retired
  EXPECT_FALSE(lookupGGMLType(31)); // Q4_0_4_4, retired
  EXPECT_FALSE(lookupGGMLType(1000));
  ASSERT_TRUE(lookupGGMLType(12));
  EXPECT_EQ(lookupGGMLType(12)->type, GGMLType::Q4_K);
}

TEST(QuantTypes, ParseIsCaseInsensitive) {
  EXPECT_EQ(parseGGMLType("q4_k"), GGMLType::Q4_K);
  EXPECT_EQ(parseGGMLType("IQ4_XS"), GGMLType::IQ4_XS);
  EXPECT_FALSE(parseGGMLType("q4_kk"));
  EXPECT_FALSE(parseGGMLType(""));
}

TEST(QuantTypes, RowBytesNeedsWholeBlocks) {
  EXPECT_EQ(rowBytes(GGMLType::Q4_K, 6144), uint64_t(6144 / 256 * 144));
  EXPECT_FALSE(rowBytes(GGMLType::Q4_K, 192)); // attn_k_b rows: never K-quant
  EXPECT_EQ(rowBytes(GGMLType::Q8_0, 192), uint64_t(6 * 34));
}
