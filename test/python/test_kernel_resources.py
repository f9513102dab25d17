"""The step kernels compile without spills and without local memory, for
every architecture the build compiles their images for (sm_90, sm_100,
sm_120), but for the kernels named below with the reason each may.

A value a kernel spills, reloaded on a decode step's critical path, cost up
to ~0.8 us a layer on GLM-5 (docs/perf.md, twenty-eighth pass: the grid MLA
kernel's 12 bytes of spills were 0.12 ms a step at 1k), far more than a
kernel bench shows, so a change that makes a kernel spill should be seen
when it is made, not found by a timeline passes later. The build keeps
ptxas's resource report (-Xptxas -v) beside each image
(backends/cuda/CompileImage.cmake: lib/kiln-cuda/sm_XX/SOURCE.fatbin.ptxas);
this test reads those reports and fails naming each kernel that spills or
keeps a stack frame and is not allowed to. It needs a build with the CUDA
parts (nvcc), not a GPU."""
import re
import shutil
import subprocess

import pytest

from conftest import REPO, build_dir

SOURCES = ["StepKernels", "StepMatVec"]

# Kernels that may spill, by a pattern their demangled name contains (a
# regular expression): the architectures where they may (None: every one)
# and why. GLM-5 at tp=8 runs none of them by default.
MAY_SPILL = {
    r"expertGateUpKernel<": (
        None, "the general experts' kernels, which GLM-5's shapes do not run"),
    r"linearQ8SplitTailKernel": (
        None, "the router fold's tail kernel (kiln-compile "
        "--fold-router=composed, off by default)"),
    r"allReducePeersKernel<true>": (
        None, "the router's choice inside the all-reduce "
        "(--fuse-router-choice, off by default)"),
    r"mlaProjectKernel<": (
        {"sm_100", "sm_120"}, "MLA's projection switch "
        "(KILN_CUDA_MLA_PROJECTION=1, off by default)"),
    r"linearKernel<1>": (
        {"sm_100"}, "the mat-vec over file blocks of types with no "
        "several-row dot (no GLM-5 mix's)"),
    # Formats by number: 0 Q4_K, 1 Q5_K, 2 Q2_K, 3 Q3_K (BulkQuant).
    r"expertGateUpK45Kernel<\(.*?BulkQuant\)0, 6144, 2048>": (
        {"sm_120"}, "GLM-5's experts at tp=1 (4-8 bytes as the body "
        "changes; tp=8 runs the 256-row kernel)"),
    r"expertGateUpK45Kernel<\(.*?BulkQuant\)0, 6144, 512>": (
        {"sm_120"}, "GLM-5's experts at tp=4 (4-8 bytes)"),
    r"expert(GateUp|Down)K45Kernel<\(.*?BulkQuant\)3, 0, 0>": (
        {"sm_90", "sm_120"}, "the 2-bit mixes' Q3_K rows in the general-shape "
        "bulk-copy kernels (8 bytes; on sm_90 the 2-bit mix's down runs this "
        "one, its fixed form holding fewer blocks: docs/perf.md, forty-second "
        "pass)"),
    # A width after the input kind: the fixed-width kernels, not the
    # general one (width 0).
    r"linearQ8SplitKernel<4, true, \(.*?Q8Input\)\d, [1-9]\d*>": (
        {"sm_120"}, "the fixed-width q8_0 mat-vecs (KILN_CUDA_SPECIALISED=q8, "
        "off by default)"),
    r"linearKSplitKernel<\(kiln::GGMLType\)12, 4, false>": (
        {"sm_120"}, "Q4_K rows with an x not 16-byte aligned (no GLM-5 "
        "step's)"),
}

# Kernels that may keep a stack frame without spilling, as above.
MAY_USE_STACK = {
    r"ropeKernel": (None, "double sincos's reduction of huge arguments"),
    r"normRopeAppendKernel": (
        None, "double sincos's reduction of huge arguments"),
    r"indexerScores": (None, "the query's rope: double sincos's reduction"),
    r"repackSplitKernel": (None, "runs once, at load"),
}

