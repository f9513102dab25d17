#!/usr/bin/env python3
"""Static instruction counts of the CUDA kernel images a build makes: for
each kernel of one architecture, its registers, its SASS instructions, and
its longest loop (the instructions between a backward branch and its
target) with how many of them are address, compare, branch and move work
rather than the kernel's arithmetic and memory operations.

    utils/kernel-stats.py build/lib/kiln-cuda/sm_90/StepMatVec.fatbin \\
        [--arch sm_90] [--match linearQ8SplitKernel] [--csv]

It runs cuobjdump (to pull the architecture's ELF out of the fatbin and to
read its resource usage) and nvdisasm (for the SASS), from CUDA_HOME/bin
or the PATH; CUDA's slim installs lack both, and the PyPI packages
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm carry them (this script
also looks in the nvidia/cu*/bin folders of the Python it runs in). The
counts are static: a loop's instructions are what one trip issues, not how
many trips a warp makes (docs/perf.md, fifteenth pass)."""
import argparse
import csv
import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

# Opcodes counted as overhead in a loop: integer address arithmetic,
# compares and predicate logic, branches and reconvergence, moves, and
# constant-bank or special-register reads.
OVERHEAD = {
    "IMAD", "IADD3", "LEA", "LDC", "ISETP", "SHF", "BRA", "BSSY", "BSYNC",
    "MOV", "SEL", "ULDC", "S2R", "VIADD", "IMNMX", "VIMNMX", "PLOP3", "R2UR",
    "UIADD3", "UISETP", "ULEA", "USHF", "USEL", "UMOV", "S2UR", "IABS",
}

# Memory loads counted in a loop (global, shared, generic; not the
# constant bank's LDC, which OVERHEAD counts).
LOADS = {"LD", "LDG", "LDS", "LDSM"}

INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)")
LABEL = re.compile(r"^\s*(\.L_x_\d+):")
BRANCH_TARGET = re.compile(r"\bBRA\b[^;]*?(\.L_x_\d+)")
FUNCTION = re.compile(r"\n\s*\.text\.(\S+):")


def find_tool(name):
    """The tool from CUDA_HOME/bin, the PATH, or a PyPI nvidia package."""
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    candidates = [os.path.join(home, "bin", name), shutil.which(name)]
    purelib = sysconfig.get_paths()["purelib"]
    candidates += sorted(glob.glob(os.path.join(purelib, "nvidia", "*", "bin",
                                                name)))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    sys.exit(f"kernel-stats: error: {name} not found in {home}/bin, on the "
             f"PATH or in a Python nvidia package; install it with "
             f"'pip install nvidia-cuda-{name}'")


def parse_functions(sass):
    """{mangled name: [opcode of each instruction]} and, for each, the
    longest loop as (length, overhead, loads)."""
    parts = FUNCTION.split(sass)
    out = {}
    for i in range(1, len(parts), 2):
        name, body = parts[i], parts[i + 1]
        labels, ops, lines = {}, [], []
        for line in body.split("\n"):
            m = LABEL.match(line)
            if m:
                labels[m.group(1)] = len(ops)
                continue
            m = INSTRUCTION.search(line)
            if m:
                ops.append(m.group(1))
                lines.append(line)
        best = None
        for k, line in enumerate(lines):
            m = BRANCH_TARGET.search(line)
            if not m or m.group(1) not in labels:
                continue
            start = labels[m.group(1)]
            if start <= k and (best is None or k - start > best[1] - best[0]):
                best = (start, k)
        loop = None
        if best:
            body_ops = ops[best[0]:best[1] + 1]
            loop = (len(body_ops), sum(o in OVERHEAD for o in body_ops),
                    sum(o in LOADS for o in body_ops))
        out[name] = (ops, loop)
    return out


def parse_registers(text):
    """{mangled name: registers} from cuobjdump -res-usage."""
    regs, current = {}, None
    for line in text.splitlines():
        m = re.search(r"Function (\S+):", line)
        if m:
            current = m.group(1)
            continue
        m = re.search(r"REG:(\d+)", line)
        if m and current:
            regs[current] = int(m.group(1))
            current = None
    return regs


def demangle(names):
    filt = shutil.which("c++filt")
    if not filt:
        return {n: n for n in names}
    text = subprocess.run([filt], input="\n".join(names), capture_output=True,
                          text=True, check=True).stdout.splitlines()
    short = [re.sub(r"kiln::cuda::\(anonymous namespace\)::", "", t)
             for t in text]
    return dict(zip(names, short))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("image", help="a fatbin or cubin of the build")
    p.add_argument("--arch", default="sm_90", help="default sm_90")
    p.add_argument("--match", default="",
                   help="only kernels whose demangled name contains this")
    p.add_argument("--csv", action="store_true", help="CSV, not a table")
    args = p.parse_args()
    if not os.path.isfile(args.image):
        sys.exit(f"kernel-stats: error: {args.image}: no such file")
    cuobjdump, nvdisasm = find_tool("cuobjdump"), find_tool("nvdisasm")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([cuobjdump, "-xelf", "all", os.path.abspath(args.image)],
                       cwd=tmp, capture_output=True, check=True)
        elves = sorted(glob.glob(os.path.join(tmp, f"*.{args.arch}.cubin")))
        if not elves and args.image.endswith(".cubin"):
            elves = [os.path.abspath(args.image)]
        if not elves:
            sys.exit(f"kernel-stats: error: {args.image}: no {args.arch} image")
        functions, regs = {}, {}
        for elf in elves:
            sass = subprocess.run([nvdisasm, "-c", elf], capture_output=True,
                                  text=True, check=True).stdout
            functions.update(parse_functions(sass))
            usage = subprocess.run([cuobjdump, "-res-usage", elf],
                                   capture_output=True, text=True,
                                   check=True).stdout
            regs.update(parse_registers(usage))
    names = demangle(sorted(functions))
    rows = []
    for mangled, (ops, loop) in functions.items():
        name = names[mangled]
        if args.match and args.match not in name:
            continue
        length, overhead, loads = loop or (0, 0, 0)
        rows.append((name, regs.get(mangled, 0), len(ops), length, overhead,
                     loads))
    rows.sort()
    header = ("kernel", "registers", "instructions", "loop", "loop overhead",
              "loop loads")
    if args.csv:
        w = csv.writer(sys.stdout)
        w.writerow(header)
        w.writerows(rows)
        return
    print(f"| {' | '.join(header)} |")
    print("|" + "---|" * len(header))
    for name, r, n, length, overhead, loads in rows:
        share = f" ({100 * overhead // length}%)" if length else ""
        print(f"| `{name}` | {r} | {n} | {length} | {overhead}{share} | "
              f"{loads} |")


if __name__ == "__main__":
    main()
