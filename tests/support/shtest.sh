# Shared by the shell tests that start spexd under mpirun (sourced, not run):
#   MPI environment for root on one machine, waiting for sockets, stopping mpirun by PID,
#   listing what daemons left in /dev/shm, and JUnit XML that tests/run.sh counts.
# Use: source "$R/tests/support/shtest.sh"; record NAME "failure message or empty"; ...;
#      write_junit SUITE; [ $failures = 0 ]
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
CASES=()  # "name|failure message" (empty message = passed)
failures=0

record() {  # name failure-message (empty = pass)
  CASES+=("$1|$2")
  if [ -n "$2" ]; then echo "FAIL $1: $2"; failures=$((failures + 1)); else echo "ok   $1"; fi
  return 0
}

wait_sockets() {  # dir count: waits up to 20 s for `count` node*.sock files in dir
  for _ in $(seq 200); do
    local n; n=$(ls "$1"/node*.sock 2>/dev/null | wc -l)
    [ "$n" -ge "$2" ] && return 0
    sleep 0.1
  done
  return 1
}

alive() {  # pid -> 0 when it is running (an exited process not yet reaped does not count)
  [ -r "/proc/$1/stat" ] && [ "$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null)" != Z ]
}

# pid [daemon pids...] -> 0 when every daemon ended within 15 s of SIGTERM to mpirun, else 1.
# mpirun itself outliving its daemons (seen once on a loaded machine: OpenMPI's own shutdown,
# not spexd's) is reported with its process table and then SIGKILLed, not counted as a failure.
stop_mpirun() {
  local mpi=$1 t0=$SECONDS d; shift
  kill -TERM "$mpi"
  for _ in $(seq 150); do
    alive "$mpi" || { wait "$mpi"; echo "mpirun $mpi ended $((SECONDS - t0)) s after SIGTERM"; return 0; }
    sleep 0.1
  done
  echo "mpirun $mpi still running 15 s after SIGTERM; its processes:"
  ps -o pid,ppid,stat,wchan:24,etime,args --ppid "$mpi" -p "$mpi" 2>/dev/null | cut -c1-160
  local left=0
  for d in "$@"; do alive "$d" && left=$((left + 1)); done
  kill -9 "$mpi"; wait "$mpi"
  if [ $# -gt 0 ] && [ $left = 0 ]; then
    echo "WARNING: every daemon had ended; only mpirun lingered (SIGKILLed)"
    return 0
  fi
  return 1
}

kill_left() {  # daemon pids -> SIGKILLs those still alive (after a failed stop), prints them
  local d
  for d in "$@"; do
    alive "$d" || continue
    echo "daemon $d still alive: SIGKILL"; kill -9 "$d"
  done
  return 0
}

# When this file was sourced: segments older than that are not this test's daemons', whatever
# their pid says. pid_max is 32768 on a machine of few cores, so a daemon of this test can get
# the pid of one that another test or job killed earlier and whose segments are still there (seen
# in a fresh-clone run: another user's segments from hours before, named by the reused pid).
SHTEST_T0=$(date +%s)

shm_left() {  # daemon pids -> prints what they left in /dev/shm (created since SHTEST_T0)
  for d in "$@"; do
    find /dev/shm -maxdepth 1 -name "spex-$d-*" -newermt "@$((SHTEST_T0 - 1))" -printf '%f\n' 2>/dev/null
  done
}

write_junit() {  # suite name; to $XML_OUTPUT_FILE when Bazel sets it
  [ -n "${XML_OUTPUT_FILE:-}" ] || return 0
  {
    echo '<?xml version="1.0" encoding="UTF-8"?>'
    echo "<testsuites><testsuite name=\"$1\" tests=\"${#CASES[@]}\" failures=\"$failures\">"
    local c name msg
    for c in "${CASES[@]}"; do
      name=${c%%|*}; msg=${c#*|}
      msg=$(printf '%s' "$msg" | sed -e 's/&/\&amp;/g' -e 's/</\&lt;/g' -e 's/>/\&gt;/g' -e 's/"/\&quot;/g')
      if [ -n "$msg" ]; then
        echo "  <testcase classname=\"$1\" name=\"$name\"><failure message=\"$msg\"/></testcase>"
      else
        echo "  <testcase classname=\"$1\" name=\"$name\"/>"
      fi
    done
    echo "</testsuite></testsuites>"
  } >"$XML_OUTPUT_FILE"
}
