#!/usr/bin/env bash
# Sets up, builds, and runs every test suite: lit (FileCheck over kiln-opt),
# the GoogleTest unit tests, pytest and a bounded fuzz run (utils/fuzz.sh).
# Ends with one line "N passed, M failed, K skipped" over all suites; exits
# non-zero on any failure, including a runner that crashed or ran nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
utils/setup.sh
utils/build.sh
build=${KILN_BUILD_DIR:-build}
results="$build/test-results"
rm -rf "$results"
mkdir -p "$results"

# Each runner writes JUnit XML; a runner's own exit status is kept too, so a
# crash that leaves no XML still counts as a failure.
runner_status=()
run() {
  local name=$1; shift
  echo
  echo "== $name: $*"
  set +e
  "$@"
  local rc=$?
  set -e
  runner_status+=("$name=$rc")
}

if [ -f "$build/test/lit/lit.site.cfg.py" ]; then
  run lit /usr/lib/llvm-22/bin/lit -sv "$build/test/lit" \
    --xunit-xml-output "$results/lit.xml"
fi
for t in "$build"/test/unit/*-tests; do
  [ -x "$t" ] || continue
  run "unit:$(basename "$t")" "$t" --gtest_brief=1 \
    --gtest_output="xml:$results/unit-$(basename "$t").xml"
done
# The MLIR-free half (runtime, plugins, kiln-gguf) configured on its own,
# without the compiler: it must build where no MLIR is installed, and
# test_runtime.py checks its binaries hold no llvm::/mlir:: symbol.
runtime_build="$build-runtime"
echo
echo "== MLIR-free build: $runtime_build (-DKILN_BUILD_COMPILER=OFF)"
if [ ! -f "$runtime_build/build.ninja" ]; then
  cmake -G Ninja -S . -B "$runtime_build" -DCMAKE_BUILD_TYPE=Release \
    -DKILN_BUILD_COMPILER=OFF -DKILN_ENABLE_CUDA=OFF \
    -DCMAKE_DISABLE_FIND_PACKAGE_MLIR=ON -DCMAKE_DISABLE_FIND_PACKAGE_LLVM=ON \
    >/dev/null
fi
cmake --build "$runtime_build" --target kiln-run kiln-gguf kiln-backend-cpu

run pytest env KILN_BUILD_DIR="$PWD/$build" \
  KILN_RUNTIME_BUILD_DIR="$PWD/$runtime_build" .venv/bin/python -m pytest -q \
  -rs test/python --junitxml="$results/pytest.xml"

# A short, bounded fuzz run (ASan + UBSan) of the GGUF reader, after it has
# replayed the malformed-GGUF corpus, the artifact reader and the chat
# templates; KILN_FUZZ_SECONDS sets each one's length.
run fuzz utils/fuzz.sh --seconds "${KILN_FUZZ_SECONDS:-30}" \
  --junit "$results/fuzz.xml"

echo
echo "== gpu: skipped here (needs an NVIDIA GPU; run utils/gpu-test.sh on a GPU machine)"
echo
python3 utils/test-summary.py "$results" "${runner_status[@]}"
