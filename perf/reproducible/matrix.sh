#!/usr/bin/env bash
# matrix.sh: the whole train.reproducible matrix, which is broader than the CTest case
# (tests/e2e/train/reproducible.sh). Every strategy runs at 1, 2, 4 and 8 ranks, and for each
# strategy a 4-rank run is stopped at step 2 and resumed at 2 ranks. Every final checkpoint
# is compared with the 1-rank full_shard run's: h5diff of /model and /optim, and the
# metrics.jsonl step records as strings. Prints one table row per strategy and exits 1 on any
# difference. Hybrid strategies simulate 2 ranks per host (at 1 rank: one host).
#   perf/reproducible/matrix.sh [build-dir]       (default build/; needs bin/shardtrain, h5diff)
# Env: DECK (default tests/e2e/train/tiny.toml: tiny GPT-2, dropout 0.1, clipping), STEPS (4).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../.."
build="${1:-$root/build}"
st="$build/bin/shardtrain"
[ -x "$st" ] || { echo "no $st" >&2; exit 1; }
DECK=${DECK:-$root/tests/e2e/train/tiny.toml} STEPS=${STEPS:-4}
work=$(mktemp -d "${TMPDIR:-/tmp}/repro-matrix-XXXXXX")
trap 'rm -rf "$work"' EXIT
mpi=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
export OMPI_MCA_ess_singleton_isolated=1
awk 'BEGIN { srand(11); split("the of and to a in that it was her she not be his as had with for he you", w, " ");
  for (l = 0; l < 800; ++l) { s = ""; for (i = 0; i < 9; ++i) s = s w[int(rand() * 20) + 1] " "; print s "." } }' > "$work/text.txt"
"$st" data prepare --source "$work/text.txt" --tokenizer byte --out "$work/data" > /dev/null 2>&1
COMMON=(--set train.reproducible=true --set train.global_batch=8 --set train.micro_batch=1 --set "train.max_steps=$STEPS"
        --set "data.dataset=$work/data")
run() {  # run NP OUT [--set ...]
  local np=$1 out=$2; shift 2
  local hosts=0
  [ "$np" -ge 2 ] && hosts=2
  "${mpi[@]}" -np "$np" "$st" train "$DECK" "${COMMON[@]}" --set "parallel.simulate_ranks_per_host=$hosts" \
    --set "run.out_dir=$out" "$@" >> "$out.log" 2>&1 ||
    { tail -20 "$out.log"; echo "run failed: $out" >&2; exit 1; }
}
steps() { sed -n 's/.*"grad_norm":\([^,}]*\).*"loss":\([^,}]*\).*"lr":\([^,}]*\).*"step":\([0-9]*\).*/\4 \2 \1 \3/p' "$1/metrics.jsonl"; }
last=$(printf '%s/checkpoints/step_%08d.h5' "" "$STEPS")
same() {  # same DIR: "=" when DIR matches the reference, else "DIFF"
  steps "$1" | cmp -s - "$work/ref.steps" || { echo DIFF; return; }
  for g in /model /optim; do h5diff -q "$work/ref$last" "$1$last" "$g" "$g" > /dev/null || { echo DIFF; return; }; done
  echo "="
}
run 1 "$work/ref"
steps "$work/ref" > "$work/ref.steps"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(basename "$DECK"), $STEPS steps, 8 leaves; '=' : same bits as 1 rank full_shard (steps as strings, h5diff /model /optim)"
echo "| strategy | 1 | 2 | 4 | 8 | 4 -> 2 resume |"
echo "|---|:-:|:-:|:-:|:-:|:-:|"
bad=0
for s in full_shard shard_grad_op no_shard hybrid_shard hybrid_shard_zero2; do
  row="| $s |"
  for np in 1 2 4 8; do
    run "$np" "$work/$s-$np" --set "parallel.strategy=$s"
    r=$(same "$work/$s-$np"); row+=" $r |"; [ "$r" = "=" ] || bad=1
  done
  run 4 "$work/$s-res" --set "parallel.strategy=$s" --set train.max_steps=2
  run 2 "$work/$s-res" --set "parallel.strategy=$s"
  r=$(same "$work/$s-res"); row+=" $r |"; [ "$r" = "=" ] || bad=1
  echo "$row"
done
exit $bad
