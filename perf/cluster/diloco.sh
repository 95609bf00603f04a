#!/usr/bin/env bash
# DiLoCo (parallel.replica_sync = "diloco", docs/strategies.md) on the namespace test cluster,
# 2 nodes x 2 ranks (tests/cluster/cluster.sh), per link setting (unshaped, then tc tbf on each
# node's egress): full_shard and hybrid_shard syncing every step, hybrid_shard under DiLoCo at
# each H of --inner-steps (diloco.outer_dtype fp32, whole model), and the streaming variant
# (--streaming: fragments, overlap, outer dtype); for each: tokens/s, the bytes each node sent
# over its link per optimizer step (its veth counters: Ethernet frames, payload + headers), the
# engine's own inter-node counter, `shardtrain plan`'s inter-node bytes per step for the same
# deck, and the ratios the issue's goals are stated in (bytes vs hybrid_shard on the same link,
# tokens/s vs the same configuration unshaped and vs hybrid_shard on the same link).
#
#   perf/cluster/diloco.sh [SHARDTRAIN] [--rates "none 1gbit 100mbit"] [--inner-steps "10 50 100 500"]
#                          [--streaming "F TAU DTYPE H"] [--warmup W] [--steps K] [--reps N] [--only LABEL] [--set KEY=VALUE ...]
#
# Bytes per step: two runs per cell, W and W+K steps (same deck, same start-up and final
# checkpoint), (counters after the longer - after the shorter) / K, as perf/cluster/run.sh. For a
# DiLoCo cell K is rounded up to whole cycles (a multiple of H): every fragment syncs once in any
# H consecutive steps, so the difference holds exactly K / H outer syncs of each.
# tokens/s: the longer run's steps after W, their tokens over their summed time (a mean, so the
# steps that wait for an outer sync count; the median would leave them out).
# --reps N (default 1): N rounds over the rates; rounds after the first run only the DiLoCo cells'
# longer run again (tokens/s; the bytes are the first round's), and each DiLoCo cell's tokens/s
# is the median of its N runs. Rounds alternate the rates, so a change of the machine's load
# during the run falls on every rate alike (2 cores for 4 ranks: a single run moves by ±20%).
# --streaming "F TAU DTYPE H": one more cell, diloco.fragments F, diloco.overlap_steps TAU,
# diloco.outer_dtype DTYPE at inner_steps H (default "4 1 int4 100"; "" = none; F is at most the
# deck's units: wide.toml has 5). --only LABEL: that configuration only, with the two references.
# Output: a Markdown table on stdout, raw numbers in $OUT/diloco.tsv (OUT=perf/cluster/out).
# Needs root (namespaces); the cluster (its own name and subnet) is removed on exit.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
ST=$REPO/build/bin/shardtrain
[[ ${1:-} != --* && -n ${1:-} ]] && { ST=$(realpath "$1"); shift; }
RATES="none 1gbit 100mbit"
HS="10 50 100 500"
STREAM="4 1 int4 100"
K=12 W=4 ONLY= REPS=1
EXTRA=()  # --set KEY=VALUE: added to every configuration (e.g. fsdp.quant_guard_every=0)
usage() {
  echo "usage: $0 [SHARDTRAIN] [--rates R] [--inner-steps \"H ...\"] [--streaming \"F TAU DTYPE H\"] [--warmup W] [--steps K] [--reps N] [--only LABEL] [--set KEY=VALUE ...]" >&2
  exit 2
}
while [[ $# -gt 0 ]]; do
  case $1 in
    --rates) RATES=$2; shift 2 ;;
    --inner-steps) HS=$(tr ',' ' ' <<<"$2"); shift 2 ;;
    --streaming) STREAM=$2; shift 2 ;;
    --set) EXTRA+=("$2"); shift 2 ;;
    --warmup) W=$2; shift 2 ;;
    --steps) K=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    *) usage ;;
  esac
done
for h in $HS; do [[ $h =~ ^[1-9][0-9]*$ ]] || { echo "$0: --inner-steps: '$h' is not a positive integer" >&2; exit 2; }; done
[[ $K =~ ^[1-9][0-9]*$ && $W =~ ^[0-9]+$ && $REPS =~ ^[1-9][0-9]*$ ]] || { echo "$0: --steps K >= 1, --warmup W >= 0, --reps N >= 1" >&2; exit 2; }
if [[ -n $STREAM ]]; then
  read -r SF ST_TAU SDT SH <<<"$STREAM"
  [[ $SF =~ ^[1-9][0-9]*$ && $ST_TAU =~ ^[0-9]+$ && $SDT =~ ^(fp32|bf16|int8|int4)$ && $SH =~ ^[1-9][0-9]*$ ]] ||
    { echo "$0: --streaming '$STREAM': F TAU DTYPE H, e.g. \"4 1 int4 100\"" >&2; exit 2; }
