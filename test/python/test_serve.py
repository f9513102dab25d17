"""kiln-serve against the official openai client, on loopback, CPU backend,
tiny model: completions, chat, streaming, errors, a client that disconnects
mid-stream, and 50 sequential requests with nothing leaked.

What the server answers is compared with kiln-run on the same prompt (greedy,
so the tokens are determined): the server is a transport, not a second model.
"""
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from conftest import file_chat_template, run_tool, tiny_cpu_model, tool

SEED = 6


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_cpu_model(tmp_path_factory.mktemp("serve"), SEED, 128)


def start_server(model, max_context=96, *extra):
    gguf, art = model
    proc = subprocess.Popen(
        [str(tool("kiln-serve")), str(art), "--weights", str(gguf), "--port",
         "0", "--model-name", "tiny", "--max-context", str(max_context),
         "--threads", "2", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={k: v for k, v in os.environ.items() if k != "KILN_API_KEY"})
    line = proc.stdout.readline()
    assert "serving 'tiny' on http://127.0.0.1:" in line, (
        line, proc.stderr.read() if proc.poll() is not None else "")
    port = int(line.split("http://127.0.0.1:")[1].split()[0])
    return proc, f"http://127.0.0.1:{port}"


def stop_server(proc):
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def server(model):
    proc, url = start_server(model)
    yield proc, url
    stop_server(proc)


@pytest.fixture(scope="module")
def glm_model(tmp_path_factory):
    """The same model with room for a prompt that lists tools."""
    return tiny_cpu_model(tmp_path_factory.mktemp("serve-glm"), SEED, 384)


@pytest.fixture(scope="module")
def glm_server(glm_model):
    """Kiln's GLM template (--chat-template glm), which writes tools and tool
    calls (the synthetic file's own template does not)."""
    proc, url = start_server(glm_model, 384, "--chat-template", "glm")
    yield proc, url
    stop_server(proc)


def openai_client(url):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                         timeout=60)


@pytest.fixture()
def client(server):
    return openai_client(server[1])


@pytest.fixture()
def glm_client(glm_server):
    return openai_client(glm_server[1])


def greedy_text(model, prompt_text, n):
    gguf, art = model
    out = run_tool("kiln-run", art, "--weights", gguf, "--prompt",
                   prompt_text, "-n", n, "--json")
    return json.loads(out.stdout)


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    with urllib.request.urlopen(server[1] + "/health") as r:
        assert json.load(r) == {"status": "ok"}


def test_completion_equals_kiln_run(model, client):
    r = client.completions.create(model="tiny", prompt="Kiln compiles",
                                  max_tokens=12, temperature=0)
    expected = greedy_text(model, "Kiln compiles", 12)
    assert r.choices[0].text == expected["text"]
    assert r.usage.prompt_tokens == expected["prompt_tokens"]
    assert r.usage.completion_tokens == len(expected["tokens"])
    assert r.choices[0].finish_reason in ("length", "stop")


def test_chat_uses_the_template(model, client):
    r = client.chat.completions.create(
        model="tiny", max_tokens=10, temperature=0,
        messages=[{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Hello"}])
    # The same conversation rendered by the file's template (as kiln-chat-
    # template renders it) and run by kiln-run gives the same reply.
    gguf, _ = model
    template = file_chat_template(gguf)
    import jinja2
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    prompt = env.from_string(template).render(
        messages=[{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Hello"}],
        add_generation_prompt=True)
    expected = greedy_text(model, prompt, 10)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == expected["text"]
    assert r.usage.prompt_tokens == expected["prompt_tokens"]


def test_streaming_equals_non_streaming(client):
    args = dict(model="tiny", max_tokens=12, temperature=0,
                messages=[{"role": "user", "content": "Stream this"}])
    whole = client.chat.completions.create(**args).choices[0].message.content
    pieces, finish = [], None
    for chunk in client.chat.completions.create(stream=True, **args):
        delta = chunk.choices[0].delta
        if delta.content:
            pieces.append(delta.content)
        finish = chunk.choices[0].finish_reason or finish
    assert "".join(pieces) == whole and finish in ("length", "stop")
    text = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt="Stream", max_tokens=8, temperature=0,
        stream=True))
    assert text == client.completions.create(
        model="tiny", prompt="Stream", max_tokens=8, temperature=0
    ).choices[0].text


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}}}}]
TOOL_HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {
            "name": "get_weather",
            "arguments": json.dumps({"city": "Paris", "days": 2})}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]


def test_chat_with_tools_renders_calls_key_by_key(glm_model, glm_client):
    # The openai client sends a call's arguments as JSON text; the server
    # gives the template an object, so the prompt holds the call as the model
    # writes one (<arg_key>/<arg_value> pairs): the reply equals kiln-run's
    # on the prompt jinja2 renders (as HuggingFace sets it up) from Kiln's
    # GLM template with the arguments as a dict.
    r = glm_client.chat.completions.create(
        model="tiny", max_tokens=10, temperature=0, messages=TOOL_HISTORY,
        tools=TOOLS)
    from test_chat_template import GLM_TEMPLATE, jinja_render
    history = json.loads(json.dumps(TOOL_HISTORY))
    call = history[1]["tool_calls"][0]["function"]
    call["arguments"] = json.loads(call["arguments"])
    prompt = jinja_render(GLM_TEMPLATE.read_text(),
                          dict(messages=history, tools=TOOLS,
                               add_generation_prompt=True))
    assert "<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>" in prompt
    expected = greedy_text(glm_model, prompt, 10)
    assert r.usage.prompt_tokens == expected["prompt_tokens"]
    # A random model writes no tool call: the reply is its text (the markup
    # parsing itself is tested in tool-call-tests).
    message = r.choices[0].message
    assert not message.tool_calls
    assert message.content == expected["text"]
    assert r.choices[0].finish_reason in ("length", "stop")


