"""kiln-split-projections cuts GLM-5's attn_q_b, whose 256 rows a head are
read as 192 without position (by attn_k_b) and 64 with it (by the rope), into
one projection per slice: each weight handle holds its rows of every head
(gathered at load), fuse-projections puts the two back into one mat-vec, and
the slices become views. Every output row is the same dot product as before,
so the CPU backend's teacher-forced logits with and without the pass must be
bit-identical; the pass must have run (no step.slice left, the cut bindings
in the artifact) for the comparison to compare two programs."""
import numpy as np
import pytest

from conftest import cpu_logits, run_tool, step_program

SEED = 53
TOKENS = "3,14,159,265,358,979,323,846,264,338,327,950"


@pytest.mark.parametrize("mix,tp", [("tiny", 1), ("tiny", 2),
                                    ("ud-q4_k_xl", 1)])
def test_split_equals_sliced(tmp_path, mix, tp):
    print(f"seed {SEED}")
    gguf = tmp_path / "m.gguf"
    run_tool("kiln-gguf", "synth", gguf, "--preset", "tiny", "--mix", mix,
             "--seed", SEED, "--quiet")
    common = ["--context", 32, "--tp", tp]
    split = step_program(tmp_path, gguf, "split", *common)
    sliced = step_program(tmp_path, gguf, "sliced", *common,
                       "--split-projections=false")
    # Two different programs: the slice copies gone, q_b's two cuts bound.
    assert "step.slice" not in split
    slices = sliced.count("step.slice")
    assert slices > 0
    cuts = [line for line in split.splitlines()
            if "= step.weight" in line and "rows = " in line]
    assert len(cuts) > 0 and len(cuts) % 2 == 0
    assert sum("rows = 0 to " in line for line in cuts) == len(cuts) // 2
    assert not any(" to " in line for line in sliced.splitlines()
                   if "= step.weight" in line)

    logits = {name: cpu_logits(tmp_path, gguf, name, TOKENS, *common, *flags)
              for name, flags in (("split", []),
                                  ("sliced", ["--split-projections=false"]))}
    assert logits["split"].shape[0] == len(TOKENS.split(","))
    assert np.array_equal(logits["split"], logits["sliced"])
    # The describe names the cut bindings.
    described = run_tool("kiln-run", tmp_path / "split.kiln", "--describe")
    assert "rows [0, " in described.stdout
