#!/usr/bin/env bash
# spexd's metrics, timeline and spexctl's views end to end (1 node under mpirun, spex_trainer):
# a non-loopback --metrics_address is refused naming --metrics_allow_remote; `spexctl watch` with
# no daemon says so; a known run (a dense and a topk bucket, 8 steps) scraped over HTTP passes
# `promtool check metrics` and carries its counts; the --timeline file of that run has every
# bucket's phases (check_timeline.py); `spexctl timeline start|stop` records a running job;
# `spexctl stats --json` parses; `spexctl watch` refreshes every second piped and under a
# pseudo-terminal and ends cleanly on SIGINT; a timeline being recorded when spexd stops is still
# valid JSON; on 2 nodes, the running byte totals of `spexctl stats --json` and watch's bytes/s
# match a dense bucket's exact 4000 bytes per exchange. Every process started by pid.
set -uo pipefail
R="${RUNFILES_DIR:-${TEST_SRCDIR:-$PWD/..}}/spex"
SPEXD="$R/daemon/spexd"; TRAINER="$R/client/spex_trainer"; SPEXCTL="$R/client/spexctl"
CHECK="$R/tests/observe/check_timeline.py"
source "$R/tests/support/shtest.sh"
PY=/usr/bin/python3
dir=$(mktemp -d /tmp/spex-obs.XXXXXX)
port=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
ctl() { "$SPEXCTL" --socket="$dir/node0.sock" "$@"; }
# SIGINT to the `spexctl watch` of pid $1; SIGKILL if it still runs 5 s later. Sets watch_rc to
# its exit status (137 after the SIGKILL).
interrupt_watch() {
  kill -INT "$1"
  for _ in $(seq 50); do alive "$1" || break; sleep 0.1; done
  alive "$1" && { kill -9 "$1"; echo "watch ignored SIGINT"; }
  wait "$1"; watch_rc=$?
}

# 1. Loopback only unless allowed: the flag's error names both flags, and nothing starts.
msg=""
if timeout 30 mpirun -np 1 "$SPEXD" --socket="$dir/refused.sock" --metrics_address="0.0.0.0:$port" \
    >"$dir/refused.log" 2>&1; then
  msg="spexd started with --metrics_address=0.0.0.0"
elif ! grep -q -- "--metrics_allow_remote" "$dir/refused.log"; then
  msg="no message naming --metrics_allow_remote: $(tail -3 "$dir/refused.log")"
fi
record refuses_remote_metrics_address "$msg"

# 2. `spexctl watch` with no daemon at the socket says so and keeps retrying (its format once had
# an argument too many: absl::StrFormat then gives "", and watch printed empty lines).
"$SPEXCTL" --socket="$dir/none.sock" watch >"$dir/watch_none.txt" 2>&1 &
w=$!
sleep 1.5
interrupt_watch $w
msg=""
[ $watch_rc = 0 ] || msg="watch exited $watch_rc after SIGINT; "
grep -q "no daemon answers at $dir/none.sock: .* (retrying every [0-9]* ms" "$dir/watch_none.txt" ||
  msg+="no 'no daemon answers at $dir/none.sock' line: '$(head -c 300 "$dir/watch_none.txt")'"
record watch_without_daemon "$msg"

# 3. The known run, with metrics and a timeline from the flags.
mpirun -np 1 "$SPEXD" --socket="$dir/node{rank}.sock" --local_trainers=1 --log_level=warning \
  --dense_fallback=off --metrics_address="127.0.0.1:$port" --timeline="$dir/flag.json" \
  --timeline_dir="$dir" >"$dir/spexd.log" 2>&1 &
mpi=$!
if ! wait_sockets "$dir" 1; then
  record daemon_starts "no socket within 20 s: $(tail -5 "$dir/spexd.log")"
  kill -9 $mpi; wait $mpi; write_junit spexd_observe_test; exit 1
fi
daemons=$(pgrep -P $mpi -f spexd | tr '\n' ' ')
"$TRAINER" --socket="$dir/node0.sock" --local_rank=0 --local_size=1 --buckets=1000,70000 \
  --compressors=dense,topk --density=0.01 --steps=8 --quiet >"$dir/trainer.log" 2>&1
