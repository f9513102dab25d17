#!/usr/bin/env bash
# A/B of two packs (utils/gpu-pack.sh) on one GPU host: the same benchmark
# from each, in turn, several rounds, so that both see the same machine
# (machines of one kind differ by 0.1-0.4 ms a GLM-5 step, more than many
# single changes move it). Prints each round's medians and the medians of
# them.
#
#   utils/gpu-ab.sh PACK_A PACK_B [ROUNDS] -- BENCH-ARGS...
#   e.g. utils/gpu-ab.sh gpu-pack-base gpu-pack 3 -- glm5.cuda.tp8.kiln \
#          --simulate-rank 0/8 --context 1024 --steps 30
# The artifact is named as it is inside each pack's models/ folder.
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { echo "usage: utils/gpu-ab.sh PACK_A PACK_B [ROUNDS] -- ARTIFACT BENCH-ARGS..." >&2; exit 2; }
[ $# -ge 4 ] || usage
a=$1 b=$2; shift 2
rounds=3
if [ "$1" != -- ]; then rounds=$1; shift; fi
[ "$1" = -- ] || usage
shift
[ $# -ge 1 ] || usage
artifact=$1; shift
case $rounds in ''|*[!0-9]*) echo "gpu-ab: error: ROUNDS: expected a count, not '$rounds'" >&2; exit 2 ;; esac
for p in "$a" "$b"; do
  [ -x "$p/bin/kiln-run" ] || { echo "gpu-ab: error: $p/bin/kiln-run: not a pack (utils/gpu-pack.sh)" >&2; exit 1; }
  [ -f "$p/models/$artifact" ] || { echo "gpu-ab: error: $p/models/$artifact: no such artifact" >&2; exit 1; }
done
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
declare -A got
for ((r = 1; r <= rounds; r++)); do
  for p in "$a" "$b"; do
    line=$("$p/bin/kiln-run" "$p/models/$artifact" --bench --backend-dir "$p/lib" "$@" 2>&1 | grep '^step:') ||
      { echo "gpu-ab: error: $p: the benchmark printed no step line" >&2; exit 1; }
    us=$(sed -E 's/^step: median ([0-9.]+) us.*/\1/' <<<"$line")
    echo "round $r $p: $us us"
    got[$p]="${got[$p]:-} $us"
  done
done
for p in "$a" "$b"; do
  median=$(tr ' ' '\n' <<<"${got[$p]}" | grep . | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}')
  echo "$p: median of $rounds rounds $median us"
done
