"""A reference reader of JSON Schema-constrained text, written
independently of chat::SchemaPrefix, for the tests of constrained replies
(test_json_schema_output.py, and the forced tool calls' JSON values in
test_constrained_output.py).

It reads in continuation-passing style, trying every way the bytes can be
read (anyOf's alternatives, a number or an enum value ending or going on),
and says whether they are a whole value the schema accepts, a prefix of
one, or neither. It reads the same language as the C++: keys written
without escapes, enum values spelled as compact JSON (json.dumps with ","
and ":"), no \\u escape of a surrogate in a string with a length bound.
"""
import codecs
import fractions
import functools
import json
import math
import re

import regex

SPACE = b" \t\r\n"
NUMBER = re.compile(rb"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
INTEGER = re.compile(rb"-?(0|[1-9][0-9]*)")
NUMBER_START = re.compile(
    rb"-?((0|[1-9][0-9]*)(\.[0-9]*)?([eE][+-]?[0-9]*)?)?")
INTEGER_START = re.compile(rb"-?(0|[1-9][0-9]*)?")
ALL_TYPES = {"null", "boolean", "integer", "number", "string", "array",
             "object"}
# The replies' bound on whitespace (chat::WhitespaceCap): at most this many
# whitespace bytes in a row outside strings.
WHITESPACE_RUN = 64


def whitespace_runs_ok(data):
    """Whether no run of whitespace outside the JSON text's strings (from a
    '"' to the next one not escaped by a backslash) is longer than
    WHITESPACE_RUN."""
    run, inside, escaped = 0, False, False
    for b in data:
        if inside:
            if escaped:
                escaped = False
            elif b == 0x5C:
                escaped = True
            elif b == 0x22:
                inside = False
        elif b in SPACE:
            run += 1
            if run > WHITESPACE_RUN:
                return False
        else:
            run = 0
            inside = b == 0x22
    return True


def pointer(doc, ref):
    assert ref.startswith("#")
    node = doc
    for token in ref[1:].split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        node = node[int(token)] if isinstance(node, list) else node[token]
    return node


def type_of(v):
    if v is None:
        return {"null"}
    if isinstance(v, bool):
        return {"boolean"}
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer()):
        return {"integer", "number"}
    if isinstance(v, float):
        return {"number"}
    if isinstance(v, str):
        return {"string"}
    return {"array"} if isinstance(v, list) else {"object"}


MAX_DIGITS = 18  # chat::JsonSchema::kMaxBoundedInteger's
UNBOUNDED = (-10 ** 99, 10 ** 99)


def integer_bounds(s):
    """The least and most integer an integer schema allows, as
    JSON Schema 2020-12 reads minimum / maximum / exclusive* (and draft 4's
    boolean exclusives); unbounded: UNBOUNDED."""
    keys = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
            "multipleOf")
    if not any(key in s for key in keys):
        return UNBOUNDED
    lo, hi = -(10 ** MAX_DIGITS - 1), 10 ** MAX_DIGITS - 1
    ex_lo = s.get("exclusiveMinimum") is True
    ex_hi = s.get("exclusiveMaximum") is True
    if "minimum" in s:
        x = s["minimum"]
        lo = max(lo, math.floor(x) + 1 if ex_lo else math.ceil(x))
    if "maximum" in s:
        x = s["maximum"]
        hi = min(hi, math.ceil(x) - 1 if ex_hi else math.floor(x))
    if not isinstance(s.get("exclusiveMinimum", True), bool):
        lo = max(lo, math.floor(s["exclusiveMinimum"]) + 1)
    if not isinstance(s.get("exclusiveMaximum", True), bool):
        hi = min(hi, math.ceil(s["exclusiveMaximum"]) - 1)
    return lo, hi


