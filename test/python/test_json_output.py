"""Generation constrained to a JSON object (kiln-run --json-object; the
server's response_format json_object rides on the same generator).

The reference is written here, independently of the C++ recogniser: a
recursive-descent reader that says whether bytes are a whole JSON object, a
prefix of one, or neither, with Python's own UTF-8 decoder for the strings'
bytes. Greedy decoding under the constraint is then checked token by token
against numpy: each generated token must be the argmax of the teacher-forced
logits over exactly the tokens whose bytes keep the text a prefix (text
tokens only: no control or unused ids). Sampled outputs at several seeds
must be prefixes, and whole objects wherever generation stopped on its own.
"""
import codecs
import json

import numpy as np
import pytest
from gguf import GGUFReader

from conftest import run_tool

SEED = 23
MAX_DEPTH = 128  # chat::JsonPrefix::kMaxDepth


class Incomplete(Exception):
    pass


class Invalid(Exception):
    pass


def json_state(data, object_only=True):
    """'whole', 'prefix' or 'invalid' for `data` (bytes)."""
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
    # Text tokens (normal 1, user-defined 4, byte 6) and their bytes; the
    # others are never allowed.
    vocab = {}
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty in (1, 6):
            vocab[i] = bytes(decode[c] for c in t)
        elif ty == 4:
            vocab[i] = t.encode()
    return d, gguf, art, {i: b for i, b in vocab.items() if b}


def kiln_run(art, gguf, *flags):
    proc = run_tool("kiln-run", art, "--weights", gguf, "--json", *flags)
    return json.loads(proc.stdout)


def test_greedy_is_the_argmax_over_the_allowed_tokens(model, tmp_path):
    d, gguf, art, vocab = model
    prompt = [5, 17, 3]
    out = kiln_run(art, gguf, "--prompt-tokens", ",".join(map(str, prompt)),
                   "-n", 40, "--json-object")
    gen = out["tokens"]
    assert gen, out
    logits_file = tmp_path / "l.npy"
    run_tool("kiln-run", art, "--weights", gguf, "--prompt-tokens",
             ",".join(map(str, prompt + gen[:-1])), "-n", 0, "--logits-out",
             logits_file)
    logits = np.load(logits_file)
    text = b""
    narrowed = 0
    for i, token in enumerate(gen):
        row = logits[len(prompt) - 1 + i]
        allowed = [t for t, b in vocab.items()
                   if t < row.size and json_state(text + b) != "invalid"]
        assert allowed, (i, text)
        masked = np.full(row.shape, -np.inf, dtype=np.float32)
        masked[allowed] = row[allowed]
        assert token == int(np.argmax(masked)), (i, text)
        narrowed += int(np.argmax(row)) != token
        text += vocab[token]
    # The constraint decided something: the plain argmax was refused.
    assert narrowed > 0
    state = json_state(text)
    if out["finish_reason"] == "stop":
        assert state == "whole"
        assert isinstance(json.loads(text), dict)
        assert out["text"] == text.decode()
    else:
        assert state == "prefix" and len(gen) == 40


@pytest.mark.parametrize("seed", range(6))
def test_sampled_output_is_a_json_object_or_a_prefix(model, seed):
    d, gguf, art, vocab = model
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
    d, gguf, art, vocab = model
    bare = tmp_path / "bare.kiln"
    run_tool("kiln-compile", gguf, "--target=cpu", "--context", "64",
             "--no-logits", "-o", bare)
    proc = run_tool("kiln-run", bare, "--weights", gguf, "--prompt", "x",
                    "--json-object", check=False)
    assert proc.returncode == 1
    assert "--json-object needs the logits" in proc.stderr
