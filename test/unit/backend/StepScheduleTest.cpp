//===- StepScheduleTest.cpp - The step's dataflow schedule ----------------===//
//
// Every pair of conflicting ops must stay ordered; independent ops should
// not be. The random cases print their seed.
//
//===----------------------------------------------------------------------===//
#include "common/StepSchedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

using namespace kiln::backend;

namespace {

OpFootprint touch(std::initializer_list<MemoryRange> ranges,
                  bool ordered = false) {
  return {ranges, ordered};
}
MemoryRange reads(uint64_t b, uint64_t e) { return {b, e, false}; }
MemoryRange writes(uint64_t b, uint64_t e) { return {b, e, true}; }

/// Every conflicting pair ordered; every wait names an earlier op on
/// another branch that signals. `skip`: the ops scheduleOnBranches left
/// out (nobody's predecessor).
void expectValid(const std::vector<OpFootprint> &ops, const StepSchedule &s,
                 const std::vector<bool> &skip = {}) {
  ASSERT_EQ(s.branch.size(), ops.size());
  for (size_t j = 0; j < ops.size(); ++j) {
    ASSERT_GE(s.branch[j], 0);
    ASSERT_LT(s.branch[j], s.branches);
    for (int32_t d : s.waits[j]) {
      EXPECT_LT(size_t(d), j);
      EXPECT_NE(s.branch[size_t(d)], s.branch[j]);
      EXPECT_TRUE(s.signals[size_t(d)]);
    }
    for (size_t i = 0; i < j; ++i) {
      if (conflicts(ops[i], ops[j])) {
        EXPECT_TRUE(scheduleOrders(s, int32_t(i), int32_t(j)))
            << "ops " << i << " and " << j << " conflict but run unordered";
      }
    }
    // Where the waits suffice, they order every conflicting op and the
    // branch's previous op without the edge from that op.
    ASSERT_EQ(s.waitsSuffice.size(), ops.size());
    if (!s.waitsSuffice[j])
      continue;
    EXPECT_FALSE(s.waits[j].empty()) << "op " << j;
    int32_t previous = -1;
    for (size_t i = 0; i < j; ++i)
      if (s.branch[i] == s.branch[j] && !(i < skip.size() && skip[i]))
        previous = int32_t(i);
    auto byWaits = [&](int32_t i) {
      for (int32_t w : s.waits[j])
        if (w == i || scheduleOrders(s, i, w))
          return true;
      return false;
    };
    EXPECT_GE(previous, 0) << "op " << j;
    EXPECT_TRUE(byWaits(previous)) << "op " << j << " after " << previous;
    for (size_t i = 0; i < j; ++i) {
      if (conflicts(ops[i], ops[j])) {
        EXPECT_TRUE(byWaits(int32_t(i))) << "op " << j << " after " << i;
      }
    }
  }
}

TEST(StepSchedule, ChainStaysOnOneBranch) {
  std::vector<OpFootprint> ops = {touch({writes(0, 8)}),
                                  touch({reads(0, 8), writes(8, 16)}),
                                  touch({reads(8, 16), writes(16, 24)})};
  StepSchedule s = scheduleStep(ops, 4);
  expectValid(ops, s);
  EXPECT_EQ(s.branches, 1);
  for (const auto &w : s.waits)
    EXPECT_TRUE(w.empty());
}

TEST(StepSchedule, IndependentOpsOverlap) {
  std::vector<OpFootprint> ops;
  for (uint64_t i = 0; i < 4; ++i)
    ops.push_back(touch({reads(1000, 1100), writes(i * 10, i * 10 + 10)}));
  StepSchedule s = scheduleStep(ops, 4);
  expectValid(ops, s);
  EXPECT_EQ(s.branches, 4);
  for (int32_t i = 0; i < 4; ++i)
    for (int32_t j = i + 1; j < 4; ++j)
      EXPECT_FALSE(scheduleOrders(s, i, j));
  // With two branches the four still run correctly, two by two.
  StepSchedule two = scheduleStep(ops, 2);
  expectValid(ops, two);
  EXPECT_EQ(two.branches, 2);
}

TEST(StepSchedule, DiamondJoins) {
  // a writes X; b and c read X and write Y and Z; d reads Y and Z.
  std::vector<OpFootprint> ops = {
      touch({writes(0, 4)}), touch({reads(0, 4), writes(4, 8)}),
      touch({reads(0, 4), writes(8, 12)}),
      touch({reads(4, 8), reads(8, 12), writes(12, 16)})};
  StepSchedule s = scheduleStep(ops, 4);
  expectValid(ops, s);
  EXPECT_FALSE(scheduleOrders(s, 1, 2)) << "b and c are independent";
  EXPECT_NE(s.branch[1], s.branch[2]);
  EXPECT_EQ(s.waits[3].size(), 1u) << "d follows one of b, c and waits for "
                                      "the other";
}

TEST(StepSchedule, WriteAfterReadIsOrdered) {
  // b overwrites what a reads (an arena buffer reused): b after a.
  std::vector<OpFootprint> ops = {touch({reads(0, 8), writes(100, 108)}),
                                  touch({writes(4, 6)})};
  StepSchedule s = scheduleStep(ops, 4);
  expectValid(ops, s);
  EXPECT_TRUE(scheduleOrders(s, 0, 1));
}

TEST(StepSchedule, OrderedOpsKeepListOrder) {
  // Collectives on disjoint memory still run in list order.
  std::vector<OpFootprint> ops = {touch({writes(0, 8)}, true),
                                  touch({writes(100, 108)}),
                                  touch({writes(200, 208)}, true)};
  StepSchedule s = scheduleStep(ops, 4);
  expectValid(ops, s);
  EXPECT_TRUE(scheduleOrders(s, 0, 2));
  EXPECT_FALSE(scheduleOrders(s, 0, 1));
}

/// An op marked light, as OpFootprint::light.
OpFootprint light(OpFootprint op) {
  op.light = true;
  return op;
}

TEST(StepSchedule, LightOpLeavesItsDependencysBranchToALaterMatVec) {
  // GLM-5's q_b (0) is read by its rope (1, light) and attn_k_b (3); the
  // cache row (2, light) is independent; MLA (4) reads all three.
  std::vector<OpFootprint> ops = {
      touch({writes(0, 8)}), light(touch({reads(0, 8), writes(8, 12)})),
      light(touch({reads(100, 104), writes(104, 108)})),
      touch({reads(0, 8), writes(12, 16)}),
      touch({reads(8, 16), reads(104, 108), writes(16, 20)})};
  StepSchedule s = scheduleStep(ops, 4);
  expectValid(ops, s);
  // attn_k_b follows q_b on its branch, waiting for nothing; the rope
  // waits for q_b on another.
  EXPECT_EQ(s.branch[3], s.branch[0]);
  EXPECT_TRUE(s.waits[3].empty());
  EXPECT_NE(s.branch[1], s.branch[0]);
  EXPECT_EQ(s.waits[1], std::vector<int32_t>{0});
  // The rope starts its branch, so there is no edge to leave out; MLA
  // needs attn_k_b before it on its branch.
  EXPECT_FALSE(s.waitsSuffice[1]);
  EXPECT_FALSE(s.waitsSuffice[4]);
  // Not light, the rope takes q_b's branch (list order) and attn_k_b
  // waits for q_b.
  ops[1].light = false;
  StepSchedule plain = scheduleStep(ops, 4);
  expectValid(ops, plain);
  EXPECT_EQ(plain.branch[1], plain.branch[0]);
  EXPECT_EQ(plain.waits[3], std::vector<int32_t>{0});
}

TEST(StepSchedule, WaitsSufficeWhereTheBranchsLastOpIsTheirAncestor) {
  // Two layers of: a (0) writes X; b (1) reads X, writes Y; c (2) reads X,
  // writes Z; d (3) reads Y and Z, writes W (which the next layer's a
  // reads). On two branches c waits for a on the second, whose previous
  // op (the last layer's c) is an ancestor of a: its edge can go.
  std::vector<OpFootprint> layer = {touch({reads(12, 16), writes(0, 4)}),
                                    touch({reads(0, 4), writes(4, 8)}),
                                    touch({reads(0, 4), writes(8, 12)}),
                                    touch({reads(4, 12), writes(12, 16)})};
  std::vector<OpFootprint> ops = layer;
  ops.insert(ops.end(), layer.begin(), layer.end());
  StepSchedule s = scheduleStep(ops, 2);
  expectValid(ops, s);
  EXPECT_NE(s.branch[6], s.branch[4]);
  EXPECT_EQ(s.waits[6], std::vector<int32_t>{4});
  EXPECT_TRUE(s.waitsSuffice[6]);
  EXPECT_FALSE(s.waitsSuffice[2]); // its branch starts with it
  // d (7) follows b (5) on its branch and waits for c (6): both needed.
  EXPECT_FALSE(s.waitsSuffice[7]);
}

TEST(StepSchedule, LightOpKeepsTheBranchWhereTheLaterOpNeedsIt) {
  // The later op reads the light op's output: it follows the light op, so
  // the chain stays on one branch.
  std::vector<OpFootprint> ops = {touch({writes(0, 8)}),
                                  light(touch({reads(0, 8), writes(8, 12)})),
                                  touch({reads(0, 12), writes(12, 16)})};
  StepSchedule s = scheduleStep(ops, 4);
  expectValid(ops, s);
  EXPECT_EQ(s.branches, 1);
  // With a single branch a light op has nowhere else to go.
  ops = {touch({writes(0, 8)}), light(touch({reads(0, 8), writes(8, 12)})),
         touch({reads(0, 8), writes(12, 16)})};
  StepSchedule one = scheduleStep(ops, 1);
  expectValid(ops, one);
  EXPECT_EQ(one.branches, 1);
}

TEST(StepSchedule, OneBranchIsListOrder) {
  std::vector<OpFootprint> ops = {touch({writes(0, 8)}),
                                  touch({writes(100, 108)})};
  StepSchedule s = scheduleStep(ops, 1);
  EXPECT_EQ(s.branches, 1);
  EXPECT_TRUE(scheduleOrders(s, 0, 1));
}

/// 1 to 60 ops, each of 1 to 3 ranges in 280 bytes, one in ten ordered,
/// one in four light.
std::vector<OpFootprint> randomOps(std::mt19937 &rng) {
  std::vector<OpFootprint> ops(1 + rng() % 60);
  for (OpFootprint &op : ops) {
    op.ordered = rng() % 10 == 0;
    op.light = rng() % 4 == 0;
    for (uint32_t r = 0, count = 1 + rng() % 3; r < count; ++r) {
      uint64_t begin = rng() % 256, length = rng() % 24;
      op.ranges.push_back({begin, begin + length, rng() % 2 == 0});
    }
  }
  return ops;
}

TEST(StepSchedule, RandomFootprints) {
  const uint32_t seed = 20261130;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  for (int round = 0; round < 200; ++round) {
    const std::vector<OpFootprint> ops = randomOps(rng);
    for (int branches : {1, 2, 3, 8}) {
      SCOPED_TRACE("round " + std::to_string(round) + ", " +
                   std::to_string(branches) + " branches");
      StepSchedule s = scheduleStep(ops, branches);
      EXPECT_LE(s.branches, branches);
      expectValid(ops, s);
    }
  }
}

// A step with some ops left out, on the whole step's branches: every kept
// op keeps its branch, every conflicting pair of kept ops stays ordered,
// and a left-out op neither waits nor is waited for.
TEST(StepSchedule, OnBranchesLeavesOpsOut) {
  const uint32_t seed = 20261202;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  for (int round = 0; round < 200; ++round) {
    const std::vector<OpFootprint> ops = randomOps(rng);
    const size_t n = ops.size();
    std::vector<bool> skip(n);
    for (size_t j = 0; j < n; ++j)
      skip[j] = rng() % 4 == 0;
    for (int branches : {1, 3, 8}) {
      SCOPED_TRACE("round " + std::to_string(round) + ", " +
                   std::to_string(branches) + " branches");
      const StepSchedule layout = scheduleStep(ops, branches);
      std::vector<OpFootprint> kept = ops;
      for (size_t j = 0; j < n; ++j)
        if (skip[j])
          kept[j] = {};
      const StepSchedule s = scheduleOnBranches(kept, layout, skip);
      expectValid(kept, s, skip);
      EXPECT_EQ(s.branches, layout.branches);
      for (size_t j = 0; j < n; ++j) {
        EXPECT_EQ(s.branch[j], layout.branch[j]);
        if (skip[j]) {
          EXPECT_TRUE(s.waits[j].empty());
          EXPECT_FALSE(s.signals[j]);
        }
        for (int32_t d : s.waits[j])
          EXPECT_FALSE(skip[size_t(d)]);
      }
    }
  }
}

// The indexer's case: X (after A) writes what B reads, B also reads C's
// output; with X left out and B no longer reading X's, B waits for C alone
// and nothing waits for X.
TEST(StepSchedule, OnBranchesDropsTheLeftOutOpsEdges) {
  std::vector<OpFootprint> ops = {
      touch({writes(0, 8)}),                  // 0: A
      touch({writes(100, 108)}),              // 1: C, another branch
      touch({reads(0, 8), writes(16, 24)}),   // 2: X, after A
      touch({reads(100, 108), reads(16, 24)}) // 3: B
  };
  const StepSchedule layout = scheduleStep(ops, 4);
  ASSERT_NE(layout.branch[2], layout.branch[1]);
  std::vector<OpFootprint> kept = ops;
  kept[2] = {};
  kept[3] = touch({reads(100, 108)}); // B without X's output
  const StepSchedule s =
      scheduleOnBranches(kept, layout, {false, false, true, false});
  expectValid(kept, s, {false, false, true, false});
  EXPECT_FALSE(s.signals[2]);
  EXPECT_EQ(std::count(s.waits[3].begin(), s.waits[3].end(), 2), 0);
  EXPECT_TRUE(scheduleOrders(s, 1, 3));
  // B's only wait, where it is on another branch than C.
  EXPECT_EQ(s.waits[3].size(),
            size_t(layout.branch[3] != layout.branch[1] ? 1 : 0));
}

} // namespace

