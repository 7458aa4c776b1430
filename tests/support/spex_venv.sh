# Installs the spex Python client the way users install it (sourced, not run):
#   install_spex_venv R DIR   client/python and proto/spex.proto (and deploy/'s emulated-cluster
#                             script, when present) copied from the runfiles root R into DIR/src,
#                             pip-installed offline into DIR/venv over Debian's Python
#                             (--system-site-packages: torch, numpy, grpcio); 1 on failure with
#                             pip's log printed.
install_spex_venv() {
  local r=$1 dir=$2
  rm -rf "$dir/src" "$dir/venv"
  mkdir -p "$dir/src/client" "$dir/src/proto"
  cp -rL "$r/client/python" "$dir/src/client/python"
  cp -L "$r/proto/spex.proto" "$dir/src/proto/spex.proto"
  # The emulated-cluster script and its delayer, when the test has them, ship inside the package
  # (setup.py copies them from ../../deploy), as in an install from a checkout.
  if [ -f "$r/deploy/emulated_cluster.sh" ]; then
    mkdir -p "$dir/src/deploy/emulated"
    cp -L "$r/deploy/emulated_cluster.sh" "$dir/src/deploy/emulated_cluster.sh"
    cp -L "$r/deploy/emulated/nfq_delay.c" "$dir/src/deploy/emulated/nfq_delay.c"
  fi
  /usr/bin/python3 -m venv --system-site-packages "$dir/venv"
  # No protoc and no gRPC plugin at install time: the package ships its generated stubs.
  if ! PROTOC=/nonexistent/protoc GRPC_PYTHON_PLUGIN=/nonexistent/grpc_python_plugin \
    "$dir/venv/bin/pip" install -q --no-build-isolation --no-deps "$dir/src/client/python" >"$dir/pip.log" 2>&1; then
    echo "pip install of client/python failed:"; cat "$dir/pip.log"; return 1
  fi
}
