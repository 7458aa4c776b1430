#!/usr/bin/env bash
# spex on a 2-host emulated cluster (deploy/emulated_cluster.sh): two network namespaces on a
# bridge, 1 Gbit/s each way, +300 us one-way latency (the NFQUEUE delayer), each host its own
# hostname, /etc/netns files and core. spexd runs under mpirun one rank per host; 2 spex_trainer
# processes per host run inside their host's namespace with --verify: a dense bucket must be the
# exact average over the namespaces, a micro bucket must match the single-process oracle
# (kernels/reference_cluster.h). Then the teardown: after a clean stop, and after a failed run
# (mpirun SIGKILLed while a daemon waits for a trainer that never comes, a stray process on a
# host), `down` must leave no namespace, /etc/netns entry, registry entry, socket, shared-memory
# segment or process of the cluster, and a second `down` must succeed too. Everything is started
# and stopped by process id. Skipped (JUnit <skipped/>, with the reason) where this machine cannot
# emulate hosts (not root, network namespaces not permitted).
set -uo pipefail
R="${RUNFILES_DIR:-${TEST_SRCDIR:-$PWD/..}}/spex"
SPEXD="$R/daemon/spexd"; TRAINER="$R/client/spex_trainer"; EMU="$R/deploy/emulated_cluster.sh"
source "$R/tests/support/shtest.sh"
T0=$SECONDS

if ! why=$(bash "$EMU" check 2>&1); then
  echo "SKIPPED: $why"
  if [ -n "${XML_OUTPUT_FILE:-}" ]; then
    msg=$(printf '%s' "$why" | sed -e 's/&/\&amp;/g' -e 's/</\&lt;/g' -e 's/>/\&gt;/g' -e 's/"/\&quot;/g')
    printf '<?xml version="1.0" encoding="UTF-8"?>\n<testsuites><testsuite name="emulated_cluster_test" tests="1" failures="0" skipped="1"><testcase classname="emulated_cluster_test" name="two_hosts"><skipped message="%s"/></testcase></testsuite></testsuites>\n' "$msg" >"$XML_OUTPUT_FILE"
  fi
  exit 0
fi

DIRS=()
cleanup() { local d; for d in "${DIRS[@]}"; do bash "$EMU" down "$d" >/dev/null 2>&1; rm -rf "$d"; done; }
trap cleanup EXIT

tag_of() { sed -n 's/^TAG=//p' "$1/cluster.env" 2>/dev/null; }

# What the cluster tagged $1 (state in $2, daemons $3...) left behind; empty when nothing.
leftovers() {
  local tag=$1 dir=$2 out=""; shift 2
  ip netns list | grep -q "^sx$tag" && out+="namespaces: $(ip netns list | grep "^sx$tag" | tr '\n' ' '). "
  ls -d /etc/netns/sx"$tag"* >/dev/null 2>&1 && out+="/etc/netns entries: $(ls -d /etc/netns/sx"$tag"*). "
  [ -e "/run/spex-emu/$tag" ] && out+="registry entry /run/spex-emu/$tag. "
  [ -n "$(find "$dir" -type s 2>/dev/null)" ] && out+="sockets: $(find "$dir" -type s). "
  local shm; shm=$(shm_left "$@"); [ -n "$shm" ] && out+="segments: $shm. "
  local p; for p in "$@"; do alive "$p" && out+="process $p still running. "; done
  printf '%s' "$out"
}

# --- 1. exact dense and micro against the oracle across 2 emulated hosts, clean stop ---------
D=$(mktemp -d /tmp/spex-emutest.XXXXXX); DIRS+=("$D")
if ! bash "$EMU" up "$D" --hosts 2 --rate 1gbit --latency-us 300 --owner $$; then
  record "up" "emulated_cluster.sh up failed"; write_junit emulated_cluster_test; exit 1
fi
TAG=$(tag_of "$D")
msg=""
for h in 1 2; do
  name=$(bash "$EMU" exec "$D" host$h hostname)
  [ "$name" = "host$h" ] || msg+="host$h calls itself '$name'. "
  addr=$(bash "$EMU" exec "$D" host$h getent hosts host$((3 - h)) | cut -d' ' -f1)
  [ "$addr" = "10.77.0.$((3 - h))" ] || msg+="host$h resolves host$((3 - h)) to '$addr'. "
done
delayers=$(cat "$D/pids")
[ "$(echo "$delayers" | grep -c .)" = 2 ] || msg+="expected 2 latency delayers, got: $delayers. "
for p in $delayers; do alive "$p" || msg+="delayer $p is not running. "; done
record "hosts_names_latency" "$msg"