// An op right after a collective, on the collective's branch or waiting for
// it, follows it; an op that depends on it only through another op, or not
// at all, does not.
TEST(StepSchedule, FollowsOrderedMarksDirectSuccessorsOfCollectives) {
  std::vector<OpFootprint> ops = {
      touch({writes(0, 8)}, /*ordered=*/true),    // 0: the collective
      touch({reads(0, 8), writes(8, 16)}),        // 1: reads its output
      touch({reads(100, 108), writes(200, 208)}), // 2: independent
      touch({reads(8, 16), writes(16, 24)}),      // 3: after 1 only
      touch({reads(0, 8), writes(300, 308)}),     // 4: reads it too
  };
  StepSchedule s = scheduleStep(ops, 4);
  expectValid(ops, s);
  const std::vector<bool> f = followsOrdered(s, ops);
  ASSERT_EQ(f.size(), ops.size());
  EXPECT_FALSE(f[0]);
  EXPECT_TRUE(f[1]);
  EXPECT_FALSE(f[2]);
  EXPECT_FALSE(f[3]);
  EXPECT_TRUE(f[4]);
  // In list order on one branch each op follows the one before it.
  StepSchedule serial = scheduleStep(ops, 1);
  const std::vector<bool> g = followsOrdered(serial, ops);
  EXPECT_EQ(g, (std::vector<bool>{false, true, false, false, false}));
}

