#!/usr/bin/env bash
# The layering rule: kernels/ is below daemon/, so no file under kernels/ includes a daemon/
# header and no BUILD file under kernels/ names a //daemon target. Checks every file of kernels/
# (the :layering_sources filegroups of kernels/ and kernels/cuda/), after a self-check that the
# checker does flag a planted include and a planted dependency (so the test can fail).
set -uo pipefail
R="${RUNFILES_DIR:-${TEST_SRCDIR:-$PWD/..}}/spex"

# violations DIR: prints every include of a daemon/ header in C++/CUDA sources and every //daemon
# label in BUILD/.bzl files (comment lines ignored), one "file:line: text" each.
violations() {
  grep -RnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]daemon/' \
    --include='*.h' --include='*.cc' --include='*.cu' --include='*.cuh' --include='*.inc' "$1"
  grep -RnE '"(@[A-Za-z0-9_]*)?//daemon([:/"])' \
    --include='BUILD' --include='BUILD.bazel' --include='*.bzl' "$1" |
    grep -vE '^[^:]*:[0-9]+:[[:space:]]*#'
  return 0
}

fail=0
# Self-check: a planted include and a planted dependency are found, comments are not.
plant=$(mktemp -d)
trap 'rm -rf "$plant"' EXIT
mkdir -p "$plant/sub"
printf '// from daemon/util: not an include\n#include "daemon/util/log.h"\n' >"$plant/sub/bad.cc"
printf '#include "kernels/primitives.h"\n// #include of daemon/ is forbidden\n' >"$plant/good.h"
printf '# "//daemon:util" in a comment\ncc_library(name = "x", deps = ["//daemon:util"])\n' \
  >"$plant/sub/BUILD"
found=$(violations "$plant")
if [ "$(printf '%s\n' "$found" | grep -c .)" != 2 ] ||
  ! grep -q 'bad.cc:2:' <<<"$found" || ! grep -q 'BUILD:2:' <<<"$found"; then
  echo "FAIL: the checker did not find exactly the two planted violations; it found:"
  printf '%s\n' "$found"
  fail=1
fi

# The real tree: the filegroups must have brought kernels/ and kernels/cuda/ (a check over an
# empty directory would pass vacuously).
for f in kernels/BUILD kernels/primitives.cc kernels/compressors/device_scratch.cc \
  kernels/cuda/BUILD kernels/cuda/cuda_primitives.cc; do
  [ -e "$R/$f" ] || { echo "FAIL: $f is not in the test's runfiles (kernels:layering_sources)"; fail=1; }
done
found=$(violations "$R/kernels")
if [ -n "$found" ]; then
  echo "FAIL: kernels/ depends on daemon/ (move what both need under kernels/, e.g. kernels/base):"
  printf '%s\n' "${found//$R\//}"
  fail=1
fi
[ $fail = 0 ] && echo "ok: $(find -L "$R/kernels" -type f | wc -l) files under kernels/, none includes or depends on daemon/"
exit $fail
