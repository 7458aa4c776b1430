#!/usr/bin/env bash
# The main job: real training through spex against plain PyTorch DDP, on an emulated cluster.
# Builds spexd, installs the spex Python package (client/python) into .venv (Debian's Python,
# system site packages), then runs deploy/train_digits.py: 2 emulated hosts (network namespaces on
# a bridge, 1 Gbit/s each way, a core each; deploy/emulated_cluster.sh) x 2 DDP trainers each
# train a 10.5M-parameter MLP on scikit-learn's digits five ways -- DDP with its own gloo
# all-reduce, DDP with PyTorch's fp16_compress_hook and PowerSGD hook (rank 1), spex dense, spex
# micro at density 0.1 (docs/benchmarks.md, time to target) -- printing one line per epoch (loss,
# accuracy, step and exchange time, achieved density) and a table (time per step, time to 95%
# test accuracy, final accuracy, speed-up over DDP). CSVs, summary.json and a PNG plot (accuracy
# against wall-clock time) go to bench/results/train_digits/ (or --results DIR). About 5 minutes
# on 2 cores. --model lstm trains a word-level LSTM language model on Debian's fortunes text,
# --model cnn a convolutional network on Fashion-MNIST (Debian's dataset-fashion-mnist) instead.
# train_digits.py is the program; its parts (flags, runs, models, hooks, training, launcher,
# report) are the package deploy/mainjob/. Needs root (network namespaces); --network=loopback
# runs on this machine's loopback, where each node's daemon and trainers get their own core(s)
# when the processes outnumber the cores (--pin auto|node|none; spex.cluster.LocalCluster(pin=...)).
#
#   bash deploy/main_job.sh [--hosts 4] [--rate 100mbit] [--latency-us 500] [--network loopback]
#       [--runs gloo,fp16,bf16,powersgd:RANK,dense,micro:0.01,topk:0.01] [--epochs N] [--hidden N]
#       [--target-acc 95] [--model mlp|lstm|cnn] [--steps-per-epoch N]
#       [--pin auto|node|none]
#   (--param KEY=VALUE: compressor parameters; --spexd-arg=FLAG, repeatable, replaces the default
#   spexd flags, e.g. to try the daemon's --dense_fallback=auto probe)
# $SPEXD: use this spexd binary instead of building one.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh >/dev/null
if [ -n "${SPEXD:-}" ]; then  # a spexd built elsewhere
  [ -x "$SPEXD" ] || { echo "main_job: SPEXD=$SPEXD is not an executable" >&2; exit 1; }
else
  bazel build -c opt //daemon:spexd 2>&1 | grep -E "ERROR|error:" || true
  SPEXD="$(bazel info -c opt bazel-bin 2>/dev/null)/daemon/spexd"
  [ -x "$SPEXD" ] || { echo "main_job: spexd did not build (bazel build //daemon:spexd)" >&2; exit 1; }
fi
VENV=.venv
if [ ! -x "$VENV/bin/python" ]; then
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
fi
# Reinstall only when the package sources or the proto changed.
STAMP=$(cat client/python/setup.py client/python/spex/*.py client/python/spex/*.c proto/spex.proto | sha1sum | cut -c1-16)
if [ "$(cat "$VENV/.spex-stamp" 2>/dev/null)" != "$STAMP" ]; then
  "$VENV/bin/pip" install -q --no-build-isolation --no-deps --force-reinstall client/python
  echo "$STAMP" >"$VENV/.spex-stamp"
fi
exec "$VENV/bin/python" deploy/train_digits.py --spexd "$SPEXD" "$@"
