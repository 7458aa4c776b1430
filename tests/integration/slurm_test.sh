#!/usr/bin/env bash
# deploy/slurm/spex.sbatch on a real Slurm 22.05 started here: munged, slurmctld and slurmd
# (single node; then 4 emulated hosts, each slurmd in its own network namespace, host name and
# /tmp), all on private ports, sockets and job ids, and all stopped by process id.
# Per cluster:
#  - a job with the synthetic trainers (spex_trainer --verify: exact results) COMPLETES, every
#    trainer verified, and nothing is left in /dev/shm or the job's socket directory;
#  - a second job whose trainers first check that the Python client (spex/paths.py) resolves
#    their node's live socket from $SLURM_JOB_ID alone, then exchange without end, is
#    cancelled with scancel: the job ends CANCELLED, every spexd and trainer process is gone,
#    and nothing is left in /dev/shm or the socket directory;
#  - (single node) the start-up retry: with a spexd that dies of SIGSEGV at its first start, the
#    job starts the daemons once more and completes exactly; with a flag spexd refuses, it fails
#    without a restart.
# Skipped, saying why, without root or the Slurm packages (deploy/setup.sh installs them); the
# 4-host case also without network namespaces.
set -uo pipefail
R="${RUNFILES_DIR:-${TEST_SRCDIR:-$PWD/..}}/spex"
source "$R/tests/support/shtest.sh"
source "$R/tests/integration/skip_junit.sh"
source "$R/tests/support/spex_venv.sh"
export SPEX_HOME="$R" SPEXD="$R/daemon/spexd" SPEX_TRAINER="$R/client/spex_trainer"
export SPEXCTL="$R/client/spexctl" SPEX_START_TIMEOUT=30
# Debugging: SPEX_SLURM_KEEP=1 keeps each cluster's scratch directory (logs, job output);
# SPEX_SLURM_ONLY_4HOSTS=1 runs only the 4-host case, SPEX_SLURM_MULTI=0 only the single node.
unset SPEX_JOB SPEX_SOCKET SPEX_LOCAL_DAEMON SPEXD_ARGS SPEX_TRAINER_LAUNCH
PY=/usr/bin/python3
S=""            # the current cluster's scratch directory (not under /tmp: hosts get their own)
PIDS=()         # daemons this test started (munged, slurmctld, slurmd), stopped by pid
NETNS=()        # network namespaces this test created
HOSTS=()        # compute host names ("" = this machine, single node)
CTL=""          # the host that runs slurmctld and the Slurm commands ("" = this machine)

