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
