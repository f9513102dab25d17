#!/usr/bin/env python3
"""Reads a step's kernel timeline (KILN_CUDA_TIMELINE=FILE, written by the
CUDA plugin from CUPTI's records) and prints where the step's time went.

Each kernel is charged the time from the latest completion before its own
to its own completion: along a chain of kernels that is the time the chain
waited for it (its work, plus its launch and dependency latency); of two
kernels running side by side the one that ends first is charged up to its
end and the other only the rest, so the charges add up to the step's span. Start times are not used: with
programmatic dependent launch a kernel is launched early and waits inside.
The longest stretch with no kernel running is printed too (a stall, such as
CUPTI handling its buffer, shows there and is left out of the charges).

  utils/timeline.py FILE [--device N] [--top K] [--group]

--group folds template arguments (mlaChunkKernel<...> -> mlaChunkKernel).
"""
import argparse
import csv
import re
import sys
from collections import defaultdict


def load(path, device):
    kernels = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if int(row["device"]) != device:
                continue
            kernels.append((int(row["start_ns"]), int(row["end_ns"]),
                            row["kernel"]))
    return kernels


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("file")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--group", action="store_true")
    a = p.parse_args()
    kernels = load(a.file, a.device)
    if not kernels:
        sys.exit(f"timeline: error: {a.file}: no kernels of device {a.device}")
    # The longest stretch with no kernel running.
    by_start = sorted(kernels)
    stall, stall_at, reach = 0, 0, by_start[0][1]
    for s, e, _ in by_start[1:]:
        if s - reach > stall:
            stall, stall_at = s - reach, reach
        reach = max(reach, e)
    by_end = sorted(kernels, key=lambda k: k[1])
    rows = defaultdict(lambda: [0, 0, 0])
    previous = by_end[0][0]
    for s, e, name in by_end:
        charge = max(0, e - previous)
        if stall and previous <= stall_at and e >= stall_at + stall:
            charge = max(0, charge - stall)
        previous = max(previous, e)
        if a.group:
            name = re.sub(r"<.*", "", name)
        r = rows[name]
        r[0] += 1
        r[1] += e - s
        r[2] += charge
    span = by_end[-1][1] - by_end[0][0] - stall
    print(f"{len(kernels)} kernels on device {a.device}: span {span / 1e3:.1f} us "
          f"without the longest stall ({stall / 1e3:.1f} us with no kernel "
          f"running)")
    print(f"{'kernel':60} {'count':>6} {'run us':>10} {'charged us':>11} {'share':>6}")
    for name, (count, total, charged) in sorted(
            rows.items(), key=lambda kv: -kv[1][2])[:a.top]:
        print(f"{name[:60]:60} {count:6d} {total / 1e3:10.1f} "
              f"{charged / 1e3:11.1f} {100 * charged / span:5.1f}%")


if __name__ == "__main__":
    main()
