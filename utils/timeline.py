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
                    [--schedule SCHED [--chain FROM:TO] [--units FROM:TO]
                                      [--layer N] [--links] [--compare OTHER]
                                      [--starts]]

--group folds template arguments (mlaChunkKernel<...> -> mlaChunkKernel).

--schedule reads the step's schedule (KILN_CUDA_SCHEDULE=SCHED from the same
run: its launch units in order, each with its op, branch, waits and kernel
count) and follows the step's critical path back from its last kernel: each
unit ends when its last kernel does, and its critical predecessor is the one
of its predecessors (the previous unit of its branch, the units it waits
for) that ended last. Each unit on the path is charged the time from that
predecessor's end to its own; the charges are printed by op kind, and with
--chain FROM:TO each link of the path between those units.

--units FROM:TO (with --schedule) lists every kernel of units FROM .. TO,
in unit order, with its branch, the units it waits for, and its start and
end in us after unit FROM's end: where a stretch of the step spent its time
(a layer: from one all-reduce to the next), including the kernels off the
critical path and how early each was launched.

--links (with --schedule) groups the critical path's links by the op kinds
they join (predecessor -> unit), with how often the path takes each and
what it is charged: which branch gated an op across the step (for GLM-5's
MLA, whether the indexer's branch or the query rope's ended last).

--compare OTHER (with --schedule) reads a second timeline of the same step
(another run of the same artifact, with a switch changed: its kernels in the
same graph positions) and prints, for each unit, how long after its latest
predecessor it ended in each run, grouped by op kind and the units' kernels
in each run, with the mean and the total change, most changed first: where a
switch moved the step's time, whether or not the unit is on the critical
path (KILN_CUDA_SPECIALISED's families, for example, are told apart by the
kernels' template arguments).

--starts (with --schedule) prints, by op kind, when each unit's first kernel
started against the end of its latest predecessor (negative: launched early,
waiting inside), for units that wait for another branch and for units whose
predecessors are all on their own branch, with counts and medians: what a
wait across branches costs a kernel's start.

--layer N (with --schedule) lists layer N's units so: from the residual add
that ends layer N - 1 (all_reduce_add_rms_norm or all_reduce_add, or
add_rms_norm on one rank; the step's first unit for layer 0) to the one that
ends layer N (each layer has two: after its attention and after its FFN).
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
                            row["kernel"], int(row["graph_node"])))
    return kernels


def load_schedule(path):
    """[(op text, branch, [waits], kernels)] in unit order."""
    units = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            if int(row["unit"]) != len(units):
                sys.exit(f"timeline: error: {path}: unit {row['unit']} out "
                         f"of order")
            waits = [int(w) for w in row["waits"].split(",") if w]
            if any(w >= len(units) for w in waits):
                sys.exit(f"timeline: error: {path}: unit {row['unit']} "
                         f"waits for a later unit")
            units.append((row["op"], int(row["branch"]), waits,
                          int(row["kernels"])))
    return units


def op_kind(text):
    m = re.search(r"\((\w+)\)\s*$", text)
    return m.group(1) if m else text


# Kernels the plugin launches after a step's last unit, in no unit of its
# schedule: the one that advances the step's all-reduce epochs
# (docs/cuda.md).
AFTER_UNITS = {"advanceEpochsKernel"}


def unit_kernels(kernels, units):
    """Each unit's kernels: the graph's kernel nodes in creation order, a
    unit's count at a time (the kernels after the last unit that are in no
    unit, AFTER_UNITS, left out)."""
    by_node = sorted(kernels, key=lambda k: k[3])
    scheduled = sum(u[3] for u in units)
    while (len(by_node) > scheduled and
           re.sub(r"<.*", "", by_node[-1][2]) in AFTER_UNITS):
        by_node.pop()
    if scheduled != len(by_node):
        sys.exit(f"timeline: error: the schedule's units have "
                 f"{sum(u[3] for u in units)} kernels, the timeline "
                 f"{len(by_node)}: not the same run")
    out, at = [], 0
    for _, _, _, count in units:
        out.append(by_node[at:at + count])
        at += count
    return out


def unit_ends(kernels, units):
    """Each unit's end, its predecessors (the previous unit of its branch
    and the units it waits for) and the latest of their ends (the step's
    first start for a unit with none)."""
    end = [max((k[1] for k in ks), default=None)
           for ks in unit_kernels(kernels, units)]
    previous, last = [], {}
    for i, (_, branch, waits, _) in enumerate(units):
        previous.append(([last[branch]] if branch in last else []) + waits)
        last[branch] = i
    # A unit with no kernel (omitted, or a copy) ends with its latest
    # predecessor.
    for i in range(len(units)):
        if end[i] is None:
            end[i] = max((end[p] for p in previous[i]), default=0)
    first = min(k[0] for k in kernels)
    ready = [max((end[p] for p in before), default=first)
             for before in previous]
    return end, previous, ready


