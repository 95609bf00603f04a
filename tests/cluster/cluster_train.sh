# shardtrain across real hosts: a test cluster of 4 nodes (tests/cluster/cluster.sh: network + UTS
# namespaces on a bridge, each node its own hostname and address, MPI over TCP between nodes and
# shared memory inside one), started once for all checks and removed on every exit path:
#   info   2 nodes x 2 ranks: the mesh names the 2 real hosts, shard groups inside them
#   S_*    every strategy at 2 nodes x 2 ranks logs the same steps, to the bit, as the same run on
#          one host with parallel.simulate_ranks_per_host=2
#   resume full_shard's step-4 checkpoint (written at 2 x 2) resumes at 4 nodes x 1 rank (same
#          continuation to the bit: same ranks, same shard group) and at 1 node x 2 ranks (within
#          fp32 rounding: other reduction order)
#   reproducible  train.reproducible: hybrid_shard at 2 nodes x 2 ranks gives a 1-rank run's bits
#   kill   kill -9 of rank 3 (node 2) mid-step: the ranks on node 1 are gone within comm.timeout_s,
#          and the job's report names rank 3 and its host (mpirun's: it ends the job at once)
#   hang   rank 3 (node 2) stalls mid-step: after comm.timeout_s the watchdog of a rank on node 1
#          reports it, naming world rank 3 and its host, and the job exits 3
#   usr1   SIGUSR1 to the launcher: one agreed checkpoint, exit 42 on every rank of both nodes
# Tiny GPT on byte tokens (tests/e2e/train/tiny.toml), dropout off, 8 steps.
# Usage: bash cluster_train.sh SHARDTRAIN MPIEXEC [mpirun flags]; exit 77 = skipped (the reason
# is printed: namespaces cannot be made here).
source "$(dirname "$0")/../e2e/train/lib.sh"
CL=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SKIP=77
T0=$SECONDS

# A cluster of our own: its name and subnet are not a person's default one (st, 198.18.10.0/24).
source "$CL/test_cluster.sh"
own_test_cluster t 100
# A cluster left by a run of this test that was killed (SIGKILL: ctest's timeout) is removed here.
remove_stale_test_clusters t
cluster_cleanup() {
  local rc=$?
  "$CL/cluster.sh" stop >/dev/null 2>&1 || true   # namespaces, links, qdiscs, /etc/hosts lines, by name
  cleanup
  exit $rc
}
trap cluster_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
"$CL/cluster.sh" start 4 || fail "cluster.sh start 4"
echo $$ > "/run/shardtrain-cluster/$SHARDTRAIN_CLUSTER/owner"
mapfile -t HOSTS < <("$CL/cluster.sh" hosts)
N1=${HOSTS[0]} N2=${HOSTS[1]}
note "cluster $SHARDTRAIN_CLUSTER up: ${HOSTS[*]} on 198.18.$SHARDTRAIN_CLUSTER_NET.0/24 after $((SECONDS - T0)) s"
export OMPI_MCA_mpi_yield_when_idle=1

COMMON=(--set model.dropout=0 --set train.max_steps=8)
# ctrain NODES NP OUT [--set ...]: NP ranks over the first NODES nodes (NP/NODES per node); RC.
ctrain() {
  local k=$1 np=$2 out=$3; shift 3
  set +e
  "$CL/mpirun-cluster" --nodes "$k" -np "$np" "$ST" train "$DECK" --set "data.dataset=$T/data" \
    --set "run.out_dir=$out" "$@" >> "$out.log" 2>&1
  RC=$?
  set -e
}
ctrain_ok() { ctrain "$@"; [ "$RC" = 0 ] || { tail -40 "$3.log"; fail "cluster training in $3 exited $RC"; }; }

make_dataset

note "info: 2 nodes x 2 ranks, hybrid_shard"
"$CL/mpirun-cluster" --nodes 2 -np 4 "$ST" info --set parallel.strategy=hybrid_shard > "$T/info.log" 2>&1 ||
  { cat "$T/info.log"; fail "info at 2 x 2 failed"; }
