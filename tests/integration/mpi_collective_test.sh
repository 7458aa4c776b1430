#!/usr/bin/env bash
# Runs the Collective conformance suite over MPI (mpi_collective_test.cc) under mpirun with 2 and
# 4 ranks on this machine. Reports each gtest case of rank 0's XML (which carries every rank's
# verdict) as "npN.Suite.Case", plus per run: mpirun's exit status and that every rank reported.
set -uo pipefail
R="${RUNFILES_DIR:-${TEST_SRCDIR:-$PWD/..}}/spex"
BIN="$R/tests/integration/mpi_collective_conformance"
source "$R/tests/support/shtest.sh"

run_world() {  # ranks
  local np=$1 dir; dir=$(mktemp -d /tmp/spex-mpicoll.XXXXXX)
  echo "== mpirun -np $np"
  # The ranks must not touch this test's own XML and premature-exit files.
  env -u XML_OUTPUT_FILE -u TEST_PREMATURE_EXIT_FILE mpirun -np "$np" "$BIN" --gtest_output="xml:$dir/gtest.xml" >"$dir/log" 2>&1 &
  local mpi=$! finished=0 rc=0
  for _ in $(seq 2400); do  # 240 s
    alive "$mpi" || { finished=1; break; }
    sleep 0.1
  done
  if [ $finished = 1 ]; then
    wait "$mpi"; rc=$?
    [ $rc = 0 ] && record "np$np.mpirun_exit" "" || record "np$np.mpirun_exit" "mpirun exited $rc"
  else
    record "np$np.mpirun_exit" "still running after 240 s (a rank hung in a collective?)"
    local ranks; ranks=$(pgrep -f "$BIN --gtest_output=xml:$dir" | tr '\n' ' ')
    stop_mpirun "$mpi" $ranks || kill_left $ranks
  fi
  grep -v '^\[ *\(RUN\|OK\) *\]' "$dir/log" | tail -n 80
  local reported; reported=$(grep -c "^mpi_collective_test: rank [0-9]* of $np:" "$dir/log")
  [ "$reported" = "$np" ] && record "np$np.every_rank_reported" "" ||
    record "np$np.every_rank_reported" "$reported of $np ranks reported"
  if /usr/bin/python3 - "$dir/gtest.xml" "np$np" >"$dir/cases" <<'PY'; then
import sys, xml.etree.ElementTree as ET
for c in ET.parse(sys.argv[1]).getroot().iter("testcase"):
    f = c.find("failure")
    msg = "" if f is None else " / ".join((f.get("message") or "").splitlines())[:300]
    print(f"{sys.argv[2]}.{c.get('classname')}.{c.get('name')}|{msg or ('' if f is None else 'failed')}")
PY
    local line
    while IFS= read -r line; do record "${line%%|*}" "${line#*|}"; done <"$dir/cases"
  else
    record "np$np.gtest_xml" "rank 0 wrote no readable gtest XML"
  fi
  rm -rf "$dir"
}

run_world 2
run_world 4
write_junit mpi_collective
echo "mpi_collective: $failures failure(s) in ${#CASES[@]} cases"
[ $failures = 0 ]
