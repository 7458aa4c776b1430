#!/usr/bin/env bash
# An emulated multi-host cluster on one machine: N hosts as network namespaces on one bridge,
# each with its own hostname, /etc/netns/<ns>/{hosts,resolv.conf} (names resolve locally, no DNS),
# its own CPU set where the machine has a core per host, and a link rate in both directions
# (tbf on the host's egress and on its switch port, i.e. its ingress). Optional one-way latency
# per host: the kernel has no netem here, so deploy/emulated/nfq_delay.c (built with cc) delays
# every packet leaving the host through an NFQUEUE rule. A "login" host (unthrottled) runs
# mpirun; OpenMPI reaches the hosts through an rsh agent that enters their namespaces, with the
# MPI settings `up` writes to DIR/mpi.env, so spexd runs under mpirun one rank per host (`mpirun`
# here; spex.emulated.EmulatedCluster starts it through spex.world.start_daemon_world with the
# same settings), and whatever `exec` starts on a host (trainers, DDP's gloo all-reduce) crosses
# the same emulated links.
#
#   emulated_cluster.sh check                           exit 0 when this machine can emulate hosts
#   emulated_cluster.sh up DIR [--hosts N] [--rate 1gbit|none] [--latency-us U] [--cpus auto|none]
#                              [--owner PID]            build the cluster; state, sockets, logs in DIR
#   emulated_cluster.sh exec DIR HOST CMD...            run CMD on HOST (host1..hostN, login, or 1..N)
#   emulated_cluster.sh mpirun DIR PROGRAM ARGS...      one rank of PROGRAM per host, mpirun on login
#   emulated_cluster.sh rate DIR RATE                   change every host's rate
#   emulated_cluster.sh status DIR
#   emulated_cluster.sh down DIR                        stop everything, remove every trace (idempotent)
#   emulated_cluster.sh down --stale                    `down` every cluster whose owner process is gone
#   emulated_cluster.sh run [up options] -- CMD...      up in a fresh directory, run CMD with
#                                                       $SPEX_EMU_DIR set, down on exit (also on failure)
#
# Teardown is by process id: the delayers' recorded PIDs, then every process still inside one of
# the cluster's namespaces (`ip netns pids`: only this cluster's processes live there) gets SIGTERM
# and, 5 s later, SIGKILL; shared-memory segments of killed daemons (/dev/shm/spex-<pid>-*) are
# removed; then the namespaces, the /etc/netns entries, the sockets and the registry entry.
# Needs root, network namespaces, tc tbf (iproute2), util-linux; latency also iptables and
# libnetfilter-queue-dev (deploy/setup.sh installs them). Without them `check` and `up` say so.
set -euo pipefail
SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
DEPLOY="$(dirname "$SELF")"
REGISTRY=/run/spex-emu
SUBNET=10.77.0
LOGIN_ADDR=$SUBNET.254

die() { echo "emulated_cluster: $*" >&2; exit 1; }

why_not() {  # prints why this machine cannot emulate hosts, or nothing
  [ "$(id -u)" = 0 ] || { echo "needs root (network namespaces, tc and /etc/netns need CAP_SYS_ADMIN/CAP_NET_ADMIN); running as uid $(id -u)"; return; }
  command -v ip >/dev/null || { echo "needs iproute2 (ip)"; return; }
  command -v unshare >/dev/null || { echo "needs util-linux (unshare)"; return; }
  local probe="sxprobe$$" err
  if ! err=$(ip netns add "$probe" 2>&1); then
    echo "network namespaces are not permitted here (ip netns add: $err)"; return
  fi
  if ! err=$(ip -n "$probe" link add dummy0 type veth peer name dummy1 2>&1); then
    ip netns del "$probe" 2>/dev/null || true
    echo "veth pairs are not permitted in a network namespace here ($err)"; return
  fi
  if ! err=$(ip netns exec "$probe" tc qdisc add dev dummy0 root tbf rate 1gbit burst 1mb latency 100ms 2>&1); then
    ip netns del "$probe" 2>/dev/null || true
    echo "tc tbf is not available ($err)"; return
  fi
  if ! err=$(ip netns exec "$probe" unshare --uts true 2>&1); then
    ip netns del "$probe" 2>/dev/null || true
    echo "UTS namespaces (own hostname per host) are not permitted ($err)"; return
  fi
  ip netns del "$probe" 2>/dev/null || true
}

