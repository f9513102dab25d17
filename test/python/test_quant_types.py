"""Kiln's ggml type table against gguf-py's GGML_QUANT_SIZES (independent
reference): same ids, names, block sizes and block bytes for every type."""
import json

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from conftest import run_tool


def test_type_table_matches_gguf_py():
    ours = {t["id"]: t for t in json.loads(run_tool("kiln-gguf", "types", "--json").stdout)}
    theirs = {t.value: (t.name, *GGML_QUANT_SIZES[t]) for t in GGMLQuantizationType}
    assert set(ours) == set(theirs), "type ids differ from gguf-py"
    for tid, (name, block, nbytes) in theirs.items():
        assert (ours[tid]["name"], ours[tid]["block_size"], ours[tid]["block_bytes"]) \
            == (name, block, nbytes), f"type {tid}"


def test_unknown_argument_is_an_error():
    proc = run_tool("kiln-gguf", "types", "--bogus", check=False)
    assert proc.returncode == 2
    assert "unknown argument '--bogus'" in proc.stderr
