#!/usr/bin/env python3
"""Writes the malformed-GGUF corpus: one small file per rule the reader
enforces, plus a few valid files, and manifest.json recording for each case
the file(s) to open and the substring the one-line error must contain.

usage: make_corpus.py [OUT_DIR]   (default: this script's folder)

Deterministic: the same bytes on every run (test_gguf_corpus.py checks that
the checked-in files are what this script writes). Files are built byte by
byte so that every rule is broken on purpose and only that rule.
"""
import json
import pathlib
import struct
import sys

# GGUF value types and ggml type ids used below.
U8, I8, U16, I16, U32, I32, F32V, BOOL, STR, ARR, U64, I64, F64 = range(13)
F32, Q8_0, Q4_K = 0, 8, 12


def u32(v):
    return struct.pack("<I", v)


def u64(v):
    return struct.pack("<Q", v)


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return u64(len(b)) + b


def header(tensors, kvs, version=3, magic=b"GGUF"):
    return magic + u32(version) + u64(tensors) + u64(kvs)


def kv(key, vtype, payload):
    return gstr(key) + u32(vtype) + payload


def kv_u32(key, v):
    return kv(key, U32, u32(v))


def tinfo(name, dims, ggml_type, offset):
    return gstr(name) + u32(len(dims)) + b"".join(u64(d) for d in dims) + \
        u32(ggml_type) + u64(offset)


def pad(b, align=32, extra=0):
    return b + b"\0" * ((-len(b)) % align) + b"\0" * extra


def model(kvs=(), tensors=(), data=0, align=32, version=3):
    """A file from KV blobs and tensor infos, padded, with `data` bytes."""
    body = header(len(tensors), len(kvs), version) + b"".join(kvs) + \
        b"".join(tensors)
    return pad(body, align, data)


def split_keys(no, count, total):
    return [kv("split.no", U16, struct.pack("<H", no)),
            kv("split.count", U16, struct.pack("<H", count)),
            kv("split.tensors.count", I32, struct.pack("<i", total))]


def f32_tensor(name, n=4, offset=0):
    return tinfo(name, [n], F32, offset)


