//===- Pieces.h - A reply fed to the fuzz targets in pieces ----*- C++ -*-===//
//
// The reply targets stream a reply as a generator does: in pieces of 1-8
// bytes, each piece's length taken from the reply's own bytes so that the
// fuzzer steers the cuts.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_TEST_FUZZ_PIECES_H
#define KILN_TEST_FUZZ_PIECES_H

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

namespace kiln::fuzz {

/// `reply` cut into pieces of 1-8 bytes (the first 1 byte; then each
/// length from the first byte of the piece before).
inline std::vector<std::string_view> pieces(std::string_view reply) {
  std::vector<std::string_view> out;
  size_t at = 0, cut = 1;
  while (at < reply.size()) {
    std::string_view piece = reply.substr(at, cut);
    cut = 1 + uint8_t(reply[at]) % 8;
    out.push_back(piece);
    at += piece.size();
  }
  return out;
}

/// Feeds `reply`'s pieces to the constraint `p` while it takes them,
/// aborting where `accepts` and `push` (on a copy) disagree; returns the
/// bytes taken. `each(p, piece)` runs first for every piece offered (more
/// of the constraint's queries, which must not crash).
template <class P, class Each>
size_t feedChecked(P &p, std::string_view reply, Each each) {
  size_t taken = 0;
  for (std::string_view piece : pieces(reply)) {
    each(p, piece);
    P copy = p;
    const bool accepted = p.accepts(piece);
    if (copy.push(piece) != accepted)
      std::abort(); // accepts and push disagree
    if (!accepted)
      break;
    p.push(piece);
    taken += piece.size();
  }
  return taken;
}

template <class P> size_t feedChecked(P &p, std::string_view reply) {
  return feedChecked(p, reply, [](const P &, std::string_view) {});
}

} // namespace kiln::fuzz

#endif // KILN_TEST_FUZZ_PIECES_H
