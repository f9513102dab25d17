"""kiln-tokenize checked against HuggingFace `tokenizers` as the reference.

A byte-level BPE is trained with `tokenizers` using GLM's exact split pattern,
written into a GGUF with gguf-py, and Kiln's encode/decode are compared with
the reference on text chosen to hit every alternative of the pattern and
every class of character, then the pre-tokenizer alone is compared on every
assigned code point, and BPE on random merge tables (seeded; merges in any
order, two merges making one token, characters cut inside). The tokenizer
Kiln's own synthesiser writes is checked too. What is not checked here: chat
templates (test_chat_template.py), and code points unassigned in the Unicode
version of Kiln's tables (see docs/tokenizer.md: `tokenizers` may know a
newer Unicode).
"""
import json
import random
import subprocess

import pytest
from gguf import GGUFReader, GGUFWriter

from conftest import run_tool, tool

tokenizers = pytest.importorskip("tokenizers")
# The Unicode data Kiln's tables are generated from (utils/setup.sh pins it
# to the version `tokenizers`' regex engine knows).
import unicodedata2 as unicodedata  # noqa: E402
from tokenizers import (Regex, Tokenizer, decoders, models,  # noqa: E402
                        pre_tokenizers, trainers)

# GLM5.md section 3 / GLM's tokenizer.json, character for character.
GLM4_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
                r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|"
                r"\s+")
SPECIALS = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
            "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
            "<think>", "</think>",
            # Starts with another special: the longest match must win.
            "[gMASK]<sop>"]
# A non-special added token: matched even with --no-special (UserDefined).
USER_DEFINED = "<kiln_user_defined>"
SEED = 20240611  # fixed so that failures reproduce
VOCAB = 3000

WORDS = ("the compiler reads weights of a model and turns each step into "
         "kernels that run on graphics processors memory speed layer expert "
         "token prompt answer question value number test fail pass order "
         "because although however language Mixture Experts Attention "
         "Tokenizer").split()
CJK = ["模型的权重", "编译器", "你好世界", "今日は良い天気ですね", "カタカナ",
       "한국어 문장입니다", "中文，标点。", "数据集"]
OTHER_SCRIPTS = ["Привет мир", "Καλημέρα κόσμε", "مرحبا بالعالم",
                 "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "Ünïcödé façade"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇯🇵", "🧑🏿‍💻", "✨"]
CODE = ['def f(x):\n    return x ** 2  # square\n',
        'for (int i = 0; i < n; ++i) { sum += a[i]; }\n',
        'if (a != b && c >= d) {\n\tprintf("%d\\n", a);\n}\n',
        '{"key": [1, 2, 3], "nested": {"x": null}}',
        '<div class="a">text</div>\r\n']


def sentence(rng):
    """One random line mixing the kinds of text the corpus needs."""
    parts = []
    for _ in range(rng.randint(3, 12)):
        kind = rng.random()
        if kind < 0.45:
            w = rng.choice(WORDS)
            parts.append(w.upper() if rng.random() < 0.1 else
                         w.capitalize() if rng.random() < 0.2 else w)
        elif kind < 0.55:
            parts.append(rng.choice(CJK))
        elif kind < 0.62:
            parts.append(rng.choice(OTHER_SCRIPTS))
        elif kind < 0.68:
            parts.append(rng.choice(EMOJI))
        elif kind < 0.76:
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 12))))
        elif kind < 0.82:
            parts.append(rng.choice(["don't", "it's", "we'll", "I'm", "you're",
                                     "they've", "he'd", "IT'S", "We'Ll"]))
        elif kind < 0.90:
            parts.append(rng.choice([",", ".", "!!", "?", "...", ";", ":",
                                     "--", "()", "\"quoted\""]))
        else:
            parts.append(rng.choice(CODE))
    seps = [" ", " ", " ", "  ", "\t", "\n", "\r\n", ""]
    return "".join(p + rng.choice(seps) for p in parts)


def training_corpus():
    rng = random.Random(SEED)
    return [sentence(rng) for _ in range(3000)]


