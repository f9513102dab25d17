"""Fusion must not change numerics: the CPU backend computes each output row
of a fused projection with the same row kernel as the separate projection,
so teacher-forced logits with and without --no-fuse are bit-identical (and
test_cpu_reference.py checks the fused default against the float64
reference)."""
import re

import numpy as np
import pytest

from conftest import run_tool

SEED = 31
TOKENS = "3,14,159,265,358,979,323,846,264,338,327,950"


@pytest.mark.parametrize("layout,tp,top_k", [([], 1, 4),
                                             (["--fused-gate-up"], 1, 4),
                                             ([], 2, 4), ([], 8, 4),
                                             ([], 2, 16), ([], 8, 16)],
                         ids=["separate-experts", "fused-gate-up-file",
                              "tp2", "tp8", "tp2-no-indexers",
                              "tp8-no-indexers"])
def test_fused_equals_unfused(tmp_path, layout, tp, top_k):
    """At tp > 1 this also covers all_reduce + add + norm as one op; where
    the indexers are left out (a top-k of the whole context) the q_a runs
    are Q8_0 alone and the collectives before them take the add alone
    (--projection-norms: all_reduce_add, the norm inside q_a's
    rms_norm_linear), which must give the bits of the collective with the
    norm (the default)."""
    print(f"seed {SEED}")
    gguf = tmp_path / "m.gguf"
    run_tool("kiln-gguf", "synth", gguf, "--preset", "tiny", "--seed", SEED,
             "--indexer-top-k", top_k, "--quiet", *layout)
    runs = [("fused", []), ("unfused", ["--no-fuse"])]
    if top_k >= 16 and tp > 1:
        report = run_tool("kiln-compile", gguf, "--target=cpu", "--context",
                          16, "--tp", tp, "--projection-norms",
                          "--emit=step", "--report", "-o",
                          tmp_path / "step.mlir")
        added = re.search(r"^\s*fused with add\s+(\d+)$",
                          report.stdout + report.stderr, re.MULTILINE)
        assert added and int(added.group(1)) > 0, \
            "no all_reduce_add in the step: the case tests nothing new"
        runs.append(("projection-norms", ["--projection-norms"]))
    logits = {}
    for name, flags in runs:
        art = tmp_path / f"{name}.kiln"
        run_tool("kiln-compile", gguf, "--target=cpu", "--context", 16,
                 "--tp", tp, *flags, "-o", art)
        out = tmp_path / f"{name}.npy"
        run_tool("kiln-run", art, "--weights", gguf, "--prompt-tokens", TOKENS,
                 "-n", 0, "--logits-out", out)
        logits[name] = np.load(out)
    assert logits["fused"].shape == (12, 1024)
    for name in logits:
        assert np.array_equal(logits["fused"], logits[name]), name
