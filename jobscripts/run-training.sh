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
#      job with the code's meaning;
#   4. passes the program's own exit code on when it aborted the job (the watchdog's 3 after a
#      network cut) but the launcher cannot end it (mpirun waiting for a node it cannot reach),
#      and gives mpirun an out-of-band keepalive that notices a lost node in bounded time.
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
#   SHARDTRAIN_ABORT_GRACE    seconds the launcher gets to end by itself after the program announced
#                             an abort ("aborting ... with exit code N": the watchdog, a stuck write)
#                             before this script ends it and exits N (default 10; see "aborts" below)
#   SHARDTRAIN_OOB_KEEPALIVE  mpirun only: seconds of silence before Open MPI's out-of-band
#                             keepalive probes a node (default: comm.timeout_s + 30, from the deck)
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
# Aborts: a rank that ends the job (the watchdog after comm.timeout_s, a stuck checkpoint write)
# prints "aborting ... with exit code N" and calls MPI_Abort. mpirun then ends every rank, but
# it waits for the daemon of a node it cannot reach (a cut link) until TCP gives up, minutes
# later, and then exits with its own code. So the ranks' stderr passes through a filter that
# notes the first such code; if the launcher has not ended SHARDTRAIN_ABORT_GRACE seconds
# after it, this script ends the launcher (SIGTERM, then SIGKILL) and exits with that code.
abort_grace=${SHARDTRAIN_ABORT_GRACE:-10}
[[ $abort_grace =~ ^[0-9]+$ ]] || die "SHARDTRAIN_ABORT_GRACE='$abort_grace' is not a number of seconds"
abort_note=$(mktemp "${TMPDIR:-/tmp}/shardtrain-abort.XXXXXX") || die "cannot create a temporary file"
watch_aborts() {
  # bash's read takes a line as soon as it ends (awk would wait for a block of input).
  local line code=""
  while IFS= read -r line || [ -n "$line" ]; do
    printf '%s\n' "$line"
    if [ -z "$code" ] && [[ $line =~ aborting\ (all\ ranks|the\ job)\ with\ exit\ code\ ([0-9]+) ]]; then
      code=${BASH_REMATCH[2]}
      echo "$code" > "$abort_note"
    fi
  done
}
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
child=""
trap 'on_signal SIGUSR1' USR1
trap 'on_signal SIGTERM' TERM
trap 'on_signal SIGINT' INT
# Read from the deck (a few seconds: a singleton start of the binary), so after the signal traps
# above: a stop signal meanwhile is held like one during the ranks' start.
if [ "$launcher" = mpirun ]; then
  # A node that becomes unreachable (a cut link) is declared lost by Open MPI's out-of-band
  # TCP keepalive: its defaults (300 s idle + 9 probes x 20 s) leave mpirun waiting 8 minutes.
  # Probed after comm.timeout_s + 30 s of silence, 3 probes 5 s apart: later than the
  # watchdog, whose report and exit 3 must come first (a lost node makes mpirun end the job
  # itself, exit 205, without the report), and soon enough to end a job whose ranks are all
  # outside collectives. The daemons (orted) get the same settings and end the ranks of a node
  # that lost mpirun.
  keepalive=${SHARDTRAIN_OOB_KEEPALIVE:-}
  if [ -z "$keepalive" ]; then
    t=$("$bin" deck show "$deck" "${sets[@]}" 2>/dev/null |
        awk '/^\[/ { c = ($1 == "[comm]") } c && $1 == "timeout_s" { print int($3 + 0.999) }')
    [[ $t =~ ^[0-9]+$ ]] || t=600
    keepalive=$(( (t > 0 ? t : 600) + 30 ))
  fi
  [[ $keepalive =~ ^[1-9][0-9]*$ ]] || die "SHARDTRAIN_OOB_KEEPALIVE='$keepalive' is not a positive number"
  cmd=("${cmd[@]:0:${#launch[@]}}" --mca oob_tcp_keepalive_time "$keepalive" --mca oob_tcp_keepalive_intvl 5 --mca oob_tcp_keepalive_probes 3 "${cmd[@]:${#launch[@]}}")
fi
say "in $PWD: ${cmd[*]}"
if [ $in_slurm = 0 ] && command -v setsid >/dev/null; then
  # Its own session: a Ctrl-C in the terminal reaches this script only (which passes SIGUSR1 on),
  # not mpirun, which would kill the ranks on SIGINT instead of letting them checkpoint.
  setsid "${cmd[@]}" 2> >(watch_aborts >&2) &
else
  "${cmd[@]}" 2> >(watch_aborts >&2) &
fi
child=$!
abort_code="" abort_at=""
while kill -0 "$child" 2>/dev/null; do
  release_held
  if [ -z "$abort_code" ] && [ -s "$abort_note" ]; then abort_code=$(cat "$abort_note"); abort_at=$SECONDS; fi
  if [ -n "$abort_code" ] && [ $((SECONDS - abort_at)) -ge "$abort_grace" ]; then
    say "the ranks aborted with exit code $abort_code ${abort_grace} s ago and $launcher still runs" \
        "(it cannot reach a node?): ending it at $(date '+%T')"
    kill -TERM "$child" 2>/dev/null || true
    for _ in 1 2 3 4 5 6; do kill -0 "$child" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$child" 2>/dev/null || true
    break
  fi
  sleep 0.5   # a trapped signal runs its handler when this returns
done
while :; do
  wait "$child"
  rc=$?
  # `wait` returns 128+n when a trapped signal interrupts it; the launcher then still runs.
  if [ $rc -gt 128 ] && kill -0 "$child" 2>/dev/null; then continue; fi
  break
done
trap - USR1 TERM INT
[ -z "$abort_code" ] && [ -s "$abort_note" ] && abort_code=$(cat "$abort_note")
if [ -n "$abort_code" ] && [ "$rc" != "$abort_code" ]; then
  say "$launcher exited $rc after the ranks aborted with exit code $abort_code: exiting $abort_code"
  rc=$abort_code
fi
rm -f "$ready" "$abort_note"
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
  # A deck may say resume = "never" (the demo decks do): only resume=auto makes a rerun resume.
  say "to resume from the checkpoint: run the same command again with checkpoint.resume=auto added (without it, a deck that says resume = \"never\" starts over)"
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
