#!/usr/bin/env bash
# Runs scale_sim_test.py with Debian's Python from the test's runfiles (the sources it builds).
set -euo pipefail
cd "${TEST_SRCDIR}/${TEST_WORKSPACE}"
exec /usr/bin/python3 tests/scale/scale_sim_test.py
