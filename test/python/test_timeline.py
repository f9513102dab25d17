"""utils/timeline.py on timelines written here, with the charges worked out
by hand: a chain of kernels (each charged the time from the previous
completion to its own), a kernel that ends inside a longer one (charged up
to its end, the longer one only the rest), launches that overlap their
predecessor (programmatic launch: start times must not matter), a stall with no kernel running (left out of
the span and the charges), and another device's kernels (not counted)."""
import subprocess
import sys

from conftest import REPO

SCRIPT = REPO / "utils" / "timeline.py"
HEADER = "kernel,start_ns,end_ns,device,stream,graph_node\n"


def table(path, *args):
    out = subprocess.run([sys.executable, SCRIPT, path, *args],
                         capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    rows = {}
    for line in lines[2:]:
        name, count, run_us, charged_us, _share = line.rsplit(None, 4)
        rows[name] = (int(count), float(run_us), float(charged_us))
    return lines[0], rows


def test_charges_along_a_chain(tmp_path):
    f = tmp_path / "t.csv"
    # a: 0-10 us; b launched at 5 (waits), ends 14; c runs 12-13 inside b;
    # d launched at 13, ends 20; a stall from 20 to 520; e 520-523.
    f.write_text(HEADER +
                 "a<int>,1000000,1010000,0,1,1\n"
                 "b,1005000,1014000,0,1,2\n"
                 "c,1012000,1013000,0,2,3\n"
                 "d,1013000,1020000,0,1,4\n"
                 "e,1520000,1523000,0,1,5\n"
                 "x,1000000,1900000,1,1,1\n")
    first, rows = table(f)
    assert "span 23.0 us" in first and "(500.0 us with no kernel" in first
    assert rows["a<int>"] == (1, 10.0, 10.0)
    assert rows["c"] == (1, 1.0, 3.0)
    assert rows["b"] == (1, 9.0, 1.0)
    assert rows["d"] == (1, 7.0, 6.0)
    assert rows["e"] == (1, 3.0, 3.0)
    assert "x" not in rows
    _, grouped = table(f, "--group")
    assert grouped["a"] == (1, 10.0, 10.0)
