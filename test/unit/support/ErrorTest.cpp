//===- ErrorTest.cpp - Errors as values and checked arithmetic -------------===//
#include "support/CheckedMath.h"
#include "support/Error.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

using namespace kiln;

TEST(Error, MessageJoinsNonEmptyParts) {
  EXPECT_EQ(Error("model.gguf", "blk.0.attn_q_a.weight", "offset past end")
                .message(),
            "model.gguf: blk.0.attn_q_a.weight: offset past end");
  EXPECT_EQ(Error("model.gguf", "", "bad magic").message(),
            "model.gguf: bad magic");
  EXPECT_EQ(Error("", "", "").message(), "unknown error");
}

TEST(Error, WithWhereKeepsFieldAndProblem) {
  Error e = Error("", "general.alignment", "not a power of two")
                .withWhere("part-00002-of-00003.gguf");
  EXPECT_EQ(e.message(),
            "part-00002-of-00003.gguf: general.alignment: not a power of two");
}

static Expected<int> half(int v) {
  if (v % 2)
    return Error("", "v", "odd");
  return v / 2;
}

TEST(Expected, HoldsValueOrError) {
  Expected<int> ok = half(8);
  ASSERT_TRUE(ok);
  EXPECT_EQ(*ok, 4);
  EXPECT_TRUE(ok.status().isOk());

  Expected<int> bad = half(7);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().problem(), "odd");
  EXPECT_FALSE(bad.status().isOk());
}

TEST(CheckedMath, DetectsOverflow) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(checkedAdd(1, 2), 3u);
  EXPECT_FALSE(checkedAdd(kMax, 1));
  EXPECT_EQ(checkedMul(1u << 20, 1u << 20), uint64_t(1) << 40);
  EXPECT_FALSE(checkedMul(uint64_t(1) << 32, uint64_t(1) << 32));
  EXPECT_EQ(checkedAlignUp(33, 32), 64u);
  EXPECT_EQ(checkedAlignUp(64, 32), 64u);
  EXPECT_FALSE(checkedAlignUp(kMax - 3, 32));
}
