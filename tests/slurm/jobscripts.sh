# The jobscripts of jobscripts/ under a real Slurm (tests/slurm/local-slurm.sh: slurmctld + slurmd +
# munged on this host, state in the test's temporary folder, stopped by pid on exit). Tiny GPT on
# byte tokens (tests/e2e/train/tiny.toml), 2 ranks, 12 steps; the reference is an uninterrupted
# run through jobscripts/local.sh (mpirun, no scheduler). The jobs, submitted together:
#   tl    cpu.sbatch, srun, --time=2 --signal=B:USR1@30: rank 1 pauses in step 7 until a stop
#         signal arrives, so the time limit's signal always lands mid-run, whatever the load;
#         the job must checkpoint step 7, exit 42, requeue itself, resume and finish (>= 60 s left
#         in the second allocation for ~10 s of work)
#   mreq  cpu.sbatch, mpirun, requeue: paused in step 4, `scancel -b --signal=USR1` (what
#         --signal=B: does: the batch shell only; the script passes it on)
#   sres  cpu.sbatch, srun, SHARDTRAIN_REQUEUE=resubmit: the same, continued by a new job
#   node  node.sbatch on 2 fake GPUs (gres without devices), full_shard, uninterrupted
#   hsdp  multinode.sbatch on one node, 2 simulated hosts: 2 replicate x 1 shard
#   bad   cpu.sbatch with a bad override: exit 2, FAILED, not requeued
#   cap   cpu.sbatch with SHARDTRAIN_MAX_RESTARTS=0, stopped by a signal: exit 42, FAILED
# Every run that finishes must log the reference's steps to the bit and end with the same
# checkpoint (hsdp: the same losses within fp32 rounding).
# Usage: bash jobscripts.sh SHARDTRAIN MPIEXEC [mpirun flags]; exit 77 = skipped (not root).
source "$(dirname "$0")/../e2e/train/lib.sh"
REPO=$(cd "$HERE/../../.." && pwd)
JS=$REPO/jobscripts
SLURM_SH=$REPO/tests/slurm/local-slurm.sh
SKIP=77
T0=$SECONDS

# Two free TCP ports in a row (slurmctld, slurmd), away from a local-slurm on the default 6817.
free_port() {
  local p
  for ((p = 6930 + RANDOM % 200 * 2; p < 7400; p += 2)); do
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && continue
    (exec 3<>"/dev/tcp/127.0.0.1/$((p + 1))") 2>/dev/null && continue
    echo "$p"; return 0
  done
  fail "no free port pair for Slurm"
}
port=$(free_port)
export LOCAL_SLURM_DIR=$T/slurm LOCAL_SLURM_PORT=$port LOCAL_SLURM_CPUS=6 LOCAL_SLURM_GPUS=4
chmod 755 "$T"   # munged wants every folder above its socket searchable by all
mkdir -p "$LOCAL_SLURM_DIR"
slurm_cleanup() {
  local rc=$?
  if [ $rc != 0 ] && [ $rc != $SKIP ] && [ -f "$LOCAL_SLURM_DIR/log/slurmctld.log" ]; then
    echo "--- slurmctld.log (tail)"; tail -15 "$LOCAL_SLURM_DIR/log/slurmctld.log"
  fi
  "$SLURM_SH" stop >/dev/null 2>&1 || true   # the daemons, by the pids they wrote
  cleanup
}
trap slurm_cleanup EXIT

note "starting Slurm in $LOCAL_SLURM_DIR (port $LOCAL_SLURM_PORT)"
set +e
out=$("$SLURM_SH" start 2>&1)
rc=$?
set -e
echo "$out"
if [ $rc = 3 ]; then echo "SKIP: Slurm cannot be started here (slurmd must run as root)"; exit $SKIP; fi
[ $rc = 0 ] || fail "local-slurm.sh start exited $rc (4: packages missing, run scripts/setup)"
export SLURM_CONF=$LOCAL_SLURM_DIR/etc/slurm.conf
note "Slurm up after $((SECONDS - T0)) s"

make_dataset
# The jobs inherit this environment (sbatch --export=ALL, the default).
export SHARDTRAIN_BIN=$ST OMPI_MCA_mpi_yield_when_idle=1
unset SHARDTRAIN_HOME SHARDTRAIN_LAUNCHER SHARDTRAIN_LAUNCHER_ARGS SHARDTRAIN_REQUEUE SHARDTRAIN_MAX_RESTARTS SHARDTRAIN_SETS \
  SHARDTRAIN_SCRIPT_SETS SHARDTRAIN_DECK SHARDTRAIN_BIND SHARDTRAIN_THREADS SHARDTRAIN_NP SHARDTRAIN_RESUBMITS