load() {  # DIR -> sources DIR/cluster.env; returns 1 when there is none
  [ -f "$1/cluster.env" ] || return 1
  # shellcheck disable=SC1091
  source "$1/cluster.env"
}

ns_of() {  # host name or index -> namespace name (needs load)
  case "$1" in
    login | 0) echo "${PREFIX}l" ;;
    host[0-9]*) echo "${PREFIX}h${1#host}" ;;
    [0-9]*) echo "${PREFIX}h$1" ;;
    *) die "unknown host '$1' (host1..host$HOSTS, login, or 1..$HOSTS)" ;;
  esac
}
name_of() {
  case "$1" in login | 0) echo login ;; host[0-9]*) echo "$1" ;; *) echo "host$1" ;; esac
}
all_ns() { echo "${PREFIX}l"; for i in $(seq 1 "$HOSTS"); do echo "${PREFIX}h$i"; done; echo "${PREFIX}s"; }

burst_for() {  # tbf burst for a rate: >= 1 ms of traffic, at least 1 MB
  local r=$1 bits
  bits=$(numfmt --from=si "$(echo "${r%bit}" | tr a-z A-Z)" 2>/dev/null || echo 1000000000)
  local b=$((bits / 8 / 1000))
  [ $b -lt 1048576 ] && b=1048576
  echo $b
}

set_rate() {  # RATE: every host, egress and ingress (switch port egress)
  local rate=$1 i burst
  for i in $(seq 1 "$HOSTS"); do
    if [ "$rate" = none ]; then
      ip netns exec "${PREFIX}h$i" tc qdisc del dev eth0 root 2>/dev/null || true
      ip netns exec "${PREFIX}s" tc qdisc del dev "p$i" root 2>/dev/null || true
    else
      burst=$(burst_for "$rate")
      ip netns exec "${PREFIX}h$i" tc qdisc replace dev eth0 root tbf rate "$rate" burst "$burst" latency 100ms
      ip netns exec "${PREFIX}s" tc qdisc replace dev "p$i" root tbf rate "$rate" burst "$burst" latency 100ms
    fi
  done
}

