#!/usr/bin/env python3
"""Sums an Nsight Compute CSV (gpu__time_duration.sum per kernel) by kernel
name: how much of a decode step each kernel takes when run alone.

    ncu --graph-profiling node --metrics gpu__time_duration.sum --csv \
        --kernel-name-base function \
        --kernel-name 'regex:^(?!fill|repack|dequant)' -c 2700 \
        kiln-run M.kiln --bench --simulate-rank 0/8 --steps 1 > step.csv
    utils/ncu-summary.py step.csv

ncu runs each kernel alone, with its caches flushed and its clocks locked
to base, so the durations are larger than inside the graph; their ranking
is what this is for (docs/perf.md).
"""
import collections
import csv
import sys

rows = list(csv.reader(open(sys.argv[1])))
hdr = None
tot = collections.defaultdict(lambda: [0, 0.0])
for r in rows:
    if hdr is None:
        if "Kernel Name" in r: hdr = r
        continue
    if len(r) != len(hdr): continue
    d = dict(zip(hdr, r))
    if d.get("Metric Name") != "gpu__time_duration.sum": continue
    v = float(d["Metric Value"].replace(",", ""))
    unit = d.get("Metric Unit", "")
    us = v / 1000 if unit in ("nsecond", "ns") else v * 1000 if unit in ("msecond", "ms") else v
    name = d["Kernel Name"].split("(")[0][:60]
    tot[name][0] += 1; tot[name][1] += us
allus = sum(v[1] for v in tot.values())
print(f"kernels {sum(v[0] for v in tot.values())}, sum of durations {allus/1000:.3f} ms")
for k, (n, us) in sorted(tot.items(), key=lambda x: -x[1][1])[:30]:
    print(f"{us/1000:8.3f} ms {n:6d} x {us/n:7.2f} us  {k}")
