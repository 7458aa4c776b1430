#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with Debian's clang (clang++, libclang-rt-14-dev)
# directly, outside Bazel (whose toolchain is g++): every spex source a target needs is compiled
# with -fsanitize=fuzzer-no-link,address,undefined into tests/fuzz/out/obj (incremental: an
# object is rebuilt when its source or any header it includes changed), the protos are
# generated with protoc + grpc_cpp_plugin, and the system libraries (abseil, gRPC, protobuf)
# are linked from Debian. Binaries: tests/fuzz/out/<target>.
#   bash tests/fuzz/build.sh [target ...]     (default: all of them)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=tests/fuzz/out
JOBS=${SPEX_JOBS:-2}
CXX=${CXX_FUZZ:-clang++}
SAN=(-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
CXXFLAGS=(-std=c++17 -O1 -g -I. -I"$OUT/gen" -Wno-unused-command-line-argument "${SAN[@]}")
mkdir -p "$OUT/obj" "$OUT/gen"

# --- sources per target
WIRE=(daemon/engine/wire.cc)
# kernels/cpu/half_kernels.cc: the half-precision passes (Highway, -lhwy) that the Primitives
# defaults, the engine's local reduce and the half dense exchange call.
KERNELS=(kernels/primitives.cc kernels/cpu/half_kernels.cc kernels/compressor.cc
  kernels/error_feedback.cc kernels/reference/reference_primitives.cc kernels/compressors/*.cc)
PROTO=("$OUT/gen/proto/spex.pb.cc" "$OUT/gen/proto/spex.grpc.pb.cc")
MEMORY=(daemon/memory/shm_buffer.cc daemon/memory/segment_guard.cc daemon/memory/segment_janitor.cc daemon/memory/trainer_memory.cc daemon/util/heap.cc daemon/util/log.cc
  proto/contract/socket_paths.cc)
CLIENT=(client/client.cc client/shm_mapping.cc client/ipc_handle_cache.cc
  proto/contract/cuda_ipc_descriptor.cc kernels/cuda/cuda_error.cc)
ENGINE=(daemon/engine/*.cc daemon/transport/agreement.cc daemon/transport/collective.cc
  daemon/transport/inproc_collective.cc daemon/merge/*.cc
  daemon/service/spex_service.cc daemon/service/peer_listener.cc)
# The service serves timelines (daemon/observe/timeline.cc); metrics (prometheus) are not needed.
[ -f daemon/observe/timeline.cc ] && ENGINE+=(daemon/observe/timeline.cc)
declare -A SRCS=(
  [wire_fuzz]="tests/fuzz/wire_fuzz.cc ${WIRE[*]}"
  [compressor_fuzz]="tests/fuzz/compressor_fuzz.cc ${KERNELS[*]}"
  [header_fuzz]="tests/fuzz/header_fuzz.cc ${CLIENT[*]} ${MEMORY[*]} ${PROTO[*]}"
  [requests_fuzz]="tests/fuzz/requests_fuzz.cc client/shm_mapping.cc ${ENGINE[*]} ${KERNELS[*]} ${MEMORY[*]} ${PROTO[*]}"
)
ALL=(wire_fuzz compressor_fuzz header_fuzz requests_fuzz)
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=("${ALL[@]}")
LIBS="$(pkg-config --libs grpc++ protobuf absl_status absl_statusor absl_strings absl_str_format \
  absl_synchronization absl_time absl_hash absl_raw_hash_set absl_random_random) -lhwy -lpthread -lrt"

# --- generated protos (only when spex.proto is newer)
if [ ! -f "$OUT/gen/proto/spex.grpc.pb.cc" ] || [ proto/spex.proto -nt "$OUT/gen/proto/spex.grpc.pb.cc" ]; then
  protoc -I. --cpp_out="$OUT/gen" --grpc_out="$OUT/gen" \
    --plugin=protoc-gen-grpc="$(command -v grpc_cpp_plugin)" proto/spex.proto
fi

# An object is stale when missing or older than its source or any prerequisite in its .d file.
stale() {
  local obj=$1 src=$2 dep=${1%.o}.d
  [ -f "$obj" ] && [ -f "$dep" ] || return 0
  [ "$src" -nt "$obj" ] && return 0
  local f
  for f in $(sed -e 's/^.*://' -e 's/\\$//' "$dep"); do
    [ -e "$f" ] || return 0
    [ "$f" -nt "$obj" ] && return 0
  done
  return 1
}
obj_of() { local s=${1#"$OUT"/gen/}; echo "$OUT/obj/${s%.cc}.o"; }

declare -A seen=()
todo=()
for t in "${TARGETS[@]}"; do
  [ -n "${SRCS[$t]:-}" ] || { echo "build.sh: unknown target $t (known: ${ALL[*]})" >&2; exit 2; }
  for s in ${SRCS[$t]}; do
    [ -n "${seen[$s]:-}" ] && continue
    seen[$s]=1
    stale "$(obj_of "$s")" "$s" && todo+=("$s")
  done
done
if ((${#todo[@]})); then
  echo "fuzz build: compiling ${#todo[@]} sources with $CXX"
  printf '%s\n' "${todo[@]}" | xargs -P "$JOBS" -I{} bash -c '
    s={}; o=$0; o=${s#'"$OUT"'/gen/}; o='"$OUT"'/obj/${o%.cc}.o; mkdir -p "$(dirname "$o")"
    extra=-fsanitize=fuzzer-no-link
    '"$CXX"' '"${CXXFLAGS[*]}"' $extra -MMD -MF "${o%.o}.d" -c "$s" -o "$o" || { rm -f "$o"; exit 1; }'
fi
for t in "${TARGETS[@]}"; do
  objs=()
  for s in ${SRCS[$t]}; do objs+=("$(obj_of "$s")"); done
  newest=$(ls -t "${objs[@]}" "$OUT/$t" 2>/dev/null | head -1 || true)
  if [ "$newest" != "$OUT/$t" ]; then
    # shellcheck disable=SC2086
    "$CXX" "${SAN[@]}" -fsanitize=fuzzer "${objs[@]}" $LIBS -o "$OUT/$t"
    echo "fuzz build: $OUT/$t"
  fi
done
