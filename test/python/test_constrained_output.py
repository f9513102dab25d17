"""Constrained generation: a JSON object (kiln-run --json-object; the
server's response_format json_object) and GLM tool calls (kiln-run
--tool-call; the server's tool_choice "required" or a named function).

The references are written here, independently of the C++ recognisers: a
recursive-descent JSON reader that says whether bytes are a whole JSON
object, a prefix of one, or neither, with Python's own UTF-8 decoder for
the strings' bytes; and a reader of the tool-call markup by literal
matching. Greedy decoding under a constraint is then checked token by token
against numpy: each generated token must be the argmax of the teacher-forced
logits over exactly the tokens whose bytes keep the text a prefix (JSON:
text tokens only; tool calls: control tokens too, and the end-of-reply ids
where a call is whole). Sampled outputs at several seeds must be prefixes,
and whole wherever generation stopped on its own.
"""
import codecs
import json
import re
from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGUFReader

from conftest import run_tool
from json_reference import WHITESPACE_RUN, schema_state, whitespace_runs_ok

SEED = 23
MAX_DEPTH = 128  # chat::JsonPrefix::kMaxDepth


class Incomplete(Exception):
    pass


class Invalid(Exception):
    pass


def json_state(data, object_only=True):
    """'whole', 'prefix' or 'invalid' for `data` (bytes); a reply's runs of
    whitespace outside strings are bounded (json_reference.WHITESPACE_RUN,
    as chat::WhitespaceCap)."""
    if not whitespace_runs_ok(data):
        return "invalid"
    pos = 0

    def peek():
        if pos >= len(data):
            raise Incomplete
        return data[pos]

    def take():
        nonlocal pos
        b = peek()
        pos += 1
        return b

    def spaces():
        nonlocal pos
        while pos < len(data) and data[pos] in b" \t\r\n":
            pos += 1

    def string():
        decoder = codecs.getincrementaldecoder("utf-8")()
        while True:
            b = take()
            if decoder.getstate()[0] and b < 0x80:
                raise Invalid  # a UTF-8 character left unfinished
            if b == ord('"'):
                return
            if b == ord("\\"):
                e = take()
                if e == ord("u"):
                    for _ in range(4):
                        if chr(take()) not in "0123456789abcdefABCDEF":
                            raise Invalid
                elif chr(e) not in '"\\/bfnrt':
                    raise Invalid
                continue
            if b < 0x20:
                raise Invalid
            try:
                decoder.decode(bytes([b]), final=False)
            except UnicodeDecodeError:
                raise Invalid

    def digits(at_least_one):
        n = 0
        while pos < len(data) and ord("0") <= data[pos] <= ord("9"):
            take()
            n += 1
        if at_least_one and n == 0:
            if pos >= len(data):
                raise Incomplete
            raise Invalid

    def number():
        if peek() == ord("-"):
            take()
        first = take()
        if first == ord("0"):
            pass
        elif ord("1") <= first <= ord("9"):
            digits(False)
        else:
            raise Invalid
        if pos >= len(data):
            raise Incomplete  # inside a container, something must end it
        if data[pos] == ord("."):
            take()
            digits(True)
        if pos < len(data) and data[pos] in b"eE":
            take()
            if peek() in b"+-":
                take()
            digits(True)
        if pos >= len(data):
            raise Incomplete

    def value(depth, top):
        spaces()
        b = peek()
        if top and object_only and b != ord("{"):
            raise Invalid
        if b in b"{[":
            if depth >= MAX_DEPTH:
                raise Invalid
            take()
            close = ord("}") if b == ord("{") else ord("]")
            spaces()
            if peek() == close:
                take()
                return
            while True:
                if close == ord("}"):
                    spaces()
                    if take() != ord('"'):
                        raise Invalid
                    string()
                    spaces()
                    if take() != ord(":"):
                        raise Invalid
                value(depth + 1, False)
                spaces()
                c = take()
                if c == close:
                    return
                if c != ord(","):
                    raise Invalid
        elif b == ord('"'):
            take()
            string()
        elif b in b"tfn":
            word = {ord("t"): b"true", ord("f"): b"false",
                    ord("n"): b"null"}[b]
            for w in word:
                if take() != w:
                    raise Invalid
        else:
            number()

    try:
        value(0, True)
        spaces()
        if pos != len(data):
            raise Invalid
        return "whole"
    except Incomplete:
        return "prefix"
    except Invalid:
        return "invalid"


