#!/usr/bin/env bash
# run-training.sh: what every shardtrain jobscript shares (node.sbatch, multinode.sbatch,
# cpu.sbatch, local.sh call it; docs/jobscripts.md explains it). It
#   1. starts `shardtrain train DECK --set k=v ...` through srun or mpirun, in the background;
#   2. passes a stop signal it receives (SIGUSR1 from `#SBATCH --signal=B:USR1@...`, SIGTERM,
#      SIGINT) on to the launcher as SIGUSR1: every rank finishes its step, all write one
#      checkpoint and exit 42;
#   3. acts on the exit code: 0 finished; 42 checkpointed on a signal, not finished -> requeue
#      the Slurm job (or resubmit it) so that the next start resumes from that checkpoint
#      (checkpoint.resume=auto), at most SHARDTRAIN_MAX_RESTARTS times; anything else fails the
#      job with the code's meaning.
#
# Usage (inside a Slurm allocation, or on a workstation with SHARDTRAIN_NP):
#   run-training.sh [DECK] [key=value | --set key=value]...
# Settings, from the environment (the jobscripts set them in their "edit here" block):
#   SHARDTRAIN_DECK           the deck when no DECK argument is given
#   SHARDTRAIN_BIN            the shardtrain binary (default: build/bin/shardtrain of this checkout,
#                             or <prefix>/bin/shardtrain of an install; the module sets it)
#   SHARDTRAIN_LAUNCHER       srun | mpirun (default: srun inside Slurm, mpirun outside)
#   SHARDTRAIN_LAUNCHER_ARGS  more launcher arguments, split at spaces (e.g. "--mpi=pmix")
#   SHARDTRAIN_NP             ranks (default: $SLURM_NTASKS; required outside Slurm)
#   SHARDTRAIN_BIND           none (default): srun --cpu-bind=none / mpirun --bind-to none, as the
#                             communication thread needs a core of its own; "launcher": the
#                             launcher's own binding
#   SHARDTRAIN_THREADS        threads per rank -> OMP_NUM_THREADS and run.threads
#                             (default: $SLURM_CPUS_PER_TASK; unset: the deck's run.threads)
#   SHARDTRAIN_SCRIPT_SETS    overrides of the jobscript itself (its strategy), space-separated
#                             key=value, first
#   SHARDTRAIN_SETS           more overrides, space-separated key=value, after those and before
#                             the arguments' (the last value of a key wins)
#   SHARDTRAIN_REQUEUE        requeue (default: `scontrol requeue`, resubmission if that fails)
#                             | resubmit (`sbatch --dependency=afterany:<this job>`) | none
#   SHARDTRAIN_MAX_RESTARTS   give up (exit 42, job FAILED) after this many restarts (default 10)
#   SHARDTRAIN_READY_WAIT     seconds a stop signal that comes while the ranks start is held at most
#                             (default 300; see "held" below and docs/jobscripts.md)
# Exit code: the program's (0, 42 when not requeued, 1, 2, 3, 4, 5, 128+signal), 0 after a requeue
# or a resubmission; 2 when this script's own input is wrong.
set -uo pipefail

say() { echo "shardtrain-job: $*"; }
die() { echo "shardtrain-job: error: $*" >&2; exit 2; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
in_slurm=0
[ -n "${SLURM_JOB_ID:-}" ] && in_slurm=1

# ---- arguments: [DECK] then overrides ------------------------------------------------------
job_args=("$@")   # as given, for a resubmission
deck=${SHARDTRAIN_DECK:-}
if [ $# -gt 0 ] && [[ $1 != *=* && $1 != -* ]]; then deck=$1; shift; fi
[ -n "$deck" ] || die "no deck: give it as the first argument or set SHARDTRAIN_DECK"
sets=()
for kv in ${SHARDTRAIN_SCRIPT_SETS:-} ${SHARDTRAIN_SETS:-}; do sets+=(--set "$kv"); done
while [ $# -gt 0 ]; do
  case $1 in
    --set) [ $# -ge 2 ] || die "--set needs key=value"; sets+=(--set "$2"); shift 2 ;;
    --set=*) sets+=(--set "${1#--set=}"); shift ;;
    *=*) sets+=(--set "$1"); shift ;;
    *) die "unexpected argument '$1' (expected key=value overrides after the deck)" ;;
  esac
