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

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#ifdef __CUDACC__
#define KILN_DRAW_FN __host__ __device__ inline
#else
#define KILN_DRAW_FN inline
#endif

namespace kiln::draw {

/// The `sampling` slot: eight 32-bit words (four in artifacts compiled
/// before the step cut a nucleus, which draw plain temperatures only).
///   [0] the temperature's float bits: 0 is the plain argmax (greedy);
///       otherwise within [kMinTemperature, kMaxTemperature];
///   [1], [2] the seed's low and high 32 bits;
///   [3] the nucleus's share p (top-p): its float bits, 0 for none,
///       otherwise within (0, 1) and with a temperature (bestKey below);
///   [4] top-k: the count of tokens kept, 0 for none, otherwise positive
///       and with a temperature: only the k tokens of the largest weights
///       (below; ties at the k-th all kept) are drawn, and a nucleus is cut
///       from them alone;
///   [5] min-p: its float bits, 0 for none, otherwise within (0, 1] and
///       with a temperature: only tokens whose weight (below) is at least
///       it are drawn, and a nucleus is cut from them alone;
///   [6] 0 (reserved), or in the adjusting form (below) its entry count;
///   [7] 0 (reserved).
/// The adjusting form has more words after these: the logits' adjustments
/// (logit_bias and the penalties over the recent tokens), made before the
/// draw or the argmax (adjustLogit below).
constexpr int kDrawWords = 8;
/// The words of the first form (no nucleus).
constexpr int kTemperatureWords = 4;
/// The adjusting form: the eight words, the penalties' eight (kPenaltyWords
/// below), then kEntryWords a token adjusted; its capacity is the entries
/// it has room for (at least 1).
constexpr int kEntriesStart = 16;
constexpr int kEntryWords = 3;
KILN_DRAW_FN constexpr int adjustingWords(int capacity) {
  return kEntriesStart + kEntryWords * capacity;
}
/// The entries a slot of `count` words has room for: 0 unless it is the
/// adjusting form.
KILN_DRAW_FN constexpr int adjustCapacity(int count) {
  return count > kEntriesStart && (count - kEntriesStart) % kEntryWords == 0
             ? (count - kEntriesStart) / kEntryWords
             : 0;
}
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
    "the temperature must be 0 or within [2^-16, 2^16], top-p 0 or within "
    "(0, 1), top-k 0 or positive and min-p 0 or within (0, 1], the last "
    "three only with a temperature, the reserved words 0";

/// A draw as the words give it.
struct DrawParams {
  float temperature = 0; ///< 0: the plain argmax
  uint64_t seed = 0;
  float topP = 0; ///< 0: no nucleus
  float minP = 0; ///< 0: no floor
  int32_t topK = 0; ///< 0: every token
  /// Whether the draw cuts the vocabulary (and so needs all of it).
  KILN_DRAW_FN bool cuts() const {
    return topP != 0.0f || minP != 0.0f || topK != 0;
  }
  /// The word that names the first cut (for a refusal): 3, 4 or 5.
  KILN_DRAW_FN int cutWord() const {
    return topP != 0.0f ? 3 : topK != 0 ? 4 : 5;
  }
  bool operator==(const DrawParams &) const = default;
};

/// Whether the slot's `count` words (kDrawWords, kTemperatureWords or an
/// adjusting form's) are valid as far as the eight go (the adjusting
/// form's entry count included: readPenalties and validEntry check the
/// rest), and what they say; `bad` is the first bad word's index.
KILN_DRAW_FN bool readWords(const int32_t *words, int count, DrawParams &params,
                            int &bad) {
  const float t = bitsFloat(uint32_t(words[0]));
  if (!(t == 0.0f || (t >= kMinTemperature && t <= kMaxTemperature))) {
    bad = 0;
    return false;
  }
  // In the first form word 3 is reserved, as words 4 .. 7 are here; the
  // adjusting form has the eight words first.
  const bool eight = count >= kDrawWords;
  const float p = eight ? bitsFloat(uint32_t(words[3])) : 0.0f;
  if (words[3] != 0 && (!eight || !(p > 0.0f && p < 1.0f) || t == 0.0f)) {
    bad = 3;
    return false;
  }
  // min-p, in the eight words only.
  const float m = eight ? bitsFloat(uint32_t(words[5])) : 0.0f;
  if (eight && words[5] != 0 && (!(m > 0.0f && m <= 1.0f) || t == 0.0f)) {
    bad = 5;
    return false;
  }
  // top-k, in the eight words only.
  const int32_t k = eight ? words[4] : 0;
  if (eight && k != 0 && (k < 0 || t == 0.0f)) {
    bad = 4;
    return false;
  }
  // The reserved words, with fixed bounds so that a kernel keeps the words
  // in registers (the first form has none past word 3); word 6 is the
  // adjusting form's entry count.
  for (int i = 6; i < kDrawWords; ++i)
    if (i < count && words[i] != 0 &&
        (i != 6 || words[i] < 0 || words[i] > adjustCapacity(count))) {
      bad = i;
      return false;
    }
  params.temperature = t;
  params.seed = uint64_t(uint32_t(words[1])) | uint64_t(uint32_t(words[2]))
                                                   << 32;
  params.topP = p;
  params.minP = m;
  params.topK = k;
  return true;
}

/// Whether the slot's words are valid; `bad` is the first bad word's index.
KILN_DRAW_FN bool validWords(const int32_t *words, int count, int &bad) {
  DrawParams params;
  return readWords(words, count, params, bad);
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

/// The largest value gumbel takes, with a margin: 16.64 over every one of
/// the 2^23 values of the bits it reads (DrawKeyTest checks them all). So
/// a key is at most logit * scale + kGumbelBound, as the float sums round:
/// a token whose bound is below a key already made cannot win.
constexpr float kGumbelBound = 17.0f;

/// Token `token`'s key at `position`, `scale` = 1 / T.
KILN_DRAW_FN float drawKey(float logit, float scale, uint64_t seed,
                           uint32_t position, uint32_t token) {
  return logit * scale + gumbel(drawBits(seed, position, token));
}

/// e^x for x <= 0 in float, without branches, so that a loop over a
/// vocabulary vectorises: x = k ln 2 + r with |r| <= ln 2 / 2 (ln 2 in two
/// parts, the first exact in k's products), e^r by its Taylor polynomial to
/// r^6 (truncation below 1.3e-7 of the result) and 2^k from exponent bits.
/// 0 below -87 (2^-125.5) and for -infinity and NaN; e^0 is exactly 1.
/// Within 5e-7 of e^x, relatively (SamplerTest checks it against double).
/// The Sampler's weights and the nucleus's (below).
KILN_DRAW_FN float expNonPositive(float x) {
  const float c = x > -87.0f ? x : -87.0f; // NaN too: the comparison fails
  const int32_t k = int32_t(c * 1.44269504f - 0.5f); // round(c / ln 2)
  const float kf = float(k);
  const float r = (c - kf * 0.693359375f) + kf * 2.12194440e-4f;
  float p = 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const float twoK = bitsFloat(uint32_t(k + 127) << 23);
  return x > -87.0f ? p * twoK : 0.0f;
}

//===----------------------------------------------------------------------===//
// The nucleus (top-p, word 3).
//
// Token v's weight is w(v) = e^((logit(v) - top) / T) (expNonPositive; top
// the largest logit, NaN ignored) and its mass w(v) * 2^40 truncated to an
// integer, so that masses add exactly in any order, on any processor and
// over any split of the vocabulary. With total the whole mass and want =
// ceil(p * total) (at most total), the cut is the largest weight c (as
// float bits, which order as the weights do) such that the tokens of
// weight >= c hold at least want; the nucleus is those tokens, ties at the
// cut included. The draw is the largest key among them (bestKey).
//
// The cut is found by a radix selection over the weight's bits, three
// digits from the top (digitShift, digitWidth): each pass sums the masses of
// the tokens that share the digits found so far by their next digit, and takes
// the highest digit at which the mass above it reaches want. Ranks that
// hold parts of the vocabulary add their passes' sums (integers, exact) and
// take the same digits.
//
// With min-p (word 5) a token of weight below it holds no mass, so the
// share is of the tokens at or above it, and is never drawn; min-p alone
// cuts at that floor (the Sampler's min-p: weights at least min-p times
// the best one's, which is 1).
//
// Top-k (word 4) is a floor too: the largest weight c such that at least k
// tokens have weight >= c, found by the same selection over counts instead
// of masses. Only tokens of positive weight count (1 each): where fewer
// than k have one, the k-th weight is 0 and keeps every token, which is no
// cut, as a total of at most k is. The floor a draw keeps is the higher
// of min-p's and top-k's, then the share is of the tokens at or above it:
// the Sampler's order (min-p, then the k most likely of what it keeps,
// then top-p), as the weights order as the logits do.
//
// It is the Sampler's top-p and top-k but for two things: ties at a cut
// are all kept (the Sampler keeps them by id until the count or the mass
// is reached; tokens whose logits differ may share a weight), and a
// token's mass is its weight to 2^-40, so a cut that the masses reach
// within ~1e-7 of p x total may fall one token apart.
//===----------------------------------------------------------------------===//

constexpr float kMassScale = 0x1p40f;
constexpr int kNucleusPasses = 3;
/// Pass `pass`'s digit: bits [20, 31), [10, 20), [0, 10) of the weight.
KILN_DRAW_FN constexpr int digitShift(int pass) {
  return pass == 0 ? 20 : pass == 1 ? 10 : 0;
}
KILN_DRAW_FN constexpr int digitWidth(int pass) { return pass == 0 ? 11 : 10; }
constexpr int kNucleusBins = 1 << 11; ///< the widest digit's

/// Token `logit`'s weight as float bits; `scale` = 1 / T.
KILN_DRAW_FN uint32_t weightBits(float logit, float top, float scale) {
  return floatBits(expNonPositive((logit - top) * scale));
}
/// A weight's mass (bits of a float within [0, 1]).
KILN_DRAW_FN uint64_t weightMass(uint32_t bits) {
  return uint64_t(bitsFloat(bits) * kMassScale);
}
/// The mass a token holds under min-p's floor (weight bits; 0 for none):
/// none below it, which leaves it out of the total and of the cut.
KILN_DRAW_FN uint64_t floorMass(uint32_t bits, uint32_t floor) {
  return bits >= floor ? weightMass(bits) : 0;
}
/// The cut of a draw with min-p alone: its floor, or every token where the
/// largest logit is not finite (then no weight is above 0).
KILN_DRAW_FN uint32_t floorCut(float top, uint32_t floor) {
  return top - top == 0.0f ? floor : 0; // finite
}

/// The selection's state: the tokens whose weight bits share `prefix`'s
/// digits found so far are its candidates; `before` is the mass of the
/// tokens above them; want 0 once there is no cut (every token kept).
struct NucleusCut {
  uint64_t want = 0;
  uint64_t before = 0;
  uint32_t prefix = 0;
};

/// Whether weight bits `bits` are a candidate in pass `pass`.
KILN_DRAW_FN bool nucleusCandidate(uint32_t bits, uint32_t prefix, int pass) {
  const int above = digitShift(pass) + digitWidth(pass);
  return above >= 32 || (bits >> above) == (prefix >> above);
}
/// Weight bits' digit in pass `pass`.
KILN_DRAW_FN uint32_t nucleusDigit(uint32_t bits, int pass) {
  return (bits >> digitShift(pass)) & ((1u << digitWidth(pass)) - 1);
}

/// What the first pass's total asks the selection to reach: a share p's
/// ceil(p x total) of the masses (at most total), or with p = 0 a count of
/// k tokens. 0 (no cut) where the total is 0 (no finite largest logit) or
/// k is at least the count of every token.
KILN_DRAW_FN uint64_t firstWant(uint64_t total, float p, int32_t k) {
  if (p == 0.0f)
    return uint64_t(k) < total ? uint64_t(k) : 0;
  const double want = ceil(double(p) * double(total));
  return want >= double(total) ? total : uint64_t(want);
}

/// What a token adds to a pass's bin: 1 for a positive weight where the
/// selection counts (`counting`, top-k), else its mass under min-p's
/// floor. (A zero adds nothing, and a kernel skips its add: the many
/// tokens whose weights underflow would otherwise all add to one bin.)
KILN_DRAW_FN uint64_t passUnit(uint32_t bits, uint32_t floor, bool counting) {
  return counting ? uint64_t(bits != 0) : floorMass(bits, floor);
}

/// After pass `pass`: `bins` are the candidates' masses (or counts) by
/// digit, summed over every rank. The first pass sets want (firstWant: a
/// share p, or with p = 0 a count k). Takes the highest digit d with before
/// + the bins of digits >= d reaching want; none (sums that disagree, which
/// exact sums do not) is no cut.
KILN_DRAW_FN void nucleusStep(const uint64_t *bins, int pass, float p,
                              int32_t k, NucleusCut &cut) {
  const int count = 1 << digitWidth(pass);
  if (pass == 0) {
    uint64_t total = 0;
    for (int d = 0; d < count; ++d)
      total += bins[d];
    cut.want = firstWant(total, p, k);
    cut.before = 0;
    cut.prefix = 0;
  }
  if (cut.want == 0)
    return;
  uint64_t before = cut.before;
  for (int d = count - 1; d >= 0; --d) {
    if (before + bins[d] >= cut.want) {
      cut.before = before;
      cut.prefix |= uint32_t(d) << digitShift(pass);
      return;
    }
    before += bins[d];
  }
  cut.want = 0;
}

/// The cut's weight bits once the passes are done (0: every token).
KILN_DRAW_FN uint32_t nucleusBits(const NucleusCut &cut) {
  return cut.want ? cut.prefix : 0;
}

/// The largest of x[0, n), NaN ignored; -infinity if none.
inline float nucleusTop(const float *x, int64_t n) {
  float top = -__builtin_inff();
  for (int64_t i = 0; i < n; ++i)
    top = x[i] > top ? x[i] : top;
  return top;
}

/// Adds pass `pass`'s masses of x[0, n) by digit to `bins` (none below
/// min-p's floor, as weight bits).
inline void nucleusHistogram(const float *x, int64_t n, float top, float scale,
                             const NucleusCut &cut, int pass, uint64_t *bins,
                             uint32_t floor = 0) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = weightBits(x[i], top, scale);
    if (nucleusCandidate(bits, cut.prefix, pass))
      bins[nucleusDigit(bits, pass)] += floorMass(bits, floor);
  }
}