def test_reference_reader():
    """The reference on texts whose answer is known (and json.loads agrees
    on the whole ones)."""
    for text in [b'{}', b' {"a": [1, -2.5e+3, true, null, "\\u00e9"]}\n',
                 '{"é": "€ 😀"}'.encode()]:
        assert json_state(text) == "whole", text
        assert isinstance(json.loads(text), dict)
        for cut in range(len(text)):
            assert json_state(text[:cut]) in ("prefix", "whole"), text[:cut]
    for text in [b'[1]', b'{"a":01}', b'{"a":1,}', b'{}x', b'{"a":"\x01"}',
                 b'{"a":"\xed\xa0\x80"}', b'{"a":"\xc3"}', b'{"a" 1}']:
        assert json_state(text) == "invalid", text


def byte_decoder():
    """GPT-2's byte-level spelling, inverted: character -> byte."""
    printable = (list(range(ord("!"), ord("~") + 1)) +
                 list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100)))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("json")
    gguf = d / "tiny.gguf"
    run_tool("kiln-gguf", "synth", gguf, "--preset", "tiny", "--seed", SEED,
             "--quiet")
    art = d / "tiny.kiln"
    run_tool("kiln-compile", gguf, "--target=cpu", "--context", "64", "-o",
             art)
    r = GGUFReader(gguf)

    def field(key):
        f = r.fields[key]
        return [f.contents(i) for i in range(len(f.data))]
    decode = byte_decoder()
    tokens, types = field("tokenizer.ggml.tokens"), field(
        "tokenizer.ggml.token_type")
    # Text tokens (normal 1, user-defined 4, byte 6) and their bytes, and
    # control tokens (3) and theirs (their text); unused ones never come.
    vocab, control = {}, {}
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty in (1, 6):
            vocab[i] = bytes(decode[c] for c in t)
        elif ty == 4:
            vocab[i] = t.encode()
        elif ty == 3:
            control[i] = t.encode()
    # The end-of-reply ids (Tokenizer::endOfReplyIds): eos, eot, and GLM's
    # turn markers where they are control tokens.
    enders = set()
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"):
        if key in r.fields:
            enders.add(int(r.fields[key].contents()))
    for marker in ("<|endoftext|>", "<|user|>", "<|observation|>"):
        enders |= {i for i, b in control.items() if b == marker.encode()}
    return SimpleNamespace(
        gguf=gguf, art=art, vocab={i: b for i, b in vocab.items() if b},
        control={i: b for i, b in control.items() if b}, enders=enders)


def kiln_run(art, gguf, *flags):
    proc = run_tool("kiln-run", art, "--weights", gguf, "--json", *flags)
    return json.loads(proc.stdout)


def greedy_under(model, tmp_path, flags, n, spellers, state_of,
                 control_ok=None):
    """kiln-run's greedy reply under a constraint (`flags`), each token
    checked against numpy: the argmax of its teacher-forced logits over
    exactly the tokens of `spellers` (id -> bytes) whose bytes keep the text
    not 'invalid' by `state_of` (control tokens among them only where
    `control_ok(text, bytes)` says, if given), and the end-of-reply ids
    where the text is 'whole'. Returns kiln-run's output and the reply's
    bytes."""
    prompt = [5, 17, 3]
    out = kiln_run(model.art, model.gguf, "--prompt-tokens",
                   ",".join(map(str, prompt)), "-n", n, *flags)
    gen = out["tokens"]
    assert gen, out
    logits_file = tmp_path / "l.npy"
    run_tool("kiln-run", model.art, "--weights", model.gguf,
             "--prompt-tokens", ",".join(map(str, prompt + gen[:-1])), "-n",
             0, "--logits-out", logits_file)
    logits = np.load(logits_file)
    text = b""
    narrowed = 0
    for i, token in enumerate(gen):
        row = logits[len(prompt) - 1 + i]
        allowed = [t for t, b in spellers.items()
                   if t < row.size and (control_ok is None or
                                        t not in model.control or
                                        control_ok(text, b))
                   and state_of(text + b) != "invalid"]
        if state_of(text) == "whole":
            allowed += sorted(model.enders)
        assert allowed, (i, text)
        masked = np.full(row.shape, -np.inf, dtype=np.float32)
        masked[allowed] = row[allowed]
        assert token == int(np.argmax(masked)), (i, text)
        narrowed += int(np.argmax(row)) != token
        text += spellers[token]
    # The constraint decided something: the plain argmax was refused.
    assert narrowed > 0
    if out["finish_reason"] == "length":
        assert len(gen) == n
    return out, text


