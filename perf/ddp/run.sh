#!/usr/bin/env bash
# Side-by-side step time: PyTorch DDP (fp32, gloo) vs shardtrain no_shard / full_shard fp32 /
# full_shard bf16 on the same GPT-2 config, micro batch and threads per rank, at 2 and 4 ranks.
# Prints a Markdown table (ranks, config, median step ms, ratio to PyTorch DDP at that rank count).
#
#   perf/ddp/run.sh                 # defaults below; run from anywhere
#   RANKS="2" STEPS=4 perf/ddp/run.sh
#   D=512 LAYERS=8 HEADS=8 SEQ=256 MB=4 perf/ddp/run.sh
#
# Needs: build/bin/shardtrain (BIN=...), /usr/bin/python3 with torch (Debian python3-torch),
# mpirun, and a GPT-2 token set (.data/austen-gpt2; prepared here if missing).
# Raw results: $OUT/results.jsonl (one line per run), logs in $OUT/*.log.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
BIN=${BIN:-build/bin/shardtrain}
PY=${PY:-/usr/bin/python3}
OUT=${OUT:-runs/ddp-bench}
DATA=${DATA:-.data/austen-gpt2}
RANKS=${RANKS:-"2 4"}
VOCAB=${VOCAB:-50257} SEQ=${SEQ:-256} D=${D:-384} LAYERS=${LAYERS:-6} HEADS=${HEADS:-6} MB=${MB:-2}
THREADS=${THREADS:-1}          # intra-op threads per rank, both sides
STEPS=${STEPS:-6}              # timed steps; 2 warm-up steps before them on both sides
CONFIGS=${CONFIGS:-"ddp ddp_reuse no_shard full_shard full_shard_release full_shard_bf16"}
# ddp_reuse: the PyTorch peer with glibc set as shardtrain's run.reuse_host_memory sets it (freed
# blocks kept for reuse), so the allocator's share of the difference shows; full_shard_release:
# shardtrain with glibc's defaults (run.reuse_host_memory = false).
REUSE_TUNABLES="glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=2147483647"
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none)

"$PY" -c "import torch" 2>/dev/null || { echo "run.sh: $PY has no torch (apt-get install -y --no-install-recommends python3-torch)" >&2; exit 1; }
[ -x "$BIN" ] || { echo "run.sh: no shardtrain binary at $BIN (set BIN=)" >&2; exit 1; }
[ -f "$DATA/meta.json" ] || "$BIN" data prepare --source austen --tokenizer gpt2 --out "$DATA"
mkdir -p "$OUT"
: > "$OUT/results.jsonl"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" | tee "$OUT/header.txt"
echo "# gpt2 V=$VOCAB T=$SEQ d=$D L=$LAYERS H=$HEADS, micro batch $MB, $THREADS thread(s)/rank, median of $STEPS steps after 2 warm-up" | tee -a "$OUT/header.txt"
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/header.txt"

# Both sides on the same GEMM kernel: shardtrain selects OpenBLAS's core at start-up
# (docs/performance.md); the PyTorch peer gets the same core through OPENBLAS_CORETYPE.
blas=$("$BIN" info perf/ddp/bench.toml --set data.dataset="$DATA" 2>/dev/null | sed -n 's/^  BLAS //p')
core=$(sed -n 's/.*, core \([A-Za-z0-9]*\) (.*/\1/p' <<<"$blas")
echo "# BLAS (shardtrain): $blas" | tee -a "$OUT/header.txt"
if [ -z "${OPENBLAS_CORETYPE:-}" ] && [ -n "$core" ]; then
  export OPENBLAS_CORETYPE=$core
  echo "# PyTorch DDP peer: OPENBLAS_CORETYPE=$core (the core shardtrain selected)" | tee -a "$OUT/header.txt"
fi

port=29517
for n in $RANKS; do
  for cfg in $CONFIGS; do
    log="$OUT/np${n}-${cfg}.log"
    load=$(cut -d' ' -f1 /proc/loadavg)
    if [ "$cfg" = ddp ] || [ "$cfg" = ddp_reuse ]; then
      port=$((port + 1))
      tun=""; [ "$cfg" = ddp_reuse ] && tun=$REUSE_TUNABLES
      GLIBC_TUNABLES=$tun "${MPIRUN[@]}" -np "$n" -x GLIBC_TUNABLES ${OPENBLAS_CORETYPE:+-x OPENBLAS_CORETYPE} "$PY" perf/ddp/gpt2_ddp.py --vocab "$VOCAB" --seq "$SEQ" --d-model "$D" \
        --layers "$LAYERS" --heads "$HEADS" --micro-batch "$MB" --steps "$STEPS" --warmup 2 \
        --threads "$THREADS" --port "$port" > "$log" 2>&1 || { echo "run.sh: DDP at $n ranks failed, see $log" >&2; exit 1; }
      ms=$(grep '^{' "$log" | tail -1 | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["median_step_ms"])')
      comm=""
    else
      strategy=$cfg dtype=fp32 reuse=true
      [ "$cfg" = full_shard_bf16 ] && strategy=full_shard dtype=bf16
      [ "$cfg" = full_shard_release ] && strategy=full_shard reuse=false
      dir="$OUT/np${n}-${cfg}"
      rm -rf "$dir"
      "${MPIRUN[@]}" -np "$n" "$BIN" train perf/ddp/bench.toml --set run.out_dir="$dir" \
        --set parallel.strategy="$strategy" --set fsdp.param_dtype="$dtype" \
        --set model.vocab_size="$VOCAB" --set model.seq_len="$SEQ" --set model.d_model="$D" \
        --set model.n_layers="$LAYERS" --set model.n_heads="$HEADS" --set train.micro_batch="$MB" \
        --set train.max_steps=$((STEPS + 2)) --set run.threads="$THREADS" --set data.dataset="$DATA" \
        --set run.reuse_host_memory=$reuse \
        > "$log" 2>&1 || { echo "run.sh: shardtrain $cfg at $n ranks failed, see $log" >&2; exit 1; }
      ms=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["median_step_ms"])' "$dir/summary.json")
      comm=$("$PY" -c '
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if "comm_share" in l][2:]
print(round(statistics.median(r["comm_share"] for r in rows), 3))' "$dir/metrics.jsonl")
    fi
    echo "{\"ranks\": $n, \"config\": \"$cfg\", \"median_step_ms\": $ms, \"comm_share\": \"${comm}\", \"load1\": $load}" | tee -a "$OUT/results.jsonl"
  done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/header.txt"

"$PY" - "$OUT/results.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
names = {"ddp": "PyTorch DDP fp32", "ddp_reuse": "PyTorch DDP fp32, glibc as reuse_host_memory",
         "full_shard_release": "shardtrain full_shard fp32, reuse_host_memory = false",
         "no_shard": "shardtrain no_shard fp32",
         "full_shard": "shardtrain full_shard fp32", "full_shard_bf16": "shardtrain full_shard bf16"}
print()
print("| ranks | config | median step ms | / PyTorch DDP | exposed comm | load (1 min) |")
print("|---:|---|---:|---:|---:|---:|")
for r in rows:
    base = [x for x in rows if x["ranks"] == r["ranks"] and x["config"] == "ddp"]
    ratio = "%.2f" % (r["median_step_ms"] / base[0]["median_step_ms"]) if base else "-"
    comm = "%.0f%%" % (100 * float(r["comm_share"])) if r["comm_share"] != "" else "-"
    print("| %d | %s | %.0f | %s | %s | %.1f |" % (r["ranks"], names.get(r["config"], r["config"]),
          r["median_step_ms"], ratio, comm, r["load1"]))
PYEOF
