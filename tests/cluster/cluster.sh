#!/usr/bin/env bash
# cluster.sh start [N] [--rate R] | stop | status | rate R | hosts | env
# A test cluster on this machine: N "nodes" (default 2, at most 4), each a network namespace plus a
# UTS namespace with its own hostname and address, joined by a bridge, each node's link shaped
# with tc tbf (--rate 1gbit | 250mbit | none; netem for latency is not used: not every kernel has
# it). Ranks on one node talk through shared memory; ranks on different nodes through TCP over
# the bridge. Open MPI launches across the nodes with tests/cluster/mpirun-cluster.
#
#   tests/cluster/cluster.sh start 2 --rate 1gbit   # nodes st-n1, st-n2 at 198.18.10.11, .12
#   tests/cluster/mpirun-cluster -np 4 build/bin/shardtrain info
#   tests/cluster/cluster.sh stop
#
# Settings (environment): SHARDTRAIN_CLUSTER (name, default st: 1-6 of [a-z0-9]; the hosts are
# NAME-n1..NAME-nN), SHARDTRAIN_CLUSTER_NET (third octet X of the cluster's subnet 198.18.X.0/24,
# default 10; every cluster needs its own: two bridges on one subnet break routing).
# Only addresses in 198.18.0.0/15 (the benchmarking range) are used, only on links this script made.
#
# What it makes, all named after the cluster and removed by those names on `stop` (and by a
# `start` that fails half-way): namespaces stc-NAME-nI (/run/netns) and UTS namespaces bound on
# files in the state folder /run/shardtrain-cluster/NAME, the bridge stbr-NAME (198.18.X.1, in the
# root namespace: mpirun runs there), veth pairs stv-NAME-nI (root side, on the bridge) /
# eth0 (node side, 198.18.X.(10+I)), tbf qdiscs on each node's eth0 (egress: every byte a node
# sends), and lines "198.18.X.(10+I) NAME-nI  # shardtrain-cluster NAME" in /etc/hosts.
# `stop` first kills the processes still running inside the namespaces (by pid, `ip netns pids`).
# `start` when the cluster is up with N nodes only applies the rate; with another N it rebuilds.
#
# Exit codes: 0 ok; 1 a step failed (message); 2 usage; 3 namespaces cannot be made here (one
# line says why: tests report "skipped" with it).
set -euo pipefail
export PATH=$PATH:/usr/sbin:/sbin

NAME=${SHARDTRAIN_CLUSTER:-st}
NET=${SHARDTRAIN_CLUSTER_NET:-10}
STATE_ROOT=${SHARDTRAIN_CLUSTER_STATE:-/run/shardtrain-cluster}
D=$STATE_ROOT/$NAME
BR=stbr-$NAME
SUBNET=198.18.$NET
MAXN=4
HOSTS_TAG="# shardtrain-cluster $NAME"

log() { echo "cluster: $*" >&2; }
die() { log "$*"; exit 1; }
usage() { sed -n '2p' "$0" | sed 's/^# /usage: /' >&2; exit 2; }

[[ $NAME =~ ^[a-z0-9]{1,6}$ ]] || { log "SHARDTRAIN_CLUSTER=$NAME: 1-6 characters of [a-z0-9]"; exit 2; }
[[ $NET =~ ^[0-9]+$ && $NET -le 255 ]] || { log "SHARDTRAIN_CLUSTER_NET=$NET: 0-255"; exit 2; }

ns() { echo "stc-$NAME-n$1"; }
host() { echo "$NAME-n$1"; }
veth() { echo "stv-$NAME-n$1"; }
addr() { echo "$SUBNET.$((10 + $1))"; }

# Can namespaces be made here? One line why not, exit 3.
check_can() {
  local b probe=stc-probe-$$
  for b in ip tc nsenter unshare; do
    command -v "$b" >/dev/null || { log "cannot create the test cluster: $b is not installed (iproute2, util-linux)"; exit 3; }
  done
  [[ $(id -u) == 0 ]] || { log "cannot create the test cluster: network namespaces need root (this is uid $(id -u))"; exit 3; }
  if ! ip netns add "$probe" 2>/dev/null; then
    log "cannot create the test cluster: 'ip netns add' fails here (no CAP_NET_ADMIN or no namespace support)"; exit 3
  fi
  local ok=1
  ip netns exec "$probe" ip link set lo up 2>/dev/null || ok=0
  ip netns del "$probe" 2>/dev/null || true
  [[ $ok == 1 ]] || { log "cannot create the test cluster: a new network namespace cannot be configured"; exit 3; }
}

