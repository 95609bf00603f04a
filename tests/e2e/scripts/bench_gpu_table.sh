#!/usr/bin/env bash
# bench_gpu_table.sh PYTHON TABLE_PY LAUNCHER... BENCH: the three bench_gpu modes on the CPU
# (tiny GPT-2): each prints its JSON line, and plain libtorch, full_shard and CPU offload start
# from the same loss (same init, same batch); then a failed FSDP2 line, and perf/gpu/table.py
# over the four. A failed check prints "FAIL:" and no table.
set -euo pipefail
py=$1 table=$2
shift 2
f=$(mktemp)
trap 'rm -f "$f"' EXIT
for m in plain fsdp offload; do
  line=$("$@" --device cpu --model tiny --seq 64 --micro-batch 4 --steps 2 --warmup 1 --dtype fp32 --mode $m | grep '^{') ||
    { echo "FAIL: bench_gpu --mode $m printed no JSON line"; exit 1; }
  echo "$line"
  [[ $line == *"\"mode\": \"$m\""* && $line == *'"loss_first": 6.25265'* ]] ||
    { echo "FAIL: bench_gpu --mode $m: expected mode $m and loss_first 6.25265"; exit 1; }
  echo "$line" >> "$f"
done
echo '{"mode": "fsdp2", "error": "failed"}' >> "$f"
"$py" "$table" "$f" --gpu cpu --torch test
