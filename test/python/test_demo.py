"""utils/demo.sh, the README's main command, on the build the tests use (its
set-up and build skipped: KILN_DEMO_NO_SETUP=1): it runs end to end, says
which backend ran the tiny model, shows a non-empty excerpt of every
program it prints (the excerpts are sed ranges over the compiler's output,
which a change of that output could leave empty), and both verifiers
reject their bad programs."""
import os
import re
import subprocess

import pytest

from conftest import REPO, build_dir


def test_demo_runs_end_to_end(tmp_path):
    for name in ("kiln-gguf", "kiln-compile", "kiln-run", "kiln-opt"):
        if not (build_dir() / "bin" / name).exists():
            pytest.skip(f"{name} not built")
    env = {**os.environ, "KILN_DEMO_NO_SETUP": "1",
           "KILN_BUILD_DIR": str(build_dir()), "KILN_DEMO_DIR": str(tmp_path)}
    out = subprocess.run(["bash", str(REPO / "utils" / "demo.sh")], env=env,
                         capture_output=True, text=True, errors="replace",
                         cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    text = out.stdout
    # The run, on whichever backend it found, said so.
    assert re.search(r"\(backend: (cpu|cuda); random weights", text), text
    assert re.search(r"decode: 31 steps in [0-9.]+ s", text), text

    def section(title):
        """The lines between section `title` and the next section."""
        start = text.index(title)
        end = text.find("\n-- ", start + 1)
        return text[start:end if end >= 0 else len(text)]

    # Each excerpt holds what its caption promises.
    kiln = section("-- 6.")
    assert "kiln.layer 1" in kiln and "kiln.linear" in kiln, kiln
    step = section("-- 7.")
    assert "step.rms_norm_linear" in step, step
    tp2 = section("-- 7b.")
    reduces = re.search(r"all_reduce per step\s+(\d+)", tp2)
    assert reduces and int(reduces.group(1)) > 0, tp2
    assert "fused with add + norm" in tp2, tp2
    # Both bad programs rejected, each with its own message.
    assert "op weight has 2048 elements" in section("-- 8."), text
    assert "unknown memory effects on %residual" in section("-- 9."), text
    assert text.count("as it should") == 2, text