def test_streaming_with_tools_equals_non_streaming(glm_client):
    # With tools the stream holds back what could begin a call: the pieces
    # still add up to the whole reply.
    args = dict(model="tiny", max_tokens=16, temperature=0,
                messages=[{"role": "user", "content": "Stream this"}],
                tools=TOOLS)
    whole = glm_client.chat.completions.create(
        **args).choices[0].message.content
    pieces, finish = [], None
    for chunk in glm_client.chat.completions.create(stream=True, **args):
        delta = chunk.choices[0].delta
        assert not delta.tool_calls
        if delta.content:
            pieces.append(delta.content)
        finish = chunk.choices[0].finish_reason or finish
    assert "".join(pieces) == whole and finish in ("length", "stop")


def test_forced_tool_calls(glm_model, glm_client, tmp_path):
    """tool_choice "required" and a named function: the reply is the
    kiln-run --tool-call reply on the prompt jinja2 renders (the generator
    and its constraint are the ones test_constrained_output.py checks
    against a reference), and it is GLM's call markup: whole calls come back
    as tool_calls of the functions asked for, a reply cut by max_tokens is
    a prefix of one."""
    from test_chat_template import GLM_TEMPLATE, jinja_render
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    prompt = jinja_render(GLM_TEMPLATE.read_text(),
                          dict(messages=messages, tools=TOOLS,
                               add_generation_prompt=True))
    gguf, art = glm_model
    # kiln-run reads the tool's parameters schema as the server does.
    params = tmp_path / "params.json"
    params.write_text(json.dumps(TOOLS[0]["function"]["parameters"]))
    for think in (True, False):
        # By default a chat reply may think first (kiln-run --think-first);
        # enable_thinking false leaves the call alone to constrain.
        want = json.loads(run_tool(
            "kiln-run", art, "--weights", gguf, "--prompt", prompt, "-n", 40,
            "--json", *(["--think-first"] if think else []), "--tool-call",
            f"get_weather=@{params}").stdout)
        thought, answer = split_reasoning(want["text"])
        extra = {} if think else {
            "chat_template_kwargs": {"enable_thinking": False}}
        for choice in ("required", {"type": "function",
                                    "function": {"name": "get_weather"}}):
            args = dict(model="tiny", max_tokens=40, temperature=0,
                        messages=messages, tools=TOOLS, tool_choice=choice,
                        extra_body=extra)
            r = glm_client.chat.completions.create(**args)
            m = r.choices[0].message
            assert (getattr(m, "reasoning_content", None) or "") == thought
            if r.choices[0].finish_reason == "tool_calls":
                assert [c.function.name for c in m.tool_calls] == [
                    "get_weather"]
                assert set(json.loads(
                    m.tool_calls[0].function.arguments)) <= {"city", "days"}
            else:
                assert r.choices[0].finish_reason == "length"
                assert (m.content or "") == answer
                assert answer.lstrip().startswith(
                    "<tool_call>get_weather\n"[:len(answer.lstrip())])
            streamed = "".join(
                c.choices[0].delta.content or "" for c in
                glm_client.chat.completions.create(stream=True, **args)
                if c.choices)
            assert streamed == (m.content or "")
        if not think:
            assert not thought and answer, want["text"]


def split_reasoning(text):
    """chat::splitReasoning: the thinking block and the answer."""
    stripped = text.lstrip(" \t\r\n")
    if not stripped.startswith("<think>"):
        return "", text
    rest = stripped[len("<think>"):]
    close = rest.find("</think>")
    if close < 0:
        return rest, ""
    return rest[:close], rest[close + len("</think>"):].lstrip(" \t\r\n")


@pytest.mark.parametrize("kwargs,param,says", [
    (dict(tool_choice="required"), "tool_choice", "needs 'tools'"),
    (dict(tools=TOOLS, tool_choice={"type": "function",
                                    "function": {"name": "nope"}}),
     "tool_choice", "which 'tools' does not have"),
    (dict(tools=TOOLS, tool_choice="sometimes"), "tool_choice",
     "is not one of"),
    (dict(tools=TOOLS, tool_choice="required",
          response_format={"type": "json_object"}), "tool_choice",
     "exclude each other"),
    (dict(tools=[{"type": "function", "function": {"name": "a<b"}}],
          tool_choice="required"), "tools", "cannot be written"),
    # The reader trims names and keys: " f" would come back as "f".
    (dict(tools=[{"type": "function", "function": {"name": " f"}}],
          tool_choice="required"), "tools", "cannot be written"),
    (dict(tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object",
                                    "properties": {"k ": {}}}}}],
          tool_choice="required"), "tools", "cannot be written"),
])
def test_forced_tool_choice_errors(glm_client, kwargs, param, says):
    import openai
    with pytest.raises(openai.APIStatusError) as e:
        glm_client.chat.completions.create(
            model="tiny", max_tokens=4,
            messages=[{"role": "user", "content": "x"}], **kwargs)
    assert e.value.status_code == 400
    assert e.value.body["param"] == param
    assert says in e.value.body["message"]


def test_tools_must_be_a_list(server):
    req = urllib.request.Request(
        server[1] + "/v1/chat/completions", method="POST",
        headers={"Content-Type": "application/json"},
        data=json.dumps({"messages": [{"role": "user", "content": "x"}],
                         "tools": {"name": "f"}}).encode())
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    body = json.load(e.value)
    assert e.value.code == 400 and body["error"]["param"] == "tools"