declare -A JOB   # name -> the job id to follow
# submit NAME SCRIPT [sbatch options] -- [deck overrides]: from $T (logs: $T/st-NAME-<id>.out).
submit() {
  local name=$1 script=$2; shift 2
  local opts=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
  shift
  JOB[$name]=$(cd "$T" && sbatch --parsable -J "st-$name" --ntasks-per-node=2 --cpus-per-task=1 --mem=1000 \
    "${opts[@]}" "$JS/$script" "$DECK" "data.dataset=$T/data" "run.out_dir=$T/$name" "$@") ||
    fail "sbatch of $name ($script) failed"
}
field() { scontrol show job -o "$1" 2>/dev/null | grep -o " $2=[^ ]*" | head -1 | cut -d= -f2; }
joblog() { echo "$T/st-$1-${JOB[$1]}.out"; }
show_logs() {
  local n
  for n in "$@"; do echo "--- $n: job ${JOB[$n]} $(field "${JOB[$n]}" JobState) (log $(joblog "$n"))"
    grep -v '^step \|^#\|^\[[a-z]' "$(joblog "$n")" 2>/dev/null | tail -25; done
}
job_fail() { show_logs "$1"; fail "$2"; }

note "submitting: tl (time limit), mreq, sres, node, hsdp, bad, cap"
SHARDTRAIN_TEST_PAUSE=mid_step:7:1 SHARDTRAIN_TEST_PAUSE_MARKER=$T/tl.paused \
  submit tl cpu.sbatch --time=2 --signal=B:USR1@30 --
SHARDTRAIN_LAUNCHER=mpirun SHARDTRAIN_TEST_PAUSE=mid_step:4:1 SHARDTRAIN_TEST_PAUSE_MARKER=$T/mreq.paused \
  submit mreq cpu.sbatch --time=10 --
SHARDTRAIN_REQUEUE=resubmit SHARDTRAIN_TEST_PAUSE=mid_step:4:1 SHARDTRAIN_TEST_PAUSE_MARKER=$T/sres.paused \
  submit sres cpu.sbatch --time=10 --
# --exclusive=user instead of the script's --exclusive: the jobs of this test share the node.
submit node node.sbatch --time=10 --gpus-per-node=2 --exclusive=user --
submit hsdp multinode.sbatch --time=10 --nodes=1 --gpus-per-node=2 --exclusive=user -- parallel.simulate_ranks_per_host=1
submit bad cpu.sbatch --time=10 -- train.max_steps=many
SHARDTRAIN_MAX_RESTARTS=0 SHARDTRAIN_TEST_PAUSE=mid_step:2:1 SHARDTRAIN_TEST_PAUSE_MARKER=$T/cap.paused \
  submit cap cpu.sbatch --time=10 --
for n in "${!JOB[@]}"; do echo "  $n: job ${JOB[$n]}"; done

note "reference: jobscripts/local.sh -np 2, 12 steps uninterrupted"
set +e
"$JS/local.sh" -np 2 "$DECK" "data.dataset=$T/data" "run.out_dir=$T/ref" > "$T/ref.log" 2>&1
rc=$?
set -e
[ $rc = 0 ] || { tail -30 "$T/ref.log"; fail "local.sh exited $rc"; }
grep -q "^shardtrain-job: finished" "$T/ref.log" || fail "local.sh did not report the finish"
step_table "$T/ref/metrics.jsonl" > "$T/ref.steps"
[ "$(wc -l < "$T/ref.steps")" = 12 ] || fail "the reference logged $(wc -l < "$T/ref.steps") steps, expected 12"

note "waiting for the jobs (signals: mreq, sres, cap when paused; tl from Slurm's time limit)"
declare -A SIGNALLED
deadline=$((SECONDS + 300))
while :; do
  for n in mreq sres cap; do
    if [ -z "${SIGNALLED[$n]:-}" ] && [ -s "$T/$n.paused" ]; then
      scancel -b --signal=USR1 "${JOB[$n]}" || fail "scancel -b --signal=USR1 ${JOB[$n]} ($n)"
      SIGNALLED[$n]=1
    fi
  done
  # sres continues as a new job: follow the id its log names.
  if [ -z "${SIGNALLED[sres2]:-}" ] && [ "$(field "${JOB[sres]}" JobState)" = COMPLETED ]; then
    next=$(sed -n 's/^shardtrain-job: resubmitted as job \([0-9]*\).*/\1/p' "$(joblog sres)")
    [ -n "$next" ] || job_fail sres "sres completed without resubmitting itself"
    SRES_FIRST=${JOB[sres]}
    JOB[sres]=$next
    SIGNALLED[sres2]=1
  fi
  busy=""
  for n in "${!JOB[@]}"; do
    case $(field "${JOB[$n]}" JobState) in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE) ;;
      *) busy="$busy $n" ;;
    esac
  done
  [ -n "${SIGNALLED[sres2]:-}" ] || busy="$busy sres"
  [ -z "$busy" ] && break
  if [ $SECONDS -gt $deadline ]; then squeue; show_logs $busy; fail "jobs not done after 300 s:$busy"; fi
  sleep 1
done
note "all jobs ended after $((SECONDS - T0)) s"

