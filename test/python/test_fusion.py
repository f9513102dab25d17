"""Fusion must not change numerics: the CPU backend computes each output row
of a fused projection with the same row kernel as the separate projection,
so teacher-forced logits with and without --no-fuse are bit-identical (and
test_cpu_reference.py checks the fused default against the float64
reference)."""
import numpy as np
import pytest

from conftest import run_tool

SEED = 31
TOKENS = "3,14,159,265,358,979,323,846,264,338,327,950"


@pytest.mark.parametrize("layout,tp", [([], 1), (["--fused-gate-up"], 1),
                                       ([], 2), ([], 8)],
                         ids=["separate-experts", "fused-gate-up-file",
                              "tp2", "tp8"])
def test_fused_equals_unfused(tmp_path, layout, tp):
    """At tp > 1 this also covers all_reduce + add + norm as one op."""
    print(f"seed {SEED}")
    gguf = tmp_path / "m.gguf"
    run_tool("kiln-gguf", "synth", gguf, "--preset", "tiny", "--seed", SEED,
             "--indexer-top-k", 4, "--quiet", *layout)
    logits = {}
    for name, flags in (("fused", []), ("unfused", ["--no-fuse"])):
        art = tmp_path / f"{name}.kiln"
        run_tool("kiln-compile", gguf, "--target=cpu", "--context", 16,
                 "--tp", tp, *flags, "-o", art)
        out = tmp_path / f"{name}.npy"
        run_tool("kiln-run", art, "--weights", gguf, "--prompt-tokens", TOKENS,
                 "-n", 0, "--logits-out", out)
        logits[name] = np.load(out)
    assert logits["fused"].shape == (12, 1024)
    assert np.array_equal(logits["fused"], logits["unfused"])