// The graph a run replays, by its position: the first graph, the one
// without the indexers up to the smallest top-k of attended positions, the
// one of 16-block selections from its threshold on; each only where the
// step has it, and the first before any position is written.
TEST(StepGraphAt, PicksByAttendedPositions) {
  constexpr int64_t kTopK = 2048, kWide = 98304;
  EXPECT_EQ(stepGraphAt(-1, kTopK, kWide), StepGraphKind::First);
  EXPECT_EQ(stepGraphAt(0, kTopK, kWide), StepGraphKind::AllSelected);
  EXPECT_EQ(stepGraphAt(kTopK - 1, kTopK, kWide), StepGraphKind::AllSelected);
  EXPECT_EQ(stepGraphAt(kTopK, kTopK, kWide), StepGraphKind::First);
  EXPECT_EQ(stepGraphAt(kWide - 2, kTopK, kWide), StepGraphKind::First);
  EXPECT_EQ(stepGraphAt(kWide - 1, kTopK, kWide), StepGraphKind::WideSelect);
  EXPECT_EQ(stepGraphAt(202751, kTopK, kWide), StepGraphKind::WideSelect);
  // Without the graph without indexers, or without the wide one.
  EXPECT_EQ(stepGraphAt(0, 0, kWide), StepGraphKind::First);
  EXPECT_EQ(stepGraphAt(kWide - 1, kTopK, 0), StepGraphKind::First);
  EXPECT_EQ(stepGraphAt(kWide - 1, 0, 0), StepGraphKind::First);
  // Below the top-k the graph without the indexers wins even where the
  // threshold is lower (KILN_CUDA_SELECT_WIDE_FROM below the top-k).
  EXPECT_EQ(stepGraphAt(15, 64, 8), StepGraphKind::AllSelected);
  EXPECT_EQ(stepGraphAt(64, 64, 8), StepGraphKind::WideSelect);
}
