#!/usr/bin/env bash
# A C++-only demo (README, Development): a local spex cluster on this machine. Starts N spexd under mpirun
# (one per emulated node, sockets in a private directory), then L C++ trainer processes per
# node (client/spex_trainer) that exchange synthetic gradient buckets and print per-step
# timings; finally shows `spexctl stats` of node 0 and stops the daemons with SIGTERM.
#
#   bash deploy/local_cluster.sh [--nodes N] [--trainers L] [--steps S] [--buckets a,b,c]
#                                [--mode doorbell|rpc|alternate] [--compressor NAME] [--verify]
set -euo pipefail
cd "$(dirname "$0")/.."
NODES=2 TRAINERS=2 STEPS=10 BUCKETS=4194304,4194304,1048576 MODE=doorbell COMPRESSOR=dense VERIFY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) NODES=$2; shift 2 ;;
    --trainers) TRAINERS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --buckets) BUCKETS=$2; shift 2 ;;
    --mode) MODE=$2; shift 2 ;;
    --compressor) COMPRESSOR=$2; shift 2 ;;
    --verify) VERIFY=--verify; shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "local_cluster.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
bash deploy/setup.sh >/dev/null
bazel build -c opt //daemon:spexd //client:spex_trainer //client:spexctl 2>&1 | grep -E "ERROR|error:" || true
BIN=$(bazel info -c opt bazel-bin 2>/dev/null)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
DIR=$(mktemp -d /tmp/spex-local.XXXXXX)
echo "spex local cluster: $NODES nodes x $TRAINERS trainers, buckets $BUCKETS, compressor $COMPRESSOR, sockets in $DIR"
mpirun -np "$NODES" "$BIN/daemon/spexd" --socket="$DIR/node{rank}.sock" --local_trainers="$TRAINERS" \
  --compressor="$COMPRESSOR" >"$DIR/spexd.log" 2>&1 &
MPI=$!
cleanup() { kill -TERM $MPI 2>/dev/null || true; wait $MPI 2>/dev/null || true; }
trap cleanup EXIT
for _ in $(seq 300); do
  [ "$(ls "$DIR"/node*.sock 2>/dev/null | wc -l)" -ge "$NODES" ] && break
  kill -0 $MPI 2>/dev/null || { cat "$DIR/spexd.log"; exit 1; }
  sleep 0.1
done
PIDS=()
for n in $(seq 0 $((NODES - 1))); do
  for l in $(seq 0 $((TRAINERS - 1))); do
    "$BIN/client/spex_trainer" --socket="$DIR/node$n.sock" --local_rank="$l" --local_size="$TRAINERS" \
      --buckets="$BUCKETS" --steps="$STEPS" --mode="$MODE" $VERIFY --csv="$DIR/steps.$n.$l.csv" &
    PIDS+=($!)
  done
done
rc=0
for p in "${PIDS[@]}"; do wait "$p" || rc=1; done
echo "--- spexctl stats (node 0)"
"$BIN/client/spexctl" --socket="$DIR/node0.sock" stats
cleanup
trap - EXIT
echo "--- per-step CSV files: $DIR/steps.*.csv; daemon log: $DIR/spexd.log"
exit $rc
