#!/usr/bin/env bash
# Fails (listing the files) when a tracked C++ or CUDA file is not formatted as .clang-format
# says (Google style, 100 columns). Fix with `clang-format -i FILE`. Run by tests/run.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "format check: clang-format not installed (bash deploy/setup.sh)"; exit 1; }
files=()
while IFS= read -r f; do
  [ -f "$f" ] && files+=("$f")  # skips files deleted in the working tree
done < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
# One clang-format run; each unformatted file is named in its "file:line:col: error:" lines.
mapfile -t bad < <(clang-format --dry-run -Werror "${files[@]}" 2>&1 |
                   sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: error: .*/\1/p' | sort -u)
if [ "${#bad[@]}" -gt 0 ]; then
  echo "format check: ${#bad[@]} file(s) not formatted with .clang-format:"
  printf '  %s\n' "${bad[@]}"
  echo "fix with: clang-format -i ${bad[*]}"
  exit 1
fi
echo "format check: passed"
