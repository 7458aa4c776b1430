#!/usr/bin/env bash
# The fused exchange over MPI (mpi_fused_step.cc) under mpirun with 2 and 4 ranks on this
# machine: dyadic data bit-identical to the unmerged steps, normal data within the stated
# tolerance; one case per check and rank count, plus mpirun's exit status.
set -uo pipefail
R="${RUNFILES_DIR:-${TEST_SRCDIR:-$PWD/..}}/spex"
BIN="$R/tests/integration/mpi_fused_step"
source "$R/tests/support/shtest.sh"

run_world() {  # ranks
  local np=$1 dir; dir=$(mktemp -d /tmp/spex-mpifused.XXXXXX)
  echo "== mpirun -np $np"
  env -u XML_OUTPUT_FILE -u TEST_PREMATURE_EXIT_FILE mpirun -np "$np" "$BIN" >"$dir/log" 2>&1 &
  local mpi=$! finished=0 rc=0
  for _ in $(seq 1200); do  # 120 s
    alive "$mpi" || { finished=1; break; }
    sleep 0.1
  done
  if [ $finished = 1 ]; then
    wait "$mpi"; rc=$?
    [ $rc = 0 ] && record "np$np.mpirun_exit" "" || record "np$np.mpirun_exit" "mpirun exited $rc"
  else
    record "np$np.mpirun_exit" "still running after 120 s (a rank hung in a collective?)"
    local ranks; ranks=$(pgrep -f "$BIN" | tr '\n' ' ')
    stop_mpirun "$mpi" $ranks || kill_left $ranks
  fi
  cat "$dir/log"
  local data line
  for data in dyadic normal; do
    line=$(grep "^mpi_fused_step: $data data, $np ranks:" "$dir/log")
    if [ -z "$line" ]; then
      record "np$np.$data" "no verdict printed"
    elif [[ "$line" == *": ok ("* ]]; then
      record "np$np.$data" ""
    else
      record "np$np.$data" "$line"
    fi
  done
  rm -rf "$dir"
}

run_world 2
run_world 4
write_junit mpi_fused_step
echo "mpi_fused_step: $failures failure(s) in ${#CASES[@]} cases"
[ $failures = 0 ]