cmd_up() {
  local dir=$1; shift
  local hosts=2 rate=1gbit latency=0 cpus=auto owner=$PPID
  while [ $# -gt 0 ]; do
    case "$1" in
      --hosts) hosts=$2; shift 2 ;; --hosts=*) hosts=${1#*=}; shift ;;
      --rate) rate=$2; shift 2 ;; --rate=*) rate=${1#*=}; shift ;;
      --latency-us) latency=$2; shift 2 ;; --latency-us=*) latency=${1#*=}; shift ;;
      --cpus) cpus=$2; shift 2 ;; --cpus=*) cpus=${1#*=}; shift ;;
      --owner) owner=$2; shift 2 ;; --owner=*) owner=${1#*=}; shift ;;
      *) die "up: unknown option '$1'" ;;
    esac
  done
  [[ "$hosts" =~ ^[0-9]+$ ]] && [ "$hosts" -ge 1 ] && [ "$hosts" -le 200 ] || die "up: --hosts must be 1..200"
  [[ "$latency" =~ ^[0-9]+$ ]] || die "up: --latency-us must be a whole number of microseconds"
  local why; why=$(why_not)
  [ -z "$why" ] || die "cannot emulate hosts on this machine: $why"
  mkdir -p "$dir"; dir=$(cd "$dir" && pwd)
  [ ! -f "$dir/cluster.env" ] || die "up: $dir already holds a cluster (emulated_cluster.sh down $dir)"
  local tag; tag=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
  local ncpu; ncpu=$(nproc)
  {
    echo "TAG=$tag"; echo "PREFIX=sx$tag"; echo "HOSTS=$hosts"; echo "RATE=$rate"; echo "LATENCY_US=$latency"
    echo "OWNER=$owner"; echo "DIR=$dir"; echo "NCPU=$ncpu"; echo "CPUS_MODE=$cpus"
  } >"$dir/cluster.env.tmp"
  mv "$dir/cluster.env.tmp" "$dir/cluster.env"
  mkdir -p "$REGISTRY" "$dir/sock"
  echo "$dir" >"$REGISTRY/$tag"
  load "$dir"
  # From here on, any failure tears down what was built.
  trap 'echo "emulated_cluster: up failed; tearing down" >&2; cmd_down "$dir" >/dev/null 2>&1 || true' ERR
  set -E
  local sw="${PREFIX}s" i ns addr name
  ip netns add "$sw"
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  for i in $(seq 0 "$hosts"); do
    if [ "$i" = 0 ]; then ns="${PREFIX}l"; addr=$LOGIN_ADDR; name=login
    else ns="${PREFIX}h$i"; addr=$SUBNET.$i; name=host$i; fi
    ip netns add "$ns"
    ip link add eth0 netns "$ns" type veth peer name "p$i" netns "$sw"
    ip -n "$sw" link set "p$i" master br0
    ip -n "$sw" link set "p$i" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$addr/24" dev eth0
    ip -n "$ns" link set eth0 up
    mkdir -p "/etc/netns/$ns"
    {
      echo "127.0.0.1 localhost"
      echo "$LOGIN_ADDR login"
      for j in $(seq 1 "$hosts"); do echo "$SUBNET.$j host$j"; done
    } >"/etc/netns/$ns/hosts"
    echo "# emulated cluster $tag: names resolve from /etc/hosts only, no DNS" >"/etc/netns/$ns/resolv.conf"
  done
  [ "$rate" = none ] || set_rate "$rate"
  : >"$dir/pids"
  if [ "$latency" -gt 0 ]; then
    command -v iptables-legacy >/dev/null || die "--latency-us needs iptables (deploy/setup.sh installs it)"
    cc -O2 -o "$dir/nfq_delay" "$DEPLOY/emulated/nfq_delay.c" -lnetfilter_queue -lnfnetlink ||
      die "--latency-us: building deploy/emulated/nfq_delay.c failed (needs libnetfilter-queue-dev)"
    for i in $(seq 1 "$hosts"); do
      ns="${PREFIX}h$i"
      ip netns exec "$ns" iptables-legacy -A OUTPUT -o eth0 -j NFQUEUE --queue-num 0 --queue-bypass
      setsid ip netns exec "$ns" chrt -f 50 "$dir/nfq_delay" 0 "$latency" </dev/null >>"$dir/nfq_delay.log" 2>&1 &
      echo $! >>"$dir/pids"
    done
  fi
  # The agent OpenMPI's mpirun uses instead of ssh.
  printf '#!/bin/sh\nexec "%s" rsh-agent "%s" "$@"\n' "$SELF" "$dir" >"$dir/rsh"
  chmod +x "$dir/rsh"
  write_mpi_env "$dir"
  trap - ERR
  local cpu_note="unpinned"
  if [ "$cpus" = auto ]; then
    if [ "$hosts" -le "$ncpu" ]; then cpu_note="host i on core i-1 (one core each)"
    else cpu_note="$hosts hosts share $ncpu cores (host i on core (i-1) mod $ncpu): hosts steal each other's compute"; fi
  fi
  echo "emulated cluster $tag up in $dir: $hosts hosts (host1..host$hosts = $SUBNET.1..$hosts, login = $LOGIN_ADDR)," \
    "rate $rate each way, one-way latency ${latency} us, CPUs: $cpu_note"
}

cpus_of() {  # host index -> CPU list for taskset, or nothing
  [ "$CPUS_MODE" = auto ] || return 0
  [ "$1" -ge 1 ] 2>/dev/null || return 0
  echo $((($1 - 1) % NCPU))
}

