#!/usr/bin/env bash
# Packs what the GPU checks and benchmarks need onto a GPU host that has no
# MLIR and no FlatBuffers: the runtime and both backend plugins built here,
# the GPU tools and the artifacts, compiled here from each model's tensor
# table (--metadata-only). The GPU host synthesises the weights with the
# packed kiln-gguf, bit for bit the same (each tensor's bytes depend only on
# the seed, its name and its type; test/python/test_cuda_backend.py holds
# the same synth arguments), so the pack stays small enough to carry.
#
#   utils/gpu-pack.sh [PACK_DIR]      (default: gpu-pack)
#
# Then on the GPU host: utils/gpu-test.sh (it finds gpu-pack/).
# KILN_PACK_ARCH=sm_XX: the GPU host's architecture (default sm_90).
# KILN_PACK_TPS="2 4 8": the small models' tensor-parallel artifacts
# besides tp=1 (default 2).
# KILN_PACK_BENCH=1: only what utils/gpu-ab.sh needs to bench GLM-5's tp=8
# rank (kiln-run, the plugins, glm5.cuda.tp8.kiln and glm5-16k.cuda.tp8.kiln):
# a second pack small enough to carry beside a whole one, for an A/B of two
# builds whose artifacts differ (another compiler pass, say).
# KILN_PACK_COMPILE="FLAGS": more kiln-compile flags for those two bench
# artifacts (an A/B of a compiler switch: --fuse-shared-expert=false, say).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${KILN_BUILD_DIR:-build}
pack=${1:-gpu-pack}
bin=$build/bin

for f in kiln-run kiln-serve kiln-gguf kiln-compile kiln-bandwidth kiln-cuda-matvec kiln-cuda-ops kiln-allreduce; do
  [ -x "$bin/$f" ] || { echo "gpu-pack: error: $bin/$f is not built (utils/build.sh with CUDA)" >&2; exit 1; }
done
for f in libkiln-backend-cpu.so libkiln-backend-cuda.so; do
  [ -f "$build/lib/$f" ] || { echo "gpu-pack: error: $build/lib/$f is not built" >&2; exit 1; }
done

bench_only=${KILN_PACK_BENCH:-0}
case $bench_only in 0|1) ;; *) echo "gpu-pack: error: KILN_PACK_BENCH=$bench_only: expected 0 or 1" >&2; exit 1 ;; esac

rm -rf "$pack"
mkdir -p "$pack/bin" "$pack/lib" "$pack/models"
if [ "$bench_only" = 1 ]; then
  cp "$bin/kiln-run" "$pack/bin/"
else
  cp "$bin"/{kiln-run,kiln-serve,kiln-gguf,kiln-bandwidth,kiln-cuda-matvec,kiln-cuda-ops,kiln-allreduce} "$pack/bin/"
fi
cp "$build"/lib/libkiln-backend-{cpu,cuda}.so "$pack/lib/"
# The shared libraries the binaries need that a GPU host without this
# machine's packages may lack: fmt (every tool), cpp-httplib and brotli
# (kiln-serve). glibc, libstdc++, OpenSSL and zlib are the host's own.
for lib in $(ldd "$bin/kiln-run" "$bin/kiln-serve" |
             awk '/libfmt|libcpp-httplib|libbrotli/ {print $3}' | sort -u); do
  cp "$lib" "$pack/lib/"
done

m=$pack/models
# The artifacts carry the kernel images of the architectures they are
# compiled for: only the GPU host's, to keep the pack small.
pack_arch=${KILN_PACK_ARCH:-sm_90}
# The tensor-parallel widths of the small models' artifacts (tp=1 always):
# KILN_PACK_TPS="2 4 8" for a host with eight GPUs.
pack_tps="1 ${KILN_PACK_TPS:-2}"
synth() { "$bin/kiln-gguf" synth "$@" --quiet; }
compile() { "$bin/kiln-compile" "$@" 2>/dev/null; }