fi
[[ -x $ST ]] || { echo "$0: no shardtrain binary at $ST (build it, or pass its path)" >&2; exit 2; }
DECK=$HERE/wide.toml
OUT=${OUT:-$HERE/out}
mkdir -p "$OUT"
CL=$REPO/tests/cluster
export SHARDTRAIN_CLUSTER=${SHARDTRAIN_CLUSTER:-dlc} SHARDTRAIN_CLUSTER_NET=${SHARDTRAIN_CLUSTER_NET:-41}
export OMP_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1
# Ring all-gathers and all-reduces, as the planner assumes (perf/cluster/run.sh).
export OMPI_MCA_coll_tuned_use_dynamic_rules=1 OMPI_MCA_coll_tuned_allgather_algorithm=4 OMPI_MCA_coll_tuned_allreduce_algorithm=4

# label|H (0: every step)|--set arguments
CONFIGS=(
  "full_shard|0|parallel.strategy=full_shard"
  "hybrid_shard|0|parallel.strategy=hybrid_shard"
)
for h in $HS; do
  CONFIGS+=("hybrid_shard diloco H=$h|$h|parallel.strategy=hybrid_shard parallel.replica_sync=diloco diloco.inner_steps=$h")
done
if [[ -n $STREAM ]]; then
  CONFIGS+=("hybrid_shard streaming H=$SH F=$SF tau=$ST_TAU $SDT|$SH|parallel.strategy=hybrid_shard parallel.replica_sync=diloco diloco.inner_steps=$SH diloco.fragments=$SF diloco.overlap_steps=$ST_TAU diloco.outer_dtype=$SDT")
fi
# Fail before the cluster is built when the binary refuses a configuration (an engine without DiLoCo).
for c in "${CONFIGS[@]}"; do
  IFS='|' read -r label _ setstr <<<"$c"
  read -r -a sets <<<"$setstr"; sets+=("${EXTRA[@]}")
  args=()
  for a in "${sets[@]}"; do args+=(--set "$a"); done
  "$ST" deck check "$DECK" "${args[@]}" > "$OUT/deck-check.log" 2>&1 ||
    { echo "$0: $label: the deck is refused:" >&2; tail -3 "$OUT/deck-check.log" >&2; exit 2; }
done

trap '"$CL/cluster.sh" stop >/dev/null 2>&1 || true' EXIT
trap 'exit 1' INT TERM
"$CL/cluster.sh" start 2

source "$HERE/lib.sh"
timed() {  # METRICS: "step_ms tokens_per_s inter_node_bytes" of the steps after W
  /usr/bin/python3 - "$1" "$W" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "step_ms" in r and r.get("step", 0) > int(sys.argv[2]):
        print(r["step_ms"], r.get("tokens_per_s", 0), r.get("inter_node_bytes", 0))
PY
}
# The plan's inter-node bytes per step (the busiest host's link) for the configuration's strategy.
plan_link() {  # SETS...
  local a sets=()
  for a in "$@"; do sets+=(--set "$a"); done
  "$ST" plan "$DECK" --ranks 4 --ranks-per-host 2 --compute-tflops 1 --strategy "$(sed -n 's/.*parallel.strategy=\([a-z_0-9]*\).*/\1/p' <<<"$*")" \
    "${sets[@]}" 2>/dev/null | grep -m1 '^host link / step' | cut -c27- |
    awk '{ v = $1; u = $2; m = 1; if (u == "KiB") m = 1024; if (u == "MiB") m = 1048576; if (u == "GiB") m = 1073741824; printf "%.0f", v * m }'
}