def has_multiple(a, b, m):
    """Whether [a, b] holds a multiple of m (m None: any integer)."""
    m = m or 1
    return -(-a // m) * m <= b


def leads_in(text, lo, hi, m=None):
    """Whether an integer's text so far (b"-", b"12", ...) can still
    become one in [lo, hi] (a multiple of m, where given): padded with 0s
    and 9s to each length up to the digits allowed, it spans the integers
    it can become at that length."""
    if (lo, hi) == UNBOUNDED:
        return True
    negative = text.startswith(b"-")
    digits = text[1:] if negative else text
    if not digits:  # "-0" or a negative integer
        return has_multiple(lo, min(hi, 0), m)
    if digits == b"0":
        return lo <= 0 <= hi
    for extra in range(MAX_DIGITS - len(digits) + 1):
        low = int(digits + b"0" * extra)
        high = int(digits + b"9" * extra)
        a, b = (-high, -low) if negative else (low, high)
        if has_multiple(max(a, lo), min(b, hi), m):
            return True
    return False


NUMBER_DIGITS = 15  # chat::JsonSchema::kMaxNumberDigits
BOUNDED_NUMBER = re.compile(rb"-?(0|[1-9][0-9]*)(\.[0-9]+)?")
BOUNDED_NUMBER_START = re.compile(rb"-?((0|[1-9][0-9]*)(\.[0-9]*)?)?")


def number_bounds(s):
    """A number schema's bounds as (lower, upper), each None or
    (value, open): the value the bound's shortest form (repr) spells, as a
    Fraction; None where the schema has no bound and no multipleOf."""
    keys = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
            "multipleOf")
    if not any(key in s for key in keys):
        return None
    lower = upper = None

    def tighter(old, new, up):
        if old is None:
            return new
        if new[0] != old[0]:
            return new if (new[0] < old[0]) == up else old
        return new if new[1] else old  # the same value: open wins

    def bound(x):
        return fractions.Fraction(repr(float(x)))

    if "minimum" in s:
        lower = tighter(lower, (bound(s["minimum"]),
                                s.get("exclusiveMinimum") is True), False)
    if "maximum" in s:
        upper = tighter(upper, (bound(s["maximum"]),
                                s.get("exclusiveMaximum") is True), True)
    if not isinstance(s.get("exclusiveMinimum", True), bool):
        lower = tighter(lower, (bound(s["exclusiveMinimum"]), True), False)
    if not isinstance(s.get("exclusiveMaximum", True), bool):
        upper = tighter(upper, (bound(s["exclusiveMaximum"]), True), True)
    return lower, upper


def within(v, bounds):
    lower, upper = bounds
    if lower is not None and (v <= lower[0] if lower[1] else v < lower[0]):
        return False
    return upper is None or (v < upper[0] if upper[1] else v <= upper[0])


def grid_within(a, b, step, bounds):
    """Whether some multiple of step in [a, b] lies within the bounds."""
    lower, upper = bounds
    start = math.ceil(a / step)  # the multiples' indices
    end = math.floor(b / step)
    if lower is not None:
        start = max(start, math.floor(lower[0] / step) + 1 if lower[1]
                    else math.ceil(lower[0] / step))
    if upper is not None:
        end = min(end, math.ceil(upper[0] / step) - 1 if upper[1]
                  else math.floor(upper[0] / step))
    return start <= end


def number_leads_in(text, bounds, m=None):
    """Whether a bounded number's text so far can still become one within
    the bounds (a multiple of the whole number m, where given), in at most
    NUMBER_DIGITS digits (a lone leading 0 aside) and no exponent: every
    way to spend the digits left is a run of multiples of a step between
    two ends (of m, which every such step divides, where given)."""
    Fr = fractions.Fraction
    negative = text.startswith(b"-")
    body = (text[1:] if negative else text).decode()
    signs = [negative] if body else [True] if negative else [False, True]
    runs = []  # (low, high, step) of magnitudes
    if not body:
        runs.append((Fr(0), 1 - Fr(1, 10 ** NUMBER_DIGITS),
                     Fr(1, 10 ** NUMBER_DIGITS)))
        for i in range(1, NUMBER_DIGITS + 1):
            step = Fr(1, 10 ** (NUMBER_DIGITS - i))
            runs.append((Fr(10 ** (i - 1)), 10 ** i - step, step))
    else:
        whole, _, frac = body.partition(".")
        used = (0 if whole == "0" else len(whole)) + len(frac)
        left = NUMBER_DIGITS - used
        if left < 0 or ("." in body and not frac and left == 0):
            return False
        if "." in body or whole == "0":
            step = Fr(1, 10 ** (len(frac) + left))
            low = Fr(int(whole + frac), 10 ** len(frac))
            runs.append((low, low + Fr(1, 10 ** len(frac)) - step, step))
        else:
            for j in range(left + 1):
                step = Fr(1, 10 ** (left - j))
                low = Fr(int(whole) * 10 ** j)
                runs.append((low, low + 10 ** j - step, step))
    for minus in signs:
        for low, high, step in runs:
            a, b = (-high, -low) if minus else (low, high)
            if grid_within(a, b, Fr(m) if m else step, bounds):
                return True
    return False