def test_greedy_is_the_argmax_over_the_allowed_tokens(model, tmp_path):
    out, text = greedy_under(model, tmp_path, ["--json-object"], 40,
                             model.vocab, json_state)
    state = json_state(text)
    if out["finish_reason"] == "stop":
        assert state == "whole"
        assert isinstance(json.loads(text), dict)
        assert out["text"] == text.decode()
    else:
        assert state == "prefix"


@pytest.mark.parametrize("seed", range(6))
def test_sampled_output_is_a_json_object_or_a_prefix(model, seed):
    gguf, art, vocab = model.gguf, model.art, model.vocab
    out = kiln_run(art, gguf, "--prompt", "Give me JSON", "-n", 48,
                   "--temperature", "1.5", "--top-k", "40", "--seed", seed,
                   "--json-object")
    text = b"".join(vocab[t] for t in out["tokens"])
    state = json_state(text)
    if out["finish_reason"] == "stop":
        assert state == "whole", text
        assert isinstance(json.loads(text), dict)
    else:
        assert state == "prefix", text
        assert len(out["tokens"]) == 48


def test_json_object_needs_the_logits(model, tmp_path):
    gguf, art, vocab = model.gguf, model.art, model.vocab
    bare = tmp_path / "bare.kiln"
    run_tool("kiln-compile", gguf, "--target=cpu", "--context", "64",
             "--no-logits", "-o", bare)
    proc = run_tool("kiln-run", bare, "--weights", gguf, "--prompt", "x",
                    "--json-object", check=False)
    assert proc.returncode == 1
    assert "--json-object needs the logits" in proc.stderr


# --- Thinking first ---------------------------------------------------------

def think_first(data, answer_state):
    """(state, answering) for `data` under --think-first: whitespace, then
    '<think>' .. '</think>' and whitespace before an answer `answer_state`
    reads, or that answer at once; answering once the bytes are the
    answer's (chat::ThinkFirst's Answer phase)."""
    rest = data.lstrip(b" \t\r\n")
    # Each run of whitespace around the block: at most WHITESPACE_RUN bytes
    # (chat::ThinkFirst, as the JSON replies').
    if len(data) - len(rest) > WHITESPACE_RUN:
        return "invalid", False
    states, answering = [], False
    if rest and b"<think>".startswith(rest[:7]):
        if len(rest) < 7:
            states.append("prefix")  # "<think>" may still come
        else:
            close = rest.find(b"</think>", 7)
            if close < 0:
                states.append("prefix")
            else:
                after = rest[close + 8:].lstrip(b" \t\r\n")
                answering = bool(after)
                if len(rest) - close - 8 - len(after) > WHITESPACE_RUN:
                    states.append("invalid")
                else:
                    states.append(answer_state(after) if after else "prefix")
    if not rest:
        states.append("prefix")
    elif len(rest) >= 7 and rest.startswith(b"<think>"):
        pass  # the block, not an answer
    else:
        direct = answer_state(rest)
        states.append(direct)
        # Past a proper prefix of "<think>", the answer alone is left.
        answering = answering or not b"<think>".startswith(rest[:7])
    if "whole" in states:
        return "whole", answering
    return ("prefix" if "prefix" in states else "invalid"), answering


