"""utils/gpu-ab.sh without a GPU: packs whose kiln-run is a script that
prints a step line built from its environment, so the medians show which
side ran with which settings and in which order; and the refusals (two
identical sides, a setting that is not VAR=VALUE, a missing artifact)."""
import stat
import subprocess

from conftest import REPO

SCRIPT = REPO / "utils" / "gpu-ab.sh"


def fake_pack(root, name):
    """A pack whose benchmark takes MEDIAN_US (default 100) as its median
    and appends each call to calls.txt."""
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
        "echo \"step: median ${MEDIAN_US:-100} us, p90 1 us\"\n")
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
    assert f"{a}: median of 2 rounds 100 us" in out.stdout
    assert (f"{a}+KILN_CUDA_SPECIALISED=1+MEDIAN_US=90.5: median of 2 rounds "
            "90.5 us") in out.stdout


def test_refusals(tmp_path):
    a = fake_pack(tmp_path, "a")
    same = ab(a, a, "--", "m.kiln", cwd=tmp_path)
    assert same.returncode == 2 and "both sides are" in same.stderr
    bad = ab(a, f"{a}+NOTASETTING", "--", "m.kiln", cwd=tmp_path)
    assert bad.returncode == 2 and "'NOTASETTING' is not VAR=VALUE" in bad.stderr
    missing = ab(a, f"{a}+X=1", "--", "other.kiln", cwd=tmp_path)
    assert missing.returncode == 1 and "no such artifact" in missing.stderr
    assert not (tmp_path / "calls.txt").exists()
