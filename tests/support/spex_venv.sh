# Installs the spex Python client the way users install it (sourced, not run):
#   install_spex_venv R DIR   client/python and proto/spex.proto (and deploy/'s emulated-cluster
#                             script, when present) copied from the runfiles root R into DIR/src,
#                             pip-installed offline into DIR/venv over Debian's Python
#                             (--system-site-packages: torch, numpy, grpcio); 1 on failure with
#                             pip's log printed.
#   shared_spex_venv R DIR    the same install, made once per content and shared: the sources are
#                             copied into DIR/src, and a venv installed from exactly those files
#                             (keyed by their SHA-256, the Python version and this file) is kept
#                             under $SPEX_TEST_VENV_CACHE (default /tmp/spex-test-venvs) for the
#                             next test; sets SPEX_VENV to it. Falls back to install_spex_venv
#                             into DIR (SPEX_VENV=DIR/venv) where the cache cannot be written (a
#                             sandbox). Saves the ~5 s of venv + pip per Python test.
_spex_venv_stage() {
  local r=$1 dir=$2
  rm -rf "$dir/src"
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
}

# Creates DIR/venv from the sources staged in DIR/src.
_spex_venv_install() {
  local dir=$1
  rm -rf "$dir/venv"
  /usr/bin/python3 -m venv --system-site-packages "$dir/venv"
  # No protoc and no gRPC plugin at install time: the package ships its generated stubs.
  if ! PROTOC=/nonexistent/protoc GRPC_PYTHON_PLUGIN=/nonexistent/grpc_python_plugin \
    "$dir/venv/bin/pip" install -q --no-build-isolation --no-deps "$dir/src/client/python" >"$dir/pip.log" 2>&1; then
    echo "pip install of client/python failed:"; cat "$dir/pip.log"; return 1
  fi
}

install_spex_venv() {
  _spex_venv_stage "$1" "$2" && _spex_venv_install "$2"
}

shared_spex_venv() {
  local r=$1 dir=$2 cache=${SPEX_TEST_VENV_CACHE:-/tmp/spex-test-venvs} key entry
  _spex_venv_stage "$r" "$dir" || return 1
  key=$( { (cd "$dir/src" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
           /usr/bin/python3 -VV; cat "${BASH_SOURCE[0]}"; } | sha256sum | cut -c1-24)
  entry="$cache/$key"
  if ! mkdir -p "$cache" 2>/dev/null || ! { exec 9>>"$cache/lock"; } 2>/dev/null; then
    _spex_venv_install "$dir" || return 1
    SPEX_VENV="$dir/venv"; return 0
  fi
  flock 9
  if [ ! -f "$entry/ok" ]; then
    rm -rf "$entry" && mkdir -p "$entry" && cp -r "$dir/src" "$entry/src" &&
      _spex_venv_install "$entry" && touch "$entry/ok" ||
      { local rc=$?; rm -rf "$entry"; flock -u 9; exec 9>&-; return "$rc"; }
  fi
  # Entries of older contents, unused for a day, go.
  find "$cache" -mindepth 1 -maxdepth 1 -type d -mmin +1440 ! -name "$key" -exec rm -rf {} + 2>/dev/null
  touch "$entry"
  flock -u 9; exec 9>&-
  SPEX_VENV="$entry/venv"
}