/// The selection over a vocabulary held whole, given as its weights' bits
/// w[0, n): by the masses at or above `floor` for a share p, or with p = 0
/// by counts for k tokens (nucleusStep). Its cut, 0 for every token. The
/// first pass reads every weight, the later ones only the candidates it
/// leaves (in `places`, the caller's scratch).
inline uint32_t radixCutOfBits(const uint32_t *w, int64_t n, float p, int32_t k,
                               uint32_t floor, std::vector<uint32_t> &places) {
  const bool counting = p == 0.0f;
  NucleusCut cut;
  uint64_t bins[kNucleusBins] = {};
  for (int64_t i = 0; i < n; ++i)
    bins[nucleusDigit(w[i], 0)] += passUnit(w[i], floor, counting);
  nucleusStep(bins, 0, p, k, cut);
  if (cut.want == 0)
    return 0;
  places.clear();
  for (int64_t i = 0; i < n; ++i)
    if (nucleusCandidate(w[i], cut.prefix, 1))
      places.push_back(uint32_t(i));
  for (int pass = 1; pass < kNucleusPasses && cut.want != 0; ++pass) {
    for (int d = 0; d < kNucleusBins; ++d)
      bins[d] = 0;
    for (uint32_t i : places)
      if (nucleusCandidate(w[i], cut.prefix, pass))
        bins[nucleusDigit(w[i], pass)] += passUnit(w[i], floor, counting);
    nucleusStep(bins, pass, p, k, cut);
  }
  return nucleusBits(cut);
}