rc=$?
record known_run "$([ $rc = 0 ] || echo "spex_trainer exited $rc: $(tail -3 "$dir/trainer.log")")"

msg=$($PY - "$port" "$dir/metrics.txt" <<'PY'
import re, sys, time, urllib.request
port, out = sys.argv[1], sys.argv[2]
def value(name, **labels):
    for line in text.splitlines():
        m = re.match(r"(\w+)(\{(.*)\})? (\S+)$", line)
        if not m or m.group(1) != name: continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(3) or ""))
        if all(got.get(k) == v for k, v in labels.items()): return float(m.group(4))
    return None
# The engine tells observers right after waking the trainers: the last exchange may be on its way.
for _ in range(50):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    if value("spex_node_exchanges_total", node="0") == 16 and all(
            value("spex_exchanges_total", bucket=b) == 8 for b in "01"): break
    time.sleep(0.1)
open(out, "w").write(text)
bad = []
for b in ("0", "1"):
    if value("spex_exchanges_total", bucket=b, node="0") != 8: bad.append(f"exchanges of bucket {b}: {value('spex_exchanges_total', bucket=b)}")
    # One node sends nothing: the series must be there (the in-process test checks the bytes).
    if value("spex_sent_bytes_total", bucket=b) is None: bad.append(f"no bytes sent series for bucket {b}")
    for p in ("wait_local", "reduce_local", "compress", "collective", "decode", "publish"):
        if value("spex_phase_seconds_count", bucket=b, phase=p) != 8: bad.append(f"phase {p} of bucket {b}")
if value("spex_target_density", bucket="1") != 0.01: bad.append("target density of the topk bucket")
if value("spex_node_exchanges_total", node="0") != 16: bad.append("node exchanges")
if value("spex_sessions", node="0") != 0: bad.append("sessions after the trainer left")
print("; ".join(bad))
PY
)
record metrics_values "$msg"
out=$(promtool check metrics <"$dir/metrics.txt" 2>&1); rc=$?
record promtool_check_metrics "$([ $rc = 0 ] && [ -z "$out" ] || echo "promtool exited $rc: $out")"

# The flag's recording, stopped at run time: exactly the known run.
out=$(ctl timeline stop 2>&1)
record timeline_stop "$(echo "$out" | grep -q "16 exchanges in $dir/flag.json" || echo "$out")"
out=$($PY "$CHECK" "$dir/flag.json" --pid 0 --buckets 0,1 --sparse 1 --steps 8 2>&1)
record flag_timeline "$([ $? = 0 ] || echo "$out")"
out=$(ctl timeline stop 2>&1) && record timeline_stop_twice "stopped twice: $out" ||
  record timeline_stop_twice "$(echo "$out" | grep -q "no timeline is being recorded" || echo "$out")"

# 4. A running job: stats --json, watch, a timeline recorded at run time.
"$TRAINER" --socket="$dir/node0.sock" --local_rank=0 --local_size=1 --buckets=100000,200000 \
  --steps=1000000 --quiet >"$dir/long.log" 2>&1 &
