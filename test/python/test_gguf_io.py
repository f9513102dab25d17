"""Kiln's GGUF reader and writer against gguf-py, the independent reference.

Files written by gguf.GGUFWriter (every value type, several alignments, split
sets) must read through `kiln-gguf info --json` with the same metadata and
tensor infos; files Kiln writes (through the gguf-roundtrip test driver) must
read through gguf.GGUFReader with the same metadata, infos and bytes.
Random tensor data comes from a fixed seed, printed by each test.
"""
import json
import math
import os
import time

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFValueType as VT, GGUFWriter

from conftest import run_tool

SEED = 1234

# (key, value, type, element type): one of each scalar type, strings, arrays
# of numbers, of strings, of bools and of arrays.
KVS = [
    ("t.u8", 250, VT.UINT8, None),
    ("t.i8", -100, VT.INT8, None),
    ("t.u16", 65000, VT.UINT16, None),
    ("t.i16", -32000, VT.INT16, None),
    ("t.u32", 4_000_000_000, VT.UINT32, None),
    ("t.i32", -2_000_000_000, VT.INT32, None),
    ("t.u64", 2**64 - 1, VT.UINT64, None),
    ("t.i64", -2**63, VT.INT64, None),
    ("t.f32", 0.1, VT.FLOAT32, None),
    ("t.f32.inf", float("-inf"), VT.FLOAT32, None),
    ("t.f64", 1e-300, VT.FLOAT64, None),
    ("t.bool", True, VT.BOOL, None),
    ("t.str", 'gl\u00e9m "5"\n\ttab', VT.STRING, None),
    ("t.str.empty", "", VT.STRING, None),
    ("t.arr.u8", [0, 1, 255], VT.ARRAY, VT.UINT8),
    ("t.arr.i32", list(range(-5, 100)), VT.ARRAY, VT.INT32),
    ("t.arr.u64", [2**64 - 1, 0], VT.ARRAY, VT.UINT64),
    ("t.arr.f32", [1.5, -0.25, 3.0e38], VT.ARRAY, VT.FLOAT32),
    ("t.arr.f64", [math.pi], VT.ARRAY, VT.FLOAT64),
    ("t.arr.bool", [True, False, True], VT.ARRAY, VT.BOOL),
    ("tokenizer.ggml.tokens", ["<s>", "", "\u4f60\u597d", "a b"] * 50,
     VT.ARRAY, VT.STRING),
    ("t.arr.nested", [[1, 2, 3], [4], [5, 6]], VT.ARRAY, None),
]


def add_tensors(writer, rng, count=5):
    """F32, F16, I32 and two quantised tensors (raw random blocks)."""
    out = {}
    shapes = [((3, 8), np.float32), ((16,), np.float16), ((2, 2, 4), np.int32)]
    for i, (shape, dtype) in enumerate(shapes[:count]):
        arr = (rng.standard_normal(shape) * 100).astype(dtype)
        writer.add_tensor(f"blk.{i}.w", arr)
        out[f"blk.{i}.w"] = arr.tobytes()
    for name, qtype, rows, blocks, block_bytes in (
            ("blk.3.q8", Q.Q8_0, 2, 3, 34), ("blk.4.q4k", Q.Q4_K, 3, 1, 144)):
        raw = rng.integers(0, 256, (rows, blocks * block_bytes), dtype=np.uint8)
        writer.add_tensor(name, raw, raw_dtype=qtype)
        out[name] = raw.tobytes()
    return out


def write_gguf_py(path, alignment=None, split_max_tensors=0,
                  small_first_shard=False):
    print(f"seed {SEED}")
    rng = np.random.default_rng(SEED)
    w = GGUFWriter(path, "glm-dsa", split_max_tensors=split_max_tensors,
                   small_first_shard=small_first_shard)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, value, vtype, sub in KVS:
        w.add_key_value(key, value, vtype, sub_type=sub)
    data = add_tensors(w, rng)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return data


def info_json(*paths):
    return json.loads(run_tool("kiln-gguf", "info", *paths, "--json").stdout)


