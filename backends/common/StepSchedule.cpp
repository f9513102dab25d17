//===- StepSchedule.cpp - A step's ops as a dataflow graph over branches --===//
#include "common/StepSchedule.h"

#include <algorithm>

namespace kiln::backend {

namespace {

/// Steps longer than this run on one branch: the ancestor sets below take
/// ops^2 / 8 bytes (20,000 ops: 50 MB). A GLM-5 rank's step has ~2,100.
constexpr size_t kMaxScheduledOps = 20000;

bool overlaps(const MemoryRange &a, const MemoryRange &b) {
  return (a.write || b.write) && a.begin < b.end && b.begin < a.end &&
         a.begin < a.end && b.begin < b.end;
}

/// A set of op indices as bits.
class OpSet {
public:
  explicit OpSet(size_t ops) : words_(ops / 64 + 1, 0) {}
  bool has(size_t i) const { return words_[i / 64] >> (i % 64) & 1; }
  void add(size_t i) { words_[i / 64] |= uint64_t(1) << (i % 64); }
  void merge(const OpSet &o) {
    for (size_t w = 0; w < words_.size(); ++w)
      words_[w] |= o.words_[w];
  }

private:
  std::vector<uint64_t> words_;
};

/// How far ahead in the list a light op looks for an op that should have
/// the branch of their common dependency instead (GLM-5: q_b's rope, two
/// ops before attn_k_b).
constexpr size_t kLightLookahead = 8;

/// Whether a light op j should leave the branch whose last op is its
/// dependency d to a later op: one within kLightLookahead, neither light
/// nor ordered, that depends on d and not on j.
bool leavesBranch(const std::vector<OpFootprint> &ops, size_t j, int32_t d) {
  if (!ops[j].light)
    return false;
  const size_t end = std::min(ops.size(), j + 1 + kLightLookahead);
  for (size_t k = j + 1; k < end; ++k)
    if (!ops[k].light && !ops[k].ordered && conflicts(ops[size_t(d)], ops[k]) &&
        !conflicts(ops[j], ops[k]))
      return true;
  return false;
}

StepSchedule serial(size_t ops) {
  StepSchedule s;
  s.branch.assign(ops, 0);
  s.waits.assign(ops, {});
  s.signals.assign(ops, false);
  s.waitsSuffice.assign(ops, false);
  return s;
}

/// StepSchedule::waitsSuffice for an op with `waits` whose branch's last op
/// before it is `previous` (-1: none).
bool waitsSuffice(const std::vector<int32_t> &waits, int32_t previous,
                  const std::vector<OpSet> &ancestors) {
  for (int32_t w : waits)
    if (previous >= 0 && ancestors[size_t(w)].has(size_t(previous)))
      return true;
  return false;
}

} // namespace

bool conflicts(const OpFootprint &a, const OpFootprint &b) {
  if (a.ordered && b.ordered)
    return true;
  for (const MemoryRange &x : a.ranges)
    for (const MemoryRange &y : b.ranges)
      if (overlaps(x, y))
        return true;
  return false;
}

StepSchedule scheduleStep(const std::vector<OpFootprint> &ops,
                          int maxBranches) {
  const size_t n = ops.size();
  if (maxBranches <= 1 || n > kMaxScheduledOps)
    return serial(n);
  StepSchedule s = serial(n);
  s.branches = 0;
  // ancestors[j]: every op the schedule already orders before j.
  std::vector<OpSet> ancestors(n, OpSet(n));
  std::vector<int32_t> tails; // per branch: its last op
  for (size_t j = 0; j < n; ++j) {
    OpSet &reach = ancestors[j];
    // The nearest conflicting ops first: an older conflict is usually an
    // ancestor of a nearer one already, and then needs no edge (nor a
    // footprint comparison).
    std::vector<int32_t> deps;
    for (size_t i = j; i-- > 0;) {
      if (reach.has(i) || !conflicts(ops[i], ops[j]))
        continue;
      deps.push_back(int32_t(i));
      reach.merge(ancestors[i]);
      reach.add(i);
    }
    // The branch: one whose last op is a dependency (the nearest such;
    // not one a light op leaves to a later op: leavesBranch), else one
    // whose last op is already an ancestor (nothing new is ordered), else
    // a new one, else the branch idle longest (orders more than needed,
    // which is always safe).
    int chosen = -1, left = -1;
    for (int32_t d : deps)
      for (int b = 0; b < s.branches && chosen < 0; ++b)
        if (tails[b] == d) {
          if (left < 0 && leavesBranch(ops, j, d))
            left = b;
          else
            chosen = b;
        }
    for (int b = 0; b < s.branches && chosen < 0; ++b)
      if (b != left && reach.has(size_t(tails[b])))
        chosen = b;
    if (chosen < 0 && s.branches < maxBranches) {
      chosen = s.branches++;
      tails.push_back(-1);
    }
    if (chosen < 0) {
      // The branch idle longest, the left one only if it is the only one.
      for (int b = 0; b < s.branches; ++b)
        if (b != left && (chosen < 0 || tails[b] < tails[chosen]))
          chosen = b;
      if (chosen < 0)
        chosen = left;
      reach.merge(ancestors[tails[chosen]]);
      reach.add(size_t(tails[chosen]));
    }
    for (int32_t d : deps)
      if (s.branch[d] != chosen) {
        s.waits[j].push_back(d);
        s.signals[d] = true;
      }
    s.waitsSuffice[j] = waitsSuffice(s.waits[j], tails[chosen], ancestors);
    if (tails[chosen] >= 0) {
      reach.merge(ancestors[tails[chosen]]);
      reach.add(size_t(tails[chosen]));
    }
    s.branch[j] = chosen;
    tails[chosen] = int32_t(j);
  }
  s.branches = std::max(s.branches, 1);
  return s;
}

StepSchedule scheduleOnBranches(const std::vector<OpFootprint> &ops,
                                const StepSchedule &layout,
                                const std::vector<bool> &skip) {
  const size_t n = ops.size();
  // Not this step's layout, or too long: list order is always valid.
  if (layout.branch.size() != n || skip.size() != n || n > kMaxScheduledOps)
    return serial(n);
  StepSchedule s = serial(n);
  s.branches = std::max(layout.branches, 1);
  std::vector<OpSet> ancestors(n, OpSet(n));
  std::vector<int32_t> tails(size_t(s.branches), -1);
  for (size_t j = 0; j < n; ++j) {
    const int chosen = layout.branch[j];
    s.branch[j] = chosen;
    if (skip[j])
      continue;
    OpSet &reach = ancestors[j];
    if (const int32_t t = tails[size_t(chosen)]; t >= 0) {
      reach.merge(ancestors[size_t(t)]);
      reach.add(size_t(t));
    }
    // As scheduleStep: the nearest conflicting ops first.
    for (size_t i = j; i-- > 0;) {
      if (skip[i] || reach.has(i) || !conflicts(ops[i], ops[j]))
        continue;
      reach.merge(ancestors[i]);
      reach.add(i);
      if (s.branch[i] != chosen) {
        s.waits[j].push_back(int32_t(i));
        s.signals[i] = true;
      }
    }
    s.waitsSuffice[j] =
        waitsSuffice(s.waits[j], tails[size_t(chosen)], ancestors);
    tails[size_t(chosen)] = int32_t(j);
  }
  return s;
}

std::vector<bool> followsOrdered(const StepSchedule &s,
                                 const std::vector<OpFootprint> &ops,
                                 const std::vector<bool> &skip) {
  const size_t n = std::min(s.branch.size(), ops.size());
  std::vector<bool> out(n, false);
  std::vector<int32_t> last(size_t(std::max(s.branches, 1)), -1);
  for (size_t j = 0; j < n; ++j) {
    if (j < skip.size() && skip[j])
      continue;
    const size_t b = size_t(s.branch[j]);
    if (b >= last.size())
      last.resize(b + 1, -1);
    bool follows = last[b] >= 0 && ops[size_t(last[b])].ordered;
    for (int32_t d : s.waits[j])
      follows = follows || (d >= 0 && size_t(d) < n && ops[size_t(d)].ordered);
    out[j] = follows;
    last[b] = int32_t(j);
  }
  return out;
}

bool scheduleOrders(const StepSchedule &s, int32_t earlier, int32_t later) {
  const size_t n = s.branch.size();
  if (earlier < 0 || later < 0 || size_t(later) >= n || earlier >= later)
    return false;
  // Predecessors of op j: the previous op of its branch, and its waits.
  std::vector<int32_t> previous(n, -1), last(size_t(s.branches), -1);
  for (size_t j = 0; j < n; ++j) {
    previous[j] = last[size_t(s.branch[j])];
    last[size_t(s.branch[j])] = int32_t(j);
  }
  std::vector<bool> seen(n, false);
  std::vector<int32_t> todo = {later};
  while (!todo.empty()) {
    int32_t j = todo.back();
    todo.pop_back();
    if (j == earlier)
      return true;
    if (j < earlier || seen[size_t(j)])
      continue;
    seen[size_t(j)] = true;
    if (previous[size_t(j)] >= 0)
      todo.push_back(previous[size_t(j)]);
    for (int32_t d : s.waits[size_t(j)])
      todo.push_back(d);
  }
  return false;
}

StepGraphKind stepGraphAt(int64_t position, int64_t selectsAll,
                          int64_t wideFrom) {
  if (position < 0)
    return StepGraphKind::First; // not yet written
  const int64_t attended = position + 1;
  if (selectsAll > 0 && attended <= selectsAll)
    return StepGraphKind::AllSelected;
  if (wideFrom > 0 && attended >= wideFrom)
    return StepGraphKind::WideSelect;
  return StepGraphKind::First;
}

} // namespace kiln::backend
