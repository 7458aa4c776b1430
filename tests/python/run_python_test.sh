#!/usr/bin/env bash
# Runs one Python test module of tests/python (argument: its path in the workspace) against the
# spex package installed the way users install it: client/python copied out of the runfiles,
# pip-installed offline into a fresh venv over Debian's Python (--system-site-packages for
# torch, numpy, grpcio). Results go to $XML_OUTPUT_FILE as JUnit XML, one case per test method,
# which tests/run.sh counts.
set -euo pipefail
R="${RUNFILES_DIR:-${TEST_SRCDIR:-$PWD/..}}/spex"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
SRC="$TMP/src"
rm -rf "$SRC" "$TMP/venv"
mkdir -p "$SRC/client" "$SRC/proto"
cp -rL "$R/client/python" "$SRC/client/python"
cp -L "$R/proto/spex.proto" "$SRC/proto/spex.proto"
/usr/bin/python3 -m venv --system-site-packages "$TMP/venv"
# No protoc and no gRPC plugin at install time: the package ships its generated stubs.
if ! PROTOC=/nonexistent/protoc GRPC_PYTHON_PLUGIN=/nonexistent/grpc_python_plugin \
  "$TMP/venv/bin/pip" install -q --no-build-isolation --no-deps "$SRC/client/python" >"$TMP/pip.log" 2>&1; then
  echo "pip install of client/python failed:"; cat "$TMP/pip.log"; exit 1
fi
export SPEXD="$R/daemon/spexd" SPEX_REPO="$R" PYTHONDONTWRITEBYTECODE=1
cd "$TMP"  # so that `import spex` finds the installed package, not a source tree
exec "$TMP/venv/bin/python" "$R/tests/python/junit_runner.py" "$R/$1"
