#!/usr/bin/env bash
# Checks deploy/systemd without systemd running as PID 1:
#  - `systemd-analyze verify` of spexd.service prints nothing (it exits 0 on unknown keys and
#    bad values, so any output fails; a unit with a typo is checked to produce output);
#  - `systemd-analyze security --offline=true` rates it at most 3.0 (prints the score);
#  - the per-user template spexd@.service (as spexd@daemon) verifies clean, rates <= 3.0 and
#    runs as its user with a 0700 socket directory, task, file and memory limits;
#  - spex.sysusers.conf and spex.tmpfiles.conf make user/group spex and /run/spex 0750
#    spex:spex in a scratch root; spex-world passes shellcheck and `sh -n`;
#  - spex-world starts a one-host world (mpirun, spexd serving on SPEX_SOCKET_PATH with mode
#    0660), refuses a missing hostfile with a clear message, and the world stops cleanly on
#    SIGTERM (socket and /dev/shm segments removed).
# The unit's ExecStart is pointed at a scratch install of spex-world (verify needs it to exist).
set -uo pipefail
R="${RUNFILES_DIR:-${TEST_SRCDIR:-$PWD/..}}/spex"
SPEXD="$R/daemon/spexd"; SPEXCTL="$R/client/spexctl"; U="$R/deploy/systemd"
source "$R/tests/support/shtest.sh"
source "$R/tests/integration/skip_junit.sh"
T=$(mktemp -d /tmp/spex-units.XXXXXX)

if ! command -v systemd-analyze >/dev/null; then
  skip systemd_analyze "systemd-analyze not found (package systemd; deploy/setup.sh installs it)"
else
  mkdir -p "$T/root/usr/local/lib/spex" "$T/root/usr/local/bin"
  cp "$U/spex-world" "$T/root/usr/local/lib/spex/spex-world"
  ln -s "$SPEXD" "$T/root/usr/local/bin/spexd"
  sed "s#/usr/local/#$T/root/usr/local/#g" "$U/spexd.service" >"$T/spexd.service"
  out=$(systemd-analyze verify "$T/spexd.service" 2>&1); rc=$?
  [ $rc = 0 ] && [ -z "$out" ] && record verify "" ||
    record verify "systemd-analyze verify spexd.service: rc $rc, output: $out"
  # The check itself: a unit with an unknown key must produce output (rc stays 0).
  sed 's/^Restart=on-failure/Restart=on-failure\nRestartt=always/' "$T/spexd.service" >"$T/typo.service"
  out=$(systemd-analyze verify "$T/typo.service" 2>&1)
  [ -n "$out" ] && record verify_catches_typos "" ||
    record verify_catches_typos "verify printed nothing for an unknown key"
  # The per-user template, instantiated for an existing user: verifies clean, rates <= 3.0,
  # runs as the instance's user with its own 0700 socket directory and bounded resources.
  sed "s#/usr/local/#$T/root/usr/local/#g" "$U/spexd@.service" >"$T/spexd@daemon.service"
  out=$(systemd-analyze verify "$T/spexd@daemon.service" 2>&1); rc=$?
  [ $rc = 0 ] && [ -z "$out" ] && record verify_per_user "" ||
    record verify_per_user "systemd-analyze verify spexd@daemon.service: rc $rc, output: $out"
  msg=""
  for line in "User=%i" "RuntimeDirectory=spex/%i" "RuntimeDirectoryMode=0700" "TasksMax=" \
    "LimitNOFILE=" "MemoryMax=" "SPEX_SOCKET_PATH=/run/spex/%i/spexd.sock SPEX_SOCKET_MODE=0600"; do
    grep -q -- "$line" "$U/spexd@.service" || msg="$msg missing '$line';"
  done
  record per_user_unit_isolates "$msg"
  psec=$(systemd-analyze security --offline=true "$T/spexd@daemon.service" 2>&1 | tail -n 3)
  pscore=$(printf '%s\n' "$psec" | sed -n 's/.*Overall exposure level for spexd@daemon.service: \([0-9.]*\).*/\1/p')
  echo "systemd-analyze security --offline=true spexd@daemon.service: exposure ${pscore:-?}"
  awk -v s="${pscore:-99}" 'BEGIN { exit !(s <= 3.0) }' && record security_score_per_user "" ||
    record security_score_per_user "exposure ${pscore:-unknown} > 3.0: $psec"
  sec=$(systemd-analyze security --offline=true "$T/spexd.service" 2>&1 | tail -n 3)
  score=$(printf '%s\n' "$sec" | sed -n 's/.*Overall exposure level for spexd.service: \([0-9.]*\).*/\1/p')
  echo "systemd-analyze security --offline=true spexd.service: exposure ${score:-?}"
  awk -v s="${score:-99}" 'BEGIN { exit !(s <= 3.0) }' && record security_score "" ||
    record security_score "exposure ${score:-unknown} > 3.0: $sec"
fi

