#!/usr/bin/env bash
# One run on a lent GPU machine (issue 33 item 4), within about 10 minutes, from a bundle built
# beforehand here (tests/cuda/gpu_bundle.sh pack, with //bench:sparse_exchange_trainer and
# //bench:device_step_bench): names the machine (GPUs, driver, CPU model, cores, memory) in
# machine.txt, then runs tests/cuda/gpu_check.sh through the bundle twice under timeouts: first the
# GPU parts (a) the checks of gpu_check.sh as before, (b) the 25,557,032-float step on GPU and CPU
# with the engine's phases (spexctl stats per run), then the GPU step's own phases (sum, select,
# compact, copy-out, exchange, copy-in, residual; bench/device_step_bench) with each compressor's
# ratio to the dense local reduce and issue 33's goal met or not, printed at the end and kept in
# device_step.{json,csv,txt}, (c) the multi-GPU tests and runs on however many GPUs
# the machine has; then (d) `bench16` (16 cores or more: the loopback main job, the dense
# fallback on 4 emulated hosts, the merge benchmark with A/A twins) with what time is left.
# Everything goes to OUT_DIR (default bench/results/gpu_<gpu>_<date>), ready to commit.
#   bash tests/cuda/gpu_lent_run.sh BUNDLE [OUT_DIR] [BUDGET_S (default 570)]
set -uo pipefail
bundle=${1:?usage: gpu_lent_run.sh BUNDLE [OUT_DIR] [BUDGET_S]}
here=$(cd "$(dirname "$0")/../.." && pwd)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 |
  tr 'A-Z' 'a-z' | tr -c 'a-z0-9\n' '_' | sed 's/nvidia_//; s/_*$//')
out=${2:-$here/bench/results/gpu_${gpu:-none}_$(date -u +%Y%m%d)}
budget=${3:-570}
mkdir -p "$out"
start=$(date +%s)
{
  echo "date: $(date -u +%FT%TZ)"
  echo "gpus: $(nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1 | tr '\n' ';')"
  echo "peer matrix:"; nvidia-smi topo -m 2>&1 | head -20
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) x $(nproc) cores"
  echo "memory: $(free -g | awk '/Mem:/{print $2}') GiB"
  echo "kernel: $(uname -r)"
} >"$out/machine.txt"
cat "$out/machine.txt"
left() { echo $((budget - ($(date +%s) - start))); }
SPEX_GPU_CHECKS="tests e2e python timing multi" timeout $(($(left) * 6 / 10)) \
  bash "$here/tests/cuda/gpu_bundle.sh" run "$bundle" "$out" 2>&1 | tee "$out/gpu_check.txt"
t=$(left)
if [ "$t" -gt 60 ]; then
  SPEX_GPU_CHECKS="bench16" SPEX_TREE="$here" timeout $((t - 10)) \
    bash "$here/tests/cuda/gpu_bundle.sh" run "$bundle" "$out" 2>&1 | tee "$out/bench16.txt"
else
  echo "gpu_lent_run: no time left for bench16" | tee "$out/bench16.txt"
fi
# Part (b)'s figures again at the end, where a short log shows them.
if [ -f "$out/device_step.txt" ]; then
  echo "part (b): the sparse step on the GPU, phase by phase (ms), ratio to the dense local reduce"
  cat "$out/device_step.txt"
  grep '^goal ' "$out/gpu_check.txt" || true
fi
echo "gpu_lent_run: $(($(date +%s) - start)) s; outputs in $out"
