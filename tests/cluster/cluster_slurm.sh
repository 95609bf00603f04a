# A real two-node Slurm on the namespace test cluster (tests/cluster/cluster.sh: 2 nodes, each a
# network + UTS namespace with its own hostname and address; tests/cluster/cluster-slurm.sh:
# munged here, slurmctld on node 1, one slurmd per node), started once and removed on every exit
# path. Tiny GPT on byte tokens (tests/e2e/train/tiny.toml), dropout off, 12 steps. The jobs,
# submitted together from node 1 with `sbatch --nodes=2 --ntasks-per-node=2`:
#   ref   jobscripts/multinode.sbatch, srun: hybrid_shard over the 2 real hosts (mesh 2 x 2,
#         "2 hosts"), uninterrupted
#   mpi   the same with SHARDTRAIN_LAUNCHER=mpirun (Open MPI's Slurm launcher starts its daemons
#         on both nodes through srun): the same steps as ref, to the bit
#   tl    the same as ref with --time=1 --signal=B:USR1@35: rank 3 (on node 2) pauses in step 7
#         until a stop signal arrives, so Slurm's time-limit signal lands mid-run; the job must
#         checkpoint step 7 on both nodes, exit 42, requeue itself, resume, and finish with
#         ref's steps and ref's final checkpoint, to the bit
#   study jobscripts/scaling-study: full_shard at 2 ranks on 1 node and 4 ranks on 2 nodes
#         (--real-hosts), run as Slurm array jobs (srun -N), collected: both points ok, the
#         2-node one on 2 real hosts
# Usage: bash cluster_slurm.sh SHARDTRAIN MPIEXEC [mpirun flags]; exit 77 = skipped (the reason is
# printed: namespaces cannot be made here, or Slurm cannot run: not root).
source "$(dirname "$0")/../e2e/train/lib.sh"
CL=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$CL/../.." && pwd)
JS=$REPO/jobscripts
SKIP=77
T0=$SECONDS

# A cluster of our own: name s<random>, a subnet from 198.18.140.0/24 up (cluster_train takes
# theirs from .100 up, a person's default is .10); slurmctld and the slurmds listen in the nodes'
# namespaces, so no port of this host (tests/slurm's one-node Slurm) is touched.
source "$CL/test_cluster.sh"
own_test_cluster s 140
if [ "$(id -u)" != 0 ]; then echo "SKIP: Slurm cannot be started here (slurmd must run as root)"; exit $SKIP; fi
# A cluster (and its Slurm) left by a run of this test that was killed (ctest's timeout) goes first.
for owner in /run/shardtrain-cluster/s*/owner; do
  [ -f "$owner" ] || continue
  read -r opid odir < "$owner" || true
  kill -0 "$opid" 2>/dev/null && continue
  name=$(basename "$(dirname "$owner")")
  echo "removing the stale test cluster $name"
  [ -n "${odir:-}" ] && [ -d "$odir" ] && SHARDTRAIN_CLUSTER=$name CLUSTER_SLURM_DIR=$odir "$CL/cluster-slurm.sh" stop || true
  SHARDTRAIN_CLUSTER=$name "$CL/cluster.sh" stop || true
done
chmod 755 "$T"   # munged wants every folder above its socket searchable by all
export CLUSTER_SLURM_DIR=$T/slurm
mkdir -p "$CLUSTER_SLURM_DIR"
SL=$CL/cluster-slurm.sh
cluster_slurm_cleanup() {
  local rc=$?
  if [ $rc != 0 ] && [ $rc != $SKIP ] && [ -f "$CLUSTER_SLURM_DIR/log/slurmctld.log" ]; then
    echo "--- slurmctld.log (tail)"; tail -15 "$CLUSTER_SLURM_DIR/log/slurmctld.log"
  fi
  "$SL" stop >/dev/null 2>&1 || true         # the daemons, by the pids they wrote
  "$CL/cluster.sh" stop >/dev/null 2>&1 || true   # what is left in the nodes; namespaces, links, /etc/hosts lines
  cleanup
  exit $rc
}
trap cluster_slurm_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
"$CL/cluster.sh" start 2 || fail "cluster.sh start 2"
echo "$$ $CLUSTER_SLURM_DIR" > "/run/shardtrain-cluster/$SHARDTRAIN_CLUSTER/owner"
mapfile -t HOSTS < <("$CL/cluster.sh" hosts)
N1=${HOSTS[0]} N2=${HOSTS[1]}
set +e
out=$("$SL" start 2>&1)
rc=$?
set -e
echo "$out"
if [ $rc = 3 ]; then echo "SKIP: Slurm cannot be started here: ${out##*cluster-slurm: }"; exit $SKIP; fi
[ $rc = 0 ] || fail "cluster-slurm.sh start exited $rc (4: packages missing, run scripts/setup)"
export SLURM_CONF=$CLUSTER_SLURM_DIR/etc/slurm.conf
note "cluster $SHARDTRAIN_CLUSTER ($N1, $N2 on 198.18.$SHARDTRAIN_CLUSTER_NET.0/24) and its Slurm up after $((SECONDS - T0)) s"
on1() { "$SL" run "$@"; }   # a Slurm client command, on node 1

