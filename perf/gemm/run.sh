#!/usr/bin/env bash
# The CPU compute path in one run: bench_gemm's GEMM table (every kernel choice, ratios), then the
# quickstart deck's step time on the selected OpenBLAS core vs the fallback forced by
# OPENBLAS_CORETYPE=Prescott (the acceptance ratio of issue #15: <= 0.6), alternating.
#
#   perf/gemm/run.sh                 # 2 ranks, 12 steps per run, 1 pair
#   NP=2 STEPS=12 PAIRS=2 perf/gemm/run.sh
#
# Needs build/bin/{shardtrain,bench_gemm} (BIN_DIR=...), mpirun, the Austen GPT-2 tokens
# (DATA=..., prepared here if missing). Logs and run directories in $OUT.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
BIN_DIR=${BIN_DIR:-build/bin}
OUT=${OUT:-runs/gemm-bench}
DATA=${DATA:-.data/austen-gpt2}
NP=${NP:-2} STEPS=${STEPS:-12} PAIRS=${PAIRS:-1}
MPIRUN=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
[ -f "$DATA/meta.json" ] || "$BIN_DIR/shardtrain" data prepare --source austen --tokenizer gpt2 --out "$DATA"
mkdir -p "$OUT"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load $(cut -d' ' -f1-3 /proc/loadavg)"
"$BIN_DIR/bench_gemm" ${GEMM_ARGS:-}
echo
echo "| run | OpenBLAS core | median step ms | load (1 min) |"
echo "|---|---|---:|---:|"
declare -A ms
for p in $(seq 1 "$PAIRS"); do
  for mode in selected fallback; do
    dir="$OUT/quickstart-$mode-$p"
    rm -rf "$dir"
    env_args=()
    [ "$mode" = fallback ] && env_args=(-x OPENBLAS_CORETYPE=Prescott)
    "${MPIRUN[@]}" -np "$NP" "${env_args[@]}" "$BIN_DIR/shardtrain" train inputs/quickstart.toml \
      --set run.out_dir="$dir" --set checkpoint.resume=never --set checkpoint.previous_run=move_aside \
      --set data.dataset="$DATA" --set train.max_steps="$STEPS" --set train.val_every=100000 \
      --set log.every=1 > "$dir.log" 2>&1 || { echo "run.sh: $mode failed, see $dir.log" >&2; exit 1; }
    core=$(sed -n 's/^# BLAS .*, core \([A-Za-z0-9]*\) (.*/\1/p' "$dir.log" | head -1)
    m=$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["median_step_ms"]))' "$dir/summary.json")
    ms[$mode]=$(( ${ms[$mode]:-0} + m ))
    echo "| $mode ($p) | $core | $m | $(cut -d' ' -f1 /proc/loadavg) |"
  done
done
python3 -c "import sys; s, f = map(float, sys.argv[1:]); print(f'\nselected / fallback step time: {s / f:.2f} (goal <= 0.6)')" "${ms[selected]}" "${ms[fallback]}"
