#!/usr/bin/env bash
# Runs Kiln's GPU tests and benchmarks on a machine with NVIDIA GPUs and
# writes a results table. CI has no GPU and does not run this (utils/test.sh
# says so).
#
# With a pack from utils/gpu-pack.sh (binaries, plugins and artifacts built
# on a machine with MLIR and FlatBuffers) it runs everything:
#   1. device copy bandwidth (the roofline's denominator);
#   2. quantised mat-vec: device layouts bit-exact, products checked, timed;
#   3. every step kernel against the CPU reference (kiln-cuda-ops), and the
#      kernel table at GLM-5 tp=8 shapes (kiln-cuda-ops --bench);
#   4. the CUDA backend against the CPU backend, graph vs eager, tp=2 vs
#      tp=1, compute-sanitizer (test/python/test_cuda_backend.py);
#   5. benchmarks on random weights: GLM-5 rank 0 of tp=8 alone on one GPU
#      (graph and eager, context 1024, the 2-bit mix at 1024 too; graph at
#      4,096, 16,384, 32,768,
#      131,072 and 202,000 positions; the step
#      without each op kind; its critical path by op kind where CUPTI is
#      installed), in-graph all-reduce latency, with two GPUs GLM-5
#      (40 layers) at tp=2, with four all 78 layers at tp=4 (a pack made with
#      KILN_PACK_TPS="2 4"), and with eight GLM-5 at tp=8 (1k and 16k, graph
#      and eager, and without NCCL for the collectives' share).
# Without a pack it builds the MLIR-free half here and runs 1-3.
#
#   KILN_GPU_PACK=DIR        the pack (default: gpu-pack)
#   KILN_GPU_RESULTS=DIR     where the results go (default: gpu-results)
#   KILN_FMT_INCLUDE_DIR=DIR folder holding fmt/ when no fmt package exists
#   KILN_CUDA_ARCH=90        architectures to build for (default: 90, H200)
#   KILN_GPU_BUILD_DIR=DIR   build folder without a pack (default: build-gpu)
#   KILN_GPU_ONLY="A B"      run only the named steps (e.g. "ops backend")
set -uo pipefail
cd "$(dirname "$0")/.."
pack=${KILN_GPU_PACK:-gpu-pack}
results=${KILN_GPU_RESULTS:-gpu-results}
mkdir -p "$results"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-test: error: no NVIDIA GPU visible (nvidia-smi -L failed)" >&2
  exit 1
fi
nvidia-smi -L
gpus=$(nvidia-smi -L | grep -c '^GPU ')

if [ -x "$pack/bin/kiln-run" ]; then
  bin=$pack/bin
  export LD_LIBRARY_PATH="$PWD/$pack/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  build=${KILN_GPU_BUILD_DIR:-build-gpu}
  if [ ! -f "$build/build.ninja" ]; then
    echo "gpu-test: no pack at $pack; configuring $build (MLIR-free)"
    cmake -G Ninja -S . -B "$build" -DCMAKE_BUILD_TYPE=Release \
      -DKILN_BUILD_COMPILER=OFF -DKILN_ENABLE_CUDA=ON \
      -DKILN_CUDA_ARCHITECTURES="${KILN_CUDA_ARCH:-90}" \
      ${KILN_FMT_INCLUDE_DIR:+-DKILN_FMT_INCLUDE_DIR="$KILN_FMT_INCLUDE_DIR"} || exit 1
  fi
  echo "gpu-test: building $build"
  cmake --build "$build" || exit 1
  bin=$build/bin
fi

failed=()
step() { # NAME COMMAND...: runs, tees into the results, records a failure
  local name=$1; shift
  if [ -n "${KILN_GPU_ONLY:-}" ] && [[ " $KILN_GPU_ONLY " != *" $name "* ]]; then
    return 0
  fi
  echo; echo "== $name"
  "$@" 2>&1 | tee "$results/$name.txt"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || failed+=("$name (exit $rc)")
}

