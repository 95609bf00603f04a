#!/usr/bin/env bash
# The hybrid-shard experiment on a real (namespace) cluster: 2 nodes x 2 ranks of
# tests/cluster/cluster.sh, the inter-node link unshaped, at 1 Gbit/s and at 250 Mbit/s (tbf on
# each node's egress), every strategy: step time, exposed-communication share (metrics.jsonl), and
# the bytes that crossed each node's link per step (the node's veth counters in
# /sys/class/net/stv-*/statistics, Ethernet frames: payload + TCP/IP/Ethernet headers), next to
# `shardtrain plan`'s inter-host bytes per step, its estimated step time per strategy and its
# recommendation (the shortest estimated step) for that link, from inputs measured here (below).
#
#   perf/cluster/run.sh [SHARDTRAIN] [--rates "none 1gbit 250mbit"] [--strategies "..."] [--warmup W] [--steps K]
#                       [--reps R] [--input-reps I] [--table-only]
#
# Bytes per step: two runs per cell, W and W+K steps (same deck, same start-up, same final
# checkpoint); (counters after the longer - counters after the shorter) / K cancels MPI wire-up,
# initialisation and the checkpoint write. Step time and comm share: the median of the longer
# run's steps after the first W (with --reps R: of R such runs, the strategies in turn; W = 4 by
# default because steps 3-5 were often still warming up, by up to 2x). Which differences are
# resolved: each run's own median too; a strategy whose fastest run is not slower than the
# fastest strategy's slowest run is reported beside it ("A ~ B": the runs do not order them),
# and the plan's pick counts as the measured fastest when it is one of those. Output:
# a Markdown table on stdout, raw numbers in $OUT/raw.tsv
# (OUT=perf/cluster/out by default). The planner's inputs: each the median of I measurements
# (--input-reps, default 3; one reading of core_us moved by 30% between runs). Needs root
# (namespaces); the cluster is removed on exit. DiLoCo (parallel.replica_sync = diloco) against
# these strategies, per H and link setting: perf/cluster/diloco.sh.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
ST=$REPO/build/bin/shardtrain
[[ ${1:-} != --* && -n ${1:-} ]] && { ST=$(realpath "$1"); shift; }
RATES="none 1gbit 250mbit"
STRATS="full_shard shard_grad_op no_shard hybrid_shard hybrid_shard_zero2"
K=12 W=4 REPS=1 IREPS=3 TABLE_ONLY=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --rates) RATES=$2; shift 2 ;;
    --strategies) STRATS=$2; shift 2 ;;
    --warmup) W=$2; shift 2 ;;          # untimed steps at the start of every run
    --steps) K=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;          # timed runs per cell (step time: median over all their steps)
    --input-reps) IREPS=$2; shift 2 ;;   # measurements per planner input (their median)
    --table-only) TABLE_ONLY=1; shift ;;   # the runs' raw.tsv exists: weights, planner and table only
    *) echo "usage: $0 [SHARDTRAIN] [--rates R] [--strategies S] [--warmup W] [--steps K] [--reps R] [--input-reps I] [--table-only]" >&2; exit 2 ;;
  esac
done
DECK=$HERE/wide.toml
OUT=${OUT:-$HERE/out}
mkdir -p "$OUT"
CL=$REPO/tests/cluster
export SHARDTRAIN_CLUSTER=${SHARDTRAIN_CLUSTER:-pf} SHARDTRAIN_CLUSTER_NET=${SHARDTRAIN_CLUSTER_NET:-20}
export OMP_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1
# Ring all-gathers and all-reduces, as the planner assumes (shardtrain's reduce-scatter is its own
# ring already). Open MPI's defaults at 4 ranks are recursive doubling (all-gather: each host
# sends the whole gathered buffer, 4/3 of the ring's 3/4) and Rabenseifner (all-reduce: 1x the
# buffer instead of the ring's 1.5x); COLL=default keeps them.
if [[ ${COLL:-ring} == ring ]]; then
  export OMPI_MCA_coll_tuned_use_dynamic_rules=1 OMPI_MCA_coll_tuned_allgather_algorithm=4 OMPI_MCA_coll_tuned_allreduce_algorithm=4