def test_think_first_reference():
    obj = lambda t: json_state(t)  # noqa: E731
    for data, want in ((b"", ("prefix", False)), (b" <th", ("prefix", False)),
                       (b"<think>a<b", ("prefix", False)),
                       (b"<think>a</think>\n", ("prefix", False)),
                       (b"<think>a</think>\n{", ("prefix", True)),
                       (b"<think></think>{}", ("whole", True)),
                       (b"{}", ("whole", True)), (b"<x", ("invalid", True)),
                       (b"<think>a</think>x", ("invalid", True)),
                       (b" " * 64 + b"{}", ("whole", True)),
                       (b" " * 65, ("invalid", False)),
                       (b"<think>a</think>" + b"\n" * 64, ("prefix", False)),
                       (b"<think>a</think>" + b"\n" * 65, ("invalid", False))):
        assert think_first(data, obj) == want, data


def test_think_first_greedy_is_the_argmax_over_the_allowed_tokens(model,
                                                                  tmp_path):
    """--think-first --json-object: free text in a thinking block (control
    tokens allowed there), then a JSON object (text tokens only)."""
    spellers = {**model.vocab,
                **{i: b for i, b in model.control.items()
                   if i not in model.enders}}
    out, text = greedy_under(
        model, tmp_path, ["--think-first", "--json-object"], 40, spellers,
        lambda t: think_first(t, json_state)[0],
        control_ok=lambda t, b: not think_first(t, json_state)[1])
    assert think_first(text, json_state)[0] in ("prefix", "whole")


# --- Tool calls -------------------------------------------------------------

# GLM's call markers: the only control tokens a forced call may write (a
# special token is never spelled as a name, key or value's text).
MARKERS = {b"<tool_call>", b"</tool_call>", b"<arg_key>", b"</arg_key>",
           b"<arg_value>", b"</arg_value>"}


def marker_ok(state_of):
    """greedy_under's control_ok for a forced call: a control token only as
    a marker, and inside a value only the "</arg_value>" that ends it (a
    newline may follow it then; inside a typed value's string it may not)."""
    def ok(text, b):
        if b not in MARKERS:
            return False
        inside = text.rfind(b"<arg_value>") > text.rfind(b"</arg_value>")
        return not inside or (b == b"</arg_value>" and
                              state_of(text + b + b"\n") != "invalid")
    return ok

# name -> [(parameter, the schema of its JSON value or None: any text,
# required)]; "get": any key, any value.
TOOLS = {"get_weather": [("city", None, False),
                         ("days", {"type": "integer"}, False)],
         "get": [],
         "set": [("level", {"type": "number"}, False),
                 ("on", {"type": "boolean"}, True)]}
TOOL_FLAGS = ["--tool-call", "get_weather=city,days:integer", "--tool-call",
              "get", "--tool-call", "set=level:number,on!:boolean"]


def tool_state(data, tools, several=True, document=None):
    """'whole', 'prefix' or 'invalid' for `data` (bytes) as GLM tool calls
    of `tools` in the GLM template's form: a listed parameter at most once,
    the call closed only once its required ones are written, a JSON value
    (json_reference.schema_state, $refs against `document`) where it has a
    schema, any text up to "</arg_value>" where not; a function without
    parameters takes any keys without '<' or a newline."""
    pos = 0

    def literal(s):
        nonlocal pos
        n = min(len(s), len(data) - pos)
        if data[pos:pos + n] != s[:n]:
            raise Invalid
        if n < len(s):
            raise Incomplete
        pos += len(s)

    def one_of(options):
        nonlocal pos
        rest = data[pos:]
        alive = [o for o in options if o[:len(rest)] == rest[:len(o)]]
        whole = [o for o in alive if rest.startswith(o)]
        if whole:
            pos += len(whole[0])
            return whole[0]
        if alive:
            raise Incomplete
        raise Invalid

    def spaces():
        # Before and between calls: at most WHITESPACE_RUN bytes in a row.
        nonlocal pos
        start = pos
        while pos < len(data) and data[pos] in b" \t\r\n":
            pos += 1
        if pos - start > WHITESPACE_RUN:
            raise Invalid

    def json_value(schema):
        """A value ends at the first '<' its schema does not take, once
        it is whole."""
        nonlocal pos
        q = pos
        while True:
            q = data.find(b"<", q)
            if q < 0:
                if schema_state(data[pos:], schema, document,
                                capped=False) == "invalid":
                    raise Invalid
                raise Incomplete
            if schema_state(data[pos:q + 1], schema, document,
                            capped=False) != "invalid":
                q += 1  # inside a string
                continue
            if schema_state(data[pos:q], schema, document,
                            capped=False) != "whole":
                raise Invalid
            pos = q
            return

    try:
        spaces()
        while True:
            literal(b"<tool_call>")
            name = one_of([n.encode() + b"\n" for n in tools])[:-1].decode()
            params = tools[name]
            seen = set()
            while True:
                more = not params or len(seen) < len(params)
                done = all(p in seen for p, _, must in params if must)
                choice = one_of([c for c, ok in ((b"<arg_key>", more),
                                                 (b"</tool_call>", done))
                                 if ok])
                if choice == b"</tool_call>":
                    break
                schema = None
                if params:
                    key = one_of([p.encode() + b"</arg_key>\n<arg_value>"
                                  for p, _, _ in params if p not in seen])
                    key = key.split(b"<")[0].decode()
                    seen.add(key)
                    schema = {p: v for p, v, _ in params}[key]
                else:
                    end = data.find(b"<", pos)
                    if b"\n" in data[pos:end if end >= 0 else len(data)]:
                        raise Invalid
                    if end < 0:
                        raise Incomplete
                    pos = end
                    literal(b"</arg_key>\n<arg_value>")
                if schema is not None:
                    json_value(schema)
                    literal(b"</arg_value>\n")
                    continue
                end = data.find(b"</arg_value>", pos)
                if end < 0:
                    raise Incomplete  # a value is any bytes up to its end
                pos = end + len(b"</arg_value>")
                literal(b"\n")
            spaces()
            if pos == len(data):
                return "whole"
            if not several:
                raise Invalid
    except Incomplete:
        return "prefix"
    except Invalid:
        return "invalid"


