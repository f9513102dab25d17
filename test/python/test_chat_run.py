"""kiln-run --chat: multi-turn on stdin, each turn rendered by the file's chat
template; later turns reuse the cached prefix. Every reply must equal what a
fresh kiln-run gives for the whole conversation so far rendered by jinja2
(greedy), so prefix reuse is exact, not approximately right."""
import json

import jinja2
import pytest
from conftest import file_chat_template, run_tool, tiny_cpu_model, tool

SEED = 6
TURNS = ["Hello there", "Tell me more", "And a third"]
N = 8


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_cpu_model(tmp_path_factory.mktemp("chat"), SEED, 256)


def test_chat_turns_equal_fresh_runs(model):
    import subprocess
    gguf, art = model
    proc = subprocess.run(
        [str(tool("kiln-run")), str(art), "--weights", str(gguf), "--chat",
         "-n", str(N), "--system", "Be brief."],
        input="\n".join(TURNS) + "\n\n", capture_output=True, text=True,
        errors="replace")
    assert proc.returncode == 0, proc.stderr
    replies = proc.stdout.split("\n")[:len(TURNS)]
    # Each turn after the first reuses the cached prefix.
    stats = [l for l in proc.stderr.splitlines() if l.startswith("[")]
    assert len(stats) == len(TURNS)
    assert all("(0 reused)" not in l for l in stats[1:])

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(file_chat_template(gguf))
    messages = [{"role": "system", "content": "Be brief."}]
    for turn, reply in zip(TURNS, replies):
        messages.append({"role": "user", "content": turn})
        prompt = template.render(messages=messages, add_generation_prompt=True)
        fresh = json.loads(run_tool("kiln-run", art, "--weights", gguf,
                                    "--prompt", prompt, "-n", N,
                                    "--json").stdout)
        # Replies are printed one per line: compare without newlines (a
        # random model's reply may itself contain some).
        assert reply == fresh["text"].split("\n")[0]
        messages.append({"role": "assistant", "content": fresh["text"]})


def test_chat_flags_are_checked(model):
    gguf, art = model
    for args, message in ((["--chat", "--prompt", "x"], "--chat reads"),
                          (["--system", "x", "--prompt", "x"],
                           "--system goes with --chat")):
        proc = run_tool("kiln-run", art, "--weights", gguf, *args,
                        check=False)
        assert proc.returncode == 2 and message in proc.stderr
