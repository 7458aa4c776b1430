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

stop_mpirun() {  # pid -> 0 when it ended within 15 s of SIGTERM (else SIGKILL, 1)
  local t0=$SECONDS
  kill -TERM "$1"
  for _ in $(seq 150); do
    kill -0 "$1" 2>/dev/null || { wait "$1"; echo "mpirun $1 ended $((SECONDS - t0)) s after SIGTERM"; return 0; }
    sleep 0.1
  done
  # Say what is still running before killing it: mpirun's children and where they wait.
  echo "mpirun $1 still running 15 s after SIGTERM; its processes:"
  ps -o pid,ppid,stat,wchan:24,etime,args --ppid "$1" -p "$1" 2>/dev/null | cut -c1-160
  kill -9 "$1"; wait "$1"; return 1
}

kill_left() {  # daemon pids -> SIGKILLs those still alive (after a failed stop), prints them
  local d
  for d in "$@"; do kill -0 "$d" 2>/dev/null && { echo "daemon $d still alive: SIGKILL"; kill -9 "$d"; }; done
  return 0
}

shm_left() {  # daemon pids -> prints what they left in /dev/shm
  for d in "$@"; do ls /dev/shm | grep "^spex-$d-"; done
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
