#!/usr/bin/env bash
# The client holds only the client: nothing under client/ (the C++ client, spexctl, the
# synthetic trainer) includes a daemon/ header or names a //daemon target, and the
# trainer-daemon contract under proto/ (the gRPC service and proto/contract: the shared-segment
# layout, futex words, socket paths, CUDA IPC descriptor) includes neither daemon/ nor client/
# and depends on neither. Checks every file of those packages (their :layering_sources
# filegroups), after a self-check that the checker flags a planted include and dependency.
set -uo pipefail
R="${RUNFILES_DIR:-${TEST_SRCDIR:-$PWD/..}}/spex"

# violations DIR LAYERS: every include of a LAYERS/ header in C++ sources and every //LAYERS
# label in BUILD/.bzl files (comment lines ignored), one "file:line: text" each. LAYERS is an
# extended regex alternative, e.g. "daemon" or "daemon|client".
violations() {
  grep -RnE "^[[:space:]]*#[[:space:]]*include[[:space:]]*[<\"]($2)/" \
    --include='*.h' --include='*.cc' --include='*.cu' --include='*.cuh' --include='*.inc' "$1"
  grep -RnE "\"(@[A-Za-z0-9_]*)?//($2)([:/\"])" \
    --include='BUILD' --include='BUILD.bazel' --include='*.bzl' "$1" |
    grep -vE '^[^:]*:[0-9]+:[[:space:]]*#'
  return 0
}

fail=0
# Self-check: a planted include and a planted dependency are found, comments and other
# packages (//daemonic, //client_tools) are not.
plant=$(mktemp -d)
trap 'rm -rf "$plant"' EXIT
mkdir -p "$plant/sub"
printf '// from daemon/memory: not an include\n#include "daemon/memory/shm_buffer.h"\n' \
  >"$plant/sub/bad.cc"
printf '#include "proto/contract/layout.h"\n// #include of daemon/ is forbidden\n' >"$plant/good.h"
printf '# "//daemon:memory" in a comment\ncc_library(name = "x", deps = ["//daemon:memory"])\n' \
  >"$plant/sub/BUILD"
printf 'cc_library(name = "y", deps = ["//daemonic:x", "//client_tools:y"])\n' >"$plant/BUILD"
found=$(violations "$plant" 'daemon|client')
if [ "$(printf '%s\n' "$found" | grep -c .)" != 2 ] ||
  ! grep -q 'bad.cc:2:' <<<"$found" || ! grep -q 'sub/BUILD:2:' <<<"$found"; then
  echo "FAIL: the checker did not find exactly the two planted violations; it found:"
  printf '%s\n' "$found"
  fail=1
fi

# The real tree: the filegroups must have brought the packages (a check over an empty directory
# would pass vacuously).
for f in client/BUILD client/client.cc client/client.h proto/BUILD proto/contract/BUILD \
  proto/contract/layout.h proto/contract/socket_paths.cc; do
  [ -e "$R/$f" ] || { echo "FAIL: $f is not in the test's runfiles (:layering_sources)"; fail=1; }
done
found=$(violations "$R/client" 'daemon')
if [ -n "$found" ]; then
  echo "FAIL: client/ depends on daemon/ (what both sides need belongs in proto/contract;"
  echo "what only trainers need gets its own client-side piece under client/):"
  printf '%s\n' "${found//$R\//}"
  fail=1
fi
found=$(violations "$R/proto" 'daemon|client')
if [ -n "$found" ]; then
  echo "FAIL: the contract under proto/ depends on daemon/ or client/ (it is below both):"
  printf '%s\n' "${found//$R\//}"
  fail=1
fi
[ $fail = 0 ] && echo "ok: $(find -L "$R/client" "$R/proto" -type f | wc -l) files under client/ and proto/; client/ does not reach daemon/, proto/ reaches neither"
exit $fail
