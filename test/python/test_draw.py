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
from draw_reference import F, adjust, choice, draw, keys, nucleus

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


def drawn(art, gguf, temperature, seed, n=16, logits=None, top_p=None,
          min_p=None, top_k=None):
    args = ["kiln-run", art, "--weights", gguf, "--prompt-tokens", PROMPT,
            "-n", n, "--ignore-eos", "--json", "--temperature", temperature,
            "--seed", seed]
    if top_p is not None:
        args += ["--top-p", top_p]
    if min_p is not None:
        args += ["--min-p", min_p]
    if top_k is not None:
        args += ["--top-k", top_k]
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


@pytest.mark.parametrize("name", ["tp1", "tp2"])
@pytest.mark.parametrize("temperature,top_p,min_p,top_k,seed",
                         [(1.0, 0.9, None, None, 7),
                          (0.7, 0.3, None, None, 2 ** 33 + 1),
                          (1.0, None, 0.6, None, 8),
                          (1.3, 0.8, 0.5, None, 9),
                          (1.5, None, None, 5, 10),
                          (1.2, 0.95, None, 20, 11),
                          (1.4, None, 0.2, 50, 12)])
def test_each_token_is_the_reference_nucleus_draw(files, tmp_path, name,
                                                  temperature, top_p, min_p,
                                                  top_k, seed):
    """With --top-p (word 3), --top-k (word 4) and --min-p (word 5) the
    step cuts the vocabulary first: token i is the reference's draw within
    the cut of that position's logits (tp=2: the ranks' parts gathered, the
    cut and the draw the whole's). The cut must matter: some of the plain
    keys' draws fall outside it."""
    _, gguf, arts = files
    out = tmp_path / "logits.npy"
    tokens = drawn(arts[name], gguf, temperature, seed, logits=out,
                   top_p=top_p, min_p=min_p, top_k=top_k)
    logits = np.load(out)
    prompt = len(PROMPT.split(","))
    print(f"seed {seed}, T {temperature}, top-p {top_p}, min-p {min_p}, "
          f"top-k {top_k}: {tokens}")
    outside = 0
    for i, token in enumerate(tokens):
        p = prompt - 1 + i
        assert token == draw(logits[p], temperature, seed, p, top_p,
                             min_p, top_k), i
        kept = nucleus(logits[p], temperature, top_p, min_p, top_k)
        assert kept[token]
        outside += not kept[draw(logits[p], temperature, seed, p)]
    assert outside > 0


def test_reference_nucleus_holds_its_share():
    """The reference's nucleus by its definition: the smallest set of the
    heaviest tokens with at least p of the softmax's mass (no ties here),
    checked in double on seeded logits; its draws never leave it."""
    rng = np.random.default_rng(SEED)
    for top_p in (0.2, 0.5, 0.9, 0.99):
        logits = rng.normal(0, 2, 5000).astype(F)
        kept = nucleus(logits, 1.0, top_p)
        w = np.exp(logits.astype(np.float64) - logits.max())
        share = w[kept].sum() / w.sum()
        lightest = w[kept].min()
        assert share >= top_p - 1e-6, (top_p, share)
        assert share - lightest / w.sum() < top_p + 1e-6, (top_p, share)
        for position in range(50):
            assert kept[draw(logits, 1.0, 3, position, top_p)]


def test_seeds_and_artifacts(files):
    """The same seed draws the same tokens, another seed others; an
    artifact without logits draws the same tokens (its step draws them)."""
    _, gguf, arts = files
    a = drawn(arts["tp1"], gguf, 1.0, 12)
    assert drawn(arts["tp1"], gguf, 1.0, 12) == a
    assert drawn(arts["tp1"], gguf, 1.0, 13) != a
    assert drawn(arts["bare"], gguf, 1.0, 12) == a
    n = drawn(arts["tp1"], gguf, 1.0, 12, top_p=0.5)
    assert drawn(arts["bare"], gguf, 1.0, 12, top_p=0.5) == n
    k = drawn(arts["tp1"], gguf, 1.0, 12, top_k=4)
    assert drawn(arts["bare"], gguf, 1.0, 12, top_k=4) == k
    # The adjusting form: 16 words and 3 for each of 320 tokens.
    described = run_tool("kiln-run", arts["bare"], "--describe").stdout
    assert ("inputs: token (4 bytes), position (4 bytes), sampling (3904 "
            "bytes); outputs: next_token (4 bytes)\n") in described


PENALISED = [
    # temperature, top-p, top-k, repeat, frequency, presence, biases, seed
    (0.0, None, None, 0.2, 0.0, 0.0, (), 0),  # below 1: repeats favoured
    (0.0, None, None, 1.0, 1.5, 0.5, ((3, -4.0), (9, 2.5), (3, 1.0)), 0),
    (1.0, None, None, 1.0, 0.8, 0.3, (), 21),
    (0.8, 0.9, None, 1.3, 0.0, 0.0, ((17, 6.0),), 22),
    (1.2, None, 8, 1.0, -0.5, 1.0, ((40, -100.0), (2, 5.0)), 23),
]


