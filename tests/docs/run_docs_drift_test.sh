#!/usr/bin/env bash
# Runs docs_drift_test.py (the documents against the spexd and spexctl binaries as built) with
# Debian's Python, writing one JUnit case per check to $XML_OUTPUT_FILE for tests/run.sh's count.
set -euo pipefail
R="${RUNFILES_DIR:-${TEST_SRCDIR:-$PWD/..}}/spex"
exec /usr/bin/python3 "$R/tests/python/junit_runner.py" "$R/tests/docs/docs_drift_test.py"
