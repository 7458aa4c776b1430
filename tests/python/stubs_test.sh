#!/usr/bin/env bash
# The Python package ships its generated gRPC stubs (client/python/spex/proto/spex_pb2.py and
# spex_pb2_grpc.py) so that `pip install client/python` needs neither protoc nor the gRPC plugin.
# This test regenerates them from proto/spex.proto with Debian's protoc and grpc_python_plugin
# and fails, naming the command that fixes it, while the shipped copies differ.
set -euo pipefail
R="${RUNFILES_DIR:-${TEST_SRCDIR:-$PWD/..}}/spex"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
rm -rf "$TMP/src"
mkdir -p "$TMP/src/client" "$TMP/src/proto"
cp -rL "$R/client/python" "$TMP/src/client/python"
cp -L "$R/proto/spex.proto" "$TMP/src/proto/spex.proto"
chmod -R u+w "$TMP/src"
mkdir -p "$TMP/shipped"
cp "$TMP/src/client/python/spex/proto/"spex_pb2*.py "$TMP/shipped/"
(cd "$TMP/src/client/python" && /usr/bin/python3 setup.py -q stubs >/dev/null)
status=0
for f in spex_pb2.py spex_pb2_grpc.py; do
  if ! diff -q "$TMP/shipped/$f" "$TMP/src/client/python/spex/proto/$f" >/dev/null; then
    echo "client/python/spex/proto/$f differs from what protoc makes of proto/spex.proto:"
    diff "$TMP/shipped/$f" "$TMP/src/client/python/spex/proto/$f" | head -20
    status=1
  fi
done
if [ $status != 0 ]; then
  echo "FAILED: regenerate the stubs: /usr/bin/python3 client/python/setup.py stubs (from the repository root)"
  exit 1
fi
echo "stubs_test: the shipped stubs match proto/spex.proto"
