"""kiln-compile --fold-router (kiln-fold-router, off by default) moves each
MoE layer's router dots before the attention's all-reduce: each rank's
router_partial share rides in the all-reduce, which divides the reduced
logits by its rms, and moe_choose makes the choice after it.

The folded logits are the unfolded ones in real arithmetic, not in f32: the
router's dots are summed per rank and then over the ranks, in another order.
The CPU backend's teacher-forced logits with and without the fold must agree
within TOL relative (max |a - b| / max |b| per position), f32 rounding of
reordered sums through a few layers (measured about 1.6e-6 on both presets),
and pick the same token wherever the unfolded top-1 minus top-2 gap,
relative to max |logit|, exceeds twice TOL (GLM5.md section 7: a closer
pair may flip). Caches are f32: an f16 cache rounds an entry lying near an
f16 boundary differently after any f32 change, which turns this rounding
noise into up to 1e-4 (test_cpu_reference.py says why).

Tiny (8 heads) and small (16 heads) presets at tp 2 and 4; the folded tiny
model also against the float64 reference (glm5_reference.py) as
test_tensor_parallel.py checks the unfolded one."""
import numpy as np
import pytest

from conftest import PRESET_SEED, run_tool
from glm5_reference import GLM5Reference

SEED = PRESET_SEED
TOKENS = "3,14,159,265,358,979,5,8,97,932,384,626"
TOL = 1e-4
CONTEXT = 32


def step_ops(gguf, tp, flags):
    """The op names of the step kiln-compile emits."""
    step = run_tool("kiln-compile", gguf, "--emit=step", "--tp", tp,
                    *flags).stdout
    return [line.split()[0] for line in step.splitlines()
            if line.strip().startswith("step.")]


def teacher_forced(gguf, tmp_path, tp, flags, name, tokens=TOKENS):
    art = tmp_path / f"{name}.kiln"
    run_tool("kiln-compile", gguf, "--target=cpu", "--context", CONTEXT,
             "--cache-type", "f32", "--tp", tp, *flags, "-o", art)
    out = tmp_path / f"{name}.npy"
    run_tool("kiln-run", art, "--weights", gguf, "--prompt-tokens", tokens,
             "-n", 0, "--logits-out", out)
    return np.load(out).astype(np.float64)


def relative(a, b):
    return np.max(np.abs(a - b), axis=1) / np.max(np.abs(b), axis=1)


@pytest.mark.parametrize("tp", [2, 4])
def test_folded_step_has_no_router(preset_model, tp):
    preset, gguf = preset_model
    print(f"{preset} seed {SEED} tp {tp}")
    plain = step_ops(gguf, tp, [])
    folded = step_ops(gguf, tp, ["--fold-router"])
    routers = plain.count("step.moe_router")
    assert routers > 0
    assert "step.router_partial" not in plain
    assert "step.moe_router" not in folded
    assert folded.count("step.router_partial") == routers
    assert folded.count("step.moe_choose") == routers


@pytest.mark.parametrize("tp", [2, 4])
def test_folded_logits_match_unfolded(preset_model, tmp_path, tp):
    preset, gguf = preset_model
    print(f"{preset} seed {SEED} tp {tp}")
    plain = teacher_forced(gguf, tmp_path, tp, [], "plain")
    folded = teacher_forced(gguf, tmp_path, tp, ["--fold-router"], "folded")
    assert plain.shape == folded.shape
    assert plain.shape[0] == len(TOKENS.split(","))
    err = relative(folded, plain)
    print(f"  max relative difference {err.max():.2e} at position "
          f"{int(np.argmax(err))}")
    assert err.max() <= TOL
    top2 = np.sort(plain, axis=1)[:, -2:]
    gap = (top2[:, 1] - top2[:, 0]) / np.max(np.abs(plain), axis=1)
    decided = gap > 2 * TOL
    print(f"  {int(decided.sum())} of {len(gap)} positions decided; "
          f"smallest gap {gap.min():.2e}")
    assert np.array_equal(np.argmax(folded, axis=1)[decided],
                          np.argmax(plain, axis=1)[decided])


@pytest.mark.parametrize("tp", [2, 4])
def test_folded_tiny_matches_reference(tmp_path, tp):
    """The folded CPU artifact against the float64 reference, as
    test_tensor_parallel.py holds the unfolded one (its seed 4, f32 mix,
    indexer top-k 8 so that DSA drops tokens, tolerance 2e-5)."""
    seed = 4
    tokens = [int(t) for t in np.random.default_rng(seed).integers(0, 1024,
                                                                   24)]
    print(f"tiny f32 seed {seed} tp {tp}")
    gguf = tmp_path / "f32.gguf"
    run_tool("kiln-gguf", "synth", gguf, "--preset", "tiny", "--seed", seed,
             "--mix", "f32", "--indexer-top-k", 8, "--quiet")
    want, info = GLM5Reference(gguf, cache_dtype=np.float64).run(tokens)
    got = teacher_forced(gguf, tmp_path, tp, ["--fold-router"], "folded",
                         ",".join(map(str, tokens)))
    err = relative(got, want).max()
    print(f"  max relative error {err:.2e} to the reference")
    assert err <= 2e-5, (
        f"smallest decision gap {np.min(info['min_gap']):.2e}")