exec_in() {  # host cmd... (needs load)
  local host=$1; shift
  local ns name idx cpus
  ns=$(ns_of "$host"); name=$(name_of "$host")
  idx=${name#host}; [ "$name" = login ] && idx=0
  [ -e "/run/netns/$ns" ] || die "host $name of cluster $TAG does not exist (is the cluster up?)"
  cpus=$(cpus_of "$idx")
  local pre=()
  [ -n "$cpus" ] && pre=(taskset -c "$cpus")
  exec "${pre[@]}" ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$name" "$@"
}

write_mpi_env() {  # DIR: how MPI reaches and uses this cluster's hosts, in DIR/mpi.env
  # One setting a line: KEY=VALUE (set for every mpirun of the cluster) or KEY?=VALUE (unless
  # the environment sets KEY). Read by `mpirun` below and by spex.emulated.EmulatedCluster, which
  # starts its daemons through spex.world.start_daemon_world with these settings.
  {
    # The agent mpirun (on login) uses instead of ssh to enter the hosts.
    echo "OMPI_MCA_plm_rsh_agent=$1/rsh"
    echo "OMPI_MCA_btl=tcp,self"
    echo "OMPI_MCA_btl_tcp_if_include=$SUBNET.0/24"
    echo "OMPI_MCA_oob_tcp_if_include=$SUBNET.0/24"
    # Two TCP connections per peer pair (one gets half the rate per direction when traffic flows
    # both ways) and the ring all-gather (the default ones reach 50-65% of the line rate).
    echo "OMPI_MCA_btl_tcp_links=2"
    echo "OMPI_MCA_coll_tuned_use_dynamic_rules=1"
    echo "OMPI_MCA_coll_tuned_allgatherv_algorithm=3"
    # Ring all-reduce for the dense exchange (bandwidth-optimal, as gloo's ring is for DDP).
    echo "OMPI_MCA_coll_tuned_allreduce_algorithm?=4"
    # A daemon shares its host's core(s) with the trainers: yield instead of busy-polling.
    echo "OMPI_MCA_mpi_yield_when_idle=1"
  } >"$1/mpi.env"
}

export_mpi_env() {  # DIR: exports DIR/mpi.env's settings
  [ -f "$1/mpi.env" ] || die "no $1/mpi.env (a cluster brought up by an older emulated_cluster.sh: down and up again)"
  local line key
  while IFS= read -r line; do
    case "$line" in
      *'?='*) key=${line%%\?=*}; [ -n "${!key:-}" ] || export "$key=${line#*\?=}" ;;
      *=*) export "$line" ;;
    esac
  done <"$1/mpi.env"
}

cmd_mpirun() {  # any MPI program, one rank per host (spex.emulated starts spexd the same way in Python)
  local dir=$1; shift
  load "$dir" || die "no cluster in $dir"
  local hostlist; hostlist=$(seq -s, -f "host%g" 1 "$HOSTS")
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export_mpi_env "$dir"
  # --bind-to none: each rank keeps the CPU set of its host (exec_in's taskset, inherited through
  # the rsh agent and orted). Open MPI's default binding would otherwise pin every rank to the
  # first core of what it takes for a node of its own (core 0 at 2 ranks), so all the daemons
  # shared core 0 with host 1's trainers.
  exec_in login mpirun --bind-to none --host "$hostlist" -np "$HOSTS" "$@"
}

