"""The artifact and the runtime end to end on the CPU backend: kiln-compile
--target=cpu writes a .kiln that kiln-run loads and runs; every way an
artifact, a weights file, a plugin or a request can be wrong is a clear error
with a non-zero exit, and the runtime half links no LLVM/MLIR."""
import json
import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

from conftest import build_dir, run_tool, tool
from test_compile_glm5 import rewrite

SEED = 21


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("runtime")
    gguf = d / "tiny.gguf"
    run_tool("kiln-gguf", "synth", gguf, "--preset", "tiny", "--seed", SEED,
             "--quiet")
    art = d / "tiny.kiln"
    run_tool("kiln-compile", gguf, "--target=cpu", "--context", "32", "-o", art)
    return d, gguf, art


def kiln_run(*args, check=False):
    return run_tool("kiln-run", *args, check=check)


def error_of(proc):
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr.startswith("kiln-run: error: "), proc.stderr
    return proc.stderr


def test_runs_and_reports(model):
    _, gguf, art = model
    proc = kiln_run(art, "--weights", gguf, "--prompt-tokens", "1,2,3",
                    "-n", "5", "--ignore-eos", check=True)
    # The streamed text comes first (the file has a tokenizer), then four
    # lines of figures.
    assert proc.stdout.startswith("text: ")
    lines = proc.stdout.splitlines()[-4:]
    assert lines[0].startswith("tokens: ")
    tokens = [int(t) for t in lines[0].split()[1:]]
    assert len(tokens) == 5 and all(0 <= t < 1024 for t in tokens)
    assert lines[1].startswith("prompt: 3 tokens in ")
    assert lines[2].startswith("decode: 4 steps in ")
    assert lines[3].startswith("load: ") and "libkiln-backend-cpu.so" in lines[3]


def test_json_and_logits(model, tmp_path):
    _, gguf, art = model
    out = tmp_path / "logits.npy"
    proc = kiln_run(art, "--weights", gguf, "--prompt-tokens", "5,6,7,8",
                    "-n", "3", "--ignore-eos", "--json", "--logits-out", out, check=True)
    report = json.loads(proc.stdout)
    assert len(report["tokens"]) == 3 and report["prompt_tokens"] == 4
    assert report["backend"] == "cpu" and report["context"] == 32
    logits = np.load(out)
    # 4 prompt positions + 2 decode steps evaluated.
    assert logits.shape == (6, 1024) and logits.dtype == np.float32
    assert np.isfinite(logits).all()
    # Greedy: each generated token is the argmax of the previous position.
    assert report["tokens"][0] == int(np.argmax(logits[3]))
    assert report["tokens"][1] == int(np.argmax(logits[4]))


def test_deterministic_across_threads(model, tmp_path):
    _, gguf, art = model
    outs = []
    for threads in ("1", "3"):
        out = tmp_path / f"l{threads}.npy"
        kiln_run(art, "--weights", gguf, "--prompt-tokens", "9,8,7,6,5",
                 "-n", "0", "--threads", threads, "--logits-out", out,
                 check=True)
        outs.append(np.load(out))
    assert np.array_equal(outs[0], outs[1])


def test_sampling_is_seeded(model):
    _, gguf, art = model
    def sample(seed):
        proc = kiln_run(art, "--weights", gguf, "--prompt-tokens", "1", "-n",
                        "8", "--temperature", "1.5", "--top-k", "50",
                        "--top-p", "0.9", "--seed", seed, "--ignore-eos", "--json",
                        check=True)
        return json.loads(proc.stdout)["tokens"]
    assert sample(1) == sample(1)
    assert sample(1) != sample(2)


def corrupt(art, tmp_path, name, edit):
    data = bytearray(art.read_bytes())
    edit(data)
    path = tmp_path / name
    path.write_bytes(bytes(data))
    return path


