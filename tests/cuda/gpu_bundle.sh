#!/usr/bin/env bash
# Runs tests/cuda/gpu_check.sh on a GPU machine that has no build toolchain for spex: `pack`
# bundles this machine's --config=cuda build (binaries, Bazel's _solib_k8, the shared libraries
# they and OpenMPI's plugins need, OpenMPI and PMIx at their configured paths, the Python
# package's generated stubs); `run` on the GPU machine (as root: OpenMPI goes under /usr, never
# over an existing file) unpacks it and runs the checks. CUDA's runtime and NCCL come from the
# GPU machine, and so does Open MPI where the machine has an mpirun of its own (the bundle's
# OpenMPI is used only where it has none: mixing the two failed on Ubuntu 24.04, "undefined
# symbol: PMIx_Info_create"; that branch has not run on a GPU machine yet). What this was made
# for and ran on: kernels/cuda/README.md.
#   bazel build --config=cuda //tests/cuda/... //daemon:spexd //client:spex_trainer //client:spexctl \
#     //bench:sparse_exchange_trainer //bench:device_step_bench
#   bash tests/cuda/gpu_bundle.sh pack /tmp/spex-gpu.tar.gz [BAZEL_BIN]
#   (copy the tarball and this source tree over)
#   bash tests/cuda/gpu_bundle.sh run /tmp/spex-gpu.tar.gz OUT_DIR   # in the source tree
set -euo pipefail
cmd=${1:-}
case "$cmd" in
pack)
  out=${2:?usage: gpu_bundle.sh pack OUT.tar.gz [BAZEL_BIN]}
  B=${3:-bazel-out/k8-opt/bin}
  T=$(mktemp -d)
  trap 'rm -rf "$T"' EXIT
  mkdir -p "$T/bin/tests/cuda" "$T/bin/daemon" "$T/bin/client" "$T/libs" "$T/pb2"
  mkdir -p "$T/bin/bench"
  # device_step_bench: gpu_check.sh's timing part (the sparse step's phases, issue 33 item 3).
  bins="daemon/spexd client/spex_trainer client/spexctl bench/device_step_bench"
  for t in cuda_primitives_test cuda_compressor_test cuda_ipc_buffer_test nccl_collective_test \
    device_test cuda_error_test client_device_test radix_top_k_test device_math_test \
    multi_device_test multi_device_client_test histogram_edge_test device_traffic_test \
    half_device_test; do
    bins="$bins tests/cuda/$t"
  done
  for b in $bins; do
    [ -x "$B/$b" ] || { echo "gpu_bundle: $B/$b missing: build with --config=cuda first" >&2; exit 1; }
    cp -L "$B/$b" "$T/bin/$b"
  done
  # For gpu_check.sh's bench16 part (network_bench's trainer), when built.
  if [ -x "$B/bench/sparse_exchange_trainer" ]; then
    cp -L "$B/bench/sparse_exchange_trainer" "$T/bin/bench/"
    bins="$bins bench/sparse_exchange_trainer"
  fi
  cp -rL "$B/_solib_k8" "$T/bin/_solib_k8"
  plugins=$(ls /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so \
    /usr/lib/x86_64-linux-gnu/pmix2/lib/pmix/*.so 2>/dev/null || true)
  # Every library the binaries and plugins load, minus glibc, the C++ runtime and CUDA's own.
  { for b in $bins; do ldd "$B/$b"; done
    for p in $plugins /usr/bin/orterun /usr/bin/orted; do ldd "$p" 2>/dev/null || true; done; } |
    awk '/=> \//{print $3}' | sort -u |
    grep -v -E '/(libc|libm|libpthread|libdl|librt|libresolv|libutil|ld-linux-x86-64|libstdc\+\+|libgcc_s)\.so' |
    grep -v -E '^/usr/local/cuda|_solib' | while read -r l; do cp -L "$l" "$T/libs/"; done
  tar -cf "$T/ompi.tar" -C / usr/lib/x86_64-linux-gnu/openmpi usr/lib/x86_64-linux-gnu/pmix2 \
    usr/share/openmpi etc/openmpi usr/bin/orterun usr/bin/orted
  # The Python package's stubs, generated as its setup.py does (as spex/proto/spex.proto).
  mkdir -p "$T/protosrc/spex/proto"
  cp proto/spex.proto "$T/protosrc/spex/proto/"
  protoc -I"$T/protosrc" --python_out="$T/protosrc" --grpc_out="$T/protosrc" \
    --plugin=protoc-gen-grpc="$(command -v grpc_python_plugin)" spex/proto/spex.proto
  cp "$T"/protosrc/spex/proto/spex_pb2*.py "$T/pb2/"
  find "$T/bin" "$T/libs" -type f -exec strip --strip-debug {} + 2>/dev/null || true
  tar -C "$T" -czf "$out" bin libs pb2 ompi.tar
  ls -la "$out"
  ;;
run)
  bundle=${2:?usage: gpu_bundle.sh run BUNDLE OUT_DIR}
  outdir=${3:?usage: gpu_bundle.sh run BUNDLE OUT_DIR}
  here=$(cd "$(dirname "$0")/../.." && pwd)
  P=$(mktemp -d /tmp/spex-bundle.XXXXXX)
  trap 'rm -rf "$P"' EXIT
  tar -C "$P" -xzf "$bundle"
  if command -v mpirun >/dev/null 2>&1; then
    # This machine has an MPI of its own: use it whole (Open MPI 4.x keeps libmpi.so.40's ABI),
    # never the bundle's libraries beside its plugins (seen on Ubuntu 24.04: its own PMIx
    # plugin against the bundle's libraries, "undefined symbol: PMIx_Info_create").
    mkdir -p "$P/libs-mpi"
    for l in "$P"/libs/libmpi* "$P"/libs/libopen-* "$P"/libs/liboshmem* "$P"/libs/libpmix* \
      "$P"/libs/libhwloc* "$P"/libs/libevent* "$P"/libs/libmca_*; do
      [ -e "$l" ] && mv "$l" "$P/libs-mpi/"
    done
    echo "gpu_bundle: using this machine's $(command -v mpirun)"
  else
    tar -C / --skip-old-files -xf "$P/ompi.tar"
  fi
  nccl=$(find /usr /opt -name 'libnccl.so.2' 2>/dev/null | head -1)
  cudart=$(find /usr/local /usr/lib /opt -name 'libcudart.so.1[0-9]' 2>/dev/null | head -1)
  if [ -z "$nccl" ] || [ -z "$cudart" ]; then
    echo "gpu_bundle: need libnccl.so.2 and libcudart on this machine" >&2
    exit 1
  fi
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
  # The Python package: sources from the tree, stubs from the bundle, the C extension built here.
  mkdir -p "$P/py"
  cp -r "$here/client/python/spex" "$P/py/"
  cp "$P"/pb2/*.py "$P/py/spex/proto/"
  inc=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  ext=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  cc -O2 -shared -fPIC -I"$inc" "$here/client/python/spex/_native.c" -o "$P/py/spex/_native$ext" ||
    echo "gpu_bundle: could not build spex._native (the Python check will fail)"
  # Python runs without the bundle's libraries (its own torch/grpcio need the host's).
  PYTHONPATH="$P/py" PYTHON="env -u LD_LIBRARY_PATH python3" \
    LD_LIBRARY_PATH="$P/libs:$(dirname "$cudart"):$(dirname "$nccl")" \
    bash "$here/tests/cuda/gpu_check.sh" "$P/bin" "$outdir"
  ;;
*)
  echo "usage: gpu_bundle.sh pack OUT.tar.gz [BAZEL_BIN] | run BUNDLE OUT_DIR" >&2
  exit 2
  ;;
esac