fi
trap '"$CL/cluster.sh" stop >/dev/null 2>&1 || true' EXIT
trap 'exit 1' INT TERM
"$CL/cluster.sh" start 2

# link_bytes: "tx1 rx1 tx2 rx2" of the nodes (the root-side veth's rx = what the node sent)
link_bytes() {
  local i v
  for i in 1 2; do
    v=stv-$SHARDTRAIN_CLUSTER-n$i
    echo -n "$(cat /sys/class/net/$v/statistics/rx_bytes) $(cat /sys/class/net/$v/statistics/tx_bytes) "
  done
  echo
}
run() { # STRATEGY STEPS DIR: prints the counter deltas "tx1 rx1 tx2 rx2"
  local before after
  rm -rf "$3"
  before=$(link_bytes)
  "$CL/mpirun-cluster" -np 4 "$ST" train "$DECK" --set parallel.strategy="$1" --set train.max_steps="$2" \
    --set run.out_dir="$3" > "$3.log" 2>&1 || { tail -20 "$3.log" >&2; echo "run $1 $2 failed" >&2; exit 1; }
  after=$(link_bytes)
  paste -d' ' <(tr ' ' '\n' <<<"$before") <(tr ' ' '\n' <<<"$after") | awk 'NF == 2 { printf "%.0f ", $2 - $1 } END { print "" }'
}
source "$HERE/lib.sh"  # median

# The planner, for 4 ranks, 2 per host; the link's weight for the recommendation:
# one inter-host byte costs W intra-host bytes, W = (intra-host bandwidth) / (link bandwidth).
plan_out() { "$ST" plan "$DECK" --ranks 4 --ranks-per-host 2 "$@" 2>/dev/null; }

run_dir() { if [[ $3 == 1 ]]; then echo "$OUT/$1-$2"; else echo "$OUT/$1-$2-rep$3"; fi; }  # RATE STRATEGY REP
run_steps() { # DIR FIELD: that field of the run's timed steps (after the first W)
  sed -n 's/.*"step":\([0-9]*\).*/\1 &/p' "$1/metrics.jsonl" | awk -v w="$W" '$1 > w' | sed -n "s/.*\"$2\":\\([^,}]*\\).*/\\1/p"
}
steps() { # RATE STRATEGY FIELD: that field of every timed step of the cell's runs
  local r
  for ((r = 1; r <= REPS; r++)); do run_steps "$(run_dir "$1" "$2" $r)" "$3"; done
}
run_medians() { # RATE STRATEGY: each run's median step (ms), "a/b/c"
  local r out=()
  for ((r = 1; r <= REPS; r++)); do out+=("$(run_steps "$(run_dir "$1" "$2" $r)" step_ms | median | awk '{ printf "%.0f", $1 }')"); done
  (IFS=/; echo "${out[*]}")
}

if [[ $TABLE_ONLY == 0 ]]; then
echo -e "rate\tstrategy\tstep_ms\tcomm_share\tnode1_tx_per_step\tnode1_rx_per_step\tnode2_tx_per_step\tnode2_rx_per_step\trun_medians_ms" > "$OUT/raw.tsv"
for rate in $RATES; do
  "$CL/cluster.sh" rate "$rate"
  declare -A PER=()
  for s in $STRATS; do
    a=$(run "$s" "$W" "$OUT/$rate-$s-short")
    b=$(run "$s" $((W + K)) "$(run_dir "$rate" "$s" 1)")
    PER[$s]=$(paste -d' ' <(tr ' ' '\n' <<<"$a") <(tr ' ' '\n' <<<"$b") | awk -v k="$K" 'NF == 2 { printf "%.0f\t", ($2 - $1) / k }')
  done
  # More timed runs, the strategies in turn (so that a slow spell of the machine hits them alike).
  for ((r = 2; r <= REPS; r++)); do
    for s in $STRATS; do run "$s" $((W + K)) "$(run_dir "$rate" "$s" $r)" > /dev/null; done
  done
  for s in $STRATS; do
    ms=$(steps "$rate" "$s" step_ms | median)
    cs=$(steps "$rate" "$s" comm_share | median)
    echo -e "$rate\t$s\t$ms\t$cs\t${PER[$s]%$'\t'}\t$(run_medians "$rate" "$s")" | tee -a "$OUT/raw.tsv" >&2
  done
