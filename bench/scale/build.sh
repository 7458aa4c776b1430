#!/usr/bin/env bash
# Builds the scale harness (bench/scale/scale_harness.cc, docs/scale.md) with SimGrid's smpicxx
# from spex's own sources, unmodified: the MPI collective, the control round and commit vote, the
# dense half all-reduce, the sparse all-gather, Ok-Topk, the wire format and the primitives they
# use. Bazel cannot build it (smpicxx replaces the compiler and MPI), hence this script.
#   bash bench/scale/build.sh [OUTDIR]   -> OUTDIR/scale_harness and OUTDIR/exchange_cost (the cost
#                                          model's command line); OUTDIR defaults to bench/scale/out
# Objects are rebuilt only when a source is newer. Needs libsimgrid-dev (deploy/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-bench/scale/out}"
mkdir -p "$out/obj"
command -v smpicxx >/dev/null || {
  echo "build.sh: smpicxx not found: install libsimgrid-dev (bash deploy/setup.sh)" >&2
  exit 1
}
srcs=(
  daemon/transport/collective.cc
  daemon/transport/mpi_collective.cc
  daemon/transport/agreement.cc
  daemon/engine/control_round.cc
  daemon/engine/wire.cc
  daemon/engine/half_exchange.cc
  daemon/engine/sparse_exchange.cc
  daemon/engine/oktopk_exchange.cc
  kernels/primitives.cc
  kernels/reference/reference_primitives.cc
  kernels/cpu/half_kernels.cc
  bench/scale/scale_harness.cc
)
flags=(-std=c++17 "${SCALE_OPT:--O1}" -I.)
objs=()
pids=()
for s in "${srcs[@]}"; do
  o="$out/obj/$(echo "$s" | tr / _).o"
  objs+=("$o")
  # A header change is not tracked: delete OUTDIR/obj after changing a header.
  if [[ ! -f "$o" || "$s" -nt "$o" ]]; then
    smpicxx "${flags[@]}" -c "$s" -o "$o" 2> >(grep -v "^$" >&2) &
    pids+=($!)
    if ((${#pids[@]} >= ${SCALE_JOBS:-2})); then
      wait "${pids[0]}"
      pids=("${pids[@]:1}")
    fi
  fi
done
for p in "${pids[@]}"; do wait "$p"; done
libs=(absl_status absl_statusor absl_strings absl_str_format_internal absl_cord absl_cord_internal
  absl_cordz_info absl_cordz_functions absl_cordz_handle absl_crc_cord_state absl_int128
  absl_raw_logging_internal absl_strings_internal absl_throw_delegate absl_base absl_spinlock_wait
  absl_synchronization absl_time absl_time_zone absl_stacktrace absl_symbolize absl_debugging_internal
  absl_demangle_internal absl_malloc_internal absl_graphcycles_internal absl_exponential_biased
  absl_cordz_sample_token absl_strerror hwy)
link=()
for l in "${libs[@]}"; do
  if [[ -e "/usr/lib/x86_64-linux-gnu/lib$l.so" || -e "/usr/lib/lib$l.so" ]]; then link+=("-l$l"); fi
done
# Relinked only when an object is newer: a simulation running the harness must not see it
# rewritten under it.
relink=0
[[ -f "$out/scale_harness" ]] || relink=1
for o in "${objs[@]}"; do [[ "$o" -nt "$out/scale_harness" ]] && relink=1; done
if ((relink)); then
  smpicxx "${flags[@]}" -o "$out/scale_harness.tmp" "${objs[@]}" "${link[@]}"
  mv -f "$out/scale_harness.tmp" "$out/scale_harness"
fi
# The cost model's command-line front (plain g++: it makes no MPI call).
if [[ ! -f "$out/exchange_cost" || daemon/engine/exchange_cost.cc -nt "$out/exchange_cost" ||
  daemon/engine/exchange_cost.h -nt "$out/exchange_cost" ||
  bench/scale/exchange_cost_main.cc -nt "$out/exchange_cost" ]]; then
  g++ -std=c++17 -O1 -I. -o "$out/exchange_cost.tmp" daemon/engine/exchange_cost.cc \
    bench/scale/exchange_cost_main.cc -labsl_status -labsl_strings -labsl_int128 \
    -labsl_raw_logging_internal -labsl_throw_delegate -labsl_str_format_internal -labsl_cord \
    -labsl_cord_internal -labsl_cordz_info -labsl_cordz_functions -labsl_cordz_handle \
    -labsl_synchronization -labsl_time -labsl_time_zone -labsl_base -labsl_spinlock_wait \
    -labsl_strerror -labsl_stacktrace -labsl_symbolize -labsl_debugging_internal \
    -labsl_demangle_internal -labsl_malloc_internal
  mv -f "$out/exchange_cost.tmp" "$out/exchange_cost"
fi
echo "build.sh: $out/scale_harness $out/exchange_cost"
