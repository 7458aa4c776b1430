#!/usr/bin/env bash
# spexd's side of systemd's notification protocol, without systemd: the test owns the datagram
# socket ($NOTIFY_SOCKET; notify_listener.py logs every message with its sender's pid) and
# starts spexd under mpirun as spexd.service does (NOTIFY_SOCKET and WATCHDOG_USEC inherited,
# no WATCHDOG_PID: deploy/systemd/spex-world unsets it).
#  1 node: STATUS= lines while starting; READY=1 only once the control socket accepts
#    connections (probed when READY=1 arrives); WATCHDOG=1 from the idle daemon at the rate
#    asked for (at most one per half interval, never a gap of a whole interval); STOPPING=1 on
#    SIGTERM; nothing left in /dev/shm.
#  2 nodes: READY=1 from both daemons; while trainers exchange, SIGSTOP one daemon: the
#    other's engine is stuck inside a collective and its pings stop (systemd would restart the
#    world after WatchdogSec); after SIGCONT they resume. Everything is stopped by pid.
set -uo pipefail
R="${RUNFILES_DIR:-${TEST_SRCDIR:-$PWD/..}}/spex"
SPEXD="$R/daemon/spexd"; TRAINER="$R/client/spex_trainer"
LISTENER="$R/tests/integration/notify_listener.py"
source "$R/tests/support/shtest.sh"
source "$R/tests/integration/skip_junit.sh"
PY=/usr/bin/python3
WD_USEC=600000  # watchdog interval 0.6 s: a ping at most every 0.3 s, never a gap of 0.6 s
T=$(mktemp -d /tmp/spex-notify.XXXXXX)
LP=""  # listener pid

start_listener() {  # log [probe path]
  "$PY" "$LISTENER" "$T/notify" "$1" ${2:+--probe "$2"} &
  LP=$!
  for _ in $(seq 100); do [ -S "$T/notify" ] && return 0; sleep 0.05; done
  return 1
}
stop_listener() { [ -n "$LP" ] && kill -TERM "$LP" 2>/dev/null && wait "$LP" 2>/dev/null; LP=""; }
now() { "$PY" -c 'import time; print(f"{time.monotonic():.6f}")'; }
wait_for() {  # log pattern seconds -> 0 when a line matches within the time
  local i
  for i in $(seq $(($3 * 20))); do grep -q -- "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  return 1
}
# log pid from to -> "count maxgap" of WATCHDOG=1 from pid between monotonic times from..to,
# the gaps measured also from `from` to the first ping and from the last ping to `to`.
pings() {
  awk -v p="$2" -v a="$3" -v b="$4" '
    $2 == p && $3 == "WATCHDOG=1" && $1 >= a && $1 <= b {
      n++; g = $1 - last; if (g > max) max = g; last = $1 }
    BEGIN { last = a; max = 0 }
    END { g = b - last; if (g > max) max = g; printf "%d %.3f\n", n, max }' "$1"
}
cleanup() { stop_listener; }
trap cleanup EXIT

# ---- 1 node
echo "== 1 node"
mkdir -p "$T/one"
start_listener "$T/one/notify.log" "$T/one/node0.sock" || record listener "no listener socket"
NOTIFY_SOCKET="$T/notify" WATCHDOG_USEC=$WD_USEC mpirun -np 1 "$SPEXD" \
  --socket="$T/one/node{rank}.sock" --log_level=warning >"$T/one/mpirun.log" 2>&1 &
mpi=$!
if wait_for "$T/one/notify.log" "READY=1" 20; then
  d=$(ps -o pid= --ppid "$mpi" | tr -d ' ')
  grep "READY=1" "$T/one/notify.log"
  line=$(grep -m1 "READY=1" "$T/one/notify.log")
  msg=""
  [ "$(echo "$line" | awk '{print $2}')" = "$d" ] || msg="READY=1 not from spexd (pid $d): $line"
  case "$line" in *probe=ok*) ;; *) msg="$msg READY=1 before the socket accepted connections: $line" ;; esac
  record ready_after_socket_serves "$msg"
  # STATUS= while starting (before READY) and with READY.
  n=$(grep -c "STATUS=" "$T/one/notify.log")
  [ "$n" -ge 2 ] && record status_lines "" ||
    record status_lines "expected STATUS= lines while starting and at READY, got: $(cat "$T/one/notify.log")"
  t0=$(now); sleep 3; t1=$(now)
  read -r n gap < <(pings "$T/one/notify.log" "$d" "$t0" "$t1")
  echo "idle daemon: $n WATCHDOG=1 in $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b-a}') s, longest gap $gap s (interval 0.6 s)"
  # 3 s at one ping per 0.3 s (+ up to 50 ms for the engine's heartbeat): 8..11 pings.
  if [ "$n" -ge 8 ] && [ "$n" -le 11 ] && awk -v g="$gap" 'BEGIN { exit !(g < 0.6) }'; then
    record watchdog_rate ""
  else
    record watchdog_rate "expected 8..11 WATCHDOG=1 in 3 s (WATCHDOG_USEC=$WD_USEC) with gaps < 0.6 s, got $n, longest gap $gap s"
  fi
  stop_mpirun "$mpi" "$d" || record stop_one "mpirun did not stop within 15 s"
  wait_for "$T/one/notify.log" "STOPPING=1" 2 && record stopping "" ||
    record stopping "no STOPPING=1 after SIGTERM: $(tail -n 3 "$T/one/notify.log")"
  left=$(shm_left "$d"); [ -z "$left" ] || record shm_one "left in /dev/shm: $left"