echo -e "rate\tconfig\tH\tsteps\ttokens_per_s\tstep_ms_median\tnode1_sent\tnode2_sent\tengine_inter\tplan_link\tfinal_loss" > "$OUT/diloco.tsv"
echo -e "rate\tconfig\tround\ttokens_per_s" > "$OUT/diloco-reps.tsv"
for ((round = 1; round <= REPS; round++)); do
for rate in $RATES; do
  "$CL/cluster.sh" rate "$rate"
  for c in "${CONFIGS[@]}"; do
    IFS='|' read -r label h setstr <<<"$c"
    [[ -n $ONLY && $label != "$ONLY" && $label != full_shard && $label != hybrid_shard ]] && continue
    ((round > 1 && h == 0)) && continue
    read -r -a sets <<<"$setstr"; sets+=("${EXTRA[@]}")
    k=$K
    if ((h > 0)); then k=$(((K + h - 1) / h * h)); fi  # whole cycles
    tag=$(tr -c 'a-zA-Z0-9\n' '_' <<<"$label")
    if ((round > 1)); then
      counted_run $((W + k)) "$OUT/dlc-$rate-$tag-r$round" "${sets[@]}" log.every=1 > /dev/null
      tps=$(timed "$OUT/dlc-$rate-$tag-r$round/metrics.jsonl" | awk '{ ms += $1; tok += $2 * $1 / 1e3 } END { printf "%.1f", tok / (ms / 1e3) }')
      echo -e "$rate\t$label\t$round\t$tps" | tee -a "$OUT/diloco-reps.tsv" >&2
      continue
    fi
    a=$(counted_run "$W" "$OUT/dlc-$rate-$tag-short" "${sets[@]}" log.every=1)
    b=$(counted_run $((W + k)) "$OUT/dlc-$rate-$tag" "${sets[@]}" log.every=1)
    per=$(paste -d' ' <(tr ' ' '\n' <<<"$a") <(tr ' ' '\n' <<<"$b") | awk -v k="$k" 'NF == 2 { printf "%.0f\t", ($2 - $1) / k }')
    m=$OUT/dlc-$rate-$tag/metrics.jsonl
    stats=$(timed "$m" | awk '{ ms += $1; tok += $2 * $1 / 1e3; inter += $3; n++ }
      END { printf "%.1f\t%.0f", tok / (ms / 1e3), inter / n }')
    IFS=$'\t' read -r tps inter <<<"$stats"
    med=$(timed "$m" | awk '{ print $1 }' | median)
    loss=$(sed -n 's/.*"loss":\([^,}]*\).*/\1/p' "$m" | tail -1)
    pl=$(plan_link "${sets[@]}")
    echo -e "$rate\t$label\t$h\t$k\t$tps\t$med\t${per%$'\t'}\t$inter\t${pl:--}\t$loss" | tee -a "$OUT/diloco.tsv" >&2
    echo -e "$rate\t$label\t1\t$tps" >> "$OUT/diloco-reps.tsv"
  done
done
done
# Each cell's tokens/s: the median of its rounds.
awk -F'\t' 'NR == FNR { if (FNR > 1) v[$1 "\t" $2] = v[$1 "\t" $2] " " $4; next }
  FNR > 1 { n = split(substr(v[$1 "\t" $2], 2), x, " "); if (n > 0) { asort_n(x, n); $5 = (n % 2 ? x[(n + 1) / 2] : (x[n / 2] + x[n / 2 + 1]) / 2); $5 = $5 "" } }
  { print }
  function asort_n(a, n,   i, j, t) { for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t } }' \
  OFS='\t' "$OUT/diloco-reps.tsv" "$OUT/diloco.tsv" > "$OUT/diloco.tsv.median" && mv "$OUT/diloco.tsv.median" "$OUT/diloco.tsv"
"$CL/cluster.sh" stop
trap - EXIT

echo "# $(date -u +%Y-%m-%dT%H:%MZ), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc --all) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
mb() { awk -v b="$1" 'BEGIN { printf "%.3f", b / 1e6 }'; }
echo "| link | configuration | steps | tokens/s (median of runs) | vs unshaped | vs hybrid_shard | step (ms, median) | node 1 sent / step (MB) | node 2 sent / step (MB) | link bytes vs hybrid_shard | engine: inter-node / step (MB, all ranks) | plan: host link / step (MB) | loss at the last step |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for rate in $RATES; do
  hs_tps=$(awk -F'\t' -v r="$rate" '$1 == r && $2 == "hybrid_shard" { print $5 }' "$OUT/diloco.tsv")
  hs_b=$(awk -F'\t' -v r="$rate" '$1 == r && $2 == "hybrid_shard" { print ($7 > $8 ? $7 : $8) }' "$OUT/diloco.tsv")
  awk -F'\t' -v r="$rate" '$1 == r' "$OUT/diloco.tsv" | while IFS=$'\t' read -r _ label _ k tps med n1 n2 ei pl loss; do
    un=$(awk -F'\t' -v l="$label" '$1 == "none" && $2 == l { print $5 }' "$OUT/diloco.tsv")
    ratio() { awk -v a="$1" -v b="$2" -v f="$3" 'BEGIN { if (a == "" || b == "" || b == 0) print "-"; else printf f, a / b }'; }
    plmb=-
    [[ $pl != - ]] && plmb=$(mb "$pl")
    echo "| $rate | $label | $k | $(printf %.0f "$tps") | $(ratio "$tps" "$un" %.2fx) | $(ratio "$tps" "$hs_tps" %.2fx) | $(printf %.0f "$med") | $(mb "$n1") | $(mb "$n2") | $(awk -v a="$n1" -v b="$n2" -v h="$hs_b" 'BEGIN { m = a > b ? a : b; if (m <= 0 || h <= 0) print "-"; else if (m >= h) printf "%.2fx", m / h; else printf "1/%.0f", h / m }') | $(mb "$ei") | $plmb | $loss |"
  done
done
if ((REPS > 1)); then
  echo
  echo "tokens/s of each run (the table shows the median of a cell's runs; the references run once):"
  awk -F'\t' 'NR > 1 { v[$1 " | " $2] = v[$1 " | " $2] " " $4 } END { for (k in v) print "- " k ":" v[k] }' "$OUT/diloco-reps.tsv" | sort
fi
