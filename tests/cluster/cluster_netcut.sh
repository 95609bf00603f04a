# A network cut on the namespace cluster ends the job with exit 3 and the watchdog's report,
# through the shipped job script (jobscripts/run-training.sh, mpirun across 2 nodes x 2 ranks),
# within comm.timeout_s + a margin (issue 27, class 5). Node 2's link (its veth on the bridge) is
# set down:
#   step   mid-step, while the job trains (no test hook: the steps communicate all the time)
#   sync   mid-checkpoint, synchronous save: rank 3 (node 2) pauses just before the checkpoint
#          file's creation (SHARDTRAIN_TEST_PAUSE_IN=save.create:3) while the others wait in
#          H5Fcreate's MPI-IO calls; the link goes down, rank 3 goes on: the region 'save.create'
#          of group 'world' is reported
#   async  the same with checkpoint.async=true: region 'save.create' of group 'checkpoint writer'
#          (the background writer's communicator)
#   agree  in a step's agreement: rank 3 pauses just before step 1's (SHARDTRAIN_TEST_PAUSE_IN=
#          step.agree:3) while the others wait in it; the report names the agreement, 'step.agree'
#          of group 'world' (runtime/exchange.h names every exchange by construction)
#   outer  during a DiLoCo outer sync: rank 3 pauses before step 8's (SHARDTRAIN_TEST_PAUSE=
#          outer_sync:8:3) while node 1's ranks wait in their replicate groups' averages; a
#          replicate group is reported; then the job resumes from step 6's checkpoint and ends
#          as an uninterrupted one did, bit for bit (issue 30)
# Each time: the job script exits 3 (the program's code, although mpirun cannot reach node 2 to
# end its ranks), the report comes from a rank on node 1 and names the ranks of node 2 with their
# host, no checkpoint is committed, and the job ends within comm.timeout_s + 60 s of the cut (a
# hang fails the test there instead of blocking ctest). Tiny GPT on byte tokens.
# Usage: bash cluster_netcut.sh SHARDTRAIN MPIEXEC [mpirun flags]; exit 77 = skipped (namespaces
# cannot be made here).
source "$(dirname "$0")/../e2e/train/lib.sh"
CL=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
JOBS=$(cd "$CL/../../jobscripts" && pwd)
ST=$(readlink -f "$ST")   # the job script runs in $T
T0=$SECONDS

source "$CL/test_cluster.sh"
own_test_cluster nc 120
# A cluster left by a run of this test that was killed (ctest's timeout) is removed here.
remove_stale_test_clusters nc
JOB_PID=
cluster_cleanup() {
  local rc=$?
  # The job script and its launcher (mpirun, in a session of its own), by their pids.
  if [ -n "$JOB_PID" ] && kill -0 "$JOB_PID" 2>/dev/null; then
    for p in $(ps -o pid= --ppid "$JOB_PID"); do kill -9 "$p" 2>/dev/null || true; done
    kill -9 "$JOB_PID" 2>/dev/null || true
  fi
  "$CL/cluster.sh" stop >/dev/null 2>&1 || true   # processes in the nodes, namespaces, links, /etc/hosts lines
  cleanup
  exit $rc
}
trap cluster_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
"$CL/cluster.sh" start 2 || fail "cluster.sh start 2"
echo $$ > "/run/shardtrain-cluster/$SHARDTRAIN_CLUSTER/owner"
mapfile -t HOSTS < <("$CL/cluster.sh" hosts)
N1=${HOSTS[0]} N2=${HOSTS[1]}
LINK2=stv-$SHARDTRAIN_CLUSTER-n2   # node 2's veth on the bridge (cluster.sh's naming)
SUBNET=198.18.$SHARDTRAIN_CLUSTER_NET.0/24
note "cluster $SHARDTRAIN_CLUSTER up: $N1 $N2 on $SUBNET after $((SECONDS - T0)) s"
export OMPI_MCA_mpi_yield_when_idle=1

make_dataset
printf '%s slots=2\n%s slots=2\n' "$N1" "$N2" > "$T/hosts"
# mpirun-cluster's settings, given to the job script as launcher arguments.
LARGS="--hostfile $T/hosts --mca plm_rsh_agent $CL/cluster-rsh --mca plm_rsh_no_tree_spawn 1 --mca btl self,vader,tcp"
LARGS+=" --mca btl_tcp_if_include $SUBNET --mca oob_tcp_if_include $SUBNET"
TIMEOUT_S=8
LIMIT=$((TIMEOUT_S + 60))