done

# ---- settings -------------------------------------------------------------------------------
bin=${SHARDTRAIN_BIN:-$here/../build/bin/shardtrain}
# Installed (cmake --install: <prefix>/share/shardtrain/jobscripts), the binary is <prefix>/bin's.
[ -n "${SHARDTRAIN_BIN:-}" ] || [ -x "$bin" ] || [ ! -x "$here/../../../bin/shardtrain" ] || bin=$here/../../../bin/shardtrain
[ -x "$bin" ] || die "no shardtrain binary at '$bin' (build it, or set SHARDTRAIN_BIN)"
bin=$(readlink -f "$bin")   # absolute: srun steps may run without PATH or elsewhere
launcher=${SHARDTRAIN_LAUNCHER:-}
[ -n "$launcher" ] || { if [ $in_slurm = 1 ]; then launcher=srun; else launcher=mpirun; fi; }
np=${SHARDTRAIN_NP:-${SLURM_NTASKS:-}}
bind=${SHARDTRAIN_BIND:-none}
threads=${SHARDTRAIN_THREADS:-${SLURM_CPUS_PER_TASK:-}}
requeue=${SHARDTRAIN_REQUEUE:-requeue}
max_restarts=${SHARDTRAIN_MAX_RESTARTS:-10}
[[ $max_restarts =~ ^[0-9]+$ ]] || die "SHARDTRAIN_MAX_RESTARTS='$max_restarts' is not a number"
case $requeue in requeue | resubmit | none) ;; *) die "SHARDTRAIN_REQUEUE='$requeue': requeue, resubmit or none" ;; esac
case $bind in none | launcher) ;; *) die "SHARDTRAIN_BIND='$bind': none or launcher" ;; esac
# Restarts so far: Slurm's requeue count plus the resubmissions that led to this job.
restarts=$(( ${SLURM_RESTART_COUNT:-0} + ${SHARDTRAIN_RESUBMITS:-0} ))

if [ -n "$threads" ]; then
  [[ $threads =~ ^[1-9][0-9]*$ ]] || die "threads per rank '$threads' is not a positive number"
  export OMP_NUM_THREADS=$threads
  sets=(--set "run.threads=$threads" "${sets[@]}")   # first, so that an argument can change it
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# A restart must continue from the checkpoint, whatever the deck says (a demo deck's "never"
# would start over and loop): last, so that it wins.
[ "$restarts" -gt 0 ] && sets+=(--set checkpoint.resume=auto)

read -r -a extra <<< "${SHARDTRAIN_LAUNCHER_ARGS:-}"
case $launcher in
  srun)
    [ $in_slurm = 1 ] || die "SHARDTRAIN_LAUNCHER=srun needs a Slurm allocation (use mpirun outside Slurm)"
    launch=(srun)
    [ -n "$np" ] && launch+=(--ntasks="$np")
    [ "$bind" = none ] && launch+=(--cpu-bind=none)
    ;;
  mpirun)
    [ -n "$np" ] || die "how many ranks? set SHARDTRAIN_NP (or run inside a Slurm allocation)"
    launch=(mpirun -np "$np")
    [ "$(id -u)" = 0 ] && launch+=(--allow-run-as-root)
    [ "$bind" = none ] && launch+=(--bind-to none)
    # Outside Slurm the slots are this machine's cores: more ranks need --oversubscribe.
    [ $in_slurm = 0 ] && [ "$np" -gt "$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)" ] && launch+=(--oversubscribe)
    ;;
  *) die "SHARDTRAIN_LAUNCHER='$launcher': srun or mpirun" ;;
esac
cmd=("${launch[@]}" "${extra[@]}" "$bin" train "$deck" "${sets[@]}")

# ---- run --------------------------------------------------------------------------------------
if [ $in_slurm = 1 ]; then
  say "job $SLURM_JOB_ID start $((restarts + 1)) (restarts $restarts of at most $max_restarts) at $(date '+%F %T')" \
      "on ${SLURM_JOB_NUM_NODES:-1} node(s) ${SLURM_JOB_NODELIST:-}, $np tasks, ${threads:-(run.threads)} threads per task"
