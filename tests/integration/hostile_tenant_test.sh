#!/usr/bin/env bash
# The hostile-tenant suite (docs/security.md): creates three real users (victim, a read-only
# monitor turned attacker, a stranger), installs spexd and the Python client where they can run
# them, and runs hostile_tenant.py as root: directory squatting, an impostor socket, a foreign
# process connecting, stolen/guessed session ids, a forged pid, density and timeline changes by
# another user, timeline paths outside --timeline_dir, connection floods, segments truncated in a
# 2-node world (behind the header, and to nothing before any failure) and every resource limit
# (--max_exchange_wait, --max_streams_per_connection, --rpc_threads, --max_connections,
# --timeline_max_bytes) hit on the attacker's own daemon, and checkpoints there (stalled streams
# against --max_checkpoint_streams, --checkpoint_stream_timeout and --max_daemon_bytes, a save
# that must not stall the node's exchanges, forged and late records), and spexrun's and the
# client's attacks (hostile_spexrun.py: -x values on command lines, a SIGKILLed spexrun, a
# squatted /tmp/spex-<uid>, a host name as an ssh option, a symlink on the way to the socket),
# while the victim's job runs. Passes only when no attack succeeded and no job was disturbed;
# prints the figure. Needs root (useradd, runuser); the users are removed at the end.
set -uo pipefail
R="${RUNFILES_DIR:-${TEST_SRCDIR:-$PWD/..}}/spex"
source "$R/tests/support/shtest.sh"
if [ "$(id -u)" != 0 ]; then
  echo "hostile_tenant_test needs root (it creates users)"; exit 1
fi
W=$(mktemp -d /tmp/spex-hostile.XXXXXX)
chmod 0755 "$W"
USERS=(spexvictim spexattacker spexstranger)
cleanup() {
  for u in "${USERS[@]}"; do userdel "$u" >/dev/null 2>&1; done
  rm -rf "$W" "/tmp/spex-$(id -u spexvictim 2>/dev/null || echo none)"
}
trap cleanup EXIT
for u in "${USERS[@]}"; do id "$u" >/dev/null 2>&1 || useradd -M -r -s /bin/bash "$u"; done
# Binaries under /root are not executable by other users: copies in the world-readable $W.
cp "$R/daemon/spexd" "$W/spexd" && chmod 0755 "$W/spexd"
source "$R/tests/support/spex_venv.sh"
install_spex_venv "$R" "$W" || exit 1
chmod -R a+rX "$W"
cd "$W" || exit 1
"$W/venv/bin/python" "$R/tests/integration/hostile_tenant.py" "$W" "$W/spexd" "$W/venv/bin/python"
rc=$?
figure=$(cat "$W/figure.json" 2>/dev/null)
record hostile_tenant "$([ $rc = 0 ] || echo "rc $rc: $figure")"
write_junit hostile_tenant_test
[ "$failures" = 0 ]
