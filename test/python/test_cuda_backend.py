"""The CUDA backend against the CPU backend, on a GPU host.

Runs from a pack made by utils/gpu-pack.sh (binaries, plugins and
artifacts built on a machine with MLIR; the GPU host has none), found in
$KILN_GPU_PACK (default: gpu-pack at the repository root). Needs numpy only,
so it runs where pytest is missing too:

    python3 test/python/test_cuda_backend.py [--pack DIR]

Under pytest without a GPU or a pack, every test skips with one line.

What is compared, teacher-forced (the same token sequence fed to both, the
logits of every position kept):
  * CUDA (graph) vs CPU on tiny-f32 (f32 weights and caches), tiny-mix (the
    tiny quant mix, f16 caches) and small (UD-Q4_K_XL-like mix, f32
    caches): max |cuda - cpu| / max |cpu| per position within TOL_*;
    argmax equal at every position whose CPU decision gap (top-1 minus
    top-2, relative to max |logit|) exceeds twice that tolerance (GLM5.md
    section 7: a smaller gap may flip on rounding alone);
  * graph replay vs --eager: bit-identical;
  * the shared expert inside the routed experts' kernels (small with
    256-wide experts, where the CUDA backend runs it there; the models
    above run it as its own launches) vs the CPU, and graph vs --eager;
  * the 2-bit mix (small, ud-q2_k_xl: Q2_K / Q3_K routed experts) vs the
    CPU, and graph vs --eager;
  * tp=N (2, and 4 and 8 where the pack has the artifacts) vs tp=1, on N
    GPUs where the host has them, else every rank on one GPU (--one-gpu):
    within the same tolerance, same argmax rule; also with the router
    folded into the attention's all-reduce (kiln-compile --fold-router,
    and =composed), with both all-reduces where the ranks have GPUs each;
  * the same with the router's choice inside that all-reduce
    (--fuse-router-choice: tiny-f32 and small), five runs of each
    bit-identical (a race at load showed as a wrong run now and then);
  * greedy generation on CUDA equals the CPU's up to the first step whose
    CPU decision gap does not clear the rule;
  * a temperature, with a top-p or not, drawn on the GPU (DrawKey.h) is,
    token by token, the reference's draw over the GPU's own logits (exact),
    graph, --eager and tp=2; with penalties and logit biases, which the
    step adjusts the logits for, the reference's choice over them adjusted;
  * compute-sanitizer memcheck on the tiny model: no errors;
  * kiln-serve on the CUDA backend answers completions (one, then one
    whose prompt extends it, so the server evaluates only the new part of
    the cached prefix) with the text kiln-run generates for the same
    prompt on the same backend (greedy: the server is a transport, not a
    second model).
The tolerances: both backends accumulate in f32 in different orders (warp
trees vs sequential loops), about 1e-6 relative per dot product; 48 layers
deep of residual updates and a softmax keep that below 1e-4 with f32
caches (measured: see docs/perf.md). With f16 caches a last-bit difference
before rounding an entry to f16 can flip it by one f16 ulp (5e-4
relative), so those compare at 2e-3.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SEED_TOKENS = 20261130
POSITIONS = 48
# The positions utils/gpu-pack.sh compiles the small models' artifacts for.
CONTEXT = 64
TOL_F32 = 1e-4
TOL_F16 = 2e-3

MODELS = {
    # name: (kiln-gguf synth arguments, exactly as utils/gpu-pack.sh compiles
    # the artifacts from; tolerance)
    "tiny-f32": (["--preset", "tiny", "--seed", 4, "--mix", "f32",
                  "--indexer-top-k", 8], TOL_F32),
    # f16 caches: the indexer keeps every position (top-k 64 >= the 48
    # evaluated), since one f16 rounding flip of a cache entry (below) moves
    # indexer scores by ~1e-4, enough to swap a DSA choice on a tiny random
    # model (GLM5.md section 7). DSA selection is checked exactly per op
    # (kiln-cuda-ops) and end to end with f32 caches (tiny-f32, small).
    # With a top-k of the artifacts' CONTEXT the compiler leaves the
    # indexers out (kiln-elide-indexers): this model checks that form.
    "tiny-mix": (["--preset", "tiny", "--seed", 6, "--indexer-top-k", 64],
                 TOL_F16),
    "small": (["--preset", "small", "--seed", 2, "--indexer-top-k", 4],
              TOL_F32),
}
# Models of the shared-expert check alone (Checks.shared_expert): small
# with experts (and so the shared expert) 256 wide, the width at which the
# CUDA backend runs the shared expert inside the routed experts' Q4_K /
# Q5_K kernels (GLM-5's at tp=8).
SHARED_MODELS = {
    "small-ff256": (["--preset", "small", "--seed", 3, "--indexer-top-k", 4,
                     "--expert-ff", 256], TOL_F32),
}
# Models of the low-bit check alone (Checks.low_bit): small in the 2-bit mix,
# its routed experts Q2_K (gate/up) and Q3_K (down), which the CUDA backend
# dots from the file's blocks (QuantDot.cuh's Q2_K / Q3_K routines).
LOW_BIT_MODELS = {
    "small-q2": (["--preset", "small", "--seed", 5, "--indexer-top-k", 4,
                  "--mix", "ud-q2_k_xl"], TOL_F32),
}
# Models of the tensor-core MLA check alone (Checks.mla_tensor_cores): small
# with f16 caches at tp=2, 8 heads a rank over 512 + 64 latent values, whose
# MLA the CUDA backend runs on the tensor cores by default (GLM-5's rank at
# tp=8). The indexers' top-k takes every position (elided), so no f16
# rounding of a cache entry can swap a DSA choice (see tiny-mix).
MLA_MODELS = {
    "small-f16": (["--preset", "small", "--seed", 7, "--indexer-top-k", 64],
                  TOL_F16),
}
SINGLE_MODELS = {**SHARED_MODELS, **LOW_BIT_MODELS, **MLA_MODELS}


def indexed(model):
    """Whether the model's artifacts keep their DSA indexers: the compiler
    leaves out an indexer whose top-k takes every position the artifact
    holds (kiln-elide-indexers)."""
    args = MODELS[model][0]
    return int(args[args.index("--indexer-top-k") + 1]) < CONTEXT


def pack_dir():
    return Path(os.environ.get("KILN_GPU_PACK", ROOT / "gpu-pack"))


def have_gpu():
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def gpu_count():
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                         text=True).stdout
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def env(pack, extra=None):
    e = dict(os.environ)
    e.update(extra or {})
    e["LD_LIBRARY_PATH"] = str(pack / "lib") + (
        ":" + e["LD_LIBRARY_PATH"] if e.get("LD_LIBRARY_PATH") else "")
    e.setdefault("NCCL_NVLS_ENABLE", "0")
    return e


def run(pack, args, extra_env=None, **kw):
    proc = subprocess.run([str(a) for a in args], capture_output=True,
                          text=True, env=env(pack, extra_env), **kw)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} failed "
                             f"({proc.returncode}):\n{proc.stderr}")
    return proc


def ensure_model(pack, name):
    """A model's weights, synthesised here (the artifacts were compiled from
    the same arguments' tensor table)."""
    path = pack / "models" / f"{name}.gguf"
    if not path.exists():
        run(pack, [pack / "bin" / "kiln-gguf", "synth", path,
                   *{**MODELS, **SINGLE_MODELS}[name][0], "--quiet"])
    return path