step bandwidth "$bin/kiln-bandwidth"
step matvec "$bin/kiln-cuda-matvec"
[ -x "$bin/kiln-cuda-ops" ] && step ops "$bin/kiln-cuda-ops"
# The kernel table at GLM-5 tp=8 shapes (docs/perf.md).
[ -x "$bin/kiln-cuda-ops" ] && step ops-bench "$bin/kiln-cuda-ops" --bench
# A chain of dependent mat-vecs as kernels and as one persistent kernel
# (docs/perf.md, thirteenth pass).
[ -x "$bin/kiln-cuda-ops" ] && step chain-bench "$bin/kiln-cuda-ops" --bench-chain
# The router's choice as its own kernel and inside the all-reduce, alone
# (docs/perf.md, twenty-second pass).
[ -x "$bin/kiln-cuda-ops" ] && step choice-bench "$bin/kiln-cuda-ops" --bench-choice

if [ -x "$pack/bin/kiln-run" ]; then
  m=$pack/models
  step backend python3 test/python/test_cuda_backend.py --pack "$pack" \
    --table "$results/backend-table.md"
  run() { "$bin/kiln-run" "$@" --backend-dir "$pack/lib"; }
  # With the captured graph's node and edge counts (KILN_CUDA_GRAPH_STATS).
  step bench-glm5-tp8-rank0-graph env KILN_CUDA_GRAPH_STATS=1 \
    "$bin/kiln-run" "$m/glm5.cuda.tp8.kiln" --backend-dir "$pack/lib" \
    --bench --simulate-rank 0/8 --context 1024 --steps 30
  # The same step drawing its token at T = 0.8 (the argmax of DrawKey.h's
  # keys over the rank's 19,360 logits, in the graph): the draw's cost.
  step bench-glm5-tp8-rank0-graph-drawn run "$m/glm5.cuda.tp8.kiln" --bench \
    --simulate-rank 0/8 --context 1024 --steps 30 --temperature 0.8 --seed 5
  # GLM's default sampling, T = 1 with top-p 0.95: the nucleus's graph
  # (the whole vocabulary gathered, here this rank's part in every rank's
  # place, then the grid's cut and draw over 154,880 logits).
  step bench-glm5-tp8-rank0-graph-nucleus run "$m/glm5.cuda.tp8.kiln" \
    --bench --simulate-rank 0/8 --context 1024 --steps 30 --temperature 1 \
    --top-p 0.95 --seed 5
  # Penalties and a bias under GLM's default sampling: the step's
  # adjustments over the tokens the steps drew, their slot written each step.
  step bench-glm5-tp8-rank0-graph-penalised run "$m/glm5.cuda.tp8.kiln" \
    --bench --simulate-rank 0/8 --context 1024 --steps 30 --temperature 1 \
    --top-p 0.95 --seed 5 --repeat-penalty 1.1 --frequency-penalty 0.5 \
    --presence-penalty 0.3 --logit-bias 7=2
  # A client's common mix, top-k 40 under top-p 0.95: the grid's three
  # passes of counts before the nucleus's.
  step bench-glm5-tp8-rank0-graph-topk run "$m/glm5.cuda.tp8.kiln" \
    --bench --simulate-rank 0/8 --context 1024 --steps 30 --temperature 1 \
    --top-k 40 --top-p 0.95 --seed 5
  # The first tokens of a context: MLA's blocks wait for each other there
  # with little work each (docs/perf.md, seventh pass).
  step bench-glm5-tp8-rank0-graph-64 run "$m/glm5.cuda.tp8.kiln" --bench \
    --simulate-rank 0/8 --context 64 --steps 30
  # The 2-bit mix (Q2_K / Q3_K routed experts, dotted from the file's
  # blocks) at 1k: its floor is lower, its experts' kernels the general ones.
  [ -f "$m/glm5-q2.cuda.tp8.kiln" ] && step bench-glm5-q2-tp8-rank0-graph \
    run "$m/glm5-q2.cuda.tp8.kiln" --bench --simulate-rank 0/8 --context 1024 \
    --steps 30
  step bench-glm5-tp8-rank0-graph-4k run "$m/glm5-16k.cuda.tp8.kiln" --bench \
    --simulate-rank 0/8 --context 4096 --steps 20
  step bench-glm5-tp8-rank0-graph-16k run "$m/glm5-16k.cuda.tp8.kiln" --bench \
    --simulate-rank 0/8 --context 16384 --steps 20
  # The model's whole context allocated (202,752 positions), 1,024 filled.
  step bench-glm5-tp8-rank0-graph-fullctx run "$m/glm5-full.cuda.tp8.kiln" \
    --bench --simulate-rank 0/8 --context 1024 --steps 10
  # Long contexts in the same allocation: the indexer scans every key, its
  # selection grows with them, attention reads 2,048 positions.
  for long in 32768 131072 202000; do
    step bench-glm5-tp8-rank0-graph-ctx$long run "$m/glm5-full.cuda.tp8.kiln" \
      --bench --simulate-rank 0/8 --context $long --steps 10
  done
  # From 98,304 attended positions the default replays a second graph (the
  # selection by 16 blocks), which replays slower than the same kernels as
  # the only graph (docs/perf.md, thirty-second pass): that one graph.
  for long in 131072 202000; do
    step bench-glm5-tp8-rank0-graph-ctx$long-one16 env KILN_CUDA_SELECT_BLOCKS=16 \
      "$bin/kiln-run" "$m/glm5-full.cuda.tp8.kiln" --backend-dir "$pack/lib" \
      --bench --simulate-rank 0/8 --context $long --steps 10
  done
  # What the graph's parallel branches and overlapped launches each buy
  # (docs/cuda.md): the same step with one of them off.
  step bench-glm5-tp8-rank0-graph-serial env KILN_CUDA_BRANCHES=1 \
    "$bin/kiln-run" "$m/glm5.cuda.tp8.kiln" --backend-dir "$pack/lib" \
    --bench --simulate-rank 0/8 --context 1024 --steps 30
  step bench-glm5-tp8-rank0-graph-nopdl env KILN_CUDA_PDL=0 \
    "$bin/kiln-run" "$m/glm5.cuda.tp8.kiln" --backend-dir "$pack/lib" \
    --bench --simulate-rank 0/8 --context 1024 --steps 30
  step bench-glm5-tp8-rank0-eager run "$m/glm5.cuda.tp8.kiln" --bench \
    --simulate-rank 0/8 --context 1024 --steps 10 --eager
  # The all-reduces' local stand-in for NCCL's (a ring-traffic kernel, then
  # the add and norm) instead of the one-shot kernel's (its own part read
  # once per rank, added and normalised).
  step bench-glm5-tp8-rank0-graph-nccl env KILN_CUDA_ALLREDUCE=nccl \
    "$bin/kiln-run" "$m/glm5.cuda.tp8.kiln" --backend-dir "$pack/lib" \
    --bench --simulate-rank 0/8 --context 1024 --steps 30
  # One graph for a DSA step (KILN_CUDA_SHORT_GRAPH=0): at 1k the rank with
  # room for the model's whole context then runs its indexers; by default it
  # replays a second graph without them (docs/cuda.md). (The 2k rank has no
  # indexers: the compiler leaves them out.)
  step bench-glm5-tp8-rank0-graph-fullctx-onegraph env KILN_CUDA_SHORT_GRAPH=0 \
    "$bin/kiln-run" "$m/glm5-full.cuda.tp8.kiln" --backend-dir "$pack/lib" \
    --bench --simulate-rank 0/8 --context 1024 --steps 10
  # The shared expert's own ops beside the router (kiln-compile
  # --fuse-shared-expert=false; by default it runs inside the routed
  # experts' kernels: docs/perf.md), at 1k.
  step bench-glm5-tp8-rank0-graph-apart run "$m/glm5-apart.cuda.tp8.kiln" \
    --bench --simulate-rank 0/8 --context 1024 --steps 30
  # The eight sampling words (kiln-compile --adjustments=0): no adjustment
  # kernel ahead of the argmax, which the default runs every step.
  step bench-glm5-tp8-rank0-graph-eight-words \
    run "$m/glm5-eight-words.cuda.tp8.kiln" \
    --bench --simulate-rank 0/8 --context 1024 --steps 30
  # The norms after the collectives in q_a's mat-vec and the router, not
  # in the collectives (kiln-compile --projection-norms, off by default
  # until measured: docs/perf.md, thirty-seventh pass), at 1k.
  step bench-glm5-tp8-rank0-graph-projection-norms \
    run "$m/glm5-projection-norms.cuda.tp8.kiln" \
    --bench --simulate-rank 0/8 --context 1024 --steps 30
  # The all-reduces as before the forty-second pass: their inputs copied
  # into the exchange (KILN_CUDA_DIRECT_SLOTS=0) and summed by one cluster
  # (KILN_CUDA_PEER_CLUSTER=1), and the cluster alone with direct slots;
  # the default writes them straight into the exchange and sums them by
  # blocks that are not a cluster (docs/perf.md, forty-first pass), at 1k.
  step bench-glm5-tp8-rank0-graph-copied-peer-cluster \
    env KILN_CUDA_DIRECT_SLOTS=0 KILN_CUDA_PEER_CLUSTER=1 \
    "$bin/kiln-run" "$m/glm5.cuda.tp8.kiln" --backend-dir "$pack/lib" \
    --bench --simulate-rank 0/8 --context 1024 --steps 30
  step bench-glm5-tp8-rank0-graph-peer-cluster env KILN_CUDA_PEER_CLUSTER=1 \
    "$bin/kiln-run" "$m/glm5.cuda.tp8.kiln" --backend-dir "$pack/lib" \
    --bench --simulate-rank 0/8 --context 1024 --steps 30
  # A timing probe: the routed experts' gate/up input rounded to an int8
  # grid and dotted by dp4a (KILN_CUDA_EXPERTS_INT8_X=1; its results are
  # not the CPU's: docs/perf.md, fortieth pass), at 1k and 16k.
  step bench-glm5-tp8-rank0-graph-experts-int8x env KILN_CUDA_EXPERTS_INT8_X=1 \
    "$bin/kiln-run" "$m/glm5.cuda.tp8.kiln" --backend-dir "$pack/lib" \
    --bench --simulate-rank 0/8 --context 1024 --steps 30
  step bench-glm5-tp8-rank0-graph-16k-experts-int8x \
    env KILN_CUDA_EXPERTS_INT8_X=1 \
    "$bin/kiln-run" "$m/glm5-16k.cuda.tp8.kiln" --backend-dir "$pack/lib" \
    --bench --simulate-rank 0/8 --context 16384 --steps 20
  # The router folded into the attention's all-reduce (kiln-compile
  # --fold-router, off by default: docs/perf.md, nineteenth pass), at 1k.
  step bench-glm5-tp8-rank0-graph-fold run "$m/glm5-fold.cuda.tp8.kiln" \
    --bench --simulate-rank 0/8 --context 1024 --steps 30
  # The same through the composed weight (kiln-compile
  # --fold-router=composed: the share of the logits as rows of attn_output's
  # launch), at 1k.
  step bench-glm5-tp8-rank0-graph-composed run "$m/glm5-composed.cuda.tp8.kiln" \
    --bench --simulate-rank 0/8 --context 1024 --steps 30
  # And with the router's choice inside the all-reduce (kiln-compile
  # --fuse-router-choice, off by default: docs/perf.md, twentieth pass).
  step bench-glm5-tp8-rank0-graph-composed-choice run "$m/glm5-composed-choice.cuda.tp8.kiln" \
    --bench --simulate-rank 0/8 --context 1024 --steps 30
  # attn_v_b combined and projected by MLA's launch (off by default:
  # docs/perf.md, twenty-eighth pass), at 1k and at 16k.
  step bench-glm5-tp8-rank0-graph-mlaproj env KILN_CUDA_MLA_PROJECTION=1 \
    "$bin/kiln-run" "$m/glm5.cuda.tp8.kiln" --backend-dir "$pack/lib" \
    --bench --simulate-rank 0/8 --context 1024 --steps 30
  step bench-glm5-tp8-rank0-graph-16k-mlaproj env KILN_CUDA_MLA_PROJECTION=1 \
    "$bin/kiln-run" "$m/glm5-16k.cuda.tp8.kiln" --backend-dir "$pack/lib" \
    --bench --simulate-rank 0/8 --context 16384 --steps 30
  # The kernels compiled for GLM-5's shapes: the default runs the experts',
  # MLA's, the router's and the all-reduce's (docs/cuda.md); here none (KILN_CUDA_SPECIALISED=0) at 1k and
  # 16k, and every family (=1) at 1k, with the count of such launches in
  # each graph.
  step bench-glm5-tp8-rank0-graph-general env KILN_CUDA_SPECIALISED=0 \
    KILN_CUDA_GRAPH_STATS=1 "$bin/kiln-run" "$m/glm5.cuda.tp8.kiln" \
    --backend-dir "$pack/lib" --bench --simulate-rank 0/8 --context 1024 \
    --steps 30
  step bench-glm5-tp8-rank0-graph-16k-general env KILN_CUDA_SPECIALISED=0 \
    "$bin/kiln-run" "$m/glm5-16k.cuda.tp8.kiln" --backend-dir "$pack/lib" \
    --bench --simulate-rank 0/8 --context 16384 --steps 20
  # The indexer's top-k as before the seventeenth pass (docs/perf.md): by
  # its cluster of blocks at every count, four radix passes always.
  step bench-glm5-tp8-rank0-graph-4k-cluster env KILN_CUDA_CLUSTER_SELECT=1 \
    "$bin/kiln-run" "$m/glm5-16k.cuda.tp8.kiln" --backend-dir "$pack/lib" \
    --bench --simulate-rank 0/8 --context 4096 --steps 20
  step bench-glm5-tp8-rank0-graph-16k-cluster env KILN_CUDA_CLUSTER_SELECT=1 \
    "$bin/kiln-run" "$m/glm5-16k.cuda.tp8.kiln" --backend-dir "$pack/lib" \
    --bench --simulate-rank 0/8 --context 16384 --steps 20
  # The indexer's scores without the tensor cores (the kernels by groups
  # of lanes), at 4k and 16k.
  step bench-glm5-tp8-rank0-graph-4k-no-mma env KILN_CUDA_INDEXER_MMA=0 \
    "$bin/kiln-run" "$m/glm5-16k.cuda.tp8.kiln" --backend-dir "$pack/lib" \
    --bench --simulate-rank 0/8 --context 4096 --steps 20
  step bench-glm5-tp8-rank0-graph-16k-no-mma env KILN_CUDA_INDEXER_MMA=0 \
    "$bin/kiln-run" "$m/glm5-16k.cuda.tp8.kiln" --backend-dir "$pack/lib" \
    --bench --simulate-rank 0/8 --context 16384 --steps 20
  step bench-glm5-tp8-rank0-graph-specialised-all env KILN_CUDA_SPECIALISED=1 \
    KILN_CUDA_GRAPH_STATS=1 "$bin/kiln-run" "$m/glm5.cuda.tp8.kiln" \
    --backend-dir "$pack/lib" --bench --simulate-rank 0/8 --context 1024 \
    --steps 30
  # The same bits however the step is launched, at GLM-5's real shapes: the
  # bench's result line (its token and a digest of its logits; the weights
  # and caches are seeded) for the rank's step as a graph, on one branch,
  # without programmatic launch, eagerly, with the early prefetch after
  # collectives, and with none and every family of the fixed-shape
  # kernels, at 1k; at 16k with none and every family, the indexer's
  # top-k as before the seventeenth pass and by a cluster of 16 blocks; at
  # 4k with the top-k as before too. A short run each.
  # A leading base:ENV=VALUE applies to every run, the default's included.
  same_result() { # CONTEXT [base:ENV=VALUE] [ENV=VALUE|--eager]...: each run's line, all equal
    local context=$1 first="" line variant base=()
    shift
    case ${1:-} in base:*) base=("${1#base:}"); shift ;; esac
    for variant in default "$@"; do
      local env_args=(${base[@]+"${base[@]}"}) flags=()
      case $variant in
        default) ;;
        --eager) flags=(--eager) ;;
        *) env_args+=("$variant") ;;
      esac
      line=$(env ${env_args[@]+"${env_args[@]}"} "$bin/kiln-run" \
               "$m/glm5-logits.cuda.tp8.kiln" --backend-dir "$pack/lib" \
               --bench --simulate-rank 0/8 --context "$context" --steps 2 \
               ${flags[@]+"${flags[@]}"} 2>&1 | grep '^result:') ||
        { echo "$variant: no result line"; return 1; }
      echo "$variant: $line"
      case $line in *"no logits"*) echo "$variant: no logits to compare"; return 1 ;; esac
      [ -n "$first" ] || first=$line
      [ "$line" = "$first" ] || { echo "$variant: differs from the default"; return 1; }
    done
  }
  # MLA on the tensor cores (the default for the rank's 8 heads) rounds
  # otherwise than the scalar kernels, so none of the fixed-shape kernels
  # (KILN_CUDA_SPECIALISED=0) is compared with the scalar MLA
  # (KILN_CUDA_MLA_MMA=0).
  step same-result-glm5-tp8-rank0 same_result 1024 KILN_CUDA_BRANCHES=1 \
    KILN_CUDA_PDL=0 --eager KILN_CUDA_QUIET_START=0 KILN_CUDA_QUIET_PREFETCH=0 \
    KILN_CUDA_SPECIALISED=1 KILN_CUDA_SHORT_GRAPH=0 KILN_CUDA_TAGGED_IDS=0 \
    KILN_CUDA_ROUTER_WARPS=0
  step same-result-glm5-tp8-rank0-scalar-mla same_result 1024 \
    base:KILN_CUDA_MLA_MMA=0 KILN_CUDA_SPECIALISED=0 KILN_CUDA_SPECIALISED=1 --eager
  step same-result-glm5-tp8-rank0-16k same_result 16384 \
    KILN_CUDA_SPECIALISED=1 KILN_CUDA_CLUSTER_SELECT=1 \
    KILN_CUDA_SELECT_BLOCKS=16 KILN_CUDA_SELECT_WIDE_FROM=8192 \
    KILN_CUDA_TAGGED_IDS=0 KILN_CUDA_ROUTER_WARPS=0
  step same-result-glm5-tp8-rank0-16k-scalar-mla same_result 16384 \
    base:KILN_CUDA_MLA_MMA=0 KILN_CUDA_SPECIALISED=0 KILN_CUDA_SPECIALISED=1
  step same-result-glm5-tp8-rank0-4k same_result 4096 \
    KILN_CUDA_CLUSTER_SELECT=1
  # What each op kind costs on the step's critical path: the step with
  # every op of that kind left out (KILN_CUDA_OMIT; results not valid).
  omit_table() {
    printf '| ops left out | step median (us) |\n|---|---|\n'
    # The op kinds of GLM-5's fused step. Not dsa_indexer or moe_router:
    # left out, their selection or ids are never written, and the step
    # stops at the fault its consumer then meets, so they measure nothing.
    for kinds in none rope slice norm_rope_append rms_norm_linear \
        fused_linear linear swiglu_linear mla_attention moe_experts \
        all_reduce_add_rms_norm; do
      local t out omit=$kinds
      [ "$kinds" = none ] && omit=
      out=$(KILN_CUDA_OMIT=$omit \
        "$bin/kiln-run" "$m/glm5.cuda.tp8.kiln" --backend-dir "$pack/lib" \
        --bench --simulate-rank 0/8 --context 1024 --steps 20 2>&1)
      t=$(sed -n 's/^step: median \([0-9.]*\) us.*/\1/p' <<<"$out")
      # A step that stops at a fault says which.
      [ -n "$t" ] || t="failed: $(grep -m1 'error' <<<"$out" | tr '|' '/' | cut -c1-160)"
      printf '| %s | %s |\n' "$kinds" "$t"
    done
  }
  step omit-glm5-tp8-rank0 omit_table
  # The host's part of a served token (docs/perf.md, forty-third pass): a
  # tiny model of GLM-5's vocabulary size, greedy and sampled, with and
  # without a JSON schema to constrain the reply (the sampler's order and
  # the constraint's masks run on the host).
  host_sampling() {
    local d case
    d=$(mktemp -d)
    "$bin/kiln-gguf" synth "$d/vocab.gguf" --preset tiny --vocab 154880 \
      --seed 23 --quiet || return 1
    cat > "$d/schema.json" <<'SCHEMA'
{"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 40},
  "age": {"type": "integer", "minimum": 0, "maximum": 150},
  "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}},
  "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]+$"}},
 "required": ["name", "age"], "additionalProperties": false}
