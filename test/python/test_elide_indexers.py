"""kiln-elide-indexers leaves out a DSA indexer whose cache holds no more
positions than its top-k: at every position the step can run at it selects
0 .. position in order, so MLA attending every position without it reads the
same entries in the same order. The CPU backend's teacher-forced logits with
and without the pass must be bit-identical, and the pass must have run (the
step without indexers or their caches) only where the context allows it."""
import numpy as np
import pytest

from conftest import cpu_logits, run_tool, step_program

SEED = 47
TOP_K = 16
TOKENS = "3,14,159,265,358,979,323,846,264,338,327,950,288,419,716,939"


@pytest.mark.parametrize("tp", [1, 2])
def test_elided_equals_kept(tmp_path, tp):
    print(f"seed {SEED}")
    gguf = tmp_path / "m.gguf"
    run_tool("kiln-gguf", "synth", gguf, "--preset", "tiny", "--seed", SEED,
             "--indexer-top-k", TOP_K, "--quiet")
    common = ["--context", TOP_K, "--tp", tp]
    elided = step_program(tmp_path, gguf, "elided", *common)
    kept = step_program(tmp_path, gguf, "kept", *common, "--elide-indexers=false")
    # Proof that the comparison below compares two different programs.
    assert "step.dsa_indexer" not in elided and "index_cache" not in elided
    indexers = kept.count("step.dsa_indexer")
    assert indexers > 0
    # One position more and the indexers choose: they stay.
    more = step_program(tmp_path, gguf, "more", "--context", TOP_K + 1, "--tp", tp)
    assert more.count("step.dsa_indexer") == indexers

    # Every position the caches hold, the last at top_k - 1.
    logits = {name: cpu_logits(tmp_path, gguf, name, TOKENS, *common, *flags)
              for name, flags in (("elided", []),
                                  ("kept", ["--elide-indexers=false"]))}
    assert logits["elided"].shape == (TOP_K, 1024)
    assert np.array_equal(logits["elided"], logits["kept"])
