#!/usr/bin/env python3
"""Sums the JUnit XML files of Kiln's test runners into one closing line.

usage: test-summary.py RESULTS_DIR NAME=EXIT_STATUS...

Prints per-suite counts, then "N passed, M failed, K skipped". Exits 1 if any
test failed, any runner exited non-zero, or no test ran at all.
"""
import pathlib
import sys
import xml.etree.ElementTree as ET


def count(path):
    passed = failed = skipped = 0
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            failed += 1
        elif "skipped" in kinds:
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped


def main():
    results = pathlib.Path(sys.argv[1])
    statuses = dict(arg.rsplit("=", 1) for arg in sys.argv[2:])
    total = [0, 0, 0]
    failed_by_suite = {}
    for xml in sorted(results.glob("*.xml")):
        p, f, s = count(xml)
        print(f"  {xml.stem}: {p} passed, {f} failed, {s} skipped")
        failed_by_suite[xml.stem] = f
        total = [total[0] + p, total[1] + f, total[2] + s]
    bad_runners = [n for n, rc in statuses.items() if rc != "0"]
    for name in bad_runners:
        print(f"  runner {name} exited with status {statuses[name]}")
        # A runner that failed without reporting a failing test (a crash, a
        # configuration error) counts as one failed test of its own.
        if failed_by_suite.get(name.replace(":", "-"), 0) == 0:
            total[1] += 1
    ok = total[1] == 0 and not bad_runners and total[0] > 0
    if total[0] == 0:
        print("  no test passed: treating the run as failed")
    print(f"{total[0]} passed, {total[1]} failed, {total[2]} skipped")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
