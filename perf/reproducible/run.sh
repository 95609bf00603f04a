#!/usr/bin/env bash
# run.sh: step time of train.reproducible ÷ the default mode, for the GPT-2 deck of the scaling
# study (perf/scaling/gpt2-byte.toml: 4.8 M parameters, global batch 16 = 4 leaves of 4
# sequences of 128 tokens, synthetic tokens), full_shard at 2 and 4 ranks. The runs alternate
# (default, reproducible, default, ...) REPS times, so drift on a shared machine hits both; each
# run's time is the median step time of steps 3..STEPS from its metrics.jsonl; a row's ratio
# is the median over repetitions of reproducible ÷ default. Also checks that the reproducible
# runs at 2 and 4 ranks logged the same losses (as strings).
#   perf/reproducible/run.sh [build-dir]     (default build/; needs bin/shardtrain)
# Env: STEPS (default 10), REPS (default 3), RANKS (default "2 4").
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../.."
build="${1:-$root/build}"
st="$build/bin/shardtrain"
[ -x "$st" ] || { echo "no $st: cmake --build $build -j2 --target shardtrain" >&2; exit 1; }
STEPS=${STEPS:-10} REPS=${REPS:-3} RANKS=${RANKS:-2 4}
work=$(mktemp -d "${TMPDIR:-/tmp}/repro-bench-XXXXXX")
trap 'rm -rf "$work"' EXIT
mpi=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
deck=$root/perf/scaling/gpt2-byte.toml
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}; $STEPS steps, medians over $REPS alternations"
# step_ms DIR: median step_ms of steps >= 3.
step_ms() {
  /usr/bin/python3 - "$1/metrics.jsonl" <<'PY'
import json, statistics, sys
v = [r["step_ms"] for r in map(json.loads, open(sys.argv[1])) if r.get("kind", "train") == "train" and "step_ms" in r and r["step"] >= 3]
print(statistics.median(v))
PY
}
losses() { /usr/bin/python3 -c 'import json,sys; print(" ".join(l.split("\"loss\":")[1].split(",")[0] for l in open(sys.argv[1]) if "\"loss\":" in l and "\"step_ms\"" in l))' "$1/metrics.jsonl"; }
run() {  # run NP MODE OUT
  "${mpi[@]}" -np "$1" "$st" train "$deck" --set data.dataset= --set "train.max_steps=$STEPS" --set log.every=1 \
    --set "train.reproducible=$2" --set "run.out_dir=$3" --set checkpoint.every_steps=0 --set checkpoint.keep_last=1 \
    > "$3.log" 2>&1 || { tail -20 "$3.log"; echo "run failed: $3" >&2; exit 1; }
}
echo "| ranks | default ms/step | reproducible ms/step | reproducible ÷ default (median) | each alternation |"
echo "|---:|---:|---:|---:|---|"
for np in $RANKS; do
  ratios=() ds=() rs=()
  for rep in $(seq "$REPS"); do
    run "$np" false "$work/d$np-$rep"
    run "$np" true "$work/r$np-$rep"
    d=$(step_ms "$work/d$np-$rep") r=$(step_ms "$work/r$np-$rep")
    ds+=("$d") rs+=("$r") ratios+=("$(awk -v a="$r" -v b="$d" 'BEGIN{print a/b}')")
  done
  med() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END{print v[int((NR+1)/2)]}'; }
  printf "| %d | %.0f | %.0f | %.3f | %s |\n" "$np" "$(med "${ds[@]}")" "$(med "${rs[@]}")" "$(med "${ratios[@]}")" \
    "$(printf '%.2f ' "${ratios[@]}")"
  losses "$work/r$np-1" > "$work/losses-$np"
done
set -- $RANKS
if [ $# -ge 2 ]; then
  cmp -s "$work/losses-$1" "$work/losses-$2" && echo "reproducible losses at $1 and $2 ranks: identical strings" ||
    { echo "reproducible losses differ between $1 and $2 ranks"; exit 1; }
fi
