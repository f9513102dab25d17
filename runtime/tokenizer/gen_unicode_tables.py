#!/usr/bin/env python3
"""Writes UnicodeTables.inc: the code point classes the glm4 pre-tokenizer needs.

The split pattern uses \\p{L} (general category L*), \\p{N} (N*) and \\s. The
tables are derived from the PyPI package unicodedata2 (unicodedata's
interface, with newer Unicode data than a given Python has; utils/setup.sh
pins the version to the one HuggingFace `tokenizers`' regex engine knows),
and the Unicode version is recorded in the output. \\s is what Oniguruma,
that regex engine, means by it: U+0009..U+000D, U+0085 and the categories Zs,
Zl and Zp; Python's str.isspace() differs (it also accepts U+001C..U+001F).

Usage: .venv/bin/python runtime/tokenizer/gen_unicode_tables.py [OUT]
       [--module unicodedata]
OUT defaults to UnicodeTables.inc beside this script. --module takes the
data from another module with unicodedata's interface (the standard module:
this Python's Unicode version). Deterministic: the same Unicode version
always gives the same file.
"""
import argparse
import importlib
import pathlib

# The C++ side (Unicode.cpp) names the classes this way.
LETTER, NUMBER, SPACE = "L", "N", "S"
CONTROL_SPACES = {0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x85}
MAX_CODE_POINT = 0x10FFFF
RANGES_PER_LINE = 3


def char_class(unicodedata, cp):
    """The class of one code point, or None for "anything else"."""
    if cp in CONTROL_SPACES:
        return SPACE
    category = unicodedata.category(chr(cp))
    if category.startswith("L"):
        return LETTER
    if category.startswith("N"):
        return NUMBER
    if category in ("Zs", "Zl", "Zp"):
        return SPACE
    return None


def class_ranges(unicodedata):
    """Maximal runs of consecutive code points of one class, in order."""
    ranges = []
    for cp in range(MAX_CODE_POINT + 1):
        cls = char_class(unicodedata, cp)
        if cls is None:
            continue
        if ranges and ranges[-1][1] == cp - 1 and ranges[-1][2] == cls:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp, cls])
    return ranges


def render(unicodedata, ranges):
    version = unicodedata.unidata_version
    lines = [
        "// UnicodeTables.inc - code point classes of the glm4 pre-tokenizer.",
        "//",
        f"// GENERATED from the Python module {unicodedata.__name__}, Unicode {version},",
        "// by runtime/tokenizer/gen_unicode_tables.py; do not edit. Regenerate with",
        "//   .venv/bin/python runtime/tokenizer/gen_unicode_tables.py",
        "// Each entry is {first, last, class}: L letters (general category L*),",
        "// N numbers (N*), S whitespace as Oniguruma's \\s (U+0009..U+000D,",
        "// U+0085, Zs, Zl, Zp). Code points in no range are of neither class.",
        "// Sorted and disjoint; adjacent runs of one class are merged.",
        "",
        f'constexpr std::string_view kUnicodeVersion = "{version}";',
        "",
        f"constexpr CodePointRange kCodePointRanges[{len(ranges)}] = {{",
    ]
    for start in range(0, len(ranges), RANGES_PER_LINE):
        chunk = ranges[start:start + RANGES_PER_LINE]
        lines.append("    " + " ".join(
            f"{{0x{first:04X}, 0x{last:04X}, {cls}}}," for first, last, cls in chunk))
    lines.append("};")
    return "\n".join(lines) + "\n"


def main():
    here = pathlib.Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=pathlib.Path,
                        default=here / "UnicodeTables.inc")
    parser.add_argument("--module", default="unicodedata2",
                        help="where the character data comes from")
    args = parser.parse_args()
    unicodedata = importlib.import_module(args.module)
    ranges = class_ranges(unicodedata)
    args.out.write_text(render(unicodedata, ranges))
    print(f"gen_unicode_tables: wrote {len(ranges)} ranges (Unicode "
          f"{unicodedata.unidata_version}, {args.module}) to {args.out}")


if __name__ == "__main__":
    main()