# The bridge of another cluster on this subnet would break routing: refuse.
check_subnet_free() {
  local other
  other=$(ip -o -4 addr show 2>/dev/null | awk -v s="$SUBNET." -v me="$BR" '$4 ~ "^" s && $2 != me { print $2 }' | head -1)
  [[ -z $other ]] || die "subnet $SUBNET.0/24 is already on $other: pick another SHARDTRAIN_CLUSTER_NET"
}

hosts_edit() { # $1 = add N | del: /etc/hosts rewritten in place (it may be a bind mount), under a lock
  local tmp
  tmp=$(mktemp)
  (
    flock 9
    grep -vF "$HOSTS_TAG" /etc/hosts >"$tmp" || true
    if [[ $1 == add ]]; then
      local i
      for ((i = 1; i <= $2; i++)); do printf '%s %s  %s\n' "$(addr "$i")" "$(host "$i")" "$HOSTS_TAG" >>"$tmp"; done
    fi
    cat "$tmp" >/etc/hosts
  ) 9</etc/hosts
  rm -f "$tmp"
}

tbf() { # $1 node index, $2 rate (none = no qdisc)
  local n; n=$(ns "$1")
  ip netns exec "$n" tc qdisc del dev eth0 root 2>/dev/null || true
  [[ $2 == none ]] && return 0
  local bps burst
  bps=$(rate_bps "$2")
  # burst: 1 ms at the rate (>= 16 KB); a queue of 4 MB: the sender's own qdisc applies back-pressure
  # to its TCP sockets instead of dropping, so no retransmissions inflate the byte counts.
  burst=$(( bps / 8 / 1000 )); (( burst >= 16384 )) || burst=16384
  ip netns exec "$n" tc qdisc add dev eth0 root tbf rate "$2" burst "$burst" limit 4194304
}

rate_bps() { # 1gbit, 250mbit, 500kbit, 10000000 -> bits per second
  local r=${1,,}
  case $r in
    *gbit) echo $(( ${r%gbit} * 1000000000 )) ;;
    *mbit) echo $(( ${r%mbit} * 1000000 )) ;;
    *kbit) echo $(( ${r%kbit} * 1000 )) ;;
    *bit) echo "${r%bit}" ;;
    *) [[ $r =~ ^[0-9]+$ ]] && echo "$r" || { log "rate $1: e.g. 1gbit, 250mbit, none"; exit 2; } ;;
  esac
}

check_rate() { [[ $1 == none ]] || [[ ${1,,} =~ ^[0-9]+(g|m|k)?bit$ ]] || { log "rate $1: e.g. 1gbit, 250mbit, none"; exit 2; }; }

# Kill what still runs inside a node (ranks, orted, slurmd), by pid.
kill_in_ns() {
  local n=$1 pids p i
  pids=$(ip netns pids "$n" 2>/dev/null || true)
  [[ -n $pids ]] || return 0
  for p in $pids; do kill -TERM "$p" 2>/dev/null || true; done
  for ((i = 0; i < 20; i++)); do
    pids=$(ip netns pids "$n" 2>/dev/null || true)
    [[ -z $pids ]] && return 0
    sleep 0.1
  done
  for p in $pids; do kill -KILL "$p" 2>/dev/null || true; done
  sleep 0.2
}

do_stop() {
  local i
  for ((i = 1; i <= MAXN; i++)); do
    if [[ -e /run/netns/$(ns "$i") ]]; then
      kill_in_ns "$(ns "$i")"
      ip netns del "$(ns "$i")" 2>/dev/null || log "could not delete namespace $(ns "$i")"
    fi
    if ip link show "$(veth "$i")" >/dev/null 2>&1; then ip link del "$(veth "$i")" 2>/dev/null || true; fi
    if [[ -e $D/uts/$(host "$i") ]]; then
      umount "$D/uts/$(host "$i")" 2>/dev/null || true
      rm -f "$D/uts/$(host "$i")"
    fi
  done
  if ip link show "$BR" >/dev/null 2>&1; then ip link del "$BR" 2>/dev/null || log "could not delete bridge $BR"; fi
  if grep -qF "$HOSTS_TAG" /etc/hosts 2>/dev/null; then hosts_edit del; fi
  rm -rf "${D:?}"
  rmdir "$STATE_ROOT" 2>/dev/null || true   # when no other cluster is up
  [[ ${1:-} == quiet ]] || log "$NAME stopped"
}

running_n() { [[ -f $D/nodes ]] && ip link show "$BR" >/dev/null 2>&1 && wc -l <"$D/nodes" || echo 0; }

