#!/usr/bin/env bash
# bench_gpu_table.sh PYTHON TABLE_PY LAUNCHER... BENCH: the three bench_gpu modes on the CPU
# (tiny model), a failed FSDP2 line, then perf/gpu/table.py over them.
set -euo pipefail
py=$1 table=$2
shift 2
f=$(mktemp)
trap 'rm -f "$f"' EXIT
for m in plain fsdp offload; do
  "$@" --device cpu --model tiny --seq 32 --micro-batch 2 --steps 1 --warmup 0 --dtype fp32 --mode $m | grep '^{' >> "$f"
done
echo '{"mode": "fsdp2", "error": "failed"}' >> "$f"
"$py" "$table" "$f" --gpu cpu --torch test