def test_tool_call_reference_reader():
    call = (b"<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>"
            b"P </arg_value\n<b></arg_value>\n</tool_call>")
    assert tool_state(b"\n" + call, TOOLS) == "whole"
    assert tool_state(call + b"\n" + call, TOOLS) == "whole"
    assert tool_state(call + b"\n" + call, TOOLS, several=False) == "invalid"
    for cut in range(len(call)):
        assert tool_state(call[:cut], TOOLS) == "prefix", call[:cut]
    typed = (b"<tool_call>set\n<arg_key>level</arg_key>\n<arg_value>-1.5e3"
             b"</arg_value>\n<arg_key>on</arg_key>\n<arg_value> true\n"
             b"</arg_value>\n</tool_call>")
    assert tool_state(typed, TOOLS) == "whole"
    for cut in range(len(typed)):
        assert tool_state(typed[:cut], TOOLS) == "prefix", typed[:cut]
    days = b"<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>"
    on = b"<tool_call>set\n<arg_key>on</arg_key>\n<arg_value>true" \
         b"</arg_value>\n"
    for bad in (b"x<tool_call>", b"<tool_call>get_wether", b"<tool_call>get\n"
                b"<arg_key>a\n", b"<tool_call>get_weather\n<arg_key>town",
                call + b"x", days + b"2.", days + b"<", days + b"01",
                typed.replace(b"true", b"tru<"),
                b"<tool_call>set\n</tool_call>",  # "on" is required
                on + b"<arg_key>o"):  # "on" a second time
        assert tool_state(bad, TOOLS) == "invalid", bad
    # A value with a schema: '<' inside its strings, the end at the first
    # '<' it does not take.
    place = {"type": "object", "properties": {"at": {"$ref": "#/$defs/p"}},
             "required": ["at"], "additionalProperties": False}
    doc = {"$defs": {"p": {"type": "string", "maxLength": 3}}}
    tools = {"go": [("where", place, True)]}
    head = b"<tool_call>go\n<arg_key>where</arg_key>\n<arg_value>"
    good = head + b'{"at": "<a>"}</arg_value>\n</tool_call>'
    assert tool_state(good, tools, document=doc) == "whole"
    for cut in range(len(good)):
        assert tool_state(good[:cut], tools, document=doc) == "prefix"
    for bad in (head + b'{"at": "<ab>"}', head + b'{"at": 1}',
                head + b'{}<', head + b'{"at": "x"}</arg_value>\n</x'):
        assert tool_state(bad, tools, document=doc) == "invalid", bad