def test_stream_usage_and_penalties(model, client):
    # stream_options.include_usage: a last chunk with no choices and the
    # usage of the same request unstreamed. OpenAI's penalties are the
    # sampler's (kiln-run --frequency-penalty / --presence-penalty).
    args = dict(model="tiny", max_tokens=10, temperature=0,
                frequency_penalty=1.5, presence_penalty=0.5,
                messages=[{"role": "user", "content": "Count"}])
    whole = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(
        stream=True, stream_options={"include_usage": True}, **args))
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert (chunks[-1].usage.completion_tokens ==
            whole.usage.completion_tokens)
    assert all(c.usage is None for c in chunks[:-1])
    text = "".join(c.choices[0].delta.content or "" for c in chunks[:-1])
    assert text == whole.choices[0].message.content
    gguf, art = model
    from test_chat_template import jinja_render
    prompt = jinja_render(file_chat_template(gguf),
                          dict(messages=args["messages"],
                               add_generation_prompt=True))
    out = run_tool("kiln-run", art, "--weights", gguf, "--prompt", prompt,
                   "-n", 10, "--json", "--frequency-penalty", 1.5,
                   "--presence-penalty", 0.5)
    assert json.loads(out.stdout)["text"] == whole.choices[0].message.content
    # ... and they change this reply (else the comparison proves nothing).
    plain = dict(args, frequency_penalty=0, presence_penalty=0)
    assert (client.chat.completions.create(**plain).choices[0].message.content
            != whole.choices[0].message.content)


def reference_logprobs(model, tmp_path, prompt_text, n):
    """kiln-run's greedy tokens for the prompt and the log-softmax (float64)
    of the logits each was chosen from."""
    gguf, art = model
    out = tmp_path / "ref.npy"
    run = json.loads(run_tool("kiln-run", art, "--weights", gguf, "--prompt",
                              prompt_text, "-n", n, "--json", "--logits-out",
                              out).stdout)
    logits = np.load(out).astype(np.float64)
    rows = logits[run["prompt_tokens"] - 1:][:len(run["tokens"])]
    top = rows.max(axis=1, keepdims=True)
    logp = rows - top - np.log(np.exp(rows - top).sum(axis=1, keepdims=True))
    return run["tokens"], logp


# The log-softmax of f32 logits over the vocabulary, in double on both sides
# (the server's and numpy's sums differ only in order): 1e-9 absolute.
LOGPROB_TOL = 1e-9


def test_completion_logprobs(model, client, tmp_path):
    r = client.completions.create(model="tiny", prompt="Kiln compiles",
                                  max_tokens=8, temperature=0, logprobs=2)
    tokens, logp = reference_logprobs(model, tmp_path, "Kiln compiles", 8)
    lp = r.choices[0].logprobs
    assert len(lp.token_logprobs) == len(tokens)
    assert "".join(lp.tokens) == r.choices[0].text
    for i, t in enumerate(tokens):
        assert abs(lp.token_logprobs[i] - logp[i, t]) <= LOGPROB_TOL
        # Greedy: the chosen token is the most likely. The legacy format
        # keys the two alternatives by text, so tokens of the same text
        # (the tiny vocabulary's unused ids decode to nothing) share one
        # entry: its values are among numpy's two largest.
        top = list(lp.top_logprobs[i].values())
        assert 1 <= len(top) <= 2
        assert max(top) == pytest.approx(lp.token_logprobs[i],
                                         abs=LOGPROB_TOL)
        best2 = np.sort(logp[i])[::-1][:2]
        assert all(np.min(np.abs(best2 - v)) <= LOGPROB_TOL for v in top)
    # Byte offsets into the completion: each token's bytes after the last
    # (a token that is not whole UTF-8 reaches the client as U+FFFD, so
    # only whole ones' lengths can be checked here).
    assert lp.text_offset[0] == 0
    for i in range(len(tokens) - 1):
        step = lp.text_offset[i + 1] - lp.text_offset[i]
        assert step >= 0
        if "\ufffd" not in lp.tokens[i]:
            assert step == len(lp.tokens[i].encode())


