#!/usr/bin/env bash
# local.sh: shardtrain on this machine with mpirun, without a scheduler (a workstation, a GPU box,
# an interactive node). The same handling as the Slurm jobscripts, minus the requeueing.
#
#   jobscripts/local.sh [-np N] [DECK] [key=value ...]
#   jobscripts/local.sh -np 2 inputs/quickstart.toml train.max_steps=50
#
# To stop with a checkpoint: `kill <pid of this script>` (SIGTERM), `kill -USR1` or Ctrl-C; the
# script passes SIGUSR1 to mpirun, which passes it to every rank: they finish the step, write a
# checkpoint and exit 42 (so does this script). To resume, run the same command again with
# checkpoint.resume=auto added (a deck that says resume = "never", as the demo decks in inputs/
# do, would start over without it; with resume = "auto", the default, the same command resumes).
# Settings (environment): NP (ranks, default 2; -np wins), SHARDTRAIN_BIN, SHARDTRAIN_THREADS
# (threads per rank; default: the deck's run.threads), SHARDTRAIN_BIND (none | launcher),
# SHARDTRAIN_LAUNCHER_ARGS (more mpirun arguments, e.g. "--hostfile hosts"). docs/jobscripts.md.
set -euo pipefail
export SHARDTRAIN_NP=${NP:-2}
if [ "${1:-}" = -np ] || [ "${1:-}" = -n ]; then
  [ $# -ge 2 ] || { echo "local.sh: $1 needs a number" >&2; exit 2; }
  SHARDTRAIN_NP=$2
  shift 2
fi
[[ $SHARDTRAIN_NP =~ ^[1-9][0-9]*$ ]] || { echo "local.sh: ranks '$SHARDTRAIN_NP' is not a positive number" >&2; exit 2; }
export SHARDTRAIN_DECK=${SHARDTRAIN_DECK:-inputs/quickstart.toml}
export SHARDTRAIN_LAUNCHER=mpirun
export SHARDTRAIN_BIND=${SHARDTRAIN_BIND:-none}
# Not a Slurm job, even when started inside an allocation's shell.
exec env -u SLURM_JOB_ID bash "$(dirname "$0")/run-training.sh" "$@"
