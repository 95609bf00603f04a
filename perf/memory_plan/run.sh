#!/usr/bin/env bash
# run.sh: regenerates the "Memory planner and max batch" tables of perf/README.md.
#   perf/memory_plan/run.sh [build-dir]          (default: build/; needs bin/shardtrain)
# Env: TABLES="plan maxbatch depth" (any subset), LIMIT=384MiB (per-rank limit of the last two).
#   plan:     `shardtrain plan --measure` (2 real steps per strategy, counting allocator) for
#             five decks, all five strategies; markdown rows deck | ranks | strategy | planned |
#             measured | error | planned peak at.
#   maxbatch: `shardtrain maxbatch` for the GPT-2 Large/XL-shaped scaled decks, no_shard,
#             shard_grad_op, full_shard at 1, 2, 4 ranks under LIMIT per rank.
#   depth:    `maxbatch --vary n_layers`: the deepest Large-shaped model (micro-batch 1) that
#             trains under LIMIT, no_shard vs full_shard (and full_shard with recomputation).
# Raw outputs go to $OUT (default: a temporary directory, printed).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../.."
build="${1:-$root/build}"
st="$build/bin/shardtrain"
[ -x "$st" ] || { echo "no $st: cmake --build $build -j2 --target shardtrain" >&2; exit 1; }
TABLES="${TABLES:-plan maxbatch depth}"
LIMIT="${LIMIT:-384MiB}"
OUT="${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/memory-plan-XXXXXX")}"
mkdir -p "$OUT"
mpi=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
cores=$(nproc --all)
export OMP_NUM_THREADS=1
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(hostname), $cores cores, $(awk '/MemTotal/{printf "%.0f GB", $2/1048576}' /proc/meminfo), load $(cut -d' ' -f1-3 /proc/loadavg); raw output in $OUT"

if [[ " $TABLES " == *" plan "* ]]; then
  echo
  echo "| deck | ranks (per host) | strategy | planned peak | measured peak | error | planned peak at |"
  echo "|---|---|---|---:|---:|---:|---|"
  # name | ranks | ranks per host | deck | overrides
  while IFS='|' read -r name np rph deck sets; do
    log="$OUT/plan-$name.txt"
    # shellcheck disable=SC2086
    "${mpi[@]}" -np "$np" "$st" plan "$root/$deck" --ranks-per-host "$rph" --measure --steps 2 $sets > "$log" 2>&1 < /dev/null ||
      { tail -20 "$log"; echo "plan --measure failed for $name" >&2; exit 1; }
    awk -v name="$name" -v np="$np" -v rph="$rph" '
      /^# measured/ { m = 1; next }
      m && $1 ~ /^(full_shard|shard_grad_op|no_shard|hybrid_shard|hybrid_shard_zero2)$/ {
        at = ""; for (i = 7; i < NF; ++i) at = at (at == "" ? "" : " ") $i
        printf "| %s | %s (%s) | %s | %s %s | %s %s | %s | %s |\n", name, np, rph, $1, $2, $3, $4, $5, $6, at }' "$log"
  done <<'DECKS'
gpt2-124m-4layer fp32 b2|2|1|perf/memory_plan/gpt2-124m-4layer.toml|
llama-small fp32 b8|2|1|inputs/llama-small.toml|
vit-mnist fp32 b20|2|1|inputs/vit-mnist.toml|
gpt2-large-scaled bf16+recompute b8|2|1|perf/memory_plan/gpt2-large-scaled.toml|--set train.micro_batch=8 --set fsdp.param_dtype=bf16 --set fsdp.activation_checkpointing=true
gpt2-xl-scaled fp32 b8|4|2|perf/memory_plan/gpt2-xl-scaled.toml|--set train.micro_batch=8
DECKS
fi

maxbatch_rows() {  # file -> markdown rows from the MAXBATCH lines
  awk '/^MAXBATCH/ { for (i = 2; i <= NF; ++i) { split($i, kv, "="); v[kv[1]] = kv[2] }
         if (v["max"] == 0) printf "| %s | %s | %s | OOM | - | - | %s |\n", deck, v["strategy"], v["ranks"], v["planned"]
         else printf "| %s | %s | %s | %s | %.2f | %.1f MiB | %s |\n", deck, v["strategy"], v["ranks"],
                     v["max"], v["step_s"], v["peak"] / 1048576, v["planned"] }' deck="$2" "$1"
}

if [[ " $TABLES " == *" maxbatch "* ]]; then
  echo
  echo "| model | strategy | ranks | max micro-batch | step time (s) | peak / rank | planned max |"
  echo "|---|---|---:|---:|---:|---:|---:|"
  for deck in gpt2-large-scaled gpt2-xl-scaled; do
    for np in 1 2 4; do
      log="$OUT/maxbatch-$deck-$np.txt"
      "${mpi[@]}" -np "$np" "$st" maxbatch "$here/$deck.toml" --strategy no_shard,shard_grad_op,full_shard \
        --memory-limit "$LIMIT" --steps 2 > "$log" 2>&1 < /dev/null || { tail -20 "$log"; exit 1; }
      maxbatch_rows "$log" "$deck"
    done
  done
fi

if [[ " $TABLES " == *" depth "* ]]; then
  echo
  echo "| model | strategy | ranks | max layers | parameters | step time (s) | peak / rank | planned max |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|"
  for np in 1 2 4; do
    for variant in plain recompute; do
      log="$OUT/depth-$np-$variant.txt"
      if [ $variant = plain ]; then strategies=no_shard,full_shard; sets=(); else strategies=full_shard; sets=(--set fsdp.activation_checkpointing=true); fi
      "${mpi[@]}" -np "$np" "$st" maxbatch "$here/gpt2-large-scaled.toml" --vary n_layers --strategy "$strategies" \
        --memory-limit "$LIMIT" --max 512 --steps 1 "${sets[@]}" > "$log" 2>&1 < /dev/null || { tail -20 "$log"; exit 1; }
      awk '/^MAXBATCH/ { for (i = 2; i <= NF; ++i) { split($i, kv, "="); v[kv[1]] = kv[2] }
             printf "| gpt2-large-scaled%s | %s | %s | %s | %.1f M | %.2f | %.1f MiB | %s |\n", rc, v["strategy"], v["ranks"],
                    v["max"], v["params"] / 1e6, v["step_s"], v["peak"] / 1048576, v["planned"] }' \
        rc="$([ $variant = recompute ] && echo ' +recompute' || true)" "$log"
    done
  done
fi