def test_chat_logprobs(model, client, tmp_path):
    messages = [{"role": "user", "content": "Hello"}]
    r = client.chat.completions.create(model="tiny", max_tokens=6,
                                       temperature=0, messages=messages,
                                       logprobs=True, top_logprobs=3)
    gguf, _ = model
    from test_chat_template import jinja_render
    prompt = jinja_render(file_chat_template(gguf),
                          dict(messages=messages, add_generation_prompt=True))
    tokens, logp = reference_logprobs(model, tmp_path, prompt, 6)
    content = r.choices[0].logprobs.content
    assert len(content) == len(tokens)
    for i, (entry, t) in enumerate(zip(content, tokens)):
        assert abs(entry.logprob - logp[i, t]) <= LOGPROB_TOL
        tops = [e.logprob for e in entry.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert entry.top_logprobs[0].bytes == entry.bytes
        # The three most likely, as numpy ranks them.
        want = np.sort(logp[i])[::-1][:3]
        assert np.allclose(tops, want, atol=LOGPROB_TOL, rtol=0)
    # Without the flag, no log-probabilities.
    plain = client.chat.completions.create(model="tiny", max_tokens=2,
                                           temperature=0, messages=messages)
    assert plain.choices[0].logprobs is None


def test_echo_scores_the_prompt(model, client, tmp_path):
    """echo with logprobs and max_tokens 0, as evaluation harnesses score a
    text: the prompt comes back with each token's log-probability given
    the ones before it (the first has none), as numpy computes them from
    kiln-run's logits of the same tokens."""
    gguf, art = model
    text = "Kiln compiles the model fast"
    ids = [int(t) for t in subprocess.run(
        [str(tool("kiln-tokenize")), str(gguf), "encode"], input=text,
        capture_output=True, text=True, check=True).stdout.split(",")]
    out = tmp_path / "prompt.npy"
    run_tool("kiln-run", art, "--weights", gguf, "--prompt-tokens",
             ",".join(map(str, ids)), "-n", 0, "--logits-out", out)
    rows = np.load(out).astype(np.float64)
    top = rows.max(axis=1, keepdims=True)
    logp = rows - top - np.log(np.exp(rows - top).sum(axis=1, keepdims=True))
    # Twice: the second finds the prompt cached and must still score it.
    for _ in range(2):
        r = client.completions.create(model="tiny", prompt=text, echo=True,
                                      logprobs=1, max_tokens=0)
        c = r.choices[0]
        assert c.text == text and r.usage.completion_tokens == 0
        assert len(c.logprobs.tokens) == len(ids)
        assert c.logprobs.token_logprobs[0] is None
        assert c.logprobs.top_logprobs[0] is None
        for i in range(1, len(ids)):
            assert abs(c.logprobs.token_logprobs[i] -
                       logp[i - 1, ids[i]]) <= LOGPROB_TOL
    # Echo with a completion: the prompt's text, then the completion's.
    r = client.completions.create(model="tiny", prompt=text, echo=True,
                                  max_tokens=4, temperature=0)
    plain = client.completions.create(model="tiny", prompt=text, max_tokens=4,
                                      temperature=0)
    assert r.choices[0].text == text + plain.choices[0].text


def test_several_choices(client):
    """n choices are generated one after another, choice i sampled with
    seed + i: each equals a request for one choice with that seed, streamed
    or not, and the usage counts all of them."""
    args = dict(model="tiny", max_tokens=8, temperature=1.0,
                messages=[{"role": "user", "content": "Pick"}])
    r = client.chat.completions.create(n=3, seed=5, **args)
    assert [c.index for c in r.choices] == [0, 1, 2]
    singles = [client.chat.completions.create(seed=5 + i, **args)
               for i in range(3)]
    assert ([c.message.content for c in r.choices] ==
            [s.choices[0].message.content for s in singles])
    assert r.usage.completion_tokens == sum(s.usage.completion_tokens
                                            for s in singles)
    # Not all alike (else the seeds would not matter).
    assert len({c.message.content for c in r.choices}) > 1
    texts, finished = {}, set()
    for chunk in client.chat.completions.create(n=3, seed=5, stream=True,
                                                **args):
        c = chunk.choices[0]
        texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
        if c.finish_reason:
            finished.add(c.index)
    assert finished == {0, 1, 2}
    assert [texts[i] for i in range(3)] == [c.message.content
                                           for c in r.choices]


@pytest.mark.parametrize("kwargs,status,param", [
    (dict(prompt="x", echo=True, stream=True), 400, "echo"),
    (dict(prompt="x", logprobs=6), 400, "logprobs"),
    (dict(prompt="x", logprobs=1, stream=True), 400, "logprobs"),
    (dict(prompt="x", max_tokens=200), 400, "max_tokens"),  # > --max-context
    (dict(prompt="x", frequency_penalty=2.5), 400, "frequency_penalty"),
    (dict(prompt="x", presence_penalty=-3), 400, "presence_penalty"),
    (dict(prompt="x", stream_options={"include_usage": True}), 400,
     "stream_options"),
    (dict(prompt="x", max_tokens=0), 400, "max_tokens"),
    (dict(prompt="x", temperature=-1), 400, "temperature"),
    (dict(prompt="x", stop=[1]), 400, "stop"),
    (dict(prompt="x", n=65), 400, "n"),
])
def test_bad_requests_get_4xx(client, kwargs, status, param):
    import openai
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(model="tiny", **kwargs)
    assert e.value.status_code == status
    body = e.value.body
    assert body["param"] == param and body["message"]


def test_unknown_model_and_route_and_bad_json(server, client):
    import openai
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="other", prompt="x")
    assert e.value.body["code"] == "model_not_found"
    for path, data in (("/v1/completions", b"{bad"),
                       ("/v1/chat/completions", b'{"messages": []}'),
                       ("/nope", None)):
        req = urllib.request.Request(server[1] + path, data=data)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req)
        assert err.value.code in (400, 404)
        assert "message" in json.load(err.value)["error"]
    # A value nested 1,000,000 deep (2 MB) once ran the server out of
    # stack; now a 400 at the parse, and the server is still up.
    deep = b'{"model": ' + b"[" * 1000000 + b"]" * 1000000 + b"}"
    status, reply = _post(server[1] + "/v1/completions", deep)
    assert status == 400
    assert "nested too deeply (limit 256)" in reply["error"]["message"]
    with urllib.request.urlopen(server[1] + "/health") as r:
        assert json.load(r)["status"] == "ok"


def test_disconnect_mid_stream_frees_the_slot(server, client):
    """A client that reads one event and hangs up: its generation stops (at
    the next write that fails) and the next request is served at once, not
    after the 80 tokens the first one asked for."""
    start = time.monotonic()
    client.completions.create(model="tiny", prompt="Go", max_tokens=80,
                              temperature=0, stop=None)
    full = time.monotonic() - start
    host, port = server[1][len("http://"):].split(":")
    body = json.dumps({"model": "tiny", "prompt": "Go", "max_tokens": 80,
                       "temperature": 0, "stream": True}).encode()
    s = socket.create_connection((host, int(port)))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
              b"Content-Type: application/json\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)
    received = b""
    while b"data:" not in received:
        chunk = s.recv(4096)
        assert chunk, received
        received += chunk
    s.close()
    start = time.monotonic()
    r = client.completions.create(model="tiny", prompt="Next", max_tokens=2,
                                  temperature=0)
    waited = time.monotonic() - start
    assert r.choices[0].text is not None
    print(f"80 tokens: {full:.3f} s; next request after a disconnect: "
          f"{waited:.3f} s")
    assert waited < full / 2


