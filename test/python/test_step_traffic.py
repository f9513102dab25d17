"""The bytes one decode step reads, as `kiln-run --describe` and
`kiln-compile --report` print them (runtime/artifact/StepTraffic, the
numerator of every floor in docs/perf.md), against a count made here from
gguf-py's own tensor sizes and the model's metadata: each bound tensor's
rank-local part, the routed experts at top_k / E of their bytes, the
embedding at one row, and per attended position one row of every layer's
latent and indexer cache. Attention given the indexer's selection reads
at most top_k positions' latent rows, whatever the context; past them a
position adds only the indexer's key rows (a context above top_k checks
it: before, every latent row up to the context was counted, which put the
floors of docs/perf.md at 4k and 16k positions too high). An artifact
whose context is no longer than the indexer's top-k has no indexer
(kiln-elide-indexers: it would select every position), so it binds none of
the indexer's tensors and keeps no indexer cache. attn_q_b is bound as two
cuts of its rows (kiln-split-projections), each counted at its share.

With the router folded composed (`--fold-router=composed`), each MoE
layer's attn_output is a linear_router whose backend composes, at load, a
matrix of E rows of K + N/tp f32 values (K the rank's part of
attn_output's input, N the hidden size) from the router's gate and the
FFN norm: that matrix counts, read and bound, and the gate, which no op
then reads per step, counts as bound only (the norm is still read by the
all-reduce)."""
import re

import pytest
from gguf import GGUFReader

from conftest import run_tool

SEED = 5
BIND = re.compile(r"^  binds (\S+) \S+ \[([^\]]*)\] (whole|dim (\d+) \[(\d+), "
                  r"(\d+)\))(?: of each of (\d+) groups)?"
                  r"(?:, rows \[(\d+), (\d+)\) of every (\d+) of dim 1)?")
READS = re.compile(r"decode_step reads (\d+) bytes of weights a token \((\d+) "
                   r"bound; .*\) and (\d+) bytes of caches a position")
PAST = re.compile(r"attention reads at most the indexer's (\d+) selected "
                  r"positions: past them a position adds (\d+) bytes of "
                  r"caches; (\d+) bytes at context (\d+)")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("traffic")
    gguf = d / "tiny.gguf"
    run_tool("kiln-gguf", "synth", gguf, "--preset", "tiny", "--seed", SEED,
             "--quiet")
    return d, gguf


def field(reader, key):
    f = reader.fields[key]
    return int(f.parts[f.data[0]][0])


def expected_past(reader, context):
    """(selected positions, cache bytes a position adds past them, cache
    bytes a step reads at the artifact's context): the cache holds
    `context` positions and the step attends all of them."""
    layers = (field(reader, "glm-dsa.block_count") -
              field(reader, "glm-dsa.nextn_predict_layers"))
    top_k = field(reader, "glm-dsa.attention.indexer.top_k")
    latent = (field(reader, "glm-dsa.attention.kv_lora_rank") +
              field(reader, "glm-dsa.rope.dimension_count")) * 2  # f16
    key = field(reader, "glm-dsa.attention.indexer.key_length") * 2
    return (top_k, layers * key,
            layers * (min(context, top_k) * latent + context * key))


def elided(reader, context):
    """Whether the compiler leaves the indexers out at `context`."""
    return context <= field(reader, "glm-dsa.attention.indexer.top_k")


