"""The malformed-GGUF corpus (test/gguf-corpus): every malformed file makes
`kiln-gguf check` and `kiln-gguf info` exit 1 with exactly one stderr line,
"kiln-gguf: error: ...", containing the field and problem the manifest
records; the valid files pass. Also checks that the checked-in corpus is
exactly what make_corpus.py writes."""
import json
import subprocess
import sys

import pytest

from conftest import REPO, run_tool

CORPUS = REPO / "test" / "gguf-corpus"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text())


@pytest.mark.parametrize("command", ["check", "info"])
@pytest.mark.parametrize("case", MANIFEST, ids=[c["rule"] for c in MANIFEST])
def test_corpus_case(case, command):
    proc = run_tool("kiln-gguf", command, CORPUS / case["open"], check=False)
    if case["expect"] is None:
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == ""
        return
    assert proc.returncode == 1, proc.stdout
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("kiln-gguf: error: "), lines[0]
    assert case["open"] in lines[0] or any(f in lines[0] for f in case["files"])
    assert case["expect"] in lines[0]


def test_corpus_is_what_the_script_writes(tmp_path):
    subprocess.run([sys.executable, CORPUS / "make_corpus.py", tmp_path],
                   check=True, capture_output=True)
    written = sorted(p.name for p in tmp_path.iterdir())
    checked_in = sorted(p.name for p in CORPUS.iterdir()
                        if p.suffix in (".gguf", ".json"))
    assert written == checked_in
    for name in written:
        assert (tmp_path / name).read_bytes() == (CORPUS / name).read_bytes(), name


def test_every_malformed_file_differs_by_rule():
    # One rule per case: no two cases expect the same message.
    expects = [c["expect"] for c in MANIFEST if c["expect"]]
    assert len(expects) == len(set(expects))
    assert len(expects) >= 30
