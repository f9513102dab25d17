"""Kiln's block (de)quantisers (utils/quant) against gguf-py.

Dequantisation must equal `gguf.quants.dequantize` bit for bit for every
supported type, on random blocks. Quantisation need not match gguf-py's bits
(different algorithms); instead Kiln's blocks, dequantised by gguf-py, must
equal Kiln's own dequantisation bit for bit (so the blocks are well formed
and both readers agree), and the error on Gaussian data must stay below a
per-type bound.

Random data is seeded; each test prints its seed. Set KILN_QUANT_SEED to
rerun with another base seed.
"""
import os
import zlib

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as QT
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from conftest import run_tool

BASE_SEED = int(os.environ.get("KILN_QUANT_SEED", "20250601"))

DEQUANT_TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                 "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"]

# Byte offsets of each block's fp16 scale fields (GLM5.md section 4 and
# ggml's block structs).
FP16_SCALES = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2],
               "Q8_0": [0], "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2],
               "Q5_K": [0, 2], "Q6_K": [208], "IQ4_NL": [0], "IQ4_XS": [0]}

# Relative RMS error bounds on N(0, 1) data, |x - y|_2 / |x|_2, for Kiln's
# quantisers: the measured values (docs/quant.md) plus about 30% margin.
# They sit near the uniform-quantiser floor (step / sqrt(12)), so a broken
# scale search or a lost level fails, while another seed (16384 values, the
# estimate moves by about 1%) does not.
RMS_BOUNDS = {"F32": 0.0, "F16": 3e-4, "BF16": 2.5e-3, "Q8_0": 0.007,
              "Q6_K": 0.022, "Q5_K": 0.045, "Q5_0": 0.05, "Q5_1": 0.045,
              "Q4_K": 0.09, "IQ4_NL": 0.09, "IQ4_XS": 0.09, "Q4_0": 0.11,
              "Q4_1": 0.09, "Q3_K": 0.19, "Q2_K": 0.34}
QUANT_TYPES = list(RMS_BOUNDS)


def seed_for(*parts):
    seed = BASE_SEED + zlib.crc32("/".join(parts).encode())
    print(f"seed {seed} (base {BASE_SEED}) for {'/'.join(parts)}")
    return seed


def geometry(name):
    return GGML_QUANT_SIZES[QT[name]]


def kiln_dequant(tmp_path, name, raw):
    src, dst = tmp_path / "in.bin", tmp_path / "out.f32"
    src.write_bytes(raw.tobytes())
    run_tool("quant-driver", "dequant", name, src, dst)
    return np.fromfile(dst, dtype=np.float32)


def kiln_quant(tmp_path, name, values):
    src, dst = tmp_path / "in.f32", tmp_path / "out.bin"
    src.write_bytes(np.asarray(values, dtype=np.float32).tobytes())
    run_tool("quant-driver", "quantize", name, src, dst)
    return np.fromfile(dst, dtype=np.uint8)


def assert_same_bits(ours, theirs, what, nan_equal=False):
    """Equal float32 bit patterns; with nan_equal any NaN matches any NaN
    (NaN payloads after arithmetic are not specified by IEEE 754)."""
    assert ours.shape == theirs.shape, what
    same = ours.view(np.uint32) == theirs.view(np.uint32)
    if nan_equal:
        same |= np.isnan(ours) & np.isnan(theirs)
    bad = np.flatnonzero(~same)
    assert bad.size == 0, (
        f"{what}: {bad.size} values differ, first at {bad[0]}: "
        f"kiln {ours[bad[0]]!r} ({ours.view(np.uint32)[bad[0]]:#010x}) vs "
        f"gguf-py {theirs[bad[0]]!r} ({theirs.view(np.uint32)[bad[0]]:#010x})")