def penalised(art, gguf, case, logits=None, n=12):
    t, top_p, top_k, repeat, frequency, presence, biases, seed = case
    args = ["kiln-run", art, "--weights", gguf, "--prompt-tokens", PROMPT,
            "-n", n, "--ignore-eos", "--json", "--temperature", t,
            "--seed", seed, "--repeat-penalty", repeat,
            "--frequency-penalty", frequency, "--presence-penalty", presence]
    for token, b in biases:
        args += ["--logit-bias", f"{token}={b}"]
    if top_p is not None:
        args += ["--top-p", top_p]
    if top_k is not None:
        args += ["--top-k", top_k]
    if logits:
        args += ["--logits-out", logits]
    return json.loads(run_tool(*args).stdout)


@pytest.fixture(scope="module")
def unadjusting(files):
    """The tiny model's artifacts whose step does not adjust the logits."""
    d, gguf, _ = files
    arts = {}
    for name, extra in (("host", ()), ("bare", ("--no-logits",))):
        arts[name] = d / f"{name}-no-adjustments.kiln"
        run_tool("kiln-compile", gguf, "--target=cpu", "--context", 64,
                 "--adjustments=0", *extra, "-o", arts[name])
    return arts


@pytest.mark.parametrize("case", PENALISED)
def test_penalties_and_biases_on_the_step(files, unadjusting, tmp_path, case):
    """Penalties and logit biases are the step's adjusting form: token i is
    the reference's choice (the argmax, or the keys' draw within the cuts)
    from its position's logits adjusted over the tokens before it
    (draw_reference.adjust, numpy), at tp 1 and 2 and without logits; the
    host makes the same choices where the step does not adjust. The
    adjustments must matter: some choice differs from the unadjusted one."""
    _, gguf, arts = files
    t, top_p, top_k, repeat, frequency, presence, biases, seed = case
    out = tmp_path / "logits.npy"
    first = penalised(arts["tp1"], gguf, case, logits=out)
    assert first["chooser"] == "step_draw", first
    tokens = first["tokens"]
    logits = np.load(out)
    history = [int(v) for v in PROMPT.split(",")]
    moved = 0
    print(f"case {case}: {tokens}")
    for i, token in enumerate(tokens):
        p = len(history) - 1
        row = adjust(logits[p], history, repeat, frequency, presence,
                     list(biases))
        want = choice(row, t, seed, p, top_p, None, top_k)
        plain = choice(logits[p], t, seed, p, top_p, None, top_k)
        assert token == want, i
        moved += want != plain
        history.append(token)
    assert moved > 0
    for name in ("tp2", "bare"):
        other = penalised(arts[name], gguf, case)
        assert other["chooser"] == "step_draw" and other["tokens"] == tokens
    host = penalised(unadjusting["host"], gguf, case)
    assert host["chooser"] == "host" and host["tokens"] == tokens


def test_penalties_without_an_adjusting_step_need_the_logits(files,
                                                             unadjusting):
    """Without logits and without the adjusting form a penalty is refused
    before any step, with what the step does make."""
    _, gguf, _ = files
    proc = run_tool("kiln-run", unadjusting["bare"], "--weights", gguf,
                    "--prompt-tokens", PROMPT, "-n", 4, "--temperature", 1,
                    "--top-k", 5, "--frequency-penalty", 0.5, check=False)
    assert proc.returncode == 1
    assert ("--no-logits: its step makes greedy decoding, temperatures, "
            "top-p, top-k and min-p only") in proc.stderr
    proc = run_tool("kiln-run", files[2]["tp1"], "--weights", gguf,
                    "--prompt-tokens", PROMPT, "-n", 4,
                    "--logit-bias", "1024=1", check=False)
    assert proc.returncode == 1
    assert "--logit-bias: token 1024 is outside the vocabulary (1024 " \
        "tokens)" in proc.stderr
    out = json.loads(run_tool("kiln-run", files[2]["tp1"], "--weights", gguf,
                              "--prompt-tokens", PROMPT, "-n", 4,
                              "--json").stdout)
    assert out["chooser"] == "step_argmax"


@pytest.mark.parametrize("flag,value,says", [
    ("--logit-bias", "5", "--logit-bias: expected ID=BIAS"),
    ("--logit-bias", "5=101", "--logit-bias: expected ID=BIAS"),
    ("--logit-bias", "-1=2", "--logit-bias: expected ID=BIAS"),
    ("--repeat-penalty", "1e-50", "--repeat-penalty: expected a number > 0, "
     "finite as a float"),
    ("--repeat-penalty", "1e39", "--repeat-penalty: expected a number > 0"),
])
def test_bad_adjustment_flags(files, flag, value, says):
    """kiln-run's biases and repeat penalty outside what the step adjusts
    by: usage errors (exit 2) naming the flag, before anything runs."""
    _, gguf, arts = files
    proc = run_tool("kiln-run", arts["tp1"], "--weights", gguf,
                    "--prompt-tokens", PROMPT, "-n", 2, flag, value,
                    check=False)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