if command -v systemd-sysusers >/dev/null && command -v systemd-tmpfiles >/dev/null; then
  mkdir -p "$T/sysroot/etc"
  msg=""
  systemd-sysusers --root="$T/sysroot" "$U/spex.sysusers.conf" >"$T/sysusers.log" 2>&1 ||
    msg="systemd-sysusers failed: $(cat "$T/sysusers.log")"
  grep -q '^spex:x:[0-9]*:[0-9]*:spex daemon world:/var/lib/spex:/bin/sh$' "$T/sysroot/etc/passwd" ||
    msg="$msg no user spex in $(cat "$T/sysroot/etc/passwd" 2>/dev/null)"
  systemd-tmpfiles --create --root="$T/sysroot" "$U/spex.tmpfiles.conf" >"$T/tmpfiles.log" 2>&1 ||
    msg="$msg systemd-tmpfiles failed: $(cat "$T/tmpfiles.log")"
  uid=$(awk -F: '$1 == "spex" { print $3 }' "$T/sysroot/etc/passwd")
  gid=$(awk -F: '$1 == "spex" { print $3 }' "$T/sysroot/etc/group")
  got=$(stat -c '%a %u %g' "$T/sysroot/run/spex" 2>/dev/null)
  [ "$got" = "750 $uid $gid" ] || msg="$msg /run/spex is '$got', want '750 $uid $gid'"
  record sysusers_tmpfiles "$msg"
else
  skip sysusers_tmpfiles "systemd-sysusers/systemd-tmpfiles not found"
fi

msg=$(sh -n "$U/spex-world" 2>&1)
if command -v shellcheck >/dev/null; then msg="$msg$(shellcheck "$U/spex-world" 2>&1)"; fi
record spex_world_lint "$msg"

# spex-world by hand: a missing hostfile is refused with a clear message.
SPEX_HOSTFILE="$T/none" "$U/spex-world" >"$T/nohosts.log" 2>&1; rc=$?
[ $rc = 2 ] && grep -q "cannot read the hostfile $T/none" "$T/nohosts.log" && record spex_world_no_hostfile "" ||
  record spex_world_no_hostfile "rc $rc: $(cat "$T/nohosts.log")"

# A one-host world through spex-world: serves on SPEX_SOCKET_PATH (mode 0660), stops cleanly.
echo "localhost slots=1" >"$T/hostfile"
SPEX_HOSTFILE="$T/hostfile" SPEXD="$SPEXD" SPEX_SOCKET_PATH="$T/run/spexd.sock" \
  SPEXD_ARGS="--log_level=warning" "$U/spex-world" >"$T/world.log" 2>&1 &
world=$!
msg=""
for _ in $(seq 200); do [ -S "$T/run/spexd.sock" ] && break; sleep 0.1; done
if [ -S "$T/run/spexd.sock" ]; then
  "$SPEXCTL" --socket="$T/run/spexd.sock" health | grep -q SERVING || msg="health is not SERVING"
  mode=$(stat -c %a "$T/run/spexd.sock")
  [ "$mode" = 660 ] || msg="$msg socket mode $mode, want 660"
  daemons=$(ps -o pid= --ppid "$world" | tr '\n' ' ')
  # spexd keeps every CPU this script may use (mpirun --bind-to none; by default Open MPI binds
  # a lone rank to one core).
  want=$(taskset -pc $$ | sed 's/.*: //')
  for d in $daemons; do
    got=$(taskset -pc "$d" | sed 's/.*: //')
    [ "$got" = "$want" ] || msg="$msg spexd $d may run on CPUs $got, this test on $want"
  done
  stop_mpirun "$world" $daemons || msg="$msg the world did not stop within 15 s of SIGTERM"
  [ -e "$T/run/spexd.sock" ] && msg="$msg socket left behind"
  left=$(shm_left $daemons); [ -z "$left" ] || msg="$msg left in /dev/shm: $left"
else
  msg="no socket within 20 s: $(cat "$T/world.log")"
  kill -9 "$world" 2>/dev/null; wait "$world" 2>/dev/null
fi
record spex_world_one_host "$msg"

# SPEX_DAEMON_CPUS: spexd on those cores only; a value that is not a CPU list is refused.
SPEX_HOSTFILE="$T/hostfile" SPEXD="$SPEXD" SPEX_SOCKET_PATH="$T/run/bad.sock" SPEX_DAEMON_CPUS="0;x" \
  timeout 20 "$U/spex-world" >"$T/badcpus.log" 2>&1; rc=$?
[ $rc = 2 ] && grep -q "SPEX_DAEMON_CPUS=0;x is not a CPU list" "$T/badcpus.log" && record spex_world_bad_cpus "" ||
  record spex_world_bad_cpus "rc $rc: $(cat "$T/badcpus.log")"
first=$(taskset -pc $$ | sed 's/.*: //; s/[-,].*//')
SPEX_HOSTFILE="$T/hostfile" SPEXD="$SPEXD" SPEX_SOCKET_PATH="$T/run/pinned.sock" SPEX_DAEMON_CPUS="$first" \
  SPEXD_ARGS="--log_level=warning" "$U/spex-world" >"$T/pinned.log" 2>&1 &
world=$!
msg=""
for _ in $(seq 200); do [ -S "$T/run/pinned.sock" ] && break; sleep 0.1; done
if [ -S "$T/run/pinned.sock" ]; then
  daemons=$(ps -o pid= --ppid "$world" | tr '\n' ' ')
  [ -n "$daemons" ] || msg="no spexd under mpirun"
  for d in $daemons; do
    got=$(taskset -pc "$d" | sed 's/.*: //')
    [ "$got" = "$first" ] || msg="$msg spexd $d may run on CPUs $got, want $first (SPEX_DAEMON_CPUS)"
  done
  stop_mpirun "$world" $daemons || msg="$msg the world did not stop within 15 s of SIGTERM"
else
  msg="no socket within 20 s: $(cat "$T/pinned.log")"
  kill -9 "$world" 2>/dev/null; wait "$world" 2>/dev/null
fi
record spex_world_daemon_cpus "$msg"

rm -rf "$T"
write_junit_skips systemd_units
echo "systemd units: $failures failure(s)"
[ $failures = 0 ]
