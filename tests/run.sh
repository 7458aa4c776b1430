#!/usr/bin/env bash
# The test command of README.md: installs what the project needs, builds everything (also the
# CUDA configuration, compile and link only), runs every test, and ends with one line
# "N passed, N failed" counting individual test cases (GoogleTest cases, and one per shell or
# Python test target; a target that failed to build counts as one failure; skipped cases,
# such as GPU kernel tests on a machine without a GPU, are listed but not counted).
# Exits non-zero when anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh

BAZEL=(bazel)
TEST_FLAGS=(--jobs="${SPEX_JOBS:-2}" --keep_going)
extra_pass=0; extra_fail=0

echo "== build (default configuration)"
"${BAZEL[@]}" build "${TEST_FLAGS[@]}" //... || { echo "default build failed"; extra_fail=$((extra_fail + 1)); }

if [ -d kernels/cuda ] && grep -q "spex_cuda" .bazelrc && ls kernels/cuda/*.cu >/dev/null 2>&1; then
  echo "== build --config=cuda (compile and link only; no GPU here)"
  if "${BAZEL[@]}" build --config=cuda "${TEST_FLAGS[@]}" //kernels/... //daemon/... //tests/...; then
    extra_pass=$((extra_pass + 1)); echo "cuda build: passed"
  else
    extra_fail=$((extra_fail + 1)); echo "cuda build: FAILED"
  fi
fi

echo "== format (tests/format_check.sh)"
if bash tests/format_check.sh; then
  extra_pass=$((extra_pass + 1))
else
  extra_fail=$((extra_fail + 1))
fi

echo "== tests"
"${BAZEL[@]}" test "${TEST_FLAGS[@]}" //tests/... 2>&1 | tail -n 60

targets=$("${BAZEL[@]}" query 'tests(//tests/...)' 2>/dev/null)
testlogs=$("${BAZEL[@]}" info bazel-testlogs 2>/dev/null)
/usr/bin/python3 - "$testlogs" "$extra_pass" "$extra_fail" $targets <<'PY'
import os, sys, xml.etree.ElementTree as ET
logs, extra_pass, extra_fail, targets = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
passed, failed = extra_pass, extra_fail
for t in targets:
    path = os.path.join(logs, t.lstrip("/").replace(":", "/"), "test.xml")
    if not os.path.exists(path):
        print(f"  {t}: no result (did not build or run)"); failed += 1; continue
    cases = ET.parse(path).getroot().iter("testcase")
    p = f = s = 0
    for c in cases:
        if c.find("failure") is not None or c.find("error") is not None: f += 1
        elif c.find("skipped") is not None or c.get("result") == "skipped" or c.get("status") == "notrun": s += 1
        else: p += 1
    if p + f + s == 0: f = 1
    passed += p; failed += f
    print(f"  {t}: {p} passed, {f} failed" + (f", {s} skipped (not counted)" if s else ""))
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
