"""`kiln-gguf synth` checked with gguf-py as the independent reader: the files
load, carry llama.cpp's glm-dsa keys and tensor names, have a valid byte-level
BPE vocabulary, and tensor bytes depend only on (seed, name, type)."""
import os

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize

from conftest import run_tool

SEED = 1234  # printed by pytest -rs on skip; fixed so failures reproduce


def synth(tmp_path, name, *args):
    out = tmp_path / name
    run_tool("kiln-gguf", "synth", out, "--quiet", *args)
    return out


def field(reader, key):
    f = reader.fields[key]
    if len(f.types) > 1:  # array
        return [f.contents(i) for i in range(len(f.data))]
    return f.contents()


def tensors_by_name(paths):
    out = {}
    for p in paths:
        for t in GGUFReader(p).tensors:
            assert t.name not in out, f"{t.name} appears twice"
            out[t.name] = t
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    print(f"seed {SEED}")
    return synth(tmp_path_factory.mktemp("tiny"), "tiny.gguf",
                 "--preset", "tiny", "--seed", SEED)


def test_tiny_loads_with_glm_dsa_metadata(tiny):
    r = GGUFReader(tiny)
    assert field(r, "general.architecture") == "glm-dsa"
    assert field(r, "glm-dsa.block_count") == 5  # 4 trunk + 1 MTP
    assert field(r, "glm-dsa.nextn_predict_layers") == 1
    assert field(r, "glm-dsa.embedding_length") == 256
    assert field(r, "glm-dsa.attention.head_count") == 8
    assert field(r, "glm-dsa.attention.key_length") == 64 + 16
    assert field(r, "glm-dsa.attention.indexer.top_k") == 32
    assert field(r, "glm-dsa.expert_gating_func") == 2
    assert field(r, "glm-dsa.expert_weights_scale") == pytest.approx(2.5)
    assert field(r, "tokenizer.ggml.model") == "gpt2"
    assert field(r, "tokenizer.ggml.pre") == "glm4"
    names = {t.name for t in r.tensors}
    assert "blk.0.ffn_gate.weight" in names  # dense layer
    assert "blk.1.ffn_gate_exps.weight" in names  # MoE layer
    assert "blk.4.nextn.eh_proj.weight" in names  # MTP layer
    assert "blk.5.attn_norm.weight" not in names
    k_b = next(t for t in r.tensors if t.name == "blk.0.attn_k_b.weight")
    assert list(k_b.shape) == [32, 64, 8]  # gguf-py: ne[0] first


def test_tiny_weights_are_finite_and_sensible(tiny):
    for t in GGUFReader(tiny).tensors:
        v = dequantize(t.data, t.tensor_type).astype(np.float64)
        assert np.isfinite(v).all(), t.name
        if t.name.endswith("norm.weight"):
            assert abs(v.mean() - 1.0) < 0.05, t.name
        elif t.name.endswith(".weight") and "norm" not in t.name:
            # Projections: N(0, 1/fan_in) up to quantisation error.
            fan_in = t.shape[0]
            expected = 1.0 if t.name == "token_embd.weight" else fan_in ** -0.5
            assert v.std() == pytest.approx(expected, rel=0.15), t.name
            assert abs(v.mean()) < 0.2 * expected, t.name


def test_tokenizer_is_a_valid_byte_level_bpe(tiny):
    r = GGUFReader(tiny)
    tokens = field(r, "tokenizer.ggml.tokens")
    merges = field(r, "tokenizer.ggml.merges")
    types = field(r, "tokenizer.ggml.token_type")
    assert len(tokens) == len(types) == 1024
    assert len(set(tokens)) == len(tokens)
    known = set(tokens)
    for m in merges:
        left, right = m.split(" ")
        assert left in known and right in known and left + right in known, m
    eos = field(r, "tokenizer.ggml.eos_token_id")
    assert tokens[eos] == "<|endoftext|>" and types[eos] == 3


def test_shuffle_and_split_do_not_change_tensors(tmp_path):
    print(f"seed {SEED}")
    plain = tensors_by_name([synth(tmp_path, "a.gguf", "--seed", SEED)])
    synth(tmp_path, "b.gguf", "--seed", SEED, "--shuffle", "--split", "3")
    parts = sorted(tmp_path.glob("b-0000?-of-00003.gguf"))
    assert len(parts) == 3
    split = tensors_by_name(parts)
    shuffled_order = [t.name for p in parts for t in GGUFReader(p).tensors]
    assert shuffled_order != list(plain), "--shuffle kept the canonical order"
    assert plain.keys() == split.keys()
    for name, t in plain.items():
        assert t.tensor_type == split[name].tensor_type, name
        assert np.array_equal(dequantize(t.data, t.tensor_type),
                              dequantize(split[name].data, split[name].tensor_type)), name
    # The split keys, as gguf-split writes them.
    for k, p in enumerate(parts):
        r = GGUFReader(p)
        assert field(r, "split.no") == k
        assert field(r, "split.count") == 3
        assert field(r, "split.tensors.count") == len(plain)


def test_seed_changes_the_weights(tmp_path):
    a = tensors_by_name([synth(tmp_path, "a.gguf", "--seed", "1")])
    b = tensors_by_name([synth(tmp_path, "b.gguf", "--seed", "2")])
    name = "blk.1.ffn_down_exps.weight"
    assert not np.array_equal(a[name].data, b[name].data)


def test_metadata_only_is_full_length_and_sparse(tmp_path):
    full = synth(tmp_path, "full.gguf", "--seed", SEED)
    hole = synth(tmp_path, "hole.gguf", "--seed", SEED, "--metadata-only")
    assert os.path.getsize(hole) == os.path.getsize(full)
    assert os.stat(hole).st_blocks * 512 < os.path.getsize(full) / 20
    r = GGUFReader(hole)
    assert len(r.tensors) == len(GGUFReader(full).tensors)


def test_fused_gate_up_layout(tmp_path):
    r = GGUFReader(synth(tmp_path, "f.gguf", "--fused-gate-up"))
    names = {t.name: t for t in r.tensors}
    assert "blk.1.ffn_gate_exps.weight" not in names
    assert list(names["blk.1.ffn_gate_up_exps.weight"].shape) == [256, 512, 16]


def test_misaligned_type_is_refused_and_writes_nothing(tmp_path):
    out = tmp_path / "bad.gguf"
    proc = run_tool("kiln-gguf", "synth", out, "--type", "attn_k_b=q4_k",
                    check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("kiln-gguf: error: blk.0.attn_k_b.weight: ")
    assert "not a multiple of Q4_K's block of 256" in proc.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_bad_usage(tmp_path):
    for args in (["--preset", "huge"], ["--split", "0"], ["--alignment", "48"],
                 ["--bogus"]):
        proc = run_tool("kiln-gguf", "synth", tmp_path / "x.gguf", *args,
                        check=False)
        assert proc.returncode in (1, 2), args
        assert proc.stderr.startswith("kiln-gguf: error:"), args
    assert list(tmp_path.iterdir()) == []