def _fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def _rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_fifty_sequential_requests_leak_nothing(server):
    """File descriptors and memory measured with no client connected (a
    client's keep-alive connections are closed first), before and after 50
    requests of every kind."""
    openai = pytest.importorskip("openai")
    proc = server[0]

    def idle_state(client):
        client.close()
        time.sleep(0.5)  # the server notices the closed connections
        return _fds(proc.pid), _rss_kb(proc.pid)

    warm = openai.OpenAI(base_url=server[1] + "/v1", api_key="none",
                         max_retries=0, timeout=60)
    for _ in range(5):  # thread pool, allocator
        warm.completions.create(model="tiny", prompt="warm", max_tokens=4,
                                temperature=0)
    fds, rss = idle_state(warm)
    client = openai.OpenAI(base_url=server[1] + "/v1", api_key="none",
                           max_retries=0, timeout=60)
    for i in range(50):
        if i % 2:
            client.completions.create(model="tiny", prompt=f"req {i}",
                                      max_tokens=6, temperature=0.8, seed=i)
        else:
            list(client.chat.completions.create(
                model="tiny", max_tokens=6, temperature=0, stream=True,
                messages=[{"role": "user", "content": f"req {i}"}]))
    fds_after, rss_after = idle_state(client)
    print(f"fds {fds} -> {fds_after}, RSS {rss} -> {rss_after} kB")
    # Not one more (a leak would add one per request); other tests' idle
    # keep-alive connections may have closed meanwhile.
    assert fds_after <= fds
    # Within 2 MB: allocator noise, not a per-request leak.
    assert rss_after - rss < 2048


