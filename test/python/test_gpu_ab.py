"""utils/gpu-ab.sh without a GPU: packs whose kiln-run is a script that
prints a step line built from its environment, so the medians show which
side ran with which settings and in which order, with two sides and three;
the note when a side's result differs; and the refusals (two identical sides, one side, no rounds, a setting that is
not VAR=VALUE, a missing artifact)."""
import stat
import subprocess

from conftest import REPO

SCRIPT = REPO / "utils" / "gpu-ab.sh"


def fake_pack(root, name):
    """A pack whose benchmark takes MEDIAN_US (default 100) as its median
    and TOKEN (default 7) as its result's token (with VARY set, the count
    of calls so far: another each round), and appends each call to
    calls.txt."""
    pack = root / name
    (pack / "bin").mkdir(parents=True)
    (pack / "lib").mkdir()
    (pack / "models").mkdir()
    (pack / "models" / "m.kiln").write_bytes(b"")
    run = pack / "bin" / "kiln-run"
    run.write_text(
        "#!/bin/sh\n"
        f"echo \"{name} $KILN_CUDA_SPECIALISED $*\" >> {root}/calls.txt\n"
        "echo 'loading...' >&2\n"
        f"[ -z \"$VARY\" ] || TOKEN=$(wc -l < {root}/calls.txt)\n"
        "echo \"step: median ${MEDIAN_US:-100} us, p90 1 us\"\n"
        "echo \"result: token ${TOKEN:-7}, logits FNV-1a 00ff\"\n")
    run.chmod(run.stat().st_mode | stat.S_IXUSR)
    return pack


def ab(*args, cwd):
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)],
                          capture_output=True, text=True, cwd=cwd)


def test_two_packs_alternate(tmp_path):
    a, b = fake_pack(tmp_path, "a"), fake_pack(tmp_path, "b")
    out = ab(a, b, 3, "--", "m.kiln", "--steps", "5", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["a", "b"] * 3
    assert all("--bench" in c and "--steps 5" in c for c in calls)
    assert f"{a}: median of 3 rounds 100 us" in out.stdout


def test_one_pack_with_and_without_a_switch(tmp_path):
    a = fake_pack(tmp_path, "a")
    out = ab(a, f"{a}+KILN_CUDA_SPECIALISED=1+MEDIAN_US=90.5", 2, "--",
             "m.kiln", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    # The switch reaches the second side's runs only.
    assert [c.split(" ")[1] for c in calls] == ["", "1", "", "1"]
    assert f"{a}: median of 2 rounds 100 us\n" in out.stdout
    assert (f"{a}+KILN_CUDA_SPECIALISED=1+MEDIAN_US=90.5: median of 2 rounds "
            f"90.5 us (-9.5 us against {a}; faster in 2 of 2 rounds)\n"
            ) in out.stdout


def test_three_sides_take_turns(tmp_path):
    a, b = fake_pack(tmp_path, "a"), fake_pack(tmp_path, "b")
    out = ab(a, b, f"{b}+MEDIAN_US=80", 2, "--", "m.kiln", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["a", "b", "b"] * 2
    assert f"{a}: median of 2 rounds 100 us" in out.stdout
    # Each side past the first against the first, round by round: a tie
    # is not a win.
    assert (f"{b}: median of 2 rounds 100 us (+0.0 us against {a}; faster "
            "in 0 of 2 rounds)") in out.stdout
    assert (f"{b}+MEDIAN_US=80: median of 2 rounds 80 us (-20.0 us against "
            f"{a}; faster in 2 of 2 rounds)") in out.stdout
    # Without a count before --, three rounds.
    (tmp_path / "calls.txt").unlink()
    out = ab(a, b, f"{b}+MEDIAN_US=80", "--", "m.kiln", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert len((tmp_path / "calls.txt").read_text().splitlines()) == 9


def test_results_compared(tmp_path):
    a = fake_pack(tmp_path, "a")
    same = ab(a, f"{a}+MEDIAN_US=90", 2, "--", "m.kiln", cwd=tmp_path)
    assert same.returncode == 0, same.stderr
    assert "round 1 " in same.stdout and "(token 7, logits FNV-1a 00ff)" \
        in same.stdout
    assert "note" not in same.stdout
    other = ab(a, f"{a}+TOKEN=8", f"{a}+TOKEN=7+MEDIAN_US=1", 2, "--",
               "m.kiln", cwd=tmp_path)
    assert other.returncode == 0, other.stderr
    notes = [l for l in other.stdout.splitlines() if "note" in l]
    assert notes == [f"gpu-ab: note: {a}+TOKEN=8's result (token 8, logits "
                     f"FNV-1a 00ff) differs from {a}'s (token 7, logits "
                     f"FNV-1a 00ff): other values may route to other "
                     f"experts"], other.stdout
    varies = ab(a, f"{a}+VARY=1", 2, "--", "m.kiln", cwd=tmp_path)
    assert varies.returncode == 0, varies.stderr
    assert (f"gpu-ab: note: {a}+VARY=1's rounds gave different results:"
            in varies.stdout), varies.stdout


def test_refusals(tmp_path):
    a = fake_pack(tmp_path, "a")
    same = ab(a, a, "--", "m.kiln", cwd=tmp_path)
    assert same.returncode == 2 and "two sides are" in same.stderr
    one = ab(a, 3, "--", "m.kiln", cwd=tmp_path)
    assert one.returncode == 2 and "usage" in one.stderr
    zero = ab(a, f"{a}+X=1", 0, "--", "m.kiln", cwd=tmp_path)
    assert zero.returncode == 2 and "at least 1" in zero.stderr
    bad = ab(a, f"{a}+NOTASETTING", "--", "m.kiln", cwd=tmp_path)
    assert bad.returncode == 2 and "'NOTASETTING' is not VAR=VALUE" in bad.stderr
    missing = ab(a, f"{a}+X=1", "--", "other.kiln", cwd=tmp_path)
    assert missing.returncode == 1 and "no such artifact" in missing.stderr
    assert not (tmp_path / "calls.txt").exists()
