#!/usr/bin/env bash
# A/B of two packs (utils/gpu-pack.sh), or of one pack with and without an
# environment switch, on one GPU host: the same benchmark from each side, in
# turn, several rounds, so that all sides see the same machine (machines of
# one kind differ by 0.1-0.4 ms a GLM-5 step, more than many single changes
# move it). More than two sides take turns the same way (an A/B/C of a
# baseline and two changes in one call). Prints each round's medians and the
# medians of them, each past the first side's with its difference from the
# first's and the rounds it won.
#
#   utils/gpu-ab.sh SIDE_A SIDE_B [SIDE_C...] [ROUNDS] -- BENCH-ARGS...
#   e.g. utils/gpu-ab.sh gpu-pack-base gpu-pack 3 -- glm5.cuda.tp8.kiln \
#          --simulate-rank 0/8 --context 1024 --steps 30
#        utils/gpu-ab.sh gpu-pack gpu-pack+KILN_CUDA_SPECIALISED=0 3 -- ...
# A side is a pack's folder, optionally followed by +VAR=VALUE settings for
# the benchmark's environment; ROUNDS, a count, is the last word before --
# (default 3). The artifact is named as it is inside each pack's models/
# folder. Each run's result (its `result:` line: the token and the logits'
# digest) is kept too: where they differ between rounds or sides, a note
# says so, since MoE routing follows the values and a side that computes
# other values may take other experts (a timing probe must keep them).
# Sides that round differently (another fusion, say) differ by design.
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { echo "usage: utils/gpu-ab.sh SIDE_A SIDE_B [SIDE_C...] [ROUNDS] -- ARTIFACT BENCH-ARGS... (a side: PACK[+VAR=VALUE...])" >&2; exit 2; }
sides=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do sides+=("$1"); shift; done
[ $# -ge 2 ] || usage # --, then the artifact
shift
rounds=3
last=${sides[${#sides[@]}-1]:-}
if [[ $last =~ ^[0-9]+$ ]]; then rounds=$last; unset 'sides[${#sides[@]}-1]'; fi
[ ${#sides[@]} -ge 2 ] || usage
artifact=$1; shift
[ "$rounds" -ge 1 ] || { echo "gpu-ab: error: ROUNDS: expected a count of at least 1, not '$rounds'" >&2; exit 2; }
declare -A seen
for side in "${sides[@]}"; do
  [ -z "${seen[$side]:-}" ] || { echo "gpu-ab: error: two sides are '$side'" >&2; exit 2; }
  seen[$side]=1
done
declare -A pack settings
for side in "${sides[@]}"; do
  p=${side%%+*}
  pack[$side]=$p
  settings[$side]=
  if [ "$p" != "$side" ]; then
    IFS=+ read -r -a kv <<<"${side#*+}"
    for setting in "${kv[@]}"; do
      [[ $setting =~ ^[A-Za-z_][A-Za-z0-9_]*=.*$ ]] ||
        { echo "gpu-ab: error: side '$side': '$setting' is not VAR=VALUE" >&2; exit 2; }
    done
    settings[$side]=${side#*+}
  fi
  [ -x "$p/bin/kiln-run" ] || { echo "gpu-ab: error: $p/bin/kiln-run: not a pack (utils/gpu-pack.sh)" >&2; exit 1; }
  [ -f "$p/models/$artifact" ] || { echo "gpu-ab: error: $p/models/$artifact: no such artifact" >&2; exit 1; }
done
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
declare -A got results
for ((r = 1; r <= rounds; r++)); do
  for side in "${sides[@]}"; do
    p=${pack[$side]}
    env_args=()
    [ -z "${settings[$side]}" ] || IFS=+ read -r -a env_args <<<"${settings[$side]}"
    output=$(env ${env_args[@]+"${env_args[@]}"} "$p/bin/kiln-run" "$p/models/$artifact" --bench \
               --backend-dir "$p/lib" "$@" 2>&1) || true
    line=$(grep '^step:' <<<"$output") ||
      { echo "gpu-ab: error: $side: the benchmark printed no step line" >&2
        tail -5 <<<"$output" >&2; exit 1; }
    us=$(sed -E 's/^step: median ([0-9.]+) us.*/\1/' <<<"$line")
    result=$(grep -m1 '^result:' <<<"$output" | sed -E 's/^result: //') || result=
    echo "round $r $side: $us us${result:+ ($result)}"
    got[$side]="${got[$side]:-} $us"
    if [ -n "$result" ] && [[ $'\n'"${results[$side]:-}"$'\n' != *$'\n'"$result"$'\n'* ]]; then
      results[$side]="${results[$side]:+${results[$side]}$'\n'}$result"
    fi
  done
done
# Each side's median; past the first side, its difference from the first
# side's median and in how many rounds it was the faster of the two (the
# rounds are interleaved, so round r of both ran on the same machine state).
first=${sides[0]}
declare -A medians
for side in "${sides[@]}"; do
  median=$(tr ' ' '\n' <<<"${got[$side]}" | grep . | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}')
  medians[$side]=$median
  against=
  if [ "$side" != "$first" ]; then
    against=$(awk -v a="${got[$first]}" -v b="${got[$side]}" -v ma="${medians[$first]}" -v mb="$median" -v f="$first" '
      BEGIN { n = split(a, x, " "); split(b, y, " "); faster = 0
              for (i = 1; i <= n; ++i) if (y[i] + 0 < x[i] + 0) ++faster
              printf " (%+.1f us against %s; faster in %d of %d rounds)", mb - ma, f, faster, n }')
  fi
  echo "$side: median of $rounds rounds $median us$against"
done
# The results: one a side, the same on every side, or a note.
for side in "${sides[@]}"; do
  if [ "$(grep -c . <<<"${results[$side]:-}")" -gt 1 ]; then
    echo "gpu-ab: note: $side's rounds gave different results:" $(tr '\n' ';' <<<"${results[$side]}")
  elif [ "${results[$side]:-}" != "${results[$first]:-}" ]; then
    echo "gpu-ab: note: $side's result (${results[$side]:-none}) differs from $first's (${results[$first]:-none}): other values may route to other experts"
  fi
done
