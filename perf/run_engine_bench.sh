#!/usr/bin/env bash
# run_engine_bench.sh: runs bench_engine at N = 1, 2, 4 ranks, one strategy per process (so each
# VmHWM is that strategy's own peak), then the fused-AdamW table, and prints the tables.
#   perf/run_engine_bench.sh [build-dir] [-- extra bench_engine flags, e.g. --d-model 256]
# Env: TABLES="engine optim", RANKS="1 2 4", STRATEGIES="full_shard shard_grad_op no_shard hybrid_shard full_shard+bf16",
#      CORES (default: nproc) split as max(1, CORES/N) threads per rank.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../build-bench}"
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
bench="$build/bin/bench_engine"
[ -x "$bench" ] || { echo "no $bench: cmake --build $build -j2 --target bench_engine" >&2; exit 1; }
RANKS="${RANKS:-1 2 4}"
STRATEGIES="${STRATEGIES:-full_shard shard_grad_op no_shard hybrid_shard full_shard+bf16}"
CORES="${CORES:-$(nproc)}"
TABLES="${TABLES:-engine optim}"
mpi=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)

echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(hostname), $(nproc) cores, $(awk '/MemTotal/{printf "%.0f GB", $2/1048576}' /proc/meminfo), load $(cut -d' ' -f1-3 /proc/loadavg)"
for n in $RANKS; do
  [[ " $TABLES " == *" engine "* ]] || break
  t=$(( CORES / n )); [ "$t" -lt 1 ] && t=1
  # libtorch's intra-op pool and OpenMP both read the thread count; bench_engine sets it too.
  export OMP_NUM_THREADS=$t
  first=1
  for s in $STRATEGIES; do
    hdr=(--no-header); [ $first = 1 ] && hdr=()
    "${mpi[@]}" -np "$n" "$bench" --table engine --strategy "$s" --threads "$t" "${hdr[@]}" "$@"
    first=0
  done
  echo
done
first=1
for n in $RANKS; do
  [[ " $TABLES " == *" optim "* ]] || break
  t=$(( CORES / n )); [ "$t" -lt 1 ] && t=1
  export OMP_NUM_THREADS=$t
  hdr=(--no-header); [ $first = 1 ] && hdr=()
  "${mpi[@]}" -np "$n" "$bench" --table optim --threads "$t" "${hdr[@]}" "$@"
  first=0
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