/// The cut of a vocabulary held whole, given as its weights' bits w[0, n)
/// at `top` (weightBits): share p's of the tokens at or above the floor
/// (the higher of min-p's, as weight bits with 0 for none, and top-k's
/// where k is not 0), or with p = 0 the floor itself.
inline uint32_t nucleusCutOfBits(const uint32_t *w, int64_t n, float top,
                                 float p, uint32_t floor,
                                 std::vector<uint32_t> &places, int32_t k = 0) {
  if (k != 0) {
    const uint32_t kept = radixCutOfBits(w, n, 0.0f, k, 0, places);
    floor = kept > floor ? kept : floor;
  }
  if (p == 0.0f)
    return floorCut(top, floor);
  return radixCutOfBits(w, n, p, 0, floor, places);
}

/// The same cut of a vocabulary held whole, x[0, n), at `top`
/// (nucleusTop).
inline uint32_t nucleusCutOf(const float *x, int64_t n, float top, float scale,
                             float p, uint32_t floor = 0, int32_t k = 0) {
  std::vector<uint32_t> bits(static_cast<size_t>(n)), places;
  for (int64_t i = 0; i < n; ++i)
    bits[size_t(i)] = weightBits(x[i], top, scale);
  return nucleusCutOfBits(bits.data(), n, top, p, floor, places, k);
}

