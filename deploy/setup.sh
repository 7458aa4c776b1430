#!/usr/bin/env bash
# Installs every Debian package spex needs to build, test and run. Idempotent: a second run
# checks the list and returns quickly. Used by both README commands and by .ci/run.
set -euo pipefail

PKGS=(
  # build
  bazel-bootstrap g++ pkg-config
  # format and lint (tests/format_check.sh, tests/tidy_check.sh)
  clang-format clang-tidy
  # fuzzing (tests/fuzz: clang++ with libFuzzer from compiler-rt); the sanitizer runtimes of
  # --config=asan/tsan (libasan8, libubsan1, libtsan2) come with g++
  clang libclang-rt-14-dev
  # control channel
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc libabsl-dev
  # transport
  libopenmpi-dev openmpi-bin
  # kernels
  libhwy-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
  # python client, torch hook, the main job
  python3-venv python3-pip python3-dev python3-numpy python3-grpcio python3-protobuf python3-torch
  python3-sklearn python3-matplotlib
  # the main job's language model (--model lstm): English text from the fortunes files
  fortunes
  # the main job's convolutional network (--model cnn): Fashion-MNIST images
  dataset-fashion-mnist
  # the main job's model: a real BLAS for torch (Debian's default libblas3 is the reference one)
  libopenblas0-pthread
  # emulated cluster (deploy/emulated_cluster.sh): tc/ip (iproute2), the latency delayer
  iproute2 iptables libnetfilter-queue-dev
  # SLURM launch example and its test (deploy/slurm, tests/integration/slurm_test.sh)
  slurm-wlm munge
  # metrics (spexd --metrics_address: prometheus-cpp's pull exposer) and promtool for its test
  prometheus-cpp-dev prometheus
  # systemd-analyze for the unit checks (deploy/systemd; not in a bare Debian 12 container)
  systemd
  # spexrun's ssh path, tested for real against sshd inside emulated hosts (tests/python/spexrun_test.py)
  openssh-server openssh-client
  # scale simulation (bench/scale: smpicxx, smpirun of SimGrid SMPI)
  libsimgrid-dev
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "setup: all ${#PKGS[@]} packages present"
# abseil's source for --config=tsan (ThreadSanitizer needs abseil compiled with it).
bash "$(dirname "$0")/fetch_abseil_source.sh" ||
  echo "setup: WARNING: abseil's source could not be fetched; the TSan tests of tests/run.sh will fail"