def random_blocks(rng, name, n_blocks):
    """Random bytes with every fp16 scale replaced by a finite value of
    sensible magnitude (both signs, some subnormal-ish, some zero)."""
    block_size, type_size = geometry(name)
    if name == "F32":
        return (rng.standard_normal(n_blocks) *
                10.0 ** rng.integers(-30, 30, n_blocks)).astype(np.float32).view(np.uint8)
    if name == "F16":
        h = rng.integers(0, 1 << 16, n_blocks, dtype=np.uint16)
        h[(h & 0x7C00) == 0x7C00] &= 0xBFFF  # inf/NaN exponent -> finite
        return h.view(np.uint8)
    if name == "BF16":
        b = rng.integers(0, 1 << 16, n_blocks, dtype=np.uint16)
        b[(b & 0x7F80) == 0x7F80] &= 0xBFFF
        return b.view(np.uint8)
    raw = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
    for off in FP16_SCALES[name]:
        scale = (rng.standard_normal(n_blocks) *
                 10.0 ** rng.uniform(-6, 2, n_blocks)).astype(np.float16)
        scale[::17] = 0
        raw[:, off:off + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1)


@pytest.mark.parametrize("name", DEQUANT_TYPES)
def test_dequant_matches_gguf_py(tmp_path, name):
    rng = np.random.default_rng(seed_for("dequant", name))
    block_size, _ = geometry(name)
    n_blocks = 4096 if block_size == 1 else max(64, 8192 // block_size)
    raw = random_blocks(rng, name, n_blocks)
    assert_same_bits(kiln_dequant(tmp_path, name, raw),
                     gguf_dequantize(raw, QT[name]).reshape(-1), name)


@pytest.mark.parametrize("name", DEQUANT_TYPES)
def test_dequant_of_random_bytes_matches_gguf_py(tmp_path, name):
    # Every bit pattern, inf and NaN scales included: NaN compares equal to
    # NaN, everything else bit for bit.
    rng = np.random.default_rng(seed_for("dequant-raw", name))
    block_size, type_size = geometry(name)
    n_blocks = 4096 if block_size == 1 else max(64, 8192 // block_size)
    raw = rng.integers(0, 256, n_blocks * type_size, dtype=np.uint8)
    with np.errstate(invalid="ignore", over="ignore"):
        theirs = gguf_dequantize(raw, QT[name]).reshape(-1)
    assert_same_bits(kiln_dequant(tmp_path, name, raw), theirs, name,
                     nan_equal=True)


def test_f16_nan_payloads_kept_like_numpy(tmp_path):
    # Signalling and quiet NaNs with payloads, both signs, plus infinities:
    # numpy keeps the payload, and so must Kiln (bitwise, no NaN leniency).
    h = np.array([0x7C01, 0x7E01, 0xFC01, 0x7D55, 0x7FFF, 0x7C00, 0xFC00,
                  0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF], dtype=np.uint16)
    raw = h.view(np.uint8)
    assert_same_bits(kiln_dequant(tmp_path, "F16", raw),
                     raw.view(np.float16).astype(np.float32), "F16 specials")


def relative_rms(x, y):
    norm = np.sqrt(np.mean(x.astype(np.float64) ** 2))
    err = np.sqrt(np.mean((x.astype(np.float64) - y) ** 2))
    return err / norm if norm else err


def quant_round_trip(tmp_path, name, values):
    """Kiln's blocks for `values`; checks gguf-py reads them exactly as Kiln
    does and that every scale is finite; returns the dequantised values."""
    blocks = kiln_quant(tmp_path, name, values)
    _, type_size = geometry(name)
    assert blocks.size * geometry(name)[0] == values.size * type_size
    ours = kiln_dequant(tmp_path, name, blocks)
    theirs = gguf_dequantize(blocks, QT[name]).reshape(-1)
    assert_same_bits(ours, theirs, f"{name} round trip")
    if name in FP16_SCALES:
        rows = blocks.reshape(-1, type_size)
        for off in FP16_SCALES[name]:
            scales = rows[:, off:off + 2].copy().view(np.float16)
            assert np.isfinite(scales).all(), f"{name}: non-finite scale"
    return ours


@pytest.mark.parametrize("name", QUANT_TYPES)
def test_quantize_gaussian_error_bound(tmp_path, name):
    rng = np.random.default_rng(seed_for("quant-gauss", name))
    x = rng.standard_normal(256 * 64).astype(np.float32)
    y = quant_round_trip(tmp_path, name, x)
    err = relative_rms(x, y)
    print(f"{name}: relative RMS error {err:.5f} (bound {RMS_BOUNDS[name]})")
    assert err <= RMS_BOUNDS[name]


@pytest.mark.parametrize("name", QUANT_TYPES)
def test_quantize_edge_cases(tmp_path, name):
    n = 256 * 4
    zeros = np.zeros(n, np.float32)
    assert (quant_round_trip(tmp_path, name, zeros) == 0).all(), "zeros"

    # A constant block is representable almost exactly by every type (one
    # level times the scale, or the offset); 2% covers fp16 scale rounding
    # and the 6-bit K-quant mins.
    for c in (0.37, -2.5, 1e-3):
        const = np.full(n, c, np.float32)
        y = quant_round_trip(tmp_path, name, const)
        assert np.max(np.abs(y - c)) <= 0.02 * abs(c), f"constant {c}"

    # One huge outlier among Gaussian values: scales stay finite, the
    # outlier itself survives within 2% (it sets the block's scale).
    rng = np.random.default_rng(seed_for("quant-outlier", name))
    x = rng.standard_normal(n).astype(np.float32)
    x[300] = 1000.0
    y = quant_round_trip(tmp_path, name, x)
    assert abs(y[300] - 1000.0) <= 20.0

    # Magnitudes beyond fp16's range must clamp, not become infinite.
    big = (rng.standard_normal(n) * 1e6).astype(np.float32)
    y = quant_round_trip(tmp_path, name, big)
    assert np.isfinite(y).all() or name == "F16"


@pytest.mark.parametrize("name", ["F16", "BF16"])
def test_float_conversion_matches_gguf_py(tmp_path, name):
    # Round-to-nearest-even on every bit pattern class: gguf-py's F16 is
    # numpy's cast, its BF16 is ggml's rounding; Kiln must match both.
    rng = np.random.default_rng(seed_for("float-quant", name))
    x = rng.integers(0, 1 << 32, 1 << 16, dtype=np.uint32).view(np.float32)
    x[:8] = [0.0, -0.0, np.inf, -np.inf, 65504.0, 65520.0, 2.0 ** -25,
             2.0 ** -24 * 1.5]
    blocks = kiln_quant(tmp_path, name, x)
    with np.errstate(over="ignore", invalid="ignore"):
        theirs = np.asarray(gguf_quantize(x, QT[name])).view(np.uint8).reshape(-1)
    assert (blocks == theirs).all(), f"{name} bits differ"


def test_errors(tmp_path):
    raw = tmp_path / "raw.bin"
    raw.write_bytes(bytes(18 * 2))
    proc = run_tool("quant-driver", "dequant", "IQ2_XXS", raw, tmp_path / "o",
                    check=False)
    assert proc.returncode == 1 and "unsupported type IQ2_XXS" in proc.stderr
    # 36 bytes is not a whole number of 144-byte Q4_K blocks.
    proc = run_tool("quant-driver", "dequant", "Q4_K", raw, tmp_path / "o",
                    check=False)
    assert proc.returncode == 1 and "Q4_K:" in proc.stderr
    values = tmp_path / "v.f32"
    x = np.zeros(256, np.float32)
    x[5] = np.nan
    values.write_bytes(x.tobytes())
    proc = run_tool("quant-driver", "quantize", "Q4_K", values, tmp_path / "o",
                    check=False)
    assert proc.returncode == 1 and "value 5 is not finite" in proc.stderr


def test_scales_finite(tmp_path):
    rng = np.random.default_rng(seed_for("scales-finite"))
    raw = random_blocks(rng, "Q4_K", 8).reshape(8, 144)
    path = tmp_path / "b.bin"
    path.write_bytes(raw.tobytes())
    assert run_tool("quant-driver", "scales-finite", "Q4_K", path).stdout == "ok\n"
    raw[5, 2:4] = np.array([np.inf], np.float16).view(np.uint8)  # dmin
    raw[6, 0:2] = np.array([np.nan], np.float16).view(np.uint8)
    path.write_bytes(raw.tobytes())
    assert run_tool("quant-driver", "scales-finite", "Q4_K",
                    path).stdout == "bad block 5\n"