make_dataset
# The jobs inherit this environment (sbatch --export=ALL). Open MPI between the nodes: the
# cluster's subnet only (as tests/cluster/mpirun-cluster sets it).
export SHARDTRAIN_BIN=$ST OMPI_MCA_mpi_yield_when_idle=1 \
  OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=198.18.$SHARDTRAIN_CLUSTER_NET.0/24 OMPI_MCA_oob_tcp_if_include=198.18.$SHARDTRAIN_CLUSTER_NET.0/24
unset SHARDTRAIN_HOME SHARDTRAIN_LAUNCHER SHARDTRAIN_LAUNCHER_ARGS SHARDTRAIN_REQUEUE SHARDTRAIN_MAX_RESTARTS SHARDTRAIN_SETS \
  SHARDTRAIN_SCRIPT_SETS SHARDTRAIN_DECK SHARDTRAIN_BIND SHARDTRAIN_THREADS SHARDTRAIN_NP SHARDTRAIN_RESUBMITS
declare -A JOB
# submit NAME [sbatch options] -- [deck overrides]: multinode.sbatch on both nodes, from $T.
submit() {
  local name=$1; shift
  local opts=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
  shift
  JOB[$name]=$(cd "$T" && on1 sbatch --parsable -J "st-$name" --nodes=2 --ntasks-per-node=2 --cpus-per-task=1 \
    --mem=1000 --gpus-per-node=2 --exclusive=user "${opts[@]}" "$JS/multinode.sbatch" "$DECK" "data.dataset=$T/data" \
    "run.out_dir=$T/$name" model.dropout=0 train.max_steps=12 "$@") || fail "sbatch of $name failed"
}
field() { on1 scontrol show job -o "$1" 2>/dev/null | grep -o " $2=[^ ]*" | head -1 | cut -d= -f2; }
joblog() { echo "$T/st-$1-${JOB[$1]}.out"; }
show_logs() {
  local n
  for n in "$@"; do echo "--- $n: job ${JOB[$n]:-} $(field "${JOB[$n]:-0}" JobState) (log $(joblog "$n"))"
    grep -v '^step \|^#\|^\[[a-z]\|^[a-z_]* *= ' "$(joblog "$n")" 2>/dev/null | tail -25; done
}
job_fail() { show_logs "$1"; fail "$2"; }

note "submitting ref (srun), mpi (mpirun), tl (time limit) on 2 nodes x 2 ranks"
submit ref --time=5 --
SHARDTRAIN_LAUNCHER=mpirun SHARDTRAIN_BIND=none submit mpi --time=5 --
SHARDTRAIN_TEST_PAUSE=mid_step:7:3 SHARDTRAIN_TEST_PAUSE_MARKER=$T/tl.paused submit tl --time=1 --signal=B:USR1@35 --

note "scaling study: full_shard, 2 ranks on 1 node and 4 on 2 nodes, through Slurm"
python3 "$JS/scaling-study" plan "$T/study" --deck "$DECK" --bin "$ST" --ranks 2,4 --ranks-per-host 2 --real-hosts \
  --strategies full_shard --modes strong --steps 6 --warmup 2 --set "data.dataset=$T/data" --set model.dropout=0 \
  > "$T/study-plan.log" 2>&1 || { cat "$T/study-plan.log"; fail "scaling-study plan"; }
python3 - "$T/study/study.json" <<'EOF' || fail "the study does not hold 2 ranks x 1 host and 4 ranks x 2 hosts"
import json, sys
pts = json.load(open(sys.argv[1]))["points"]
shapes = sorted((p["ranks"], p["hosts"]) for p in pts)
sys.exit(0 if shapes == [(2, 1), (4, 2)] else (print("points:", shapes) or 1))
EOF
(cd "$T" && on1 python3 "$JS/scaling-study" run "$T/study" --launcher slurm --no-exclusive --cpus-per-task 1 \
  --sbatch-arg=--time=5 --sbatch-arg=--mem=1000 --no-report-job) > "$T/study-run.log" 2>&1 ||
  { cat "$T/study-run.log"; fail "scaling-study run --launcher slurm"; }