def tokens_for(vocab_hint=64):
    rng = np.random.default_rng(SEED_TOKENS)
    return [int(t) for t in rng.integers(1, vocab_hint, POSITIONS)]


def logits(pack, art, gguf, tokens, out, extra=(), extra_env=None):
    run(pack, [pack / "bin" / "kiln-run", art, "--weights", gguf,
               "--backend-dir", pack / "lib", "--prompt-tokens",
               ",".join(map(str, tokens)), "-n", 0, "--logits-out", out,
               *extra], extra_env=extra_env)
    return np.load(out)


def rel(a, b):
    """Per position: max |a - b| / max |b|."""
    return np.max(np.abs(a - b), axis=1) / np.max(np.abs(b), axis=1)


def gaps(ref):
    top2 = np.sort(ref, axis=1)[:, -2:]
    return (top2[:, 1] - top2[:, 0]) / np.max(np.abs(ref), axis=1)


def compare(name, got, ref, tol, report):
    err = rel(got, ref)
    g = gaps(ref)
    decided = g > 2 * tol
    same = np.argmax(got, axis=1) == np.argmax(ref, axis=1)
    ok = bool(np.all(err <= tol) and np.all(same[decided]))
    report.append(f"| {name} | {err.max():.2e} | {tol:g} | "
                  f"{int(same[decided].sum())}/{int(decided.sum())} | "
                  f"{'PASS' if ok else 'FAIL'} |")
    return ok


