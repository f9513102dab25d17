#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test Kiln:
# Debian packages (MLIR/LLVM 22, fmt, GoogleTest, FlatBuffers, nlohmann-json, ninja, ccache, clang-22 for
# fuzzing) and a Python virtual environment in .venv (numpy, gguf, pytest,
# tokenizers, jinja2, openai, and unicodedata2 pinned to the Unicode version
# of the tokenizer's tables, runtime/tokenizer/gen_unicode_tables.py).
# Idempotent: installs only what is missing. Works as root or through sudo.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(cmake ninja-build ccache git libfmt-dev libgtest-dev
  libflatbuffers-dev flatbuffers-compiler nlohmann-json3-dev libcpp-httplib-dev
  libmlir-22-dev mlir-22-tools llvm-22-dev llvm-22-tools
  clang-22 libclang-rt-22-dev python3 python3-venv)
PY_PACKAGES=(numpy gguf pytest tokenizers jinja2 openai unicodedata2==16.0.0 jsonschema regex)

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
else
  echo "setup: Debian packages present"
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating Python virtual environment .venv"
  python3 -m venv .venv
fi
if ! .venv/bin/python -c "import numpy, gguf, pytest, tokenizers, jinja2, openai, unicodedata2, jsonschema, regex; assert unicodedata2.unidata_version == '16.0.0'" 2>/dev/null; then
  echo "setup: installing Python packages: ${PY_PACKAGES[*]}"
  .venv/bin/python -m pip install -q --disable-pip-version-check "${PY_PACKAGES[@]}"
else
  echo "setup: Python packages present"
fi
