#!/usr/bin/env bash
# run.sh: LoRA against the full fine-tune of one model on this CPU, and the planner's 70B numbers
# (perf/README.md, "LoRA and frozen parameters").
#   perf/lora/run.sh [build-dir]          (default: build/; needs bin/shardtrain)
# Env: ROUNDS=3 (alternations), STEPS=6 (steps per probe; timed: the median of those after the first), LIMIT=512MiB
# (per-rank cap of the depth search), DECK=perf/lora/llama-167m.toml, SETS="" (extra --set
# KEY=VALUE for both configurations), DEPTH_SETS="model.vocab_size=4096" (added for the depth
# search: with the deck's 32000-token vocabulary the full fine-tune's embedding and head alone,
# 65.5 M parameters at 8 bytes per rank, do not fit 512 MiB), PARTS="step depth plan70b".
#   step:    `plan --measure --strategy full_shard` at 2 ranks, LoRA (the deck: rank 16 on every
#            linear of the blocks) and the full fine-tune (--set lora.rank=0) alternately, ROUNDS
#            times each: planned and measured peak per rank (counting allocator) and the step
#            time (the probe's: the median of the steps after the first, each its slowest rank's);
#            the medians and the LoRA / full ratios.
#   depth:   `maxbatch --vary n_layers` at 2 ranks under LIMIT per rank: the deepest model of the
#            deck's width (and DEPTH_SETS) that trains, LoRA and full; parameters at the maximum
#            and their ratio.
#   plan70b: `plan inputs/llama-70b-lora.toml --target cuda` at 8 x 80 GiB: LoRA, and the full
#            fine-tune with cpu_offload (device and host memory); no steps.
# Prints the CPU model and the load (uptime) before and after. Raw outputs go to $OUT.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../.."
build="${1:-$root/build}"
st="$build/bin/shardtrain"
[ -x "$st" ] || { echo "no $st: cmake --build $build -j2 --target shardtrain" >&2; exit 1; }
ROUNDS="${ROUNDS:-3}"
STEPS="${STEPS:-6}"
LIMIT="${LIMIT:-512MiB}"
DECK="${DECK:-$here/llama-167m.toml}"
DEPTH_SETS="${DEPTH_SETS-model.vocab_size=4096}"
PARTS="${PARTS:-step depth plan70b}"
OUT="${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/lora-perf-XXXXXX")}"
mkdir -p "$OUT"
read -r -a sets <<< "${SETS:-}"
set_args=()
for s in "${sets[@]}"; do set_args+=(--set "$s"); done
mpi=(mpirun --oversubscribe --bind-to none -np 2)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(hostname): $cpu, $(nproc --all) cores, $(awk '/MemTotal/{printf "%.0f GB", $2/1048576}' /proc/meminfo); raw output in $OUT"
echo "# load before: $(uptime | sed 's/.*load average/load average/')"

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

if [[ " $PARTS " == *" step "* ]]; then
  echo
  echo "## LoRA vs full fine-tune: $(basename "$DECK") ${SETS:-}, full_shard, 2 ranks, $STEPS steps per probe, $ROUNDS alternations"
  echo
  echo "| round | config | planned peak / rank | measured peak / rank | error | step (s) |"
  echo "|---:|---|---:|---:|---:|---:|"
  for r in $(seq 1 "$ROUNDS"); do
    for cfg in lora full; do
      log="$OUT/step-$cfg-$r.txt"
      extra=()
      [ "$cfg" = full ] && extra=(--set lora.rank=0)
      "${mpi[@]}" "$st" plan "$DECK" --strategy full_shard --measure --steps "$STEPS" "${set_args[@]}" "${extra[@]}" \
        > "$log" 2>&1 < /dev/null || { tail -20 "$log"; echo "plan --measure failed ($cfg)" >&2; exit 1; }
      # full_shard  PLANNED  MEASURED  ERROR  PEAK-AT...  STEP  EST
      line=$(awk '/^# measured/ { m = 1; next } m && $1 == "full_shard" { print; exit }' "$log")
      planned=$(awk '/^PLAN_VS_MEASURED/ { for (i = 2; i <= NF; ++i) { split($i, kv, "="); if (kv[1] == "planned") print kv[2] } }' "$log")
      measured=$(awk '/^PLAN_VS_MEASURED/ { for (i = 2; i <= NF; ++i) { split($i, kv, "="); if (kv[1] == "measured") print kv[2] } }' "$log")
      step=$(echo "$line" | awk '{ print $(NF - 1) }')
      err=$(echo "$line" | awk '{ print $6 }')
      echo "$planned $measured $step" > "$OUT/step-$cfg-$r.val"
      awk -v r="$r" -v c="$cfg" -v p="$planned" -v m="$measured" -v e="$err" -v s="$step" \
        'BEGIN { printf "| %s | %s | %.1f MiB | %.1f MiB | %s | %.3f |\n", r, c, p / 1048576, m / 1048576, e, s }'
    done
  done
  lora_step=$(cat "$OUT"/step-lora-*.val | awk '{ print $3 }' | median)
  full_step=$(cat "$OUT"/step-full-*.val | awk '{ print $3 }' | median)
  lora_peak=$(cat "$OUT"/step-lora-*.val | awk '{ print $2 }' | median)
  full_peak=$(cat "$OUT"/step-full-*.val | awk '{ print $2 }' | median)
  ratios=$(for r in $(seq 1 "$ROUNDS"); do paste "$OUT/step-lora-$r.val" "$OUT/step-full-$r.val" | awk '{ print $3 / $6 }'; done | median)
  worst=$(cat "$OUT"/step-*.val | awk '{ e = ($1 - $2) / $2; if (e < 0) e = -e; if (e > w) w = e } END { printf "%.1f%%", 100 * w }')
  echo
  awk -v ls="$lora_step" -v fs="$full_step" -v lp="$lora_peak" -v fp="$full_peak" -v rr="$ratios" -v w="$worst" 'BEGIN {
    printf "median step: LoRA %.3f s, full %.3f s: ratio %.2f (median of the per-round ratios %.2f; goal <= 0.70)\n", ls, fs, ls / fs, rr
    printf "median peak per rank: LoRA %.1f MiB, full %.1f MiB: ratio %.3f (goal <= 0.35)\n", lp / 1048576, fp / 1048576, lp / fp
    printf "largest planned-vs-measured error: %s (goal <= 10%%)\n", w }'
