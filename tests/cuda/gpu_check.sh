#!/usr/bin/env bash
# The GPU path on a machine WITH a GPU (none of this project's build and CI machines has one, so
# this is a program, not a test of the suite). Needs a --config=cuda build:
#   bazel build --config=cuda //tests/cuda/... //daemon:spexd //client:spex_trainer
#   bash tests/cuda/gpu_check.sh [BIN_DIR (default bazel-bin)] [OUT_DIR (default /tmp/spex-gpu)]
# Runs, each bounded by a timeout, and prints one PASS/FAIL line per check:
#  1. the CUDA test binaries (kernel comparisons against the reference, the compressors on the
#     CUDA primitives against the CPU primitives, CUDA IPC buffers, NCCL on one GPU, ...);
#  2. end to end: one spexd --device=cuda (MPI singleton: NCCL refuses two ranks on one GPU) and
#     two spex_trainer --device=cuda --verify, for dense and sparse compressors over both
#     signalling paths and overlapped Start/Wait;
#  3. the Python client's device buckets and the DDP hook on CUDA buckets (gpu_python_check.py),
#     when python3 imports torch (with CUDA) and spex; it includes bfloat16 and float16 device
#     buckets (half.cu's kernels, bit for bit against torch's rounding; cuda_primitives_test's
#     HalfPassesEqualKernelsHalf checks the same kernels against kernels/half.h in part 1);
#  4. a first timing: one 25,557,032-float bucket exchanged by spexd --device=cuda and by
#     spexd --device=cpu (all cores, --threads=0) on the same machine, dense and five compressors
#     at 0.01, p50 per step, and the engine's mean time per phase of each run (spexctl stats,
#     saved as OUT_DIR/<run>.stats.txt); then the sparse step on the GPU phase by phase
#     (bench/device_step_bench: sum, select, compact, copy-out, exchange, copy-in, residual for
#     micro, topk and exdyna, and each step's ratio to the dense local reduce of the same bucket
#     in the same run; OUT_DIR/device_step.{json,csv,txt}), with issue 33's goal for micro and
#     topk (<= 10x the dense local reduce and < 2 ms) printed as met or not;
#  5. several GPUs (`multi`; docs/design.md#multi-gpu): the fake-device tests of the multi-GPU
#     path, then, with G >= 2 GPUs, one spexd --device=cuda (every GPU: --devices left out) and
#     G spex_trainer --cuda_device=g --verify for dense, topk and micro, peer or staged as the
#     machine has it; on any GPU count, a trainer on GPU G (not served) must be refused naming
#     --devices;
#  6. `bench16` (only with 16 or more cores): the measurements 2 cores could not resolve, each
#     under its own timeout, outputs under OUT_DIR/bench16: the loopback main job with a core per
#     process (exchange p50/p90), --dense_fallback=auto against its forced twins on 4 emulated
#     hosts of 4 cores (needs network namespaces), and the merge benchmark with A/A twins. Needs
#     $SPEX_TREE (a spex source tree whose bench/ and deploy/ scripts run; default: this script's
#     tree) and, for the main job, torch and scikit-learn. Not run anywhere yet.
# $PYTHON (default python3) runs the Python part; $SPEX_GPU_CHECKS picks parts (default
# "tests e2e python timing multi"). Logs go to OUT_DIR; the last line is "gpu_check: N passed, M
# failed". tests/cuda/gpu_lent_run.sh runs every part once within a time budget.
set -uo pipefail
BIN=${1:-bazel-bin}
OUT=${2:-/tmp/spex-gpu}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_ess_singleton_isolated=1
PASS=0
FAIL=0
result() {  # name rc
  if [ "$2" = 0 ]; then PASS=$((PASS + 1)); echo "PASS $1"; else FAIL=$((FAIL + 1)); echo "FAIL $1 (rc $2)"; fi
}

