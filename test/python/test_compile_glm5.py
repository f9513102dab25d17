"""kiln-compile's check of a GLM-5 file against its metadata: every tensor the
model implies must be there with its dims and a supported type, nothing else
may be, and the metadata must be glm-dsa. Files are a synthesised tiny model
rewritten by gguf-py (the independent writer) with one defect each."""
import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter, GGUFValueType
from gguf.constants import GGMLQuantizationType as QT

from conftest import run_tool

SEED = 11


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("compile") / "tiny.gguf"
    run_tool("kiln-gguf", "synth", path, "--preset", "tiny", "--seed", SEED,
             "--quiet")
    return path


def rewrite(src, dst, drop_keys=(), set_keys=None, drop=(), replace=None,
            add=None, add_keys=None):
    """Copies `src` to `dst` through gguf-py, changing what is asked
    (add_keys: new keys, {name: (value, GGUFValueType)})."""
    r = GGUFReader(src)
    w = GGUFWriter(str(dst), arch=None)
    set_keys = set_keys or {}
    for key, (value, vtype) in (add_keys or {}).items():
        w.add_key_value(key, value, vtype)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key in drop_keys:
            continue
        vtype = f.types[0]
        if key in set_keys:
            w.add_key_value(key, set_keys[key], vtype)
            continue
        if vtype == GGUFValueType.ARRAY:
            w.add_key_value(key, [f.contents(i) for i in range(len(f.data))],
                            vtype, sub_type=f.types[-1])
        else:
            w.add_key_value(key, f.contents(), vtype)
    for t in r.tensors:
        if t.name in drop:
            continue
        if replace and t.name in replace:
            data, qtype = replace[t.name]
            w.add_tensor(t.name, data, raw_dtype=qtype)
            continue
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    for name, (data, qtype) in (add or {}).items():
        w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def compile_error(path):
    proc = run_tool("kiln-compile", path, check=False)
    assert proc.returncode == 1, proc.stdout[:200]
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kiln-compile: error: "), proc.stderr
    return lines[0]


def test_unchanged_copy_compiles(tiny, tmp_path):
    # The rewrite itself must not disturb anything the builder checks.
    out = rewrite(tiny, tmp_path / "copy.gguf")
    assert "kiln.layer 3" in run_tool("kiln-compile", out).stdout


def test_missing_tensor(tiny, tmp_path):
    msg = compile_error(rewrite(tiny, tmp_path / "m.gguf",
                                drop={"blk.2.attn_q_b.weight"}))
    assert msg.endswith("blk.2.attn_q_b.weight: missing: the model's metadata "
                        "implies a tensor of dims {128, 384}")


def test_unexpected_tensor(tiny, tmp_path):
    extra = np.ones(256, dtype=np.float32)
    msg = compile_error(rewrite(tiny, tmp_path / "u.gguf",
                                add={"blk.9.attn_norm.weight": (extra, QT.F32)}))
    assert "blk.9.attn_norm.weight: unexpected tensor" in msg