def plain(typed):
    """A Kiln JSON value as plain Python (arrays of arrays as nested lists)."""
    if typed["type"] != "array":
        return typed["value"]
    if typed["element_type"] == "array":
        return [plain(e) for e in typed["value"]]
    return typed["value"]


def same(a, b):
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(
            same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == b and type(a) is type(b) or (
        isinstance(a, (int, float)) and not isinstance(a, bool)
        and not isinstance(b, bool) and a == b)


def reader_fields(reader):
    """GGUFReader's metadata without its pseudo-keys for the header."""
    return {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def assert_matches_reader(kiln_metadata, kiln_tensors, path, part=0):
    """Kiln's view of one file equals gguf-py's GGUFReader view."""
    reader = GGUFReader(path)
    fields = reader_fields(reader)
    assert list(kiln_metadata) == list(fields), "keys or key order"
    for key, field in fields.items():
        ours = kiln_metadata[key]
        assert ours["type"] == field.types[0].name.lower(), key
        if field.types[0] == VT.ARRAY:
            assert ours["element_type"] == field.types[1].name.lower(), key
            if field.types[1] == VT.ARRAY:
                # GGUFReader flattens arrays of arrays; compare flattened.
                flat = [x for inner in plain(ours) for x in inner]
                assert same(flat, field.contents()), key
                continue
        assert same(plain(ours), field.contents()), key
    mine = [t for t in kiln_tensors if t["part"] == part]
    assert [t["name"] for t in mine] == [t.name for t in reader.tensors]
    for ours, theirs in zip(mine, reader.tensors):
        assert ours["type_id"] == int(theirs.tensor_type), ours["name"]
        assert ours["type"] == theirs.tensor_type.name, ours["name"]
        assert ours["dims"] == [int(d) for d in theirs.shape], ours["name"]
        assert ours["bytes"] == int(theirs.n_bytes), ours["name"]
        assert ours["file_offset"] == int(theirs.data_offset), ours["name"]


@pytest.mark.parametrize("alignment", [None, 1, 8, 64, 4096])
def test_gguf_py_files_read_identically(tmp_path, alignment):
    path = tmp_path / "m.gguf"
    write_gguf_py(path, alignment)
    info = info_json(path)
    assert info["parts"][0]["alignment"] == (alignment or 32)
    assert info["parts"][0]["file_size"] == path.stat().st_size
    assert_matches_reader(info["metadata"], info["tensors"], path)
    # Against what was written, not only against GGUFReader (which flattens
    # nested arrays): every value and its exact type.
    for key, value, vtype, sub in KVS:
        ours = info["metadata"][key]
        assert ours["type"] == vtype.name.lower(), key
        if sub is not None:
            assert ours["element_type"] == sub.name.lower(), key
        expected = value
        if vtype == VT.FLOAT32:
            expected = float(np.float32(value))
        elif sub == VT.FLOAT32:
            expected = [float(np.float32(v)) for v in value]
        assert same(plain(ours), expected), key
    assert info["metadata"]["t.arr.nested"]["value"][0]["element_type"] == "int32"


@pytest.mark.parametrize("small_first_shard", [False, True])
def test_gguf_py_split_sets(tmp_path, small_first_shard):
    base = tmp_path / "glm.gguf"
    write_gguf_py(base, split_max_tensors=2, small_first_shard=small_first_shard)
    parts = sorted(tmp_path.glob("glm-*-of-*.gguf"))
    assert len(parts) >= 3, [p.name for p in parts]
    whole = info_json(*reversed(parts))
    assert [p["path"] for p in whole["parts"]] == [str(p) for p in parts]
    for one in parts:
        assert info_json(one)["tensors"] == whole["tensors"], one.name
    for index, part in enumerate(parts):
        assert_matches_reader(whole["parts"][index]["metadata"],
                              whole["tensors"], part, part=index)
    assert whole["metadata"] == whole["parts"][0]["metadata"]
    names = [t["name"] for t in whole["tensors"]]
    assert len(names) == len(set(names)) == 5
    assert whole["metadata"]["split.count"] == {"type": "uint16",
                                                "value": len(parts)}
    # A missing part is an error naming it.
    parts[1].unlink()
    proc = run_tool("kiln-gguf", "info", parts[0], check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("kiln-gguf: error: ")
    assert "split part 2 of" in proc.stderr and parts[1].name in proc.stderr


@pytest.mark.parametrize("alignment", [1, 8, 32, 64, 4096])
def test_kiln_written_files_read_by_gguf_py(tmp_path, alignment):
    src = tmp_path / "src.gguf"
    data = write_gguf_py(src)
    out = tmp_path / "out.gguf"
    run_tool("gguf-roundtrip", src, out, "--alignment", alignment)
    assert sorted(os.listdir(tmp_path)) == ["out.gguf", "src.gguf"]
    theirs_src, theirs_out = GGUFReader(src), GGUFReader(out)
    src_fields, out_fields = reader_fields(theirs_src), reader_fields(theirs_out)
    keys = [k for k in out_fields if k != "general.alignment"]
    assert keys == list(src_fields)
    for key in keys:
        a, b = src_fields[key], out_fields[key]
        assert a.types == b.types, key
        assert same(a.contents(), b.contents()), key
    if alignment == 32:
        assert "general.alignment" not in theirs_out.fields
    else:
        assert theirs_out.fields["general.alignment"].contents() == alignment
        assert theirs_out.fields["general.alignment"].types == [VT.UINT32]
    assert [t.name for t in theirs_out.tensors] == list(data)
    for t in theirs_out.tensors:
        assert t.data_offset % alignment == 0, t.name
        assert t.data.tobytes() == data[t.name], t.name
        assert t.tensor_type == theirs_src.tensors[
            [s.name for s in theirs_src.tensors].index(t.name)].tensor_type
    # And Kiln reads its own output like gguf-py does.
    info = info_json(out)
    assert_matches_reader(info["metadata"], info["tensors"], out)


def test_metadata_only_file_is_sparse_and_readable(tmp_path):
    src = tmp_path / "src.gguf"
    write_gguf_py(src)
    out = tmp_path / "meta.gguf"
    run_tool("gguf-roundtrip", src, out, "--no-data")
    reader = GGUFReader(out)
    assert all(not t.data.tobytes().strip(b"\0") for t in reader.tensors)
    assert out.stat().st_size == src.stat().st_size
    run_tool("kiln-gguf", "check", out)


def test_info_is_fast_and_reads_no_tensor_data(tmp_path):
    """A 13 GiB sparse file with a 150k-entry vocabulary: info answers well
    under a second (tolerance: 2 s on a loaded machine; typically ms)."""
    path = tmp_path / "big.gguf"
    w = GGUFWriter(path, "glm-dsa")
    w.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(150_000)])
    nbytes = 256 * 6144 * (2048 // 32 * 34)  # Q8_0 {2048, 6144, 256}
    for i in range(4):
        w.add_tensor_info(f"blk.{i}.ffn_down_exps.weight",
                          (256, 6144, 2048 // 32 * 34), np.dtype(np.uint8),
                          nbytes, raw_dtype=Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    header = path.stat().st_size
    os.truncate(path, (header + 31) // 32 * 32 + 4 * nbytes)
    start = time.perf_counter()
    info = info_json(path)
    elapsed = time.perf_counter() - start
    assert len(info["tensors"]) == 4
    assert info["tensors"][3]["bytes"] == nbytes
    assert info["tensors"][3]["dims"] == [2048, 6144, 256]
    assert elapsed < 2.0, f"info took {elapsed:.3f} s"
    text = run_tool("kiln-gguf", "info", path).stdout
    assert "(150000 elements)" in text


def test_usage_errors():
    proc = run_tool("kiln-gguf", "info", check=False)
    assert proc.returncode == 2 and "no file given" in proc.stderr
    proc = run_tool("kiln-gguf", "check", "--bogus", check=False)
    assert proc.returncode == 2 and "unknown option '--bogus'" in proc.stderr
    for command in ("info", "check", "types"):
        proc = run_tool("kiln-gguf", command, "--help")
        assert proc.stdout.startswith(f"usage: kiln-gguf {command}")
    proc = run_tool("kiln-gguf", "info", "/nonexistent.gguf", check=False)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "cannot open" in proc.stderr
