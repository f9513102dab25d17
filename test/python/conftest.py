"""Shared fixtures of Kiln's Python tests: where the built tools are."""
import os
import pathlib
import subprocess

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def build_dir():
    return pathlib.Path(os.environ.get("KILN_BUILD_DIR", REPO / "build"))


def tool(name):
    """Path of a built Kiln tool; skips the test if it was not built."""
    path = build_dir() / "bin" / name
    if not path.exists():
        pytest.skip(f"{name} not built (looked in {path.parent})")
    return path


def run_tool(name, *args, check=True):
    """Runs a built tool and returns the CompletedProcess (text mode)."""
    # Generated text from random models may hold bytes that are not UTF-8;
    # tests compare what they need and must not fail on decoding.
    return subprocess.run([str(tool(name)), *map(str, args)],
                          capture_output=True, text=True, errors="replace",
                          check=check)


def tiny_cpu_model(directory, seed, context):
    """Synthesises the tiny GLM-5 (seed) and compiles it for the CPU backend
    with `context` positions: (gguf, artifact) paths in `directory`."""
    gguf, art = directory / "m.gguf", directory / "m.kiln"
    run_tool("kiln-gguf", "synth", gguf, "--preset", "tiny", "--seed", seed,
             "--quiet")
    run_tool("kiln-compile", gguf, "--target=cpu", "--context", context, "-o",
             art)
    return gguf, art


def step_program(directory, gguf, name, *flags):
    """The planned step program's text, as kiln-compile --emit=step gives
    (written to `directory`/`name`.mlir)."""
    out = directory / f"{name}.mlir"
    run_tool("kiln-compile", gguf, "--emit=step", *flags, "-o", out)
    return out.read_text()


def cpu_logits(directory, gguf, name, tokens, *flags):
    """The CPU backend's teacher-forced logits over `tokens` (comma
    separated), from an artifact compiled with `flags` (`directory`/`name`
    .kiln and .npy)."""
    art, out = directory / f"{name}.kiln", directory / f"{name}.npy"
    run_tool("kiln-compile", gguf, "--target=cpu", *flags, "-o", art)
    run_tool("kiln-run", art, "--weights", gguf, "--prompt-tokens", tokens,
             "-n", 0, "--logits-out", out)
    return np.load(out)


# The seed of preset_model's files.
PRESET_SEED = 7


@pytest.fixture(scope="session", params=["tiny", "small"])
def preset_model(request, tmp_path_factory):
    """The tiny or the small preset's GLM-5 (seed PRESET_SEED), synthesised
    once for the tests that compare two compilations of one model:
    (preset, gguf path)."""
    preset = request.param
    gguf = tmp_path_factory.mktemp(f"preset-{preset}") / "m.gguf"
    print(f"{preset} seed {PRESET_SEED}")
    run_tool("kiln-gguf", "synth", gguf, "--preset", preset, "--seed",
             PRESET_SEED, "--quiet")
    return preset, gguf


def file_chat_template(gguf):
    """The GGUF's tokenizer.chat_template, read with gguf-py."""
    from gguf import GGUFReader
    field = GGUFReader(str(gguf)).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode()
