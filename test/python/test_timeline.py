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


SCHEDULE_HEADER = "unit\top\tbranch\twaits\tkernels\n"


def refused(*args):
    """The script's error output for arguments it must refuse (a non-zero
    exit)."""
    r = subprocess.run([sys.executable, SCRIPT, *map(str, args)],
                       capture_output=True, text=True)
    assert r.returncode != 0
    return r.stderr


def critical(path, *args):
    """The --schedule section: the total, the per-kind rows and the chain
    links as {unit: (after, charged us)}."""
    out = subprocess.run([sys.executable, SCRIPT, path, *args],
                         capture_output=True, text=True, check=True).stdout
    section = out[out.index("critical path:"):].splitlines()
    kinds, links = {}, {}
    for line in section[2:]:
        fields = line.split()
        if len(fields) == 4 and not fields[0].isdigit():
            kinds[fields[0]] = (int(fields[1]), float(fields[2]))
        elif len(fields) >= 4 and fields[0].isdigit():
            after = None if fields[1] == "-" else int(fields[1])
            links[int(fields[0])] = (after, float(fields[2]))
    return section[0], kinds, links


def four_units(tmp_path):
    """A timeline and its schedule: units in enqueue order, kernels in
    graph-node order (the CSV rows are shuffled): u0 (branch 0) one kernel
    0-10 us; u1 (branch 1, waits for u0) one kernel ending at 14; u2 (branch
    0, after u0) two kernels ending at 12 and 13; u3 (branch 0, after u2,
    waits for u1) ends at 20."""
    t = tmp_path / "t.csv"
    t.write_text(HEADER +
                 "k3,1010000,1012000,0,1,3\n"
                 "k1,1000000,1010000,0,1,1\n"
                 "k5,1014000,1020000,0,1,5\n"
                 "k2,1010000,1014000,0,2,2\n"
                 "k4,1012000,1013000,0,1,4\n")
    s = tmp_path / "s.tsv"
    s.write_text(SCHEDULE_HEADER +
                 "0\tstep 'decode_step' op 0 (rms_norm)\t0\t\t1\n"
                 "1\tstep 'decode_step' op 1 (linear)\t1\t0\t1\n"
                 "2\tstep 'decode_step' op 2 (rope)\t0\t\t2\n"
                 "3\tstep 'decode_step' op 3 (add)\t0\t1\t1\n")
    return t, s


def test_critical_path_through_the_schedule(tmp_path):
    # four_units: u3's latest predecessor is u1 (14 > 13), so the path is
    # u0, u1, u3 with charges 10, 4, 6; u2 is off it.
    t, s = four_units(tmp_path)
    first, kinds, links = critical(t, "--schedule", s, "--chain", "0:3")
    assert first.startswith("critical path: 3 of 4 launch units, 20.0 us")
    assert kinds == {"rms_norm": (1, 10.0), "linear": (1, 4.0),
                     "add": (1, 6.0)}
    assert links == {0: (None, 10.0), 1: (0, 4.0), 3: (1, 6.0)}


def test_schedule_with_the_quiet_column_reads_the_same(tmp_path):
    # The plugin now writes a sixth column (quiet: the unit follows a
    # collective and starts without its early prefetch); the path is the
    # same as without it.
    t, s = four_units(tmp_path)
    lines = s.read_text().splitlines()
    quiet = [lines[0] + "\tquiet"] + [
        line + ("\t1" if i == 1 else "\t0")
        for i, line in enumerate(lines[1:])]
    s.write_text("\n".join(quiet) + "\n")
    first, kinds, links = critical(t, "--schedule", s, "--chain", "0:3")
    assert first.startswith("critical path: 3 of 4 launch units, 20.0 us")
    assert links == {0: (None, 10.0), 1: (0, 4.0), 3: (1, 6.0)}


def test_schedule_of_another_run_is_refused(tmp_path):
    t = tmp_path / "t.csv"
    t.write_text(HEADER + "k1,1000000,1010000,0,1,1\n")
    s = tmp_path / "s.tsv"
    s.write_text(SCHEDULE_HEADER +
                 "0\tstep 'decode_step' op 0 (rms_norm)\t0\t\t2\n")
    assert ("the schedule's units have 2 kernels, the timeline 1"
            in refused(t, "--schedule", s))