# Named samples: each aims at one part of the pattern or of BPE.
SAMPLES = {
    "ascii": "The quick brown fox jumps over the lazy dog.",
    "words_and_caps": "Compiler COMPILER compiler CoMpIlEr",
    "cjk": "编译器读取模型的权重。今日は良い天気ですね。한국어 문장입니다",
    "mixed_scripts": "Привет, мир! Καλημέρα. مرحبا. שלום. नमस्ते. สวัสดี",
    "combining_marks": "e\u0301te\u0301 n\u0303 a\u0308\u0308 क्षि",
    "emoji": "Hi 😀! 👍🏽👍🏽 ✨✨✨",
    "emoji_zwj": "family: 👨‍👩‍👧‍👦, flag 🏳️‍🌈, coder 🧑🏿‍💻, 🇯🇵🇫🇷",
    "spaces": "a  b   c    d     e",
    "trailing_spaces": "line with trailing spaces   ",
    "leading_spaces": "   leading spaces",
    "tabs": "a\tb\t\tc\t\t\td \t x",
    "newlines": "one\ntwo\n\nthree\n\n\n\nfour\n",
    "crlf": "dos\r\nline\r\n\r\nend\r\n",
    "space_newline_mix": "a \n b  \n\n  c \t\n\t d   \r\n   e",
    "only_whitespace": " \t\n \r\n  ",
    "unicode_spaces": "a\u00a0b\u3000c\u2028d\u2029e\u2003f\u0085g\u000bh\u000ci",
    "not_spaces": "a\u001cb\u001fc\u180ed\u200be\ufeff",
    "digits": "1 12 123 1234 12345 123456 1234567 12345678901234567890",
    "decimals": "3.14159 1,000,000 -42 +7 1e10 0x1F 2024-06-11",
    "other_numbers": "٣٤٥٦ ²³ ⅫⅣ ½¾ ０１２３４ 𝟙𝟚𝟛",
    "contractions": "don't it's we'll I'm you're they've he'd",
    "contractions_case": "DON'T It'S WE'LL I'M YOU'RE THEY'VE HE'D We'Ll "
                         "you'rE They'vE",
    "contraction_edges": "'s 's' ''s 'sa 'Re 'x rock'n'roll ' 'ſ x'ſx "
                         "'ll'll",
    "code_python": CODE[0] + CODE[2],
    "code_c": CODE[1] + "x+=1;y-->0?z:w;",
    "json": CODE[3],
    "punctuation_runs": "!!! ??? ... --- ... ,,, ;;; ((( ))) «» —— ->==> "
                        "\"'\" !\n\n?\r\n",
    "punct_then_newlines": "end.\n\n\nnext!\r\n\r\nok",
    "space_before_punct": "a !b ?  !c",
    "special_embedded": "[gMASK]<sop><|system|>\nYou are helpful.<|user|>\n"
                        "Hi there<|assistant|>\n<think>ok</think>Hello!"
                        "<|endoftext|>",
    "special_adjacent": "<|user|><|user|>[gMASK][gMASK]x<sop>",
    "special_partial": "<|user <|user| |user|> [gMAS <sop <|",
    "special_in_word": "abc<|user|>def 12<sop>34",
    "user_defined": "before" + USER_DEFINED + "after " + USER_DEFINED,
    "long_word": "a" * 300 + " " + "ab" * 200,
    "long_whitespace": " " * 500 + "x" + "\n" * 300 + "\t" * 100,
    "empty": "",
    "single_char": "x",
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The reference tokenizer and the GGUF holding the same vocabulary."""
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GLM4_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator(training_corpus(), trainer=trainer)
    hf.add_tokens([USER_DEFINED])
    folder = tmp_path_factory.mktemp("tokenizer")
    hf.save(str(folder / "tokenizer.json"))

    saved = json.loads((folder / "tokenizer.json").read_text())
    vocab = saved["model"]["vocab"]
    merges = [m if isinstance(m, str) else " ".join(m)
              for m in saved["model"]["merges"]]
    added = {t["content"]: t for t in saved["added_tokens"]}
    size = hf.get_vocab_size(with_added_tokens=True)
    tokens = [None] * size
    for text, i in vocab.items():
        tokens[i] = text
    for text, t in added.items():
        tokens[t["id"]] = text
    assert None not in tokens
    # llama.cpp's token types: 1 normal, 3 control, 4 user-defined.
    types = [1] * size
    for text, t in added.items():
        types[t["id"]] = 3 if t["special"] else 4
    path = folder / "ref.gguf"
    write_tokenizer_gguf(path, tokens, types, merges,
                         eos=hf.token_to_id("<|endoftext|>"),
                         bos=hf.token_to_id("[gMASK]"))
    return hf, path


def write_tokenizer_gguf(path, tokens, types, merges, pre="glm4",
                         model="gpt2", eos=None, bos=None):
    w = GGUFWriter(str(path), arch="glm-dsa")
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    if types is not None:
        w.add_token_types(types)
    w.add_token_merges(merges)
    if eos is not None:
        w.add_eos_token_id(eos)
    if bos is not None:
        w.add_bos_token_id(bos)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def kiln(path, mode, data, *flags, check=True):
    """Runs kiln-tokenize with raw bytes on stdin; returns the process."""
    proc = subprocess.run([str(tool("kiln-tokenize")), str(path), mode,
                           *flags], input=data, capture_output=True)
    if check:
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return proc


def kiln_encode(path, text, special=True):
    data = text.encode() if isinstance(text, str) else text
    out = kiln(path, "encode", data, *([] if special else ["--no-special"]))
    line = out.stdout.decode().strip()
    return [int(x) for x in line.split(",")] if line else []


def kiln_decode(path, ids):
    return kiln(path, "decode", ",".join(map(str, ids)).encode()).stdout


def hf_encode(hf, text, special=True):
    hf.encode_special_tokens = not special
    try:
        return hf.encode(text, add_special_tokens=False).ids
    finally:
        hf.encode_special_tokens = False


def show(hf, ids):
    return [hf.id_to_token(i) for i in ids]


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_encode_matches_tokenizers(reference, name):
    hf, path = reference
    text = SAMPLES[name]
    expected = hf_encode(hf, text)
    got = kiln_encode(path, text)
    assert got == expected, (show(hf, got), show(hf, expected))


@pytest.mark.parametrize("name", ["special_embedded", "special_adjacent",
                                  "special_in_word", "user_defined"])
def test_encode_without_special_matches_tokenizers(reference, name):
    hf, path = reference
    text = SAMPLES[name]
    expected = hf_encode(hf, text, special=False)
    got = kiln_encode(path, text, special=False)
    assert got == expected, (show(hf, got), show(hf, expected))
    # Without special parsing no control token may appear.
    controls = {hf.token_to_id(s) for s in SPECIALS}
    assert not controls & set(got)


def test_encode_random_text_matches_tokenizers(reference):
    """Lines the tokenizer was not trained on, one encode call each."""
    hf, path = reference
    rng = random.Random(SEED + 1)
    for _ in range(40):
        text = sentence(rng)
        assert kiln_encode(path, text) == hf_encode(hf, text), repr(text)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_decode_matches_tokenizers_and_round_trips(reference, name):
    hf, path = reference
    text = SAMPLES[name]
    ids = hf_encode(hf, text)
    got = kiln_decode(path, ids)
    assert got == text.encode()
    assert got.decode() == hf.decode(ids, skip_special_tokens=False)


def test_decode_of_random_ids_matches_tokenizers(reference):
    """Random id sequences cut UTF-8 sequences anywhere: Kiln returns the raw
    bytes, `tokenizers` replaces what is not UTF-8 with U+FFFD."""
    hf, path = reference
    rng = random.Random(SEED + 2)
    size = hf.get_vocab_size(with_added_tokens=True)
    for _ in range(30):
        ids = [rng.randrange(size) for _ in range(rng.randint(1, 40))]
        got = kiln_decode(path, ids)
        assert got.decode(errors="replace") == hf.decode(
            ids, skip_special_tokens=False), ids


def test_invalid_utf8_round_trips(reference):
    """Invalid bytes are kept, each a character of no class (docs)."""
    hf, path = reference
    data = (b"ok \xff\xfe bad \xc3( lone \x80 cut \xe4\xb8 tail \xf0\x9f\x98"
            b" ovl \xc0\xaf sur \xed\xa0\x80 end")
    ids = kiln_encode(path, data)
    assert kiln_decode(path, ids) == data
    # The valid text around them encodes as it would alone.
    head, tail = hf_encode(hf, "ok"), hf_encode(hf, " end")
    assert ids[:len(head)] == head and ids[-len(tail):] == tail
    # Invalid bytes split like punctuation: a run of them takes a leading
    # space; a letter after one does not join it.
    pieces = kiln(path, "split", b"ok \xff\xfe bad\xc3(x\xe4\xb8 tail")
    assert pieces.stdout.decode().strip() == "2,3,4,2,1,2,5"


def test_split_matches_tokenizers_on_every_code_point(reference):
    """The pre-tokenizer alone, on every code point that the committed
    tables' Unicode version (unicodedata2's) assigns, each in contexts
    that tell its class apart: after a letter, next to digits and
    punctuation, doubled after a space, after a word's apostrophe (the
    case-insensitive contractions: "x'ſ" is "x", "'ſ"), before a letter and
    a newline. Code points assigned only in a later Unicode are left out:
    `tokenizers` may know them (docs/tokenizer.md)."""
    hf, path = reference
    info = kiln(path, "info", b"").stdout.decode().splitlines()
    tables = dict(line.split(" ", 1) for line in info)["unicode"]
    assert tables == unicodedata.unidata_version, (
        "the committed tables are not from the pinned unicodedata2: "
        "regenerate them (runtime/tokenizer/gen_unicode_tables.py)")
    split = pre_tokenizers.Split(Regex(GLM4_PATTERN), behavior="isolated")
    points = [cp for cp in range(0x110000)
              if not 0xD800 <= cp <= 0xDFFF
              and unicodedata.category(chr(cp)) != "Cn"]
    text = "".join(f"x{c}1{c}!{c} {c}{c}x'{c}\u4e00\n"
                   for c in map(chr, points))
    expected = [len(p.encode()) for p, _ in split.pre_tokenize_str(text)]
    out = kiln(path, "split", text.encode()).stdout.decode().strip()
    got = [int(x) for x in out.split(",")]
    if got != expected:
        at = next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)
        offset = sum(expected[:at])
        context = text.encode()[max(0, offset - 20):offset + 20]
        pytest.fail(f"pieces differ at byte {offset}: "
                    f"{context.decode(errors='replace')!r} (Kiln's tables: "
                    f"Unicode {tables}; code points from unicodedata2's "
                    f"{unicodedata.unidata_version})")


@pytest.fixture(scope="module")
def synth_gguf(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "tiny.gguf"
    run_tool("kiln-gguf", "synth", out, "--preset", "tiny", "--quiet",
             "--metadata-only")
    return out


def test_synth_tokenizer_round_trips(synth_gguf):
    info = kiln(synth_gguf, "info", b"").stdout.decode().splitlines()
    facts = dict(line.split(" ", 1) for line in info)
    assert facts["pre"] == "glm4"
    for name in sorted(SAMPLES):
        text = SAMPLES[name]
        ids = kiln_encode(synth_gguf, text)
        assert kiln_decode(synth_gguf, ids) == text.encode(), name
    # The synthesiser writes [gMASK] as BOS and <|user|> as end of turn.
    ids = kiln_encode(synth_gguf, "[gMASK]<sop><|user|>\nhi")
    assert ids[0] == int(facts["bos"])
    assert ids[2] == int(facts["eot"])


def test_synth_tokenizer_matches_tokenizers(synth_gguf):
    """The synthesiser's vocabulary loaded into `tokenizers` gives the same
    ids: a second vocabulary, learned by another trainer."""
    r = GGUFReader(synth_gguf)

    def field(key):
        f = r.fields[key]
        return [f.contents(i) for i in range(len(f.data))]
    tokens = field("tokenizer.ggml.tokens")
    types = field("tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ")) for m in field("tokenizer.ggml.merges")]
    hf = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                              merges=merges))
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GLM4_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([t for t, ty in zip(tokens, types) if ty == 3])
    for name in sorted(SAMPLES):
        text = SAMPLES[name]
        if USER_DEFINED in text:
            continue  # a token of the trained vocabulary only
        assert kiln_encode(synth_gguf, text) == hf_encode(hf, text), name


def test_cli_errors(reference, tmp_path):
    hf, path = reference
    size = hf.get_vocab_size(with_added_tokens=True)
    proc = kiln(path, "decode", f"1,{size}".encode(), check=False)
    assert proc.returncode == 1
    assert f"token id {size} is outside the vocabulary" in proc.stderr.decode()
    proc = kiln(path, "decode", b"1,x,2", check=False)
    assert proc.returncode == 1
    assert "id #1" in proc.stderr.decode()
    proc = kiln(tmp_path / "missing.gguf", "encode", b"", check=False)
    assert proc.returncode == 1 and "missing.gguf" in proc.stderr.decode()
    proc = kiln(path, "frobnicate", b"", check=False)
    assert proc.returncode == 2


@pytest.mark.parametrize("change, message", [
    ({"model": "llama"},
     'tokenizer.ggml.model: tokenizer model "llama" is not supported'),
    ({"pre": "qwen2"},
     'tokenizer.ggml.pre: pre-tokenizer "qwen2" is not supported'),
    ({"types": [1, 1]}, "tokenizer.ggml.token_type: 2 types for"),
    ({"merges": ["a zz"]}, 'names "zz", which is not a token'),
    ({"duplicate": True}, "repeats token"),
    ({"eos": 10 ** 6}, "tokenizer.ggml.eos_token_id: token id 1000000 is "
                       "outside the vocabulary"),
])
def test_bad_metadata_is_reported(tmp_path, change, message):
    """Each broken file fails to load with an error naming the file, the key
    and the problem (the unit tests cover every check; this is the CLI)."""
    tokens = sorted(pre_tokenizers.ByteLevel.alphabet()) + ["ab", "[gMASK]"]
    if change.get("duplicate"):
        tokens.append("ab")
    types = change.get("types", [1] * (len(tokens) - 1) + [3])
    if change.get("duplicate"):
        types = [1] * len(tokens)
    path = write_tokenizer_gguf(
        tmp_path / "bad.gguf", tokens, types, change.get("merges", ["a b"]),
        pre=change.get("pre", "glm4"), model=change.get("model", "gpt2"),
        eos=change.get("eos"))
    proc = kiln(path, "encode", b"abc", check=False)
    assert proc.returncode == 1
    err = proc.stderr.decode()
    assert str(path) in err and message in err, err


def test_absent_pre_defaults_to_glm4(tmp_path):
    tokens = sorted(pre_tokenizers.ByteLevel.alphabet()) + ["ab"]
    path = write_tokenizer_gguf(tmp_path / "nopre.gguf", tokens, None,
                                ["a b"], pre=None)
    proc = kiln(path, "encode", b"ab  ab")
    assert "using glm4" in proc.stderr.decode()
    ab = len(tokens) - 1
    space = tokens.index("Ġ")
    # "ab", " " (\s+(?!\S) leaves the last space to the word), " ab".
    assert proc.stdout.decode().strip() == f"{ab},{space},{space},{ab}"


# Random merge tables: what training never makes. Merges in any order, a
# merge whose result another merge already makes (two pairs, one token),
# merges whose sides no earlier merge can reach, and multi-byte characters
# cut inside. BPE's rule (the lowest rank first, the leftmost of equal
# ranks) must pick the same tokens as `tokenizers` on every line.
RANDOM_MERGE_SEEDS = [20261207 + i for i in range(6)]
RANDOM_MERGE_CHARS = ["a", "b", "c", " ", "é", "中", "1"]


def random_merge_table(rng):
    """The byte-level alphabet, then 40-120 random merges over spellings of
    short strings of RANDOM_MERGE_CHARS (in UTF-8 bytes, so that a merge
    may join part of a character to another)."""
    mapping = bytes_to_byte_level()
    assert set(mapping.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    tokens = sorted(mapping.values())
    pool = sorted({mapping[b] for ch in RANDOM_MERGE_CHARS
                   for b in ch.encode()})
    known = set(tokens)
    merges, pairs = [], set()
    for _ in range(rng.randint(40, 120)):
        left, right = rng.choice(pool), rng.choice(pool)
        if (left, right) in pairs or len(left) + len(right) > 8:
            continue
        pairs.add((left, right))
        merges.append((left, right))
        if left + right not in known:
            known.add(left + right)
            tokens.append(left + right)
            pool.append(left + right)
    return tokens, merges


def bytes_to_byte_level():
    """GPT-2's byte-level map: byte -> the character that spells it."""
    printable = (list(range(ord("!"), ord("~") + 1)) +
                 list(range(ord("¡"), ord("¬") + 1)) +
                 list(range(ord("®"), ord("ÿ") + 1)))
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


@pytest.mark.parametrize("seed", RANDOM_MERGE_SEEDS)
def test_random_merge_tables_match_tokenizers(tmp_path, seed):
    print(f"seed {seed}")
    rng = random.Random(seed)
    tokens, merges = random_merge_table(rng)
    vocab = {t: i for i, t in enumerate(tokens)}
    hf = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GLM4_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.decoder = decoders.ByteLevel()
    path = write_tokenizer_gguf(tmp_path / "random.gguf", tokens,
                                [1] * len(tokens),
                                [f"{a} {b}" for a, b in merges])
    lines = []
    for _ in range(100):
        # Two or three characters a line: runs like "aaab" and "ababa",
        # where merges compete for a symbol and ties between equal ranks
        # (one merge at two places) are common.
        chars = rng.sample(RANDOM_MERGE_CHARS, rng.randint(2, 3))
        lines.append("".join(rng.choice(chars)
                             for _ in range(rng.randint(1, 40))))
    for text in lines:
        assert kiln_encode(path, text) == hf_encode(hf, text), repr(text)