def critical_path(kernels, units):
    """The units on the path back from the last one to end, each with its
    charge in ns, first to last; and each unit's end."""
    end, previous, ready = unit_ends(kernels, units)
    path = []
    i = max(range(len(units)), key=lambda j: end[j])
    while True:
        before = max(previous[i], key=lambda p: end[p], default=None)
        path.append((i, end[i] - ready[i], before))
        if before is None:
            break
        i = before
    path.reverse()
    return path, end


def print_links(path, units):
    """The path's links grouped by (predecessor kind, unit kind), most
    charged first."""
    links = defaultdict(lambda: [0, 0])
    for i, charge, before in path:
        if before is None:
            continue
        link = links[(op_kind(units[before][0]), op_kind(units[i][0]))]
        link[0] += 1
        link[1] += charge
    print(f"\n{'critical links (predecessor -> unit)':60} {'count':>6} "
          f"{'charged us':>11} {'mean us':>8}")
    for (a, b), (count, charge) in sorted(links.items(),
                                          key=lambda kv: -kv[1][1]):
        print(f"{a + ' -> ' + b:60} {count:6d} {charge / 1e3:11.1f} "
              f"{charge / count / 1e3:8.2f}")


def print_schedule(kernels, units, chain, stall, stall_at, links=False):
    path, end = critical_path(kernels, units)
    # The longest stall, where a link spans it, is left out as above.
    path = [(i, charge - stall
             if stall and before is not None and end[before] <= stall_at and
             end[i] >= stall_at + stall else charge, before)
            for i, charge, before in path]
    total = sum(c for _, c, _ in path)
    print(f"\ncritical path: {len(path)} of {len(units)} launch units, "
          f"{total / 1e3:.1f} us")
    kinds = defaultdict(lambda: [0, 0])
    for i, charge, _ in path:
        k = kinds[op_kind(units[i][0])]
        k[0] += 1
        k[1] += charge
    print(f"{'op kind':32} {'on path':>8} {'charged us':>11} {'share':>6}")
    for kind, (count, charge) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
        print(f"{kind:32} {count:8d} {charge / 1e3:11.1f} "
              f"{100 * charge / total:5.1f}%")
    if links:
        print_links(path, units)
    if chain:
        lo, hi = chain
        print(f"\n{'unit':>6} {'after':>6} {'charged us':>11}  op")
        for i, charge, before in path:
            if lo <= i <= hi:
                print(f"{i:6d} {before if before is not None else '-':>6} "
                      f"{charge / 1e3:11.2f}  {units[i][0]}")


def longest_stall(kernels):
    """The longest stretch with no kernel running: (its length, its
    start)."""
    by_start = sorted(kernels)
    stall, stall_at, reach = 0, 0, by_start[0][1]
    for s, e, *_ in by_start[1:]:
        if s - reach > stall:
            stall, stall_at = s - reach, reach
        reach = max(reach, e)
    return stall, stall_at


def print_compare(kernels, other, units, top):
    """Unit by unit, the time from its predecessors' end to its own in two
    runs of one step (less each run's longest stall where it falls inside),
    grouped by op kind and the units' kernels."""
    a, b = unit_kernels(kernels, units), unit_kernels(other, units)
    runs = []
    for ks in (kernels, other):
        end, _, ready = unit_ends(ks, units)
        stall, at = longest_stall(ks)
        runs.append([e - r - (stall if stall and r <= at and e >= at + stall
                              else 0) for e, r in zip(end, ready)])
    groups = defaultdict(lambda: [0, 0, 0])
    for i, (text, *_) in enumerate(units):
        if not a[i] or not b[i]:
            continue
        key = (op_kind(text), " + ".join(k[2] for k in a[i]),
               " + ".join(k[2] for k in b[i]))
        g = groups[key]
        g[0] += 1
        g[1] += runs[0][i]
        g[2] += runs[1][i]
    print(f"\nafter its predecessors, unit by unit (mean us): this run -> the "
          f"other")
    print(f"{'op kind':24} {'units':>6} {'this':>8} {'other':>8} "
          f"{'change':>8} {'total us':>9}  kernels (this -> other)")
    rows = sorted(groups.items(), key=lambda kv: -abs(kv[1][2] - kv[1][1]))
    for (kind, ka, kb), (n, ta, tb) in rows[:top]:
        names = ka if ka == kb else f"{ka} -> {kb}"
        print(f"{kind:24} {n:6d} {ta / n / 1e3:8.2f} {tb / n / 1e3:8.2f} "
              f"{(tb - ta) / n / 1e3:+8.2f} {(tb - ta) / 1e3:+9.1f}  {names}")