/// Whether every key of x[0, n) at `scale` is below `least` by its bound
/// (kGumbelBound; a NaN's is not).
inline bool allBelow(const float *x, int64_t n, float scale, float least) {
  int below = 0; // a count, so that the loop vectorises
  for (int64_t i = 0; i < n; ++i)
    below += x[i] * scale + kGumbelBound < least;
  return below == n;
}

/// The index of the largest key of x[0, n) (value i's made for index
/// base + i), ties to the lowest (a NaN key wins only at i = 0, as the
/// plain argmax's scan); the key in `key`. n > 0. With a cut (non-zero
/// weight bits, nucleusCutOf), a token whose weight at `top` is below it
/// has key -infinity.
inline int64_t bestKey(const float *x, int64_t n, int64_t base, float scale,
                       uint64_t seed, uint32_t position, float &key,
                       float top = 0, uint32_t cut = 0) {
  // The keys a block at a time into a buffer (a loop without branches the
  // compiler vectorises), then the scan. After the first block, a block
  // whose tokens' bounds (kGumbelBound) are all below the best key so far
  // is skipped: none of its keys can win or tie, so the index is the same.
  // (A NaN skips nothing.)
  constexpr int64_t kBlock = 256;
  float keys[kBlock];
  int64_t best = 0;
  float most = 0;
  for (int64_t at = 0; at < n; at += kBlock) {
    const int64_t m = n - at < kBlock ? n - at : kBlock;
    if (at != 0 && allBelow(x + at, m, scale, most))
      continue;
    for (int64_t i = 0; i < m; ++i)
      keys[i] =
          drawKey(x[at + i], scale, seed, position, uint32_t(base + at + i));
    if (cut != 0)
      for (int64_t i = 0; i < m; ++i)
        keys[i] = weightBits(x[at + i], top, scale) >= cut ? keys[i]
                                                           : -__builtin_inff();
    int64_t i = 0;
    if (at == 0) {
      most = keys[0];
      i = 1;
    }
    for (; i < m; ++i)
      if (keys[i] > most) { // strict: a tie keeps the lower index
        most = keys[i];
        best = at + i;
      }
  }
  key = most;
  return best;
}