class Checks:
    def __init__(self, pack, work):
        self.pack, self.work = pack, Path(work)
        self.models = pack / "models"
        self.report = []
        self.failed = []

    def art(self, model, target, tp):
        return self.models / f"{model}.{target}.tp{tp}.kiln"

    def gguf(self, model):
        return ensure_model(self.pack, model)

    def check(self, ok, what):
        if not ok:
            self.failed.append(what)

    def identical(self, label, got, want, what, ok=True):
        """A row requiring got == want bit for bit (and `ok`)."""
        same = np.array_equal(got, want) and ok
        self.report.append(f"| {label} | {np.max(np.abs(got - want)):.1e} | "
                           f"bit-identical | - | {'PASS' if same else 'FAIL'} |")
        self.check(same, what)

    def logits_said(self, model, art, gguf, toks, extra, extra_env):
        """Logits with `extra` flags and `extra_env`, and the backend's
        stderr."""
        tag = "".join(f"-{k}{v}" for k, v in extra_env.items())
        out = self.work / f"{model}-{art.stem}{tag}.npy"
        proc = run(self.pack, [self.pack / "bin" / "kiln-run", art,
                               "--weights", gguf, "--backend-dir",
                               self.pack / "lib", "--prompt-tokens",
                               ",".join(map(str, toks)), "-n", 0,
                               "--logits-out", out, *extra],
                   extra_env=extra_env)
        return np.load(out), proc.stderr

    def noted(self, model, art, gguf, toks, extra, extra_env, note):
        """Logits with `extra_env`, and the first group of the regular
        expression `note` in the backend's stderr (None if it did not say
        it)."""
        got, said = self.logits_said(model, art, gguf, toks, extra, extra_env)
        found = re.search(note, said)
        return got, found.group(1) if found else None

    def direct_slots(self, model, art, gguf, toks, extra, extra_env=None):
        """Logits with KILN_CUDA_DIRECT_SLOTS=1 (and `extra_env`), and the
        backend's count of the all-reduces it placed so ("N of M"; None if
        it did not say)."""
        return self.noted(model, art, gguf, toks, extra,
                          {"KILN_CUDA_DIRECT_SLOTS": "1", **(extra_env or {})},
                          r"(?:DIRECT_SLOTS=1|direct slots): (\d+ of \d+) "
                          r"all-reduces")

    def teacher_forced(self, model):
        tol = MODELS[model][1]
        gguf, toks = self.gguf(model), tokens_for()
        cpu = logits(self.pack, self.art(model, "cpu", 1), gguf, toks,
                     self.work / f"{model}-cpu.npy")
        graph = logits(self.pack, self.art(model, "cuda", 1), gguf, toks,
                       self.work / f"{model}-cuda.npy")
        eager = logits(self.pack, self.art(model, "cuda", 1), gguf, toks,
                       self.work / f"{model}-eager.npy", ["--eager"])
        self.check(compare(f"{model}: cuda tp1 graph vs cpu", graph, cpu, tol,
                           self.report), f"{model} cuda vs cpu")
        self.identical(f"{model}: graph vs --eager", graph, eager,
                       f"{model} graph vs eager")
        # The kernels compiled for GLM-5's shapes, every family
        # (KILN_CUDA_SPECIALISED=1), against none (=0): the same bits, and
        # the default's (some families) too. Of these models only small
        # has such shapes (attn_k_b's 192 and attn_v_b's 512 values a head,
        # attn_output's 4,096, the shared expert's down 2,048), so there
        # the captured step must also have run some.
        general = logits(self.pack, self.art(model, "cuda", 1), gguf, toks,
                         self.work / f"{model}-general.npy",
                         extra_env={"KILN_CUDA_SPECIALISED": "0"})
        # The logits, and what kiln-run said, with graph statistics on
        # (KILN_CUDA_GRAPH_STATS) and `extra_env`.
        def logits_and_stats(name, extra_env):
            out = self.work / f"{model}-{name}.npy"
            proc = run(self.pack, [self.pack / "bin" / "kiln-run",
                                   self.art(model, "cuda", 1), "--weights",
                                   gguf, "--backend-dir", self.pack / "lib",
                                   "--prompt-tokens",
                                   ",".join(map(str, toks)), "-n", 0,
                                   "--logits-out", out],
                       extra_env={**extra_env, "KILN_CUDA_GRAPH_STATS": "1"})
            return np.load(out), proc.stderr

        fixed, stats = logits_and_stats("fixed",
                                        {"KILN_CUDA_SPECIALISED": "1"})
        launched = re.findall(r"(\d+) launches of kernels compiled for "
                              r"their shapes", stats)
        ran = sum(int(n) for n in launched)
        self.identical(f"{model}: fixed-shape kernels (all, and the "
                       f"default's) vs general ({ran} launches a step)",
                       fixed, general, f"{model} fixed-shape kernels vs general",
                       ok=(np.array_equal(general, graph) and
                           (ran > 0 or model != "small")))
        # attn_q_b's rows cut per slice of its heads (kiln-split-projections,
        # the default) against its slices copied out after one mat-vec
        # (--split-projections=false): every row is the same dot product.
        sliced = logits(self.pack, self.models / f"{model}.cuda-sliced.tp1.kiln",
                        gguf, toks, self.work / f"{model}-sliced.npy")
        self.identical(f"{model}: attn_q_b cut per slice vs its slices "
                       f"copied (--split-projections=false)", graph, sliced,
                       f"{model} split projections vs slices")
        # A switch (VAR=value) that must leave the logits bit for bit as
        # the default graph's.
        def same_bits(var, name, label, what, value="1"):
            got = logits(self.pack, self.art(model, "cuda", 1), gguf, toks,
                         self.work / f"{model}-{name}.npy",
                         extra_env={var: value})
            self.identical(f"{model}: {label}", got, graph, f"{model} {what}")

        # The schedule's and the launches' switches (docs/perf.md,
        # thirty-sixth pass): the same kernels on the same inputs, ordered
        # otherwise, so the same bits. The light ops scheduled as any other
        # (KILN_CUDA_LIGHT_OPS=0), every branch edge kept in the graph,
        # also those the waits make redundant (KILN_CUDA_DROP_BRANCH_EDGES=
        # 0), MLA's blocks free to share multiprocessors
        # (KILN_CUDA_MLA_ALONE=0), its dependents scheduled at its start
        # (KILN_CUDA_MLA_LATE_DEPENDENTS=0).
        same_bits("KILN_CUDA_LIGHT_OPS", "lightops",
                  "light ops scheduled as the others vs the default",
                  "light ops vs default", value="0")
        same_bits("KILN_CUDA_DROP_BRANCH_EDGES", "keepedges",
                  "every branch edge kept vs the redundant ones left out",
                  "kept branch edges vs default", value="0")
        same_bits("KILN_CUDA_MLA_ALONE", "mlashared",
                  "MLA's blocks free to share a multiprocessor vs one each",
                  "MLA blocks shared vs alone", value="0")
        # MLA's cache rows all loaded after its wait
        # (KILN_CUDA_MLA_EARLY_ROWS=0) against the default, which loads the
        # earlier steps' rows before it: the same rows; this step's own
        # row, written by its predecessor, is read after the wait in both
        # (read before it, it would be stale and the logits would differ).
        same_bits("KILN_CUDA_MLA_EARLY_ROWS", "laterows",
                  "MLA's rows all loaded after its wait vs the earlier "
                  "steps' before it", "MLA late rows vs early", value="0")
        same_bits("KILN_CUDA_MLA_LATE_DEPENDENTS", "mlaearly",
                  "MLA's dependents scheduled at its start vs after its "
                  "chunks", "MLA dependents early vs late", value="0")
        # The indexer's switches, where the compiler kept the indexers.
        if not indexed(model):
            self.report.append(f"| {model}: the selection's switches | - | "
                               f"not run: no indexers (top-k >= the "
                               f"artifact's {CONTEXT} positions) | - | - |")
        else:
            # The indexer's top-k as before the seventeenth pass
            # (KILN_CUDA_CLUSTER_SELECT=1: its cluster of blocks, four
            # radix passes) against the default (one block at these counts,
            # stopping once the threshold is known): the same selection, so
            # the same bits. tiny-f32 (top 8) and small (top 4) select from
            # up to 48 positions.
            same_bits("KILN_CUDA_CLUSTER_SELECT", "cluster",
                      "indexer top-k by the cluster, four passes, vs the "
                      "default", "cluster selection vs default")
            # One graph (KILN_CUDA_SHORT_GRAPH=0: the indexers at every
            # position) against the default's two (the steps below the
            # indexers' top-k replay a graph without them, MLA attending
            # every position without reading the selection): the same
            # entries in the same order, so the same bits. The prompt runs
            # past tiny-f32's top 8 and small's top 4 (both graphs
            # replayed).
            same_bits("KILN_CUDA_SHORT_GRAPH", "onegraph",
                      "one graph (the indexers below their top-k too) vs "
                      "two", "one graph vs two", value="0")
            # The selection by clusters of 16 blocks from a count of
            # attended positions on (KILN_CUDA_SELECT_WIDE_FROM=N: a second
            # graph, which the steps from N attended positions replay, each
            # indexer's selection by 16 blocks where the GPU runs such
            # clusters) against the default's one graph: the same selection,
            # so the same bits. From half the prompt, so that both graphs
            # are replayed; the capture's statistics must name the second
            # graph. (At these counts the cluster's first block selects
            # alone; utils/gpu-test.sh's 16k check runs the cluster of 16
            # itself.)
            wide_from = POSITIONS // 2
            wide, stats = logits_and_stats(
                "wide", {"KILN_CUDA_SELECT_WIDE_FROM": str(wide_from)})
            captured = f"from {wide_from} attended positions" in stats
            self.identical(f"{model}: selection by clusters of 16 from "
                           f"{wide_from} attended positions (a second graph"
                           f"{'' if captured else ', not captured'}) vs the "
                           f"default", wide, graph,
                           f"{model} wide selection graph vs default",
                           ok=captured)
        # attn_v_b by MLA's launch (KILN_CUDA_MLA_PROJECTION=1: the combine
        # and the projection in one kernel, a cluster a head; where the
        # weight is Q8_0, tiny-mix and small, their latent widths 64 and 512;
        # tiny-f32's runs as a mat-vec after MLA either way) against the CPU,
        # the same tolerance.
        inside = logits(self.pack, self.art(model, "cuda", 1), gguf, toks,
                        self.work / f"{model}-mlaproj.npy",
                        extra_env={"KILN_CUDA_MLA_PROJECTION": "1"})
        self.check(compare(f"{model}: cuda tp1 graph, v_b inside MLA, vs cpu",
                           inside, cpu, tol, self.report),
                   f"{model} cuda v_b inside MLA vs cpu")
        # tp = N against tp = 1, for every N the pack has an artifact for
        # (utils/gpu-pack.sh KILN_PACK_TPS): on N GPUs where the host has
        # them, else every rank on one GPU (kiln-run --one-gpu: the same
        # ranks and one-shot all-reduces, exchanging through that GPU's
        # memory; NCCL's all-reduce then has no part).
        for tp in (2, 4, 8):
            art = self.art(model, "cuda", tp)
            if not art.exists():
                continue
            spread = gpu_count() >= tp
            place = [] if spread else ["--one-gpu"]
            where = f"{tp} GPUs" if spread else f"{tp} ranks on one GPU"
            part = logits(self.pack, art, gguf, toks,
                          self.work / f"{model}-tp{tp}.npy", place)
            self.check(compare(f"{model}: cuda tp{tp} ({where}) vs cuda tp1",
                               part, graph, tol, self.report),
                       f"{model} tp{tp}")
            parte = logits(self.pack, art, gguf, toks,
                           self.work / f"{model}-tp{tp}e.npy",
                           place + ["--eager"])
            self.identical(f"{model}: tp{tp} ({where}) graph vs --eager",
                           part, parte, f"{model} tp{tp} graph vs eager")
            # The all-reduces' inputs written by their producers straight
            # into the exchange (KILN_CUDA_DIRECT_SLOTS=1) against copied
            # there by the all-reduces (=0), whichever is the default: the
            # same sums in the same order, so the same bits, graph and
            # eager; the backend must say it placed some.
            copied = logits(self.pack, art, gguf, toks,
                            self.work / f"{model}-tp{tp}copied.npy", place,
                            extra_env={"KILN_CUDA_DIRECT_SLOTS": "0"})
            for mode in ([], ["--eager"]):
                how = ", eager" if mode else ""
                direct, placed = self.direct_slots(model, art, gguf, toks,
                                                   place + mode)
                self.identical(f"{model}: tp{tp} ({where}{how}, direct "
                               f"slots: {placed}) vs copied, graph",
                               direct, copied,
                               f"{model} tp{tp} direct slots{how}",
                               ok=placed is not None and
                               not placed.startswith("0 "))
            # Each all-reduce's epoch from the step's word and its call's
            # place (the default) against loaded from the exchange by each
            # block (KILN_CUDA_STEP_EPOCHS=0): the same parts in the same
            # order, so the same bits, graph and eager; the ranks' flags
            # meet only where they give a call the same epoch.
            for mode, want in (([], part), (["--eager"], parte)):
                how = ", eager" if mode else ""
                loaded = logits(self.pack, art, gguf, toks,
                                self.work / f"{model}-tp{tp}loaded.npy",
                                place + mode,
                                extra_env={"KILN_CUDA_STEP_EPOCHS": "0"})
                self.identical(f"{model}: tp{tp} ({where}{how}) step epochs "
                               f"vs loaded from the exchange", want, loaded,
                               f"{model} tp{tp} step epochs{how}")
            # Every all-reduce by blocks that are not a cluster
            # (KILN_CUDA_PEER_CLUSTER=0) against one cluster each (=1),
            # whichever is the default: the fused norm's parts through the
            # exchange, added in the cluster's order, so the same bits, graph
            # and eager, and with direct slots against copied parts.
            flat_env = {"KILN_CUDA_PEER_CLUSTER": "0"}
            clustered = logits(self.pack, art, gguf, toks,
                               self.work / f"{model}-tp{tp}cluster.npy",
                               place, extra_env={"KILN_CUDA_PEER_CLUSTER": "1"})
            for mode in ([], ["--eager"]):
                how = ", eager" if mode else ""
                flat = logits(self.pack, art, gguf, toks,
                              self.work / f"{model}-tp{tp}flat.npy",
                              place + mode, extra_env=flat_env)
                self.identical(f"{model}: tp{tp} ({where}{how}, no cluster) "
                               f"vs clusters, graph", flat, clustered,
                               f"{model} tp{tp} no cluster{how}")
            direct, placed = self.direct_slots(model, art, gguf, toks, place,
                                               flat_env)
            self.identical(f"{model}: tp{tp} ({where}, no cluster, direct "
                           f"slots: {placed}) vs clusters, copied", direct,
                           copied, f"{model} tp{tp} no cluster, direct slots",
                           ok=placed is not None and
                           not placed.startswith("0 "))
            # Every part pushed into every rank's exchange instead of
            # pulled from it (KILN_CUDA_PEER_PUSH=1, off by default): the
            # same sums in the same order, the default's bits; the backend
            # must say the ranks push.
            pushed, said = self.noted(model, art, gguf, toks, place,
                                      {"KILN_CUDA_PEER_PUSH": "1"},
                                      r"PEER_PUSH=1: (\d+) ranks push")
            self.identical(f"{model}: tp{tp} ({where}, parts pushed: "
                           f"{said} ranks) vs the default graph", pushed,
                           part, f"{model} tp{tp} pushed",
                           ok=said == str(tp))
            # The same with NCCL's all-reduce instead of the one-shot
            # kernel over NVLink peers (the default).
            alls = [("", None)]
            if spread:
                nccl = logits(self.pack, art, gguf, toks,
                              self.work / f"{model}-tp{tp}n.npy",
                              extra_env={"KILN_CUDA_ALLREDUCE": "nccl"})
                self.check(compare(f"{model}: cuda tp{tp} ({tp} GPUs, NCCL's "
                                   f"all-reduce) vs cuda tp1", nccl, graph,
                                   tol, self.report), f"{model} tp{tp} nccl")
                alls.append((", NCCL's all-reduce",
                             {"KILN_CUDA_ALLREDUCE": "nccl"}))
            # The router folded into the attention's all-reduce
            # (--fold-router: its partial logits before it, divided by its
            # rms, the choice after it), with both all-reduces; its logits
            # differ from the unfolded step's by rounding only.
            # The same through the composed weight
            # (--fold-router=composed: the share as rows of attn_output's
            # launch, made at load). And with the choice inside the
            # all-reduce (--fuse-router-choice), run five times: a race at
            # load (inputs and zeros on the legacy stream, docs/perf.md's
            # twenty-second pass) made one run in eight wrong, so every
            # run must give the first run's bits.
            # And with the norms after the collectives inside the ops
            # that read them, the collectives taking the residual add
            # alone (--projection-norms, tiny-mix): all_reduce_add, q_a's
            # rms_norm_linear dividing its sums by the rms, and
            # rms_norm_router writing the normalised vector the experts
            # read.
            for kind, what in (("cuda-projnorm", "norms in q_a and the router"),
                               ("cuda-fold", "router folded"),
                               ("cuda-composed", "router composed"),
                               ("cuda-composed-choice",
                                "router composed, choice inside")):
                fold = self.art(model, kind, tp)
                if not fold.exists():
                    continue
                for label, extra_env in alls:
                    got = logits(self.pack, fold, gguf, toks,
                                 self.work / f"{model}-tp{tp}{kind}.npy",
                                 place, extra_env=extra_env)
                    self.check(compare(f"{model}: cuda tp{tp} ({where}, "
                                       f"{what}{label}) vs cuda tp1",
                                       got, graph, tol, self.report),
                               f"{model} tp{tp} {kind}{label}")
                    if kind == "cuda-projnorm" and not extra_env:
                        # all_reduce_add's inputs by direct slots too, and
                        # its sums by blocks that are not a cluster
                        # (KILN_CUDA_PEER_CLUSTER=0), against copied parts
                        # and clusters (whichever are the defaults).
                        plain = logits(
                            self.pack, fold, gguf, toks,
                            self.work / f"{model}-tp{tp}{kind}-plain.npy",
                            place, extra_env={"KILN_CUDA_DIRECT_SLOTS": "0",
                                              "KILN_CUDA_PEER_CLUSTER": "1"})
                        for flat in ("1", "0"):
                            how = ", no cluster" if flat == "0" else ""
                            direct, placed = self.direct_slots(
                                model, fold, gguf, toks, place,
                                {"KILN_CUDA_PEER_CLUSTER": flat})
                            self.identical(
                                f"{model}: tp{tp} ({where}, {what}, direct "
                                f"slots: {placed}{how}) vs without", direct,
                                plain,
                                f"{model} tp{tp} {kind} direct slots{how}",
                                ok=placed is not None and
                                not placed.startswith("0 "))
                    if kind != "cuda-composed-choice":
                        continue
                    again = [logits(self.pack, fold, gguf, toks,
                                    self.work / f"{model}-tp{tp}{kind}{i}.npy",
                                    place, extra_env=extra_env)
                             for i in range(4)]
                    self.identical(f"{model}: tp{tp} ({where}, {what}{label})"
                                   f", five runs", again[0], got,
                                   f"{model} tp{tp} {kind}{label} runs",
                                   all(np.array_equal(a, got) for a in again))
        return cpu

    def shared_expert(self):
        """The shared expert inside the routed experts' Q4_K / Q5_K kernels
        as a ninth expert of weight 1 (kiln-fuse-shared-expert, the
        default; the CUDA backend runs it there for a Q8_0 shared expert
        256 wide, small-ff256's) against the CPU, which computes it as the
        unfused ops do (test_fuse_shared_expert.py): the same tolerance and
        argmax rule, and graph vs --eager bit for bit."""
        for model, (_, tol) in SHARED_MODELS.items():
            self.single_against_cpu(
                model, tol, "shared expert",
                lambda stderr: sum(int(n) for n in re.findall(
                    r"(\d+) moe_experts with the shared expert inside",
                    stderr)),
                "shared expert inside the routed kernels: {} ops a step")

    def low_bit(self):
        """The 2-bit mix (LOW_BIT_MODELS: Q2_K / Q3_K routed experts)
        against the CPU: the same tolerance and argmax rule, and graph vs
        --eager bit for bit."""
        for model, (_, tol) in LOW_BIT_MODELS.items():
            self.single_against_cpu(model, tol, "2-bit mix", None, None)

    def mla_tensor_cores(self):
        """MLA on the tensor cores (MLA_MODELS, tp=2: 8 heads a rank; every
        rank on one GPU where the host has one) against the CPU at tp=1,
        and the scalar kernel (KILN_CUDA_MLA_MMA=0) likewise: the same
        tolerance and argmax rule; the graph's count of tensor-core MLA
        launches above zero by default and zero with the switch off; graph
        vs --eager bit for bit."""
        place = [] if gpu_count() >= 2 else ["--one-gpu"]
        note = r"(\d+) MLA launches on the tensor cores"
        for model, (_, tol) in MLA_MODELS.items():
            gguf, toks = self.gguf(model), tokens_for()
            art = self.art(model, "cuda", 2)
            cpu = logits(self.pack, self.art(model, "cpu", 1), gguf, toks,
                         self.work / f"{model}-cpu.npy")
            ran = {}
            got = {}
            for name, switch in (("tensor cores", {}),
                                 ("scalar", {"KILN_CUDA_MLA_MMA": "0"})):
                # Each rank's capture says its count.
                got[name], said = self.logits_said(
                    model, art, gguf, toks, place,
                    {**switch, "KILN_CUDA_GRAPH_STATS": "1"})
                ran[name] = sum(int(n) for n in re.findall(note, said))
                ok = compare(f"{model}: cuda tp2 graph, MLA {name} "
                             f"({ran[name]} launches on the tensor cores) "
                             f"vs cpu tp1", got[name], cpu, tol, self.report)
                want = ran[name] > 0 if not switch else ran[name] == 0
                self.check(ok and want, f"{model} MLA {name} vs cpu")
            eager = logits(self.pack, art, gguf, toks,
                           self.work / f"{model}-eager.npy",
                           ["--eager", *place])
            self.identical(f"{model}: tp2 graph vs --eager (MLA on the "
                           f"tensor cores)", got["tensor cores"], eager,
                           f"{model} MLA tensor cores graph vs eager")

    def single_against_cpu(self, model, tol, what, count, label):
        """One SINGLE_MODELS model: CUDA graph (with graph statistics on)
        against the CPU, and graph against --eager. `count`, when given,
        reads a number of ops from the backend's stderr that must be above
        zero, shown in the row through `label`."""
        gguf, toks = self.gguf(model), tokens_for()
        cpu = logits(self.pack, self.art(model, "cpu", 1), gguf, toks,
                     self.work / f"{model}-cpu.npy")
        out = self.work / f"{model}-cuda.npy"
        proc = run(self.pack, [self.pack / "bin" / "kiln-run",
                               self.art(model, "cuda", 1), "--weights",
                               gguf, "--backend-dir", self.pack / "lib",
                               "--prompt-tokens", ",".join(map(str, toks)),
                               "-n", 0, "--logits-out", out],
                   extra_env={"KILN_CUDA_GRAPH_STATS": "1"})
        got = np.load(out)
        n = count(proc.stderr) if count else None
        eager = logits(self.pack, self.art(model, "cuda", 1), gguf, toks,
                       self.work / f"{model}-eager.npy", ["--eager"])
        shown = f" ({label.format(n)})" if count else ""
        ok = compare(f"{model}: cuda tp1 graph{shown} vs cpu", got, cpu, tol,
                     self.report)
        self.check(ok and (n is None or n > 0), f"{model} {what} vs cpu")
        self.identical(f"{model}: graph vs --eager", got, eager,
                       f"{model} {what} graph vs eager")

    def greedy(self, model):
        """32 greedy tokens on each backend, the CPU's logits kept. The CUDA
        tokens must equal the CPU's up to and including the first step whose
        CPU decision gap is within twice the tolerance (from there on a
        rounding difference may choose otherwise, GLM5.md section 7); the
        row says how many steps that rule decided."""
        import json
        gguf, tol = self.gguf(model), MODELS[model][1]
        outs = {}
        for target in ("cpu", "cuda"):
            npy = self.work / f"{model}-greedy-{target}.npy"
            proc = run(self.pack, [self.pack / "bin" / "kiln-run",
                                   self.art(model, target, 1), "--weights",
                                   gguf, "--backend-dir", self.pack / "lib",
                                   "--prompt-tokens", "1,2,3", "-n", 32,
                                   "--ignore-eos", "--json", "--logits-out",
                                   npy])
            outs[target] = (json.loads(proc.stdout)["tokens"], np.load(npy))
        (cpu, cpu_logits), (cuda, _) = outs["cpu"], outs["cuda"]
        # Generated token i is chosen from evaluated position 2 + i.
        g = gaps(cpu_logits)[2:2 + len(cpu)]
        undecided = np.flatnonzero(g <= 2 * tol)
        decided = int(undecided[0]) + 1 if undecided.size else len(cpu)
        same = cpu[:decided] == cuda[:decided]
        self.report.append(f"| {model}: greedy 32 tokens cuda vs cpu | - | "
                           f"identical where decided | {decided}/{len(cpu)}"
                           f" (smallest gap {g.min():.1e}) | "
                           f"{'PASS' if same else 'FAIL'} |")
        self.check(same, f"{model} greedy")

    def drawn(self, model):
        """The step's own draw on the GPU (DrawKey.h; no logits cross for
        it), a plain temperature and one with a top-p (the step's nucleus,
        cut by the one-block argmax; at tp=2 over the whole vocabulary
        gathered by the nucleus's graph): each of 32 tokens must be
        draw_reference.py's draw over the logits of the position that drew
        it, the GPU's own logits (the keys' and the weights' bits are the
        same on both sides, so this is exact); --eager draws the same
        tokens, and so do tp=2's ranks (on two GPUs or one) from their own
        logits. A nucleus must move some draws (the plain keys' token falls
        outside it)."""
        import json
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from draw_reference import draw, nucleus
        gguf = self.gguf(model)
        seed = 20261205
        runs = [("tp1 graph", 1, []), ("tp1 --eager", 1, ["--eager"])]
        if self.art(model, "cuda", 2).exists():
            runs.append(("tp2", 2, [] if gpu_count() >= 2 else ["--one-gpu"]))
            runs.append(("tp2 --eager", 2, ["--eager"] if gpu_count() >= 2
                         else ["--eager", "--one-gpu"]))
        for temperature, top_p, min_p, top_k in ((0.9, None, None, None),
                                                 (1.1, 0.6, None, None),
                                                 (1.0, 0.9, 0.2, None),
                                                 (1.3, None, None, 6),
                                                 (1.2, 0.95, None, 30)):
            cut = (f", top-p {top_p}" if top_p else "") + \
                (f", min-p {min_p}" if min_p else "") + \
                (f", top-k {top_k}" if top_k else "")
            tokens = {}
            for label, tp, extra in runs:
                npy = self.work / f"{model}-drawn-{tp}{len(extra)}.npy"
                sampling = ["--temperature", temperature, "--seed", seed]
                if top_p:
                    sampling += ["--top-p", top_p]
                if min_p:
                    sampling += ["--min-p", min_p]
                if top_k:
                    sampling += ["--top-k", top_k]
                proc = run(self.pack, [self.pack / "bin" / "kiln-run",
                                       self.art(model, "cuda", tp),
                                       "--weights", gguf, "--backend-dir",
                                       self.pack / "lib", "--prompt-tokens",
                                       "1,2,3", "-n", 32, "--ignore-eos",
                                       "--json", *sampling, "--logits-out",
                                       npy, *extra])
                out, lg = json.loads(proc.stdout), np.load(npy)
                got = out["tokens"]
                want = [draw(lg[2 + i], temperature, seed, 2 + i, top_p,
                             min_p, top_k) for i in range(len(got))]
                greedy = [int(np.argmax(lg[2 + i])) for i in range(len(got))]
                ok = (got == want and got != greedy
                      and out["chooser"] == "step_draw")
                if top_p or top_k:
                    moved = sum(
                        not nucleus(lg[2 + i], temperature, top_p, min_p,
                                    top_k)[
                            draw(lg[2 + i], temperature, seed, 2 + i)]
                        for i in range(len(got)))
                    ok = ok and moved > 0
                tokens[label] = got
                self.report.append(
                    f"| {model}: drawn, T {temperature}{cut} seed {seed}, "
                    f"cuda {label} vs the reference's draw | - | exact | "
                    f"{sum(a == b for a, b in zip(got, want))}/{len(got)} | "
                    f"{'PASS' if ok else 'FAIL'} |")
                self.check(ok, f"{model} drawn{cut} {label}")
            same = tokens["tp1 graph"] == tokens["tp1 --eager"] and (
                "tp2" not in tokens or tokens["tp2"] == tokens["tp2 --eager"])
            self.report.append(f"| {model}: drawn{cut}, graph vs --eager | - "
                               f"| identical | - | "
                               f"{'PASS' if same else 'FAIL'} |")
            self.check(same, f"{model} drawn{cut} graph vs eager")

    def penalised(self, model):
        """Penalties and logit biases made by the step (the adjusting form,
        launchAdjustLogits before the argmax or the draw; no logits cross
        for them): each of 24 tokens must be draw_reference.py's choice
        over the GPU's own logits of its position adjusted over the tokens
        before it (adjust, then the argmax or the keys' draw; exact, as
        the drawn rows), graph, --eager and tp=2. The adjustments must move
        some choice."""
        import json
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from draw_reference import adjust, choice
        gguf = self.gguf(model)
        seed = 20261206
        runs = [("tp1 graph", 1, []), ("tp1 --eager", 1, ["--eager"])]
        if self.art(model, "cuda", 2).exists():
            runs.append(("tp2", 2, [] if gpu_count() >= 2 else ["--one-gpu"]))
        prompt = [1, 2, 3]
        # temperature, top-p, repeat, frequency, presence, biases: a bias
        # of 12 makes its token the usual draw, until the penalties on its
        # count outweigh it (smaller ones moved no draw of these models'
        # spread logits in the first run).
        for t, top_p, repeat, frequency, presence, biases in (
                (0.0, None, 0.3, 0.0, 0.0, ()),
                (1.0, None, 1.0, 1.2, 0.6, ((5, 12.0), (9, -2.0))),
                (1.1, 0.95, 1.4, 0.0, 0.5, ((7, 12.0),))):
            what = (f"T {t}" + (f", top-p {top_p}" if top_p else "") +
                    f", repeat {repeat}, frequency {frequency}, presence "
                    f"{presence}, {len(biases)} biases")
            tokens = {}
            for label, tp, extra in runs:
                npy = self.work / f"{model}-penalised-{tp}{len(extra)}.npy"
                sampling = ["--temperature", t, "--seed", seed,
                            "--repeat-penalty", repeat,
                            "--frequency-penalty", frequency,
                            "--presence-penalty", presence]
                for token, b in biases:
                    sampling += ["--logit-bias", f"{token}={b}"]
                if top_p:
                    sampling += ["--top-p", top_p]
                proc = run(self.pack, [self.pack / "bin" / "kiln-run",
                                       self.art(model, "cuda", tp),
                                       "--weights", gguf, "--backend-dir",
                                       self.pack / "lib", "--prompt-tokens",
                                       ",".join(map(str, prompt)), "-n", 24,
                                       "--ignore-eos", "--json", *sampling,
                                       "--logits-out", npy, *extra])
                out, lg = json.loads(proc.stdout), np.load(npy)
                got = out["tokens"]
                history, matched, moved = list(prompt), 0, 0
                for i, token in enumerate(got):
                    p = len(history) - 1
                    row = adjust(lg[p], history, repeat, frequency, presence,
                                 list(biases))
                    want = choice(row, t, seed, p, top_p)
                    plain = choice(lg[p], t, seed, p, top_p)
                    matched += token == want
                    moved += want != plain
                    history.append(token)
                ok = (matched == len(got) == 24 and moved > 0
                      and out["chooser"] == "step_draw")
                tokens[label] = got
                self.report.append(
                    f"| {model}: penalised, {what}, cuda {label} vs the "
                    f"reference's choice | - | exact | {matched}/{len(got)} "
                    f"({moved} moved) | {'PASS' if ok else 'FAIL'} |")
                self.check(ok, f"{model} penalised ({what}) {label}")
            same = tokens["tp1 graph"] == tokens["tp1 --eager"]
            self.report.append(f"| {model}: penalised, {what}, graph vs "
                               f"--eager | - | identical | - | "
                               f"{'PASS' if same else 'FAIL'} |")
            self.check(same, f"{model} penalised ({what}) graph vs eager")

    def architecture_guard(self):
        """An artifact compiled for another GPU architecture is refused at
        load, naming both (kiln-compile --target=cuda:sm_XX)."""
        cap = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap",
                              "--format=csv,noheader"], capture_output=True,
                             text=True).stdout.split()[0]
        mine = "sm_" + cap.replace(".", "")
        other = next(a for a in ("sm_90", "sm_100", "sm_120") if a != mine)
        proc = subprocess.run(
            [str(self.pack / "bin" / "kiln-run"),
             str(self.models / f"tiny-f32.cuda-{other}.tp1.kiln"), "--weights",
             str(self.gguf("tiny-f32")), "--backend-dir", str(self.pack / "lib"),
             "--prompt-tokens", "1", "-n", "1"],
            capture_output=True, text=True, env=env(self.pack))
        expected = f"compiled for {other} (kiln-compile --target=cuda:{other})"
        ok = proc.returncode == 1 and expected in proc.stderr and mine in proc.stderr
        same = subprocess.run(
            [str(self.pack / "bin" / "kiln-run"),
             str(self.models / f"tiny-f32.cuda-{mine}.tp1.kiln"), "--weights",
             str(self.gguf("tiny-f32")), "--backend-dir", str(self.pack / "lib"),
             "--prompt-tokens", "1", "-n", "1"],
            capture_output=True, text=True, env=env(self.pack)).returncode == 0
        self.report.append(f"| architecture guard: {other} artifact on a {mine} "
                           f"GPU refused, {mine} artifact runs | - | - | - | "
                           f"{'PASS' if ok and same else 'FAIL: ' + proc.stderr[-200:]} |")
        self.check(ok and same, "architecture guard")

    def kernel_images(self):
        """The kernels that run are the artifact's: --profile names the
        images the plugin ran them from, and an artifact whose image is
        damaged (its fatbin header zeroed, the file checksum made valid
        again) is refused naming the payload."""
        art, gguf = self.art("tiny-f32", "cuda", 1), self.gguf("tiny-f32")
        base = [str(self.pack / "bin" / "kiln-run"), None, "--weights",
                str(gguf), "--backend-dir", str(self.pack / "lib"),
                "--prompt-tokens", "1,2", "-n", "1"]
        base[1] = str(art)
        proc = subprocess.run(base + ["--profile"], capture_output=True,
                              text=True, env=env(self.pack))
        ran = re.search(r"runs (\d+) kernels from the artifact's images: "
                        r"(sm_\d+)/StepKernels.fatbin", proc.stderr)
        ok = proc.returncode == 0 and ran is not None and int(ran[1]) > 0
        self.report.append(f"| tiny-f32: kernels run from the artifact's "
                           f"images | - | - | - | "
                           f"{'PASS (' + ran[1] + ' kernels, ' + ran[2] + ')' if ok else 'FAIL: ' + proc.stderr[-300:]} |")
        self.check(ok, "kernel images used")

        data = bytearray(art.read_bytes())
        at = data.find(bytes([0x50, 0xED, 0x55, 0xBA]))
        data[at:at + 64] = bytes(64)
        hashed = 0xCBF29CE484222325
        for byte in bytes(data[32:]):
            hashed = ((hashed ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
        data[24:32] = hashed.to_bytes(8, "little")
        damaged = self.work / "damaged-image.kiln"
        damaged.write_bytes(bytes(data))
        base[1] = str(damaged)
        proc = subprocess.run(base, capture_output=True, text=True,
                              env=env(self.pack))
        ok = (proc.returncode == 1 and "payload cuda/sm_" in proc.stderr and
              "the kernel image does not load" in proc.stderr)
        self.report.append(f"| damaged kernel image refused, naming the "
                           f"payload | - | - | - | "
                           f"{'PASS' if ok else f'FAIL (exit {proc.returncode}): ' + proc.stderr[-300:]} |")
        self.check(ok, "damaged kernel image")

    def serve(self):
        """kiln-serve on the CUDA backend: /health, then two greedy
        completions (the second prompt extends the first, so its prefix is
        reused) whose text and token counts equal kiln-run's."""
        import json
        import urllib.request
        model, n = "tiny-mix", 8
        art, gguf = self.art(model, "cuda", 1), self.gguf(model)
        binary = self.pack / "bin" / "kiln-serve"
        if not binary.exists():
            self.report.append("| kiln-serve on cuda | - | - | - | FAIL: "
                               "kiln-serve is not in the pack |")
            self.failed.append("kiln-serve missing")
            return
        proc = subprocess.Popen(
            [str(binary), str(art), "--weights", str(gguf), "--port", "0",
             "--model-name", "tiny", "--backend-dir", str(self.pack / "lib")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env(self.pack))
        results, problem = [], None
        try:
            line = proc.stdout.readline()
            if "serving 'tiny' on http://127.0.0.1:" not in line:
                raise AssertionError(f"kiln-serve did not start: {line!r} "
                                     f"{proc.stderr.read()[-300:] if proc.poll() is not None else ''}")
            url = "http://127.0.0.1:" + line.split("http://127.0.0.1:")[1].split()[0]
            with urllib.request.urlopen(url + "/health", timeout=60) as r:
                if json.load(r) != {"status": "ok"}:
                    raise AssertionError("/health did not answer ok")
            for prompt in ("Kiln compiles", "Kiln compiles models for"):
                body = json.dumps({"model": "tiny", "prompt": prompt,
                                   "max_tokens": n, "temperature": 0}).encode()
                req = urllib.request.Request(
                    url + "/v1/completions", data=body,
                    headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=120) as r:
                    got = json.load(r)
                want = json.loads(run(self.pack, [
                    self.pack / "bin" / "kiln-run", art, "--weights", gguf,
                    "--backend-dir", self.pack / "lib", "--prompt", prompt,
                    "-n", n, "--json"]).stdout)
                results.append(
                    got["choices"][0]["text"] == want["text"] and
                    got["usage"]["prompt_tokens"] == want["prompt_tokens"] and
                    got["usage"]["completion_tokens"] == len(want["tokens"]))
        except (AssertionError, OSError, ValueError, KeyError) as e:
            problem = str(e).splitlines()[-1][:300] if str(e) else repr(e)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        ok = problem is None and len(results) == 2 and all(results)
        detail = problem or f"{sum(results)}/2 completions equal kiln-run's"
        self.report.append(f"| {model}: kiln-serve on cuda, 2 completions "
                           f"(the second extends the first) vs kiln-run | - | "
                           f"identical text and counts | - | "
                           f"{'PASS' if ok else 'FAIL: ' + detail} |")
        self.check(ok, "kiln-serve on cuda")

    def memcheck(self):
        tool = shutil.which("compute-sanitizer") or \
            "/usr/local/cuda/bin/compute-sanitizer"
        if not Path(tool).exists():
            self.report.append("| memcheck | - | - | - | SKIP (no "
                               "compute-sanitizer) |")
            return
        # tiny-mix graph and eager; small-f16's ranks (MLA on the tensor
        # cores) on one GPU.
        for model, tp, flags in (("tiny-mix", 1, []),
                                 ("tiny-mix", 1, ["--eager"]),
                                 ("small-f16", 2, ["--one-gpu"])):
            proc = subprocess.run(
                [tool, "--tool", "memcheck", "--error-exitcode", "3",
                 str(self.pack / "bin" / "kiln-run"),
                 str(self.art(model, "cuda", tp)), "--weights",
                 str(self.gguf(model)), "--backend-dir",
                 str(self.pack / "lib"), "--prompt-tokens", "1,2,3", "-n", "4",
                 *flags],
                capture_output=True, text=True, env=env(self.pack))
            lines = proc.stdout.splitlines() + proc.stderr.splitlines()
            summary = [l for l in lines if "ERROR SUMMARY" in l]
            if proc.returncode != 0:
                print("\n".join(l for l in lines if l.startswith("=====")
                                 )[:3000])
            ok = proc.returncode == 0 and summary and " 0 errors" in summary[-1]
            self.report.append(f"| {model}: compute-sanitizer memcheck "
                               f"tp{tp} {' '.join(flags) or 'graph'} | - | "
                               f"0 errors | "
                               f"- | {'PASS' if ok else 'FAIL: ' + (summary[-1] if summary else proc.stderr[-300:])} |")
            self.check(ok, f"memcheck {model} {flags}")

    def all(self):
        print(f"token seed {SEED_TOKENS}, {POSITIONS} positions")
        for model in MODELS:
            try:
                self.teacher_forced(model)
                self.greedy(model)
                self.drawn(model)
                self.penalised(model)
            except AssertionError as e:
                # A run that fails outright fails its model's checks; the
                # other models still run.
                self.report.append(f"| {model} | - | - | - | FAIL: "
                                   f"{str(e).splitlines()[-1][:300]} |")
                self.failed.append(f"{model}: {e}")
        for what, check in (("shared expert", self.shared_expert),
                            ("2-bit mix", self.low_bit),
                            ("MLA on the tensor cores",
                             self.mla_tensor_cores)):
            try:
                check()
            except AssertionError as e:
                self.report.append(f"| {what} | - | - | - | FAIL: "
                                   f"{str(e).splitlines()[-1][:300]} |")
                self.failed.append(f"{what}: {e}")
        self.architecture_guard()
        self.kernel_images()
        self.serve()
        self.memcheck()
        header = ["| check | max rel error | tolerance | argmax equal "
                  "(decided positions) | result |", "|---|---|---|---|---|"]
        return "\n".join(header + self.report)


def _skip_reason():
    if not have_gpu():
        return "no NVIDIA GPU (nvidia-smi -L failed): runs on the GPU host"
    if not (pack_dir() / "bin" / "kiln-run").exists():
        return f"no GPU pack at {pack_dir()} (utils/gpu-pack.sh makes it)"
    return None


def test_cuda_backend_against_cpu(tmp_path):
    import pytest
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    checks = Checks(pack_dir(), tmp_path)
    print(checks.all())
    assert not checks.failed, checks.failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pack", type=Path, default=pack_dir())
    ap.add_argument("--table", type=Path, help="write the results table here")
    args = ap.parse_args()
    os.environ["KILN_GPU_PACK"] = str(args.pack)
    reason = _skip_reason()
    if reason:
        print(f"skip: {reason}")
        return 0
    with tempfile.TemporaryDirectory() as work:
        checks = Checks(args.pack.resolve(), work)
        table = checks.all()
    print(table)
    if args.table:
        args.table.write_text(table + "\n")
    if checks.failed:
        print("FAILED: " + ", ".join(checks.failed))
        return 1
    print("all CUDA backend checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