SCHEMA
    echo "| reply (119 steps, tiny model of 154,880 tokens) | ms a step |"
    echo "|---|---|"
    for case in "greedy:" "greedy, json_schema:--json-schema $d/schema.json" \
        "sampled T=0.8, json_schema:--temperature 0.8 --seed 5 --json-schema $d/schema.json" \
        "sampled T=0.8 (drawn by the step):--temperature 0.8 --seed 5" \
        "sampled T=1, top-p 0.95 (the step's nucleus):--temperature 1 --top-p 0.95 --seed 5" \
        "sampled T=0.6, top-k 40 (the step's top-k):--temperature 0.6 --top-k 40 --seed 5" \
        "sampled T=0.8, frequency 0.5, presence 0.3, a bias (the step's adjustments):--temperature 0.8 --frequency-penalty 0.5 --presence-penalty 0.3 --logit-bias 7=2 --seed 5" \
        "the same on the host (--adjustments=0)@eight:--temperature 0.8 --frequency-penalty 0.5 --presence-penalty 0.3 --logit-bias 7=2 --seed 5"; do
      local art=tiny-vocab label=${case%%:*}
      if [[ $label == *@eight ]]; then art=tiny-vocab-eight-words; label=${label%@eight}; fi
      # shellcheck disable=SC2086
      run "$m/$art.cuda.tp1.kiln" --weights "$d/vocab.gguf" --prompt hi \
        -n 120 --json ${case#*:} | python3 -c "import json, sys
d = json.load(sys.stdin)
print('| %s | %.3f |' % (sys.argv[1], 1e3 * d['decode_seconds'] / d['decode_steps']))" \
        "$label" || { rm -rf "$d"; return 1; }
    done
    rm -rf "$d"
    # The sampler alone on this host's core (kiln-run --bench-sampler).
    # The second figure is the step's draw (DrawKey.h's keys and cuts)
    # made on the host, as for an artifact whose step does not draw it.
    echo "| sampler alone, 154,880 tokens N(0, 9) | ms a draw | the step's draw on the host |"
    echo "|---|---|---|"
    for case in "T=0.8:--temperature 0.8" \
        "T=1, top-p 0.95:--temperature 1 --top-p 0.95" \
        "T=0.6, top-k 40:--temperature 0.6 --top-k 40" \
        "T=1, min-p 0.05:--temperature 1 --min-p 0.05"; do
      # shellcheck disable=SC2086
      "$bin/kiln-run" --bench-sampler 154880 --steps 200 --json ${case#*:} |
        python3 -c "import json, sys
d = json.load(sys.stdin)
k = d['keys_ms_per_draw']
print('| %s | %.3f | %s |' % (sys.argv[1], d['ms_per_draw'], '-' if k is None else '%.3f' % k))" \
        "${case%%:*}" || return 1
    done
  }
  [ -f "$m/tiny-vocab.cuda.tp1.kiln" ] && step host-sampling host_sampling
  step profile-glm5-tp8-rank0 run "$m/glm5.cuda.tp8.kiln" --bench \
    --simulate-rank 0/8 --context 1024 --steps 3 --profile
  # The step's critical path by op kind and its links by the kinds they
  # join: one replay's kernels from CUPTI
  # (KILN_CUDA_TIMELINE) and the captured schedule (KILN_CUDA_SCHEDULE),
  # read by utils/timeline.py. CUPTI comes with the CUDA toolkit.
  cupti=$(ls /usr/local/cuda*/lib64/libcupti.so* 2>/dev/null | sort | head -1)
  timeline="$results/timeline-glm5-tp8-rank0.csv"
  schedule="$results/schedule-glm5-tp8-rank0.tsv"
  critical_path() {
    local t=$timeline s=$schedule
    KILN_CUPTI_LIBRARY=$cupti KILN_CUDA_TIMELINE=$t KILN_CUDA_SCHEDULE=$s \
      "$bin/kiln-run" "$m/glm5.cuda.tp8.kiln" --backend-dir "$pack/lib" \
      --bench --simulate-rank 0/8 --context 1024 --steps 10 &&
      python3 utils/timeline.py "$t" --group --top 20 --schedule "$s" --links
  }
  # Where the default's kernels compiled for GLM-5's shapes move the step's
  # time: a second replay without them (KILN_CUDA_SPECIALISED=0), unit by
  # unit against the first (timeline.py --compare).
  compare_general() {
    local t=$timeline s=$schedule
    local g="$results/timeline-glm5-tp8-rank0-general.csv"
    KILN_CUDA_SPECIALISED=0 KILN_CUPTI_LIBRARY=$cupti KILN_CUDA_TIMELINE=$g \
      "$bin/kiln-run" "$m/glm5.cuda.tp8.kiln" --backend-dir "$pack/lib" \
      --bench --simulate-rank 0/8 --context 1024 --steps 10 &&
      python3 utils/timeline.py "$t" --schedule "$s" --compare "$g" --top 12
  }
  if [ -n "$cupti" ]; then
    step critical-path-glm5-tp8-rank0 critical_path
    step compare-glm5-tp8-rank0-general compare_general
  else
    echo "critical path: skipped (no libcupti under /usr/local/cuda*/lib64)"
  fi
  # GLM-5 at tp=N on N GPUs (all 78 layers), the collectives in the graph
  # (all-reduces by the one-shot kernel over NVLink peers): the all-reduce
  # alone (NCCL's and the one-shot kernel's), graph and eager at 1k, graph
  # at 16k (and eager, when asked), the step with NCCL's all-reduce, the
  # step with every collective local, whose difference is the share the
  # collectives take, and the step with the fixed-width kernels.
  group_benches() { # TP [16k-eager]
    local tp=$1 a="$m/glm5.cuda.tp$1.kiln" long="$m/glm5-16k.cuda.tp$1.kiln"
    step "allreduce-$tp" "$bin/kiln-allreduce" --gpus "$tp"
    step "bench-glm5-tp$tp-graph" run "$a" --bench --context 1024 --steps 30
    step "bench-glm5-tp$tp-eager" run "$a" --bench --context 1024 --steps 10 \
      --eager
    step "bench-glm5-tp$tp-graph-16k" run "$long" --bench --context 16384 \
      --steps 20
    if [ "${2:-}" = 16k-eager ]; then
      step "bench-glm5-tp$tp-graph-16k-eager" run "$long" --bench \
        --context 16384 --steps 10 --eager
    fi
    step "bench-glm5-tp$tp-graph-nccl" env KILN_CUDA_ALLREDUCE=nccl \
      "$bin/kiln-run" "$a" --backend-dir "$pack/lib" --bench --context 1024 \
      --steps 30
    step "bench-glm5-tp$tp-graph-nonccl" env KILN_CUDA_LOCAL_COLLECTIVES=1 \
      "$bin/kiln-run" "$a" --backend-dir "$pack/lib" --bench --context 1024 \
      --steps 30
    # The all-reduces as before the forty-second pass (inputs copied into
    # the exchange, one cluster: docs/perf.md, forty-first pass); where the
    # pack has the artifact, the norms after the collectives in the ops
    # that read them (--projection-norms).
    step "bench-glm5-tp$tp-graph-copied-peer-cluster" env \
      KILN_CUDA_DIRECT_SLOTS=0 KILN_CUDA_PEER_CLUSTER=1 "$bin/kiln-run" "$a" \
      --backend-dir "$pack/lib" --bench --context 1024 --steps 30
    local pn="$m/glm5-projection-norms.cuda.tp$tp.kiln"
    if [ -f "$pn" ]; then
      step "bench-glm5-tp$tp-graph-projection-norms" run "$pn" --bench \
        --context 1024 --steps 30
    fi
    # Every part pushed into every rank's exchange instead of pulled over
    # NVLink (KILN_CUDA_PEER_PUSH=1, off by default until measured: the
    # same pass).
    step "bench-glm5-tp$tp-graph-push" env KILN_CUDA_PEER_PUSH=1 \
      "$bin/kiln-run" "$a" --backend-dir "$pack/lib" --bench --context 1024 \
      --steps 30
    # Without the kernels compiled for GLM-5's shapes (by default the
    # experts' and MLA's run).
    step "bench-glm5-tp$tp-graph-general" env KILN_CUDA_SPECIALISED=0 \
      "$bin/kiln-run" "$a" --backend-dir "$pack/lib" --bench --context 1024 \
      --steps 30
  }
  # The deployment itself: eight GPUs.
  [ "$gpus" -ge 8 ] && group_benches 8 16k-eager
  # Four, from a pack made with KILN_PACK_TPS="2 4".
  [ "$gpus" -ge 4 ] && [ -f "$m/glm5.cuda.tp4.kiln" ] && group_benches 4
  if [ "$gpus" -ge 2 ]; then
    step allreduce "$bin/kiln-allreduce" --gpus 2
    step bench-glm5-l40-tp2-graph run "$m/glm5-l40.cuda.tp2.kiln" --bench \
      --context 1024 --steps 30
    step bench-glm5-l40-tp2-eager run "$m/glm5-l40.cuda.tp2.kiln" --bench \
      --context 1024 --steps 10 --eager
    step bench-glm5-l40-tp2-graph-nccl env KILN_CUDA_ALLREDUCE=nccl \
      "$bin/kiln-run" "$m/glm5-l40.cuda.tp2.kiln" --backend-dir "$pack/lib" \
      --bench --context 1024 --steps 30
    step bench-glm5-l40-tp2-graph-push env KILN_CUDA_PEER_PUSH=1 \
      "$bin/kiln-run" "$m/glm5-l40.cuda.tp2.kiln" --backend-dir "$pack/lib" \
      --bench --context 1024 --steps 30
  fi
fi

echo
echo "== summary (results in $results/)"
if [ ${#failed[@]} -eq 0 ]; then
  echo "gpu-test: all passed"
else
  printf 'gpu-test: FAILED: %s\n' "${failed[@]}"
  exit 1
fi
