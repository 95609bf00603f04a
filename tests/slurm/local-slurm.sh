#!/usr/bin/env bash
# local-slurm.sh start|stop|status|env: a real one-node Slurm (Debian slurm-wlm: slurmctld, slurmd,
# slurm-client, munge) on this host, started as root without systemd, for the jobscript tests
# (tests/slurm/*.sh). Everything lives under $LOCAL_SLURM_DIR; nothing in /etc is read or written.
# The daemons are stopped by the pids they wrote under that folder, never by name.
# After start:  export SLURM_CONF=$LOCAL_SLURM_DIR/etc/slurm.conf   (or: eval "$(local-slurm.sh env)")
#
# Env: LOCAL_SLURM_DIR (required: the state folder); LOCAL_SLURM_PORT (6817; slurmd uses +1);
#      LOCAL_SLURM_CPUS (max(nproc,4): more than the real cores oversubscribes);
#      LOCAL_SLURM_GPUS (0: a count > 0 declares that many fake GPUs as gres/gpu, no device
#      files, so jobscripts with --gpus-per-node can be submitted on a machine without GPUs);
#      LOCAL_SLURM_MEM_MB (MemTotal - 512); LOCAL_SLURM_MPI (MpiDefault, pmix: Debian's Open MPI
#      has PMIx, not PMI2).
# Exit codes: 0 ok; 1 a daemon did not come up (logs printed); 2 usage;
#             3 Slurm cannot be started here: not root (slurmd must be);
#             4 the packages are missing (scripts/setup installs them).
# Written from the facts in shared/tools/README.md (a one-host Slurm 22.05 in a container).
set -euo pipefail
export PATH=$PATH:/usr/sbin:/sbin

D=${LOCAL_SLURM_DIR:?set LOCAL_SLURM_DIR to a state folder}
CONF=$D/etc/slurm.conf
H=$(hostname -s)
PORT=${LOCAL_SLURM_PORT:-6817}
GPUS=${LOCAL_SLURM_GPUS:-0}

log() { echo "local-slurm: $*" >&2; }

live_pid() { # $1 pidfile $2 comm: print the pid if that process is alive and is that program
  local p
  [[ -s $1 ]] || return 1
  p=$(cat "$1")
  [[ $p =~ ^[0-9]+$ && -r /proc/$p/comm && $(cat "/proc/$p/comm") == "$2" ]] || return 1
  echo "$p"
}