# job NAME [key=value ...]: the job script in the background (JOB_PID), output in $T/NAME.log.
job() {
  local name=$1; shift
  (cd "$T" && exec env -u SLURM_JOB_ID SHARDTRAIN_LAUNCHER=mpirun SHARDTRAIN_BIN="$ST" SHARDTRAIN_NP=4 \
     SHARDTRAIN_BIND=none SHARDTRAIN_LAUNCHER_ARGS="$LARGS" \
     bash "$JOBS/run-training.sh" "$DECK" "data.dataset=$T/data" "run.out_dir=$T/$name" \
     "comm.timeout_s=$TIMEOUT_S" model.dropout=0 "$@") > "$T/$name.log" 2>&1 &
  JOB_PID=$!
}
cut_link() { ip link set "$LINK2" down; T_CUT=$(date +%s.%N); }
# wait_job NAME: RC and TOOK (seconds from the cut to the job script's end); a job still running
# LIMIT s after the cut fails the test (a hang).
wait_job() {
  local i
  for ((i = 0; i < LIMIT * 10; i++)); do
    kill -0 "$JOB_PID" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$JOB_PID" 2>/dev/null; then
    tail -30 "$T/$1.log"
    fail "$1: the job still runs $LIMIT s after the cut (comm.timeout_s = $TIMEOUT_S): it hangs"
  fi
  set +e
  wait "$JOB_PID"
  RC=$?
  set -e
  JOB_PID=
  TOOK=$(awk -v a="$T_CUT" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
}
# Between cases: nothing left running in the nodes (node 2's ranks never heard of the abort), link up.
reset_nodes() {
  local n p
  for n in 1 2; do
    for p in $(ip netns pids "stc-$SHARDTRAIN_CLUSTER-n$n" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
  done
  ip link set "$LINK2" up
  sleep 1
}
# check_report NAME WHAT: exit 3 from the job script, a report from a rank of node 1 naming node 2's ranks.
check_report() {
  local name=$1 what=$2
  [ "$RC" = 3 ] || { tail -40 "$T/$name.log"; fail "$name: the job script exited $RC, expected 3"; }
  grep -q "FAILED: a collective timed out (exit 3)" "$T/$name.log" ||
    { tail -20 "$T/$name.log"; fail "$name: the job script did not report exit 3"; }
  grep -q "^shardtrain watchdog \[rank [01]\]: collective timed out" "$T/$name.log" ||
    { cat "$T/$name.log"; fail "$name: no watchdog report from a rank on $N1"; }
  grep -Eq "hosts of those ranks: .*world rank [23] on $N2" "$T/$name.log" ||
    { cat "$T/$name.log"; fail "$name: the report does not name node 2's ranks on $N2"; }
  if [ -n "$what" ]; then
    grep -Eq "^shardtrain watchdog \[rank [01]\]: collective timed out .*$what" "$T/$name.log" ||
      { grep "^shardtrain watchdog" "$T/$name.log"; fail "$name: the report is not about $what"; }
  fi
  awk -v t="$TOOK" -v l="$LIMIT" 'BEGIN { exit !(t <= l) }' || fail "$name: ended $TOOK s after the cut (limit $LIMIT s)"
  note "$name: exit 3, $TOOK s after the cut (comm.timeout_s $TIMEOUT_S); report:"
  grep -E "^shardtrain watchdog|hosts of those ranks|shardtrain-job: (FAILED|the ranks aborted|mpirun exited)" "$T/$name.log" | head -6
}

note "step: node 2's link cut mid-step"
job step train.max_steps=100000
BG_PID=$JOB_PID wait_file "$T/step/metrics.jsonl" 120
for ((i = 0; i < 600; i++)); do
  [ "$(grep -c '"step":' "$T/step/metrics.jsonl" 2>/dev/null)" -ge 3 ] && break
  kill -0 "$JOB_PID" 2>/dev/null || { cat "$T/step.log"; fail "step: the job ended before step 3"; }
  sleep 0.1
done
cut_link
wait_job step
check_report step ""
reset_nodes

for mode in sync async; do
  note "$mode: node 2's link cut while rank 3 holds back the checkpoint's creation"
  async=false
  [ $mode = async ] && async=true
  export SHARDTRAIN_TEST_PAUSE_IN=save.create:3 SHARDTRAIN_TEST_PAUSE_MARKER=$T/$mode.paused
  job $mode train.max_steps=4 checkpoint.every_steps=4 checkpoint.async=$async
  unset SHARDTRAIN_TEST_PAUSE_IN SHARDTRAIN_TEST_PAUSE_MARKER
  BG_PID=$JOB_PID wait_file "$T/$mode.paused" 120
  victim=$(cat "$T/$mode.paused")
  ip netns pids "stc-$SHARDTRAIN_CLUSTER-n2" | grep -qx "$victim" || fail "$mode: the paused rank (pid $victim) is not on $N2"
  cut_link
  rm -f "$T/$mode.paused"   # rank 3 goes on into the region, and blocks there too
  wait_job $mode
  group=world
  [ $mode = async ] && group="checkpoint writer"
  check_report $mode "in group '$group' .*region save\.create"
  [ ! -e "$(ckpt_file "$T/$mode" 4)" ] || fail "$mode: a checkpoint of step 4 was committed"
  reset_nodes
done

note "agree: node 2's link cut while rank 3 holds back a step's agreement"
export SHARDTRAIN_TEST_PAUSE_IN=step.agree:3 SHARDTRAIN_TEST_PAUSE_MARKER=$T/agree.paused
job agree train.max_steps=4
unset SHARDTRAIN_TEST_PAUSE_IN SHARDTRAIN_TEST_PAUSE_MARKER
BG_PID=$JOB_PID wait_file "$T/agree.paused" 120
victim=$(cat "$T/agree.paused")
ip netns pids "stc-$SHARDTRAIN_CLUSTER-n2" | grep -qx "$victim" || fail "agree: the paused rank (pid $victim) is not on $N2"
sleep 1   # the other ranks are in step 1's agreement, waiting for rank 3
cut_link
rm -f "$T/agree.paused"   # rank 3 goes on into the agreement, and blocks there too
wait_job agree
check_report agree "in group 'world' .*region step\.agree"
reset_nodes

note "outer: node 2's link cut during a DiLoCo outer sync; the job then resumes from its last checkpoint"
# hybrid_shard over the 2 real nodes (a replica per node), H = 4, a checkpoint every 2 steps. The
# reference runs 10 steps uninterrupted. Then rank 3 (node 2) holds back at step 8's outer sync
# (SHARDTRAIN_TEST_PAUSE=outer_sync:8:3) while node 1's ranks wait for it in their replicate
# groups' averages; the link goes down: exit 3, a report naming a replicate group and node 2's
# ranks, no checkpoint of step 8. With the link back, the same job resumes from step 6 and ends as
# the reference did, bit for bit.
DL=(parallel.strategy=hybrid_shard parallel.replica_sync=diloco diloco.inner_steps=4 checkpoint.every_steps=2
    train.max_steps=10)
job outer-ref "${DL[@]}"
wait "$JOB_PID" || { tail -30 "$T/outer-ref.log"; fail "outer-ref: the uninterrupted DiLoCo job failed"; }
JOB_PID=
grep -q '"event":"outer_sync","step":8' "$T/outer-ref/metrics.jsonl" || fail "outer-ref: no outer sync at step 8"
export SHARDTRAIN_TEST_PAUSE=outer_sync:8:3 SHARDTRAIN_TEST_PAUSE_MARKER=$T/outer.paused
job outer "${DL[@]}"
unset SHARDTRAIN_TEST_PAUSE SHARDTRAIN_TEST_PAUSE_MARKER
BG_PID=$JOB_PID wait_file "$T/outer.paused" 120
victim=$(cat "$T/outer.paused")
ip netns pids "stc-$SHARDTRAIN_CLUSTER-n2" | grep -qx "$victim" || fail "outer: the paused rank (pid $victim) is not on $N2"
sleep 1   # node 1's ranks are in the outer sync's average, waiting for node 2's
cut_link
wait_job outer
check_report outer "in group 'replicate\\[[01]\\]'"
[ -e "$(ckpt_file "$T/outer" 6)" ] || fail "outer: no checkpoint of step 6 before the cut"
[ ! -e "$(ckpt_file "$T/outer" 8)" ] || fail "outer: a checkpoint of step 8 was committed"
reset_nodes
job outer "${DL[@]}"
wait "$JOB_PID" || { tail -30 "$T/outer.log"; fail "outer: the resumed job failed"; }
JOB_PID=
grep -q "# resumed from $(ckpt_file "$T/outer" 6): step 6," "$T/outer.log" ||
  { tail -30 "$T/outer.log"; fail "outer: the job did not resume from step 6"; }
step_table "$T/outer-ref/metrics.jsonl" > "$T/outer-ref.steps"
step_table "$T/outer/metrics.jsonl" > "$T/outer.steps"
diff "$T/outer-ref.steps" "$T/outer.steps" || fail "outer: the resumed job's steps differ from the uninterrupted one's"
same_params "$(ckpt_file "$T/outer-ref" 10)" "$(ckpt_file "$T/outer" 10)"
note "outer: resumed from step 6 and ended as the uninterrupted job did"

note "OK: a cut mid-step, mid-checkpoint (sync), mid-checkpoint (async), in a step's agreement and during a DiLoCo outer sync each ended the job with exit 3 (the last one resumed exactly) in $((SECONDS - T0)) s"