# GLM-5's tp=8 rank as the benches of utils/gpu-ab.sh run it (the same
# commands as below).
read -r -a bench_flags <<<"${KILN_PACK_COMPILE:-}"
glm5_bench_artifacts() {
  compile "$m/glm5-meta.gguf" --target=cuda:$pack_arch --tp 8 --no-logits --context 2048 \
    ${bench_flags[@]+"${bench_flags[@]}"} -o "$m/glm5.cuda.tp8.kiln"
  compile "$m/glm5-meta.gguf" --target=cuda:$pack_arch --tp 8 --no-logits --context 16640 \
    ${bench_flags[@]+"${bench_flags[@]}"} -o "$m/glm5-16k.cuda.tp8.kiln"
}
if [ "$bench_only" = 1 ]; then
  synth "$m/glm5-meta.gguf" --preset glm5 --metadata-only
  glm5_bench_artifacts
  rm -f "$m/glm5-meta.gguf"
  du -sh "$pack"
  echo "gpu-pack: $pack ready (benches only); on the GPU host run utils/gpu-ab.sh"
  exit 0
fi

# tiny, f32 weights and caches: the tightest comparison (seed 4, as the CPU
# tests' greedy case); tiny mix with f16 caches (seed 6); small (GLM-5's head
# geometry, the UD-Q4_K_XL-like mix, 590 MB), f32 caches (seed 2).
model() { # NAME CACHE-TYPE SYNTH-ARGS...
  local name=$1 cache=$2; shift 2
  synth "$m/$name-meta.gguf" "$@" --metadata-only
  for target in cpu cuda; do
    for tp in $pack_tps; do
      t=$target; [ "$target" = cuda ] && t=cuda:$pack_arch
      compile "$m/$name-meta.gguf" --target=$t --tp $tp --context 64 \
        --cache-type "$cache" -o "$m/$name.$target.tp$tp.kiln"
      # With attn_q_b's slices copied out after its mat-vec
      # (--split-projections=false), for the check that its rows cut per
      # slice give the same bits.
      if [ "$target" = cuda ] && [ "$tp" = 1 ]; then
        compile "$m/$name-meta.gguf" --target=$t --tp 1 --context 64 \
          --cache-type "$cache" --split-projections=false \
          -o "$m/$name.cuda-sliced.tp1.kiln"
      fi
      # With the router folded into the attention's all-reduce
      # (--fold-router: only where there is one, tp > 1), for the tp=N on N
      # GPUs checks.
      # And through the composed weight (--fold-router=composed: the
      # logits' share as rows of attn_output's launch).
      if [ "$target" = cuda ] && [ "$tp" -gt 1 ]; then
        compile "$m/$name-meta.gguf" --target=$t --tp $tp --context 64 \
          --cache-type "$cache" --fold-router -o "$m/$name.cuda-fold.tp$tp.kiln"
        compile "$m/$name-meta.gguf" --target=$t --tp $tp --context 64 \
          --cache-type "$cache" --fold-router=composed \
          -o "$m/$name.cuda-composed.tp$tp.kiln"
        # And with the norms after the collectives inside q_a's mat-vec
        # and the router, the collectives taking the residual add alone
        # (--projection-norms), on the model whose q_a runs are Q8_0 alone
        # (its indexers left out at 64 positions).
        if [ "$name" = tiny-mix ]; then
          compile "$m/$name-meta.gguf" --target=$t --tp $tp --context 64 \
            --cache-type "$cache" --projection-norms \
            -o "$m/$name.cuda-projnorm.tp$tp.kiln"
        fi
        # And with the choice inside the all-reduce (--fuse-router-choice),
        # on the two models the test runs it on.
        if [ "$name" = tiny-f32 ] || [ "$name" = small ]; then
          compile "$m/$name-meta.gguf" --target=$t --tp $tp --context 64 \
            --cache-type "$cache" --fold-router=composed --fuse-router-choice \
            -o "$m/$name.cuda-composed-choice.tp$tp.kiln"
        fi
      fi
    done
  done
  rm -f "$m/$name-meta.gguf"
}
model tiny-f32 f32 --preset tiny --seed 4 --mix f32 --indexer-top-k 8
# The architecture guard: artifacts for one architecture each (the test
# runs the one the GPU is not).
synth "$m/arch-meta.gguf" --preset tiny --seed 4 --mix f32 --indexer-top-k 8 --metadata-only
for arch in sm_90 sm_100 sm_120; do
  compile "$m/arch-meta.gguf" --target=cuda:$arch --context 64 --cache-type f32 \
    -o "$m/tiny-f32.cuda-$arch.tp1.kiln"
