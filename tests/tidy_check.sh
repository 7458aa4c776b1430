#!/usr/bin/env bash
# Runs clang-tidy (.clang-tidy at the root) over the C++ sources of kernels/, daemon/ and client/
# with the compile commands of the Bazel build: Bazel 4.2.3 has no compile_commands.json
# extractor, so this builds the targets (for generated headers such as the .pb.h files), asks
# `bazel aquery` for their CppCompile actions and writes compile_commands.json from them under
# bazel-out's execution root. Fails listing the findings. Usage:
#   bash tests/tidy_check.sh [FILE.cc ...]   (default: every .cc under kernels/ daemon/ client/)
# Not part of tests/run.sh (see docs/testing.md, "Format and lint"): it takes minutes on 2 cores.
set -uo pipefail
cd "$(dirname "$0")/.."
command -v clang-tidy >/dev/null || { echo "tidy check: clang-tidy not installed (bash deploy/setup.sh)"; exit 1; }
targets="//kernels/... + //daemon/... + //client/..."
jobs="${SPEX_JOBS:-2}"
bazel build --jobs="$jobs" -- //kernels/... //daemon/... //client/... >/dev/null 2>&1 ||
  { echo "tidy check: the build failed (bazel build //kernels/... //daemon/... //client/...)"; exit 1; }
execroot=$(bazel info execution_root 2>/dev/null)
db_dir=$(mktemp -d)
trap 'rm -rf "$db_dir"' EXIT
bazel aquery "mnemonic(\"CppCompile\", $targets)" --output=jsonproto 2>/dev/null > "$db_dir/aquery.json" ||
  { echo "tidy check: bazel aquery failed"; exit 1; }
/usr/bin/python3 - "$db_dir" "$execroot" "$PWD" <<'PY'
import json, os, sys
db_dir, execroot, src_root = sys.argv[1:]
actions = json.load(open(os.path.join(db_dir, "aquery.json"))).get("actions", [])
commands, seen = [], set()
for a in actions:
    args = a["arguments"]
    src = args[args.index("-c") + 1]
    if src in seen or not src.startswith(("kernels/", "daemon/", "client/")):
        continue
    seen.add(src)
    # gcc-only flags clang does not know.
    args = [x for x in args if x not in ("-fno-canonical-system-headers",)]
    commands.append({"directory": execroot, "file": os.path.join(src_root, src), "arguments": args})
json.dump(commands, open(os.path.join(db_dir, "compile_commands.json"), "w"))
with open(os.path.join(db_dir, "files"), "w") as f:
    f.write("".join(sorted(src + "\n" for src in seen)))
PY
if [ "$#" -gt 0 ]; then
  files=("$@")
else  # the sources this configuration compiles (not kernels/cuda's GPU files, say)
  mapfile -t files < "$db_dir/files"
fi
log="$db_dir/tidy.log"
printf '%s\n' "${files[@]}" |
  xargs -P "$jobs" -n 4 clang-tidy -p "$db_dir" --config-file="$PWD/.clang-tidy" --quiet \
    2>/dev/null > "$log"
if grep -q "error:\|warning:" "$log"; then
  echo "tidy check: findings (.clang-tidy):"
  grep -A3 "error:\|warning:" "$log"
  exit 1
fi
echo "tidy check: passed (${#files[@]} files)"
