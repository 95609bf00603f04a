#!/usr/bin/env bash
# run.sh: instruction rows packed whole into windows (data.packing = "packed") against one row per
# window ("padded", a micro-batch trimmed to its longest row) and the token stream cut every
# seq_len tokens ("stream") on a long-tail chat set, on this CPU (the numbers for perf/README.md).
#   perf/packing/run.sh [build-dir]          (default: build/; needs bin/shardtrain)
# Env: ROWS=4000 (rows of make_rows.py: GPT-2 tokens log-normal, median ~100, 16..1024; 5% go to
# val), ROUNDS=2 (alternations), STEPS=5 (steps per run; timed: those after the first two, as
# summary.json), MICRO=1 (windows per micro-batch, packed and stream), PADDED_MICRO=8 (rows per
# micro-batch, padded; a val split shorter than one global batch is refused), DECK=
# perf/packing/llama-100m.toml (96 M Llama, seq_len 1024, fp32, full_shard), SETS="" (extra
# --set KEY=VALUE for every run), PYTHON=/usr/bin/python3 (numpy and torch, for
# tests/python/packing_reference.py's window statistics).
#   1. the Austen novels (`data extract-austen` into <data-dir>/austen when absent), make_rows.py,
#      `data prepare --tokenizer gpt2 --chat-format plain` (a version-3 dataset with rows);
#   2. the reference's statistics of the split at seq_len: rows, windows, counted targets and fill
#      for packed (first-fit decreasing), padded, stream; padded's expected fill of a micro-batch
#      of PADDED_MICRO random rows trimmed to the longest;
#   3. at 2 ranks, packed / padded / stream alternately, ROUNDS times: the median step time (each
#      run's steps after the first two), tokens/s as metrics.jsonl has it, and counted target tokens
#      per second: metrics.jsonl's per-step counted targets when it has them ("targets"), else
#      the expected count (global batch x counted targets per window of that packing);
#   4. the ratios packed / padded and packed / stream of counted targets per second (medians over
#      rounds) and the windows' fill.
# Checkpoints are deleted after each run (the final one is ~1 GB). Prints the CPU and the load
# before and after; raw outputs in $OUT.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../.."
build="${1:-$root/build}"
st="$build/bin/shardtrain"
[ -x "$st" ] || { echo "no $st: cmake --build $build -j2 --target shardtrain" >&2; exit 1; }
ROWS="${ROWS:-4000}"
ROUNDS="${ROUNDS:-2}"
STEPS="${STEPS:-5}"
MICRO="${MICRO:-1}"
PADDED_MICRO="${PADDED_MICRO:-8}"
DECK="${DECK:-$here/llama-100m.toml}"
PY="${PYTHON:-/usr/bin/python3}"
OUT="${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/packing-perf-XXXXXX")}"
data="${SHARDTRAIN_DATA_DIR:-$root/.data}"
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

# 1. The rows and the dataset (kept in $OUT: a rerun with the same OUT reuses them).
ls "$data"/austen/*.txt >/dev/null 2>&1 || "$st" data extract-austen --out "$data/austen" >/dev/null
[ -s "$OUT/rows.jsonl" ] || "$PY" "$here/make_rows.py" --austen "$data/austen" --rows "$ROWS" --out "$OUT/rows.jsonl"
if [ ! -f "$OUT/ds/meta.json" ]; then
  "$st" data prepare --source "$OUT/rows.jsonl" --tokenizer gpt2 --chat-format plain --val-fraction 0.05 \
    --out "$OUT/ds" >"$OUT/prepare.log" 2>&1 || { cat "$OUT/prepare.log"; exit 1; }
fi
T=$("$st" deck show "$DECK" "${set_args[@]}" 2>/dev/null | sed -n 's/^seq_len = \([0-9]*\).*/\1/p' | head -1)
T=${T:-1024}

# 2. The split at seq_len T, as the reference places it.
"$PY" "$root/tests/python/packing_reference.py" windows "$OUT/ds" train "$T" --packing packed,padded,stream \
  >"$OUT/windows.txt"
"$PY" - "$OUT/ds" "$T" "$PADDED_MICRO" >>"$OUT/windows.txt" <<'PY'
# padded's expected fill: micro-batches of B random rows, each trimmed to its longest row.
import json, random, sys
import numpy as np
ds, T, B = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
meta = json.load(open(f"{ds}/meta.json"))
starts = np.fromfile(f"{ds}/train.rows", dtype="<i8").reshape(-1, 2)[:, 0]
n = np.minimum(np.diff(np.append(starts, meta["splits"]["train"]["tokens"])), T).tolist()
rng = random.Random(1)
placed = capacity = 0
for _ in range(50):
    rng.shuffle(n)
    for i in range(0, len(n) - B + 1, B):
        placed += sum(n[i:i + B])
        capacity += B * max(n[i:i + B])