kill_pids() {  # pids...: SIGTERM, up to 5 s, SIGKILL; then their /dev/shm/spex-<pid>-* segments
  [ $# -gt 0 ] || return 0
  local p left
  kill -TERM "$@" 2>/dev/null || true
  for _ in $(seq 50); do
    left=0
    for p in "$@"; do [ -d "/proc/$p" ] && [ "$(cut -d' ' -f3 "/proc/$p/stat" 2>/dev/null)" != Z ] && left=1; done
    [ $left = 0 ] && break
    sleep 0.1
  done
  for p in "$@"; do [ -d "/proc/$p" ] && kill -KILL "$p" 2>/dev/null || true; done
  for p in "$@"; do rm -f /dev/shm/spex-"$p"-* 2>/dev/null || true; done
}

cmd_down() {
  local dir=$1
  load "$dir" || { echo "emulated_cluster: nothing to tear down in $dir"; return 0; }
  local ns pids=()
  [ -f "$dir/pids" ] && mapfile -t pids <"$dir/pids"
  ((${#pids[@]})) && kill_pids "${pids[@]}"
  for ns in $(all_ns); do
    [ -e "/run/netns/$ns" ] || continue
    mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null)
    ((${#pids[@]})) && kill_pids "${pids[@]}"
  done
  for ns in $(all_ns); do
    [ -e "/run/netns/$ns" ] && ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/${ns:?}"
  done
  rm -rf "${dir:?}/sock" "$dir/rsh" "$dir/mpi.env" "$dir/nfq_delay" "$dir/pids"
  rm -f "$REGISTRY/$TAG" "$dir/cluster.env"
  echo "emulated cluster $TAG down: no namespace, /etc/netns entry, socket or segment of it left"
}

cmd_down_stale() {
  local f dir owner
  for f in "$REGISTRY"/*; do
    [ -f "$f" ] || continue
    dir=$(cat "$f")
    owner=$(sed -n 's/^OWNER=//p' "$dir/cluster.env" 2>/dev/null || true)
    if [ -z "$owner" ] || ! kill -0 "$owner" 2>/dev/null; then
      if [ -f "$dir/cluster.env" ]; then cmd_down "$dir"; else rm -f "$f"; fi
    fi
  done
}

cmd_status() {
  load "$1" || { echo "no cluster in $1"; return 1; }
  echo "cluster $TAG: $HOSTS hosts, rate $RATE, latency $LATENCY_US us, owner $OWNER, dir $DIR"
  local i
  for i in $(seq 0 "$HOSTS"); do
    local ns; ns=$(ns_of "$i")
    printf '  %-6s %-12s cpus=%-3s processes=%s\n' "$(name_of "$i")" "$ns" "$(cpus_of "$i")" \
      "$(ip netns pids "$ns" 2>/dev/null | wc -l)"
  done
}

cmd_run() {
  local up=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do up+=("$1"); shift; done
  [ "${1:-}" = -- ] && shift
  [ $# -gt 0 ] || die "run: no command after --"
  local dir; dir=$(mktemp -d /tmp/spex-emu.XXXXXX)
  trap 'cmd_down "$dir" >/dev/null; rm -rf "$dir"' EXIT
  trap 'exit 130' INT TERM
  cmd_up "$dir" "${up[@]}" --owner $$
  local rc=0
  SPEX_EMU_DIR=$dir "$@" || rc=$?
  return $rc
}

[ $# -ge 1 ] || { sed -n '2,31p' "$SELF"; exit 2; }
cmd=$1; shift
case "$cmd" in
  check) why=$(why_not); [ -z "$why" ] && { echo "emulated_cluster: this machine can emulate hosts"; exit 0; }
    echo "emulated_cluster: cannot emulate hosts on this machine: $why"; exit 1 ;;
  up) [ $# -ge 1 ] || die "up: DIR missing"; cmd_up "$@" ;;
  down) [ $# -ge 1 ] || die "down: DIR or --stale missing"
    if [ "$1" = --stale ]; then cmd_down_stale; else cmd_down "$1"; fi ;;
  exec) [ $# -ge 3 ] || die "exec: DIR HOST CMD..."; load "$1" || die "no cluster in $1"; shift; exec_in "$@" ;;
  rsh-agent) dir=$1; shift; load "$dir" || die "no cluster in $dir"; host=$1; shift
    exec_in "$host" sh -c "$*" ;;
  mpirun) [ $# -ge 2 ] || die "mpirun: DIR PROGRAM..."; cmd_mpirun "$@" ;;
  rate) [ $# -eq 2 ] || die "rate: DIR RATE"; load "$1" || die "no cluster in $1"; set_rate "$2"
    sed -i "s/^RATE=.*/RATE=$2/" "$1/cluster.env" ;;
  status) cmd_status "$@" ;;
  run) cmd_run "$@" ;;
  *) die "unknown command '$cmd' (check, up, exec, mpirun, rate, status, down, run)" ;;
esac