bash "$EMU" mpirun "$D" "$SPEXD" --socket="$D/sock/node{rank}.sock" --local_trainers=2 --threads=1 \
  --dense_fallback=off --min_sparse_elements=0 --residual_norm_every=1 --log_level=warning >"$D/mpirun.log" 2>&1 &
MPI=$!
if ! wait_sockets "$D/sock" 2; then
  cat "$D/mpirun.log"; kill -9 $MPI; record "exchange" "daemons did not start"; write_junit emulated_cluster_test; exit 1
fi
DAEMONS=$(pgrep -f "^$SPEXD --socket=$D/sock" | tr '\n' ' ')
msg=""
root_net=$(readlink /proc/$$/ns/net)
nets=""
for d in $DAEMONS; do nets+="$(readlink /proc/$d/ns/net) "; done
[ "$(echo $nets | tr ' ' '\n' | sort -u | grep -c .)" = 2 ] || msg+="daemons $DAEMONS are not in 2 namespaces ($nets). "
echo "$nets" | grep -q "$root_net" && msg+="a daemon runs in the root namespace. "
PIDS=()
for n in 1 2; do
  for l in 0 1; do
    bash "$EMU" exec "$D" host$n "$TRAINER" --socket="$D/sock/node$((n - 1)).sock" --local_rank=$l --local_size=2 \
      --verify --quiet --threads=1 --buckets=300007,70001 --compressors=dense,micro --density=0.01 --steps=4 \
      --mode=alternate >"$D/t$n.$l.log" 2>&1 &
    PIDS+=($!)
  done
done
failed=0
for p in "${PIDS[@]}"; do wait "$p" || failed=$((failed + 1)); done
cat "$D"/t*.log
verified=$(grep -h " verified: " "$D"/t*.log | grep -vc ", 0 residual norms")
[ $failed = 0 ] || msg+="$failed trainers failed. "
[ "$verified" = 4 ] || msg+="$verified of 4 trainers verified dense and micro (with residual norms). "
record "dense_exact_and_micro_oracle_across_hosts" "$msg"

msg=""
stop_mpirun $MPI $DAEMONS || { msg="daemons did not stop within 15 s of SIGTERM. "; kill_left $DAEMONS; }
grep ERROR "$D/mpirun.log" && msg+="daemon logged errors. "
bash "$EMU" down "$D" || msg+="down failed. "
msg+=$(leftovers "$TAG" "$D" $DAEMONS $delayers)
bash "$EMU" down "$D" >/dev/null || msg+="a second down failed. "
record "clean_teardown" "$msg"

# --- 2. teardown after a failed run -----------------------------------------------------------
D2=$(mktemp -d /tmp/spex-emutest.XXXXXX); DIRS+=("$D2")
msg=""
if bash "$EMU" up "$D2" --hosts 2 --rate 100mbit --owner $$ >/dev/null; then
  TAG2=$(tag_of "$D2")
  bash "$EMU" mpirun "$D2" "$SPEXD" --socket="$D2/sock/node{rank}.sock" --local_trainers=2 --threads=1 \
    --log_level=warning >"$D2/mpirun.log" 2>&1 &
  MPI2=$!
  if wait_sockets "$D2/sock" 2; then
    DAEMONS2=$(pgrep -f "^$SPEXD --socket=$D2/sock" | tr '\n' ' ')
    # One trainer of node 0 registers a bucket its partner never attaches (a linked segment) and
    # waits; a stray process sits on host 2.
    bash "$EMU" exec "$D2" host1 "$TRAINER" --socket="$D2/sock/node0.sock" --local_rank=0 --local_size=2 --quiet \
      --buckets=30000 --steps=100 >"$D2/t.log" 2>&1 &
    T=$!
    bash "$EMU" exec "$D2" host2 sleep 600 &
    S=$!
    for _ in $(seq 50); do [ -n "$(shm_left $DAEMONS2)" ] && break; sleep 0.1; done
    [ -n "$(shm_left $DAEMONS2)" ] || msg+="(setup) no segment was created. "
    kill -9 $MPI2; wait $MPI2 2>/dev/null  # the owner of the job dies; daemons, trainer, stray stay
    bash "$EMU" down "$D2" || msg+="down failed. "
    wait $T 2>/dev/null; wait $S 2>/dev/null
    msg+=$(leftovers "$TAG2" "$D2" $DAEMONS2 $T $S)
    bash "$EMU" down "$D2" >/dev/null || msg+="a second down failed. "
  else
    cat "$D2/mpirun.log"; kill -9 $MPI2; msg+="daemons did not start. "
  fi
else
  msg+="up failed. "
fi
record "teardown_after_failed_run" "$msg"

echo "emulated_cluster_test: $failures failure(s) in $((SECONDS - T0)) s"
write_junit emulated_cluster_test
[ $failures = 0 ]