# expect NAME STATE EXITCODE RESTARTS
expect() {
  local s e r
  s=$(field "${JOB[$1]}" JobState) e=$(field "${JOB[$1]}" ExitCode) r=$(field "${JOB[$1]}" Restarts)
  [ "$s $e $r" = "$2 $3 $4" ] || job_fail "$1" "$1: job ${JOB[$1]} ended $s, exit $e, $r restarts; expected $2, exit $3, $4 restarts"
}
has() { grep -q -- "$2" "$(joblog "$1")" || job_fail "$1" "$1: the log lacks '$2'"; }
# same_as_ref NAME: every step's loss, grad norm and LR, and the final checkpoint's weights,
# optimizer state, data cursor and RNG states, equal to the reference's (verified once) to the bit.
"$ST" ckpt verify "$(ckpt_file "$T/ref" 12)" > /dev/null || fail "ckpt verify of the reference's final checkpoint"
same_as_ref() {
  local g a b
  step_table "$T/$1/metrics.jsonl" > "$T/$1.steps"
  diff "$T/ref.steps" "$T/$1.steps" || job_fail "$1" "$1: the steps differ from the uninterrupted reference"
  a=$(ckpt_file "$T/ref" 12) b=$(ckpt_file "$T/$1" 12)
  [ -f "$b" ] || job_fail "$1" "$1: no final checkpoint $b"
  for g in /model /optim /train/data_cursor /train/rng_state; do
    h5diff -q "$a" "$b" "$g" "$g" || { h5diff -r "$a" "$b" "$g" "$g" | head -20; fail "$1: $g differs from the reference's"; }
  done
}

note "tl: stopped by the time limit's SIGUSR1 in step 7, requeued by itself, resumed, same result"
expect tl COMPLETED 0:0 1
[ -s "$T/tl.paused" ] || job_fail tl "tl never paused in step 7"
has tl "shardtrain-job: SIGUSR1 received"
has tl "checkpoint: step 7 .*signal SIGUSR1"
has tl "shardtrain-job: checkpointed on SIGUSR1, not finished (exit 42)"
has tl "shardtrain-job: requeueing job ${JOB[tl]}"
# (slurmstepd's "CANCELLED ... DUE TO JOB REQUEUE" line is not checked: whether it reaches the
# log depends on whether the batch shell has exited when the requeue lands. The restart count
# above, the requeue line and the resume below prove the requeue.)
has tl "# resumed from $(ckpt_file "$T/tl" 7): step 7,"
has tl "shardtrain-job: finished"
same_as_ref tl

note "mreq: mpirun, scancel -b --signal=USR1 in step 4, requeued, same result"
expect mreq COMPLETED 0:0 1
has mreq "mpirun -np 2"
has mreq "checkpoint: step 4 .*signal SIGUSR1"
has mreq "# resumed from $(ckpt_file "$T/mreq" 4): step 4,"
same_as_ref mreq

note "sres: srun, signal in step 4, resubmitted as a new job, same result"
[ "$(field "$SRES_FIRST" ExitCode)" = 0:0 ] || fail "sres's first job $SRES_FIRST ended $(field "$SRES_FIRST" ExitCode)"
grep -q "checkpoint: step 4 .*signal SIGUSR1" "$T/st-sres-$SRES_FIRST.out" || fail "sres: no checkpoint on the signal"
expect sres COMPLETED 0:0 0
has sres "srun --ntasks=2"
has sres "start 2 (restarts 1 "
has sres "# resumed from $(ckpt_file "$T/sres" 4): step 4,"
same_as_ref sres

note "node: node.sbatch (fake GPUs), full_shard, same result"
expect node COMPLETED 0:0 0
has node "mesh 1 replicate x 2 shard, strategy full_shard"
same_as_ref node

note "hsdp: multinode.sbatch, hybrid_shard 2 x 1, same losses within fp32 rounding"
expect hsdp COMPLETED 0:0 0
has hsdp "mesh 2 replicate x 1 shard, strategy hybrid_shard"
step_table "$T/hsdp/metrics.jsonl" > "$T/hsdp.steps"
awk 'NR == FNR { ref[$1] = $2; next }
     { n++; d = $2 - ref[$1]; if (d < 0) d = -d; if (!($1 in ref) || d > 1e-4 * ref[$1]) bad = bad " " $1 }
     END { if (n != 12 || bad != "") { print "hsdp: " n " steps; steps off the reference:" bad; exit 1 } }' \
  "$T/ref.steps" "$T/hsdp.steps" || job_fail hsdp "hsdp's losses are not the reference's"

note "bad: exit 2, FAILED, not requeued; cap: exit 42 after the restart cap, FAILED"
expect bad FAILED 2:0 0
has bad "shardtrain-job: FAILED: bad input (exit 2)"
expect cap FAILED 42:0 0
has cap "SHARDTRAIN_MAX_RESTARTS=0"

note "OK: 7 jobs in $((SECONDS - T0)) s; the time-limited job was requeued and ended bit-identical to the uninterrupted run"