CHECKS=" ${SPEX_GPU_CHECKS:-tests e2e python timing multi} "
want() { [[ "$CHECKS" == *" $1 "* ]]; }

# 1. Test binaries.
want tests && for t in cuda_primitives_test cuda_compressor_test cuda_ipc_buffer_test nccl_collective_test \
  device_test cuda_error_test client_device_test radix_top_k_test device_math_test \
  multi_device_test multi_device_client_test histogram_edge_test device_traffic_test half_device_test; do
  [ -x "$BIN/tests/cuda/$t" ] || { result "$t (not in $BIN)" 1; continue; }
  timeout 180 "$BIN/tests/cuda/$t" --gtest_brief=1 >"$OUT/$t.log" 2>&1
  rc=$?
  result "$t" $rc
  grep -E '^\[  (FAILED|SKIPPED) |^\[ *(PASSED|FAILED) *\]|worst' "$OUT/$t.log" | head -40
done

# 2./4. spexd and trainers. One daemon per run, stopped by process id.
SOCKDIR=$(mktemp -d /tmp/spexgpu.XXXXXX)
# The two local trainers of a run: `cpp_trainer` (spex_trainer, args passed on) or `py_trainer`.
cpp_trainer() {  # local-rank socket device trainer-args...
  local rank=$1 sock=$2 device=$3
  shift 3
  timeout 100 "$BIN/client/spex_trainer" --device="$device" --socket="$sock" --local_rank="$rank" \
    --local_size=2 --threads=1 --quiet "$@"
}
py_trainer() {  # local-rank socket device
  # shellcheck disable=SC2086  # $PYTHON may be a command with arguments
  timeout 120 ${PYTHON:-python3} "$(dirname "$0")/gpu_python_check.py" "$2" "$1" 29517
}
run_job() {  # name device trainer-function trainer-args...
  local name=$1 device=$2 trainer=$3
  shift 3
  local sock="$SOCKDIR/$name.sock"
  timeout 150 "$BIN/daemon/spexd" --device="$device" --local_trainers=2 --socket="$sock" \
    --dense_fallback=off --threads="${DTHREADS:-1}" >"$OUT/$name.spexd.log" 2>&1 &
  local dpid=$!
  for _ in $(seq 300); do
    [ -S "$sock" ] && break
    kill -0 $dpid 2>/dev/null || break
    sleep 0.1
  done
  "$trainer" 0 "$sock" "$device" "$@" >"$OUT/$name.t0.log" 2>&1 &
  local t0=$!
  "$trainer" 1 "$sock" "$device" "$@" >"$OUT/$name.t1.log" 2>&1
  local rc1=$?
  wait $t0
  local rc0=$?
  # The engine's mean time per phase of every bucket (the step's phases, item 4(b) of issue 33).
  [ -n "${STATS:-}" ] && timeout 10 "$BIN/client/spexctl" --socket="$sock" stats \
    >"$OUT/$name.stats.txt" 2>&1
  kill -TERM $dpid 2>/dev/null
  wait $dpid
  local rcd=$?
  local rc=$((rc0 != 0 || rc1 != 0 || rcd != 0))
  if [ -f "$OUT/$name.stats.txt" ]; then grep -E "phases|^ +[0-9]" "$OUT/$name.stats.txt" | head -3; fi
  result "$name (trainers $rc0/$rc1, spexd $rcd)" $rc
  tail -n 6 "$OUT/$name.t0.log" "$OUT/$name.t1.log"
  [ $rc != 0 ] && tail -15 "$OUT/$name.spexd.log"
  return 0
}
if want e2e; then
run_job e2e_dense_exact cuda cpp_trainer --buckets=1000,65536,1048576 --compressors=dense --steps=8 --verify
run_job e2e_topk_micro cuda cpp_trainer --buckets=1000,65536,1048576 --compressors=dense,topk,micro --steps=8 \
  --verify --density=0.01
