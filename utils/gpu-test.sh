#!/usr/bin/env bash
# Runs Kiln's GPU work on a machine with an NVIDIA GPU: builds the MLIR-free
# half there (no MLIR needed; fmt from the system or, header-only, from
# KILN_FMT_INCLUDE_DIR), then runs the GPU checks and probes. CI has no GPU and
# does not run this; utils/test.sh says so.
#
#   KILN_FMT_INCLUDE_DIR=DIR  folder holding fmt/ when no fmt package exists
#   KILN_CUDA_ARCH=90         architectures to build for (default: 90, H200)
#   KILN_GPU_BUILD_DIR=DIR    build folder (default: build-gpu)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${KILN_GPU_BUILD_DIR:-build-gpu}

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-test: error: no NVIDIA GPU visible (nvidia-smi -L failed)" >&2
  exit 1
fi
nvidia-smi -L

if [ ! -f "$build/build.ninja" ]; then
  echo "gpu-test: configuring $build (MLIR-free)"
  cmake -G Ninja -S . -B "$build" -DCMAKE_BUILD_TYPE=Release \
    -DKILN_BUILD_COMPILER=OFF -DKILN_ENABLE_CUDA=ON \
    -DKILN_CUDA_ARCHITECTURES="${KILN_CUDA_ARCH:-90}" \
    ${KILN_FMT_INCLUDE_DIR:+-DKILN_FMT_INCLUDE_DIR="$KILN_FMT_INCLUDE_DIR"}
fi
echo "gpu-test: building $build"
cmake --build "$build"

echo
echo "== device copy bandwidth (the roofline's denominator)"
"$build/bin/kiln-bandwidth"

echo
echo "== quantised mat-vec: device layout bit-exact, products checked, then timed"
"$build/bin/kiln-cuda-matvec"
