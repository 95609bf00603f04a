#!/usr/bin/env bash
# Quantized collectives (ZeRO++ qwZ / qgZ: fsdp.quantize_weights, fsdp.quantize_grads) on the
# namespace test cluster, 2 nodes x 2 ranks (tests/cluster/cluster.sh), per link setting: step
# time (median of metrics.jsonl's step_ms after W warm-up steps), the bytes each node sent over
# its link per step (its veth counters: Ethernet frames, payload + headers), the engine's own
# inter-node byte counter (metrics.jsonl inter_node_bytes: the ring model, summed over ranks) and
# the final loss, for full_shard, hybrid_shard and hybrid_shard with each option.
#
#   perf/cluster/zeropp.sh [SHARDTRAIN] [--rates "none 250mbit"] [--steps K] [--only LABEL]
# (--only: just the configuration of that label, e.g. "hybrid_shard + qgZ"; full_shard and
# hybrid_shard are still run, as the table's references)
#
# Bytes per step: (counters over a W+K-step run - over a W-step run) / K, as perf/cluster/run.sh.
# Output: a Markdown table on stdout, raw numbers in $OUT/zeropp.tsv (OUT=perf/cluster/out).
# Needs root (namespaces); the cluster (its own name and subnet) is removed on exit.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
ST=$REPO/build/bin/shardtrain
[[ ${1:-} != --* && -n ${1:-} ]] && { ST=$(realpath "$1"); shift; }
RATES="none 250mbit"
K=6 W=2 ONLY=
while [[ $# -gt 0 ]]; do
  case $1 in
    --rates) RATES=$2; shift 2 ;;
    --steps) K=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    *) echo "usage: $0 [SHARDTRAIN] [--rates R] [--steps K]" >&2; exit 2 ;;
  esac
done
DECK=$HERE/wide.toml
OUT=${OUT:-$HERE/out}
mkdir -p "$OUT"
CL=$REPO/tests/cluster
export SHARDTRAIN_CLUSTER=${SHARDTRAIN_CLUSTER:-zpp} SHARDTRAIN_CLUSTER_NET=${SHARDTRAIN_CLUSTER_NET:-37}
export OMP_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1
export OMPI_MCA_coll_tuned_use_dynamic_rules=1 OMPI_MCA_coll_tuned_allgather_algorithm=4 OMPI_MCA_coll_tuned_allreduce_algorithm=4
trap '"$CL/cluster.sh" stop >/dev/null 2>&1 || true' EXIT
trap 'exit 1' INT TERM
"$CL/cluster.sh" start 2

# label|--set arguments
CONFIGS=(
  "full_shard|parallel.strategy=full_shard"
  "full_shard + qwZ|parallel.strategy=full_shard fsdp.quantize_weights=true"
  "full_shard + hpZ|parallel.strategy=full_shard fsdp.secondary_shards=true"
  "full_shard + qwZ + hpZ|parallel.strategy=full_shard fsdp.quantize_weights=true fsdp.secondary_shards=true"
  "hybrid_shard|parallel.strategy=hybrid_shard"
  "hybrid_shard + qwZ|parallel.strategy=hybrid_shard fsdp.quantize_weights=true"
  "hybrid_shard + qgZ|parallel.strategy=hybrid_shard fsdp.quantize_grads=true"
  "hybrid_shard + qwZ + qgZ|parallel.strategy=hybrid_shard fsdp.quantize_weights=true fsdp.quantize_grads=true"
)

source "$HERE/lib.sh"
field() {  # METRICS KEY: the key's values of the steps after W
  sed -n 's/.*"step":\([0-9]*\).*/\1 &/p' "$1" | awk -v w="$W" '$1 > w' | sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p"
}

echo -e "rate\tconfig\tstep_ms\tnode1_sent\tnode2_sent\tengine_inter\tengine_intra\tfinal_loss" > "$OUT/zeropp.tsv"
for rate in $RATES; do
  "$CL/cluster.sh" rate "$rate"
  for c in "${CONFIGS[@]}"; do
    label=${c%%|*}
    [[ -n $ONLY && $label != "$ONLY" && $label != full_shard && $label != hybrid_shard ]] && continue
    read -r -a sets <<<"${c#*|}"
    tag=$(tr -c 'a-z0-9\n' '_' <<<"$label")
    a=$(counted_run "$W" "$OUT/zpp-$rate-$tag-short" "${sets[@]}")
    b=$(counted_run $((W + K)) "$OUT/zpp-$rate-$tag" "${sets[@]}")
    per=$(paste -d' ' <(tr ' ' '\n' <<<"$a") <(tr ' ' '\n' <<<"$b") | awk -v k="$K" 'NF == 2 { printf "%.0f\t", ($2 - $1) / k }')
    m=$OUT/zpp-$rate-$tag/metrics.jsonl
    ms=$(field "$m" step_ms | median)
    ei=$(field "$m" inter_node_bytes | median)
    ea=$(field "$m" intra_node_bytes | median)
    loss=$(sed -n 's/.*"loss":\([^,}]*\).*/\1/p' "$m" | tail -1)
    echo -e "$rate\t$label\t$ms\t${per%$'\t'}\t$ei\t$ea\t$loss" | tee -a "$OUT/zeropp.tsv" >&2
  done
done
"$CL/cluster.sh" stop
trap - EXIT

mb() { awk -v b="$1" 'BEGIN { printf "%.2f", b / 1e6 }'; }
echo "| link | configuration | step (ms) | vs full_shard | node 1 sent / step (MB) | node 2 sent / step (MB) | link bytes vs hybrid_shard | engine: inter-node / step (MB, all ranks) | engine: intra-node / step (MB) | loss at step $((W + K)) |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for rate in $RATES; do
  fs=$(awk -F'\t' -v r="$rate" '$1 == r && $2 == "full_shard" { print $3 }' "$OUT/zeropp.tsv")
  hs=$(awk -F'\t' -v r="$rate" '$1 == r && $2 == "hybrid_shard" { print ($4 > $5 ? $4 : $5) }' "$OUT/zeropp.tsv")
  awk -F'\t' -v r="$rate" '$1 == r' "$OUT/zeropp.tsv" | while IFS=$'\t' read -r _ label ms n1 n2 ei ea loss; do
    echo "| $rate | $label | $(printf %.0f "$ms") | $(awk -v a="$ms" -v b="$fs" 'BEGIN { printf "%.2f", a / b }') | $(mb "$n1") | $(mb "$n2") | $(awk -v a="$n1" -v b="$n2" -v h="$hs" 'BEGIN { printf "%.3f", (a > b ? a : b) / h }') | $(mb "$ei") | $(mb "$ea") | $loss |"
  done
done