run_job e2e_exact_rpc cuda cpp_trainer --buckets=65536,262144,1048576 --compressors=exdyna,randomk,cltk \
  --mode=alternate --steps=8 --verify --density=0.01
run_job e2e_more cuda cpp_trainer --buckets=131072,131072,131072,131072,131072 \
  --compressors=gtopk,topk_union,thresh,dgc,sage --mode=rpc --steps=6 --verify --density=0.01
# Thresholds from Moments sums may differ from the CPU oracle's in the last bits (the GPU sums
# in another order): gaussiank, redsync and sidco_e matched it on an H200; deft did not (one
# element of 262,144 at step 3), so deft runs without --verify (cuda_compressor_test bounds it).
run_job e2e_sums cuda cpp_trainer --buckets=262144,262144,262144 \
  --compressors=gaussiank,redsync,sidco_e --steps=6 --verify --density=0.01
run_job e2e_deft cuda cpp_trainer --buckets=262144 --compressors=deft --steps=6 --density=0.01 --inputs=gradient
run_job e2e_overlap cuda cpp_trainer --buckets=1000,65536,1048576 --compressors=dense,topk,micro --mode=overlap \
  --steps=8 --verify --density=0.01
fi

# The Python client and the DDP hook (needs torch with CUDA and the spex package importable).
if ! want python; then
  :
elif ${PYTHON:-python3} -c "import torch, spex; assert torch.cuda.is_available()" >"$OUT/python_import.log" 2>&1; then
  run_job python_client_ddp cuda py_trainer
else
  FAIL=$((FAIL + 1))
  echo "FAIL python: cannot import torch with CUDA and spex: $(tail -1 "$OUT/python_import.log")"
fi

want timing && for dev in cuda cpu; do
  for comp in dense micro topk exdyna sidco_e; do
    STATS=1 DTHREADS=0 run_job "e2e_time_${comp}_$dev" "$dev" cpp_trainer --buckets=25557032 --compressors=$comp --density=0.01 \
      --inputs=gradient --steps=20
  done
done
# The sparse step's phases on the GPU against the dense local reduce, one process, same run.
if want timing; then
  timeout 300 "$BIN/bench/device_step_bench" --device=cuda --compressors=micro,topk,exdyna \
    --steps=20 --json="$OUT/device_step.json" --csv="$OUT/device_step.csv" >"$OUT/device_step.txt" 2>&1
  rc=$?
  cat "$OUT/device_step.txt"
  result "device_step_bench (the sparse step's phases on the GPU)" $rc
  # Issue 33's goal: micro and topk at d = 0.01 within 10x of the dense local reduce, under 2 ms.
  awk '$1 == "micro" || $1 == "topk" {
         printf "goal %s: %.3f ms, %.2fx the dense local reduce: %s\n", $1, $2, $3,
                ($2 < 2 && $3 <= 10) ? "met" : "NOT met" }' "$OUT/device_step.txt"
