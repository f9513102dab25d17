"""DrawKey.h's keys in numpy float32, written from the header's definition
(each operation one IEEE float32 operation rounded to nearest, as the C++
and CUDA code is built): the reference test_draw.py (CPU backend) and
test_cuda_backend.py (CUDA backend) compare the drawn tokens with. numpy
only, so it runs on a GPU host without pytest."""
import numpy as np

F = np.float32


def draw_bits(seed, position, token):
    """DrawKey.h drawBits, in uint64 arithmetic (wrapping like C++'s)."""
    m = np.uint64
    with np.errstate(over="ignore"):
        z = m(seed) + m(0x9e3779b97f4a7c15) * m(position + 1)
        z = z ^ (token.astype(m) * m(0xd1b54a32d192ed03))
        z = (z ^ (z >> m(30))) * m(0xbf58476d1ce4e5b9)
        z = (z ^ (z >> m(27))) * m(0x94d049bb133111eb)
        return ((z ^ (z >> m(31))) >> m(32)).astype(np.uint32)


def draw_log(x):
    """DrawKey.h drawLog: x = 2^e m, ln m by atanh's series, in float32."""
    b = x.view(np.uint32)
    e = (b >> np.uint32(23)).astype(np.int32) - 127
    m = ((b & np.uint32(0x7fffff)) | np.uint32(0x3f800000)).view(F)
    big = m > F(1.41421354)
    m = np.where(big, m * F(0.5), m)
    e = e + big.astype(np.int32)
    s = (m - F(1)) / (m + F(1))
    z = s * s
    q = F(2) / F(9)
    q = F(2) / F(7) + z * q
    q = F(2) / F(5) + z * q
    q = F(2) / F(3) + z * q
    lnm = s * F(2) + (s * z) * q
    ef = e.astype(F)
    return ef * F(0.693145751953125) + (lnm + ef * F(1.42860677e-6))


def keys(logits, temperature, seed, position):
    """Every token's key at `position` (DrawKey.h drawKey)."""
    bits = draw_bits(seed, position, np.arange(len(logits), dtype=np.uint64))
    u = (((bits >> np.uint32(9)) << np.uint32(1)) | np.uint32(1)).astype(F) \
        * F(2.0 ** -24)
    g = -draw_log(-draw_log(u))
    scale = F(1) / F(temperature)
    return logits.astype(F) * scale + g


def exp_non_positive(x):
    """DrawKey.h expNonPositive: e^x for x <= 0 in float32 (k ln 2 + r, a
    Taylor polynomial in r, 2^k from exponent bits); 0 below -87 and for
    NaN."""
    inside = x > F(-87)
    c = np.where(inside, x, F(-87)).astype(F)
    k = (c * F(1.44269504) - F(0.5)).astype(np.int32)  # truncation, as C++
    kf = k.astype(F)
    r = (c - kf * F(0.693359375)) + kf * F(2.12194440e-4)
    p = F(1) / F(720)
    for coefficient in (F(1) / F(120), F(1) / F(24), F(1) / F(6), F(0.5),
                        F(1), F(1)):
        p = p * r + coefficient
    two_k = ((k + 127).astype(np.uint32) << np.uint32(23)).view(F)
    return np.where(inside, p * two_k, F(0)).astype(F)


def nucleus(logits, temperature, top_p=None, min_p=None, top_k=None):
    """The tokens DrawKey.h's cut keeps, as a boolean mask, by its
    definition (not the header's radix passes): each weight's mass its
    float32 weight times 2^40 truncated, none below the floor (min-p's
    weight, raised to the k-th largest weight for a top-k below the
    vocabulary's size); the cut the largest weight whose tokens at or above
    it hold ceil(p x total) (at most the total), or the floor alone without
    a top-p."""
    x = logits.astype(F)
    top = F(np.max(np.where(np.isnan(x), F(-np.inf), x)))
    with np.errstate(invalid="ignore"):
        w = exp_non_positive((x - top) * (F(1) / F(temperature)))
    bits = w.view(np.uint32)
    floor = np.uint32(F(min_p).view(np.uint32)) if min_p else np.uint32(0)
    if top_k and top_k < len(x):
        floor = max(floor, np.sort(bits)[::-1][top_k - 1])
    if top_p is None:
        if not np.isfinite(top):
            return np.ones(len(x), dtype=bool)
        return bits >= floor
    mass = np.where(bits >= floor, (w * F(2.0 ** 40)).astype(np.uint64),
                    np.uint64(0))
    total = int(mass.sum(dtype=np.uint64))
    if total == 0:
        return np.ones(len(x), dtype=bool)
    want = min(total, int(np.ceil(np.float64(F(top_p)) * np.float64(total))))
    # Weights largest first; a cut keeps every token of its weight, so it
    # is reached at the last token of a run of equal weights.
    order = np.argsort(-bits.astype(np.int64), kind="stable")
    sorted_bits = bits[order]
    held = np.cumsum(mass[order], dtype=np.uint64)
    ends = np.append(sorted_bits[1:] != sorted_bits[:-1], True)
    reached = np.nonzero(ends & (held >= np.uint64(want)))[0]
    if len(reached) == 0:
        return np.ones(len(x), dtype=bool)
    return bits >= sorted_bits[reached[0]]


def draw(logits, temperature, seed, position, top_p=None, min_p=None,
         top_k=None):
    """The token the step's draw picks: the largest key, within the cut
    where top_p, min_p or top_k is given."""
    k = keys(logits, temperature, seed, position)
    if top_p is not None or min_p is not None or top_k is not None:
        k = np.where(nucleus(logits, temperature, top_p, min_p, top_k), k,
                     F(-np.inf))
    return int(np.argmax(k))


def adjust(logits, history, repeat=1.0, frequency=0.0, presence=0.0,
           bias=None, window=64):
    """The logits adjusted as the step's adjusting form states it
    (DrawKey.h): each biased token's biases (a list of (id, bias), summed
    in float32 in the order given) added first; then each token among the
    last `window` of `history`, by its count c there: a positive logit
    divided by the repeat penalty, any other multiplied (in float32, as
    llama.cpp), then less frequency * c and presence (float64, rounded)."""
    out = np.array(logits, dtype=F)
    total = {}
    for token, b in bias or ():
        total[token] = F(total[token] + F(b)) if token in total else F(b)
    for token, b in total.items():
        if b != 0 or np.signbit(b):
            out[token] = F(out[token] + b)
    if repeat != 1 or frequency != 0 or presence != 0:
        recent = list(history)[-window:] if window > 0 else []
        for token in sorted(set(recent)):
            c = recent.count(token)
            v = out[token]
            if repeat != 1:
                v = F(v / F(repeat)) if v > 0 else F(v * F(repeat))
            if frequency != 0 or presence != 0:
                v = F(np.float64(v) - frequency * c - presence)
            out[token] = v
    return out


def choice(logits, temperature, seed, position, top_p=None, min_p=None,
           top_k=None):
    """The step's choice: the argmax at temperature 0 (ties to the lowest
    id, as numpy's), else its draw."""
    if temperature == 0:
        return int(np.argmax(logits))
    return draw(logits, temperature, seed, position, top_p, min_p, top_k)
