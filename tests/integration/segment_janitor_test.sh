#!/usr/bin/env bash
# spexd's segment janitor (daemon/memory/segment_janitor.h): a daemon that ends without its own
# clean-up leaves nothing in /dev/shm. Each case starts spexd under mpirun with two local trainers
# and one synthetic trainer, so that its buckets' segments keep their names (a name is removed
# once every trainer attached), then ends the daemon:
#   - SIGKILL of spexd;
#   - two SIGTERMs to mpirun 0.2 s apart (mpirun then exits at once and Open MPI aborts spexd with
#     _exit, before it sees a signal: what `kill` of a runuser/sudo session's process group does);
#   - one SIGTERM to mpirun (the clean stop: spexd removes its names itself, the janitor says
#     nothing).
# Each checks that the names and the daemon's socket file are gone within 5 s, that the janitor
# exited, and what it said. The SIGKILL and the two SIGTERMs run a world of two daemons, whose
# Open MPI shared-memory segments (/dev/shm/vader_segment.*, which a killed world leaves too) must
# be gone as well. And that the janitor is a process of its own session named spexd-janitor,
# which `pgrep -f` for the daemon's command line does not find.
set -uo pipefail
R="${RUNFILES_DIR:-${TEST_SRCDIR:-$PWD/..}}/spex"
SPEXD="$R/daemon/spexd"; TRAINER="$R/client/spex_trainer"
source "$R/tests/support/shtest.sh"

run_case() {  # name how nodes
  local name=$1 how=$2 nodes=$3 dir; dir=$(mktemp -d /tmp/spex-janitor.XXXXXX)
  mpirun -np "$nodes" --bind-to none "$SPEXD" --socket="$dir/node{rank}.sock" --local_trainers=2 \
    --log_level=info >"$dir/mpirun.log" 2>&1 &
  local mpi=$!
  if ! wait_sockets "$dir" "$nodes"; then
    record "$name" "spexd did not start: $(tail -c 400 "$dir/mpirun.log")"; kill -9 "$mpi"; wait "$mpi"; return
  fi
  # Node 0's daemon: the one whose bucket segments (spex-PID-bN-HASH) appear when the trainer
  # registers. Anchored: a doorbell's name (spex-PID-bell-HASH) whose hash starts with b and a
  # digit matched a bare -b[0-9] and picked node 1's daemon (CI failed on it once in about 20).
  "$TRAINER" --socket="$dir/node0.sock" --local_rank=0 --local_size=2 --buckets=1000,65536 \
    --steps=1000 >"$dir/trainer.log" 2>&1 &
  local trainer=$!
  local daemon="" d
  for _ in $(seq 100); do
    for d in $(ps -o pid= --ppid "$mpi"); do shm_left "$d" | grep -qE -- "^spex-$d-b[0-9]+-" && daemon=$d; done
    [ -n "$daemon" ] && break
    sleep 0.1
  done
  local janitor; janitor=$(ps -o pid= --ppid "$daemon" | tr -d ' ' | head -1)
  local vader; vader=$(grep -o "/dev/shm/vader_segment[^ ]*" "/proc/$daemon/maps" 2>/dev/null | sort -u)
  [ "$nodes" = 1 ] || [ -n "$vader" ] || echo "note: the daemons map no vader_segment (Open MPI took another path)"
  local names=""
  for _ in $(seq 100); do
    names=$(shm_left "$daemon" | sort | tr '\n' ' ')
    [ "$(echo "$names" | wc -w)" -ge 3 ] && break  # the doorbell and two buckets
    sleep 0.1
  done
  local problems=""
  [ "$(echo "$names" | wc -w)" -ge 3 ] || problems+="the daemon's segments did not appear (found: '$names'); "
  if [ -z "$janitor" ]; then
    problems+="spexd $daemon has no child process (the janitor); "
  else
    local comm cmdline sid dsid
    comm=$(cat "/proc/$janitor/comm" 2>/dev/null)
    cmdline=$(tr '\0' ' ' <"/proc/$janitor/cmdline" 2>/dev/null | sed 's/ *$//')
    sid=$(ps -o sid= -p "$janitor" | tr -d ' '); dsid=$(ps -o sid= -p "$daemon" | tr -d ' ')
    [ "$comm" = spexd-janitor ] || problems+="the janitor's name is '$comm'; "
    [ "$cmdline" = spexd-janitor ] || problems+="the janitor's command line is '$cmdline'; "
    [ "$sid" = "$janitor" ] && [ "$sid" != "$dsid" ] || problems+="the janitor is in session $sid, spexd in $dsid; "
    pgrep -f "spexd --socket=$dir" | grep -qx "$janitor" && problems+="pgrep -f for the daemon finds the janitor; "
  fi
  case $how in
    kill9) kill -KILL "$daemon" ;;
    term2) kill -TERM "$mpi"; sleep 0.2; kill -TERM "$mpi" ;;  # apart: two at once count as one
    term1) kill -TERM "$mpi" ;;
  esac
  local left=""
  for _ in $(seq 50); do
    left=$(shm_left "$daemon")
    [ -z "$left" ] && ! alive "$janitor" && break
    sleep 0.1
  done
  [ -z "$left" ] || problems+="left in /dev/shm 5 s after the daemon ended: $(echo $left); "
  for _ in $(seq 50); do [ -e "$dir/node0.sock" ] || break; sleep 0.1; done
  [ -e "$dir/node0.sock" ] && problems+="the daemon's socket is left 5 s after it ended; "
  for v in $vader; do
    for _ in $(seq 50); do [ -e "$v" ] || break; sleep 0.1; done
    [ -e "$v" ] && problems+="Open MPI's $v left 5 s after the daemon ended; "
  done
  [ -n "$janitor" ] && alive "$janitor" && { problems+="the janitor $janitor still runs; "; kill -9 "$janitor"; }
  kill -9 "$trainer" 2>/dev/null; wait "$trainer" 2>/dev/null
  for _ in $(seq 100); do alive "$mpi" || break; sleep 0.1; done
  alive "$mpi" && { problems+="mpirun still runs 10 s after the daemon ended; "; kill -9 "$mpi"; }
  wait "$mpi" 2>/dev/null
  alive "$daemon" && { problems+="spexd $daemon still runs; "; kill -9 "$daemon"; }
  local said; said=$(grep -a "spexd-janitor:" "$dir/mpirun.log")
  case $how in
    kill9 | term2)
      # After term2 mpirun may be gone before the janitor writes: its words are then lost.
      [ "$how" = term2 ] || echo "$said" | grep -q "ended without removing [3-9] shared-memory name" ||
        problems+="the janitor did not say what it removed (log: '$said'); " ;;
    term1)
      grep -q "stopped cleanly" "$dir/mpirun.log" || problems+="spexd did not stop cleanly; "
      [ -z "$said" ] || problems+="the janitor spoke after a clean stop: $said; " ;;
  esac
  echo "== $name: daemon $daemon, janitor $janitor, segments $names, Open MPI's: $(echo $vader)"
  [ -z "$problems" ] || { tail -n 20 "$dir/mpirun.log"; echo "spex_trainer said:"; tail -n 5 "$dir/trainer.log"; }
  record "$name" "$problems"
  rm -rf "$dir"
}

run_case sigkill_of_spexd kill9 2
run_case mpirun_gone_first term2 2
run_case clean_stop term1 1
write_junit segment_janitor_test
[ "$failures" = 0 ]
