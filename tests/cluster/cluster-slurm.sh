#!/usr/bin/env bash
# cluster-slurm.sh start|stop|status|env|run CMD...: a real multi-node Slurm on the namespace test
# cluster (tests/cluster/cluster.sh, which must be up): munged on this host (its socket is a file,
# reachable from every node's network namespace), slurmctld on node 1 (the controller is a node,
# as on a small real cluster: SlurmctldHost=NAME-n1 at node 1's address) and one slurmd per node,
# each started inside its node's network + UTS namespaces with `slurmd -N NAME-nI` and its own
# spool, pid and log files (%n in slurm.conf). Jobs' processes live in the node that runs them:
# their hostname is the node's, ranks on different nodes talk over the bridge.
# The client commands run on node 1 (`run`): an srun there names node 1's address to the slurmds
# (from the root namespace the hostname would resolve to 127.0.0.1, which no node can reach).
#
#   tests/cluster/cluster.sh start 2
#   CLUSTER_SLURM_DIR=/tmp/cs tests/cluster/cluster-slurm.sh start
#   CLUSTER_SLURM_DIR=/tmp/cs tests/cluster/cluster-slurm.sh run sbatch --nodes=2 ... jobscripts/multinode.sbatch DECK
#   CLUSTER_SLURM_DIR=/tmp/cs tests/cluster/cluster-slurm.sh stop
#
# Env: CLUSTER_SLURM_DIR (required: the state folder; every folder above it must be searchable by
#      all, for munged); CLUSTER_SLURM_PORT (6917: slurmctld; the slurmds use +1, in their own
#      namespaces); CLUSTER_SLURM_CPUS (CPUs declared per node, 4: more than the real cores
#      oversubscribes); CLUSTER_SLURM_GPUS (2: fake gres/gpu per node, no devices, so the GPU
#      jobscripts can be submitted); SHARDTRAIN_CLUSTER / SHARDTRAIN_CLUSTER_NET (the cluster).
# Daemons are stopped by the pids they wrote (never by name); whatever is left inside the nodes
# goes with `cluster.sh stop`.
# Exit codes: 0 ok; 1 a daemon did not come up (logs printed); 2 usage or the cluster is not up;
#             3 Slurm cannot run here (not root); 4 the packages are missing (scripts/setup).
set -euo pipefail
export PATH=$PATH:/usr/sbin:/sbin

D=${CLUSTER_SLURM_DIR:?set CLUSTER_SLURM_DIR to a state folder}
CONF=$D/etc/slurm.conf
PORT=${CLUSTER_SLURM_PORT:-6917}
GPUS=${CLUSTER_SLURM_GPUS:-2}
CL=${SHARDTRAIN_CLUSTER_STATE:-/run/shardtrain-cluster}/${SHARDTRAIN_CLUSTER:-st}
export SLURM_CONF=$CONF

log() { echo "cluster-slurm: $*" >&2; }

nodes() { [[ -f $CL/nodes ]] || { log "the test cluster ${SHARDTRAIN_CLUSTER:-st} is not up (tests/cluster/cluster.sh start)"; exit 2; }; cat "$CL/nodes"; }
# on NODE CMD...: CMD inside NODE's network and UTS namespaces
on() { local h=$1 ns; shift; ns=$(awk -v h="$h" '$1 == h { print $2 }' "$CL/nodes"); exec_in "$ns" "$h" "$@"; }
exec_in() { local ns=$1 h=$2; shift 2; nsenter --net="/run/netns/$ns" --uts="$CL/uts/$h" -- "$@"; }
first() { nodes | head -1 | cut -d' ' -f1; }