def test_the_epoch_advance_after_the_last_unit_is_left_out(tmp_path):
    # The plugin launches advanceEpochsKernel after a step's last unit, in
    # no unit of its schedule: left out. Any other kernel past the units is
    # still another run.
    t, s = four_units(tmp_path)
    lines = t.read_text().splitlines()
    node = max(int(line.rsplit(",", 1)[1]) for line in lines[1:]) + 1
    t.write_text("\n".join(lines) +
                 f"\nadvanceEpochsKernel,30000000,30002000,0,1,{node}\n")
    first, kinds, links = critical(t, "--schedule", s, "--chain", "0:3")
    assert first.startswith("critical path: 3 of 4 launch units, 20.0 us")
    t.write_text("\n".join(lines) + f"\nsomeKernel,30000000,30002000,0,1,"
                 f"{node}\n")
    assert "not the same run" in refused(t, "--schedule", s)


def test_units_list_each_kernel_after_the_first_units_end(tmp_path):
    # four_units: unit 0 ends at 10 us, so times are printed from there;
    # unit 2's two kernels both listed, in graph-node order; unit 1 waits
    # for unit 0.
    t, s = four_units(tmp_path)
    out = subprocess.run([sys.executable, SCRIPT, t, "--schedule", s,
                          "--units", "0:3"],
                         capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in
            out[out.index("units 0..3"):].splitlines()[2:]]
    assert [(r[0], r[1], r[2], r[3], r[4], r[5], r[-1]) for r in rows] == [
        ("0", "0", "-", "-10.00", "0.00", "10.00", "k1"),
        ("1", "1", "0", "0.00", "4.00", "4.00", "k2"),
        ("2", "0", "-", "0.00", "2.00", "2.00", "k3"),
        ("2", "0", "-", "2.00", "3.00", "1.00", "k4"),
        ("3", "0", "1", "4.00", "10.00", "6.00", "k5")]
    # Outside the schedule's units, or without a schedule: an error.
    assert ("--units 2:4: the schedule has units 0..3"
            in refused(t, "--schedule", s, "--units", "2:4"))
    assert "--units needs --schedule" in refused(t, "--units", "0:1")


def test_layer_lists_the_units_between_its_residual_norms(tmp_path):
    """Two layers: boundaries (the residual add and norm) at units 1, 3 (one
    rank's add_rms_norm) and 5, 7 (the all-reduce's); layer 0 runs from the
    step's first unit to unit 3, layer 1 from unit 3 to unit 7. One kernel a
    unit, unit u from u to u + 1 us."""
    t = tmp_path / "t.csv"
    t.write_text(HEADER + "".join(
        f"k{u},{1000000 + 1000 * u},{1001000 + 1000 * u},0,1,{u + 1}\n"
        for u in range(8)))
    s = tmp_path / "s.tsv"
    kinds = ["embed", "add_rms_norm", "linear", "add_rms_norm", "linear",
             "all_reduce_add_rms_norm", "rope", "all_reduce_add_rms_norm"]
    s.write_text(SCHEDULE_HEADER + "".join(
        f"{u}\tstep 'decode_step' op {u} ({k})\t0\t\t1\n"
        for u, k in enumerate(kinds)))

    def listed(layer):
        out = subprocess.run([sys.executable, SCRIPT, t, "--schedule", s,
                              "--layer", str(layer)],
                             capture_output=True, text=True, check=True).stdout
        head = out.index("units ")
        return out[head:].splitlines()[0], [
            line.split()[0] for line in out[head:].splitlines()[2:]]

    assert listed(0) == ("units 0..3, us after unit 0's end:",
                         ["0", "1", "2", "3"])
    assert listed(1) == ("units 3..7, us after unit 3's end:",
                         ["3", "4", "5", "6", "7"])
    assert ("--layer 2: the schedule has layers 0..1"
            in refused(t, "--schedule", s, "--layer", 2))
    assert "--layer needs --schedule" in refused(t, "--layer", 0)


def test_links_group_the_path_by_the_kinds_they_join(tmp_path):
    # four_units: the path u0 (rms_norm), u1 (linear, after u0), u3 (add,
    # after u1): two links, charged 4 and 6 us; the first unit has none.
    t, s = four_units(tmp_path)
    out = subprocess.run([sys.executable, SCRIPT, t, "--schedule", s,
                          "--links"],
                         capture_output=True, text=True, check=True).stdout
    section = out[out.index("critical links"):].splitlines()[1:]
    rows = {}
    for line in section:
        if not line.strip():
            break
        name, count, charged, mean = line.rsplit(None, 3)
        rows[name] = (int(count), float(charged), float(mean))
    assert rows == {"linear -> add": (1, 6.0, 6.0),
                    "rms_norm -> linear": (1, 4.0, 4.0)}
    assert list(rows) == ["linear -> add", "rms_norm -> linear"]
    assert "--links needs --schedule" in refused(t, "--links")


