#!/usr/bin/env bash
# Runs function_length_test.py (no function under daemon/ over 100 lines; the scanner on a planted
# file) with Debian's Python, writing one JUnit case per check to $XML_OUTPUT_FILE for
# tests/run.sh's count.
set -euo pipefail
R="${RUNFILES_DIR:-${TEST_SRCDIR:-$PWD/..}}/spex"
exec /usr/bin/python3 "$R/tests/python/junit_runner.py" "$R/tests/lint/function_length_test.py"