def test_tool_call_greedy_is_the_argmax_over_the_allowed_tokens(model,
                                                                tmp_path):
    spellers = {**model.vocab,
                **{i: b for i, b in model.control.items()
                   if i not in model.enders}}
    out, text = greedy_under(model, tmp_path, TOOL_FLAGS, 48, spellers,
                             lambda t: tool_state(t, TOOLS),
                             control_ok=marker_ok(
                                 lambda t: tool_state(t, TOOLS)))
    assert tool_state(text, TOOLS) in ("prefix", "whole")


PLACE = {"type": "object",
         "properties": {
             "where": {"type": "object",
                       "properties": {"lat": {"type": "number"},
                                      "tag": {"$ref": "#/$defs/tag"}},
                       "required": ["lat"], "additionalProperties": False},
             "note": {"type": "string"}},
         "required": ["where"],
         "$defs": {"tag": {"enum": ["a", "b"]}}}
PLACE_TOOLS = {"go": [("where", PLACE["properties"]["where"], True),
                      ("note", None, False)]}


def test_tool_call_values_keep_the_schema(model, tmp_path):
    """--tool-call NAME=@FILE: the parameters' schema from a file, the
    object value held to it (the reference reads it with
    json_reference.schema_state); greedy, against numpy."""
    path = tmp_path / "params.json"
    path.write_text(json.dumps(PLACE))
    spellers = {**model.vocab,
                **{i: b for i, b in model.control.items()
                   if i not in model.enders}}
    out, text = greedy_under(
        model, tmp_path, ["--tool-call", f"go=@{path}"], 60, spellers,
        lambda t: tool_state(t, PLACE_TOOLS, document=PLACE),
        control_ok=marker_ok(
            lambda t: tool_state(t, PLACE_TOOLS, document=PLACE)))
    assert tool_state(text, PLACE_TOOLS, document=PLACE) in ("prefix",
                                                             "whole")
    # Sampled replies (seeds 0-7): calls or prefixes by the reference, and
    # at least one gets to a key of the object value, where the schema
    # decides.
    inside = 0
    for seed in range(8):
        out = kiln_run(model.art, model.gguf, "--prompt", "Call", "-n", 60,
                       "--temperature", "1.2", "--top-k", "50", "--seed",
                       seed, "--tool-call", f"go=@{path}")
        text = b"".join(spellers.get(t, model.control.get(t, b""))
                        for t in out["tokens"])
        assert tool_state(text, PLACE_TOOLS, document=PLACE) in (
            "prefix", "whole"), (seed, text)
        inside += b'"lat"' in text or b'"tag"' in text
    assert inside > 0


@pytest.mark.parametrize("seed", range(4))
def test_sampled_tool_calls_are_calls_or_prefixes(model, seed):
    gguf, art = model.gguf, model.art
    spellers = {**model.vocab, **model.control}
    out = kiln_run(art, gguf, "--prompt", "Call a tool", "-n", 52,
                   "--temperature", "1.2", "--top-k", "50", "--seed", seed,
                   *TOOL_FLAGS)
    text = b"".join(spellers[t] for t in out["tokens"])
    state = tool_state(text, TOOLS)
    assert state in ("prefix", "whole"), text
    if out["finish_reason"] == "stop":
        assert state == "whole", text
    assert all(model.control[t] in MARKERS for t in out["tokens"]
               if t in model.control), text


def test_tool_call_flag_errors(model):
    gguf, art = model.gguf, model.art
    for flags, says in ((["--tool-call", "a<b"], "--tool-call: expected"),
                        (["--tool-call", "f=x,"], "--tool-call: expected"),
                        (["--tool-call", "f=x:text"], "--tool-call: expected"),
                        # Read back trimmed, so not the name it was.
                        (["--tool-call", "f "], "--tool-call: expected"),
                        (["--tool-call", "f= x"], "--tool-call: expected"),
                        (["--tool-call", "f", "--json-object"],
                         "exclude each other")):
        proc = run_tool("kiln-run", art, "--weights", gguf, "--prompt", "x",
                        *flags, check=False)
        assert proc.returncode == 2, flags
        assert says in proc.stderr, (flags, proc.stderr)