else
  say "start at $(date '+%F %T') on $(hostname -s), $np ranks"
fi
say "in $PWD: ${cmd[*]}"
t0=$SECONDS
stop_signal=""
# Until every rank has installed its stop handler (first thing in main, but a rank spends its
# first seconds loading libraries), a SIGUSR1 would kill it. Slurm may send the --signal warning
# up to 60 s early, that is during start-up: such a signal is held until rank 0 has written this
# file (after all ranks are in MPI; src/cli/main.cpp), or for at most SHARDTRAIN_READY_WAIT seconds.
ready=$PWD/.shardtrain-ready.$$.$RANDOM
export SHARDTRAIN_READY_FILE=$ready
ready_wait=${SHARDTRAIN_READY_WAIT:-300}
held=""
on_signal() {
  # The first one counts; a second (e.g. the time limit's SIGTERM after our SIGUSR1) is passed on too.
  [ -z "$stop_signal" ] && stop_signal=$1
  if [ ! -e "$ready" ] && [ $((SECONDS - t0)) -lt "$ready_wait" ]; then
    say "$1 received at $(date '+%T') while the ranks start: held until they are up"
    held=$1
    return
  fi
  say "$1 received at $(date '+%T'): asking shardtrain to checkpoint and stop (SIGUSR1 to $launcher)"
  kill -USR1 "$child" 2>/dev/null || true
}
release_held() {  # passes a held signal on once the ranks are up (or the wait is over)
  while [ -n "$held" ] && kill -0 "$child" 2>/dev/null; do
    if [ -e "$ready" ] || [ $((SECONDS - t0)) -ge "$ready_wait" ]; then
      say "passing the held $held on at $(date '+%T') (SIGUSR1 to $launcher)"
      held=""
      kill -USR1 "$child" 2>/dev/null || true
      return
    fi
    sleep 0.2
  done
}
if [ $in_slurm = 0 ] && command -v setsid >/dev/null; then
  # Its own session: a Ctrl-C in the terminal reaches this script only (which passes SIGUSR1 on),
  # not mpirun, which would kill the ranks on SIGINT instead of letting them checkpoint.
  setsid "${cmd[@]}" &
else
  "${cmd[@]}" &
fi
child=$!
trap 'on_signal SIGUSR1' USR1
trap 'on_signal SIGTERM' TERM
trap 'on_signal SIGINT' INT
while :; do
  release_held
  wait "$child"
  rc=$?
  # `wait` returns 128+n when a trapped signal interrupts it; the launcher then still runs.
  if [ $rc -gt 128 ] && kill -0 "$child" 2>/dev/null; then continue; fi
  break
done
trap - USR1 TERM INT
rm -f "$ready"
took=$((SECONDS - t0))

# ---- the exit code ----------------------------------------------------------------------------
case $rc in
  0)
    say "finished: training done after ${took} s (exit 0)"
    exit 0 ;;
  42) ;;
  1) say "FAILED: internal error (exit 1) after ${took} s; see the messages above"; exit 1 ;;
  2) say "FAILED: bad input (exit 2): the deck, an override, the data or a checkpoint file; see above"; exit 2 ;;
  3) say "FAILED: a collective timed out (exit 3); the watchdog's report above names the ranks; resubmit to resume"; exit 3 ;;
  4) say "FAILED: the run diverged (exit 4): a non-finite loss or gradient norm; the last good checkpoint is kept; change the deck (learning rate, warm-up, clipping) and resubmit"; exit 4 ;;
  5) say "FAILED: a write failed (exit 5: disk full, quota or I/O error); the last good checkpoint is kept; free space and resubmit"; exit 5 ;;
  *)
    if [ $rc -gt 128 ]; then
      say "FAILED: exit $rc ($launcher or a rank ended by signal $((rc - 128))) after ${took} s; resubmit to resume from the last checkpoint"
    else
      say "FAILED: exit $rc after ${took} s"
    fi
    exit "$rc" ;;
esac

# 42: a checkpoint was written on a stop signal and training is not finished.
say "checkpointed on ${stop_signal:-a signal}, not finished (exit 42) after ${took} s"
if [ $in_slurm = 0 ]; then
  say "run the same command again to resume from the checkpoint"
  exit 42