do_start() {
  local n=2 rate=none
  while [[ $# -gt 0 ]]; do
    case $1 in
      --rate) rate=${2:?--rate needs a value}; shift 2 ;;
      --rate=*) rate=${1#--rate=}; shift ;;
      [0-9]*) n=$1; shift ;;
      *) usage ;;
    esac
  done
  [[ $n =~ ^[1-9]$ && $n -le $MAXN ]] || { log "nodes: 1-$MAXN, not $n"; exit 2; }
  check_rate "$rate"
  check_can
  local cur; cur=$(running_n)
  if [[ $cur == "$n" ]]; then
    do_rate "$rate"
    log "$NAME already up: $n nodes, rate $rate"
    return 0
  fi
  [[ $cur == 0 ]] || log "$NAME is up with $cur nodes: rebuilding with $n"
  do_stop quiet
  check_subnet_free
  # From here on a failure removes whatever was made.
  trap 'rc=$?; if [[ $rc != 0 ]]; then log "start failed: removing what was made"; do_stop quiet; fi' EXIT
  trap 'exit 1' INT TERM HUP
  mkdir -p "$D/uts"
  ip link add "$BR" type bridge
  ip addr add "$SUBNET.1/24" dev "$BR"
  ip link set "$BR" up
  local i h
  : >"$D/nodes.tmp"
  for ((i = 1; i <= n; i++)); do
    h=$(host "$i")
    ip netns add "$(ns "$i")"
    ip link add "$(veth "$i")" type veth peer name eth0 netns "$(ns "$i")"
    ip link set "$(veth "$i")" master "$BR" up
    ip netns exec "$(ns "$i")" ip link set lo up
    ip netns exec "$(ns "$i")" ip addr add "$(addr "$i")/24" dev eth0
    ip netns exec "$(ns "$i")" ip link set eth0 up
    touch "$D/uts/$h"
    unshare --uts="$D/uts/$h" hostname "$h"
    echo "$h $(ns "$i") $(addr "$i") $(veth "$i")" >>"$D/nodes.tmp"
  done
  hosts_edit add "$n"
  echo "$SUBNET.0/24" >"$D/subnet"
  mv "$D/nodes.tmp" "$D/nodes"
  do_rate "$rate"
  # Every node reaches the bridge (where mpirun runs) and the next node: a TCP connect to port 9,
  # where nothing listens, is refused at once when the address is reachable (no ping needed).
  for ((i = 1; i <= n; i++)); do
    reach "$i" "$SUBNET.1" || die "node $(host "$i") cannot reach $SUBNET.1"
    [[ $n == 1 ]] || reach "$i" "$(addr $(( i % n + 1 )))" || die "node $(host "$i") cannot reach $(addr $(( i % n + 1 )))"
  done
  trap - EXIT INT TERM HUP
  log "$NAME up: $n nodes ($(cut -d' ' -f1,3 "$D/nodes" | tr '\n' ' ' | sed 's/ $//'; echo)), bridge $BR $SUBNET.1, rate $rate"
}

reach() { # $1 node index, $2 address
  local out
  out=$(ip netns exec "$(ns "$1")" timeout 3 bash -c "exec 3<>/dev/tcp/$2/9" 2>&1) && return 0
  [[ $out == *"refused"* ]]
}

do_rate() {
  local r=${1:?rate}; check_rate "$r"
  [[ -f $D/nodes ]] || die "$NAME is not up"
  local i n; n=$(wc -l <"$D/nodes")
  for ((i = 1; i <= n; i++)); do tbf "$i" "$r"; done
  echo "$r" >"$D/rate"
}

do_status() {
  if [[ $(running_n) == 0 ]]; then echo "cluster $NAME: not running"; return 0; fi
  echo "cluster $NAME: $(wc -l <"$D/nodes") nodes, subnet $(cat "$D/subnet"), rate $(cat "$D/rate"), state $D"
  local h n a v q
  while read -r h n a v; do
    q=$(ip netns exec "$n" tc qdisc show dev eth0 2>/dev/null | head -1)
    printf '  %-10s %-15s netns %-12s link %-12s rx %s tx %s bytes  qdisc: %s\n' "$h" "$a" "$n" "$v" \
      "$(cat "/sys/class/net/$v/statistics/tx_bytes")" "$(cat "/sys/class/net/$v/statistics/rx_bytes")" "$q"
  done <"$D/nodes"
}

case ${1:-} in
  start) shift; do_start "$@" ;;
  stop) do_stop ;;
  status) do_status ;;
  rate) do_rate "${2:-}" ;;
  hosts) [[ -f $D/nodes ]] || die "$NAME is not up"; cut -d' ' -f1 "$D/nodes" ;;
  env) echo "export SHARDTRAIN_CLUSTER=$NAME SHARDTRAIN_CLUSTER_NET=$NET" ;;
  check) check_can ;;
  *) usage ;;
esac
