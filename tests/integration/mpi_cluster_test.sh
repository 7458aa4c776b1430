#!/usr/bin/env bash
# Starts N spexd under mpirun on this machine (one per emulated node) with L trainer processes
# (C++ client, spex_trainer --verify) per node; every trainer checks that its result is the
# exact average of all inputs (several buckets of different sizes, several steps, doorbell and
# RPC paths; 2x2, 4x2 and 3x2 trainers). Then checks bad-start handling (a live socket,
# different --local_trainers per node), clean shutdown on SIGTERM of one rank or of
# mpirun, and that nothing is left in /dev/shm.
set -uo pipefail
R="${RUNFILES_DIR:-${TEST_SRCDIR:-$PWD/..}}/spex"
SPEXD="$R/daemon/spexd"; TRAINER="$R/client/spex_trainer"; SPEXCTL="$R/client/spexctl"
source "$R/tests/support/shtest.sh"
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

run_cluster() {  # nodes trainers mode stop_how
  local N=$1 L=$2 mode=$3 stop=$4 dir; dir=$(mktemp -d /tmp/spex-it.XXXXXX)
  echo "== $N nodes x $L trainers, mode $mode, stop by $stop"
  mpirun -np "$N" "$SPEXD" --socket="$dir/node{rank}.sock" --local_trainers="$L" --register_timeout=30s \
    --log_level=warning >"$dir/mpirun.log" 2>&1 &
  local mpi=$!
  if ! wait_sockets "$dir" "$N"; then fail "daemons did not start"; cat "$dir/mpirun.log"; kill -9 $mpi; return; fi
  local daemons; daemons=$(pgrep -f "spexd --socket=$dir" | tr '\n' ' ')
  "$SPEXCTL" --socket="$dir/node0.sock" health | grep -q SERVING || fail "health is not SERVING"
  local pids=()
  for n in $(seq 0 $((N - 1))); do
    for l in $(seq 0 $((L - 1))); do
      "$TRAINER" --socket="$dir/node$n.sock" --local_rank="$l" --local_size="$L" --verify --quiet \
        --buckets=1,1000,4097,262144 --steps=5 --mode="$mode" >"$dir/t$n.$l.log" 2>&1 &
      pids+=($!)
    done
  done
  for p in "${pids[@]}"; do wait "$p" || fail "a trainer failed"; done
  cat "$dir"/t*.log
  grep -h "verified exact" "$dir"/t*.log | wc -l | grep -qx "$((N * L))" || fail "not every trainer verified"
  "$SPEXCTL" --socket="$dir/node1.sock" stats | tee "$dir/stats" | grep -q "exchanges 20" || fail "stats: expected 20 exchanges"
  # A second daemon over a live socket must refuse to start, and leave the first serving.
  mpirun -np 1 "$SPEXD" --socket="$dir/node0.sock" >"$dir/second.log" 2>&1 && fail "second daemon started over a live socket"
  grep -q "already serving" "$dir/second.log" || { fail "no clear message for a live socket"; cat "$dir/second.log"; }
  "$SPEXCTL" --socket="$dir/node0.sock" health | grep -q SERVING || fail "first daemon stopped serving"
  if [ "$stop" = one-rank ]; then
    kill -TERM "$(echo "$daemons" | awk '{print $NF}')"
  else
    kill -TERM "$mpi"
  fi
  local ok=0
  for _ in $(seq 150); do kill -0 "$mpi" 2>/dev/null || { ok=1; break; }; sleep 0.1; done
  [ $ok = 1 ] || { fail "daemons did not stop within 15 s"; kill -9 "$mpi"; }
  wait "$mpi"; local rc=$?
  [ "$stop" = one-rank ] && [ $rc != 0 ] && fail "mpirun exited $rc after SIGTERM to one rank"
  for d in $daemons; do
    ls /dev/shm | grep -q "^spex-$d-" && fail "segments of daemon $d left in /dev/shm"
  done
  ls "$dir"/node*.sock >/dev/null 2>&1 && fail "sockets left behind"
  grep -E "ERROR" "$dir/mpirun.log" && fail "daemon logged errors"
  rm -rf "$dir"
}

run_cluster 2 2 doorbell one-rank
run_cluster 2 2 rpc mpirun
run_cluster 4 2 alternate mpirun
# 3 x 2: a divisor that is not a power of two (the dense path scales after the reduction).
run_cluster 3 2 alternate mpirun

# Daemons started with different values of a flag every node must share all refuse, saying
# which flag to fix, and leave no socket.
dir=$(mktemp -d /tmp/spex-int.XXXXXX)
expect_mismatch() {  # flag value-a value-b pattern
  local flag=$1 a=$2 b=$3 pattern=$4 log="$dir/mismatch.$1.log"
  if timeout 60 mpirun -np 1 "$SPEXD" --socket="$dir/a.sock" "--$flag=$a" : \
      -np 1 "$SPEXD" --socket="$dir/b.sock" "--$flag=$b" >"$log" 2>&1; then
    fail "daemons with different --$flag started"
  fi
  grep -q -- "$pattern" "$log" || { fail "no clear message for different --$flag"; cat "$log"; }
  ls "$dir"/*.sock >/dev/null 2>&1 && fail "a refused start (--$flag) left its socket"
}
expect_mismatch local_trainers 1 2 "local_trainers differs between nodes"
# A blocking and a non-blocking all-reduce never match.
expect_mismatch mpi_wait_max_sleep_us 0 500 "mpi_wait_max_sleep_us differs between nodes (0 to 500"
expect_mismatch mpi_passive_wait_min_bytes 0 1048576 \
  "mpi_passive_wait_min_bytes differs between nodes (0 to 1048576"
rm -rf "$dir"
echo "integration: $failures failure(s)"
[ $failures = 0 ]