done
rm -f "$m/arch-meta.gguf"
model tiny-mix f16 --preset tiny --seed 6 --indexer-top-k 64
model small f32 --preset small --seed 2 --indexer-top-k 4
# Small with 256-wide experts (and shared expert): the width at which the
# CUDA backend runs the shared expert inside the routed experts' Q4_K / Q5_K
# kernels (GLM-5's at tp=8; the models above run it as its own launches).
# test_cuda_backend.py's SHARED_MODELS and LOW_BIT_MODELS hold the same
# synth arguments.
single() { # NAME SYNTH-ARGS...: tp=1 artifacts, CPU and CUDA, f32 caches
  local name=$1; shift
  synth "$m/$name-meta.gguf" "$@" --metadata-only
  for target in cpu cuda; do
    t=$target; [ "$target" = cuda ] && t=cuda:$pack_arch
    compile "$m/$name-meta.gguf" --target=$t --context 64 --cache-type f32 \
      -o "$m/$name.$target.tp1.kiln"
  done
  rm -f "$m/$name-meta.gguf"
}
single small-ff256 --preset small --seed 3 --indexer-top-k 4 --expert-ff 256
# Small with f16 caches at tp=2: 8 heads a rank over 512 + 64 latent values,
# the shape whose MLA runs on the tensor cores (GLM-5's rank at tp=8); the
# indexers' top-k takes every position, so MLA attends them all (its rows
# loaded before its wait) and no f16 rounding can swap a DSA choice.
synth "$m/small-f16-meta.gguf" --preset small --seed 7 --indexer-top-k 64 --metadata-only
compile "$m/small-f16-meta.gguf" --target=cpu --context 64 --cache-type f16 \
  -o "$m/small-f16.cpu.tp1.kiln"
compile "$m/small-f16-meta.gguf" --target=cuda:$pack_arch --tp 2 --context 64 \
  --cache-type f16 -o "$m/small-f16.cuda.tp2.kiln"
rm -f "$m/small-f16-meta.gguf"
# Small in the 2-bit mix: Q2_K / Q3_K routed experts.
single small-q2 --preset small --seed 5 --indexer-top-k 4 --mix ud-q2_k_xl
# A tiny model of GLM-5's vocabulary size (154,880 tokens), for the host's
# part of a sampled or constrained token (utils/gpu-test.sh's host-sampling
# step synthesises its weights with the same arguments).
synth "$m/vocab-meta.gguf" --preset tiny --vocab 154880 --seed 23 --metadata-only
compile "$m/vocab-meta.gguf" --target=cuda:$pack_arch --context 256 \
  -o "$m/tiny-vocab.cuda.tp1.kiln"
# With the eight sampling words (--adjustments=0): penalties on the host.
compile "$m/vocab-meta.gguf" --target=cuda:$pack_arch --context 256 \
  --adjustments=0 -o "$m/tiny-vocab-eight-words.cuda.tp1.kiln"
rm -f "$m/vocab-meta.gguf"

# GLM-5 at full width (78 layers, UD-Q4_K_XL-like mix) for benchmarks on
# random weights: tp=8 (one rank simulated on one GPU) and, on two GPUs,
# tp=2 with 40 of the 78 layers (106.6 GiB of weights per GPU).
synth "$m/glm5-meta.gguf" --preset glm5 --metadata-only
# The rank with room for 2k positions, and with room for 16k (the indexer
# then selects 2,048 of them).
glm5_bench_artifacts
# With the shared expert's own ops (--fuse-shared-expert=false: its gate/up
# and down kernels beside the router, as before it moved inside the routed
# experts' kernels), for its bench row.
compile "$m/glm5-meta.gguf" --target=cuda:$pack_arch --tp 8 --no-logits --context 2048 \
  --fuse-shared-expert=false -o "$m/glm5-apart.cuda.tp8.kiln"
