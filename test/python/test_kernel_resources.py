"""The step kernels compile for sm_90 without spills and without local
memory, but for the kernels named below with the reason each may.

A value a kernel spills, reloaded on a decode step's critical path, cost up
to ~0.8 us a layer on GLM-5 (docs/perf.md, twenty-eighth pass: the grid MLA
kernel's 12 bytes of spills were 0.12 ms a step at 1k), far more than a
kernel bench shows, so a change that makes a kernel spill should be seen
when it is made, not found by a timeline passes later. This test compiles
both image sources as the build does (utils: backends/cuda/CMakeLists.txt's
flags), reads ptxas's resource report (-Xptxas -v) and fails naming each
kernel that spills or keeps a stack frame and is not allowed to.
It needs nvcc (not a GPU)."""
import concurrent.futures
import os
import pathlib
import re
import shutil
import subprocess

import pytest

from conftest import REPO

CUDA_DIR = REPO / "backends" / "cuda"


def nvcc():
    found = shutil.which("nvcc")
    if found:
        return found
    default = pathlib.Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.exists() else None


# Kernels that may spill, by a part of their demangled name, and why.
MAY_SPILL = {
    "expertGateUpKernel<1>":
        "the general experts' kernel, which GLM-5's shapes do not run",
    "linearQ8SplitTailKernel":
        "the router fold's tail kernel (kiln-compile --fold-router=composed, "
        "off by default)",
    "allReducePeersKernel<true>":
        "the router's choice inside the all-reduce (--fuse-router-choice, "
        "off by default)",
}

# Kernels that may keep a stack frame without spilling, and why.
MAY_USE_STACK = {
    "ropeKernel": "double sincos's reduction of huge arguments",
    "normRopeAppendKernel": "double sincos's reduction of huge arguments",
    "indexerScores": "the query's rope: double sincos's reduction",
    "repackSplitKernel": "runs once, at load",
}

REPORT = re.compile(
    r"Function properties for (\S+)\n\s*(\d+) bytes stack frame, "
    r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def compile_report(compiler, source, out_dir):
    """ptxas's report of every kernel of `source`, as the build compiles its
    image for sm_90: {demangled name: (stack, spill stores, spill loads)}."""
    flags = ["--fmad=false"] if source == "StepKernels" else []
    cubin = out_dir / f"{source}.cubin"
    done = subprocess.run(
        [compiler, "-std=c++20", "-O3", "-DNDEBUG", *flags,
         f"-I{CUDA_DIR}", f"-I{REPO / 'utils'}",
         "--generate-code=arch=compute_90,code=sm_90", "-cubin",
         "-Xptxas", "-v", str(CUDA_DIR / f"{source}.cu"), "-o", str(cubin)],
        capture_output=True, text=True)
    assert done.returncode == 0, f"{source}.cu: nvcc failed:\n{done.stderr}"
    found = REPORT.findall(done.stdout + done.stderr)
    names = [name for name, *_ in found]
    demangler = shutil.which("c++filt")
    if demangler:
        names = subprocess.run([demangler], input="\n".join(names),
                               capture_output=True, text=True,
                               check=True).stdout.splitlines()
    return {name: tuple(int(v) for v in numbers)
            for name, (_, *numbers) in zip(names, found)}


def allowed(name, table):
    return next((why for part, why in table.items() if part in name), None)


@pytest.mark.skipif(nvcc() is None, reason="no nvcc to compile the kernels")
@pytest.mark.skipif(shutil.which("c++filt") is None,
                    reason="no c++filt to name the kernels")
def test_step_kernels_keep_to_registers(tmp_path):
    compiler = nvcc()
    sources = ["StepKernels", "StepMatVec"]
    with concurrent.futures.ThreadPoolExecutor(len(sources)) as pool:
        reports = list(pool.map(
            lambda s: compile_report(compiler, s, tmp_path), sources))
    problems = []
    for source, report in zip(sources, reports):
        # Every kernel of the file, not a few: a report the pattern stopped
        # matching would otherwise pass with nothing checked.
        assert len(report) >= 40, (
            f"{source}.cu: only {len(report)} kernels in ptxas's report")
        print(f"{source}.cu: {len(report)} kernels")
        for name, (stack, stores, loads) in sorted(report.items()):
            if stores or loads:
                table = MAY_SPILL
                what = f"{stores} bytes of spill stores, {loads} of loads"
            elif stack:
                table = MAY_USE_STACK
                what = f"{stack} bytes of stack frame (local memory)"
            else:
                continue
            why = allowed(name, table)
            print(f"  {name}: {what} ({why or 'NOT ALLOWED'})")
            if not why:
                problems.append(f"{source}.cu: {name}: {what}")
    assert not problems, "\n".join(problems)


def test_report_pattern_reads_ptxas_lines():
    """The pattern takes a kernel's name and its three numbers from ptxas's
    lines as nvcc 13 prints them (a fixed sample, so that a change of the
    pattern is checked without nvcc)."""
    sample = (
        "ptxas info    : Compiling entry function '_Z1kv' for 'sm_90'\n"
        "ptxas info    : Function properties for _Z1kv\n"
        "    40 bytes stack frame, 12 bytes spill stores, 32 bytes spill "
        "loads\n"
        "ptxas info    : Used 64 registers, used 1 barriers\n")
    assert REPORT.findall(sample) == [("_Z1kv", "40", "12", "32")]
    assert allowed("void ropeKernel(float const*)", MAY_USE_STACK)
    assert allowed("mlaKernel<Other>", MAY_SPILL) is None