@functools.lru_cache(maxsize=64)
def pattern_whole(pattern):
    """`pattern` as a full match over the whole string: any text before
    and after it where it is not anchored (JSON Schema's patterns need only
    occur), in the `regex` module with ASCII classes (ECMA-262's \\d \\w;
    the tests' patterns use no '.' or \\s, where Python and ECMA differ)."""
    body = pattern
    start = body.startswith("^")
    if start:
        body = body[1:]
    end = body.endswith("$") and not body.endswith("\\$")
    if end:
        body = body[:-1]
    return regex.compile(("" if start else "(?s:.)*?") + "(?:" + body + ")" +
                         ("" if end else "(?s:.)*"), regex.ASCII)


def pattern_search(pattern, text):
    return regex.search(pattern, text, regex.ASCII) is not None


def pattern_candidates(pattern, lo, hi):
    """Code points in [lo, hi] (surrogates left out) that stand for every
    way a character there can go on: the ends of the range and each code
    point the pattern names, with its neighbours (where classes begin and
    end)."""
    named = set()
    for c in pattern:
        named |= {ord(c) - 1, ord(c), ord(c) + 1}
    for m in regex.finditer(r"\\u([0-9a-fA-F]{4})|\\x([0-9a-fA-F]{2})",
                            pattern):
        v = int(m.group(1) or m.group(2), 16)
        named |= {v - 1, v, v + 1}
    out = {lo, hi} | {c for c in named if lo <= c <= hi}
    return [c for c in sorted(out) if not 0xD800 <= c <= 0xDFFF]


def pattern_prefix(pattern, text, partial=None):
    """{'prefix'} if the decoded characters `text` (and a character read
    part of the way, one of the code points in `partial`) can still be
    followed to a match; otherwise nothing."""
    if pattern is None:
        return {"prefix"}
    whole = pattern_whole(pattern)
    done = "".join(text)
    if partial is None:
        ok = whole.fullmatch(done, partial=True) is not None
    else:
        ok = any(whole.fullmatch(done + chr(c), partial=True) is not None
                 for c in pattern_candidates(pattern, *partial))
    return {"prefix"} if ok else set()


def utf8_range(pending):
    """The code points a UTF-8 sequence begun with `pending` can be."""
    if not pending:
        return None
    lead = pending[0]
    n = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    v = lead & (0x7F >> n)
    for b in pending[1:]:
        v = v << 6 | (b & 0x3F)
    left = n - len(pending)
    least = {2: 0x80, 3: 0x800, 4: 0x10000}[n]
    return (max(v << 6 * left, least),
            min((v << 6 * left) | ((1 << 6 * left) - 1), 0x10FFFF))