def test_compare_two_runs_unit_by_unit(tmp_path):
    # four_units as the first run. The other run: u0 as before (0-10 us),
    # then no kernel for 500 us (a stall, as CUPTI's buffer handling
    # makes: not charged), then u1's kernel renamed k2<512> and ending 6
    # us after u0's end (4 before); u2's two kernels 2 us after it (3
    # before); u3 6 us after u1, as before.
    t, s = four_units(tmp_path)
    o = tmp_path / "o.csv"
    o.write_text(HEADER +
                 "k1,1000000,1010000,0,1,1\n"
                 "k2<512>,1510000,1516000,0,2,2\n"
                 "k3,1510000,1511000,0,1,3\n"
                 "k4,1511000,1512000,0,1,4\n"
                 "k5,1516000,1522000,0,1,5\n")
    out = subprocess.run([sys.executable, SCRIPT, t, "--schedule", s,
                          "--compare", o],
                         capture_output=True, text=True, check=True).stdout
    section = out[out.index("after its predecessors"):].splitlines()[2:]
    rows = {}
    for line in section:
        f = line.split(None, 6)
        rows[(f[0], f[6])] = (int(f[1]), float(f[2]), float(f[3]),
                              float(f[4]), float(f[5]))
    assert rows == {
        ("linear", "k2 -> k2<512>"): (1, 4.0, 6.0, 2.0, 2.0),
        ("rope", "k3 + k4"): (1, 3.0, 2.0, -1.0, -1.0),
        ("rms_norm", "k1"): (1, 10.0, 10.0, 0.0, 0.0),
        ("add", "k5"): (1, 6.0, 6.0, 0.0, 0.0)}
    # Most changed first.
    assert list(rows)[:2] == [("linear", "k2 -> k2<512>"), ("rope", "k3 + k4")]
    # A timeline of another step (unit 2 short of a kernel): refused.
    o.write_text(HEADER +
                 "k1,1000000,1010000,0,1,1\n"
                 "k2,1010000,1014000,0,2,2\n"
                 "k3,1010000,1012000,0,1,3\n"
                 "k5,1014000,1020000,0,1,5\n")
    assert "not the same run" in refused(t, "--schedule", s, "--compare", o)
    assert "--compare needs --schedule" in refused(t, "--compare", o)


def test_starts_split_own_branch_from_across(tmp_path):
    # u0 (branch 0) 0-10 us; u1 (branch 1, waits for u0) starts at 11, ends
    # at 14: 1 us after its predecessor; u2 (branch 0, after u0) launched
    # early at 6, ends at 13: -4; u3 (branch 0, after u2, waits for u1)
    # starts at 14.5: 0.5 after the later of 13 and 14. u0 has no
    # predecessor and is not listed.
    t = tmp_path / "t.csv"
    t.write_text(HEADER +
                 "k1,1000000,1010000,0,1,1\n"
                 "k2,1011000,1014000,0,2,2\n"
                 "k3,1006000,1013000,0,1,3\n"
                 "k4,1014500,1020000,0,1,4\n")
    s = tmp_path / "s.tsv"
    s.write_text(SCHEDULE_HEADER +
                 "0\tstep 'decode_step' op 0 (rms_norm)\t0\t\t1\n"
                 "1\tstep 'decode_step' op 1 (linear)\t1\t0\t1\n"
                 "2\tstep 'decode_step' op 2 (linear)\t0\t\t1\n"
                 "3\tstep 'decode_step' op 3 (add)\t0\t1\t1\n")
    out = subprocess.run([sys.executable, SCRIPT, t, "--schedule", s,
                          "--starts"], capture_output=True, text=True,
                         check=True).stdout
    section = out[out.index("start after"):].splitlines()[3:]
    rows = {f[0]: f[1:] for f in (line.split() for line in section)}
    assert rows["linear"] == ["1", "-4.00", "1", "1.00"]
    assert rows["add"] == ["0", "-", "1", "0.50"]
    assert "rms_norm" not in rows
    assert "needs --schedule" in refused(t, "--starts")
