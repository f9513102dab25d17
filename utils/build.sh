#!/usr/bin/env bash
# Configures (once) and builds Kiln into build/ with ninja.
# Extra arguments go to the first configure, e.g. -DKILN_ENABLE_CUDA=OFF.
# KILN_BUILD_DIR overrides the build folder.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${KILN_BUILD_DIR:-build}

if [ ! -f "$build/build.ninja" ]; then
  echo "build: configuring $build"
  args=(-G Ninja -S . -B "$build" -DCMAKE_BUILD_TYPE=Release)
  if [ -d /usr/lib/llvm-22/lib/cmake/mlir ]; then
    args+=(-DMLIR_DIR=/usr/lib/llvm-22/lib/cmake/mlir
           -DLLVM_EXTERNAL_LIT=/usr/lib/llvm-22/bin/lit)
  fi
  cmake "${args[@]}" "$@"
fi
echo "build: building $build"
cmake --build "$build"
