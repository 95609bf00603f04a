# Shell functions the namespace-cluster benchmarks share (sourced by zeropp.sh and diloco.sh;
# median by run.sh too). Expects CL (tests/cluster), ST (the binary), DECK and
# SHARDTRAIN_CLUSTER (the cluster's name) set by the script that sources it.

# The median of the numbers on stdin, one a line.
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

# "node1 node2": what each node has sent so far (the root side's rx of its veth: Ethernet
# frames, payload + headers).
link_sent() {
  local i
  for i in 1 2; do echo -n "$(cat /sys/class/net/stv-"$SHARDTRAIN_CLUSTER"-n$i/statistics/rx_bytes) "; done
  echo
}

# counted_run STEPS DIR SETS...: trains DECK for STEPS steps on 2 nodes x 2 ranks into DIR (log
# DIR.log) with --set SETS, and prints what each node sent meanwhile, "node1 node2".
# (The deltas are printed with %.0f: mawk's %d stops at 2^31 - 1, which a run of 100 steps of
# hybrid_shard on wide.toml passes; it printed 2147483647 for 5.3 GB.)
counted_run() {
  local steps=$1 dir=$2 before after a
  shift 2
  local sets=()
  for a in "$@"; do sets+=(--set "$a"); done
  rm -rf "$dir"
  before=$(link_sent)
  "$CL/mpirun-cluster" -np 4 "$ST" train "$DECK" "${sets[@]}" --set train.max_steps="$steps" \
    --set run.out_dir="$dir" > "$dir.log" 2>&1 || { tail -20 "$dir.log" >&2; echo "run $dir failed" >&2; exit 1; }
  after=$(link_sent)
  paste -d' ' <(tr ' ' '\n' <<<"$before") <(tr ' ' '\n' <<<"$after") | awk 'NF == 2 { printf "%.0f ", $2 - $1 } END { print "" }'
}