def schema_state(data, root, document=None, capped=True):
    """'whole', 'prefix' or 'invalid' for `data` (bytes) under `root`
    ('whole' wins where the bytes may also go on); $refs resolve against
    `document` (default: root). `capped`: a reply's runs of whitespace are
    bounded (whitespace_runs_ok); a forced call's values are not."""
    if capped and not whitespace_runs_ok(data):
        return "invalid"
    n = len(data)

    def ws(p):
        while p < n and data[p] in SPACE:
            p += 1
        return p

    def resolve(s):
        while isinstance(s, dict) and ("$ref" in s or "allOf" in s):
            s = (pointer(document or root, s["$ref"]) if "$ref" in s
                 else s["allOf"][0])
        return {} if s is True else s

    def literal(options, p, k):
        out = set()
        for lit in options:
            if data[p:p + len(lit)] == lit:
                out |= k(p + len(lit))
            elif p + len(lit) > n and lit.startswith(data[p:]):
                out.add("prefix")
        return out

    def bounded_number(s, p, k):
        bounds, multiple = number_bounds(s), s.get("multipleOf")
        m = BOUNDED_NUMBER.match(data, p)
        start = BOUNDED_NUMBER_START.match(data, p)
        out = set()
        if start.end() == n and number_leads_in(data[p:], bounds, multiple):
            out.add("prefix")
        if m:
            digits = m.group().lstrip(b"-")
            count = sum(c in b"0123456789" for c in digits)
            if digits.startswith(b"0"):
                count -= 1  # a lone leading 0
            v = fractions.Fraction(m.group().decode())
            if (count <= NUMBER_DIGITS and within(v, bounds) and
                    (not multiple or v % multiple == 0)):
                out |= k(m.end())
        return out

    def number(s, s_types, p, k):
        if "number" in s_types and number_bounds(s) is not None:
            return bounded_number(s, p, k)
        integer = "number" not in s_types
        m = (INTEGER if integer else NUMBER).match(data, p)
        start = (INTEGER_START if integer else NUMBER_START).match(data, p)
        lo, hi = integer_bounds(s)
        multiple = s.get("multipleOf")
        out = set()
        if start.end() == n and leads_in(data[p:], lo, hi, multiple):
            out.add("prefix")  # more of the number may come
        if m and ((lo, hi) == UNBOUNDED or
                  (lo <= int(data[p:m.end()]) <= hi and
                   (not multiple or int(data[p:m.end()]) % multiple == 0))):
            out |= k(m.end())
        return out

    def string(s, p, k):
        lo, hi = s.get("minLength", 0), s.get("maxLength")
        pattern = s.get("pattern")
        bounded = lo > 0 or hi is not None or pattern is not None
        decoder = codecs.getincrementaldecoder("utf-8")()
        count, text = 0, []
        while p < n:
            b = data[p]
            if decoder.getstate()[0]:  # inside a UTF-8 character
                try:
                    text.append(decoder.decode(bytes([b])))
                except UnicodeDecodeError:
                    return set()
                p += 1
                continue
            if b == ord('"'):
                if count < lo:
                    return set()
                if pattern is not None and not pattern_search(
                        pattern, "".join(text)):
                    return set()
                return k(p + 1)
            if b < 0x20:
                return set()
            if hi is not None and count >= hi:
                return set()
            count += 1
            if b == ord("\\"):
                esc = data[p + 1:p + 2]
                if not esc:
                    return pattern_prefix(pattern, text, (0, 0xFFFF))
                if esc == b"u":
                    digits = data[p + 2:p + 6]
                    if not re.fullmatch(rb"[0-9a-fA-F]*", digits):
                        return set()
                    if bounded and re.match(rb"[dD][89a-fA-F]", digits):
                        return set()
                    if len(digits) < 4:
                        v = int(digits or b"0", 16) << 4 * (4 - len(digits))
                        return pattern_prefix(
                            pattern, text,
                            (v, v + (1 << 4 * (4 - len(digits))) - 1))
                    text.append(chr(int(digits, 16)))
                    p += 6
                elif esc in (b'"', b"\\", b"/", b"b", b"f", b"n", b"r",
                             b"t"):
                    text.append(json.loads(b'"\\' + esc + b'"'))
                    p += 2
                else:
                    return set()
                if pattern is not None and not pattern_prefix(pattern, text):
                    return set()
                continue
            try:
                text.append(decoder.decode(bytes([b])))
            except UnicodeDecodeError:
                return set()
            if pattern is not None and not pattern_prefix(
                    pattern, text, utf8_range(decoder.getstate()[0])):
                return set()
            p += 1
        pending = decoder.getstate()[0]
        return pattern_prefix(pattern, text,
                              utf8_range(pending) if pending else None)

    def obj(s, p, k):
        props = s.get("properties", {})
        extra = s.get("additionalProperties", True)
        required = set(s.get("required", []))
        tracked = set(props) | required  # names a second time is refused

        def child(name):
            if name in props:
                return props[name]
            return {} if extra is True else extra

        def more(seen):
            return extra is not False or bool(set(props) - seen)

        def key(p, seen):
            q = p
            decoder = codecs.getincrementaldecoder("utf-8")()
            while q < n and data[q] != ord('"'):
                if data[q] == ord("\\") or data[q] < 0x20:
                    return set()
                try:
                    decoder.decode(bytes([data[q]]))
                except UnicodeDecodeError:
                    return set()
                q += 1
            raw = data[p:q]
            if q == n:
                if extra is not False:
                    return {"prefix"}
                ok = any(name.encode().startswith(raw)
                         for name in set(props) - seen)
                return {"prefix"} if ok else set()
            if decoder.getstate()[0]:
                return set()
            name = raw.decode()
            if name in seen:
                return set()
            if name not in props and extra is False:
                return set()
            now = seen | ({name} & tracked)
            c = ws(q + 1)
            if c == n:
                return {"prefix"}
            if data[c] != ord(":"):
                return set()
            return value(child(name), c + 1,
                         lambda e: after(e, now))

        def after(p, seen):
            p = ws(p)
            if p == n:
                return {"prefix"}
            if data[p] == ord("}"):
                return k(p + 1) if required <= seen else set()
            if data[p] != ord(",") or not more(seen):
                return set()
            return open_key(p + 1, seen)

        def open_key(p, seen):
            p = ws(p)
            if p == n:
                return {"prefix"}
            if data[p] != ord('"'):
                return set()
            return key(p + 1, seen)

        p = ws(p)
        if p == n:
            return {"prefix"}
        if data[p] == ord("}"):
            return k(p + 1) if not required else set()
        if not more(set()):
            return set()
        return open_key(p, set())

    def arr(s, p, k):
        items = s.get("items", {})
        lo = s.get("minItems", 0)
        hi = 0 if items is False else s.get("maxItems")

        def after(p, count):
            p = ws(p)
            if p == n:
                return {"prefix"}
            if data[p] == ord("]"):
                return k(p + 1) if count >= lo else set()
            if data[p] != ord(",") or (hi is not None and count >= hi):
                return set()
            return value(items, p + 1, lambda e: after(e, count + 1))

        p = ws(p)
        if p == n:
            return {"prefix"}
        if data[p] == ord("]"):
            return k(p + 1) if lo == 0 else set()
        if hi == 0:
            return set()
        return value(items, p, lambda e: after(e, 1))

    def value(s, p, k):
        p = ws(p)
        if p == n:
            return {"prefix"}
        s = resolve(s)
        if "anyOf" in s:
            out = set()
            for alt in s["anyOf"]:
                out |= value(alt, p, k)
            return out
        types = s.get("type", ALL_TYPES)
        types = {types} if isinstance(types, str) else set(types)
        if "enum" in s or "const" in s:
            values = s["enum"] if "enum" in s else [s["const"]]
            options = []
            for v in values:
                spelled = json.dumps(v, separators=(",", ":"),
                                     ensure_ascii=False).encode()
                if type_of(v) & types and spelled not in options:
                    options.append(spelled)
            return literal(options, p, k)
        b = data[p]
        if b == ord("{") and "object" in types:
            return obj(s, p + 1, k)
        if b == ord("[") and "array" in types:
            return arr(s, p + 1, k)
        if b == ord('"') and "string" in types:
            return string(s, p + 1, k)
        if b in b"tf" and "boolean" in types:
            return literal([b"true", b"false"], p, k)
        if b == ord("n") and "null" in types:
            return literal([b"null"], p, k)
        if (b == ord("-") or 0x30 <= b <= 0x39) and types & {"integer",
                                                              "number"}:
            return number(s, types, p, k)
        return set()

    out = value(root, 0, lambda e: {"whole"} if ws(e) == n else set())
    return "whole" if "whole" in out else "prefix" if out else "invalid"
