#!/usr/bin/env bash
# The main job on the embedded default. It grows with every issue: today it
# sets up, builds, and shows the parts of the pipeline that exist.
set -euo pipefail
cd "$(dirname "$0")/.."
utils/setup.sh
utils/build.sh
bin=${KILN_BUILD_DIR:-build}/bin

echo
echo "== Kiln demo =="
echo "The compile-and-run pipeline (GGUF -> kiln dialect -> step plan -> kiln-run)"
echo "is not built yet; see README.md's status table. What works today:"
echo
echo "-- the kiln dialect: a GLM-5 dense FFN block parsed, verified and printed by kiln-opt"
"$bin/kiln-opt" models/glm5/examples/dense-ffn.mlir
echo
echo "-- and a shape error caught by the op verifiers:"
if "$bin/kiln-opt" models/glm5/examples/bad-norm.mlir 2>&1; then
  echo "demo: error: kiln-opt accepted an ill-formed program" >&2
  exit 1
fi
echo "(kiln-opt rejected it with the message above, as it should)"
echo
echo "Next stages, in order: GGUF reader and synthetic GLM-5 files, the full GLM-5 program,"
echo "the step dialect and memory plan, the CPU runtime (kiln-compile + kiln-run), CUDA."