# With the eight sampling words (--adjustments=0: no adjustment kernel
# ahead of the argmax), for the bench row that prices the default's.
compile "$m/glm5-meta.gguf" --target=cuda:$pack_arch --tp 8 --no-logits --context 2048 \
  --adjustments=0 -o "$m/glm5-eight-words.cuda.tp8.kiln"
# With the norms after the collectives in q_a's mat-vec and the router,
# not in the collectives (--projection-norms, off by default until
# measured), for its bench row.
compile "$m/glm5-meta.gguf" --target=cuda:$pack_arch --tp 8 --no-logits --context 2048 \
  --projection-norms -o "$m/glm5-projection-norms.cuda.tp8.kiln"
# With the router folded into the attention's all-reduce (--fold-router,
# off by default: measured slower), for its bench row.
compile "$m/glm5-meta.gguf" --target=cuda:$pack_arch --tp 8 --no-logits --context 2048 \
  --fold-router -o "$m/glm5-fold.cuda.tp8.kiln"
# The same through the composed weight (--fold-router=composed).
compile "$m/glm5-meta.gguf" --target=cuda:$pack_arch --tp 8 --no-logits --context 2048 \
  --fold-router=composed -o "$m/glm5-composed.cuda.tp8.kiln"
# And with the router's choice inside the all-reduce (--fuse-router-choice).
compile "$m/glm5-meta.gguf" --target=cuda:$pack_arch --tp 8 --no-logits --context 2048 \
  --fold-router=composed --fuse-router-choice -o "$m/glm5-composed-choice.cuda.tp8.kiln"
# With its logits (gathered over the vocabulary), for comparing the bits of
# runs launched different ways (gpu-test.sh's same-result steps: the bench
# prints a digest of the logits); the timed benches leave them out.
compile "$m/glm5-meta.gguf" --target=cuda:$pack_arch --tp 8 --context 16640 \
  -o "$m/glm5-logits.cuda.tp8.kiln"
# And with the model's own context (202,752 positions): caches and MLA's
# scratch at their largest (MLA's shared memory then passes 48 KiB).
compile "$m/glm5-meta.gguf" --target=cuda:$pack_arch --tp 8 --no-logits \
  -o "$m/glm5-full.cuda.tp8.kiln"
# All 78 layers at tp=4 (108.8 GiB of weights per GPU), for a host with
# four GPUs, when the pack is asked for tp=4.
case " $pack_tps " in
  *" 4 "*)
    compile "$m/glm5-meta.gguf" --target=cuda:$pack_arch --tp 4 --no-logits --context 2048 \
      -o "$m/glm5.cuda.tp4.kiln"
    compile "$m/glm5-meta.gguf" --target=cuda:$pack_arch --tp 4 --no-logits --context 16640 \
      -o "$m/glm5-16k.cuda.tp4.kiln"
    ;;
esac
rm -f "$m/glm5-meta.gguf"
# The 2-bit mix at full width (Q2_K / Q3_K routed experts), rank 0 of tp=8,
# for its bench row.
synth "$m/glm5-q2-meta.gguf" --preset glm5 --mix ud-q2_k_xl --metadata-only
compile "$m/glm5-q2-meta.gguf" --target=cuda:$pack_arch --tp 8 --no-logits --context 2048 \
  -o "$m/glm5-q2.cuda.tp8.kiln"
rm -f "$m/glm5-q2-meta.gguf"
synth "$m/glm5-l40-meta.gguf" --preset glm5 --layers 40 --metadata-only
compile "$m/glm5-l40-meta.gguf" --target=cuda:$pack_arch --tp 2 --no-logits --context 2048 \
  -o "$m/glm5-l40.cuda.tp2.kiln"
rm -f "$m/glm5-l40-meta.gguf"

du -sh "$pack"
echo "gpu-pack: $pack ready; on the GPU host run utils/gpu-test.sh"
