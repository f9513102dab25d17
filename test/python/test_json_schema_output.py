"""Replies constrained by a JSON Schema (kiln-run --json-schema; the
server's response_format json_schema is checked in test_serve.py).

The reference is json_reference.schema_state, written independently of
chat::SchemaPrefix (see there what it reads). Greedy replies
are checked token by token against numpy (the argmax over exactly the
tokens the reference allows), and every whole reply is validated by the
`jsonschema` package, a third, independent reader.
"""
import json

import jsonschema
import pytest

from conftest import run_tool
from json_reference import schema_state
from test_constrained_output import greedy_under, kiln_run, model  # noqa: F401

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 6},
        "age": {"type": "integer", "minimum": -4, "exclusiveMaximum": 121},
        "tags": {"type": "array", "items": {"enum": ["a", "ab", 1, 12, None]},
                 "maxItems": 3},
        "pet": {"anyOf": [{"$ref": "#/$defs/pet"}, {"type": "null"}]},
        "code": {"type": "string", "pattern": "^[A-Z]{2}(-[0-9]+)?$"},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
    "$defs": {"pet": {"type": "object",
                      "properties": {"kind": {"enum": ["cat", "dog"]},
                                     "legs": {"type": "number"}},
                      "required": ["kind"], "additionalProperties": False}},
}
PATTERNS = {"type": "object",
            "properties": {"id": {"type": "string",
                                  "pattern": "^[a-z]+_[0-9]{2}$"},
                           "tag": {"type": "string", "pattern": "x|yz"}},
            "required": ["id"], "additionalProperties": False}
ANY_KEYS = {"type": "object", "properties": {"id": {"const": 7}},
            "required": ["id"]}
LIST = {"type": "array", "items": {"type": ["boolean", "string"]},
        "minItems": 1, "maxItems": 4}
# Numbers held to bounds: a probability, an open interval whose ends are
# not short decimals, a one-sided bound of 17 significant digits.
MEASURES = {"type": "object",
            "properties": {"p": {"type": "number", "minimum": 0,
                                 "maximum": 1},
                           "t": {"type": ["number", "null"],
                                 "exclusiveMinimum": -273.15,
                                 "exclusiveMaximum": 1e3},
                           "x": {"type": "number",
                                 "minimum": 0.30000000000000004}},
            "required": ["p", "t", "x"], "additionalProperties": False}
# Whole multiples: an integer and a number, one of them bounded.
MULTIPLES = {"type": "array",
             "items": {"anyOf": [{"type": "integer", "multipleOf": 5,
                                  "minimum": -12, "maximum": 40},
                                 {"type": "number", "multipleOf": 3}]},
             "minItems": 2, "maxItems": 4}


def test_reference_reader():
    cases = [
        (PERSON, b'{"name":"Al","age":3}', "whole"),
        (PERSON, b' { "age" : -1 , "name" : "x" } ', "whole"),
        (PERSON, b'{"name":"Al","age":3,"pet":{"kind":"cat"}}', "whole"),
        (PERSON, b'{"name":"Al","age":3,"pet":null,"tags":[12,"a"]}',
         "whole"),
        (PERSON, b'{"name":"Al"', "prefix"),
        (PERSON, b'{"na', "prefix"),
        (PERSON, b'{"nx', "invalid"),
        (PERSON, b'{"name":"Al"}', "invalid"),
        (PERSON, b'{"age":1.5}', "invalid"),
        (PERSON, b'{"age":12', "prefix"),
        (PERSON, b'{"age":121', "invalid"),
        (PERSON, b'{"age":-5', "invalid"),
        (PERSON, b'{"age":-0', "prefix"),
        (PERSON, b'{"age":-', "prefix"),
        (PERSON, b'{"age":1000', "invalid"),
        ({"type": "integer", "minimum": 18}, b"1", "prefix"),
        ({"type": "integer", "minimum": 18, "maximum": 99}, b"17", "invalid"),
        ({"type": "integer", "maximum": 0, "exclusiveMaximum": True}, b"-0",
         "invalid"),
        (PERSON, b'{"code":"AB-12"}', "invalid"),  # name and age required
        (PERSON, b'{"age":1,"name":"x","code":"AB-1', "prefix"),
        (PERSON, b'{"age":1,"name":"x","code":"AB-"', "invalid"),
        (PERSON, b'{"age":1,"name":"x","code":"A1', "invalid"),
        (PERSON, b'{"age":1,"name":"x","code":"AB\\u002d7"}', "whole"),
        (PERSON, b'{"age":1,"name":"x","code":"AB\xe2', "invalid"),
        (PATTERNS, b'{"id":"ab_12","tag":"..x.."}', "whole"),
        (PATTERNS, b'{"id":"ab_1"}', "invalid"),
        (PATTERNS, b'{"id":"ab_12","tag":"y"}', "invalid"),
        (PATTERNS, b'{"id":"ab_12","tag":"\xc3\xa9y', "prefix"),
        (PERSON, b'{"age":1,"age":2}', "invalid"),
        (PERSON, b'{"name":"abcdefg"', "invalid"),
        (PERSON, b'{"name":"\\ud83d', "invalid"),
        (PERSON, b'{"age":1,"tags":[1', "prefix"),
        (PERSON, b'{"age":1,"tags":[123', "invalid"),
        (PERSON, b'{"age":1,"pet":{"kind":"cow"', "invalid"),
        (ANY_KEYS, b'{"id":7,"x":[1,{}],"idx":0}', "whole"),
        (ANY_KEYS, b'{"id":7,"id":7}', "invalid"),
        (ANY_KEYS, b'{"x":1}', "invalid"),
        (LIST, b'["a",true]', "whole"),
        (LIST, b'[]', "invalid"),
        (LIST, b'[1]', "invalid"),
        (LIST, b'[true,true,true,true,', "invalid"),
        (MEASURES, b'{"p":0.5,"t":null,"x":0.31}', "whole"),
        (MEASURES, b'{"p":1.0,"t":-273.14,"x":0.300000000000001}', "whole"),
        (MEASURES, b'{"p":1.5', "invalid"),
        (MEASURES, b'{"p":1.', "prefix"),
        (MEASURES, b'{"p":1.0', "prefix"),
        (MEASURES, b'{"p":1.01', "invalid"),
        (MEASURES, b'{"p":2', "invalid"),
        (MEASURES, b'{"p":1e0', "invalid"),
        (MEASURES, b'{"p":-0', "prefix"),
        (MEASURES, b'{"p":-0.', "prefix"),
        (MEASURES, b'{"p":-0.0000000000000001', "invalid"),
        (MEASURES, b'{"p":0.0000000000000001', "invalid"),
        (MEASURES, b'{"p":0,"t":-273.15', "invalid"),
        (MEASURES, b'{"p":0,"t":-273.15}', "invalid"),
        (MEASURES, b'{"p":0,"t":-273.150000000001', "invalid"),
        (MEASURES, b'{"p":0,"t":-273.14999999999', "prefix"),
        (MEASURES, b'{"p":0,"t":999.999999999999', "prefix"),
        (MEASURES, b'{"p":0,"t":1000', "invalid"),
        (MEASURES, b'{"p":0,"t":0,"x":0.3', "prefix"),
        (MEASURES, b'{"p":0,"t":0,"x":0.3}', "invalid"),
        (MEASURES, b'{"p":0,"t":0,"x":1234567890123456', "invalid"),
        (MULTIPLES, b'[-10,35]', "whole"),
        (MULTIPLES, b'[9.0,3,-0]', "whole"),
        (MULTIPLES, b'[41', "prefix"),       # 411 is a multiple of 3
        (MULTIPLES, b'[41.5', "invalid"),
        (MULTIPLES, b'[41,', "invalid"),
        (MULTIPLES, b'[4', "prefix"),       # 40, 42, ...
        (MULTIPLES, b'[4.5', "invalid"),
        (MULTIPLES, b'[7,', "invalid"),
        (MULTIPLES, b'[6.00', "prefix"),
        (MULTIPLES, b'[1e1', "invalid"),
        (MULTIPLES, b'[-15', "prefix"),      # -15 is a multiple of 3
        (MULTIPLES, b'[-16', "prefix"),      # -162, ...
        ({"type": "integer", "multipleOf": 7}, b"9999999999999999999",
         "invalid"),                          # 18 digits at most
        ({"type": "number"}, b"12", "whole"),
        ({"type": "number"}, b"12.", "prefix"),
        ({"enum": [1, 12]}, b"1", "whole"),
    ]
    for schema, data, want in cases:
        assert schema_state(data, schema) == want, (schema, data)
        if want == "whole":
            jsonschema.validate(json.loads(data), schema)