cat "$T/study-run.log"
mapfile -t STUDY_JOBS < <(sed -n 's/.* as job \([0-9]*\) .*/\1/p' "$T/study-run.log")
[ ${#STUDY_JOBS[@]} = 2 ] || fail "scaling-study submitted ${#STUDY_JOBS[@]} jobs, expected 2 (one per job shape)"
for i in "${!JOB[@]}"; do echo "  $i: job ${JOB[$i]}"; done
echo "  study: jobs ${STUDY_JOBS[*]}"

note "waiting for the jobs (tl: stopped by Slurm's time-limit signal, then requeued)"
deadline=$((SECONDS + 240))
while :; do
  busy=$(on1 squeue -h -o '%A %j %T' 2>/dev/null || true)
  [ -z "$busy" ] && break
  if [ $SECONDS -gt $deadline ]; then echo "$busy"; show_logs ref mpi tl; fail "jobs not done after 240 s"; fi
  sleep 1
done
note "all jobs ended after $((SECONDS - T0)) s"

expect() { # NAME STATE EXITCODE: and the restart count in $3 of ... (>= given)
  local s e
  s=$(field "${JOB[$1]}" JobState) e=$(field "${JOB[$1]}" ExitCode)
  [ "$s $e" = "$2 $3" ] || job_fail "$1" "$1: job ${JOB[$1]} ended $s, exit $e; expected $2, exit $3"
}
has() { grep -q -- "$2" "$(joblog "$1")" || job_fail "$1" "$1: the log lacks '$2'"; }

note "ref: srun over 2 real hosts, hybrid_shard 2 x 2"
expect ref COMPLETED 0:0
has ref "on 2 node(s) $SHARDTRAIN_CLUSTER-n\[1-2\], 4 tasks"
has ref "srun --ntasks=4"
has ref "world 4 ranks (2 hosts), mesh 2 replicate x 2 shard, strategy hybrid_shard"
step_table "$T/ref/metrics.jsonl" > "$T/ref.steps"
[ "$(wc -l < "$T/ref.steps")" = 12 ] || fail "ref logged $(wc -l < "$T/ref.steps") steps, expected 12"
verify_once "$(ckpt_file "$T/ref" 12)"

same_as_ref() { # NAME: every step and the final checkpoint equal to ref's, to the bit
  local g a b
  step_table "$T/$1/metrics.jsonl" > "$T/$1.steps"
  diff "$T/ref.steps" "$T/$1.steps" || job_fail "$1" "$1: the steps differ from ref's"
  a=$(ckpt_file "$T/ref" 12) b=$(ckpt_file "$T/$1" 12)
  [ -f "$b" ] || job_fail "$1" "$1: no final checkpoint $b"
  for g in /model /optim /train/data_cursor /train/rng_state; do
    h5diff -q "$a" "$b" "$g" "$g" || { h5diff -r "$a" "$b" "$g" "$g" | head -20; fail "$1: $g differs from ref's"; }
  done
}

note "mpi: mpirun inside the 2-node allocation, same steps and checkpoint as ref"
expect mpi COMPLETED 0:0
has mpi "mpirun -np 4"
has mpi "world 4 ranks (2 hosts), mesh 2 replicate x 2 shard"
same_as_ref mpi

note "tl: the time limit's SIGUSR1 in step 7 on both nodes, checkpoint, requeue, resume, ref's result"
expect tl COMPLETED 0:0
r=$(field "${JOB[tl]}" Restarts)
[ "${r:-0}" -ge 1 ] || job_fail tl "tl was not requeued (Restarts=$r)"
[ -s "$T/tl.paused" ] || job_fail tl "tl's rank 3 never paused in step 7"
has tl "shardtrain-job: SIGUSR1 received"
# The pause holds step 7 until the signal; on a machine so loaded that the signal came before
# step 7, the first stop is earlier (and the pause then waits for the next allocation's signal).
k=$(sed -n 's/^checkpoint: step \([0-9]*\) .*signal SIGUSR1.*/\1/p' "$(joblog tl)" | head -1)
[ -n "$k" ] && [ "$k" -ge 1 ] && [ "$k" -lt 12 ] || job_fail tl "tl: no checkpoint on the time limit's SIGUSR1 mid-run"
[ "$k" = 7 ] || echo "note: the time-limit signal came before the pause, in step $k"
has tl "shardtrain-job: checkpointed on SIGUSR1, not finished (exit 42)"
has tl "shardtrain-job: requeueing job ${JOB[tl]}"
has tl "# resumed from $(ckpt_file "$T/tl" "$k"): step $k,"
has tl "shardtrain-job: finished"
same_as_ref tl

note "study: both points ran through Slurm, the 4-rank one on 2 real hosts"
for j in "${STUDY_JOBS[@]}"; do
  s=$(on1 scontrol show job -o "$j" 2>/dev/null | grep -o " JobState=[^ ]*" | head -1)
  [ "$s" = " JobState=COMPLETED" ] || { cat "$T"/study/slurm/*.out 2>/dev/null | tail -30; fail "study job $j:$s"; }
done
python3 "$JS/scaling-study" collect "$T/study" > "$T/study-collect.log" 2>&1 ||
  { cat "$T/study-collect.log"; fail "scaling-study collect"; }
python3 - "$T/study/results.csv" <<'EOF' || { cat "$T/study/results.csv"; fail "study results"; }
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
got = sorted((r["ranks"], r["hosts"], r["hosts_simulated"], r["status"]) for r in rows)
want = [("2", "1", "False", "ok"), ("4", "2", "False", "ok")]
if [g[:2] for g in got] != [w[:2] for w in want] or any(g[3] != "ok" for g in got) or any(g[2] not in ("False", "false", "0") for g in got):
    print("results:", got); sys.exit(1)
EOF
grep -rq "world 4 ranks (2 hosts)" "$T/study/runs" || fail "the study's 4-rank point did not run on 2 hosts"

note "OK in $((SECONDS - T0)) s: multinode.sbatch with srun and mpirun over 2 real hosts, a time-limited job requeued and bit-identical, a scaling study on 1 and 2 nodes"