print(f"padded_micro B {B} fill {placed / capacity:.4f}")
PY
echo
echo "## The split: $ROWS rows from make_rows.py, GPT-2 tokens, seq_len $T"
echo
echo '```'
cat "$OUT/windows.txt"
echo '```'
wstat() { awk -v p="$1" -v k="$2" '$1 == p { for (i = 2; i < NF; ++i) if ($i == k) print $(i + 1) }' "$OUT/windows.txt"; }

# 3. The runs, alternating.
echo
echo "## $(basename "$DECK") ${SETS:-}, 2 ranks, $STEPS steps per run (timed: after the first two), $ROUNDS alternations"
echo
echo "| round | packing | micro-batch | global batch | step (s) | tokens/s (metrics) | counted targets / step | counted targets/s |"
echo "|---:|---|---:|---:|---:|---:|---:|---:|"
for r in $(seq 1 "$ROUNDS"); do
  for mode in packed padded stream; do
    micro=$MICRO
    [ "$mode" = padded ] && micro=$PADDED_MICRO
    global=$((2 * micro))
    run="$OUT/$mode-$r"
    rm -rf "$run"
    "${mpi[@]}" "$st" train "$DECK" --set data.dataset="$OUT/ds" --set data.packing="$mode" --set run.out_dir="$run" \
      --set train.max_steps="$STEPS" --set train.micro_batch="$micro" --set train.global_batch="$global" \
      "${set_args[@]}" >"$OUT/$mode-$r.log" 2>&1 </dev/null || { tail -20 "$OUT/$mode-$r.log"; exit 1; }
    rm -rf "$run/checkpoints"
    # Expected counted targets per window of this packing (the split's, over its windows).
    per_window=$(awk -v c="$(wstat "$mode" counted)" -v w="$(wstat "$mode" windows)" 'BEGIN { print c / w }')
    "$PY" - "$run/metrics.jsonl" "$global" "$per_window" >"$run.val" <<'PY'
# median step seconds, median tokens/s, counted targets per step, counted targets per second
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"step_ms"' in l]
timed = recs[2:] if len(recs) > 2 else (recs[1:] or recs)  # as summary.json: after 2 warm-up steps
ms = statistics.median(r["step_ms"] for r in timed)
tps = statistics.median(r.get("tokens_per_s", 0.0) for r in timed)
key = next((k for k in ("targets", "counted_targets", "counted") if k in timed[0]), None)
if key:  # what the run counted
    per_step = sum(r[key] for r in timed) / len(timed)
    rate = sum(r[key] for r in timed) / sum(r["step_ms"] / 1000 for r in timed)
    src = key
else:  # expected: the global batch's windows x the split's counted targets per window
    per_step = int(sys.argv[2]) * float(sys.argv[3])
    rate = per_step / (ms / 1000)
    src = "expected"
print(f"{ms / 1000:.3f} {tps:.0f} {per_step:.1f} {rate:.1f} {src}")
PY
    read -r step tps per_step rate src <"$run.val"
    echo "| $r | $mode | $micro | $global | $step | $tps | $per_step ($src) | $rate |"
  done
done

# 4. Ratios (medians over rounds of the per-round ratios) and the fill.
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
ratio() { for r in $(seq 1 "$ROUNDS"); do paste "$OUT/$1-$r.val" "$OUT/$2-$r.val" | awk '{ print $4 / $9 }'; done | median; }
echo
echo "packing line of the runs (train's own statistics):"
for mode in packed padded stream; do
  echo "  $mode: $(grep -m1 -i 'fill' "$OUT/$mode-1.log" | cut -c1-200 || true)"
done
echo
awk -v pp="$(ratio packed padded)" -v ps="$(ratio packed stream)" -v fp="$(wstat packed fill)" \
  -v fd="$(wstat padded_micro fill)" -v wp="$(wstat packed windows)" -v wd="$(wstat padded windows)" \
  -v ws="$(wstat stream windows)" 'BEGIN {
  printf "counted target tokens/s: packed / padded %.2f, packed / stream %.2f (medians of the per-round ratios)\n", pp, ps
  printf "window fill: packed %.3f (%d windows for %d rows), padded %.3f (expected, micro-batches trimmed to the longest row), stream 1.000 (%d windows cut through rows)\n", fp, wp, wd, fd, ws }'
echo
echo "# load after: $(uptime | sed 's/.*load average/load average/')"