def print_starts(kernels, units):
    """By op kind: the first kernel's start minus the latest predecessor's
    end, for units with a wait across branches and units without."""
    _, previous, ready = unit_ends(kernels, units)
    rows = defaultdict(lambda: ([], []))
    for i, ks in enumerate(unit_kernels(kernels, units)):
        if not ks or not previous[i]:
            continue
        across = bool(units[i][2])
        start = min(k[0] for k in ks)
        rows[op_kind(units[i][0])][1 if across else 0].append(
            (start - ready[i]) / 1e3)

    def median(v):
        v = sorted(v)
        return v[len(v) // 2] if v else None

    def cell(v):
        m = median(v)
        return f"{len(v):5d} {m:8.2f}" if v else f"{0:5d} {'-':>8}"

    print("\nstart after the latest predecessor's end, us (median; negative: "
          "launched early)")
    print(f"{'op kind':28} {'own branch':>14} {'across branches':>15}")
    print(f"{'':28} {'units':>5} {'median':>8} {'units':>6} {'median':>8}")
    for kind, (own, across) in sorted(rows.items(),
                                      key=lambda kv: -len(kv[1][1])):
        print(f"{kind:28} {cell(own)}  {cell(across)}")


def print_units(kernels, units, lo, hi):
    per_unit = unit_kernels(kernels, units)
    if not per_unit[lo]:
        sys.exit(f"timeline: error: --units: unit {lo} ran no kernel, so "
                 f"it has no end to time from")
    zero = max(k[1] for k in per_unit[lo])
    print(f"\nunits {lo}..{hi}, us after unit {lo}'s end:")
    print(f"{'unit':>6} {'branch':>6} {'waits for':>12} {'start':>8} "
          f"{'end':>8} {'run':>7}  op / kernel")
    for i in range(lo, hi + 1):
        text, branch, waits, _ = units[i]
        for start, end, name, _ in per_unit[i]:
            print(f"{i:6d} {branch:6d} {','.join(map(str, waits)) or '-':>12} "
                  f"{(start - zero) / 1e3:8.2f} {(end - zero) / 1e3:8.2f} "
                  f"{(end - start) / 1e3:7.2f}  {op_kind(text)} / {name}")


def unit_range(flag, text, units):
    m = re.fullmatch(r"(\d+):(\d+)", text)
    if not m:
        sys.exit(f"timeline: error: {flag} {text}: expected FROM:TO (unit "
                 f"indices)")
    lo, hi = int(m.group(1)), int(m.group(2))
    if units is not None and not lo <= hi < len(units):
        sys.exit(f"timeline: error: {flag} {text}: the schedule has units "
                 f"0..{len(units) - 1}")
    return lo, hi


def layer_range(n, units):
    """Layer n's units: from the boundary that ends layer n - 1 (unit 0 for
    layer 0) to the one that ends layer n, two boundaries (the residual add
    and norm after the attention and after the FFN) a layer."""
    ends = [i for i, (text, *_) in enumerate(units)
            if op_kind(text) in ("all_reduce_add_rms_norm", "all_reduce_add",
                                 "add_rms_norm")]
    layers = len(ends) // 2
    if not 0 <= n < layers:
        sys.exit(f"timeline: error: --layer {n}: the schedule has layers "
                 f"0..{layers - 1} ({len(ends)} residual adds and norms)")
    return (ends[2 * n - 1] if n > 0 else 0), ends[2 * n + 1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("file")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--group", action="store_true")
    p.add_argument("--schedule")
    p.add_argument("--chain")
    p.add_argument("--units")
    p.add_argument("--layer", type=int)
    p.add_argument("--links", action="store_true")
    p.add_argument("--compare")
    p.add_argument("--starts", action="store_true")
    a = p.parse_args()
    if a.starts and not a.schedule:
        sys.exit("timeline: error: --starts needs --schedule")
    if a.units and not a.schedule:
        sys.exit("timeline: error: --units needs --schedule")
    if a.links and not a.schedule:
        sys.exit("timeline: error: --links needs --schedule")
    if a.layer is not None and not a.schedule:
        sys.exit("timeline: error: --layer needs --schedule")
    if a.compare and not a.schedule:
        sys.exit("timeline: error: --compare needs --schedule")
    chain = unit_range("--chain", a.chain, None) if a.chain else None
    kernels = load(a.file, a.device)
    if not kernels:
        sys.exit(f"timeline: error: {a.file}: no kernels of device {a.device}")
    stall, stall_at = longest_stall(kernels)
    by_end = sorted(kernels, key=lambda k: k[1])
    rows = defaultdict(lambda: [0, 0, 0])
    previous = by_end[0][0]
    for s, e, name, _ in by_end:
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
    if a.schedule:
        units = load_schedule(a.schedule)
        print_schedule(kernels, units, chain, stall, stall_at, a.links)
        if a.units:
            print_units(kernels, units, *unit_range("--units", a.units, units))
        if a.layer is not None:
            print_units(kernels, units, *layer_range(a.layer, units))
        if a.starts:
            print_starts(kernels, units)
        if a.compare:
            other = load(a.compare, a.device)
            if not other:
                sys.exit(f"timeline: error: {a.compare}: no kernels of "
                         f"device {a.device}")
            print_compare(kernels, other, units, a.top)


if __name__ == "__main__":
    main()
