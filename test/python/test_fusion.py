"""Fusion must not change numerics: the CPU backend computes each output row
of a fused projection with the same row kernel as the separate projection,
so teacher-forced logits with and without --no-fuse are bit-identical (and
test_cpu_reference.py checks the fused default against the float64
reference). The tiny model's three MoE layers are each one step.moe_ffn in
the fused program; a second comparison leaves out only that fusion
(kiln-compile's hidden --no-fuse-moe-ffn), so a difference there is that
op's."""
import numpy as np
import pytest

from conftest import run_tool

SEED = 31
TOKENS = "3,14,159,265,358,979,323,846,264,338,327,950"


def compile_and_run(tmp_path, gguf, name, tp, flags):
    """Teacher-forced logits of TOKENS from `gguf` compiled for the CPU with
    `flags`."""
    art = tmp_path / f"{name}.kiln"
    run_tool("kiln-compile", gguf, "--target=cpu", "--context", 16, "--tp", tp,
             *flags, "-o", art)
    out = tmp_path / f"{name}.npy"
    run_tool("kiln-run", art, "--weights", gguf, "--prompt-tokens", TOKENS,
             "-n", 0, "--logits-out", out)
    return np.load(out)


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
    fused = compile_and_run(tmp_path, gguf, "fused", tp, [])
    unfused = compile_and_run(tmp_path, gguf, "unfused", tp, ["--no-fuse"])
    assert fused.shape == (12, 1024)
    assert np.array_equal(fused, unfused)


@pytest.mark.parametrize("layout,tp", [([], 1), (["--fused-gate-up"], 1),
                                       ([], 8)],
                         ids=["separate-experts", "fused-gate-up-file",
                              "tp8"])
def test_moe_ffn_equals_its_four_ops(tmp_path, layout, tp):
    """step.moe_ffn on the CPU runs the router, the shared expert's two
    projections, its swiglu_linear and the experts with the shared output
    as addend, as the four ops it replaces did: the same bits."""
    print(f"seed {SEED}")
    gguf = tmp_path / "m.gguf"
    run_tool("kiln-gguf", "synth", gguf, "--preset", "tiny", "--seed", SEED,
             "--indexer-top-k", 4, "--quiet", *layout)
    kinds = {}
    for name, flags in (("moe_ffn", []), ("four_ops", ["--no-fuse-moe-ffn"])):
        step = run_tool("kiln-compile", gguf, "--emit=step", "--context", 16,
                        "--tp", tp, *flags).stdout
        kinds[name] = {op: step.count(f"step.{op} ")
                       for op in ("moe_ffn", "moe_router", "moe_experts")}
    assert kinds["moe_ffn"] == {"moe_ffn": 3, "moe_router": 0,
                                "moe_experts": 0}, kinds
    assert kinds["four_ops"] == {"moe_ffn": 0, "moe_router": 3,
                                 "moe_experts": 3}, kinds
    fused = compile_and_run(tmp_path, gguf, "moe_ffn", tp, [])
    four = compile_and_run(tmp_path, gguf, "four_ops", tp,
                           ["--no-fuse-moe-ffn"])
    assert fused.shape == (12, 1024)
    assert np.array_equal(fused, four)