def test_dense_tensor_on_a_moe_layer_is_unexpected(tiny, tmp_path):
    w = np.zeros((512, 256 // 32 * 34), dtype=np.uint8)
    msg = compile_error(rewrite(tiny, tmp_path / "d.gguf",
                                add={"blk.2.ffn_gate.weight": (w, QT.Q8_0)}))
    assert "blk.2.ffn_gate.weight: unexpected tensor" in msg


def test_wrong_dims(tiny, tmp_path):
    w = np.ones(128, dtype=np.float32)
    msg = compile_error(rewrite(tiny, tmp_path / "s.gguf",
                                replace={"blk.0.attn_norm.weight": (w, QT.F32)}))
    assert msg.endswith("blk.0.attn_norm.weight: dims {128} but the model's "
                        "metadata implies {256}")


def test_unsupported_type(tiny, tmp_path):
    # blk.0.attn_q_a.weight is {256, 128}: one IQ2_XXS block (66 bytes) a row.
    w = np.zeros((128, 66), dtype=np.uint8)
    msg = compile_error(rewrite(tiny, tmp_path / "t.gguf",
                                replace={"blk.0.attn_q_a.weight": (w, QT.IQ2_XXS)}))
    assert msg.endswith("blk.0.attn_q_a.weight: unsupported type IQ2_XXS for "
                        "tensor blk.0.attn_q_a.weight")


def test_missing_metadata_key(tiny, tmp_path):
    msg = compile_error(rewrite(tiny, tmp_path / "k.gguf",
                                drop_keys={"glm-dsa.expert_count"}))
    assert msg.endswith("glm-dsa.expert_count: missing")


def test_other_architecture(tiny, tmp_path):
    msg = compile_error(rewrite(tiny, tmp_path / "a.gguf",
                                set_keys={"general.architecture": "llama"}))
    assert msg.endswith("general.architecture: 'llama' is not glm-dsa (GLM-5)")


def test_metadata_that_disagrees_with_the_tensors(tiny, tmp_path):
    # One more layer in the metadata than in the file: its tensors are missing.
    msg = compile_error(rewrite(tiny, tmp_path / "b.gguf",
                                set_keys={"glm-dsa.block_count": 6}))
    assert "blk.5.attn_norm.weight: missing" in msg, msg


@pytest.mark.parametrize("key,value,message", [
    # Group-limited routing (DeepSeek-V3's) would be silently wrong.
    ("glm-dsa.expert_group_count", 8,
     "glm-dsa.expert_group_count: 8 groups are not supported (GLM-5 routes "
     "over one group)"),
    ("glm-dsa.expert_group_used_count", 4,
     "glm-dsa.expert_group_used_count: 4 groups are not supported (GLM-5 "
     "routes over one group)"),
    # The redundant MLA keys must agree with the ones Kiln builds from.
    ("glm-dsa.attention.key_length", 77,
     "glm-dsa.attention.key_length: 77 is not kv_lora_rank 64 + rope dims 16"),
    ("glm-dsa.attention.value_length", 63,
     "glm-dsa.attention.value_length: 63 is not kv_lora_rank 64"),
    ("glm-dsa.attention.head_count_kv", 2,
     "glm-dsa.attention.head_count_kv: 2 is not 1 (MLA's one latent head)"),
])
def test_metadata_kiln_cannot_honour(tiny, tmp_path, key, value, message):
    msg = compile_error(rewrite(tiny, tmp_path / "g.gguf",
                                set_keys={key: value}))
    assert msg.endswith(message), msg


@pytest.mark.parametrize("key,value,vtype,message", [
    ("glm-dsa.rope.scaling.type", "yarn", GGUFValueType.STRING,
     "glm-dsa.rope.scaling.type: 'yarn' rope scaling is not supported "
     "(GLM-5 uses none)"),
    ("glm-dsa.rope.scaling.type", 3, GGUFValueType.UINT32,
     "glm-dsa.rope.scaling.type: expected a string, got uint32"),
])
def test_rope_scaling_is_refused(tiny, tmp_path, key, value, vtype, message):
    msg = compile_error(rewrite(tiny, tmp_path / "y.gguf",
                                add_keys={key: (value, vtype)}))
    assert msg.endswith(message), msg


def test_rope_scaling_none_is_accepted(tiny, tmp_path):
    path = rewrite(tiny, tmp_path / "none.gguf", add_keys={
        "glm-dsa.rope.scaling.type": ("none", GGUFValueType.STRING)})
    run_tool("kiln-compile", path, "--emit=mlir", "-o", "/dev/null")


def test_expert_weights_norm_absent_means_unnormalised(tiny, tmp_path):
    """llama.cpp's rule (and the numpy reference's): without the key the
    router does not renormalise; with it, as it says."""
    absent = run_tool("kiln-compile", rewrite(
        tiny, tmp_path / "n.gguf", drop_keys={"glm-dsa.expert_weights_norm"}),
        "--emit=mlir", "-o", "-").stdout
    assert "normalize = false" in absent and "normalize = true" not in absent
    present = run_tool("kiln-compile", tiny, "--emit=mlir", "-o", "-").stdout
    assert "normalize = true" in present and "normalize = false" not in present


@pytest.mark.parametrize("target,expected", [
    ("cuda", "sm_90,sm_100,sm_120"),
    ("cuda:sm_90,sm_120", "sm_90,sm_120"),
    ("cuda:sm_100,sm_100", "sm_100"),
])
def test_cuda_target_records_its_architectures(tiny, tmp_path, target,
                                               expected):
    """--target=cuda[:ARCHS] writes the architectures into the artifact
    (payload cuda/archs), which the CUDA plugin checks each GPU against."""
    art = tmp_path / "m.kiln"
    run_tool("kiln-compile", tiny, f"--target={target}", "--context", 16,
             "-o", art)
    described = run_tool("kiln-run", art, "--describe").stdout
    assert f"payload cuda/archs: {len(expected)} bytes: {expected}" in described


@pytest.mark.parametrize("target,message", [
    ("cuda:sm_91", "sm_91: not an architecture the CUDA backend is built for"),
    ("cpu:fast", "the cpu target takes no options"),
    ("metal", "unknown target"),
])
def test_bad_target_is_refused_before_any_output(tiny, tmp_path, target,
                                                 message):
    art = tmp_path / "m.kiln"
    proc = run_tool("kiln-compile", tiny, f"--target={target}", "-o", art,
                    check=False)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not art.exists()


def cuda_images():
    from conftest import build_dir
    return build_dir() / "lib" / "kiln-cuda"


needs_images = pytest.mark.skipif(
    not (cuda_images() / "sm_90" / "StepKernels.fatbin").exists(),
    reason="this build has no CUDA kernel images (built without nvcc)")


@needs_images
def test_cuda_artifact_carries_images_and_device_layouts(tiny, tmp_path):
    """--target=cuda:sm_90 copies that architecture's kernel images, byte for
    byte, into the artifact, and names each type's split layout (q8_0-split,
    q4_k-split, q5_k-split, q6_k-split; the tiny mix has none of the types of
    the other split layouts, tested below) for exactly the weights of that type
    read only by mat-vecs (linear, fused_linear, and mla_attention's output
    projection, attn_v_b after kiln-fuse-mla-projection: the compiler and the
    plugin share that rule); the routed experts' weights (read by
    moe_experts, Q8_0 down and Q4_K gate/up in the tiny mix) and every other
    type stay in the file's blocks. The cpu target names no device layout."""
    art = tmp_path / "m.kiln"
    run_tool("kiln-compile", tiny, "--target=cuda:sm_90", "--context", 16,
             "-o", art)
    described = run_tool("kiln-run", art, "--describe").stdout
    data = art.read_bytes()
    for name in ("StepKernels", "StepMatVec"):
        image = (cuda_images() / "sm_90" / f"{name}.fatbin").read_bytes()
        assert (f"payload cuda/sm_90/{name}.fatbin: {len(image)} bytes"
                in described), described
        assert image in data
    assert "sm_100/" not in described and "sm_120/" not in described
    binds = [line for line in described.splitlines()
             if line.strip().startswith("binds ")]
    layouts = {"Q8_0": "q8_0-split", "Q4_K": "q4_k-split",
               "Q5_K": "q5_k-split", "Q6_K": "q6_k-split"}
    for type_name, layout in layouts.items():
        split = [line for line in binds if layout in line]
        assert split and all(f" {type_name} " in line for line in split), (
            layout, split)
        # Every weight of the type but the routed experts and the embedding
        # (read by embed) is split: the tiny model reads each of them only
        # through a mat-vec.
        dense = [line for line in binds
                 if f" {type_name} " in line and "_exps" not in line
                 and "token_embd" not in line]
        assert dense and all(layout in line for line in dense), (layout, dense)
    embedding = [line for line in binds if "token_embd.weight" in line]
    assert embedding and " Q8_0 " in embedding[0]
    assert "device layout" not in embedding[0]
    assert any(".attn_q_a." in line for line in binds if "q8_0-split" in line)
    assert any(".attn_v_b." in line for line in binds if "q8_0-split" in line)
    assert any("output.weight" in line for line in binds
               if "q6_k-split" in line)
    assert any("ffn_gate_shexp" in line for line in binds
               if "q5_k-split" in line)
    assert any(".ffn_gate." in line for line in binds if "q4_k-split" in line)
    experts = [line for line in binds if "_exps" in line]
    assert any(" Q8_0 " in line for line in experts)
    assert any(" Q4_K " in line for line in experts)
    assert not any("-split" in line for line in experts), experts
    others = [line for line in binds
              if not any(f" {t} " in line for t in layouts)]
    assert others and not any("device layout" in line for line in others)
    cpu = tmp_path / "c.kiln"
    run_tool("kiln-compile", tiny, "--target=cpu", "--context", 16, "-o", cpu)
    assert "device layout" not in run_tool("kiln-run", cpu,
                                           "--describe").stdout


@needs_images
def test_cuda_target_splits_the_4_bit_32_value_types(tmp_path):
    """The 4-bit types GLM-5 mixes put on attention weights (IQ4_XS, IQ4_NL,
    Q5_0, Q5_1) get their split layouts when only mat-vecs read them,
    attn_k_b's stacked per-head matrices [32, 64, 8] included; a weight of
    such a type read by embed keeps the file's blocks."""
    gguf = tmp_path / "mixed.gguf"
    run_tool("kiln-gguf", "synth", gguf, "--preset", "tiny", "--seed", SEED,
             "--type", "attn_q_a=iq4_xs", "--type", "attn_kv_a_mqa=iq4_nl",
             "--type", "attn_k_b=q5_0", "--type", "attn_output=q5_1",
             "--type", "token_embd=q5_0", "--quiet")
    art = tmp_path / "m.kiln"
    run_tool("kiln-compile", gguf, "--target=cuda:sm_90", "--context", 16,
             "-o", art)
    binds = [line for line in run_tool("kiln-run", art, "--describe")
             .stdout.splitlines() if line.strip().startswith("binds ")]
    expected = {".attn_q_a.": ("IQ4_XS", "iq4_xs-split"),
                ".attn_kv_a_mqa.": ("IQ4_NL", "iq4_nl-split"),
                ".attn_k_b.": ("Q5_0", "q5_0-split"),
                ".attn_output.": ("Q5_1", "q5_1-split")}
    for tensor, (type_name, layout) in expected.items():
        lines = [line for line in binds if tensor in line]
        assert lines and all(f" {type_name} " in line and layout in line
                             for line in lines), (tensor, lines)
    for layout in ("iq4_xs-split", "iq4_nl-split", "q5_0-split",
                   "q5_1-split"):
        assert all(any(t in line for t in expected)
                   for line in binds if layout in line), layout
    embedding = [line for line in binds if "token_embd.weight" in line]
    assert embedding and " Q5_0 " in embedding[0]
    assert "device layout" not in embedding[0]


@needs_images
def test_cuda_target_without_images_is_refused(tiny, tmp_path):
    """No images for the named architecture: exit 2 naming the file, and no
    artifact written."""
    only = tmp_path / "images" / "sm_100"
    only.mkdir(parents=True)
    for name in ("StepKernels", "StepMatVec"):
        (only / f"{name}.fatbin").write_bytes(
            (cuda_images() / "sm_100" / f"{name}.fatbin").read_bytes())
    art = tmp_path / "m.kiln"
    proc = run_tool("kiln-compile", tiny, "--target=cuda:sm_90",
                    f"--cuda-images={tmp_path / 'images'}", "-o", art,
                    check=False)
    assert proc.returncode == 2, proc.stderr
    assert "sm_90/StepKernels.fatbin" in proc.stderr
    assert "cannot read the kernel image" in proc.stderr
    assert not art.exists()
    # The default takes the architectures the folder has.
    run_tool("kiln-compile", tiny, "--target=cuda",
             f"--cuda-images={tmp_path / 'images'}", "--context", 16, "-o", art)
    assert ("payload cuda/archs: 6 bytes: sm_100"
            in run_tool("kiln-run", art, "--describe").stdout)