grep -q "mesh: 2 replicate x 2 shard" "$T/info.log" || { cat "$T/info.log"; fail "info: not a 2 x 2 mesh"; }
# rank, host, local rank, device, shard group and its ranks, replicate group and its ranks
for want in "0 $N1 0 .*shard\[0\] *0,1 .*replicate\[0\] *0,2" "1 $N1 1 .*shard\[0\] *0,1 .*replicate\[1\] *1,3" \
            "2 $N2 0 .*shard\[1\] *2,3 .*replicate\[0\] *0,2" "3 $N2 1 .*shard\[1\] *2,3 .*replicate\[1\] *1,3"; do
  grep -Eq "^ *${want// / +}" "$T/info.log" || { cat "$T/info.log"; fail "info: no line '$want'"; }
done
grep -q "#" <(grep -E "^ *[0-3] +$SHARDTRAIN_CLUSTER-n" "$T/info.log" | grep "#") && fail "info: simulated host names"
cat "$T/info.log" | grep -E "hosts|mesh|^ *[0-3] " || true

for s in full_shard shard_grad_op no_shard hybrid_shard hybrid_shard_zero2; do
  note "S_$s: 2 nodes x 2 ranks vs one host with simulate_ranks_per_host=2"
  extra=()
  [ $s = full_shard ] && extra=(--set checkpoint.every_steps=4)
  ctrain_ok 2 4 "$T/C_$s" "${COMMON[@]}" --set parallel.strategy=$s "${extra[@]}"
  train_ok 4 "$T/L_$s" "${COMMON[@]}" --set parallel.strategy=$s --set parallel.simulate_ranks_per_host=2
  step_table "$T/C_$s/metrics.jsonl" > "$T/C_$s.steps"
  step_table "$T/L_$s/metrics.jsonl" > "$T/L_$s.steps"
  [ "$(wc -l < "$T/C_$s.steps")" = 8 ] || fail "S_$s: the cluster run logged $(wc -l < "$T/C_$s.steps") steps"
  diff "$T/L_$s.steps" "$T/C_$s.steps" || fail "S_$s: the 2-node run's steps differ from the one-host run's"
  grep -q "hosts: 2 (real)\|2 hosts" "$T/C_$s.log" || true
done

FROM=$(ckpt_file "$T/C_full_shard" 4)
[ -f "$FROM" ] || fail "no step-4 checkpoint in the 2 x 2 full_shard run"
step_table "$T/C_full_shard/metrics.jsonl" | awk '$1 > 4' > "$T/ref58.steps"
note "resume 4 x 1: the 2 x 2 checkpoint of step 4 on 4 nodes, 1 rank each"
ctrain_ok 4 4 "$T/R41" "${COMMON[@]}" --set "checkpoint.resume=$FROM"
grep -q "# resumed from $FROM: step 4, .*written by 4 ranks" "$T/R41.log" || fail "R41 did not resume from step 4"
step_table "$T/R41/metrics.jsonl" > "$T/R41.steps"
diff "$T/ref58.steps" "$T/R41.steps" || fail "R41: steps 5-8 at 4 x 1 differ from the 2 x 2 continuation"
note "resume 1 x 2: the same checkpoint on node 1 only, 2 ranks (micro_batch 2, 2 accumulation steps)"
ctrain_ok 1 2 "$T/R12" "${COMMON[@]}" --set "checkpoint.resume=$FROM"
grep -q "# resumed from $FROM: step 4, .*written by 4 ranks" "$T/R12.log" || fail "R12 did not resume from step 4"
step_table "$T/R12/metrics.jsonl" > "$T/R12.steps"
paste "$T/ref58.steps" "$T/R12.steps" | awk -v tol=1e-5 '
  function rel(a, b) { d = a - b; if (d < 0) d = -d; m = a < 0 ? -a : a; if (m < 1) m = 1; return d / m }
  { n++; if ($1 != $5 || rel($2, $6) > tol || rel($3, $7) > tol) { print "R12: step " $5 " loss " $6 " vs " $2; bad = 1 } }
  END { exit bad || n != 4 }' || fail "R12: steps 5-8 at 1 x 2 are not the 2 x 2 continuation within 1e-5"

