"""`kiln-gguf dequant` and `kiln-gguf check`'s scale check, end to end through
GGUF files written by gguf-py: random blocks of every supported type,
dequantised by kiln-gguf, equal `gguf.quants.dequantize` bit for bit."""
import numpy as np
import pytest
from gguf import GGUFWriter
from gguf.constants import GGMLQuantizationType as QT
from gguf.quants import dequantize

from conftest import run_tool
from test_quant_formats import (DEQUANT_TYPES, assert_same_bits, geometry,
                                random_blocks, seed_for)

ROWS = 6


def write_model(path, tensors):
    """tensors: name -> (type name, raw uint8 blocks, values per row)."""
    w = GGUFWriter(str(path), "glm-dsa")
    for name, (tname, raw, row) in tensors.items():
        block, nbytes = geometry(tname)
        shape = (raw.size // nbytes * block // row, row)  # numpy order
        w.add_tensor(name, raw.reshape(shape[0], row // block * nbytes),
                     raw_dtype=QT[tname])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("tname", DEQUANT_TYPES)
def test_dequant_command_matches_gguf_py(tmp_path, tname):
    rng = np.random.default_rng(seed_for("gguf-dequant", tname))
    block, nbytes = geometry(tname)
    row = 256 if block <= 256 else block
    raw = random_blocks(rng, tname, ROWS * row // block)
    model = tmp_path / "m.gguf"
    write_model(model, {"blk.0.w.weight": (tname, raw, row)})
    out = tmp_path / "w.f32"
    run_tool("kiln-gguf", "dequant", model, "--tensor", "blk.0.w.weight",
             "-o", out)
    ours = np.fromfile(out, dtype=np.float32)
    theirs = dequantize(raw, QT[tname]).astype(np.float32).reshape(-1)
    assert_same_bits(ours, theirs, tname)


def test_dequant_errors(tmp_path):
    rng = np.random.default_rng(seed_for("gguf-dequant", "errors"))
    model = tmp_path / "m.gguf"
    write_model(model, {"a.weight": ("Q8_0", random_blocks(rng, "Q8_0", 8), 64),
                        "b.weight": ("IQ2_XXS", rng.integers(0, 256, 66 * 2, dtype=np.uint8), 256)})
    out = tmp_path / "x.f32"
    proc = run_tool("kiln-gguf", "dequant", model, "--tensor", "b.weight",
                    "-o", out, check=False)
    assert proc.returncode == 1
    assert "b.weight: unsupported type IQ2_XXS for tensor b.weight" in proc.stderr
    proc = run_tool("kiln-gguf", "dequant", model, "--tensor", "nope",
                    "-o", out, check=False)
    assert proc.returncode == 1 and "nope: no such tensor" in proc.stderr
    assert not out.exists()
    proc = run_tool("kiln-gguf", "dequant", model, check=False)
    assert proc.returncode == 2


def test_check_rejects_a_non_finite_scale(tmp_path):
    rng = np.random.default_rng(seed_for("gguf-check", "nan-scale"))
    raw = random_blocks(rng, "Q4_K", 4)
    model = tmp_path / "ok.gguf"
    write_model(model, {"blk.3.ffn_up_exps.weight": ("Q4_K", raw, 256)})
    assert run_tool("kiln-gguf", "check", model).stdout.startswith("OK")
    bad = raw.copy().reshape(4, 144)
    bad[2, 0:2] = np.array([np.inf], dtype=np.float16).view(np.uint8)  # d
    model = tmp_path / "bad.gguf"
    write_model(model, {"blk.3.ffn_up_exps.weight": ("Q4_K", bad.reshape(-1), 256)})
    proc = run_tool("kiln-gguf", "check", model, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().endswith(
        "blk.3.ffn_up_exps.weight: block 2 has a non-finite scale")


def test_dequant_reads_a_tensor_from_any_split_part(tmp_path):
    run_tool("kiln-gguf", "synth", tmp_path / "s.gguf", "--split", "3",
             "--seed", "5", "--quiet")
    run_tool("kiln-gguf", "synth", tmp_path / "one.gguf", "--seed", "5",
             "--quiet")
    parts = sorted(tmp_path.glob("s-0000?-of-00003.gguf"))
    for name in ("token_embd.weight", "output.weight"):  # first and last part
        a, b = tmp_path / "a.f32", tmp_path / "b.f32"
        run_tool("kiln-gguf", "dequant", parts[1], "--tensor", name, "-o", a)
        run_tool("kiln-gguf", "dequant", tmp_path / "one.gguf", "--tensor",
                 name, "-o", b)
        assert a.read_bytes() == b.read_bytes(), name