REPORT = re.compile(
    r"Function properties for (\S+)\n\s*(\d+) bytes stack frame, "
    r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def read_report(path):
    """ptxas's report of every kernel of one image: {demangled name: (stack,
    spill stores, spill loads)}."""
    found = REPORT.findall(path.read_text())
    names = [name for name, *_ in found]
    names = subprocess.run([shutil.which("c++filt")], input="\n".join(names),
                           capture_output=True, text=True,
                           check=True).stdout.splitlines()
    return {name: tuple(int(v) for v in numbers)
            for name, (_, *numbers) in zip(names, found)}


def allowed(name, arch, table):
    return next((why for part, (archs, why) in table.items()
                 if re.search(part, name) and (archs is None or arch in archs)),
                None)


def image_dirs():
    """The build's image folders, sm_XX each (empty without the CUDA
    parts)."""
    root = build_dir() / "lib" / "kiln-cuda"
    return sorted(root.glob("sm_*")) if root.is_dir() else []


@pytest.mark.skipif(not image_dirs(),
                    reason="no kernel images built (the build found no nvcc)")
@pytest.mark.skipif(shutil.which("c++filt") is None,
                    reason="no c++filt to name the kernels")
def test_step_kernels_keep_to_registers():
    problems = []
    for folder in image_dirs():
        arch = folder.name
        for source in SOURCES:
            path = folder / f"{source}.fatbin.ptxas"
            # An image built without its report (an older build, or a
            # changed build rule) fails rather than passing unchecked.
            assert path.is_file(), f"{path}: no ptxas report beside the image"
            report = read_report(path)
            # Every kernel of the file, not a few: a report the pattern
            # stopped matching would otherwise pass with nothing checked.
            assert len(report) >= 40, (
                f"{path}: only {len(report)} kernels in ptxas's report")
            print(f"{arch} {source}.cu: {len(report)} kernels")
            for name, (stack, stores, loads) in sorted(report.items()):
                if stores or loads:
                    table = MAY_SPILL
                    what = f"{stores} bytes of spill stores, {loads} of loads"
                elif stack:
                    table = MAY_USE_STACK
                    what = f"{stack} bytes of stack frame (local memory)"
                else:
                    continue
                why = allowed(name, arch, table)
                print(f"  {name}: {what} ({why or 'NOT ALLOWED'})")
                if not why:
                    problems.append(f"{arch} {source}.cu: {name}: {what}")
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
    assert allowed("void ropeKernel(float const*)", "sm_90", MAY_USE_STACK)
    assert allowed("mlaKernel<Other>", "sm_90", MAY_SPILL) is None
    # An entry for some architectures allows nothing on the others.
    assert allowed("void linearKernel<1>(LinearArgs)", "sm_100", MAY_SPILL)
    assert allowed("void linearKernel<1>(LinearArgs)", "sm_90",
                   MAY_SPILL) is None
    fixed = "void ns::linearQ8SplitKernel<4, true, (ns::Q8Input)1, 6144>(A)"
    assert allowed(fixed, "sm_120", MAY_SPILL)
    assert allowed(fixed.replace("6144", "0"), "sm_120", MAY_SPILL) is None


SCRIPT = REPO / "backends" / "cuda" / "CompileImage.cmake"


@pytest.mark.skipif(shutil.which("cmake") is None, reason="no cmake")
def test_compile_image_keeps_report_whole_or_not_at_all(tmp_path):
    """CompileImage.cmake (the image build's wrapper) writes the command's
    whole output to REPORT and passes on what is not ptxas's report; a
    failed command fails the step with its output and leaves no report; an
    argument with a ";" reaches the command whole (a fixed sh script stands
    for nvcc)."""
    report = tmp_path / "image.fatbin.ptxas"
    script = ('echo "ptxas info    : Used 8 registers" >&2; '
              'echo "    0 bytes stack frame" >&2; '
              'echo "warning: an nvcc warning; kept" >&2; exit "$0"')

    def run(status):
        return subprocess.run(
            ["cmake", f"-DREPORT={report}", "-P", str(SCRIPT), "--", "sh",
             "-c", script, str(status)], capture_output=True, text=True)

    done = run(0)
    assert done.returncode == 0, done.stderr
    text = report.read_text()
    assert "Used 8 registers" in text and "an nvcc warning; kept" in text
    assert "warning: an nvcc warning; kept" in done.stderr
    assert "ptxas info" not in done.stderr
    assert not (tmp_path / "image.fatbin.ptxas.part").exists()

    done = run(3)
    assert done.returncode != 0
    assert "an nvcc warning; kept" in done.stderr
    assert not report.exists(), "a failed compile left its report behind"
