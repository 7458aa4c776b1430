#!/usr/bin/env bash
# The test command of README.md: installs what the project needs, builds everything (also the
# CUDA configuration, compile and link only), runs every test, and ends with one line
# "N passed, N failed" counting individual test cases (GoogleTest cases, and one per shell or
# Python test target; a target that failed to build counts as one failure; skipped cases,
# such as GPU kernel tests on a machine without a GPU, are listed but not counted).
# The C++ unit and in-process tests run again under AddressSanitizer + UndefinedBehaviorSanitizer
# (--config=asan), each case counted as "<target> [asan]", and the in-process engine tests under ThreadSanitizer
# (--config=tsan), counted as "<target> [tsan]"; the libFuzzer targets of tests/fuzz run briefly
# (SPEX_FUZZ_SECONDS, 10 s each), one pass or failure per target.
# Exits non-zero when anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh

BAZEL=(bazel)
TEST_FLAGS=(--jobs="${SPEX_JOBS:-2}" --keep_going)
extra_pass=0; extra_fail=0

echo "== build (default configuration) [${SECONDS} s]"
"${BAZEL[@]}" build "${TEST_FLAGS[@]}" //... || { echo "default build failed"; extra_fail=$((extra_fail + 1)); }

echo "== format (tests/format_check.sh) [${SECONDS} s]"
if bash tests/format_check.sh; then
  extra_pass=$((extra_pass + 1))
else
  extra_fail=$((extra_fail + 1))
fi

echo "== tests [${SECONDS} s]"
"${BAZEL[@]}" test "${TEST_FLAGS[@]}" //tests/... 2>&1 | tail -n 60

# The CUDA configuration shares the default output tree (only targets that depend on
# //third_party:cuda_runtime differ), so it is built after the default tests have run: built
# before them, those targets would be compiled for CUDA and then compiled back.
if [ -d kernels/cuda ] && grep -q "spex_cuda" .bazelrc && ls kernels/cuda/*.cu >/dev/null 2>&1; then
  echo "== build --config=cuda (compile and link only; no GPU here) [${SECONDS} s]"
  if "${BAZEL[@]}" build --config=cuda "${TEST_FLAGS[@]}" //kernels/... //daemon/... //tests/...; then
    extra_pass=$((extra_pass + 1)); echo "cuda build: passed"
  else
    extra_fail=$((extra_fail + 1)); echo "cuda build: FAILED"
  fi
fi

# Sanitizers: own output trees (--platform_suffix in .bazelrc), so the default build stays.
# Which C++ tests run instrumented is chosen by tags in the BUILD files (docs/testing.md):
# ASan+UBSan runs every cc_test except those tagged "no_asan" (pure arithmetic whose kernels are
# also run instrumented by the engine tests and tests/fuzz's compressor_fuzz, and GPU-only cases
# that skip here); TSan runs the cc_tests tagged "tsan" (the in-process engine tests and the
# in-process collective: many threads, one process). The in-process collective's
# 1,048,576-element conformance cases are left out of both (about 100 s under ASan, minutes under
# TSan); they run in the default configuration, and the smaller sizes run the same code
# instrumented.
# Cases left out of both sanitizers (each still runs in the default configuration above): the
# in-process collective's 1,048,576-element cases, and under ASan the two longest cases of
# targets it instruments, whose code the same targets' shorter cases run instrumented: the
# histogram edge's two-level walk against the host walk (26 s under ASan) and the primitives'
# single-thread instances (27 s; the two-thread instances run the same kernels).
SANITIZER_FILTER='-*n1048576*:HistogramEdge.TwoLevelWalkEqualsTheHostWalk'
SANITIZER_FILTER+=':Threads/PrimitivesTest.*/1threads'
ASAN_TARGETS=$("${BAZEL[@]}" query 'kind(cc_test, tests(//tests/...)) except attr(tags, "\bno_asan\b", tests(//tests/...))' 2>/dev/null)
echo "== tests under ASan+UBSan (--config=asan) [${SECONDS} s]"
# shellcheck disable=SC2086
"${BAZEL[@]}" test --config=asan "${TEST_FLAGS[@]}" --test_arg=--gtest_filter="$SANITIZER_FILTER" \
  $ASAN_TARGETS 2>&1 | tail -n 40
# TSan: abseil compiled from Debian's source with the sanitizer (deploy/fetch_abseil_source.sh,
# run by setup.sh; third_party/absl_src.BUILD), so TSan sees absl::Mutex's synchronisation.
TSAN_TARGETS=$("${BAZEL[@]}" query 'attr(tags, "\btsan\b", kind(cc_test, tests(//tests/...)))' 2>/dev/null)
echo "== engine tests under TSan (--config=tsan) [${SECONDS} s]"
if [ -f /opt/spex/abseil-src/.spex-version ]; then
  # shellcheck disable=SC2086
  "${BAZEL[@]}" test --config=tsan "${TEST_FLAGS[@]}" --test_arg=--gtest_filter="$SANITIZER_FILTER" \
    $TSAN_TARGETS 2>&1 | tail -n 20
else
  echo "TSan: FAILED: abseil's source is missing from /opt/spex/abseil-src (deploy/fetch_abseil_source.sh)"
  extra_fail=$((extra_fail + 1))
fi
echo "== fuzz (tests/fuzz/run.sh, ${SPEX_FUZZ_SECONDS:-10} s per target) [${SECONDS} s]"
fuzz_log=$(mktemp)
bash tests/fuzz/run.sh 2>&1 | tee "$fuzz_log"
extra_pass=$((extra_pass + $(grep -c '^fuzz .*: passed' "$fuzz_log")))
extra_fail=$((extra_fail + $(grep -c '^fuzz .*: FAILED' "$fuzz_log")))
if ! grep -q '^fuzz ' "$fuzz_log"; then extra_fail=$((extra_fail + 1)); fi
rm -f "$fuzz_log"

echo "== counting results [${SECONDS} s]"
targets=$("${BAZEL[@]}" query 'tests(//tests/...)' 2>/dev/null)
testlogs=$("${BAZEL[@]}" info bazel-testlogs 2>/dev/null)
asan_logs=$("${BAZEL[@]}" info --config=asan bazel-testlogs 2>/dev/null)
tsan_logs=$("${BAZEL[@]}" info --config=tsan bazel-testlogs 2>/dev/null)
# Arguments: "@LOGS=LABEL" switches the testlogs directory (and the label added to names).
/usr/bin/python3 - "$extra_pass" "$extra_fail" "@$testlogs=" $targets "@$asan_logs=asan" \
  $ASAN_TARGETS "@$tsan_logs=tsan" $TSAN_TARGETS <<'PY'
import os, sys, xml.etree.ElementTree as ET
extra_pass, extra_fail, args = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
passed, failed = extra_pass, extra_fail
logs, label = "", ""
for t in args:
    if t.startswith("@"):
        logs, label = t[1:].rsplit("=", 1); continue
    path = os.path.join(logs, t.lstrip("/").replace(":", "/"), "test.xml")
    if label: t = f"{t} [{label}]"
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