# in_host_argv host: sets IN_HOST to the command prefix that runs a command in that emulated
# host (net namespace, own host name, /etc/hosts, private /tmp; every stage execs the next, so
# `"${IN_HOST[@]}" daemon &` gives the daemon's own pid in $!); empty for this machine.
in_host_argv() {
  IN_HOST=()
  [ -z "$1" ] && return 0
  IN_HOST=(nsenter --net="/run/netns/$NSP$1" unshare --uts --mount --propagation slave bash -c '
    h=$0 s=$1; shift; hostname "$h"
    mount --bind "$s/etc-hosts" /etc/hosts && mount --bind "$s/etc-resolv" /etc/resolv.conf &&
      mount --bind "$s/hosts/$h/tmp" /tmp || exit 97
    exec "$@"' "$1" "$S")
}
inhost() {  # host cmd...: runs cmd in the host (foreground only: see in_host_argv)
  local IN_HOST
  in_host_argv "$1"; shift
  "${IN_HOST[@]}" "$@"
}
on_ctl() { inhost "$CTL" "$@"; }
host_tmp() { [ -z "$1" ] && echo /tmp || echo "$S/hosts/$1/tmp"; }

stop_all() {  # every daemon by pid (SIGTERM, then SIGKILL after 10 s), then the namespaces
  local p i
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do
    for i in $(seq 100); do alive "$p" || break; sleep 0.1; done
    alive "$p" && { echo "daemon $p still alive 10 s after SIGTERM: SIGKILL"; kill -9 "$p"; }
    wait "$p" 2>/dev/null
  done
  PIDS=()
  for p in "${NETNS[@]}"; do ip netns del "$p" 2>/dev/null; done
  NETNS=()
}
trap stop_all EXIT

job_state() { on_ctl scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
wait_job_end() {  # id seconds -> prints the final state
  local s i
  for i in $(seq $(($2 * 10))); do
    s=$(job_state "$1")
    case "$s" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE)
      echo "$s"; return 0 ;;
    esac
    sleep 0.1
  done
  echo "${s:-UNKNOWN}"; return 1
}
# job output -> the pids of its spexd (spex-node prints them) and of its trainers
job_pids() { sed -n 's/.*spexd pid \([0-9]*\).*/\1/p; s/.*trainer pid \([0-9]*\).*/\1/p' "$1"; }
leftovers() {  # job id, pids -> what the job left: live processes, segments, socket dirs
  local id=$1 h p; shift
  for p in "$@"; do alive "$p" && echo "process $p alive"; done
  for p in "$@"; do ls /dev/shm | grep "^spex-$p-" | sed 's/^/\/dev\/shm\//'; done
  for h in "${HOSTS[@]}"; do
    [ -e "$(host_tmp "$h")/spex-0/$id" ] && echo "socket dir of ${h:-this host}: $(ls -A "$(host_tmp "$h")/spex-0/$id")"
  done
}

start_cluster() {  # name: single | multi -> 0 when every node is idle
  local mode=$1 i port
  S=$(mktemp -d /var/tmp/spex-slurm.XXXXXX) && chmod 755 "$S"
  mkdir -p "$S/state" "$S/log" "$S/munge" "$S/spool"
  port=$((20000 + RANDOM % 20000))
  if [ "$mode" = multi ]; then
    # The emulated hosts have a private /tmp, and the runfiles' source files are links into the
    # workspace, which may itself live under /tmp: give the hosts a dereferenced copy in $S.
    cp -rL "$R" "$S/spex" || return 1
    R="$S/spex"
    export SPEX_HOME="$R" SPEXD="$R/daemon/spexd" SPEX_TRAINER="$R/client/spex_trainer"
    export SPEXCTL="$R/client/spexctl"
    NSP="sx$$-" CTL=ctl HOSTS=(h1 h2 h3 h4)
    ip netns add "${NSP}sw" || return 1
    NETNS+=("${NSP}sw")
    ip -n "${NSP}sw" link set lo up && ip -n "${NSP}sw" link add br0 type bridge &&
      ip -n "${NSP}sw" link set br0 up || return 1
    printf '127.0.0.1 localhost\n10.213.0.100 ctl\n' >"$S/etc-hosts"
    echo "# no DNS" >"$S/etc-resolv"
    for i in 0 1 2 3 4; do
      local h=h$i addr=10.213.0.$i
      [ $i = 0 ] && h=ctl addr=10.213.0.100
      [ $i != 0 ] && echo "$addr $h" >>"$S/etc-hosts"
      ip netns add "$NSP$h" || return 1
      NETNS+=("$NSP$h")
      ip link add eth0 netns "$NSP$h" type veth peer name "p$i" netns "${NSP}sw" &&
        ip -n "${NSP}sw" link set "p$i" master br0 && ip -n "${NSP}sw" link set "p$i" up &&
        ip -n "$NSP$h" link set lo up && ip -n "$NSP$h" addr add "$addr/24" dev eth0 &&
        ip -n "$NSP$h" link set eth0 up || return 1
      mkdir -p "$S/hosts/$h/tmp" && chmod 1777 "$S/hosts/$h/tmp"
    done
    ctl_line="SlurmctldHost=ctl(10.213.0.100)"
    node_line="NodeName=h[1-4] NodeAddr=10.213.0.[1-4] CPUs=2 State=UNKNOWN"
    # MPI between the emulated hosts: TCP on their subnet.
    export OMPI_MCA_btl=tcp,self OMPI_MCA_btl_tcp_if_include=10.213.0.0/24 \
      OMPI_MCA_oob_tcp_if_include=10.213.0.0/24
  else
    NSP="" CTL="" HOSTS=("")
    ctl_line="SlurmctldHost=$(hostname)(127.0.0.1)"
    node_line="NodeName=$(hostname) NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN"
    export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
    unset OMPI_MCA_btl
  fi
  # munge: a private daemon, key and socket.
  head -c 128 /dev/urandom >"$S/munge/munge.key" && chmod 600 "$S/munge/munge.key"
  munged -F --force -S "$S/munge/munge.sock" --key-file="$S/munge/munge.key" \
    --log-file="$S/log/munged.log" --pid-file="$S/munge/munged.pid" \
    --seed-file="$S/munge/munged.seed" >"$S/log/munged.out" 2>&1 &
  PIDS+=($!)
  for i in $(seq 50); do [ -S "$S/munge/munge.sock" ] && break; sleep 0.1; done
  cat >"$S/slurm.conf" <<CONF
ClusterName=spextest
$ctl_line
SlurmctldPort=$port
SlurmdPort=$((port + 1))
FirstJobId=$((1000 + RANDOM * 16))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$S/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool/%n
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd-%n.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
KillWait=10
$node_line
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
  export SLURM_CONF="$S/slurm.conf"
  # Started straight from this shell (no function or subshell in between), so that $! is the
  # daemon's pid.
  local h IN_HOST
  in_host_argv "$CTL"
  "${IN_HOST[@]}" slurmctld -D -i >"$S/log/slurmctld.out" 2>&1 &
  PIDS+=($!)
  for h in "${HOSTS[@]}"; do
    mkdir -p "$S/spool/${h:-$(hostname)}"
    in_host_argv "$h"
    "${IN_HOST[@]}" slurmd -D >"$S/log/slurmd-${h:-local}.out" 2>&1 &
    PIDS+=($!)
  done
  # Each pid must become the daemon itself (the host wrappers exec it; on a loaded machine that
  # can take more than a moment).
  local comm
  for i in "${PIDS[@]}"; do
    for _ in $(seq 50); do
      comm=$(cat "/proc/$i/comm" 2>/dev/null)
      case "$comm" in munged | slurmctld | slurmd) break ;; esac
      sleep 0.1
    done
    case "$comm" in munged | slurmctld | slurmd) ;;
      *) echo "pid $i is '$comm' after 5 s, not a daemon"; return 1 ;;
    esac
  done
  for i in $(seq 150); do
    [ "$(on_ctl sinfo -h -o '%t' 2>/dev/null | sort -u)" = idle ] && return 0
    sleep 0.1
  done
  echo "nodes not idle after 15 s: $(on_ctl sinfo -h 2>&1)"; tail -n 5 "$S"/log/*.log; return 1
}

run_jobs() {  # case name, trainers per node
  local name=$1 per=$2 n=${#HOSTS[@]} id state out msg t0
  # 1. The example with its default synthetic trainers: exact results.
  t0=$SECONDS
  id=$(cd "$S" && on_ctl sbatch --parsable -N "$n" --ntasks-per-node="$per" -o "$S/job-%j.out" \
    "$R/deploy/slurm/spex.sbatch")
  if [ -z "$id" ]; then record "${name}_verify" "sbatch failed"; return; fi
  state=$(wait_job_end "$id" 60)
  out="$S/job-$id.out"
  cat "$out"
  msg=""
  [ "$state" = COMPLETED ] || msg="job $id ended $state: $(tail -n 5 "$out")"
  got=$(grep -c "verified exact" "$out")
  [ "$got" = $((n * per)) ] || msg="$msg $got of $((n * per)) trainers verified"
  left=$(leftovers "$id" $(job_pids "$out"))
  [ -z "$left" ] || msg="$msg left behind: $left"
  [ -n "$(job_pids "$out")" ] || msg="$msg no spexd pid in the job output"
  # Open MPI's start-up race (spex.sbatch, "Start-up retry"): a restart is no failure.
  echo "$name: verify job $id $state in $((SECONDS - t0)) s, daemons restarted" \
    "$(grep -c "starting the daemons again" "$out") time(s)"
  record "${name}_verify" "$msg"

  # 2. Python resolves the live socket from $SLURM_JOB_ID; then endless exchange; scancel.
  cat >"$S/trainer.sh" <<TR
#!/bin/bash
echo "trainer pid \$\$ on \$(hostname)"
$PY - "$R/client/python/spex/paths.py" <<'PYEOF' || exit 1
import importlib.util, os, stat, sys
spec = importlib.util.spec_from_file_location("spex_paths", sys.argv[1])
paths = importlib.util.module_from_spec(spec); spec.loader.exec_module(paths)
p = paths.client_socket_path()
ok = os.path.exists(p) and stat.S_ISSOCK(os.stat(p).st_mode)
print(f"python {'resolves' if ok else 'MISSES'} {p}", flush=True)
sys.exit(0 if ok else 1)
PYEOF
exec "$SPEX_TRAINER" --local_rank=\$LOCAL_RANK --local_size=\$LOCAL_WORLD_SIZE --quiet --buckets=1000,65536 --steps=100000000
TR
  chmod +x "$S/trainer.sh"
  id=$(cd "$S" && on_ctl sbatch --parsable -N "$n" --ntasks-per-node="$per" -o "$S/job-%j.out" \
    "$R/deploy/slurm/spex.sbatch" "$S/trainer.sh")
  if [ -z "$id" ]; then record "${name}_scancel" "sbatch failed"; return; fi
  out="$S/job-$id.out"
  for _ in $(seq 300); do
    [ "$(grep -c "python resolves" "$out" 2>/dev/null)" = $((n * per)) ] && break
    grep -q "python MISSES" "$out" 2>/dev/null && break
    case "$(job_state "$id")" in PENDING | RUNNING | CONFIGURING | "") ;; *) break ;; esac
    sleep 0.1
  done
  sleep 1  # exchanging
  msg=""
  [ "$(grep -c "python resolves" "$out")" = $((n * per)) ] ||
    msg="the Python client did not resolve every node's socket: $(grep python "$out")"
  [ "$(job_state "$id")" = RUNNING ] || msg="$msg job $id is $(job_state "$id") before scancel"
  pids=$(job_pids "$out" | tr '\n' ' ')
  t0=$SECONDS
  on_ctl scancel "$id"
  state=$(wait_job_end "$id" 30)
  for _ in $(seq 150); do
    alive_any=0
    for p in $pids; do alive "$p" && alive_any=1; done
    [ $alive_any = 0 ] && break
    sleep 0.1
  done
  cat "$out"
  echo "$name: scancel of job $id: $state, processes gone $((SECONDS - t0)) s after scancel"
  [ "$state" = CANCELLED ] || msg="$msg job ended $state, not CANCELLED"
  left=$(leftovers "$id" $pids)
  [ -z "$left" ] || msg="$msg left behind after scancel: $left"
  record "${name}_scancel" "$msg"
}

spexrun_job() {  # case name, trainers per node: spexrun inside an allocation, no -H
  # The Python package installed as users install it (a venv over Debian's Python, in $S so that
  # every host sees it); spexrun takes the hosts and slots from the allocation, starts the
  # daemons under mpirun and an agent per host as a step (srun), and the DDP trainers train
  # through the hook with no arguments: the same parameters on every rank.
  local name=$1 per=$2 n=${#HOSTS[@]} id state out msg left
  if [ ! -x "$S/venv/bin/spexrun" ] && ! install_spex_venv "$R" "$S"; then
    record "${name}_spexrun" "pip install of client/python failed (its log is above)"
    return
  fi
  cat >"$S/ddp.py" <<'PYEOF'
import hashlib, os, torch, torch.distributed as dist
import spex.torch
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 64))
state = spex.torch.register(model, compressor="topk", density=0.05)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(dist.get_rank())
for step in range(20):
    opt.zero_grad()
    model(torch.randn(8, 256, generator=g)).square().mean().backward()
    opt.step()
h = hashlib.sha1(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
print(f"rank {dist.get_rank()} of {dist.get_world_size()} on {os.uname().nodename} digest {h}", flush=True)
state.close()
PYEOF
  printf '#!/bin/bash
exec "%s" --spexd "%s" --spexd-arg=--log_level=error -- "%s" "%s"
' \
    "$S/venv/bin/spexrun" "$SPEXD" "$S/venv/bin/python" "$S/ddp.py" >"$S/spexrun.sh"
  chmod +x "$S/spexrun.sh"
  id=$(cd "$S" && on_ctl sbatch --parsable -N "$n" --ntasks-per-node="$per" -o "$S/job-%j.out" "$S/spexrun.sh")
  if [ -z "$id" ]; then record "${name}_spexrun" "sbatch failed"; return; fi
  state=$(wait_job_end "$id" 120)
  out="$S/job-$id.out"
  cat "$out"
  msg=""
  [ "$state" = COMPLETED ] || msg="job $id ended $state"
  [ "$(grep -c "digest" "$out")" = $((n * per)) ] || msg="$msg $(grep -c digest "$out") of $((n * per)) ranks"
  [ "$(sed -n 's/.*digest //p' "$out" | sort -u | wc -l)" = 1 ] || msg="$msg parameters differ between ranks"
  grep -q "all $((n * per)) trainers exited 0" "$out" || msg="$msg no 'all trainers exited 0' line"
  for h in "${HOSTS[@]}"; do
    [ -n "$(ls -A "$(host_tmp "$h")/spex-0" 2>/dev/null | grep spexrun)" ] &&
      msg="$msg socket dir left on ${h:-this host}: $(ls -A "$(host_tmp "$h")/spex-0")"
  done
  record "${name}_spexrun" "$msg"
}

retry_jobs() {  # case name: spex.sbatch's start-up retry, with a spexd that crashes once
  local name=$1 n=${#HOSTS[@]} id state out msg left
  # A spexd that dies of SIGSEGV at its first start (as Open MPI's start-up race makes one do),
  # then starts normally: the job must start the daemons again once and complete exactly.
  printf '#!/bin/bash\n[ -e "%s" ] || { touch "%s"; kill -SEGV $$; }\nexec "%s" "$@"\n' \
    "$S/crashed-once" "$S/crashed-once" "$SPEXD" >"$S/crash-once-spexd"
  chmod +x "$S/crash-once-spexd"
  id=$(cd "$S" && SPEXD="$S/crash-once-spexd" on_ctl sbatch --parsable -N "$n" \
    --ntasks-per-node=1 -o "$S/job-%j.out" "$R/deploy/slurm/spex.sbatch")
  state=$(wait_job_end "$id" 60)
  out="$S/job-$id.out"
  msg=""
  [ "$state" = COMPLETED ] || msg="job $id ended $state: $(tail -n 5 "$out")"
  [ "$(grep -c "starting the daemons again (attempt 2 of 3)" "$out")" = 1 ] ||
    msg="$msg not one restart: $(grep "spex:" "$out")"
  [ "$(grep -c "verified exact" "$out")" = "$n" ] || msg="$msg not every trainer verified"
  left=$(leftovers "$id" $(job_pids "$out"))
  [ -z "$left" ] || msg="$msg left behind: $left"
  record "${name}_start_retry" "$msg"
  [ -n "$msg" ] && cat "$out"
  # A spexd that refuses its flags (status 2) is not started again: the job fails at once.
  id=$(cd "$S" && SPEXD_ARGS=--no_such_flag on_ctl sbatch --parsable -N "$n" \
    --ntasks-per-node=1 -o "$S/job-%j.out" "$R/deploy/slurm/spex.sbatch")
  state=$(wait_job_end "$id" 60)
  out="$S/job-$id.out"
  msg=""
  [ "$state" = FAILED ] || msg="job $id ended $state, not FAILED"
  grep -q "starting the daemons again" "$out" && msg="$msg restarted a daemon that refused its flags"
  grep -q "before every daemon served" "$out" || msg="$msg no message: $(tail -n 5 "$out")"
  record "${name}_no_retry_on_bad_flags" "$msg"
  [ -n "$msg" ] && cat "$out"
}

missing=""
for c in munged slurmctld slurmd sbatch scancel scontrol sinfo srun; do
  command -v "$c" >/dev/null || missing="$missing $c"
done
if [ "$(id -u)" != 0 ]; then
  skip slurm_single "needs root (starts munged, slurmctld and slurmd)"
  skip slurm_4hosts "needs root"
elif [ -n "$missing" ]; then
  skip slurm_single "not installed:$missing (packages slurm-wlm munge; deploy/setup.sh installs them)"
  skip slurm_4hosts "not installed:$missing"
else
  echo "== single node, 2 trainers"
  if [ -n "${SPEX_SLURM_ONLY_4HOSTS:-}" ]; then :
  elif start_cluster single; then
    run_jobs single 2
    spexrun_job single 2
    retry_jobs single
  else
    record single_start "the single-node Slurm did not start"
  fi
  stop_all; [ -n "${SPEX_SLURM_KEEP:-}" ] && echo "kept $S" || rm -rf "$S"
  echo "== 4 emulated hosts (network namespaces), 1 trainer each"
  if [ "${SPEX_SLURM_MULTI:-1}" = 0 ]; then
    skip slurm_4hosts "SPEX_SLURM_MULTI=0 turns the 4-host case off"
  elif ! command -v nsenter >/dev/null || ! command -v unshare >/dev/null ||
    ! ip netns add "sx$$-probe" 2>/dev/null; then
    skip slurm_4hosts "cannot create network namespaces here (ip netns, nsenter, unshare)"
  else
    ip netns del "sx$$-probe"
    if start_cluster multi; then
      run_jobs 4hosts 1
      spexrun_job 4hosts 1
    else
      record 4hosts_start "the 4-host Slurm did not start"
    fi
    stop_all; [ -n "${SPEX_SLURM_KEEP:-}" ] && echo "kept $S" || rm -rf "$S"
  fi
fi
write_junit_skips slurm
echo "slurm: $failures failure(s)"
[ $failures = 0 ]
