#!/usr/bin/env python3
"""Generates runtime/chat/UnicodeTables.inc from the running Python.

The chat-template engine must treat text exactly as Python's `str` does
(jinja2 runs on Python strings): which code points `str.strip()` removes,
what `str.lower()`, `str.upper()` and `str.capitalize()` map them to, and
which ones `repr()` escapes. Those facts are read here from Python itself,
by asking it about every code point, and written as sorted C++ tables.

Final sigma: Python lowercases U+03A3 to U+03C2 at the end of a word. The
rule needs two derived properties (Cased, Case_Ignorable) that `unicodedata`
does not expose, so they are measured through `str.lower()` itself:
  - "A" + c + "\u03a3" lowers to a final sigma iff c is case-ignorable or
    cased (the scan skips ignorables, then needs a cased letter);
  - c + "\u03a3" lowers to a final sigma iff c is cased and not ignorable.
A code point that is both behaves as ignorable (it is always skipped), so
the tables record "ignorable" and "cased (and not ignorable)".

Usage: .venv/bin/python runtime/chat/gen_unicode_tables.py
"""
import pathlib
import sys
import unicodedata

OUT = pathlib.Path(__file__).resolve().parent / "UnicodeTables.inc"
MAX = 0x110000
SIGMA = "\u03a3"
FINAL = "\u03c2"


def is_surrogate(cp):
    return 0xD800 <= cp <= 0xDFFF


def ranges(pred):
    """[first, last] runs of code points (surrogates excluded) where pred."""
    out, start = [], None
    for cp in range(MAX + 1):
        hit = cp < MAX and not is_surrogate(cp) and pred(cp)
        if hit and start is None:
            start = cp
        elif not hit and start is not None:
            out.append((start, cp - 1))
            start = None
    return out


def mapping(fn, base=None):
    """{cp: mapped} where fn(chr(cp)) differs from chr(cp) (or from base)."""
    out = []
    for cp in range(MAX):
        if is_surrogate(cp):
            continue
        c = chr(cp)
        m = fn(c)
        ref = base(c) if base else c
        if m != ref:
            assert 1 <= len(m) <= 3, (cp, m)
            out.append((cp, [ord(x) for x in m]))
    return out


def emit_ranges(lines, name, rs):
    lines.append(f"constexpr CodePointRun {name}[{len(rs)}] = {{")
    row = []
    for a, b in rs:
        row.append(f"{{0x{a:04X}, 0x{b:04X}}}")
        if len(row) == 4:
            lines.append("    " + ", ".join(row) + ",")
            row = []
    if row:
        lines.append("    " + ", ".join(row) + ",")
    lines.append("};")
    lines.append("")


def emit_mapping(lines, name, entries):
    lines.append(f"constexpr CaseMapping {name}[{len(entries)}] = {{")
    row = []
    for cp, to in entries:
        padded = to + [0] * (3 - len(to))
        row.append(f"{{0x{cp:04X}, {len(to)}, {{" +
                   ", ".join(f"0x{x:04X}" for x in padded) + "}}")
        if len(row) == 2:
            lines.append("    " + ", ".join(row) + ",")
            row = []
    if row:
        lines.append("    " + ", ".join(row) + ",")
    lines.append("};")
    lines.append("")


def main():
    lower = mapping(str.lower)
    upper = mapping(str.upper)
    # Title case differs from upper case for few code points (digraphs).
    title = mapping(str.title, base=str.upper)
    space = ranges(lambda cp: chr(cp).isspace())
    printable = ranges(lambda cp: not chr(cp).isprintable())
    both = ranges(lambda cp: ("A" + chr(cp) + SIGMA).lower()[-1] == FINAL)
    cased = ranges(lambda cp: (chr(cp) + SIGMA).lower()[-1] == FINAL)
    cased_set = set()
    for a, b in cased:
        cased_set.update(range(a, b + 1))

    def ignorable(cp):
        if cp in cased_set:
            return False
        return ("A" + chr(cp) + SIGMA).lower()[-1] == FINAL

    ignorable_runs = [r for r in ranges(ignorable)]
    del both

    lines = [
        "// UnicodeTables.inc - Python's str facts for the chat-template engine.",
        "//",
        f"// GENERATED from Python {sys.version.split()[0]} (Unicode "
        f"{unicodedata.unidata_version}) by",
        "// runtime/chat/gen_unicode_tables.py; do not edit. Regenerate with",
        "//   .venv/bin/python runtime/chat/gen_unicode_tables.py",
        "// Runs are sorted, disjoint, inclusive. Case mappings list code points",
        "// whose full mapping differs from themselves (kTitleMappings: whose",
        "// title case differs from their upper case).",
        "",
        f'constexpr std::string_view kUnicodeVersion = "{unicodedata.unidata_version}";',
        "",
    ]
    emit_ranges(lines, "kSpaceRuns", space)
    emit_ranges(lines, "kNonPrintableRuns", printable)
    emit_ranges(lines, "kCasedRuns", cased)
    emit_ranges(lines, "kCaseIgnorableRuns", ignorable_runs)
    emit_mapping(lines, "kLowerMappings", lower)
    emit_mapping(lines, "kUpperMappings", upper)
    emit_mapping(lines, "kTitleMappings", title)
    OUT.write_text("\n".join(lines))
    print(f"wrote {OUT}: {len(lower)} lower, {len(upper)} upper, "
          f"{len(title)} title, {len(space)} space, {len(printable)} "
          f"non-printable, {len(cased)} cased, {len(ignorable_runs)} ignorable")


if __name__ == "__main__":
    main()
