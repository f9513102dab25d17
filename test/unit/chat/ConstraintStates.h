//===- ConstraintStates.h - Checks shared by the reply recognisers' tests -===//
#ifndef KILN_TEST_UNIT_CHAT_CONSTRAINTSTATES_H
#define KILN_TEST_UNIT_CHAT_CONSTRAINTSTATES_H

#include "support/Random.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

/// Every state of `start` along `text`, byte by byte (the start included).
template <class P>
std::vector<P> statesAlong(P start, const std::string &text) {
  std::vector<P> states = {start};
  for (char c : text) {
    EXPECT_TRUE(start.push(std::string(1, c))) << text;
    states.push_back(start);
  }
  return states;
}

/// For every two of `states` with equal keys: the same complete() and the
/// same answer to every probe. Returns how many pairs had equal keys.
template <class P>
size_t checkEqualKeys(const std::vector<P> &states,
                      const std::vector<std::string> &probes) {
  size_t pairs = 0;
  for (size_t i = 0; i < states.size(); ++i)
    for (size_t j = i + 1; j < states.size(); ++j) {
      if (states[i].key() != states[j].key())
        continue;
      ++pairs;
      EXPECT_EQ(states[i].complete(), states[j].complete());
      for (const std::string &probe : probes)
        EXPECT_EQ(states[i].accepts(probe), states[j].accepts(probe))
            << i << " " << j << " " << probe;
    }
  return pairs;
}

/// Gives `text` to `p` in seeded random pieces of 1 to `maxPiece` bytes,
/// checking each: accepts(piece) must equal push(piece) on a copy. Returns
/// false at the first piece refused (`p` as before it), true once every
/// piece is taken.
template <class P>
bool takePieces(P &p, const std::string &text, kiln::Rng &rng,
                size_t maxPiece) {
  for (size_t at = 0; at < text.size();) {
    const std::string piece = text.substr(at, 1 + rng.below(maxPiece));
    P copy = p;
    const bool accepted = p.accepts(piece);
    EXPECT_EQ(copy.push(piece), accepted) << text << " at " << at;
    if (!accepted)
      return false;
    EXPECT_TRUE(p.push(piece));
    at += piece.size();
  }
  return true;
}

#endif // KILN_TEST_UNIT_CHAT_CONSTRAINTSTATES_H