@pytest.mark.parametrize("args, message", [
    (["--threads", "x"], "--threads: expected a thread count (0: every core) "
                         "from 0 to 4096, not 'x'"),
    (["--threads", "5000"], "from 0 to 4096, not '5000'"),
    (["--device", "-1"], "--device: expected a GPU ordinal from 0 to 1024, "
                         "not '-1'"),
    (["--backend-dir"], "--backend-dir needs a value"),
    (["--weights"], "--weights needs at least one file"),
    (["second.kiln"], "more than one artifact given: second.kiln"),
])
def test_session_flags_as_kiln_run(model, args, message):
    """The flags that open a session are parsed by one function for both
    tools: the same refusal, word for word, and exit status 2."""
    gguf, art = model
    lines = []
    for name in ("kiln-serve", "kiln-run"):
        proc = subprocess.run([str(tool(name)), str(art), *args],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, (name, proc.stderr)
        first = proc.stderr.splitlines()[0]
        assert first.startswith(name + ": error: "), first
        assert message in first, first
        lines.append(first.split(": error: ", 1)[1])
    assert lines[0] == lines[1]


def test_chat_template_file_errors(model, tmp_path):
    """--chat-template names the file it cannot read, or the template's
    line it cannot parse, and exits 1 before serving."""
    gguf, art = model
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }}")
    for path, message in ((tmp_path / "missing.jinja", "cannot read the file"),
                          (bad, "bad.jinja")):
        proc = subprocess.run(
            [str(tool("kiln-serve")), str(art), "--weights", str(gguf),
             "--port", "0", "--chat-template", str(path)],
            capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.startswith("kiln-serve: error: "), proc.stderr
        assert str(path.name) in proc.stderr and message in proc.stderr, (
            proc.stderr)


def test_reasoning_mode_is_checked(model):
    gguf, art = model
    proc = subprocess.run(
        [str(tool("kiln-serve")), str(art), "--weights", str(gguf),
         "--reasoning", "hidden"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("kiln-serve: error: --reasoning: expected "
                                  "separate or inline, not 'hidden'"), (
        proc.stderr)


def _post(url, body):
    """POSTs body (JSON bytes as they are, else a value to encode) as JSON;
    the status and the reply's JSON, error or not."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, method="POST", data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def test_tokenize_and_detokenize(model, server):
    gguf, _ = model
    text = "Hello <|user|> world"
    want = [int(t) for t in subprocess.run(
        [str(tool("kiln-tokenize")), str(gguf), "encode"], input=text,
        capture_output=True, text=True, check=True).stdout.split(",")]
    status, body = _post(server[1] + "/tokenize", {"prompt": text})
    assert status == 200
    assert body["tokens"] == want and body["count"] == len(want)
    assert body["max_model_len"] == 96
    status, body = _post(server[1] + "/detokenize", {"tokens": want})
    assert status == 200 and body["prompt"] == text
    for bad in ({"tokens": [1, 1 << 40]}, {"tokens": [-1]}, {"tokens": "1"}):
        status, body = _post(server[1] + "/detokenize", bad)
        assert status == 400 and body["error"]["param"] == "tokens"
    status, body = _post(server[1] + "/tokenize", {"text": text})
    assert status == 400 and body["error"]["param"] == "prompt"


def _metrics(url):
    with urllib.request.urlopen(url + "/metrics") as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    # Every sample has its HELP and TYPE lines.
    for name in {n.split("{")[0] for n in values}:
        assert f"# TYPE {name} " in text and f"# HELP {name} " in text
    return values


def test_metrics_count_requests_and_tokens(server, client):
    before = _metrics(server[1])
    r = client.completions.create(model="tiny", prompt="Count me",
                                  max_tokens=5, temperature=0)
    import openai
    with pytest.raises(openai.APIStatusError):
        client.completions.create(model="tiny", prompt="x", max_tokens=0)
    after = _metrics(server[1])
    def delta(name):
        return after[name] - before.get(name, 0)
    assert delta('kiln_requests_total{endpoint="completions"}') == 1
    assert delta('kiln_request_errors_total{class="4xx"}') == 1
    assert delta("kiln_prompt_tokens_total") == r.usage.prompt_tokens
    assert delta("kiln_generated_tokens_total") == r.usage.completion_tokens
    assert delta("kiln_generation_seconds_total") > 0
    assert after["kiln_requests_running"] == 0
    assert after["kiln_requests_waiting"] == 0
    # Where the tokens were chosen: greedy by the step's argmax, a
    # temperature (with its cuts, penalties and biases) by the step's draw,
    # biases past the step's room (320 tokens) on the host.
    chooser = 'kiln_generated_tokens_by_chooser_total{{chooser="{}"}}'
    assert delta(chooser.format("step_argmax")) == r.usage.completion_tokens
    for kind, extra in (("step_draw", {}), ("step_draw", {"top_p": 0.5}),
                        ("step_draw", {"extra_body": {"top_k": 3}}),
                        ("step_draw", {"frequency_penalty": 0.5,
                                       "logit_bias": {"7": 2}}),
                        ("host", {"logit_bias": {str(i): 0.5
                                                 for i in range(321)}})):
        before = _metrics(server[1])
        d = client.completions.create(model="tiny", prompt="Count me",
                                      max_tokens=4, temperature=0.9, seed=2,
                                      **extra)
        after = _metrics(server[1])
        assert delta(chooser.format(kind)) == d.usage.completion_tokens > 0
        assert sum(delta(chooser.format(k)) for k in
                   ("step_argmax", "step_draw", "host")) == \
            d.usage.completion_tokens


@pytest.fixture(scope="module")
def thinking_server(glm_model, tmp_path_factory):
    """A GLM-style template with macros, a namespace and enable_thinking
    (test_chat_template.THINKING_TEMPLATE) as --chat-template FILE."""
    from test_chat_template import THINKING_TEMPLATE
    path = tmp_path_factory.mktemp("thinking") / "glm-style.jinja"
    path.write_text(THINKING_TEMPLATE)
    proc, url = start_server(glm_model, 384, "--chat-template", str(path))
    yield proc, url
    stop_server(proc)


def test_chat_template_kwargs(glm_model, thinking_server):
    """chat_template_kwargs reach the template: enable_thinking=false makes
    the same prompt jinja2 renders with it (the user turn marked /nothink,
    an empty thinking block after <|assistant|>)."""
    client = openai_client(thinking_server[1])
    from test_chat_template import THINKING_TEMPLATE, jinja_render
    messages = [{"role": "user", "content": "Hi"}]
    counts = {}
    for thinking in (None, False):
        extra = ({} if thinking is None else
                 {"chat_template_kwargs": {"enable_thinking": thinking}})
        r = client.chat.completions.create(model="tiny", max_tokens=4,
                                           temperature=0, messages=messages,
                                           extra_body=extra)
        context = dict(messages=messages, add_generation_prompt=True)
        if thinking is not None:
            context["enable_thinking"] = thinking
        prompt = jinja_render(THINKING_TEMPLATE, context)
        expected = greedy_text(glm_model, prompt, 4)
        assert r.usage.prompt_tokens == expected["prompt_tokens"]
        counts[thinking] = r.usage.prompt_tokens
    assert counts[False] > counts[None]
    for bad, what in (("x", "must be an object"),
                      ({"messages": []}, "may not set 'messages'")):
        status, body = _post(thinking_server[1] + "/v1/chat/completions",
                             {"messages": messages,
                              "chat_template_kwargs": bad})
        assert status == 400 and what in body["error"]["message"]
        assert body["error"]["param"] == "chat_template_kwargs"


def test_max_request_bytes(model):
    """--max-request-bytes: a larger body is a 413 in the JSON error shape,
    before the server reads it; smaller ones are served as before."""
    proc, url = start_server(model, 96, "--max-request-bytes", "100000")
    try:
        status, reply = _post(url + "/v1/completions",
                              {"model": "tiny", "prompt": "x" * 200000,
                               "max_tokens": 2})
        assert status == 413
        assert "--max-request-bytes" in reply["error"]["message"]
        status, reply = _post(url + "/v1/completions",
                              {"model": "tiny", "prompt": "x",
                               "max_tokens": 2})
        assert status == 200 and reply["choices"], reply
    finally:
        stop_server(proc)
    bad = subprocess.run([str(tool("kiln-serve")), "m.kiln",
                          "--max-request-bytes", "0"],
                         capture_output=True, text=True)
    assert bad.returncode == 2
    assert "--max-request-bytes: expected a number in [1," in bad.stderr


def test_api_key(model):
    """--api-key (or $KILN_API_KEY): requests without the key, or with
    another, get a 401; /health stays open."""
    import openai
    proc, url = start_server(model, 96, "--api-key", "s3cret")
    try:
        good = openai.OpenAI(base_url=url + "/v1", api_key="s3cret",
                             max_retries=0, timeout=60)
        assert [m.id for m in good.models.list().data] == ["tiny"]
        r = good.completions.create(model="tiny", prompt="x", max_tokens=2,
                                    temperature=0)
        assert r.choices[0].finish_reason in ("length", "stop")
        bad = openai.OpenAI(base_url=url + "/v1", api_key="s3cre",
                            max_retries=0, timeout=60)
        with pytest.raises(openai.AuthenticationError) as e:
            bad.models.list()
        assert e.value.body["code"] == "invalid_api_key"
        status, _ = _post(url + "/tokenize", {"prompt": "x"})
        assert status == 401
        with urllib.request.urlopen(url + "/health") as r:
            assert json.load(r) == {"status": "ok"}
    finally:
        stop_server(proc)


def test_logit_bias_and_refused_parameters(server, client):
    status, body = _post(server[1] + "/tokenize", {"prompt": "A"})
    (a,) = body["tokens"]
    args = dict(model="tiny", prompt="Kiln", max_tokens=4, temperature=0)
    # +100 on one token makes greedy decoding pick it every time.
    r = client.completions.create(logit_bias={str(a): 100}, **args)
    assert r.choices[0].text == "A" * 4
    # -100 on the unbiased reply's first token moves it off that token.
    plain = client.completions.create(logprobs=0, **args)
    first = plain.choices[0].logprobs.tokens[0]
    status, body = _post(server[1] + "/tokenize", {"prompt": first})
    if len(body["tokens"]) == 1:
        other = client.completions.create(
            logprobs=0, logit_bias={str(body["tokens"][0]): -100}, **args)
        assert other.choices[0].logprobs.tokens[0] != first
    import openai
    for extra, param in ((dict(logit_bias={"-1": 1}), "logit_bias"),
                         (dict(logit_bias={str(a): 101}), "logit_bias"),
                         (dict(suffix="end"), "suffix"),
                         (dict(best_of=3), "best_of")):
        with pytest.raises(openai.APIStatusError) as e:
            client.completions.create(**args, **extra)
        assert e.value.status_code == 400 and e.value.body["param"] == param
    for fmt, says in (({"type": "json_schema", "json_schema": {"name": "x"}},
                       "json_schema needs"),
                      ({"type": "json_schema", "json_schema": {
                          "name": "x", "schema": {"type": "object",
                                                  "properties": {
                                                      "a": {"not": {}}}}}},
                       "'response_format' json_schema.schema: "
                       "#/properties/a/not: keyword 'not' is "
                       "not supported"),
                      ({"type": "json_schema", "json_schema": {
                          "name": "x", "schema": {"multipleOf": 0.5}}},
                       "#/multipleOf: a multiple is kept only of a whole "
                       "number"),
                      ({"type": "json_schema", "json_schema": {
                          "name": "x", "schema": {"pattern": "(?=a)"}}},
                       "#/pattern: pattern: look-arounds"),
                      ({"type": "json_schema", "json_schema": {
                          "name": "x", "schema": {"$ref": "#/nowhere"}}},
                       "names nothing"),
                      # Nesting that once ran the pattern compiler out of
                      # stack (the server died): a 400, and the cases after
                      # it find the server still up.
                      ({"type": "json_schema", "json_schema": {
                          "name": "x", "schema": {
                              "pattern": "(" * 100000 + "a" + ")" * 100000}}},
                       "#/pattern: pattern: groups nested more than 64 deep"),
                      ({"type": "json_schema", "json_schema": {
                          "name": "x", "schema": {
                              "pattern": "a" + "*" * 100000}}},
                       "a quantifier after a quantifier"),
                      ({"type": "yaml"}, "json_object")):
        with pytest.raises(openai.APIStatusError) as e:
            client.chat.completions.create(
                model="tiny", max_tokens=2,
                messages=[{"role": "user", "content": "x"}],
                response_format=fmt)
        assert e.value.status_code == 400
        assert e.value.body["param"] == "response_format"
        assert says in e.value.body["message"]


def test_sampling_needs_the_logits(model, tmp_path):
    """An artifact compiled with --no-logits serves greedy replies,
    temperatures, their cuts, penalties and biases (the step draws and
    adjusts: DrawKey.h), the same as kiln-run; biases past the step's room
    or logprobs are a 400 naming the parameter (before, a sampled request
    drew from no logits)."""
    gguf, _ = model
    bare = tmp_path / "bare.kiln"
    run_tool("kiln-compile", gguf, "--target=cpu", "--context", "96",
             "--no-logits", "-o", bare)
    proc, url = start_server((gguf, bare))
    try:
        status, body = _post(url + "/v1/completions",
                             {"model": "tiny", "prompt": "Kiln",
                              "max_tokens": 3, "temperature": 0})
        assert status == 200 and body["choices"][0]["text"] is not None
        status, body = _post(url + "/v1/completions",
                             {"model": "tiny", "prompt": "Kiln",
                              "max_tokens": 6, "temperature": 0.9,
                              "seed": 11})
        assert status == 200, body
        want = json.loads(run_tool(
            "kiln-run", bare, "--weights", gguf, "--prompt", "Kiln", "-n", 6,
            "--temperature", 0.9, "--seed", 11, "--json").stdout)
        assert body["choices"][0]["text"] == want["text"]
        # A top_p, a top_k and both are the step's cuts: served, as kiln-run
        # draws them.
        # So are the penalties and biases (the step's adjusting form).
        for extra, flags in (({"top_p": 0.6}, ["--top-p", 0.6]),
                             ({"top_k": 4}, ["--top-k", 4]),
                             ({"top_p": 0.9, "top_k": 6},
                              ["--top-p", 0.9, "--top-k", 6]),
                             ({"top_p": 0.5, "min_p": 0.1,
                               "presence_penalty": 0.5},
                              ["--top-p", 0.5, "--min-p", 0.1,
                               "--presence-penalty", 0.5]),
                             ({"top_k": 5, "logit_bias": {"3": 2},
                               "frequency_penalty": 1.5},
                              ["--top-k", 5, "--logit-bias", "3=2",
                               "--frequency-penalty", 1.5])):
            status, body = _post(url + "/v1/completions",
                                 {"model": "tiny", "prompt": "Kiln",
                                  "max_tokens": 6, "temperature": 0.9,
                                  "seed": 11, **extra})
            assert status == 200, body
            want = json.loads(run_tool(
                "kiln-run", bare, "--weights", gguf, "--prompt", "Kiln",
                "-n", 6, "--temperature", 0.9, *flags, "--seed", 11,
                "--json").stdout)
            assert want["chooser"] == "step_draw"
            # The same text, bytes that are not UTF-8 included (a random
            # model's reply may hold them: one U+FFFD a maximal subpart on
            # both sides).
            assert body["choices"][0]["text"] == want["text"], extra
        # More biased ids than the step's room (320), or logprobs: 400s.
        for extra, param in (({"temperature": 0.7, "top_k": 5,
                               "logit_bias": {str(i): 1 for i in range(321)}},
                              "logit_bias"),
                             ({"temperature": 0, "logprobs": 2},
                              "logprobs")):
            status, body = _post(url + "/v1/completions",
                                 {"model": "tiny", "prompt": "Kiln",
                                  "max_tokens": 3, **extra})
            assert status == 400, body
            assert body["error"]["param"] == param
            assert f"'{param}' needs the logits" in body["error"]["message"]
            assert "compiled with --no-logits" in body["error"]["message"]
    finally:
        stop_server(proc)


def test_json_object_replies(model, server, client):
    """response_format json_object: the same tokens as kiln-run
    --json-object (which test_constrained_output.py checks against a reference
    reader); a '}' biased up closes the object at once, and the reply ends
    there with finish_reason stop; streamed as not."""
    gguf, art = model
    want = json.loads(run_tool(
        "kiln-run", art, "--weights", gguf, "--prompt", "Kiln compiles",
        "-n", 12, "--json", "--json-object").stdout)
    r = client.completions.create(
        model="tiny", prompt="Kiln compiles", max_tokens=12, temperature=0,
        extra_body={"response_format": {"type": "json_object"}})
    assert r.choices[0].text == want["text"]
    assert r.choices[0].finish_reason == want["finish_reason"]
    status, body = _post(server[1] + "/tokenize", {"prompt": "}"})
    assert status == 200 and len(body["tokens"]) == 1
    close = body["tokens"][0]
    # Without a thinking block first (a '}' biased up would fill it).
    args = dict(model="tiny", max_tokens=40, temperature=0.8, seed=3,
                messages=[{"role": "user", "content": "JSON please"}],
                logit_bias={str(close): 100},
                response_format={"type": "json_object"},
                extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    r = client.chat.completions.create(**args)
    assert r.choices[0].finish_reason == "stop"
    assert json.loads(r.choices[0].message.content) == {}
    chunks = list(client.chat.completions.create(stream=True, **args))
    assert "".join(c.choices[0].delta.content or "" for c in chunks
                   if c.choices) == r.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_json_whitespace_is_bounded(server, client):
    """A model that would write only whitespace (here a ' ' biased up by
    100) writes at most 64 bytes of it in a row outside strings under
    response_format (chat::WhitespaceCap): the longest run is exactly 64,
    and something else comes between runs."""
    import re
    status, body = _post(server[1] + "/tokenize", {"prompt": " "})
    assert status == 200 and len(body["tokens"]) == 1
    space = body["tokens"][0]
    for fmt in ({"type": "json_object"},
                {"type": "json_schema", "json_schema": {
                    "name": "v", "schema": {"type": "array"}}}):
        r = client.completions.create(
            model="tiny", prompt="JSON:", max_tokens=85, temperature=0,
            logit_bias={str(space): 100}, extra_body={"response_format": fmt})
        text = r.choices[0].text
        runs = [len(m) for m in re.findall(r"[ \t\r\n]+", text)]
        assert max(runs) == 64, (fmt, runs)
        assert text.strip(), fmt


def test_json_schema_replies(model, server, client, tmp_path):
    """response_format json_schema: the same tokens as kiln-run
    --json-schema (which test_json_schema_output.py checks against a
    reference reader and jsonschema), greedy and sampled; a whole reply
    validates."""
    import jsonschema
    gguf, art = model
    schema = {"type": "array", "items": {"type": ["boolean", "null"]},
              "minItems": 1, "maxItems": 3}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    fmt = {"type": "json_schema",
           "json_schema": {"name": "flags", "schema": schema, "strict": True}}
    for flags, args in (([], dict(temperature=0)),
                        (["--temperature", "1.2", "--seed", "4"],
                         dict(temperature=1.2, seed=4))):
        want = json.loads(run_tool(
            "kiln-run", art, "--weights", gguf, "--prompt", "Kiln compiles",
            "-n", 30, "--json", "--json-schema", path, *flags).stdout)
        r = client.completions.create(
            model="tiny", prompt="Kiln compiles", max_tokens=30,
            extra_body={"response_format": fmt}, **args)
        assert r.choices[0].text == want["text"]
        assert r.choices[0].finish_reason == want["finish_reason"]
        if want["finish_reason"] == "stop":
            jsonschema.validate(json.loads(want["text"]), schema)
    # '[' and ']' biased up: the reply opens and closes an array at once,
    # and ends there (nothing may follow a whole value).
    ids = []
    for piece in ("[", "]"):
        status, body = _post(server[1] + "/tokenize", {"prompt": piece})
        assert status == 200 and len(body["tokens"]) == 1
        ids.append(body["tokens"][0])
    empty = {"type": "array", "items": {"type": "null"}, "maxItems": 3}
    r = client.chat.completions.create(
        model="tiny", max_tokens=40, temperature=0,
        messages=[{"role": "user", "content": "JSON please"}],
        logit_bias={str(i): 100 for i in ids},
        response_format={"type": "json_schema",
                         "json_schema": {"name": "e", "schema": empty}})
    assert r.choices[0].finish_reason == "stop"
    assert json.loads(r.choices[0].message.content) == []


def test_tools_with_a_template_that_ignores_them(server):
    """The synthetic file's own template never reads 'tools': a request
    with tools is refused rather than silently answered without them."""
    status, body = _post(server[1] + "/v1/chat/completions",
                         {"messages": [{"role": "user", "content": "x"}],
                          "tools": TOOLS, "max_tokens": 2})
    assert status == 400 and body["error"]["param"] == "tools"
    assert "does not read 'tools'" in body["error"]["message"]
    # No tools, or an empty list: answered.
    status, _ = _post(server[1] + "/v1/chat/completions",
                      {"messages": [{"role": "user", "content": "x"}],
                       "tools": [], "max_tokens": 2})
    assert status == 200
