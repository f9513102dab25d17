//===- Random.h - Deterministic random numbers and hashing ---------*- C++ -*-===//
//
// xoshiro256** (Blackman and Vigna) seeded through splitmix64: fast,
// statistically sound and fully specified, so a synthetic model's bytes and a
// seeded sample are the same on every machine and with every standard
// library. Also 64-bit FNV-1a, for seeds derived from names and checksums.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_SUPPORT_RANDOM_H
#define KILN_SUPPORT_RANDOM_H

#include <cmath>
#include <cstdint>
#include <string_view>

namespace kiln {

/// 64-bit FNV-1a, continued from `hash`: per-tensor seeds derived from
/// (seed, name, type) only, and the artifact's checksum.
inline uint64_t fnv1a(std::string_view bytes,
                      uint64_t hash = 0xcbf29ce484222325ull) {
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  return hash;
}

class Rng {
public:
  explicit Rng(uint64_t seed) {
    // splitmix64 spreads any seed (even 0) over the whole state.
    for (uint64_t &word : state_) {
      seed += 0x9e3779b97f4a7c15ull;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      word = z ^ (z >> 31);
    }
  }

  uint64_t next() {
    uint64_t result = rotl(state_[1] * 5, 7) * 9;
    uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  /// Uniform in [0, 1) with 53 random bits.
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }

  /// Uniform integer in [0, n) (n > 0); the bias of the modulo is below
  /// n / 2^64, irrelevant for picking blocks.
  uint64_t below(uint64_t n) { return next() % n; }

  /// Standard normal (Box-Muller; the second value of each pair is kept).
  double normal() {
    if (haveSpare_) {
      haveSpare_ = false;
      return spare_;
    }
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300)
      u1 = 1e-300;
    double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2.0 * M_PI * u2);
    haveSpare_ = true;
    return r * std::cos(2.0 * M_PI * u2);
  }

private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t state_[4];
  double spare_ = 0.0;
  bool haveSpare_ = false;
};

} // namespace kiln

#endif // KILN_SUPPORT_RANDOM_H