def expected(reader, described, context, tp=1, composed=False):
    """Per rank: (weights read, bound, cache bytes a position) for an
    artifact of `context` positions (`composed`: the router folded into
    linear_routers at `tp` ranks)."""
    sizes = {t.name: int(t.n_bytes) for t in reader.tensors}
    vocab = next(t for t in reader.tensors
                 if t.name == "token_embd.weight").shape[-1]
    chosen = field(reader, "glm-dsa.expert_used_count")
    experts = field(reader, "glm-dsa.expert_count")
    # The decode step runs the main layers; the next-token-prediction
    # layers counted in block_count are @mtp_step's.
    layers = (field(reader, "glm-dsa.block_count") -
              field(reader, "glm-dsa.nextn_predict_layers"))
    row = (field(reader, "glm-dsa.attention.kv_lora_rank") +
           field(reader, "glm-dsa.rope.dimension_count")) * 2  # f16
    if not elided(reader, context):
        row += field(reader, "glm-dsa.attention.indexer.key_length") * 2
    # A composed MoE layer's matrix: E rows of K / tp + N / tp f32 values.
    hidden = field(reader, "glm-dsa.embedding_length")
    dense = field(reader, "glm-dsa.leading_dense_block_count")
    derived = 0
    if composed:
        for layer in range(dense, layers):
            k = next(t for t in reader.tensors
                     if t.name == f"blk.{layer}.attn_output.weight").shape[0]
            derived += experts * (int(k) // tp + hidden // tp) * 4
    ranks, current = [], None
    for line in described.splitlines():
        if re.match(r"^rank \d+:", line):
            current = [0, 0]
            ranks.append(current)
            continue
        m = BIND.match(line)
        if not m:
            continue
        name, dims = m[1], [int(x) for x in m[2].split(", ")]
        local = sizes[name]
        if m[3] != "whole":
            cut = (int(m[6]) - int(m[5])) * int(m[7] or 1)
            local = local * cut // dims[int(m[4])]
        if m[8] is not None:
            # attn_q_b's rows cut per slice of its heads
            # (kiln-split-projections): B - A of every P rows.
            local = local * (int(m[9]) - int(m[8])) // int(m[10])
        share = 1.0
        if "_exps" in name:
            share = chosen / experts
        elif name == "token_embd.weight":
            share = 1.0 / vocab
        elif composed and name.endswith(".ffn_gate_inp.weight"):
            share = 0.0
        current[0] += int(float(local) * share)
        current[1] += local
    return [(w + derived, b + derived, layers * row) for w, b in ranks]


@pytest.mark.parametrize("tp,context,flags", [
    (1, 32, []), (2, 32, []), (1, 16, []), (1, 80, []), (2, 80, []),
    (2, 32, ["--fold-router=composed"]), (4, 32, ["--fold-router=composed"])])
def test_step_traffic_matches_an_independent_count(model, tp, context, flags):
    d, gguf = model
    composed = "--fold-router=composed" in flags
    art = d / f"tp{tp}-{context}{'-composed' if composed else ''}.kiln"
    report = run_tool("kiln-compile", gguf, "--target=cpu", "--tp", tp,
                      "--context", context, "--cache-type", "f16", "--report",
                      *flags, "-o", art).stderr
    if composed:
        assert "linear_router=" in report, report
    described = run_tool("kiln-run", art, "--describe").stdout
    got = [tuple(int(x) for x in m.groups())
           for m in READS.finditer(described)]
    reader = GGUFReader(gguf)
    # No indexer tensor bound where the indexers were left out; every
    # layer's five where they were not.
    indexer = len(re.findall(r"^  binds blk\.\d+\.indexer\.", described,
                             re.M))
    layers = (field(reader, "glm-dsa.block_count") -
              field(reader, "glm-dsa.nextn_predict_layers"))
    assert indexer == (0 if elided(reader, context) else tp * layers * 5), \
        indexer
    want = expected(reader, described, context, tp, composed)
    assert len(got) == tp and got == want, (got, want)
    past = [tuple(int(x) for x in m.groups()) for m in PAST.finditer(described)]
    if elided(reader, context):
        assert past == [], past
    else:
        assert past == [expected_past(reader, context) + (context,)] * tp, past
    # The compiler's report states the same figures, per rank.
    for rank, (weights, bound, cache) in enumerate(want):
        assert (f"rank {rank}: a decode step reads {weights / 1e9:.3f} GB of "
                f"weights ({bound / 1e9:.3f} GB bound" in report), report
        assert f"and {cache} bytes of caches a position attended" in report