note "reproducible: hybrid_shard at 2 nodes x 2 ranks (real hosts, TCP between them) vs 1 rank, with dropout"
REPRO=(--set train.reproducible=true --set train.max_steps=4 --set train.global_batch=8 --set train.micro_batch=2)
ctrain_ok 2 4 "$T/P22" "${REPRO[@]}" --set parallel.strategy=hybrid_shard
train_ok 1 "$T/P1" "${REPRO[@]}"
step_table "$T/P22/metrics.jsonl" > "$T/P22.steps"
step_table "$T/P1/metrics.jsonl" > "$T/P1.steps"
[ "$(wc -l < "$T/P1.steps")" = 4 ] || fail "P1 logged $(wc -l < "$T/P1.steps") steps"
diff "$T/P1.steps" "$T/P22.steps" || fail "reproducible: the 2 x 2 cluster run's steps differ from the 1-rank run's"
for g in /model /optim; do
  h5diff -q "$(ckpt_file "$T/P1" 4)" "$(ckpt_file "$T/P22" 4)" "$g" "$g" || fail "reproducible: $g differs between 1 rank and 2 x 2"
done

TIMEOUT_S=10
note "kill: kill -9 of rank 3 on $N2 in step 3 (comm.timeout_s=$TIMEOUT_S)"
export SHARDTRAIN_TEST_PAUSE=mid_step:3:3 SHARDTRAIN_TEST_PAUSE_MARKER=$T/K.paused
"$CL/mpirun-cluster" --nodes 2 -np 4 "$ST" train "$DECK" --set "data.dataset=$T/data" --set "run.out_dir=$T/K" \
  "${COMMON[@]}" --set comm.timeout_s=$TIMEOUT_S > "$T/K.log" 2>&1 &
BG_PID=$!
wait_file "$T/K.paused" 60
unset SHARDTRAIN_TEST_PAUSE SHARDTRAIN_TEST_PAUSE_MARKER
victim=$(cat "$T/K.paused")
# the victim runs in node 2's namespace; the ranks of node 1 in node 1's
ip netns pids "stc-$SHARDTRAIN_CLUSTER-n2" | grep -qx "$victim" || fail "kill: rank 3 (pid $victim) is not on $N2"
node1_ranks() { ip netns pids "stc-$SHARDTRAIN_CLUSTER-n1" | while read -r p; do
  [ "$(cat "/proc/$p/comm" 2>/dev/null)" = shardtrain ] && echo "$p"; done; }
[ "$(node1_ranks | wc -l)" = 2 ] || fail "kill: not 2 shardtrain ranks on $N1"
t_kill=$SECONDS
kill -9 "$victim"
gone=
for ((i = 0; i < (TIMEOUT_S + 5) * 10; i++)); do
  if [ -z "$(node1_ranks)" ]; then gone=$((SECONDS - t_kill)); break; fi
  sleep 0.1
done
[ -n "$gone" ] || { cat "$T/K.log"; fail "kill: the ranks on $N1 still run $((TIMEOUT_S + 5)) s after the kill"; }
wait_bg
[ "$RC" != 0 ] || fail "kill: the job exited 0"
grep -Eq "rank 3 .*on node $N2|rank 3 \(world 3\).*$N2|world rank 3.*$N2" "$T/K.log" ||
  { cat "$T/K.log"; fail "kill: no report names rank 3 on $N2"; }
note "kill: the ranks on $N1 ended $gone s after the kill (limit ${TIMEOUT_S} s), exit $RC; report:"
grep -E "rank 3|$N2" "$T/K.log" | head -5