check_can_start() {
  local b missing=()
  for b in slurmctld slurmd sbatch scontrol munged munge; do command -v "$b" >/dev/null || missing+=("$b"); done
  if [[ ${#missing[@]} -gt 0 ]]; then
    log "missing ${missing[*]}: install slurmctld slurmd slurm-client munge (scripts/setup does)"
    exit 4
  fi
  if [[ $(id -u) != 0 ]]; then log "slurmd must run as root to start jobs; this is uid $(id -u)"; exit 3; fi
}

start_daemon() { # $1 name for the .out log, then the command (the daemons run in the foreground, detached)
  local n=$1; shift
  setsid "$@" </dev/null >"$D/log/$n.out" 2>&1 &
}

wait_for() { # $1 seconds, then a command retried every 0.25 s until it succeeds
  local t=$1 i; shift
  for ((i = 0; i < t * 4; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.25; done
  return 1
}

write_conf() {
  local cpus mem gres="" i
  cpus=${LOCAL_SLURM_CPUS:-$(( $(nproc) > 4 ? $(nproc) : 4 ))}
  mem=${LOCAL_SLURM_MEM_MB:-$(( $(awk '/^MemTotal:/{print $2}' /proc/meminfo) / 1024 - 512 ))}
  if [[ $GPUS -gt 0 ]]; then
    gres=" Gres=gpu:$GPUS"
    # slurmd counts GPUs by their device files: stand-ins under $D/dev (character devices like
    # /dev/null where mknod is allowed, else empty files, which slurmd accepts with an error line)
    mkdir -p "$D/dev"
    for ((i = 0; i < GPUS; i++)); do mknod "$D/dev/gpu$i" c 1 3 2>/dev/null || : >"$D/dev/gpu$i"; done
    echo "NodeName=$H Name=gpu File=$D/dev/gpu[0-$((GPUS - 1))]" >"$D/etc/gres.conf"
  fi
  cat >"$CONF" <<EOF
ClusterName=local
SlurmctldHost=$H(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$D/munge/munge.sock,cred_expire=5
StateSaveLocation=$D/spool/ctld
SlurmdSpoolDir=$D/spool/d
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$D/log/jobcomp.txt
MpiDefault=${LOCAL_SLURM_MPI:-pmix}
MailProg=/bin/true
ReturnToService=2
MinJobAge=3600
KillWait=5
InactiveLimit=0
SchedulerParameters=sched_interval=2
GresTypes=gpu
NodeName=$H NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem$gres State=UNKNOWN
PartitionName=debug Nodes=$H Default=YES MaxTime=INFINITE State=UP
EOF
}

node_idle() { [[ $(sinfo -h -n "$H" -o %t 2>/dev/null | head -1) == idle ]]; }

do_start() {
  export SLURM_CONF=$CONF
  if live_pid "$D/run/slurmctld.pid" slurmctld >/dev/null; then
    log "already running"; echo "export SLURM_CONF=$CONF"; return 0
  fi
  check_can_start
  do_stop quiet   # leftovers of a half-started run, if any
  rm -rf "${D:?}/spool" "${D:?}/etc" "${D:?}/log" "${D:?}/run" "${D:?}/munge" "${D:?}/dev"
  mkdir -p "$D"/{etc,log,run,spool/ctld,spool/d,munge}
  chmod 755 "$D" "$D/munge"   # munged: socket folder needs o+x and no group/other write; key 0600
  if command -v mungekey >/dev/null; then mungekey -c -k "$D/munge/munge.key" -b 1024
  else dd if=/dev/urandom of="$D/munge/munge.key" bs=128 count=1 status=none; fi
  chmod 600 "$D/munge/munge.key"
  start_daemon munged munged -F --key-file="$D/munge/munge.key" --socket="$D/munge/munge.sock" \
    --pid-file="$D/run/munged.pid" --log-file="$D/log/munged.log" --seed-file="$D/munge/munged.seed"
  wait_for 10 munge -S "$D/munge/munge.sock" -n ||
    { cat "$D/log/munged.out" "$D/log/munged.log" >&2 2>/dev/null; log "munged failed"; exit 1; }
  write_conf
  start_daemon slurmctld slurmctld -D -f "$CONF"
  wait_for 20 scontrol ping || { tail "$D/log/slurmctld.out" "$D/log/slurmctld.log" >&2; log "slurmctld failed"; exit 1; }
  start_daemon slurmd slurmd -D -f "$CONF" -N "$H"
  if ! wait_for 15 node_idle; then
    scontrol update NodeName="$H" State=RESUME >/dev/null 2>&1 || true
    wait_for 10 node_idle ||
      { sinfo -N -l >&2; tail "$D/log/slurmd.out" "$D/log/slurmd.log" >&2; log "node not idle"; exit 1; }
  fi
  log "up in $D (port $PORT): $(sinfo -h -o '%P %a %D %t %c cpus %G' | tr '\n' ' ')"
  echo "export SLURM_CONF=$CONF"
}

stop_pidfile() { # $1 pidfile $2 comm: TERM, wait up to 15 s, then KILL
  local p i
  p=$(live_pid "$1" "$2") || { rm -f "$1"; return 0; }
  kill -TERM "$p" 2>/dev/null || true
  for ((i = 0; i < 60; i++)); do [[ -d /proc/$p ]] || break; sleep 0.25; done
  if [[ -d /proc/$p ]]; then kill -KILL "$p" 2>/dev/null || true; fi
  rm -f "$1"
}

do_stop() {
  export SLURM_CONF=$CONF
  if live_pid "$D/run/slurmctld.pid" slurmctld >/dev/null; then
    # cancel this cluster's jobs first, so that no slurmstepd or job process outlives slurmd
    local jobs; jobs=$(squeue -h -o %A 2>/dev/null || true)
    if [[ -n $jobs ]]; then
      # shellcheck disable=SC2086
      scancel -f $jobs 2>/dev/null || true
      wait_for 20 bash -c '[[ -z $(squeue -h -t R,CG -o %A 2>/dev/null) ]]' || true
    fi
  fi
  stop_pidfile "$D/run/slurmd.pid" slurmd
  stop_pidfile "$D/run/slurmctld.pid" slurmctld
  stop_pidfile "$D/run/munged.pid" munged
  [[ ${1:-} == quiet ]] || log "stopped"
}

do_status() {
  local n p
  for n in munged slurmctld slurmd; do
    if p=$(live_pid "$D/run/$n.pid" "$n"); then echo "$n running, pid $p"; else echo "$n not running"; fi
  done
  if [[ -f $CONF ]]; then SLURM_CONF=$CONF sinfo 2>/dev/null || true; fi
}

case ${1:-} in
  start) do_start ;;
  stop) do_stop ;;
  status) do_status ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