live_pid() { # $1 pidfile $2 comm
  local p
  [[ -s $1 ]] || return 1
  p=$(cat "$1")
  [[ $p =~ ^[0-9]+$ && -r /proc/$p/comm && $(cat "/proc/$p/comm") == "$2" ]] || return 1
  echo "$p"
}
wait_for() { local t=$1 i; shift; for ((i = 0; i < t * 4; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.25; done; return 1; }
start_daemon() { local n=$1; shift; setsid "$@" </dev/null >"$D/log/$n.out" 2>&1 & }

check_can_start() {
  local b missing=()
  for b in slurmctld slurmd sbatch scontrol munged munge nsenter; do command -v "$b" >/dev/null || missing+=("$b"); done
  [[ ${#missing[@]} == 0 ]] || { log "missing ${missing[*]}: install slurmctld slurmd slurm-client munge (scripts/setup)"; exit 4; }
  [[ $(id -u) == 0 ]] || { log "slurmd must run as root to start jobs; this is uid $(id -u)"; exit 3; }
}

write_conf() {
  local cpus=${CLUSTER_SLURM_CPUS:-4} mem h a list="" gres=""
  mem=$(( $(awk '/^MemTotal:/{print $2}' /proc/meminfo) / 1024 / 4 ))
  local ctl ctl_addr
  read -r ctl _ ctl_addr _ < <(nodes | head -1)
  : >"$D/etc/gres.conf"
  if [[ $GPUS -gt 0 ]]; then
    gres=" Gres=gpu:$GPUS"
    mkdir -p "$D/dev"
  fi
  {
    cat <<EOF
ClusterName=${SHARDTRAIN_CLUSTER:-st}
SlurmctldHost=$ctl($ctl_addr)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$D/munge/munge.sock,cred_expire=5
StateSaveLocation=$D/spool/ctld
SlurmdSpoolDir=$D/spool/%n
TmpFS=$D/tmp/%n
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$D/log/jobcomp.txt
MpiDefault=pmix
MailProg=/bin/true
ReturnToService=2
MinJobAge=3600
KillWait=5
InactiveLimit=0
SchedulerParameters=sched_interval=1
GresTypes=gpu
EOF
    while read -r h _ a _; do
      echo "NodeName=$h NodeAddr=$a CPUs=$cpus RealMemory=$mem$gres State=UNKNOWN"
      list=${list:+$list,}$h
    done < <(nodes)
    echo "PartitionName=nodes Nodes=$list Default=YES MaxTime=INFINITE State=UP"
  } >"$CONF"
  # fake GPUs: stand-in files per node (character devices like /dev/null where mknod works)
  local i
  while read -r h _; do
    [[ $GPUS -gt 0 ]] || break
    for ((i = 0; i < GPUS; i++)); do mknod "$D/dev/$h-gpu$i" c 1 3 2>/dev/null || : >"$D/dev/$h-gpu$i"; done
    echo "NodeName=$h Name=gpu File=$D/dev/$h-gpu[0-$((GPUS - 1))]" >>"$D/etc/gres.conf"
  done < <(nodes)
}

all_idle() {
  local want have
  want=$(nodes | wc -l)
  have=$(on "$(first)" sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)
  [[ $have == "$want" ]]
}

do_start() {
  local h ns
  nodes >/dev/null
  if live_pid "$D/run/slurmctld.pid" slurmctld >/dev/null; then log "already running"; echo "export SLURM_CONF=$CONF"; return 0; fi
  check_can_start
  do_stop quiet
  rm -rf "${D:?}/spool" "${D:?}/etc" "${D:?}/log" "${D:?}/run" "${D:?}/munge" "${D:?}/dev" "${D:?}/tmp"
  mkdir -p "$D"/{etc,log,run,spool/ctld,munge}
  chmod 755 "$D" "$D/munge"
  if command -v mungekey >/dev/null; then mungekey -c -k "$D/munge/munge.key" -b 1024
  else dd if=/dev/urandom of="$D/munge/munge.key" bs=128 count=1 status=none; fi
  chmod 600 "$D/munge/munge.key"
  start_daemon munged munged -F --key-file="$D/munge/munge.key" --socket="$D/munge/munge.sock" \
    --pid-file="$D/run/munged.pid" --log-file="$D/log/munged.log" --seed-file="$D/munge/munged.seed"
  wait_for 10 munge -S "$D/munge/munge.sock" -n ||
    { cat "$D/log/munged.out" "$D/log/munged.log" >&2 2>/dev/null; log "munged failed"; exit 1; }
  write_conf
  local ctl; ctl=$(first)
  start_daemon slurmctld nsenter --net="/run/netns/$(awk 'NR == 1 { print $2 }' "$CL/nodes")" --uts="$CL/uts/$ctl" -- \
    slurmctld -D -f "$CONF"
  wait_for 20 on "$ctl" scontrol ping ||
    { tail "$D/log/slurmctld.out" "$D/log/slurmctld.log" >&2; log "slurmctld failed"; exit 1; }
  while read -r h ns _; do
    mkdir -p "$D/spool/$h" "$D/tmp/$h"
    start_daemon "slurmd-$h" nsenter --net="/run/netns/$ns" --uts="$CL/uts/$h" -- slurmd -D -f "$CONF" -N "$h"
  done < <(nodes)
  if ! wait_for 20 all_idle; then
    while read -r h _; do on "$ctl" scontrol update NodeName="$h" State=RESUME >/dev/null 2>&1 || true; done < <(nodes)
    wait_for 10 all_idle || { on "$ctl" sinfo -N -l >&2; tail "$D"/log/slurmd-*.log >&2; log "nodes not idle"; exit 1; }
  fi
  log "up in $D (slurmctld on $ctl port $PORT): $(on "$ctl" sinfo -h -N -o '%N %t %c cpus %G' | tr '\n' ' ')"
  echo "export SLURM_CONF=$CONF"
}

stop_pidfile() { # $1 pidfile $2 comm
  local p i
  p=$(live_pid "$1" "$2") || { rm -f "$1"; return 0; }
  kill -TERM "$p" 2>/dev/null || true
  for ((i = 0; i < 60; i++)); do [[ -d /proc/$p ]] || break; sleep 0.25; done
  [[ ! -d /proc/$p ]] || kill -KILL "$p" 2>/dev/null || true
  rm -f "$1"
}

do_stop() {
  local f
  if [[ -f $CL/nodes ]] && live_pid "$D/run/slurmctld.pid" slurmctld >/dev/null; then
    local jobs; jobs=$(on "$(first)" squeue -h -o %A 2>/dev/null || true)
    if [[ -n $jobs ]]; then
      # shellcheck disable=SC2086
      on "$(first)" scancel -f $jobs 2>/dev/null || true
      wait_for 20 bash -c "[[ -z \$(nsenter --net=/run/netns/$(awk 'NR == 1 { print $2 }' "$CL/nodes") squeue -h -t R,CG -o %A 2>/dev/null) ]]" || true
    fi
  fi
  for f in "$D"/run/slurmd-*.pid; do [[ -e $f ]] && stop_pidfile "$f" slurmd; done
  stop_pidfile "$D/run/slurmctld.pid" slurmctld
  stop_pidfile "$D/run/munged.pid" munged
  [[ ${1:-} == quiet ]] || log "stopped"
}

do_status() {
  local n p f
  for f in "$D/run/munged.pid" "$D/run/slurmctld.pid" "$D"/run/slurmd-*.pid; do
    [[ -e $f ]] || continue
    n=$(basename "$f" .pid)
    if p=$(live_pid "$f" "${n%%-*}"); then echo "$n running, pid $p"; else echo "$n not running"; fi
  done
  [[ -f $CONF && -f $CL/nodes ]] && on "$(first)" sinfo -N 2>/dev/null || true
}

case ${1:-} in
  start) do_start ;;
  stop) do_stop ;;
  status) do_status ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  run) shift; [[ $# -gt 0 ]] || { echo "usage: $0 run CMD..." >&2; exit 2; }; nodes >/dev/null; on "$(first)" "$@" ;;
  *) echo "usage: $0 start|stop|status|env|run CMD..." >&2; exit 2 ;;
esac
