//===- DrawKey.h - A sampled token as an argmax of keys, on any processor ---*-
//C++ -*-===//
//
// A draw from softmax(logits / T) is the argmax over tokens v of
//
//   key(v) = logit(v) * (1 / T) + G(seed, position, v),
//
// G = -ln(-ln U) a standard Gumbel variable (the Gumbel-max identity), U a
// uniform variable made from a hash of the request's seed, the step's
// position and the token id. Each token's key needs only its own logit, so
// a draw is an argmax like greedy decoding's: every tensor-parallel rank
// takes the best key of its part of the vocabulary, and only the best keys
// travel. The step's `argmax` ops take it from the step's `sampling` input
// slot (DrawWords) and its position.
//
// Every operation below is one IEEE single-precision operation rounded to
// nearest (no fused multiply-add: the files that include this are built
// without contraction, `-ffp-contract=off` on the host, `--fmad=false` on
// the device; the logarithm is the header's own), so a key has the same
// bits on a CPU, on a GPU and in numpy's float32 (the tests' reference).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_SUPPORT_DRAWKEY_H
#define KILN_SUPPORT_DRAWKEY_H

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define KILN_DRAW_FN __host__ __device__ inline
#else
#define KILN_DRAW_FN inline
#endif

namespace kiln::draw {

/// The `sampling` slot: four 32-bit words.
///   [0] the temperature's float bits: 0 is the plain argmax (greedy);
///       otherwise within [kMinTemperature, kMaxTemperature];
///   [1], [2] the seed's low and high 32 bits;
///   [3] 0 (reserved).
constexpr int kDrawWords = 4;
/// The temperatures a key is made for: below 2^-16 a draw is the argmax in
/// all but exact ties; above 2^16 the logits no longer matter.
constexpr float kMinTemperature = 0x1p-16f, kMaxTemperature = 0x1p16f;

KILN_DRAW_FN uint32_t floatBits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}
KILN_DRAW_FN float bitsFloat(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/// What validWords requires, for the messages that refuse words.
constexpr const char *kWordsRule =
    "the temperature must be 0 or within [2^-16, 2^16], the last word 0";

/// Whether the slot's words are valid; `bad` is the first bad word's index.
KILN_DRAW_FN bool validWords(const int32_t *words, int &bad) {
  const float t = bitsFloat(uint32_t(words[0]));
  if (!(t == 0.0f || (t >= kMinTemperature && t <= kMaxTemperature))) {
    bad = 0;
    return false;
  }
  if (words[3] != 0) {
    bad = 3;
    return false;
  }
  return true;
}

/// 32 random bits for token `token` at `position` under `seed`: the
/// position and the token spread by two odd constants, then splitmix64's
/// finaliser (a bijection of 64 bits in which every input bit reaches
/// every output bit).
KILN_DRAW_FN uint32_t drawBits(uint64_t seed, uint32_t position,
                               uint32_t token) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (uint64_t(position) + 1);
  z ^= uint64_t(token) * 0xd1b54a32d192ed03ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return uint32_t((z ^ (z >> 31)) >> 32);
}

/// U in (0, 1) from 23 of the bits: an odd multiple of 2^-24, exact in
/// float, never 0 or 1.
KILN_DRAW_FN float drawUniform(uint32_t bits) {
  return float(((bits >> 9) << 1) | 1u) * 0x1p-24f;
}

/// ln x for a positive normal x (every argument here is within [2^-24,
/// 17]): x = 2^e m with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s), s =
/// (m - 1) / (m + 1), |s| < 0.172, by its series to s^9 (the next term is
/// below 8e-10); within 2e-7 of ln x, the same bits everywhere.
KILN_DRAW_FN float drawLog(float x) {
  const uint32_t b = floatBits(x);
  int e = int(b >> 23) - 127;
  float m = bitsFloat((b & 0x7fffffu) | 0x3f800000u);
  if (m > 1.41421354f) {
    m = m * 0.5f;
    e = e + 1;
  }
  const float s = (m - 1.0f) / (m + 1.0f);
  const float z = s * s;
  float q = 2.0f / 9.0f;
  q = 2.0f / 7.0f + z * q;
  q = 2.0f / 5.0f + z * q;
  q = 2.0f / 3.0f + z * q;
  const float lnm = s * 2.0f + (s * z) * q;
  // ln 2 in two parts: the first has 8 trailing zero bits, so e times it
  // (|e| < 128) is exact.
  const float ef = float(e);
  return ef * 0.693145751953125f + (lnm + ef * 1.42860677e-6f);
}

/// G = -ln(-ln U), a standard Gumbel variable, from the hash bits.
KILN_DRAW_FN float gumbel(uint32_t bits) {
  return -drawLog(-drawLog(drawUniform(bits)));
}

/// Token `token`'s key at `position`, `scale` = 1 / T.
KILN_DRAW_FN float drawKey(float logit, float scale, uint64_t seed,
                           uint32_t position, uint32_t token) {
  return logit * scale + gumbel(drawBits(seed, position, token));
}

/// The index of the largest key of x[0, n) (value i's made for index
/// base + i), ties to the lowest (a NaN key wins only at i = 0, as the
/// plain argmax's scan); the key in `key`. n > 0.
inline int64_t bestKey(const float *x, int64_t n, int64_t base, float scale,
                       uint64_t seed, uint32_t position, float &key) {
  // The keys a block at a time into a buffer (a loop without branches the
  // compiler vectorises), then the scan.
  constexpr int64_t kBlock = 256;
  float keys[kBlock];
  int64_t best = 0;
  float top = 0;
  for (int64_t at = 0; at < n; at += kBlock) {
    const int64_t m = n - at < kBlock ? n - at : kBlock;
    for (int64_t i = 0; i < m; ++i)
      keys[i] =
          drawKey(x[at + i], scale, seed, position, uint32_t(base + at + i));
    int64_t i = 0;
    if (at == 0) {
      top = keys[0];
      i = 1;
    }
    for (; i < m; ++i)
      if (keys[i] > top) { // strict: a tie keeps the lower index
        top = keys[i];
        best = at + i;
      }
  }
  key = top;
  return best;
}

/// The seed of the slot's words.
KILN_DRAW_FN uint64_t drawSeed(const int32_t *words) {
  return uint64_t(uint32_t(words[1])) | uint64_t(uint32_t(words[2])) << 32;
}

} // namespace kiln::draw

#undef KILN_DRAW_FN

#endif // KILN_SUPPORT_DRAWKEY_H