/// The draw within a nucleus (and min-p's floor, weight bits, 0 for none;
/// and top-k's, k 0 for none) over a vocabulary held whole, x[0, n), on
/// the host: bestKey(..., top, nucleusCutOf(...)) computed faster. Each weight
/// is made once (a loop that vectorises) for nucleusCutOfBits, and keys are
/// made only for the nucleus's tokens (by id, so ties go to the lower index).
/// `bits` and `places` are the caller's scratch. The index, its key in `key`. n
/// > 0.
inline int64_t nucleusDraw(const float *x, int64_t n, float scale, float p,
                           uint64_t seed, uint32_t position, float &key,
                           std::vector<uint32_t> &bits,
                           std::vector<uint32_t> &places, uint32_t floor = 0,
                           int32_t k = 0) {
  const float top = nucleusTop(x, n);
  bits.resize(size_t(n));
  uint32_t *w = bits.data();
  for (int64_t i = 0; i < n; ++i)
    w[i] = weightBits(x[i], top, scale);
  const uint32_t edge = nucleusCutOfBits(w, n, top, p, floor, places, k);
  if (edge == 0)
    return bestKey(x, n, 0, scale, seed, position, key);
  // Every token of the nucleus has a finite key (its weight is positive,
  // so its logit is finite): the largest, the first of equal ones.
  int64_t best = -1;
  float most = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (w[i] < edge)
      continue;
    const float k = drawKey(x[i], scale, seed, position, uint32_t(i));
    if (best < 0 || k > most) {
      best = i;
      most = k;
    }
  }
  key = most;
  return best;
}