def cases():
    """(name, {file: bytes}, file to open, expected error substring or None
    for a valid case)."""
    ok = model([kv_u32("general.alignment", 64),
                kv("general.name", STR, gstr("corpus")),
                kv("tokens", ARR, u32(STR) + u64(3) + gstr("a") + gstr("")
                   + gstr("bc")),
                kv("nested", ARR, u32(ARR) + u64(1) + u32(U8) + u64(2)
                   + b"\1\2"),
                kv("flag", BOOL, b"\1")],
               [tinfo("q8", [32, 2], Q8_0, 0), f32_tensor("v", 4, 128)],
               data=144, align=64)
    yield "valid", {"valid.gguf": ok}, "valid.gguf", None
    yield "valid-v2", {"valid-v2.gguf": model([kv_u32("k", 1)],
                                              [f32_tensor("t")], 16,
                                              version=2)}, \
        "valid-v2.gguf", None
    split_ok = {
        "split-ok-00001-of-00002.gguf": model(split_keys(0, 2, 1)),
        "split-ok-00002-of-00002.gguf": model(split_keys(1, 2, 1),
                                              [f32_tensor("t")], 16),
    }
    yield "valid-split", split_ok, "split-ok-00002-of-00002.gguf", None

    yield "bad magic", {"bad-magic.gguf": b"GGML" + u32(3) + u64(0) + u64(0)}, \
        "bad-magic.gguf", "magic: not a GGUF file"
    yield "version 1", {"version-1.gguf": header(0, 0, version=1)}, \
        "version-1.gguf", "version: GGUF version 1 is not supported"
    yield "big-endian", {"big-endian.gguf": b"GGUF" + struct.pack(">I", 3)
                         + u64(0) + u64(0)}, \
        "big-endian.gguf", "big-endian"
    yield "truncated header", {"truncated-header.gguf": header(0, 0)[:14]}, \
        "truncated-header.gguf", "tensor_count: file ends inside"
    yield "truncated kv", {"truncated-kv.gguf": header(0, 1)
                           + gstr("general.name") + u32(STR) + u64(20)
                           + b"short"}, \
        "truncated-kv.gguf", "general.name: string of 20 bytes is longer"
    yield "kv value cut", {"kv-value-cut.gguf": header(0, 1)
                           + gstr("some.long.key") + u32(U64) + b"\1\2"}, \
        "kv-value-cut.gguf", "some.long.key: file ends inside the uint64 value"
    yield "absurd kv count", {"absurd-kv-count.gguf": header(0, 2**40)
                              + kv_u32("k", 1)}, \
        "absurd-kv-count.gguf", "kv_count: metadata count 1099511627776 cannot fit"
    yield "absurd tensor count", {"absurd-tensor-count.gguf":
                                  header(2**50, 0) + b"\0" * 64}, \
        "absurd-tensor-count.gguf", "tensor_count: tensor count 1125899906842624 cannot fit"
    yield "string longer than file", {"string-too-long.gguf": header(0, 1)
                                      + gstr("s") + u32(STR) + u64(2**63)
                                      + b"x" * 8}, \
        "string-too-long.gguf", "s: string of 9223372036854775808 bytes is longer"
    yield "key longer than file", {"key-too-long.gguf": header(0, 1)
                                   + u64(4096) + b"k" * 16}, \
        "key-too-long.gguf", "metadata key #0: key of 4096 bytes is longer"
    yield "array longer than file", {"array-too-long.gguf": header(0, 1)
                                     + gstr("a") + u32(ARR) + u32(U32)
                                     + u64(2**62) + u32(1)}, \
        "array-too-long.gguf", "a: array of 4611686018427387904 uint32 elements is longer"
    yield "string array longer than file", {
        "string-array-too-long.gguf": header(0, 1) + gstr("tokenizer.ggml.tokens")
        + u32(ARR) + u32(STR) + u64(1000) + gstr("a") * 3}, \
        "string-array-too-long.gguf", "tokenizer.ggml.tokens: array of 1000 string elements"
    yield "bad value type", {"bad-value-type.gguf": header(0, 1) + gstr("k")
                             + u32(13) + u32(0)}, \
        "bad-value-type.gguf", "k: unknown value type 13"
    yield "bad array element type", {"bad-array-type.gguf": header(0, 1)
                                     + gstr("a") + u32(ARR) + u32(40) + u64(0)}, \
        "bad-array-type.gguf", "a: unknown array element type 40"
    yield "bool not 0/1", {"bad-bool.gguf": header(0, 1) + gstr("b") + u32(BOOL)
                           + b"\x07" + b"\0" * 8}, \
        "bad-bool.gguf", "b: bool value 7 is neither 0 nor 1"
    yield "arrays nested too deep", {"nested-too-deep.gguf": header(0, 1)
                                     + gstr("d") + u32(ARR)
                                     + (u32(ARR) + u64(1)) * 20
                                     + u32(U8) + u64(0)}, \
        "nested-too-deep.gguf", "d: arrays nested deeper than"
    yield "duplicate key", {"duplicate-key.gguf": model([kv_u32("k", 1),
                                                         kv_u32("k", 2)])}, \
        "duplicate-key.gguf", "k: duplicate metadata key"
    yield "alignment not a power of two", {
        "alignment-48.gguf": model([kv_u32("general.alignment", 48)])}, \
        "alignment-48.gguf", "general.alignment: alignment 48 is not a power of two"
    yield "alignment zero", {"alignment-0.gguf":
                             model([kv_u32("general.alignment", 0)])}, \
        "alignment-0.gguf", "general.alignment: alignment 0 is not a power of two"
    yield "alignment wrong type", {"alignment-u64.gguf": model(
        [kv("general.alignment", U64, u64(64))])}, \
        "alignment-u64.gguf", "general.alignment: must be uint32, not uint64"
    yield "truncated tensor info", {"truncated-tensor-info.gguf": header(1, 0)
                                    + gstr("blk.0.w") + u32(2) + u64(4)
                                    + b"\0" * 4}, \
        "truncated-tensor-info.gguf", "blk.0.w: file ends inside the dimensions"
    yield "unknown ggml type", {"unknown-type.gguf": model(
        [], [tinfo("w", [4], 4, 0)], 16)}, \
        "unknown-type.gguf", "w: unknown ggml type id 4"
    yield "zero dim", {"zero-dim.gguf": model([], [tinfo("w", [4, 0], F32, 0)],
                                              16)}, \
        "zero-dim.gguf", "w: dimension 1 is 0"
    yield "five dims", {"five-dims.gguf": model(
        [], [tinfo("w", [1, 1, 1, 1, 1], F32, 0)], 16)}, \
        "five-dims.gguf", "w: 5 dimensions (at most 4)"
    yield "ne[0] not a multiple of the block", {"ne0-not-block.gguf": model(
        [], [tinfo("blk.0.attn_k_b.weight", [192, 512], Q4_K, 0)], 64)}, \
        "ne0-not-block.gguf", "blk.0.attn_k_b.weight: ne[0] = 192 is not a multiple of the Q4_K block size 256"
    yield "dims product overflows", {"dims-overflow.gguf": model(
        [], [tinfo("w", [2**32, 2**32, 2], F32, 0)], 16)}, \
        "dims-overflow.gguf", "w: product of dimensions overflows 64 bits"
    yield "byte size overflows", {"bytes-overflow.gguf": model(
        [], [tinfo("w", [2**62, 2], F32, 0)], 16)}, \
        "bytes-overflow.gguf", "w: data size overflows 64 bits"
    yield "data past end of file", {"data-past-end.gguf": model(
        [], [f32_tensor("w", 64)], 100)}, \
        "data-past-end.gguf", "w: data (offset 0, 256 bytes"
    yield "offset past end of file", {"offset-past-end.gguf": model(
        [], [f32_tensor("w", 4, 2**64 - 32)], 16)}, \
        "offset-past-end.gguf", "lies past the end of the file"
    yield "misaligned offset", {"misaligned-offset.gguf": model(
        [], [f32_tensor("w", 4, 4)], 64)}, \
        "misaligned-offset.gguf", "w: data offset 4 is not a multiple of the alignment 32"
    yield "duplicate tensor", {"duplicate-tensor.gguf": model(
        [], [f32_tensor("w"), f32_tensor("w", 4, 32)], 64)}, \
        "duplicate-tensor.gguf", "w: duplicate tensor name"
    yield "overlapping tensors", {"overlapping-tensors.gguf": model(
        [], [f32_tensor("a", 16), f32_tensor("b", 4, 32)], 96)}, \
        "overlapping-tensors.gguf", "b: data overlaps that of tensor a"
    yield "split part missing", {
        "split-missing-00001-of-00003.gguf": model(split_keys(0, 3, 1)),
        "split-missing-00003-of-00003.gguf": model(split_keys(2, 3, 1),
                                                   [f32_tensor("t")], 16),
    }, "split-missing-00001-of-00003.gguf", "split part 2 of 3 is missing"
    yield "split counts inconsistent", {
        "split-counts-00001-of-00002.gguf": model(split_keys(0, 2, 2),
                                                  [f32_tensor("a")], 16),
        "split-counts-00002-of-00002.gguf": model(split_keys(1, 2, 3),
                                                  [f32_tensor("b")], 16),
    }, "split-counts-00001-of-00002.gguf", \
        "split.tensors.count: split.tensors.count 3 differs from 2"
    yield "split tensor total wrong", {
        "split-total-00001-of-00002.gguf": model(split_keys(0, 2, 5),
                                                 [f32_tensor("a")], 16),
        "split-total-00002-of-00002.gguf": model(split_keys(1, 2, 5),
                                                 [f32_tensor("b")], 16),
    }, "split-total-00002-of-00002.gguf", \
        "split.tensors.count is 5 but the parts hold 2 tensors"
    yield "split duplicate tensor", {
        "split-dup-00001-of-00002.gguf": model(split_keys(0, 2, 2),
                                               [f32_tensor("w")], 16),
        "split-dup-00002-of-00002.gguf": model(split_keys(1, 2, 2),
                                               [f32_tensor("w")], 16),
    }, "split-dup-00001-of-00002.gguf", "w: tensor also in"
    yield "split.no out of range", {"split-no-range.gguf": model(
        split_keys(4, 2, 1))}, \
        "split-no-range.gguf", "split.no: split.no 4 is not below split.count 2"
    yield "split.no mismatching the name", {
        "split-name-00001-of-00002.gguf": model(split_keys(0, 2, 0)),
        "split-name-00002-of-00002.gguf": model(split_keys(0, 2, 0)),
    }, "split-name-00001-of-00002.gguf", \
        "file name says part 2 of 2 but the file is split.no 0"


def main():
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1
                       else pathlib.Path(__file__).parent)
    out.mkdir(parents=True, exist_ok=True)
    manifest = []
    seen = set()
    for rule, files, open_name, expect in cases():
        for name, data in files.items():
            assert name not in seen, name
            seen.add(name)
            (out / name).write_bytes(data)
        manifest.append({"rule": rule, "open": open_name, "files": sorted(files),
                         "expect": expect})
        print(f"corpus: {open_name}: {rule}")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