else
  record ready_after_socket_serves "no READY=1 within 20 s (spexd must call SdNotifier::Ready once it serves): $(cat "$T/one/notify.log"; tail -n 5 "$T/one/mpirun.log")"
  kill -9 "$mpi" 2>/dev/null; wait "$mpi" 2>/dev/null
fi
stop_listener

# ---- 2 nodes: a stalled engine stops the pings
echo "== 2 nodes, one SIGSTOPped while trainers exchange"
mkdir -p "$T/two"
start_listener "$T/two/notify.log" || record listener "no listener socket"
NOTIFY_SOCKET="$T/notify" WATCHDOG_USEC=$WD_USEC mpirun -np 2 "$SPEXD" \
  --socket="$T/two/node{rank}.sock" --log_level=warning --shutdown_grace=2s >"$T/two/mpirun.log" 2>&1 &
mpi=$!
if wait_sockets "$T/two" 2 && wait_for "$T/two/notify.log" "READY=1" 10; then
  sleep 0.3
  read -r d0 d1 < <(ps -o pid= --ppid "$mpi" --sort=pid | tr '\n' ' ')
  readys=$(awk '$3 ~ /(^|\|)READY=1/ { print $2 }' "$T/two/notify.log" | sort -u | tr '\n' ' ')
  [ "$readys" = "$(printf '%s\n' "$d0" "$d1" | sort | tr '\n' ' ')" ] && record ready_two "" ||
    record ready_two "READY=1 expected from both daemons ($d0 $d1), got from: $readys"
  tp=()
  for n in 0 1; do
    "$TRAINER" --socket="$T/two/node$n.sock" --local_rank=0 --local_size=1 --quiet \
      --buckets=1000 --steps=1000000 >"$T/two/t$n.log" 2>&1 &
    tp+=($!)
  done
  sleep 1
  # Healthy while exchanging: both ping.
  t0=$(now); sleep 1.2; t1=$(now)
  read -r n0 g0 < <(pings "$T/two/notify.log" "$d0" "$t0" "$t1")
  read -r n1 g1 < <(pings "$T/two/notify.log" "$d1" "$t0" "$t1")
  echo "exchanging: daemon $d0 $n0 pings (gap $g0 s), daemon $d1 $n1 pings (gap $g1 s)"
  [ "$n0" -ge 3 ] && [ "$n1" -ge 3 ] && awk -v a="$g0" -v b="$g1" 'BEGIN { exit !(a < 0.6 && b < 0.6) }' &&
    record watchdog_while_exchanging "" ||
    record watchdog_while_exchanging "expected >= 3 pings each in 1.2 s with gaps < 0.6 s: $n0 (gap $g0), $n1 (gap $g1)"
  alive "${tp[0]}" && alive "${tp[1]}" || record trainers_running "a trainer ended early: $(cat "$T"/two/t*.log)"
  # Stall: daemon d1 stopped; d0's engine blocks in the next collective.
  kill -STOP "$d1"
  sleep 0.5
  t0=$(now); sleep 1.5; t1=$(now)
  read -r n0 g0 < <(pings "$T/two/notify.log" "$d0" "$t0" "$t1")
  echo "daemon $d1 stopped: daemon $d0 sent $n0 pings in 1.5 s"
  [ "$n0" = 0 ] && record watchdog_stops_when_stalled "" ||
    record watchdog_stops_when_stalled "daemon $d0 kept pinging ($n0 in 1.5 s) while its peer was stopped"
  kill -CONT "$d1"
  t0=$(now); sleep 1.2; t1=$(now)
  read -r n0 g0 < <(pings "$T/two/notify.log" "$d0" "$t0" "$t1")
  echo "after SIGCONT: daemon $d0 sent $n0 pings in 1.2 s"
  [ "$n0" -ge 2 ] && record watchdog_resumes "" ||
    record watchdog_resumes "daemon $d0 sent $n0 pings in 1.2 s after its peer continued"
  for p in "${tp[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${tp[@]}"; do wait "$p" 2>/dev/null; done
  stop_mpirun "$mpi" "$d0" "$d1" || { record stop_two "daemons did not stop within 15 s"; kill_left "$d0" "$d1"; }
  left=$(shm_left "$d0" "$d1"); [ -z "$left" ] || record shm_two "left in /dev/shm: $left"
else
  record ready_two "no sockets or no READY=1 within the time: $(cat "$T/two/notify.log"; tail -n 5 "$T/two/mpirun.log")"
  kill -9 "$mpi" 2>/dev/null; wait "$mpi" 2>/dev/null
fi
stop_listener

rm -rf "$T"
write_junit_skips systemd_notify
echo "systemd notify: $failures failure(s)"
[ $failures = 0 ]