//===----------------------------------------------------------------------===//
// Adjustments (the adjusting form): OpenAI's logit_bias and the penalties
// over the recent tokens, made by the step before its draw or argmax, so
// that a penalised request needs no logits on the host.
//
//   [8, 9]   the repeat penalty, a double (low word first; 1: none;
//            applied as a float);
//   [10, 11] the frequency penalty, a double (0: none);
//   [12, 13] the presence penalty, a double (0: none);
//   [14, 15] 0 (reserved);
//   then word 6's count of entries, kEntryWords each, ids ascending:
//   the token id, its bias's float bits (0: none) and its count among the
//   recent tokens (0: not among them).
//
// A token with an entry has its logit adjusted (adjustLogit), the others
// keep theirs: the Sampler's penalise, which builds the same entries
// (runtime makeAdjustments) and applies the same function. Each rank of a
// split vocabulary adjusts the entries in its part.
//===----------------------------------------------------------------------===//

/// The penalties' words, [8, 16).
constexpr int kPenaltyWords = 8;
static_assert(kDrawWords + kPenaltyWords == kEntriesStart);

struct Penalties {
  double repeat = 1;    ///< > 0: llama.cpp's repeat penalty
  double frequency = 0; ///< OpenAI's, times a token's count
  double presence = 0;  ///< OpenAI's, once for a token present
  bool operator==(const Penalties &) const = default;
};

/// One adjusted token.
struct Adjustment {
  int32_t id = 0;
  float bias = 0;    ///< added first (0: none)
  int32_t count = 0; ///< among the recent tokens
  bool operator==(const Adjustment &) const = default;
};

/// What the adjusting form's penalties must be, for the messages that
/// refuse them.
constexpr const char *kPenaltiesRule =
    "the repeat penalty must be above 0 and finite as a float, the "
    "frequency and presence penalties finite, the reserved words 0";

/// What an adjusted token's words must be.
constexpr const char *kEntryRule =
    "an adjusted token's id must be within the vocabulary and above the "
    "one before it, its bias finite and its count at least 0";
/// The rule that word `bad` of a slot broke, for its message.
inline const char *wordRule(int bad) {
  return bad < kDrawWords      ? kWordsRule
         : bad < kEntriesStart ? kPenaltiesRule
                               : kEntryRule;
}

KILN_DRAW_FN double wordsDouble(const int32_t *w) {
  const uint64_t u = uint64_t(uint32_t(w[0])) | uint64_t(uint32_t(w[1])) << 32;
  double x;
  memcpy(&x, &u, sizeof x);
  return x;
}
KILN_DRAW_FN void doubleWords(double x, int32_t *w) {
  uint64_t u;
  memcpy(&u, &x, sizeof u);
  w[0] = int32_t(uint32_t(u));
  w[1] = int32_t(uint32_t(u >> 32));
}

/// The adjusting form's penalties (words [8, 16) of `words`), or false with
/// `bad` the first bad word.
KILN_DRAW_FN bool readPenalties(const int32_t *words, Penalties &penalties,
                                int &bad) {
  const double r = wordsDouble(words + 8), f = wordsDouble(words + 10),
               p = wordsDouble(words + 12);
  // x - x is 0 for a finite x only (NaN and infinities give NaN); the
  // repeat penalty is applied as a float (adjustLogit).
  const float rf = float(r);
  if (!(rf > 0.0f) || rf - rf != 0.0f) {
    bad = 8;
    return false;
  }
  if (f - f != 0) {
    bad = 10;
    return false;
  }
  if (p - p != 0) {
    bad = 12;
    return false;
  }
  if (words[14] != 0 || words[15] != 0) {
    bad = words[14] != 0 ? 14 : 15;
    return false;
  }
  penalties = {r, f, p};
  return true;
}

/// Entry `i`'s words, or false with `bad` the first bad word: an id
/// within [0, vocab) and above the previous entry's, a finite bias, a
/// count of at least 0.
KILN_DRAW_FN bool readEntry(const int32_t *words, int i, int64_t vocab,
                            Adjustment &entry, int &bad) {
  const int at = kEntriesStart + kEntryWords * i;
  const int32_t id = words[at];
  if (id < 0 || id >= vocab || (i > 0 && id <= words[at - kEntryWords])) {
    bad = at;
    return false;
  }
  const float bias = bitsFloat(uint32_t(words[at + 1]));
  if (bias - bias != 0.0f) {
    bad = at + 1;
    return false;
  }
  if (words[at + 2] < 0) {
    bad = at + 2;
    return false;
  }
  entry = {id, bias, words[at + 2]};
  return true;
}