long=$!
sleep 1
out=$(ctl stats --json 2>&1)
msg=$(echo "$out" | $PY -c '
import json, sys
s = json.load(sys.stdin)
bad = []
if s["node_rank"] != 0 or s["node_count"] != 1: bad.append("node")
if s["sessions"] != 1: bad.append("sessions %s" % s["sessions"])
if sorted(int(b["bucket_id"]) for b in s["buckets"]) != [0, 1]: bad.append("buckets")
if not all(int(b["exchanges"]) > 0 and b["state"] for b in s["buckets"]): bad.append("bucket exchanges/state")
print("; ".join(bad))' 2>&1)
record stats_json "$msg"

(cd "$dir" && "$SPEXCTL" --socket="$dir/node0.sock" timeline start rt.json >"$dir/start.out" 2>&1)
rc=$?
record timeline_start_relative "$([ $rc = 0 ] && grep -q "$dir/rt.json" "$dir/start.out" || cat "$dir/start.out")"
out=$(ctl timeline start "$dir/other.json" 2>&1) && msg="a second recording started" ||
  msg=$(echo "$out" | grep -q "already being recorded" || echo "$out")
record timeline_start_twice "$msg"

"$SPEXCTL" --socket="$dir/node0.sock" watch >"$dir/watch.txt" 2>&1 &
w=$!
sleep 2.5
interrupt_watch $w
frames=$(grep -c "spexd node 0/1" "$dir/watch.txt")
msg=""
[ $watch_rc = 0 ] || msg="watch exited $watch_rc after SIGINT"
[ "$frames" -ge 2 ] && [ "$frames" -le 4 ] || msg="$msg; $frames frames in 2.5 s"
grep -qE "^ +1 dense .* [0-9.]+K? +[0-9.]+ +1 " "$dir/watch.txt" || grep -qE "^ +1 " "$dir/watch.txt" || msg="$msg; no bucket line"
grep -q $'\x1b' "$dir/watch.txt" && msg="$msg; escape codes when piped"
record watch_piped "$msg"
[ -n "$msg" ] && cat "$dir/watch.txt"

msg=$($PY - "$SPEXCTL" "$dir/node0.sock" <<'PY'
import os, pty, signal, sys, time
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], [sys.argv[1], f"--socket={sys.argv[2]}", "watch"])
out, t0 = b"", time.time()
os.set_blocking(fd, False)
while time.time() - t0 < 2.5:
    try: out += os.read(fd, 65536)
    except BlockingIOError: time.sleep(0.05)
    except OSError: break
os.kill(pid, signal.SIGINT)
bad = []
for _ in range(50):
    done, status = os.waitpid(pid, os.WNOHANG)
    if done: break
    time.sleep(0.1)
else:
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    bad.append("ignored SIGINT for 5 s")
if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0: bad.append(f"status {status} after SIGINT")
if out.count(b"\x1b[H\x1b[2J") < 2: bad.append(f"{out.count(b'spexd node')} frames, no redraw: {out[:200]!r}")
if b"exch/s" not in out: bad.append("no header")
print("; ".join(bad))
PY
)
record watch_terminal "$msg"

sleep 0.5
out=$(ctl timeline stop 2>&1)
record timeline_stop_runtime "$(echo "$out" | grep -q "in $dir/rt.json" || echo "$out")"
out=$($PY "$CHECK" "$dir/rt.json" --pid 0 --buckets 0,1 --steps 10 --min_steps 2>&1)
record runtime_timeline "$([ $? = 0 ] || echo "$out")"
out=$(ctl timeline start "$dir/rt.json" 2>&1) && msg="replaced an existing file" ||
  msg=$(echo "$out" | grep -q "never replaced" || echo "$out")
record timeline_never_replaces "$msg"
# Only files directly in --timeline_dir, created 0600 (they show the job's buckets and timings).
record timeline_mode_0600 "$(m=$(stat -c %a "$dir/rt.json" "$dir/flag.json" | sort -u); [ "$m" = 600 ] || echo "modes $m")"
msg=""
for outside in "$dir/../escape.json" "/tmp/escape-$$.json" "$dir/sub/x.json"; do
  out=$(ctl timeline start "$outside" 2>&1) && { msg="recorded to $outside"; ctl timeline stop >/dev/null 2>&1; }
  echo "$out" | grep -q -- "--timeline_dir" || msg="$msg; $outside: $out"
done
record timeline_outside_dir_refused "$msg"

# 5. Recording while spexd stops: the file is closed as valid JSON.
ctl timeline start "$dir/at_exit.json" >/dev/null 2>&1
sleep 0.5
kill -TERM $long; wait $long
stop_mpirun $mpi $daemons; rc=$?
record daemon_stops "$([ $rc = 0 ] || echo "spexd did not stop within 15 s")"
kill_left $daemons
out=$($PY -c 'import json, sys; e = json.load(open(sys.argv[1])); print(sum(x.get("name") == "exchange" for x in e))' \
  "$dir/at_exit.json" 2>&1)
record timeline_valid_at_exit "$([[ "$out" =~ ^[0-9]+$ ]] && [ "$out" -gt 0 ] || echo "$out")"
# The long trainer was killed: its "died without Goodbye" is expected.
errors=$(grep ERROR "$dir/spexd.log" | grep -v "died without Goodbye" | head -3)
record daemon_log_clean "$errors"

