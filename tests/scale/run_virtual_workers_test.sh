#!/usr/bin/env bash
# Runs virtual_workers_test.py with Debian's Python (numpy, torch) from the test's runfiles, on
# the C ABI library built by //bench/scale:libreference_cluster_c.so.
set -euo pipefail
cd "${TEST_SRCDIR}/${TEST_WORKSPACE}"
exec /usr/bin/python3 tests/scale/virtual_workers_test.py "$1"
