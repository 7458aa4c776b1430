#!/usr/bin/env bash
# Runs one Python test module of tests/python (argument: its path in the workspace) against the
# spex package installed the way users install it: client/python copied out of the runfiles,
# pip-installed offline into a venv over Debian's Python (--system-site-packages for torch,
# numpy, grpcio); the venv is made once per content of the package and shared between tests
# (shared_spex_venv in tests/support/spex_venv.sh). Results go to $XML_OUTPUT_FILE as JUnit
# XML, one case per test method, which tests/run.sh counts.
set -euo pipefail
R="${RUNFILES_DIR:-${TEST_SRCDIR:-$PWD/..}}/spex"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
source "$R/tests/support/spex_venv.sh"
shared_spex_venv "$R" "$TMP" || exit 1
export SPEXD="$R/daemon/spexd" SPEX_REPO="$R" PYTHONDONTWRITEBYTECODE=1
cd "$TMP"  # so that `import spex` finds the installed package, not a source tree
exec "$SPEX_VENV/bin/python" "$R/tests/python/junit_runner.py" "$R/$1"
