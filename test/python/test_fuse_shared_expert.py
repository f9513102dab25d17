"""kiln-compile moves each MoE layer's shared expert inside its moe_experts
(kiln-fuse-shared-expert; the default, --fuse-shared-expert=false keeps its
own ops). The CPU backend computes
it there with the same kernels as the fused_linear and swiglu_linear it
replaces and adds it last, as the addend was added, so the logits of the
fused and unfused artifacts must be bit-identical, on one rank and on two,
for the tiny and the small preset."""
import numpy as np
import pytest

from conftest import PRESET_SEED, run_tool

SEED = PRESET_SEED
TOKENS = "3,14,159,265,358,979"
GENERATED = 2


@pytest.mark.parametrize("tp", [1, 2])
def test_shared_expert_inside_moe_experts_same_bits(preset_model, tmp_path, tp):
    preset, gguf = preset_model
    print(f"{preset} seed {SEED} tp {tp}")
    def shared_lines(flags):
        step = run_tool("kiln-compile", gguf, "--emit=step", "--tp", tp,
                        *flags).stdout
        return ([line for line in step.splitlines() if "shared(" in line],
                [line for line in step.splitlines()
                 if "step.swiglu_linear" in line and "shexp" in line])

    # Fused by default: every MoE layer's moe_experts holds its shared
    # expert, and no swiglu_linear of it is left; apart, the reverse.
    inside, apart = shared_lines([])
    assert inside and not apart
    assert len(inside) == len(shared_lines(["--fuse-shared-expert=false"])[1])
    assert not shared_lines(["--fuse-shared-expert=false"])[0]

    logits = {}
    for name, flags in (("fused", []),
                        ("unfused", ["--fuse-shared-expert=false"])):
        art = tmp_path / f"{name}.kiln"
        run_tool("kiln-compile", gguf, "--target=cpu", "--context", 16,
                 "--tp", tp, *flags, "-o", art)
        out = tmp_path / f"{name}.npy"
        run_tool("kiln-run", art, "--weights", gguf, "--prompt-tokens", TOKENS,
                 "-n", GENERATED, "--logits-out", out)
        logits[name] = np.load(out)
    prompt = len(TOKENS.split(","))
    assert logits["fused"].shape[0] >= prompt
    assert logits["fused"].shape == logits["unfused"].shape
    assert np.array_equal(logits["fused"], logits["unfused"])
