//===- WhitespaceCapTest.cpp - A bound on a JSON reply's whitespace runs -===//
//
// The run of whitespace outside strings is bounded at the limit exactly
// (the limit-th byte taken, the next refused), a non-whitespace byte starts
// the count again, whitespace inside strings (escaped quotes included) is
// not counted, and the wrapped constraint still decides everything else;
// accepts agrees with push on seeded random pieces.
//
//===----------------------------------------------------------------------===//
#include "chat/WhitespaceCap.h"
#include "chat/JsonPrefix.h"

#include "support/Random.h"

#include <gtest/gtest.h>

#include <string>

using namespace kiln::chat;

namespace {

WhitespaceCap capped(uint32_t limit) {
  return WhitespaceCap(std::make_unique<JsonPrefix>(), limit);
}

TEST(WhitespaceCap, RunsOutsideStringsStopAtTheLimit) {
  WhitespaceCap c = capped(4);
  EXPECT_TRUE(c.push(" \n\t"));
  EXPECT_TRUE(c.accepts(" "));
  EXPECT_FALSE(c.accepts("  ")); // five in a row
  EXPECT_TRUE(c.push(" "));
  EXPECT_FALSE(c.accepts("\n"));
  EXPECT_FALSE(c.push("\r"));
  EXPECT_TRUE(c.push("{")); // the count starts again
  EXPECT_TRUE(c.push("    "));
  EXPECT_FALSE(c.accepts(" \"a\""));
  EXPECT_TRUE(c.accepts("\"a\""));
  // Inside a string whitespace is the string's: any amount, escaped quotes
  // too; after the string the count is back at zero.
  EXPECT_TRUE(c.push("\"   \\\"        \\\\"));
  EXPECT_TRUE(c.push("          \""));
  EXPECT_TRUE(c.push("    :"));
  EXPECT_FALSE(c.push("     1"));
  EXPECT_TRUE(c.push("    1    }"));
  EXPECT_TRUE(c.complete());
  EXPECT_TRUE(c.final());
}

TEST(WhitespaceCap, TheWrappedConstraintStillDecides) {
  WhitespaceCap c = capped(64);
  EXPECT_FALSE(c.accepts("x")); // not JSON
  EXPECT_FALSE(c.push("]"));
  EXPECT_TRUE(c.push("{\"k\": [1, 2]"));
  EXPECT_FALSE(c.complete());
  EXPECT_TRUE(c.push("}"));
  EXPECT_TRUE(c.complete());
}

TEST(WhitespaceCap, KeysTellRunsApart) {
  WhitespaceCap a = capped(8), b = capped(8);
  EXPECT_EQ(a.key(), b.key());
  ASSERT_TRUE(a.push("{ "));
  ASSERT_TRUE(b.push("{  "));
  EXPECT_NE(a.key(), b.key()); // they accept different runs
  ASSERT_TRUE(a.push(" "));
  EXPECT_EQ(a.key(), b.key());
  std::unique_ptr<ReplyConstraint> copy = a.clone();
  EXPECT_EQ(copy->key(), a.key());
  ASSERT_TRUE(copy->push("      "));
  EXPECT_FALSE(copy->accepts(" "));
  EXPECT_TRUE(a.accepts("      ")); // the original is untouched
}

TEST(WhitespaceCap, AcceptsAgreesWithPush) {
  const uint64_t seed = 20261205;
  SCOPED_TRACE("seed " + std::to_string(seed));
  kiln::Rng rng(seed);
  const std::string pieces[] = {" ", "\n  ", "   \t", "{", "}", "\"a b\"",
                                "\"", "\\", ":", ",", "[", "]", "1", "  \""};
  for (int round = 0; round < 300; ++round) {
    WhitespaceCap c = capped(1 + uint32_t(rng.below(9)));
    for (int i = 0; i < 40; ++i) {
      const std::string &p = pieces[rng.below(std::size(pieces))];
      const bool said = c.accepts(p);
      const std::string before = c.key();
      ASSERT_EQ(c.push(p), said) << round << " " << i;
      if (!said) {
        ASSERT_EQ(c.key(), before);
      }
    }
  }
}

} // namespace