fi
if [ "$stop_signal" = SIGTERM ]; then
  # Slurm's SIGTERM is scancel, preemption or the time limit itself: not ours to requeue
  # (preemption requeues by itself). The early SIGUSR1 of --signal is what requeues.
  say "stopped by SIGTERM (scancel, preemption or the time limit): not requeueing; resubmit to resume"
  exit 42
fi
if [ "$requeue" = none ]; then
  say "SHARDTRAIN_REQUEUE=none: not requeueing; resubmit to resume"
  exit 42
fi
if [ "$restarts" -ge "$max_restarts" ]; then
  say "FAILED: not requeueing: this job has been restarted $restarts times (SHARDTRAIN_MAX_RESTARTS=$max_restarts);" \
      "resubmit it to continue, or raise the limit"
  exit 42
fi

resubmit() {
  local script
  script=$(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/.* Command=\([^ ]*\).*/\1/p')
  if [ -z "$script" ] || [ ! -r "$script" ]; then
    say "FAILED: cannot resubmit: Slurm does not name a readable jobscript for job $SLURM_JOB_ID ('$script')"
    return 1
  fi
  # sbatch reads the #SBATCH lines again, but not the options this job was submitted with:
  # repeat the shape of this allocation (what Slurm tells the job about it).
  local opts=(--parsable --dependency="afterany:$SLURM_JOB_ID" --chdir="$PWD" --job-name="$SLURM_JOB_NAME"
              --nodes="$SLURM_JOB_NUM_NODES") limit
  if [ -n "${SLURM_NTASKS_PER_NODE:-}" ]; then opts+=(--ntasks-per-node="$SLURM_NTASKS_PER_NODE")
  else opts+=(--ntasks="$SLURM_NTASKS"); fi
  [ -n "${SLURM_CPUS_PER_TASK:-}" ] && opts+=(--cpus-per-task="$SLURM_CPUS_PER_TASK")
  [ -n "${SLURM_GPUS_PER_NODE:-}" ] && opts+=(--gpus-per-node="$SLURM_GPUS_PER_NODE")
  [ -n "${SLURM_MEM_PER_NODE:-}" ] && opts+=(--mem="$SLURM_MEM_PER_NODE")
  [ -n "${SLURM_MEM_PER_CPU:-}" ] && opts+=(--mem-per-cpu="$SLURM_MEM_PER_CPU")
  [ -n "${SLURM_JOB_PARTITION:-}" ] && opts+=(--partition="$SLURM_JOB_PARTITION")
  [ -n "${SLURM_JOB_ACCOUNT:-}" ] && opts+=(--account="$SLURM_JOB_ACCOUNT")
  [ -n "${SLURM_JOB_QOS:-}" ] && opts+=(--qos="$SLURM_JOB_QOS")
  limit=$(squeue -h -j "$SLURM_JOB_ID" -o %l 2>/dev/null)
  [[ $limit =~ ^[0-9] ]] && opts+=(--time="$limit")
  # The job's own SLURM_* variables must not leak into the next job (SLURM_CONF is configuration).
  local unset=() v out
  for v in $(compgen -e); do [[ $v == SLURM_* && $v != SLURM_CONF ]] && unset+=(-u "$v"); done
  if out=$(env "${unset[@]}" SHARDTRAIN_RESUBMITS=$((${SHARDTRAIN_RESUBMITS:-0} + 1)) \
           sbatch "${opts[@]}" "$script" "${job_args[@]}" 2>&1); then
    say "resubmitted as job ${out%%;*} (starts after this one ends; restart $((restarts + 1)))"
    return 0
  fi
  say "FAILED: sbatch: $out"
  return 1
}
if [ "$requeue" = requeue ]; then
  say "requeueing job $SLURM_JOB_ID (restart $((restarts + 1)) of at most $max_restarts)"
  if out=$(scontrol requeue "$SLURM_JOB_ID" 2>&1); then
    exit 0   # Slurm ends this run now and starts the job again later with the same id
  fi
  say "scontrol requeue failed: $out; resubmitting instead (is '#SBATCH --requeue' set?)"
fi
resubmit && exit 0
exit 42
