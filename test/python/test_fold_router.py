"""kiln-compile --fold-router (kiln-fold-router, off by default) moves each
MoE layer's router dots before the attention's all-reduce: each rank's
router_partial share rides in the all-reduce, which divides the reduced
logits by its rms, and moe_choose makes the choice after it. With
--fold-router=composed the share comes from the attn_output linear itself
(linear_router), through a matrix the backend composes at load from the
gate, the FFN norm and the rank's part of attn_output (common/StepOps.h).
With --fuse-router-choice the all-reduce also makes the choice
(kiln-fuse-router-choice: its `choose` clause; off by default, measured
slower on the GPU); without it moe_choose follows the all-reduce.
The choice inside must give the same bits as moe_choose: the CPU logits
with it and without it are compared bit for bit.

The folded logits are the unfolded ones in real arithmetic, not in f32: the
router's dots are summed per rank and then over the ranks, in another order
(composed: through a matrix made in double and rounded once to f32, then a
dot of K + N/tp terms). The CPU backend's teacher-forced logits with and
without the fold must agree within TOL relative (max |a - b| / max |b| per
position), f32 rounding of reordered sums through a few layers (measured
about 1.6e-6 on both presets for either form), and pick the same token
wherever the unfolded top-1 minus top-2 gap, relative to max |logit|,
exceeds twice TOL (GLM5.md section 7: a closer pair may flip). Caches are
f32: an f16 cache rounds an entry lying near an f16 boundary differently
after any f32 change, which turns this rounding noise into up to 1e-4
(test_cpu_reference.py says why).

Tiny (8 heads) and small (16 heads) presets at tp 2 and 4, both forms; the
folded tiny model also against the float64 reference (glm5_reference.py) as
test_tensor_parallel.py checks the unfolded one; the choice inside against
moe_choose at tp 2."""
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


def logits_f32(gguf, tmp_path, tp, flags, name, tokens=TOKENS):
    """The CPU backend's teacher-forced logits, as kiln-run writes them."""
    art = tmp_path / f"{name}.kiln"
    run_tool("kiln-compile", gguf, "--target=cpu", "--context", CONTEXT,
             "--cache-type", "f32", "--tp", tp, *flags, "-o", art)
    out = tmp_path / f"{name}.npy"
    run_tool("kiln-run", art, "--weights", gguf, "--prompt-tokens", tokens,
             "-n", 0, "--logits-out", out)
    logits = np.load(out)
    assert logits.dtype == np.float32
    return logits


def teacher_forced(gguf, tmp_path, tp, flags, name, tokens=TOKENS):
    return logits_f32(gguf, tmp_path, tp, flags, name,
                      tokens).astype(np.float64)


def relative(a, b):
    return np.max(np.abs(a - b), axis=1) / np.max(np.abs(b), axis=1)


# The two forms of the fold: the flag and the op that carries the share.
FORMS = {"partial": ("--fold-router", "step.router_partial"),
         "composed": ("--fold-router=composed", "step.linear_router")}


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("tp", [2, 4])
def test_folded_step_has_no_router(preset_model, tp, form):
    preset, gguf = preset_model
    flag, share = FORMS[form]
    print(f"{preset} seed {SEED} tp {tp} {form}")
    plain = step_ops(gguf, tp, [])
    folded = step_ops(gguf, tp, [flag, "--fuse-router-choice"])
    separate = step_ops(gguf, tp, [flag])
    routers = plain.count("step.moe_router")
    assert routers > 0
    for _, op in FORMS.values():
        assert op not in plain
    assert "step.moe_router" not in folded
    assert folded.count(share) == routers
    # The choice is inside the all-reduce with --fuse-router-choice,
    # moe_choose after it without (the default); otherwise the same ops.
    assert "step.moe_choose" not in folded
    assert separate.count("step.moe_choose") == routers
    assert sorted(separate) == sorted(folded + ["step.moe_choose"] * routers)
    other = next(op for _, op in FORMS.values() if op != share)
    assert other not in folded
    if form == "composed":
        # Each MoE layer's attn_output linear became its linear_router.
        assert (folded.count("step.linear") ==
                plain.count("step.linear") - routers)
        # No views: the linear_router writes the whole partial.
        assert folded.count("step.view") == plain.count("step.view")


@pytest.mark.parametrize("form", sorted(FORMS))
def test_choice_inside_all_reduce_has_same_bits(preset_model, tmp_path, form):
    """The all-reduce that makes the choice itself (--fuse-router-choice)
    and the moe_choose after it (the default) are defined as the
    same computation: the logits must be equal bit for bit."""
    preset, gguf = preset_model
    tp = 2
    flag = FORMS[form][0]
    print(f"{preset} seed {SEED} tp {tp} {form}")
    separate = logits_f32(gguf, tmp_path, tp, [flag], "separate")
    inside = logits_f32(gguf, tmp_path, tp, [flag, "--fuse-router-choice"],
                        "inside")
    assert inside.shape == separate.shape
    assert inside.shape[0] == len(TOKENS.split(","))
    assert np.array_equal(inside.view(np.uint32), separate.view(np.uint32))


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("tp", [2, 4])
def test_folded_logits_match_unfolded(preset_model, tmp_path, tp, form):
    preset, gguf = preset_model
    print(f"{preset} seed {SEED} tp {tp} {form}")
    plain = teacher_forced(gguf, tmp_path, tp, [], "plain")
    folded = teacher_forced(gguf, tmp_path, tp, [FORMS[form][0]], "folded")
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


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("tp", [2, 4])
def test_folded_tiny_matches_reference(tmp_path, tp, form):
    """The folded CPU artifact against the float64 reference, as
    test_tensor_parallel.py holds the unfolded one (its seed 4, f32 mix,
    indexer top-k 8 so that DSA drops tokens, tolerance 2e-5)."""
    seed = 4
    tokens = [int(t) for t in np.random.default_rng(seed).integers(0, 1024,
                                                                   24)]
    print(f"tiny f32 seed {seed} tp {tp} {form}")
    gguf = tmp_path / "f32.gguf"
    run_tool("kiln-gguf", "synth", gguf, "--preset", "tiny", "--seed", seed,
             "--mix", "f32", "--indexer-top-k", 8, "--quiet")
    want, info = GLM5Reference(gguf, cache_dtype=np.float64).run(tokens)
    got = teacher_forced(gguf, tmp_path, tp, [FORMS[form][0]], "folded",
                         ",".join(map(str, tokens)))
    err = relative(got, want).max()
    print(f"  max relative error {err:.2e} to the reference")
    assert err <= 2e-5, (
        f"smallest decision gap {np.min(info['min_gap']):.2e}")


@pytest.mark.parametrize("value", ["both", "true", "composed,partial"])
def test_bad_fold_router_value_is_refused(preset_model, tmp_path, value):
    """Any value but partial and composed is an error naming the flag and
    the values it takes, before any work."""
    _, gguf = preset_model
    out = run_tool("kiln-compile", gguf, "--tp", 2, f"--fold-router={value}",
                   "--emit=step", "-o", tmp_path / "x.mlir", check=False)
    assert out.returncode == 2
    assert (f"--fold-router={value}: expected 'partial' (the same as a bare "
            "--fold-router) or 'composed'") in out.stderr
    assert not (tmp_path / "x.mlir").exists()
