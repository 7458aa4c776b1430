#!/usr/bin/env bash
# Runs the libFuzzer targets of tests/fuzz (built by build.sh): each first replays its seed
# corpus (corpus/<target>) and the inputs that once crashed it (regressions/<target>), then
# fuzzes. One line per target, "fuzz <target>: passed (...)" or "fuzz <target>: FAILED (...)";
# exits non-zero when any failed. A crash leaves its input in $SPEX_FUZZ_WORK/<target>/
# (crash-*, leak-*, timeout-*, oom-*): add it to regressions/<target>/ with a unit test in
# fuzz_regression_test.cc once fixed.
#   bash tests/fuzz/run.sh                     short run: SPEX_FUZZ_SECONDS (10) per target
#   bash tests/fuzz/run.sh --long [N]          long run: N executions per target (1000000)
#   bash tests/fuzz/run.sh [--long N] TARGET..  only these targets
set -uo pipefail
cd "$(dirname "$0")/../.."
ALL=(wire_fuzz compressor_fuzz header_fuzz requests_fuzz)
SECS=${SPEX_FUZZ_SECONDS:-10}
RUNS=""
if [ "${1:-}" = "--long" ]; then
  shift
  RUNS=1000000
  if [[ "${1:-}" =~ ^[0-9]+$ ]]; then RUNS=$1; shift; fi
fi
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=("${ALL[@]}")
WORK=${SPEX_FUZZ_WORK:-$(mktemp -d /tmp/spex-fuzz.XXXXXX)}
mkdir -p "$WORK"

if ! bash tests/fuzz/build.sh "${TARGETS[@]}"; then
  for t in "${TARGETS[@]}"; do echo "fuzz $t: FAILED (did not build)"; done
  exit 1
fi

failed=0
for t in "${TARGETS[@]}"; do
  dir="$WORK/$t"
  mkdir -p "$dir/corpus"
  seeds=()
  for d in "tests/fuzz/corpus/$t" "tests/fuzz/regressions/$t"; do [ -d "$d" ] && seeds+=("$d"); done
  if [ -n "$RUNS" ]; then limit=(-runs="$RUNS"); else limit=(-max_total_time="$SECS"); fi
  start=$(date +%s)
  # New inputs go to the first corpus directory (the work copy), never into the tree.
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} \
    "tests/fuzz/out/$t" "${limit[@]}" -timeout=20 -rss_limit_mb=2560 -print_final_stats=1 \
    -artifact_prefix="$dir/" "$dir/corpus" "${seeds[@]}" >"$dir/log" 2>&1
  rc=$?
  secs=$(($(date +%s) - start))
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$dir/log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$dir/log" | tail -1)
  artifacts=$(ls "$dir" | grep -E '^(crash|leak|timeout|oom|slow-unit)-' || true)
  if [ $rc -eq 0 ] && [ -z "$(echo "$artifacts" | grep -v '^slow-unit' || true)" ]; then
    echo "fuzz $t: passed (${runs:-?} executions in ${secs}s, ${rate:-?}/s, ${cov:-cov ?})"
  else
    failed=$((failed + 1))
    echo "fuzz $t: FAILED (exit $rc after ${runs:-?} executions; log $dir/log; inputs: ${artifacts:-none})"
    grep -E 'ERROR|runtime error|SUMMARY|deadly signal|check failed|unexpected status' "$dir/log" |
      head -5 | sed 's/^/    /'
    # The first stack trace (the log lives in /tmp, which a CI machine does not keep).
    awk '/ERROR: |runtime error|check failed/{on=1} on&&/^ *#[0-9]+ /{print; if(++n==30) exit}' \
      "$dir/log" | sed 's/^/    /'
    # The crashing input itself, as hex, so it can be replayed from the CI log alone.
    for a in $artifacts; do
      case $a in crash-*|timeout-*|leak-*|oom-*) ;; *) continue ;; esac
      if [ "$(stat -c %s "$dir/$a")" -le 4096 ]; then
        echo "    input $a, hex (replay: python3 -c 'import sys; sys.stdout.buffer.write(" \
          "bytes.fromhex(sys.stdin.read()))' < hex > f && tests/fuzz/out/$t f):"
        od -An -v -tx1 "$dir/$a" | tr -d ' ' | sed 's/^/      /'
      fi
    done
  fi
done
# A passing run leaves nothing behind (its corpus and logs are in a directory this script made);
# a failing one keeps them for the inputs named above.
if [ $failed -eq 0 ] && [ -z "${SPEX_FUZZ_WORK:-}" ]; then rm -rf "$WORK"; fi
exit $((failed > 0))