def write_schema(tmp_path, schema):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    return str(path)


@pytest.mark.parametrize("schema", [PERSON, ANY_KEYS, LIST, PATTERNS,
                                    MEASURES, MULTIPLES],
                         ids=["person", "any-keys", "list", "patterns",
                              "measures", "multiples"])
def test_greedy_is_the_argmax_over_the_allowed_tokens(model, tmp_path,
                                                      schema):
    path = write_schema(tmp_path, schema)
    out, text = greedy_under(model, tmp_path, ["--json-schema", path], 40,
                             model.vocab,
                             lambda t: schema_state(t, schema))
    state = schema_state(text, schema)
    if out["finish_reason"] == "stop":
        assert state == "whole", text
        jsonschema.validate(json.loads(text), schema)
        assert out["text"] == text.decode()
    else:
        assert state in ("prefix", "whole"), text


@pytest.mark.parametrize("seed", range(8))
def test_sampled_replies_validate(model, tmp_path, seed):
    """Sampled replies (the seed printed by pytest's id): whole ones
    validate with jsonschema, the others are prefixes by the reference."""
    for schema in (PERSON, LIST, PATTERNS, MEASURES, MULTIPLES):
        path = write_schema(tmp_path, schema)
        out = kiln_run(model.art, model.gguf, "--prompt", "JSON", "-n",
                       50, "--temperature", "1.2", "--top-k", "20", "--seed",
                       seed, "--json-schema", path)
        text = b"".join(model.vocab[t] for t in out["tokens"])
        state = schema_state(text, schema)
        if out["finish_reason"] == "stop":
            assert state == "whole", text
            jsonschema.validate(json.loads(text), schema)
        else:
            assert state in ("prefix", "whole"), text
            assert len(out["tokens"]) == 50


def test_json_schema_flag_errors(model, tmp_path):
    def run(*flags):
        proc = run_tool("kiln-run", model.art, "--weights", model.gguf,
                        "--prompt", "x", *flags, check=False)
        return proc.returncode, proc.stderr

    bad = write_schema(tmp_path, {"type": "object", "properties": {
        "n": {"type": "integer", "oneOf": [{"const": 3}]}}})
    rc, err = run("--json-schema", bad)
    assert rc == 1
    assert f"{bad}: #/properties/n/oneOf: keyword 'oneOf' is " \
           "not supported" in err
    rc, err = run("--json-schema", str(tmp_path / "missing.json"))
    assert rc == 1 and "missing.json: --json-schema: cannot read" in err
    broken = tmp_path / "broken.json"
    broken.write_text('{"type": ')
    rc, err = run("--json-schema", str(broken))
    assert rc == 1 and "broken.json" in err
    rc, err = run("--json-schema", bad, "--json-object")
    assert rc == 2 and "exclude each other" in err