fi

if [[ " $PARTS " == *" depth "* ]]; then
  echo
  read -r -a dsets <<< "$DEPTH_SETS"
  for s in "${dsets[@]}"; do set_args+=(--set "$s"); done
  echo "## Deepest model of $(basename "$DECK")'s width ${SETS:-} $DEPTH_SETS under $LIMIT per rank (maxbatch --vary n_layers, full_shard, 2 ranks)"
  echo
  echo "| config | max layers | parameters | planned max | peak / rank | step (s) |"
  echo "|---|---:|---:|---:|---:|---:|"
  for cfg in lora full; do
    log="$OUT/depth-$cfg.txt"
    extra=()
    [ "$cfg" = full ] && extra=(--set lora.rank=0)
    "${mpi[@]}" "$st" maxbatch "$DECK" --vary n_layers --strategy full_shard --memory-limit "$LIMIT" --max 1024 --steps 1 \
      "${set_args[@]}" "${extra[@]}" > "$log" 2>&1 < /dev/null || { tail -20 "$log"; exit 1; }
    awk -v c="$cfg" '/^MAXBATCH/ { for (i = 2; i <= NF; ++i) { split($i, kv, "="); v[kv[1]] = kv[2] }
      printf "| %s | %s | %.1f M | %s | %.1f MiB | %.2f |\n", c, v["max"], v["params"] / 1e6, v["planned"], v["peak"] / 1048576, v["step_s"]
      print v["params"] > "'"$OUT"'/depth-" c ".val" }' "$log"
  done
  awk -v l="$(cat "$OUT/depth-lora.val")" -v f="$(cat "$OUT/depth-full.val")" \
    'BEGIN { printf "\nparameters at the maximum: LoRA / full = %.1fx (goal >= 4x)\n", (f > 0 ? l / f : 0) }'
fi

if [[ " $PARTS " == *" plan70b "* ]]; then
  echo
  echo "## Planner: inputs/llama-70b-lora.toml, 8 ranks x 80 GiB, --target cuda (no steps)"
  rows='^(# shardtrain|# fine-tune|# target|params \(|frozen|grads \(|optimizer state|unsharded|activations|peak \(|peak at|host memory|recommendation|  fsdp|  lora|  --ranks|  train)'
  for cfg in lora full-offload; do
    extra=()
    [ "$cfg" = full-offload ] && extra=(--set lora.rank=0 --set fsdp.cpu_offload=true)
    echo
    echo '```'
    echo "\$ shardtrain plan inputs/llama-70b-lora.toml --ranks 8 --device-memory 80GiB --target cuda --strategy full_shard ${extra[*]}"
    "$st" plan "$root/inputs/llama-70b-lora.toml" --ranks 8 --device-memory 80GiB --target cuda --strategy full_shard \
      --compute-tflops 150 --cores-per-host 64 "${extra[@]}" 2>&1 | grep -E "$rows" | sed 's/ (peak .*//'
    echo '```'
  done
fi
echo
echo "# load after: $(uptime | sed 's/.*load average/load average/')"