/// Token logit `l` adjusted: its bias added, then, for a recent token, the
/// repeat penalty (as a float, llama.cpp's: a positive logit divided by it,
/// any other multiplied, once however often it occurred) and the additive
/// penalties (in double, as OpenAI states them). No double division: on
/// some GPUs its slow path needs a stack frame.
KILN_DRAW_FN float adjustLogit(float l, float bias, int32_t count,
                               const Penalties &p) {
  if (floatBits(bias) != 0)
    l = l + bias;
  if (count > 0) {
    if (p.repeat != 1) {
      const float r = float(p.repeat);
      l = l > 0 ? l / r : l * r;
    }
    if (p.frequency != 0 || p.presence != 0)
      l = float(double(l) - p.frequency * double(count) - p.presence);
  }
  return l;
}

/// Writes the adjusting form's words past the eight, and word 6, for
/// `penalties` and `n` entries (words: the form's `count`, n at most its
/// capacity; the rest of them 0).
inline void writeAdjustments(int32_t *words, int count,
                             const Penalties &penalties,
                             const Adjustment *entries, size_t n) {
  std::fill(words + kDrawWords, words + count, 0);
  words[6] = int32_t(n);
  doubleWords(penalties.repeat, words + 8);
  doubleWords(penalties.frequency, words + 10);
  doubleWords(penalties.presence, words + 12);
  for (size_t i = 0; i < n; ++i) {
    int32_t *e = words + kEntriesStart + kEntryWords * i;
    e[0] = entries[i].id;
    e[1] = int32_t(floatBits(entries[i].bias));
    e[2] = entries[i].count;
  }
}

/// Whether the adjusting form's words (`count` of them) are valid: the
/// eight (readWords), the penalties and every entry against `vocab`; the
/// penalties into `penalties`, or false with `bad` the first bad word.
inline bool readAdjustments(const int32_t *words, int count, int64_t vocab,
                            Penalties &penalties, int &bad) {
  DrawParams params;
  Adjustment entry;
  if (!readWords(words, count, params, bad) ||
      !readPenalties(words, penalties, bad))
    return false;
  for (int i = 0; i < words[6]; ++i)
    if (!readEntry(words, i, vocab, entry, bad))
      return false;
  return true;
}

/// y[0, n) = x[0, n) adjusted by the adjusting form's words (`count` of
/// them, checked: readAdjustments against `vocab`), x being tokens base ..
/// base + n of the vocabulary. False with `bad` the first bad word.
inline bool adjustPart(const int32_t *words, int count, int64_t vocab,
                       const float *x, int64_t n, int64_t base, float *y,
                       int &bad) {
  Penalties penalties;
  if (!readAdjustments(words, count, vocab, penalties, bad))
    return false;
  Adjustment entry;
  std::copy(x, x + n, y);
  for (int i = 0; i < words[6]; ++i) {
    readEntry(words, i, vocab, entry, bad);
    if (entry.id >= base && entry.id - base < n)
      y[entry.id - base] =
          adjustLogit(y[entry.id - base], entry.bias, entry.count, penalties);
  }
  return true;
}

/// The draw `params` make (a temperature above 0) from a vocabulary held
/// whole, x[0, n), on the host: the keys' argmax, within the cut where
/// there is one (nucleusDraw, with the calling thread's scratch). n > 0.
inline int64_t drawWhole(const float *x, int64_t n, const DrawParams &params,
                         uint32_t position, float &key) {
  const float scale = 1.0f / params.temperature;
  if (!params.cuts())
    return bestKey(x, n, 0, scale, params.seed, position, key);
  thread_local std::vector<uint32_t> bits, places;
  return nucleusDraw(x, n, scale, params.topP, params.seed, position, key, bits,
                     places, floatBits(params.minP), params.topK);
}

} // namespace kiln::draw

#undef KILN_DRAW_FN

#endif // KILN_SUPPORT_DRAWKEY_H
