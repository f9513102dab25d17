//===- ScaleFit.cpp - Scale searches of the quantisers --------------------===//
//
// Plain candidate searches with least-squares refinement: a handful of
// starting scales, the levels each one picks, the scale (and offset) that
// minimise the squared error for those levels, and the best of them. Not
// llama.cpp's (importance-weighted) search, but deterministic, simple and
// within a few percent of it in RMS error. Sums are in double so that the
// choice does not hinge on float32 summation order.
//
//===----------------------------------------------------------------------===//
#include "quant/BlockCodecs.h"

#include <cmath>
#include <initializer_list>
#include <limits>

namespace kiln::codecs {

int roundClamp(float v, int lo, int hi) {
  if (!(v >= static_cast<float>(lo))) // Also catches NaN.
    return lo;
  if (v > static_cast<float>(hi))
    return hi;
  return static_cast<int>(std::lround(v));
}

uint16_t finiteHalf(float v) {
  constexpr float kMaxHalf = 65504.0f;
  return floatToHalf(std::fmin(std::fmax(v, -kMaxHalf), kMaxHalf));
}

namespace {
/// The value of largest magnitude (with its sign); the first one on a tie.
float signedMaxAbs(const float *x, int n) {
  float best = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > std::fabs(best))
      best = x[i];
  return best;
}

double sumSquares(const float *x, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i)
    s += static_cast<double>(x[i]) * x[i];
  return s;
}

/// Squared error of x ~ scale * q + offset with q rounded and clamped.
double affineError(const float *x, int n, int qmax, float scale, float offset) {
  double err = 0;
  for (int i = 0; i < n; ++i) {
    int q = scale != 0 ? roundClamp((x[i] - offset) / scale, 0, qmax) : 0;
    double e =
        static_cast<double>(x[i]) - (static_cast<double>(scale) * q + offset);
    err += e * e;
  }
  return err;
}
} // namespace

float fitSymmetric(const float *x, int n, int qmin, int qmax) {
  float xmax = signedMaxAbs(x, n);
  if (xmax == 0)
    return 0;
  double sxx = sumSquares(x, n);
  double bestErr = std::numeric_limits<double>::infinity();
  float best = xmax / static_cast<float>(qmax);
  // Put the largest value on (or a little either side of) the most negative
  // level, which is the widest one, or on the most positive.
  for (int edge : {qmin, qmax}) {
    for (int k = -5; k <= 10; ++k) {
      float s =
          xmax / (static_cast<float>(edge) + 0.1f * static_cast<float>(k));
      double sxq = 0, sqq = 0;
      for (int i = 0; i < n; ++i) {
        int q = roundClamp(x[i] / s, qmin, qmax);
        sxq += static_cast<double>(x[i]) * q;
        sqq += static_cast<double>(q) * q;
      }
      if (sqq == 0)
        continue;
      double err = sxx - sxq * sxq / sqq; // Error at the least-squares scale.
      if (err < bestErr) {
        bestErr = err;
        best = static_cast<float>(sxq / sqq);
      }
    }
  }
  return best;
}

AffineFit fitAffine(const float *x, int n, int qmax, bool offsetAtMostZero) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::fmin(lo, x[i]);
    hi = std::fmax(hi, x[i]);
  }
  if (offsetAtMostZero)
    lo = std::fmin(lo, 0.0f);
  if (hi == lo) // Constant block: the offset alone represents it exactly.
    return {0, lo};
  AffineFit best = {(hi - lo) / static_cast<float>(qmax), lo};
  double bestErr = affineError(x, n, qmax, best.scale, best.offset);
  for (int k = -5; k <= 10; ++k) {
    AffineFit cand = {(hi - lo) / (static_cast<float>(qmax) + 0.1f * k), lo};
    // Alternate: round against the current fit, then solve the 2x2 normal
    // equations of min sum (scale*q + offset - x)^2 for those levels.
    for (int iter = 0; iter < 2; ++iter) {
      double sq = 0, sqq = 0, sx = 0, sxq = 0;
      for (int i = 0; i < n; ++i) {
        int q = roundClamp((x[i] - cand.offset) / cand.scale, 0, qmax);
        sq += q;
        sqq += static_cast<double>(q) * q;
        sx += x[i];
        sxq += static_cast<double>(x[i]) * q;
      }
      double det = n * sqq - sq * sq;
      if (det <= 0)
        break;
      double scale = (n * sxq - sq * sx) / det;
      double offset = (sx - scale * sq) / n;
      if (offsetAtMostZero && offset > 0) {
        offset = 0;
        scale = sxq / sqq;
      }
      if (!(scale > 0))
        break;
      cand = {static_cast<float>(scale), static_cast<float>(offset)};
      double err = affineError(x, n, qmax, cand.scale, cand.offset);
      if (err < bestErr) {
        bestErr = err;
        best = cand;
      }
    }
  }
  return best;
}

uint16_t fitSuperScale(const float *s, int n, int lmin, int lmax) {
  float maxAbs = 0;
  for (int j = 0; j < n; ++j)
    maxAbs = std::fmax(maxAbs, std::fabs(s[j]));
  uint16_t best = finiteHalf(maxAbs / static_cast<float>(lmax));
  double bestErr = std::numeric_limits<double>::infinity();
  for (int k = lmax; k >= lmax / 2; --k) {
    uint16_t dh = finiteHalf(maxAbs / static_cast<float>(k));
    float d = halfToFloat(dh);
    if (d == 0)
      break; // Smaller k only gives a larger d; zero means all s are zero.
    double err = 0;
    for (int j = 0; j < n; ++j) {
      double e =
          s[j] - static_cast<double>(d) * roundClamp(s[j] / d, lmin, lmax);
      err += e * e;
    }
    if (err < bestErr) { // Ties keep the larger k: finer integer scales.
      bestErr = err;
      best = dh;
    }
  }
  return best;
}

int nearestIQ4Level(float v) {
  int best = 0;
  float bestDist = std::fabs(v - kIQ4Levels[0]);
  for (int k = 1; k < 16; ++k) {
    float dist = std::fabs(v - kIQ4Levels[k]);
    if (dist < bestDist) {
      bestDist = dist;
      best = k;
    }
  }
  return best;
}

float fitIQ4(const float *x, int n) {
  float xmax = signedMaxAbs(x, n);
  if (xmax == 0)
    return 0;
  double sxx = sumSquares(x, n);
  double bestErr = std::numeric_limits<double>::infinity();
  float best = xmax / kIQ4Levels[0];
  // The grid is lopsided (-127..113), so try the largest value on either
  // end, i.e. both signs of the scale.
  for (int edge :
       {static_cast<int>(kIQ4Levels[0]), static_cast<int>(kIQ4Levels[15])}) {
    for (int k = -10; k <= 10; ++k) {
      float s = xmax / static_cast<float>(edge + k);
      double sxg = 0, sgg = 0;
      for (int i = 0; i < n; ++i) {
        double g = kIQ4Levels[nearestIQ4Level(x[i] / s)];
        sxg += x[i] * g;
        sgg += g * g;
      }
      double err = sxx - sxg * sxg / sgg; // sgg > 0: no level is zero.
      if (err < bestErr) {
        bestErr = err;
        best = static_cast<float>(sxg / sgg);
      }
    }
  }
  return best;
}

} // namespace kiln::codecs