# 6. Two nodes: the running byte totals and watch's bytes/s. A dense bucket of 1000 floats moves
# exactly 4000 bytes each way per exchange between 2 nodes, so its totals are 4000 x its
# exchanges in every GetStats answer, and watch's sent/s and recv/s are 4000 x its exch/s.
mkdir -p "$dir/two"
mpirun -np 2 "$SPEXD" --socket="$dir/two/node{rank}.sock" --local_trainers=1 --log_level=warning \
  --dense_fallback=off >"$dir/two.log" 2>&1 &
mpi=$!
if wait_sockets "$dir/two" 2; then
  daemons=$(pgrep -P $mpi -f spexd | tr '\n' ' ')
  trainers=""
  for n in 0 1; do
    "$TRAINER" --socket="$dir/two/node$n.sock" --local_rank=0 --local_size=1 --buckets=1000,70000 \
      --compressors=dense,topk --density=0.01 --steps=1000000 --quiet >"$dir/two-trainer$n.log" 2>&1 &
    trainers="$trainers $!"
  done
  sleep 1
  msg=$("$SPEXCTL" --socket="$dir/two/node0.sock" stats --json 2>&1 | $PY -c '
import json, sys
s = json.load(sys.stdin)
bad = []
b = {int(x["bucket_id"]): x for x in s["buckets"]}
if sorted(b) != [0, 1]: bad.append("buckets %s" % sorted(b))
else:
    n = int(b[0]["exchanges"])
    for k in ("bytes_sent_total", "bytes_received_total"):
        if n == 0 or int(b[0].get(k, -1)) != 4000 * n: bad.append("dense %s %s after %d exchanges" % (k, b[0].get(k), n))
        if int(b[1].get(k, 0)) <= 0: bad.append("topk %s %s" % (k, b[1].get(k)))
print("; ".join(bad))' 2>&1)
  record two_nodes_stats_totals "$msg"
  "$SPEXCTL" --socket="$dir/two/node0.sock" watch --interval_ms=700 --count=3 >"$dir/two-watch.txt" 2>&1
  rc=$?
  msg=$($PY - "$dir/two-watch.txt" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
def num(v):
    m = re.fullmatch(r"([0-9.]+)([KMGTP]?)", v)
    return float(m.group(1)) * 1000 ** " KMGTP".index(m.group(2) or " ") if m else None
bad, frames = [], text.split("\n\n")
frames = [f for f in frames if "spexd node 0/2" in f]
if len(frames) != 3: bad.append(f"{len(frames)} frames, not 3")
for i, f in enumerate(frames[1:], 1):
    if not re.search(r"exchanges \d+ \([0-9.]+[KMGTP]?/s over \d+\.\d{3} s\)", f): bad.append(f"frame {i}: no interval in the header")
    row = next((l.split() for l in f.splitlines() if re.match(r" +0 dense ", l)), None)
    if row is None: bad.append(f"frame {i}: no dense bucket row"); continue
    # bucket compressor type state pat exch/s target achieved sent/s recv/s phases...
    if row[2] != "float32": bad.append(f"frame {i}: type {row[2]}, not float32")
    rate, sent, recv = num(row[5]), num(row[8]), num(row[9])
    if not rate: bad.append(f"frame {i}: exch/s {row[5]}"); continue
    for what, v in (("sent/s", sent), ("recv/s", recv)):
        if v is None or abs(v - 4000 * rate) > 0.1 * 4000 * rate:
            bad.append(f"frame {i}: dense {what} {v} for {rate} exchanges/s (4000 bytes each)")
print("; ".join(bad))
PY
)
  [ $rc = 0 ] || msg="watch exited $rc; $msg"
  record two_nodes_watch_bytes_per_second "$msg"
  [ -n "$msg" ] && cat "$dir/two-watch.txt"
  for t in $trainers; do kill -TERM $t; done
  for t in $trainers; do wait $t; done
  stop_mpirun $mpi $daemons >/dev/null || record two_nodes_stop "spexd did not stop within 15 s"
  kill_left $daemons
else
  record two_nodes_start "no sockets within 20 s: $(tail -5 "$dir/two.log")"
  kill -9 $mpi; wait $mpi
fi

write_junit spexd_observe_test
[ $failures = 0 ] && rm -rf "$dir"
echo "spexd_observe_test: $failures failure(s)"
[ $failures = 0 ]