fi
# 5. Several GPUs: one spexd for all of them, one trainer per GPU.
run_multi() {  # name gpus trainer-args...
  local name=$1 G=$2
  shift 2
  local sock="$SOCKDIR/$name.sock"
  timeout 150 "$BIN/daemon/spexd" --device=cuda --local_trainers="$G" --socket="$sock" \
    --dense_fallback=off --threads=1 >"$OUT/$name.spexd.log" 2>&1 &
  local dpid=$!
  for _ in $(seq 300); do
    [ -S "$sock" ] && break
    kill -0 $dpid 2>/dev/null || break
    sleep 0.1
  done
  local pids=() rc=0
  for g in $(seq 0 $((G - 1))); do
    timeout 100 "$BIN/client/spex_trainer" --device=cuda --cuda_device="$g" --socket="$sock" \
      --local_rank="$g" --local_size="$G" --threads=1 --quiet "$@" >"$OUT/$name.t$g.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  kill -TERM $dpid 2>/dev/null
  wait $dpid || rc=1
  result "$name ($G GPUs)" $rc
  grep -h -E "GPU|peer" "$OUT/$name.spexd.log" | head -3
  return 0
}
if want multi; then
  G=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  echo "multi: $G GPU(s)"
  if [ "${G:-0}" -ge 2 ]; then
    run_multi multi_dense_sparse "$G" --buckets=1000,65536,1048576 --compressors=dense,topk,micro \
      --steps=8 --verify --density=0.01
    run_multi multi_time_micro "$G" --buckets=25557032 --compressors=micro --density=0.01 \
      --inputs=gradient --steps=20
  fi
  # A trainer on a GPU the daemon was not given: refused, naming the flag.
  sock="$SOCKDIR/refuse.sock"
  timeout 60 "$BIN/daemon/spexd" --device=cuda --devices=0 --local_trainers=1 --socket="$sock" \
    >"$OUT/multi_refuse.spexd.log" 2>&1 &
  dpid=$!
  for _ in $(seq 300); do [ -S "$sock" ] && break; kill -0 $dpid 2>/dev/null || break; sleep 0.1; done
  timeout 30 "$BIN/client/spex_trainer" --device=cuda --cuda_device=1 --socket="$sock" \
    --local_rank=0 --local_size=1 --steps=1 --buckets=1000 >"$OUT/multi_refuse.t0.log" 2>&1
  trc=$?
  kill -TERM $dpid 2>/dev/null
  wait $dpid
  [ $trc != 0 ] && grep -q -- "--devices" "$OUT/multi_refuse.t0.log"
  result "multi_refuse (a trainer on GPU 1, spexd --devices=0)" $?
fi

# 6. What 2 cores could not resolve, on 16 or more.
if want bench16; then
  TREE=${SPEX_TREE:-$(cd "$(dirname "$0")/../.." && pwd)}
  B16="$OUT/bench16"
  mkdir -p "$B16"
  cores=$(nproc)
  if [ "$cores" -lt 16 ]; then
    echo "bench16: skipped ($cores cores)"
  else
    # The scripts find binaries under the tree's bazel-bin; point it at BIN when it has none.
    [ -e "$TREE/bazel-bin/daemon/spexd" ] || ln -sfn "$(cd "$BIN" && pwd)" "$TREE/bazel-bin"
    ( cd "$TREE" && timeout 200 ${PYTHON:-python3} deploy/train_digits.py --network loopback \
        --runs dense,micro:0.01 --pin auto --spexd "$BIN/daemon/spexd" --results "$B16/train_digits" \
        >"$B16/main_job_loopback.log" 2>&1 )
    result "bench16 main job on loopback, a core per process" $?
    grep -E "exch p50|dense|micro" "$B16/main_job_loopback.log" | tail -4
    ( cd "$TREE" && timeout 200 ${PYTHON:-python3} bench/network_bench.py --hosts 4 --rates 1gbit \
        --densities 0.01 --compressors topk,micro --spexd "$BIN/daemon/spexd" \
        --trainer "$BIN/bench/sparse_exchange_trainer" --out "$B16/network_auto" \
        >"$B16/network_auto.log" 2>&1 )
    result "bench16 --dense_fallback=auto against forced, 4 emulated hosts" $?
    tail -6 "$B16/network_auto.log"
    ( cd "$TREE" && timeout 240 ${PYTHON:-python3} bench/merge_bench.py --nodes 4 \
        --mergers none,fixed,omgs,rgmerge,rgmerge@aa,none@aa --steps 15 --skip_build \
        --spexd "$BIN/daemon/spexd" --out "$B16/merge" >"$B16/merge.log" 2>&1 )
    result "bench16 merge benchmark with A/A twins" $?
    grep -E "A/A|step_ms" "$B16/merge.log" | tail -8
  fi
fi

rm -rf "$SOCKDIR"
echo "gpu_check: $PASS passed, $FAIL failed"
