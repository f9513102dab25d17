//===- SplitLayoutTest.cpp - The split layouts keep every byte ------------===//
//
// The host reference repack of each split layout (backends/cuda/
// SplitLayout.h) is a permutation of the file's bytes: its planes cover
// every byte of a block once, and unpacking random blocks gives them back.
// The device repack is compared with the file's blocks by kiln-cuda-ops on
// a GPU; this checks the tables and the reference it relies on. The random
// case prints its seed.
//
//===----------------------------------------------------------------------===//
#include "cuda/SplitLayout.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <iterator>
#include <random>
#include <vector>

using namespace kiln;
using namespace kiln::cuda;

namespace {

TEST(SplitLayout, PlanesCoverEveryByteOfABlockOnce) {
  for (const SplitFormat &f : kSplitFormats) {
    SCOPED_TRACE(f.name);
    EXPECT_EQ(f.blockValues, traitsOf(f.type).blockSize);
    EXPECT_EQ(f.blockBytes, traitsOf(f.type).blockBytes);
    ASSERT_GE(f.planes, 1);
    ASSERT_LE(f.planes, kMaxSplitPlanes);
    std::vector<int> covered(f.blockBytes, 0);
    for (int p = 0; p < f.planes; ++p) {
      ASSERT_LE(f.plane[p].offset + f.plane[p].bytes, f.blockBytes);
      for (uint32_t k = 0; k < f.plane[p].bytes; ++k)
        ++covered[f.plane[p].offset + k];
    }
    for (uint32_t k = 0; k < f.blockBytes; ++k)
      EXPECT_EQ(covered[k], 1) << "byte " << k;
  }
}

TEST(SplitLayout, NamesAndTypesFindTheirFormat) {
  const std::pair<const char *, GGMLType> expected[] = {
      {"q8_0-split", GGMLType::Q8_0},     {"q4_k-split", GGMLType::Q4_K},
      {"q5_k-split", GGMLType::Q5_K},     {"q6_k-split", GGMLType::Q6_K},
      {"iq4_xs-split", GGMLType::IQ4_XS}, {"iq4_nl-split", GGMLType::IQ4_NL},
      {"q5_0-split", GGMLType::Q5_0},     {"q5_1-split", GGMLType::Q5_1}};
  for (const auto &[name, type] : expected) {
    const SplitFormat *byName = splitFormatNamed(name);
    ASSERT_NE(byName, nullptr) << name;
    EXPECT_EQ(byName->type, type);
    EXPECT_EQ(splitFormatOf(type), byName);
  }
  EXPECT_EQ(splitFormatNamed("gguf"), nullptr);
  EXPECT_EQ(splitFormatNamed("q4_k"), nullptr);
  EXPECT_EQ(std::size(kSplitFormats), std::size(expected));
  EXPECT_EQ(splitFormatOf(GGMLType::Q4_0), nullptr);
  EXPECT_EQ(splitFormatOf(GGMLType::F32), nullptr);
}

/// The kernels read a block's piece of a plane with one load: a piece of
/// 16 bytes or more is whole 16-byte loads, a smaller one a power of two,
/// so piece b (at b * bytes from a 256-aligned start) is aligned to its
/// load, whichever block a fused run's part starts with.
TEST(SplitLayout, EveryPieceIsAlignedToItsLoad) {
  for (const SplitFormat &f : kSplitFormats)
    for (int p = 0; p < f.planes; ++p) {
      SCOPED_TRACE(f.name);
      const uint32_t bytes = f.plane[p].bytes;
      EXPECT_TRUE(bytes % 16 == 0 || (bytes < 16 && (bytes & (bytes - 1)) == 0))
          << "plane " << p << ": " << bytes << " bytes";
    }
  // The quant plane (plane 0) of every layout is whole 16-byte loads.
  for (const SplitFormat &f : kSplitFormats)
    EXPECT_EQ(f.plane[0].bytes % 16, 0u) << f.name;
}

TEST(SplitLayout, PlaneStartsAreAlignedAndDisjoint) {
  for (const SplitFormat &f : kSplitFormats)
    for (uint64_t blocks : {uint64_t(1), uint64_t(7), uint64_t(24 * 2048)}) {
      SCOPED_TRACE(f.name);
      for (int p = 0; p < f.planes; ++p) {
        const uint64_t start = splitPlaneStart(f, p, blocks);
        EXPECT_EQ(start % kSplitPlaneAlign, 0u);
        EXPECT_GE(splitPlaneStart(f, p + 1, blocks),
                  start + splitPlaneBytes(f, p, blocks));
      }
      EXPECT_LT(splitPlaneStart(f, f.planes, blocks),
                blocks * f.blockBytes + f.planes * kSplitPlaneAlign);
    }
}

/// Random blocks (every byte uniform: the permutation does not care what
/// the bytes mean) repacked into one allocation as the plugin places them,
/// then unpacked: every byte comes back, and each plane holds its field.
TEST(SplitLayout, RandomBlocksRoundTrip) {
  const uint32_t seed = 20261201;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  for (const SplitFormat &f : kSplitFormats) {
    SCOPED_TRACE(f.name);
    // Rows x blocks a row: one block, a GLM-5 tp=8 row (6144 values), odd.
    for (const auto &[rows, perRow] : {std::pair<uint64_t, uint64_t>{1, 1},
                                       {5, 6144 / f.blockValues},
                                       {3, 7}}) {
      const uint64_t count = rows * perRow;
      std::vector<uint8_t> blocks(count * f.blockBytes);
      for (uint8_t &b : blocks)
        b = uint8_t(rng() & 0xFF);
      std::vector<uint8_t> memory(splitPlaneStart(f, f.planes, count), 0);
      uint8_t *planes[kMaxSplitPlanes] = {};
      for (int p = 0; p < f.planes; ++p)
        planes[p] = memory.data() + splitPlaneStart(f, p, count);
      repackSplitHost(f, blocks.data(), count, planes);

      // Block b's field p is at planes[p] + b * bytes.
      const uint64_t b = count / 2;
      for (int p = 0; p < f.planes; ++p)
        for (uint32_t k = 0; k < f.plane[p].bytes; ++k)
          ASSERT_EQ(planes[p][b * f.plane[p].bytes + k],
                    blocks[b * f.blockBytes + f.plane[p].offset + k])
              << "plane " << p << " byte " << k;

      std::vector<uint8_t> back(blocks.size(), 0);
      unpackSplitHost(f, planes, count, back.data());
      uint64_t mismatches = 0;
      for (size_t i = 0; i < back.size(); ++i)
        mismatches += back[i] != blocks[i];
      EXPECT_EQ(mismatches, 0u) << rows << " rows of " << perRow << " blocks";
    }
  }
}

} // namespace