HANG_S=5
note "hang: rank 3 on $N2 stops in step 3 (comm.timeout_s=$HANG_S): the watchdog on $N1 reports it with its host"
export SHARDTRAIN_TEST_PAUSE=mid_step:3:3 SHARDTRAIN_TEST_PAUSE_MARKER=$T/H.paused
"$CL/mpirun-cluster" --nodes 2 -np 4 "$ST" train "$DECK" --set "data.dataset=$T/data" --set "run.out_dir=$T/H" \
  "${COMMON[@]}" --set comm.timeout_s=$HANG_S > "$T/H.log" 2>&1 &
BG_PID=$!
wait_file "$T/H.paused" 60
unset SHARDTRAIN_TEST_PAUSE SHARDTRAIN_TEST_PAUSE_MARKER
t_hang=$SECONDS
wait_bg
took=$((SECONDS - t_hang))
[ "$RC" = 3 ] || { cat "$T/H.log"; fail "hang: the job exited $RC, expected 3 (collective timed out)"; }
[ "$took" -le $((HANG_S + 15)) ] || fail "hang: the job took $took s to end after the stall (timeout $HANG_S s)"
# A rank of node 1 (world rank 0 or 1) reports, naming the stalled rank and its host.
grep -q "^shardtrain watchdog \[rank [01]\]" "$T/H.log" || { cat "$T/H.log"; fail "hang: no watchdog report from a rank on $N1"; }
grep -q "hosts of those ranks: .*world rank 3 on $N2" "$T/H.log" || { cat "$T/H.log"; fail "hang: the report does not name world rank 3 on $N2"; }
note "hang: ended $took s after the stall, exit 3; report:"
grep -E "^shardtrain watchdog|NOT ARRIVED|hosts of those ranks" "$T/H.log" | head -4

note "usr1: SIGUSR1 to the launcher while rank 3 ($N2) is in step 3: one agreed checkpoint, exit 42 everywhere"
export SHARDTRAIN_TEST_PAUSE=mid_step:3:3 SHARDTRAIN_TEST_PAUSE_MARKER=$T/U.paused
# Each rank under rank-exit, which passes SIGUSR1 on and prints the rank's host and exit code; the
# barrier holds every rank's exit until all have ended, so mpirun's abort after the first exit 42
# cannot kill a rank that has not exited yet.
mkdir "$T/U.exits"
RANK_EXIT_BARRIER=$T/U.exits "$CL/mpirun-cluster" --nodes 2 -np 4 "$CL/rank-exit" "$ST" train "$DECK" --set "data.dataset=$T/data" \
  --set "run.out_dir=$T/U" "${COMMON[@]}" > "$T/U.log" 2>&1 &
BG_PID=$!
wait_file "$T/U.paused" 60
unset SHARDTRAIN_TEST_PAUSE SHARDTRAIN_TEST_PAUSE_MARKER
kill -USR1 "$BG_PID"
wait_bg
[ "$RC" = 42 ] || { tail -30 "$T/U.log"; fail "usr1: the job exited $RC, expected 42"; }
for r in 0 1 2 3; do
  h=$N1; [ $r -ge 2 ] && h=$N2
  grep -q "^rank-exit: rank $r on $h: exit 42$" "$T/U.log" || { cat "$T/U.log"; fail "usr1: rank $r on $h did not exit 42"; }
done
[ "$(grep -c "checkpoint: step 3 .*signal SIGUSR1" "$T/U.log")" = 1 ] || { cat "$T/U.log"; fail "usr1: not one checkpoint of step 3"; }
[ "$(ls "$T/U/checkpoints" | grep -c '^step_.*\.h5$')" = 1 ] || fail "usr1: checkpoints: $(ls "$T/U/checkpoints")"
"$ST" ckpt verify "$(ckpt_file "$T/U" 3)" > /dev/null || fail "usr1: ckpt verify of step 3"

note "OK: info, 5 strategies bit-identical to one host, resume at 4 x 1 and 1 x 2, kill -9, hang, SIGUSR1 in $((SECONDS - T0)) s"
