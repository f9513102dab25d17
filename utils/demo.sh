#!/usr/bin/env bash
# The main job on the embedded default: sets up, builds, synthesises the
# default small GLM-5 (the "tiny" preset), compiles it to an artifact and
# runs it end to end (on the CUDA backend where a GPU and the plugin are
# present, else on the CPU backend, saying which), then walks through the
# stages in between (the kiln program, the planned step program, its
# partition for two GPUs, the verifiers).
# KILN_BUILD_DIR: the build folder (default build); KILN_DEMO_DIR: where
# the demo's files go (default build/demo); KILN_DEMO_NO_SETUP=1 skips the
# set-up and the build (the tests run the demo on a build they made).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${KILN_DEMO_NO_SETUP:-}" ]; then
  utils/setup.sh
  utils/build.sh
fi
bin=${KILN_BUILD_DIR:-build}/bin
work=${KILN_DEMO_DIR:-build/demo}
mkdir -p "$work"

# The lines sed's RANGE picks from FILE, cut to 150 columns; an excerpt that
# comes out empty (the program's text moved on) stops the demo with an error.
excerpt() { # RANGE FILE
  local out
  out=$(sed -n "$1" "$2" | cut -c1-150)
  if [ -z "$out" ]; then
    echo "demo: error: no lines of $2 matched $1" >&2
    exit 1
  fi
  printf '%s\n' "$out"
}

echo
echo "== Kiln demo =="
echo "The embedded default: a tiny synthetic GLM-5 (glm-dsa architecture, random weights)."
echo
echo "-- 1. synthesise it: tiny preset, seed 0"
"$bin/kiln-gguf" synth "$work/glm5-tiny.gguf" --preset tiny --seed 0
echo
# The CUDA backend when a GPU is visible and the plugin was built; the CPU
# reference backend otherwise. Either way the run says which it used.
target=cpu
why="no NVIDIA GPU visible"
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  if [ -f "${KILN_BUILD_DIR:-build}/lib/libkiln-backend-cuda.so" ]; then
    target=cuda
  else
    why="a GPU is visible but the CUDA plugin was not built (no nvcc)"
  fi
fi
echo "-- 2. compile it for the $target backend and run it: a text prompt, 32 tokens generated (greedy)"
[ "$target" = cpu ] && echo "   ($why: the CPU reference backend runs it)"
"$bin/kiln-compile" "$work/glm5-tiny.gguf" --target=$target --context 64 -o "$work/glm5-tiny.kiln"
echo "   artifact: $work/glm5-tiny.kiln ($(stat -c %s "$work/glm5-tiny.kiln") bytes)"
echo "   prompt: \"Kiln compiles GLM-5.\" (encoded with the file's own tokenizer)"
"$bin/kiln-run" "$work/glm5-tiny.kiln" --weights "$work/glm5-tiny.gguf" \
  --prompt "Kiln compiles GLM-5." -n 32 | sed 's/^/   /'
echo "   (backend: $target; random weights, so the text is noise)"
echo
echo "-- 2b. chat: two user turns through the file's chat template (kiln-run --chat; the second turn reuses the cached first)"
printf 'Hello, Kiln.\nWhat did I just say?\n' | \
  "$bin/kiln-run" "$work/glm5-tiny.kiln" --weights "$work/glm5-tiny.gguf" --chat -n 16 2>&1 | sed 's/^/   /'
echo "   (kiln-serve serves the same artifact over an OpenAI-compatible HTTP API: docs/serving.md)"
echo
echo "What happened in between, stage by stage:"
echo
echo "-- 3. inspect it (metadata and tensor table; reads only the header)"
"$bin/kiln-gguf" info "$work/glm5-tiny.gguf" | sed -n '1,4p;/^tensors/,/blk.0.attn_output/p'
echo "   ..."
echo
echo "-- 4. validate every structure rule and every block's scales"
"$bin/kiln-gguf" check "$work/glm5-tiny.gguf"
echo
echo "-- 5. dequantise one routed-expert tensor (Q4_K) to float32"
"$bin/kiln-gguf" dequant "$work/glm5-tiny.gguf" --tensor blk.1.ffn_up_exps.weight \
  -o "$work/ffn_up_exps.f32"
python3 - "$work/ffn_up_exps.f32" <<'PY'
import array, math, sys
v = array.array("f"); v.frombytes(open(sys.argv[1], "rb").read())
mean = sum(v) / len(v); std = math.sqrt(sum((x - mean) ** 2 for x in v) / len(v))
print(f"   {len(v)} values, mean {mean:+.4f}, std {std:.4f} (drawn as N(0, 1/256): std 0.0625)")
PY
echo
echo "-- 6. compile it to the kiln program (the decode step; metadata only) and verify it"
"$bin/kiln-compile" "$work/glm5-tiny.gguf" -o "$work/glm5-tiny.mlir"
"$bin/kiln-opt" "$work/glm5-tiny.mlir" -o /dev/null
echo "   $(grep -c 'kiln.layer ' "$work/glm5-tiny.mlir") layers, $(grep -c 'kiln.weight' "$work/glm5-tiny.mlir") weights bound by name, program verified; layer 1 starts:"
excerpt '/kiln.layer 1 /,/kiln.linear/p' "$work/glm5-tiny.mlir"
echo
echo "-- 7. lower it to the step dialect: buffers, declared effects, one planned arena, capture verified"
"$bin/kiln-compile" "$work/glm5-tiny.gguf" --emit=step --report -o "$work/glm5-tiny.step.mlir"
"$bin/kiln-opt" --kiln-verify-capture "$work/glm5-tiny.step.mlir" -o /dev/null
echo "   layer 0 starts: its norm and every projection of its input in one op (q_a, kv_a and the indexer's)"
excerpt '/%blk.0.attn_norm = step.weight/,/step.rms_norm_linear/p' "$work/glm5-tiny.step.mlir"
echo
echo "-- 7b. partition it for two GPUs (--tp 2): each rank's slices, its collectives fused with the add and norm"
"$bin/kiln-compile" "$work/glm5-tiny.gguf" --emit=step --tp 2 --report \
  -o "$work/glm5-tiny.tp2.step.mlir" 2>&1 |
  grep -E '^step|per step|fused with|bytes per|weight bytes'
echo
echo "-- 8. a shape error caught by the op verifiers:"
if "$bin/kiln-opt" --mlir-print-op-on-diagnostic=false models/glm5/examples/bad-norm.mlir 2>&1; then
  echo "demo: error: kiln-opt accepted an ill-formed program" >&2
  exit 1
fi
echo "(kiln-opt rejected it with the message above, as it should)"
echo
echo "-- 9. the field bug (a kernel updating its input in place, undeclared) caught before capture:"
if "$bin/kiln-opt" --allow-unregistered-dialect --mlir-print-op-on-diagnostic=false --kiln-verify-capture models/glm5/examples/undeclared-in-place.mlir -o /dev/null 2>&1; then
  echo "demo: error: the capture verifier accepted an undeclared in-place write" >&2
  exit 1
fi
echo "(the capture verifier rejected it, as it should)"
echo
echo "What works now and what is next: README.md's status table; the GPU figures: docs/perf.md."
