"""A plain temperature is drawn by the step's own argmax (DrawKey.h): no
logits cross to the host. Every drawn token must be the argmax of the keys
that a numpy float32 implementation of DrawKey.h's definition makes from the
logits of the position that drew it: the same bits, since every operation is
one IEEE float32 operation rounded to nearest on both sides. That the keys'
argmax is a draw from softmax(logits / T) is checked in DrawKeyTest.cpp
(chi-square against the softmax)."""
import json

import numpy as np
import pytest

from conftest import run_tool
from draw_reference import F, keys

SEED = 33


def test_reference_keys_follow_the_softmax():
    """The reference itself: its draws from fixed logits over 40,000
    positions against the softmax (chi-square, 4 degrees; P(> 23.5) is 1e-4)."""
    logits = np.array([0.5, -1.0, 1.5, 0.0, 1.0], dtype=F)
    t = 0.8
    counts = np.zeros(5)
    for p in range(40000):
        counts[int(np.argmax(keys(logits, t, 77, p)))] += 1
    prob = np.exp(logits / t) / np.exp(logits / t).sum()
    chi = (((counts - 40000 * prob) ** 2) / (40000 * prob)).sum()
    assert chi < 23.5, (counts, prob)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("draw")
    gguf = d / "tiny.gguf"
    run_tool("kiln-gguf", "synth", gguf, "--preset", "tiny", "--seed", SEED,
             "--quiet")
    arts = {}
    for name, extra in (("tp1", ()), ("tp2", ("--tp", 2)),
                        ("bare", ("--no-logits",))):
        arts[name] = d / f"{name}.kiln"
        run_tool("kiln-compile", gguf, "--target=cpu", "--context", 64,
                 *extra, "-o", arts[name])
    return d, gguf, arts


PROMPT = "3,1,4,1,5"


def drawn(art, gguf, temperature, seed, n=16, logits=None):
    args = ["kiln-run", art, "--weights", gguf, "--prompt-tokens", PROMPT,
            "-n", n, "--ignore-eos", "--json", "--temperature", temperature,
            "--seed", seed]
    if logits:
        args += ["--logits-out", logits]
    out = json.loads(run_tool(*args).stdout)
    assert out["chooser"] == "step_draw", out
    return out["tokens"]


@pytest.mark.parametrize("name", ["tp1", "tp2"])
@pytest.mark.parametrize("temperature,seed", [(0.8, 5), (1.7, 2 ** 40 + 9)])
def test_each_token_is_the_reference_draw(files, tmp_path, name, temperature,
                                          seed):
    """Token i was drawn at position len(prompt) - 1 + i from that
    position's logits (tp=2: two ranks' best keys, the keys made from each
    token's index in the whole vocabulary)."""
    _, gguf, arts = files
    out = tmp_path / "logits.npy"
    tokens = drawn(arts[name], gguf, temperature, seed, logits=out)
    logits = np.load(out)
    prompt = len(PROMPT.split(","))
    assert logits.shape[0] == prompt + len(tokens) - 1
    print(f"seed {seed}, T {temperature}: {tokens}")
    for i, token in enumerate(tokens):
        p = prompt - 1 + i
        assert token == int(np.argmax(keys(logits[p], temperature, seed, p))), i
    # A draw, not the argmax: at these temperatures the tiny model's flat
    # logits give other tokens.
    greedy = [int(np.argmax(logits[prompt - 1 + i])) for i in range(len(tokens))]
    assert tokens != greedy


def test_seeds_and_artifacts(files):
    """The same seed draws the same tokens, another seed others; an
    artifact without logits draws the same tokens (its step draws them)."""
    _, gguf, arts = files
    a = drawn(arts["tp1"], gguf, 1.0, 12)
    assert drawn(arts["tp1"], gguf, 1.0, 12) == a
    assert drawn(arts["tp1"], gguf, 1.0, 13) != a
    assert drawn(arts["bare"], gguf, 1.0, 12) == a
    described = run_tool("kiln-run", arts["bare"], "--describe").stdout
    assert ("inputs: token (4 bytes), position (4 bytes), sampling (16 "
            "bytes); outputs: next_token (4 bytes)\n") in described


def test_cuts_still_need_the_logits(files):
    """A cut of the vocabulary is the host's Sampler's: refused without
    logits, by name."""
    _, gguf, arts = files
    proc = run_tool("kiln-run", arts["bare"], "--weights", gguf,
                    "--prompt-tokens", PROMPT, "-n", 4, "--temperature", 1,
                    "--top-k", 5, check=False)
    assert proc.returncode == 1
    assert "greedy decoding or a plain temperature only" in proc.stderr
    out = json.loads(run_tool("kiln-run", arts["tp1"], "--weights", gguf,
                              "--prompt-tokens", PROMPT, "-n", 4, "--json",
                              "--temperature", 1, "--top-k", 5).stdout)
    assert out["chooser"] == "host"
    out = json.loads(run_tool("kiln-run", arts["tp1"], "--weights", gguf,
                              "--prompt-tokens", PROMPT, "-n", 4,
                              "--json").stdout)
    assert out["chooser"] == "step_argmax"