done
fi
# The planner's inputs, measured here (docs/memory-planner.md, "Step time"):
#   intra  the bandwidth of one ring edge inside a node: `shardtrain bench collectives --op
#          all_reduce` (16 MiB, median busbw) over the 2 ranks of node 1 and, at the same time in the
#          same job (--group-size 2), over those of node 2 (the nodes share this machine's cores: as
#          hybrid's shard groups run; two jobs side by side overlap only in part);
#   W_e    intra / the busbw of a ring edge across a node's link when e edges leave the node at
#          once, each measured with the pattern that puts e edges on the link: W (e = 1) 4 ranks,
#          2 per node (the world ring of full_shard, shard_grad_op, no_shard); W2 (e = 2) the
#          2-rank groups {0,2}, {1,3} across the nodes at once in one job (--strided: hybrid's
#          replicate rings). W2 is not
#          2 W: a 2-rank all-reduce's two phases stall the link between them, and two such flows
#          through one shaped link get less than a fair split of its rate (perf/README.md);
#   core costs  per op and ring kind (link: the world ring of the 4 ranks, across the nodes;
#          intra: the 2 ranks of each node, both nodes' groups at once, --group-size 2), from
#          `bench collectives --compute-ms 20` on 16 MiB, unshaped:
#          core weight = core_us (what the collective adds to matmuls running beside it) over the
#          time of the bytes a rank sends at the intra-node edge's bandwidth; not W unshaped, which
#          would make all of a link byte's time core time (the pipelined reduce-scatter adds only
#          0.4-0.6 of its time to compute beside it);
#          sync = sync_us (clamped at 0): what the collective costs beyond its in-step time when
#          the ranks arrive from 20 ms of matmuls (about this deck's compute between two
#          collectives). Inside a node 0.2-1 ms (medians; single readings up to 10 ms: a
#          shared-memory exchange needs both ranks scheduled at once), on the TCP ring about 0
#          (socket buffers let the early one go on);
#   latency  a 1 KiB all_reduce over the 4 ranks / its 6 ring steps, unshaped;
#   compute  the achieved TFLOP/s of one rank alone (1 thread, no communication: the deck's
#          step at one sequence, no_shard), median of its steps after the first 2;
#   cores per host  this machine's cores / the 2 nodes (the namespaces share them).
busbw() { # NODES NP [OP]: the median busbw (GB/s) of OP (all_reduce) over NP ranks on NODES nodes
  "$CL/mpirun-cluster" --nodes "$1" -np "$2" "$ST" bench collectives --op "${3:-all_reduce}" --min-bytes 16M --max-bytes 16M \
    --dtype fp32 --iters 10 --warmup 2 2>/dev/null | awk -v op="${3:-all_reduce}" '$1 == op { print $7 }'
}
busbw_groups() { # FLAGS: the busbw (GB/s) of 16 MiB all_reduces in 2-rank groups at once, in one job of the 4
  # ranks (so that the groups run together, as the mesh's do): contiguous = {0,1} {2,3}, the shard
  # groups inside the nodes; --strided = {0,2} {1,3}, hybrid's replicate pairs across the link
  # shellcheck disable=SC2086
  "$CL/mpirun-cluster" -np 4 "$ST" bench collectives --op all_reduce --min-bytes 16M --max-bytes 16M --dtype fp32 \
    --iters 10 --warmup 2 --group-size 2 $1 2>/dev/null | awk '$1 == "all_reduce" { print $7 }'
}
busbw_pair() { busbw_groups --strided; }
busbw_intra() { busbw_groups ""; }
latency() { # the per-ring-step time (us) of a 1 KiB all_reduce over the 4 ranks (6 ring steps)
  "$CL/mpirun-cluster" -np 4 "$ST" bench collectives --op all_reduce --min-bytes 1K --max-bytes 1K --dtype fp32 \
    --iters 20 --warmup 2 2>/dev/null | awk '$1 == "all_reduce" { printf "%.1f\n", $5 / 6 }'
}
inputs() { local i; for ((i = 0; i < IREPS; i++)); do "$@"; done | median; }  # CMD...: median of IREPS runs
"$CL/cluster.sh" rate none
intra=$(inputs busbw_intra)
link0=$(inputs busbw 2 4)
lat=$(inputs latency)
core_costs() { # KIND FLAGS: "op bytes sync_us core_us" per op (medians of IREPS runs) of 16 MiB collectives
  # after 20 ms of matmuls (--compute-ms 20) over the rings of KIND: link = the world ring of the 4
  # ranks (across the links), intra = 2-rank groups inside the nodes, both at once (--group-size 2)
  local i op
  for ((i = 0; i < IREPS; i++)); do
    for op in all_gather reduce_scatter all_reduce; do
      # shellcheck disable=SC2086
      "$CL/mpirun-cluster" -np 4 "$ST" bench collectives --op $op --min-bytes 16M --max-bytes 16M --dtype fp32 --iters 12 \
        --warmup 2 --compute-ms 20 $2 2>/dev/null | awk -v op=$op '$1 == op { print $1, $2, $11, $12 }'
    done
  done > "$OUT/cores-$1-all.txt"
  for op in all_gather reduce_scatter all_reduce; do
    echo "$op $(awk -v op=$op '$1 == op { print $2; exit }' "$OUT/cores-$1-all.txt")" \
      "$(awk -v op=$op '$1 == op { print $3 }' "$OUT/cores-$1-all.txt" | median)" \
      "$(awk -v op=$op '$1 == op { print $4 }' "$OUT/cores-$1-all.txt" | median)"
  done > "$OUT/cores-$1.txt"
}
core_costs link ""
core_costs intra "--group-size 2"
# Per op (all_gather, reduce_scatter, all_reduce) and ring kind: the sync cost (us, clamped at 0),
# and the core weight: core_us over the model's time of the bytes one rank sends (G = 4 ranks on
# the link ring, 2 in a node's group: (G-1)/G x size for all_gather and reduce_scatter, 2(G-1)/G
# x size for all_reduce) at the intra-node edge's bandwidth.
syncs() { awk '{ printf "%s%.0f", (NR > 1 ? "," : ""), ($3 > 0 ? $3 : 0) }' "$OUT/cores-$1.txt"; }
weights() { # KIND G
  awk -v b="$intra" -v g="$2" '{ f = (g - 1) / g; sent = ($1 == "all_reduce" ? 2 * f : f) * $2; w = $4 * 1e-6 * b * 1e9 / sent
    printf "%s%.3f", (NR > 1 ? "," : ""), (w > 0 ? w : 0) }' "$OUT/cores-$1.txt"
}
sync=$(syncs link) isync=$(syncs intra)
W0=$(weights link 4) iW0=$(weights intra 2)
# The optimizer per parameter (bench_optim: adamw fused + the clipping norm's sum_of_squares, one
# core), so that the rate below is forward + backward's and each strategy's optimizer its shards'.
optns=$("$(dirname "$ST")/bench_optim" 16 2>/dev/null | awk -F'|' '$3 ~ /adamw fused, 1 range/ || $3 ~ /sum_of_squares/ { ms += $4 }
  END { printf "%.3f", ms * 1e6 / (16 * 1048576) }')
rm -rf "$OUT/compute"
"$ST" train "$DECK" --set parallel.strategy=no_shard --set train.global_batch=1 --set train.max_steps=$((W + K)) \
  --set run.out_dir="$OUT/compute" > "$OUT/compute.log" 2>&1 || { tail -20 "$OUT/compute.log" >&2; exit 1; }
# Its rate without the optimizer: FLOPs (tflops x step) over the step less the optimizer's time
# on every parameter (no_shard at one rank updates them all).
nparams=$("$ST" plan "$DECK" --ranks 1 2>/dev/null | sed -n 's/.*x [0-9]*, [0-9]* heads, \([0-9,]*\) parameters.*/\1/p' | tr -d ,)
tflops=$(sed -n 's/.*"step":\([0-9]*\).*/\1 &/p' "$OUT/compute/metrics.jsonl" | awk -v w="$W" '$1 > w' |
  sed -n 's/.*"step_ms":\([^,}]*\).*"tflops":\([^,}]*\).*/\1 \2/p' |
  awk -v ns="$optns" -v n="$nparams" '{ ms = $1; print $2 * ms / (ms - ns * n * 1e-6) }' | median)
cores=$(( $(nproc) / 2 ))
[[ $cores -ge 1 ]] || cores=1
echo -e "rate\tintra_GBps\tlink_GBps\tW\tlink2_GBps\tW2" > "$OUT/weights.tsv"
for rate in $RATES; do
  "$CL/cluster.sh" rate "$rate"
  if [[ $rate == none ]]; then inter=$link0; else inter=$(inputs busbw 2 4); fi  # unshaped: measured above
  inter2=$(inputs busbw_pair)
  echo -e "$rate\t$intra\t$inter\t$(awk -v a="$intra" -v b="$inter" 'BEGIN { printf "%.2f", a / b }')\t$inter2\t$(awk -v a="$intra" -v b="$inter2" 'BEGIN { printf "%.2f", a / b }')" >> "$OUT/weights.tsv"
done
echo -e "intra_GBps\tlink_core_weight\tlatency_us\tsync_us\tcompute_tflops\tcores_per_host\toptimizer_ns\tintra_core_weight\tintra_sync_us" > "$OUT/inputs.tsv"
echo -e "$intra\t$W0\t$lat\t$sync\t$tflops\t$cores\t$optns\t$iW0\t$isync" >> "$OUT/inputs.tsv"
"$CL/cluster.sh" stop
trap - EXIT
cat "$OUT/weights.tsv" "$OUT/inputs.tsv" >&2

# The planner per setting: its host-link bytes per step ("host link / step", busiest host), its
# estimated step and exposed communication per strategy, and its recommendation (the shortest
# estimated step), from the inputs measured above.
to_bytes() { awk '{ v = $1; u = $2; m = 1; if (u == "KiB") m = 1024; if (u == "MiB") m = 1048576; if (u == "GiB") m = 1073741824; printf "%.0f", v * m }'; }
IFS=$'\t' read -r intra W0 lat sync tflops cores optns iW0 isync < <(tail -1 "$OUT/inputs.tsv")
plan_flags() { # RATE: the plan's flags for that link setting
  echo "--inter-host-weight $(awk -v r="$1" '$1 == r { print $4 "," $6 }' "$OUT/weights.tsv") --compute-tflops $tflops" \
    "--intra-host-busbw $intra --latency-us $lat --cores-per-host $cores --link-core-weight $W0 --sync-us $sync" \
    "--intra-core-weight $iW0 --intra-sync-us $isync --optimizer-ns-per-param $optns"
}
declare -A PLAN REC EST EXP
cell() { # PLAN-TEXT ROW-LABEL STRATEGY-INDEX: one cell of the plan's table (labels fill 26 columns)
  local line
  line=$(grep -m1 -F -- "$2" <<<"$1" | cut -c27-)
  awk -v i="$3" '{ n = split($0, a, /  +/); print a[i + 1] }' <<<"$(sed 's/^ *//' <<<"$line")"
}
for rate in $RATES; do
  # shellcheck disable=SC2046
  plan=$("$ST" plan "$DECK" --ranks 4 --ranks-per-host 2 $(plan_flags "$rate") 2>/dev/null)
  echo "$plan" > "$OUT/plan-$rate.txt"
  REC[$rate]=$(sed -n 's/^recommendation: parallel.strategy = "\([a-z_0-9]*\)".*/\1/p' <<<"$plan")
  header=$(grep -m1 -E '^ +full_shard' <<<"$plan")
  i=0
  for s in $header; do
    PLAN[$s]=$(cell "$plan" "host link / step" $i | to_bytes)
    EST[$rate,$s]=$(cell "$plan" "est. step" $i | awk '{ printf "%.0f", $1 }')
    EXP[$rate,$s]=$(cell "$plan" "est. exposed comm" $i | awk '{ printf "%.0f", $1 }')
    i=$((i + 1))
  done
done
echo "# inputs: $(plan_flags "<rate>")" >&2

mb() { awk -v b="$1" 'BEGIN { printf "%.2f", b / 1e6 }'; }
# The measured fastest at RATE: the lowest step, then "~ B" for each strategy B whose fastest run
# is not slower than that strategy's slowest run (the runs do not order them).
fastest() {
  awk -F'\t' -v r="$1" '$1 == r { n++; s[n] = $2; ms[n] = $3; k = split($9, m, "/"); lo[n] = 1e30; hi[n] = 0
      for (i = 1; i <= k; i++) { if (m[i] < lo[n]) lo[n] = m[i]; if (m[i] > hi[n]) hi[n] = m[i] } }
    END { b = 1; for (i = 2; i <= n; i++) if (ms[i] < ms[b]) b = i
      out = s[b]; for (i = 1; i <= n; i++) if (i != b && lo[i] <= hi[b]) out = out " ~ " s[i]; print out }' "$OUT/raw.tsv"
}
echo "| link | W, W2 | strategy | step (ms) | runs' medians (ms) | exposed comm (ms) | plan: est. step (ms) | plan: est. exposed (ms) | node 1 sent / step (MB) | node 2 sent / step (MB) | plan: host link / step (MB) | measured / plan | plan recommends | measured fastest |"
echo "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"
verdicts=()
for rate in $RATES; do
  w=$(awk -v r="$rate" '$1 == r { print $4 ", " $6 }' "$OUT/weights.tsv")
  best=$(fastest "$rate")
  awk -v r="$rate" '$1 == r' "$OUT/raw.tsv" | while IFS=$'\t' read -r _ s ms cs tx1 rx1 tx2 rx2 runs; do
    p=${PLAN[$s]}
    ratio=$(awk -v a="$tx1" -v b="$tx2" -v p="$p" 'BEGIN { m = a > b ? a : b; printf "%.3f", m / p }')
    echo "| $rate | $w | $s | $(printf %.0f "$ms") | $runs | $(awk -v c="$cs" -v m="$ms" 'BEGIN { printf "%.0f (%.0f%%)", c * m, 100 * c }') | ${EST[$rate,$s]} | ${EXP[$rate,$s]} | $(mb "$tx1") | $(mb "$tx2") | $(mb "$p") | $ratio | ${REC[$rate]} | $best |"
  done
  if [[ " ${best//\~/} " == *" ${REC[$rate]} "* ]]; then v=yes; else v=NO; fi
  verdicts+=("$rate: plan ${REC[$rate]}, measured $best: $v")
done
echo
echo "plan's pick among the measured fastest: $(printf '%s; ' "${verdicts[@]}" | sed 's/; $//')"