def test_flipped_byte(model, tmp_path):
    _, gguf, art = model
    size = art.stat().st_size
    for offset in (40, size // 2, size - 1):
        def flip(d):
            d[offset] ^= 0x10
        bad = corrupt(art, tmp_path, f"flip{offset}.kiln", flip)
        err = error_of(kiln_run(bad, "--weights", gguf, "--prompt-tokens", "1"))
        assert f"{bad}: checksum: does not match the contents" in err


def test_truncated(model, tmp_path):
    _, gguf, art = model
    bad = corrupt(art, tmp_path, "short.kiln", lambda d: d.__delitem__(
        slice(len(d) - 100, len(d))))
    err = error_of(kiln_run(bad, "--weights", gguf, "--prompt-tokens", "1"))
    assert "payload size" in err and "truncated" in err
    tiny = corrupt(art, tmp_path, "header.kiln", lambda d: d.__delitem__(
        slice(20, len(d))))
    err = error_of(kiln_run(tiny, "--weights", gguf, "--prompt-tokens", "1"))
    assert "fewer than the 32-byte header" in err


def test_wrong_version_and_magic(model, tmp_path):
    _, gguf, art = model
    def version(d):
        d[8] = 2
    bad = corrupt(art, tmp_path, "v2.kiln", version)
    err = error_of(kiln_run(bad, "--weights", gguf, "--prompt-tokens", "1"))
    assert "format version: the file is format version 2; this build reads " \
           "version 1" in err
    def magic(d):
        d[0:4] = b"GGUF"
    bad = corrupt(art, tmp_path, "magic.kiln", magic)
    err = error_of(kiln_run(bad, "--weights", gguf, "--prompt-tokens", "1"))
    assert "not a Kiln artifact" in err


def test_missing_tensor(model, tmp_path):
    _, gguf, art = model
    bad = rewrite(gguf, tmp_path / "missing.gguf",
                  drop=("blk.2.attn_output.weight",))
    err = error_of(kiln_run(art, "--weights", bad, "--prompt-tokens", "1"))
    assert "tensor 'blk.2.attn_output.weight': is missing" in err


def test_other_type(model, tmp_path):
    d, _, art = model
    other = d / "other-type.gguf"
    run_tool("kiln-gguf", "synth", other, "--preset", "tiny", "--seed", SEED,
             "--type", "attn_q_a=q4_0", "--quiet")
    err = error_of(kiln_run(art, "--weights", other, "--prompt-tokens", "1"))
    assert "tensor 'blk.0.attn_q_a.weight': has type Q4_0, the artifact was " \
           "compiled for Q8_0" in err


def test_other_shape(model, tmp_path):
    d, _, art = model
    other = d / "other-shape.gguf"
    run_tool("kiln-gguf", "synth", other, "--preset", "tiny", "--seed", SEED,
             "--vocab", "2048", "--quiet")
    err = error_of(kiln_run(art, "--weights", other, "--prompt-tokens", "1"))
    assert "tensor 'token_embd.weight': has dims [256, 2048], the artifact " \
           "was compiled for [256, 1024]" in err


def test_context_overflow(model):
    _, gguf, art = model
    err = error_of(kiln_run(art, "--weights", gguf, "--prompt-tokens",
                            ",".join(["1"] * 30), "-n", "4"))
    assert "context: 30 prompt tokens and 4 to generate need 33 positions; " \
           "the artifact's caches hold 32" in err


def test_bad_token(model):
    _, gguf, art = model
    err = error_of(kiln_run(art, "--weights", gguf, "--prompt-tokens", "1024"))
    assert "token: 1024 is not in the vocabulary [0, 1024)" in err


def test_usage_errors(model):
    _, gguf, art = model
    proc = kiln_run(art, "--weights", gguf, "--prompt-tokens", "1,x")
    assert proc.returncode == 2 and "--prompt-tokens: expected ids" in proc.stderr
    proc = kiln_run(art, "--weights", gguf)
    assert proc.returncode == 2 and "no prompt given" in proc.stderr
    proc = kiln_run(art, "--prompt-tokens", "1")
    assert proc.returncode == 1 and "no GGUF file given" in proc.stderr


def test_missing_plugin(model, tmp_path):
    _, gguf, art = model
    lonely = tmp_path / "bin" / "kiln-run"
    lonely.parent.mkdir()
    shutil.copy(tool("kiln-run"), lonely)
    proc = subprocess.run([str(lonely), str(art), "--weights", str(gguf),
                           "--prompt-tokens", "1"], capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin"})
    err = error_of(proc)
    assert "backend: cpu: no plugin libkiln-backend-cpu.so (looked in:" in err


def test_incompatible_plugin(model, tmp_path):
    _, gguf, art = model
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler to build a stand-in plugin")
    src = tmp_path / "old.c"
    src.write_text("const void *kiln_backend_entry(unsigned v) { return 0; }\n")
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    subprocess.run([cc, "-shared", "-fPIC", "-o",
                    str(plugins / "libkiln-backend-cpu.so"), str(src)],
                   check=True)
    err = error_of(kiln_run(art, "--weights", gguf, "--prompt-tokens", "1",
                            "--backend-dir", plugins))
    assert "ABI: the plugin does not speak backend ABI version 3" in err


@pytest.mark.parametrize("which", ["build", "runtime-build"])
def test_no_llvm_in_runtime(which):
    """kiln-run, kiln-gguf and the CPU plugin hold no LLVM/MLIR symbol, in
    the full build and in the MLIR-free build (-DKILN_BUILD_COMPILER=OFF)
    that utils/test.sh makes in KILN_RUNTIME_BUILD_DIR."""
    nm = shutil.which("nm")
    if not nm:
        pytest.skip("no nm")
    if which == "build":
        root = build_dir()
    else:
        env = os.environ.get("KILN_RUNTIME_BUILD_DIR")
        if not env:
            pytest.skip("KILN_RUNTIME_BUILD_DIR not set (utils/test.sh sets "
                        "it after the MLIR-free build)")
        root = pathlib.Path(env)
        cache = (root / "CMakeCache.txt").read_text()
        assert "KILN_BUILD_COMPILER:BOOL=OFF" in cache
    binaries = [root / "bin" / "kiln-run", root / "bin" / "kiln-gguf",
                root / "lib" / "libkiln-backend-cpu.so"]
    for b in binaries:
        assert b.exists(), f"{b} was not built"
        out = subprocess.run([nm, "-C", str(b)], capture_output=True,
                             text=True, check=True).stdout
        bad = [l for l in out.splitlines() if "llvm::" in l or "mlir::" in l]
        assert not bad, f"{b} has LLVM/MLIR symbols: {bad[:3]}"


def test_prompt_text(model):
    """--prompt encodes with the GGUF's tokenizer (as kiln-tokenize does)
    and the output text is the decoding of the generated ids."""
    _, gguf, art = model
    text = "Hello, world! 12345 <|user|>"
    enc = subprocess.run([str(tool("kiln-tokenize")), str(gguf), "encode"],
                         input=text.encode(), capture_output=True, check=True)
    ids = enc.stdout.decode().strip()
    by_text = json.loads(kiln_run(art, "--weights", gguf, "--prompt", text,
                                  "-n", 6, "--ignore-eos", "--json",
                                  check=True).stdout)
    by_ids = json.loads(kiln_run(art, "--weights", gguf, "--prompt-tokens",
                                 ids, "-n", 6, "--ignore-eos", "--json",
                                 check=True).stdout)
    assert by_text["tokens"] == by_ids["tokens"]
    assert by_text["prompt_tokens"] == len(ids.split(","))
    dec = subprocess.run([str(tool("kiln-tokenize")), str(gguf), "decode"],
                         input=",".join(map(str, by_text["tokens"])).encode(),
                         capture_output=True, check=True)
    assert by_text["text"].encode() == dec.stdout
    plain = kiln_run(art, "--weights", gguf, "--prompt", text, "-n", 3,
                     "--ignore-eos", check=True).stdout
    assert plain.startswith("text: ")


def test_prompt_text_and_ids_conflict(model):
    _, gguf, art = model
    proc = kiln_run(art, "--weights", gguf, "--prompt", "hi",
                    "--prompt-tokens", "1")
    assert proc.returncode == 2
    assert "give --prompt or --prompt-tokens, not both" in proc.stderr


def test_bench_sampler():
    """kiln-run --bench-sampler times the host's sampler alone (no
    artifact): every draw a token of the vocabulary, the same draws for a
    seed, and its usage errors."""
    def bench(*args):
        return json.loads(run_tool("kiln-run", "--bench-sampler", 5000,
                                   "--steps", 40, "--json", *args).stdout)
    a = bench("--temperature", "0.7", "--top-k", "50", "--seed", "4",
              "--frequency-penalty", "0.5")
    assert a["vocab"] == 5000 and a["draws"] == 40 and a["ms_per_draw"] > 0
    # 45 draws (5 untimed), each an id below the vocabulary.
    assert 0 <= a["token_sum"] <= 45 * 4999
    b = bench("--temperature", "0.7", "--top-k", "50", "--seed", "4",
              "--frequency-penalty", "0.5")
    assert b["token_sum"] == a["token_sum"]
    # A penalty's keys' draw needs a history (not timed); a temperature,
    # alone or with a top-p or a top-k, has its time (40 more draws in the
    # sum).
    assert a["keys_ms_per_draw"] is None
    for extra in ((), ("--top-p", "0.9"), ("--top-k", "50"),
                  ("--bench-head", "8")):
        c = bench("--temperature", "0.7", "--seed", "4", *extra)
        assert c["keys_ms_per_draw"] > 0 and 0 <= c["token_sum"] <= 85 * 4999
    # A head of logits raised by 20 moves the draws to it.
    assert c["token_sum"] != bench("--temperature", "0.7",
                                   "--seed", "4")["token_sum"]
    for args, says in [((), "give --temperature T > 0"),
                       (("--bench-head", "-1", "--temperature", "1"),
                        "--bench-head: expected a count >= 0"),
                       (("x.kiln", "--temperature", "1"), "needs no artifact")]:
        proc = subprocess.run([str(tool("kiln-run")), "--bench-sampler", "10",
                               *args], capture_output=True, text=True)
        assert proc.returncode == 2 and says in proc.stderr


def test_min_p_and_repeat_penalty(model):
    _, gguf, art = model
    def run(*flags):
        proc = kiln_run(art, "--weights", gguf, "--prompt-tokens", "3,1,4",
                        "-n", 20, "--ignore-eos", "--json", *flags, check=True)
        return json.loads(proc.stdout)["tokens"]
    greedy = run()
    # min-p close to 1 keeps only the most likely token: sampling is greedy.
    assert run("--temperature", "1", "--min-p", "0.999", "--seed", "5") == greedy
    # A penalty of 1 changes nothing; a huge one forbids every recent token.
    assert run("--repeat-penalty", "1") == greedy
    strong = run("--repeat-penalty", "1e6")
    assert len(set(strong)) == len(strong)
    assert not set(strong) & {3, 1, 4}


def test_frequency_and_presence_penalties(model, tmp_path):
    """OpenAI's additive penalties against numpy: the first generated token
    is the argmax of the last prompt position's logits less frequency x
    count and presence once for each token of the prompt (64-token window;
    computed in double, rounded to float, as the sampler does)."""
    _, gguf, art = model
    changed = 0
    for prompt in ([3, 1, 4, 1, 5, 9, 2, 6], [7, 7, 7, 8], [100, 5, 100, 5]):
        toks = ",".join(map(str, prompt))
        out = tmp_path / "logits.npy"
        kiln_run(art, "--weights", gguf, "--prompt-tokens", toks, "-n", 0,
                 "--logits-out", out, check=True)
        last = np.load(out)[-1].astype(np.float64)
        counts = np.bincount(prompt, minlength=last.size)
        for f, p in ((0.5, 0), (0, 1.5), (2, 2), (-2, 0), (0, 0)):
            want = int(np.argmax((last - f * counts - p * (counts > 0))
                                 .astype(np.float32)))
            proc = kiln_run(art, "--weights", gguf, "--prompt-tokens", toks,
                            "-n", 1, "--ignore-eos", "--json",
                            "--frequency-penalty", f, "--presence-penalty", p,
                            check=True)
            got = json.loads(proc.stdout)["tokens"][0]
            assert got == want, (prompt, f, p)
            changed += want != int(np.argmax(last))
    # The cases must exercise the penalties, not just greedy decoding.
    assert changed > 0
    proc = kiln_run(art, "--weights", gguf, "--prompt-tokens", "1",
                    "--presence-penalty", "3")
    assert proc.returncode == 2
    assert "--presence-penalty: expected a number from -2 to 2" in proc.stderr


def test_stop_string(model):
    _, gguf, art = model
    def run(*flags):
        proc = kiln_run(art, "--weights", gguf, "--prompt", "Hello", "-n", 24,
                        "--ignore-eos", "--json", *flags, check=True)
        return json.loads(proc.stdout)
    full = run()["text"]
    # Two ASCII letters or digits from the middle of the text as the stop.
    at = next((i for i in range(2, len(full) - 1)
               if full[i:i + 2].isascii() and full[i:i + 2].isalnum()), None)
    if at is None:
        pytest.skip("the random text has no two ASCII letters in a row")
    stop = full[at:at + 2]
    cut = run("--stop", stop)
    assert cut["text"] == full[:full.find(stop)]
    assert len(cut["tokens"]) < 24


def test_gpu_only_modes_are_refused_on_cpu(model):
    """--bench, --simulate-rank, --profile and --one-gpu need a GPU backend:
    the CPU plugin says so instead of running something else."""
    _, gguf, art = model
    err = error_of(kiln_run(art, "--bench"))
    assert "need a GPU backend" in err
    err = error_of(kiln_run(art, "--weights", gguf, "--prompt-tokens", "1",
                            "--profile"))
    assert "the CPU backend has none" in err
    err = error_of(kiln_run(art, "--weights", gguf, "--prompt-tokens", "1",
                            "--one-gpu"))
    assert "--one-gpu places a GPU backend's ranks" in err
    for args, message in (
            (["--weights", gguf, "--prompt-tokens", "1", "--simulate-rank",
              "0/2"], "--simulate-rank and --context are --bench options"),
            (["--bench", "--simulate-rank", "3/2"],
             "--simulate-rank: expected R/N with R < N"),
            (["--bench", "--one-gpu", "--simulate-rank", "0/2"],
             "--one-gpu runs them all: give one of them")):
        proc = kiln_run(art, *args)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_weights_are_read_once_and_reported(model):
    """kiln-run reads each bound tensor once (a progress bar only on a
    terminal: stderr stays empty here) and reports the bytes: exactly the
    tensors the artifact binds, as gguf-py sizes them."""
    import json
    from gguf import GGUFReader
    _, gguf, art = model
    proc = kiln_run(art, "--weights", gguf, "--prompt-tokens", "1,2", "-n", 1,
                    "--json")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    report = json.loads(proc.stdout)
    described = kiln_run(art, "--describe").stdout
    bound = {line.split()[1] for line in described.splitlines()
             if line.strip().startswith("binds ")}
    sizes = {t.name: int(t.n_bytes) for t in GGUFReader(str(gguf)).tensors}
    assert report["weight_bytes"] == sum(sizes[name] for name in bound)
    assert report["weight_seconds"] >= 0
