"""The hostile-tenant suite (driven by hostile_tenant_test.sh, as root): real users, a victim's
job running on its own spexd, and attacks by other users and hostile processes beside it. Each
attack is tried and judged refused/contained or succeeded; the victim's job must finish every
step with exact averages. Prints the figure: attacks tried, succeeded, jobs disturbed."""

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

W, SPEXD, PY = sys.argv[1], sys.argv[2], sys.argv[3]
VICTIM, ATTACKER, STRANGER = "spexvictim", "spexattacker", "spexstranger"
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1",
       **{k: v for k, v in os.environ.items() if k.startswith("OMPI_MCA_")}}

results = []  # (attack, succeeded, detail)


def uid(name):
    return pwd.getpwnam(name).pw_uid


def as_user(user, args, **kw):
    return subprocess.run(["runuser", "-u", user, "--", "env", *[f"{k}={v}" for k, v in ENV.items()], *args],
                          capture_output=True, text=True, **kw)


def popen_as(user, args, log):
    return subprocess.Popen(["runuser", "-u", user, "--", "env", *[f"{k}={v}" for k, v in ENV.items()], *args],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)


def py_as(user, code, *args, timeout=60):
    return as_user(user, [PY, "-c", code, *args], timeout=timeout)


def record(attack, succeeded, detail=""):
    results.append((attack, succeeded, detail))
    print(f"{'SUCCEEDED' if succeeded else 'refused  '} {attack}: {detail}"[:400], flush=True)


def start_daemon(user, sock, log, *flags):
    p = popen_as(user, ["mpirun", "-np", "1", "--bind-to", "none", SPEXD, f"--socket={sock}", "--log_level=info",
                        "--threads=1", *flags], log)
    for _ in range(300):
        if os.path.exists(sock) or p.poll() is not None:
            break
        time.sleep(0.1)
    return p


def stop(p):
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def private_dir(user, name, mode=0o700):
    d = os.path.join(W, name)
    os.makedirs(d, exist_ok=True)
    os.chown(d, uid(user), uid(user))
    os.chmod(d, mode)
    return d


# The victim's job: 2 local trainers (threads of one process), RPC exchanges, exact averages,
# until a stop file appears (at least MIN steps). Prints a JSON line.
JOB = r'''
import json, os, sys, threading, time
import numpy as np, spex
sock, stop_file, n = sys.argv[1], sys.argv[2], 20000
cs = [spex.Client(sock, local_rank=r, local_size=2, exchange_timeout=60) for r in (0, 1)]
bs = [c.register_bucket(0, n, compressor="dense") for c in cs]
bad, step, errors = 0, 0, []
def one(r, step, out):
    data = (np.arange(n, dtype=np.float32) % 97) * (r + 1) + step
    try:
        out[r] = np.array(cs[r].exchange(bs[r], data, mode="rpc"))
    except Exception as e:
        out[r] = e
while step < 40 or not os.path.exists(stop_file):
    out = [None, None]
    ts = [threading.Thread(target=one, args=(r, step, out)) for r in (0, 1)]
    [t.start() for t in ts]; [t.join() for t in ts]
    want = ((np.arange(n, dtype=np.float32) % 97) * 3 + 2 * step) / 2
    for r in (0, 1):
        if isinstance(out[r], Exception):
            errors.append(f"step {step} rank {r}: {out[r]}"); bad += 1
        elif not np.array_equal(out[r], want):
            errors.append(f"step {step} rank {r}: wrong average"); bad += 1
    if bad: break
    step += 1
    time.sleep(0.02)
for c in cs: c.close()
print(json.dumps({"steps": step, "bad": bad, "errors": errors[:3]}))
'''

GRPC_PROBE = r'''
import sys, grpc, json
from spex.proto import spex_pb2 as pb, spex_pb2_grpc as pb_grpc
sock, sid, victim_pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
stub = pb_grpc.SpexStub(grpc.insecure_channel("unix:" + sock))
out = {}
def call(name, f):
    try:
        r = f(); out[name] = ["OK", str(r)[:200]]
    except grpc.RpcError as e:
        out[name] = [e.code().name, (e.details() or "")[:200]]
call("GetStats", lambda: stub.GetStats(pb.GetStatsRequest(), timeout=10))
call("ListSessions", lambda: [[s.session_id, s.pid] for s in stub.ListSessions(pb.ListSessionsRequest(), timeout=10).sessions])
call("Hello_forged_pid", lambda: stub.Hello(pb.HelloRequest(local_rank=1, local_size=2, pid=victim_pid, protocol_version=1), timeout=10))
call("Exchange_stolen", lambda: stub.Exchange(pb.ExchangeRequest(session_id=sid, bucket_id=0, step=0), timeout=10))
call("Register_stolen", lambda: stub.RegisterBucket(pb.RegisterBucketRequest(session_id=sid, bucket_id=5, elements=8), timeout=10))
call("Goodbye_stolen", lambda: stub.Goodbye(pb.GoodbyeRequest(session_id=sid), timeout=10))
call("Goodbye_guessed", lambda: stub.Goodbye(pb.GoodbyeRequest(session_id=0x1234567890abcdef), timeout=10))
call("SetDensity", lambda: stub.SetDensity(pb.SetDensityRequest(density=0.5), timeout=10))
call("StartTimeline", lambda: stub.StartTimeline(pb.StartTimelineRequest(path="/tmp/spex-hostile-tl.json"), timeout=10))
import threading
answered = threading.Event()
def stalled():  # a LoadBucketState stream that sends nothing until answered: it must not hold a thread
    answered.wait(8)
    return
    yield
call("LoadBucketState_stalled", lambda: stub.LoadBucketState(stalled(), timeout=4))
answered.set()
print(json.dumps(out))
'''

FLOOD = r'''
import socket, sys, time
path, n = sys.argv[1], int(sys.argv[2])
held, opened = [], 0
for i in range(n):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path); held.append(s); opened += 1
    except OSError:
        s.close()
time.sleep(1.0)
alive = 0
for s in held:
    s.setblocking(False)
    try:
        alive += s.recv(1) != b""
    except BlockingIOError:
        alive += 1  # nothing to read and not closed: the daemon kept it
    except OSError:
        pass
print(opened, alive)
'''

IMPOSTOR = r'''
import socket, sys, time
import os
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); os.chmod(sys.argv[1], 0o777); s.listen(8)
print("listening", flush=True); time.sleep(30)
'''

# The resource limits, hit by the attacker on its own daemon (it is that daemon's user, the only
# one who may hold calls there): spexd --local_trainers=2 --rpc_threads=6 (3 waiting exchanges)
# --max_streams_per_connection=2 --max_exchange_wait=2s --max_connections=12 --timeline_dir
# --timeline_max_bytes=20000. Each limit must answer with a clear error (or, for streams, queue
# the calls beyond 2 on their connection), short calls must still be served during the flood, and
# a job on the same daemon afterwards must be exact.
LIMITS = r'''
import json, os, socket, sys, threading, time, grpc, numpy as np, spex
from spex.proto import spex_pb2 as pb, spex_pb2_grpc as g
sock, tldir = sys.argv[1], sys.argv[2]
def stub():  # its own connection (no shared subchannel)
    return g.SpexStub(grpc.insecure_channel("unix:" + sock, options=[("grpc.use_local_subchannel_pool", 1)]))
s = stub()
h = [s.Hello(pb.HelloRequest(local_rank=r, local_size=2, protocol_version=1, client="limits"), timeout=10) for r in (0, 1)]
for x in h:
    s.RegisterBucket(pb.RegisterBucketRequest(session_id=x.session_id, bucket_id=0, elements=1000), timeout=10)
out = {}
def wait0(st, res, i):  # rank 0 waits for step 0, which rank 1 never hands in
    t = time.monotonic()
    try:
        st.Exchange(pb.ExchangeRequest(session_id=h[0].session_id, bucket_id=0, step=0), timeout=30); r = "OK"
    except grpc.RpcError as e:
        r = e.code().name + ": " + (e.details() or "")
    res.append((round(time.monotonic() - t, 2), r))
res = []; wait0(s, res, 0)
out["max_exchange_wait"] = res[0]
res = []; one = stub()
ts = [threading.Thread(target=wait0, args=(one, res, i)) for i in range(4)]; [t.start() for t in ts]; [t.join() for t in ts]
out["streams_seconds"] = sorted(r[0] for r in res)
res = []; stubs = [stub() for _ in range(8)]
ts = [threading.Thread(target=wait0, args=(stubs[i], res, i)) for i in range(8)]; [t.start() for t in ts]
time.sleep(0.5)
try:
    stub().GetStats(pb.GetStatsRequest(), timeout=5); out["short_call_during_flood"] = "OK"
except grpc.RpcError as e:
    out["short_call_during_flood"] = e.code().name + ": " + (e.details() or "")
[t.join() for t in ts]
out["threads"] = sorted(r[1][:160] for r in res)
held = []
for _ in range(20):
    c = socket.socket(socket.AF_UNIX); c.connect(sock); held.append(c)
time.sleep(0.5)
try:
    spex.Client(sock, local_rank=0, local_size=2, connect_timeout=5).close(); out["connection_over_limit"] = "OK"
except spex.SpexError as e:
    out["connection_over_limit"] = f"{type(e).__name__}: {e}"[:300]
for c in held: c.close()
time.sleep(0.5)
s.StartTimeline(pb.StartTimelineRequest(path="t.json"), timeout=10)
def ex(r, step):
    s.Exchange(pb.ExchangeRequest(session_id=h[r].session_id, bucket_id=0, step=step), timeout=30)
for step in range(150):
    ts = [threading.Thread(target=ex, args=(r, step)) for r in (0, 1)]; [t.start() for t in ts]; [t.join() for t in ts]
s.StopTimeline(pb.StopTimelineRequest(), timeout=10)
path = os.path.join(tldir, "t.json")
st = os.stat(path)
try:
    json.load(open(path)); valid = True
except ValueError:
    valid = False
out["timeline"] = {"bytes": st.st_size, "mode": oct(st.st_mode & 0o777), "valid_json": valid}
for x in h:
    s.Goodbye(pb.GoodbyeRequest(session_id=x.session_id), timeout=10)
cs = [spex.Client(sock, local_rank=r, local_size=2) for r in (0, 1)]
bs = [c.register_bucket(1, 1000, compressor="dense") for c in cs]
ok = True
for step in range(3):
    xs = [np.arange(1000, dtype=np.float32) * (r + 1) + step for r in (0, 1)]
    ys = [None, None]
    def run(r): ys[r] = np.array(cs[r].exchange(bs[r], xs[r], mode="rpc"))
    ts = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]; [t.start() for t in ts]; [t.join() for t in ts]
    ok &= all(y is not None and np.array_equal(y, (xs[0] + xs[1]) / 2) for y in ys)
for c in cs: c.close()
out["job_after_exact"] = bool(ok)
print(json.dumps(out))
'''


# A 2-node world of the attacker's own daemons, 1 trainer per node. Node 0's trainer (raw RPCs,
# never maps anything) keeps descriptors of its two buckets' segments; node 1's is a normal
# client. After 2 good steps it cuts bucket 0 behind its header and goes on asking (RPC), and cuts
# bucket 1 to nothing, header included, before any failure, and stays silent about it: node 1's
# steps of both buckets must fail promptly (DATA_LOSS naming node 0), not at its exchange
# timeout, and the next job on the same daemons must be exact from its first step.
TRUNCATE = r'''
import os, sys, threading, time, grpc, json, numpy as np, spex
from spex.proto import spex_pb2 as pb, spex_pb2_grpc as pb_grpc
s0, s1, n = sys.argv[1], sys.argv[2], 100000
stub = pb_grpc.SpexStub(grpc.insecure_channel("unix:" + s0))
h = stub.Hello(pb.HelloRequest(local_rank=0, local_size=1, protocol_version=1, client="truncator"), timeout=10)
fds = []
for b in (0, 1):
    r = stub.RegisterBucket(pb.RegisterBucketRequest(session_id=h.session_id, bucket_id=b, elements=n), timeout=10)
    fds.append(os.open("/dev/shm" + r.buffer.shm.name, os.O_RDWR))  # kept: the hostile trainer's own handles
c1 = spex.Client(s1, local_rank=0, local_size=1, exchange_timeout=30)
bk = [c1.register_bucket(b, n, compressor="dense") for b in (0, 1)]
out = {"good_steps_exact": True}
def node0(steps):
    res = {}
    for b, step in steps:
        try:
            stub.Exchange(pb.ExchangeRequest(session_id=h.session_id, bucket_id=b, step=step), timeout=30)
            res[b] = "OK"
        except grpc.RpcError as e:
            res[b] = e.code().name + ": " + (e.details() or "")[:120]
    return res
for step in (0, 1):
    t = threading.Thread(target=node0, args=([(0, step), (1, step)],)); t.start()
    for b in (0, 1):
        x = np.arange(n, dtype=np.float32) % 89 + step
        y = np.array(c1.exchange(bk[b], x, mode="rpc"))
        out["good_steps_exact"] &= bool(np.array_equal(y, x / 2))  # node 0 hands in zeros
    t.join()
os.ftruncate(fds[0], 4096)  # behind the header
os.ftruncate(fds[1], 0)     # header included
res0 = {}
t = threading.Thread(target=lambda: res0.update(node0([(0, 2)]))); t.start()
for b in (0, 1):
    t0 = time.monotonic()
    try:
        c1.exchange(bk[b], np.ones(n, dtype=np.float32), mode="rpc")
        out[f"node1_bucket{b}"] = "OK"
    except spex.SpexError as e:
        out[f"node1_bucket{b}"] = f"{e.code}: {str(e)[:300]}"
    out[f"node1_bucket{b}_seconds"] = round(time.monotonic() - t0, 2)
t.join()
out["node0_bucket0"] = res0.get(0)
stub.Goodbye(pb.GoodbyeRequest(session_id=h.session_id), timeout=10)
c1.close()
# The next job on the same daemons: exact from its first step.
cs = [spex.Client(s, local_rank=0, local_size=1) for s in (s0, s1)]
bs = [c.register_bucket(5, 1000, compressor="dense") for c in cs]
ok = True
for step in range(3):
    xs = [np.arange(1000, dtype=np.float32) * (k + 1) + step for k in (0, 1)]
    ys = [None, None]
    def run(k): ys[k] = np.array(cs[k].exchange(bs[k], xs[k], mode="rpc"))
    ts = [threading.Thread(target=run, args=(k,)) for k in (0, 1)]; [x.start() for x in ts]; [x.join() for x in ts]
    ok &= all(y is not None and np.array_equal(y, (xs[0] + xs[1]) / 2) for y in ys)
for c in cs: c.close()
out["next_job_exact"] = bool(ok)
print(json.dumps(out))
'''

# Checkpoints, on the attacker's own daemon (spexd --local_trainers=1 --rpc_threads=16
# --max_daemon_bytes=1073741824 --max_checkpoint_streams=4 --checkpoint_stream_timeout=2s), raw RPCs:
# a save of a 16 Mi-element bucket must not stall the node's other exchanges while its record is
# encoded; 15 stalled LoadBucketState streams each announcing that bucket's largest record (257
# MB charged each) must be capped and charged (a registration that fits without them is refused
# meanwhile), GetStats served, the stalled ones cancelled at the timeout, and a save whose client
# never reads likewise; a genuine record rewritten to next_step 2^64-1 and sealed again, and a
# genuine one loaded after exchanges ran, must be refused.
CKPT = r"""
import json, struct, sys, threading, time, grpc
from spex.proto import spex_pb2 as pb, spex_pb2_grpc as g
sock = sys.argv[1]
def stub(**opts):  # its own connection
    o = [("grpc.use_local_subchannel_pool", 1)] + list(opts.items())
    return g.SpexStub(grpc.insecure_channel("unix:" + sock, options=o))
s = stub()
out = {}
def err(e): return e.code().name + ": " + (e.details() or "")[:160]
def session():
    return s.Hello(pb.HelloRequest(local_rank=0, local_size=1, protocol_version=1, client="ckpt"), timeout=10).session_id
def register(sid, b, n, name="topk"):
    s.RegisterBucket(pb.RegisterBucketRequest(session_id=sid, bucket_id=b, elements=n,
                     compressor=pb.CompressorConfig(name=name, density=0.01)), timeout=30)
def exchange(sid, b, step):
    s.Exchange(pb.ExchangeRequest(session_id=sid, bucket_id=b, step=step), timeout=30)
BIG = 16 << 20
# (3) The save's engine part (until its first chunk) against 40 small buckets' exchanges, each at
# step 0 ahead of the big bucket in the engine's order.
sid = session()
for b in range(1, 41): register(sid, b, 1000, "dense")
register(sid, 1000, BIG)
first = {}
def save():
    t0 = time.monotonic()
    it = s.SaveBucketState(pb.SaveBucketStateRequest(session_id=sid, bucket_id=1000), timeout=60)
    n = 0
    for c in it:
        if n == 0: first["t"] = time.monotonic()
        n += len(c.data)
    first.update(t0=t0, end=time.monotonic(), bytes=n)
lat = []
t = threading.Thread(target=save); t.start()
for b in range(1, 41):
    a = time.monotonic(); exchange(sid, b, 0); lat.append((a, time.monotonic() - a))
    if "t" in first: break
    time.sleep(0.002)
t.join()
window = first["t"] - first["t0"]
during = [l for a, l in lat if a < first["t"]]
out["save"] = {"record_mb": round(first["bytes"] / 2**20, 1), "first_chunk_s": round(window, 3),
               "exchanges_during": len(during), "worst_exchange_s": round(max(during, default=0), 3)}
s.Goodbye(pb.GoodbyeRequest(session_id=sid), timeout=10)
time.sleep(0.5)
# (2) Stalled streams against the caps, the threads and the memory limit.
sid = session()
register(sid, 7, BIG)
total = 8 * BIG + (1 << 19)
ends, opened = [], threading.Event()
def stalled(i):
    hold = threading.Event()
    def chunks():
        yield pb.BucketStateChunk(session_id=sid, bucket_id=7, total_bytes=total, data=b"x" * 100)
        hold.wait(30)
    a = time.monotonic()
    try:
        stub().LoadBucketState(chunks(), timeout=30); r = "OK"
    except grpc.RpcError as e:
        r = err(e)
    hold.set()
    ends.append((round(time.monotonic() - a, 2), r))
ts = [threading.Thread(target=stalled, args=(i,)) for i in range(15)]
[x.start() for x in ts]
time.sleep(1.0)
try:
    s.GetStats(pb.GetStatsRequest(), timeout=5); out["stats_during"] = "OK"
except grpc.RpcError as e:
    out["stats_during"] = err(e)
try:
    register(sid, 8, 6 << 20); out["register_during"] = "OK"
except grpc.RpcError as e:
    out["register_during"] = err(e)
[x.join() for x in ts]
out["streams"] = sorted(ends)
# A stream's memory comes back when the daemon's handler returns, which can be a moment after
# its client saw CANCELLED (the daemon's own timeout): the registration may wait up to 5 s for it.
a = time.monotonic()
while True:
    try:
        register(sid, 8, 6 << 20); out["register_after"] = "OK"
        break
    except grpc.RpcError as e:
        out["register_after"] = err(e)
        if time.monotonic() - a > 5:
            break
        time.sleep(0.2)
out["register_after_s"] = round(time.monotonic() - a, 2)
# A save whose client reads one chunk and then nothing (small windows: the server's writes
# block): cancelled at the timeout, so reading on later fails instead of getting the record.
unread = stub(**{"grpc.http2.bdp_probe": 0}).SaveBucketState(pb.SaveBucketStateRequest(session_id=sid, bucket_id=7), timeout=30)
try:
    next(unread); time.sleep(3.5); list(unread); out["unread_save"] = "OK"
except grpc.RpcError as e:
    out["unread_save"] = err(e)
s.Goodbye(pb.GoodbyeRequest(session_id=sid), timeout=10)
time.sleep(0.5)
# (4) Forged and late records.
def fnv(b):
    h = 0xcbf29ce484222325
    for c in b: h = ((h ^ c) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h
def next_step_at(r):
    at = 4 + 2 + 12 + 16
    def string(at): return at + 8 + struct.unpack_from("<Q", r, at)[0]
    at = string(at)
    n = struct.unpack_from("<Q", r, at)[0]; at += 8
    for _ in range(2 * n): at = string(at)
    at = string(at + 8)
    return at + 4
sid = session()
register(sid, 1, 20000); register(sid, 2, 20000)
for step in range(2): exchange(sid, 1, step); exchange(sid, 2, step)
rec = b"".join(c.data for c in s.SaveBucketState(pb.SaveBucketStateRequest(session_id=sid, bucket_id=1), timeout=30))
at = next_step_at(rec)
saved_step = struct.unpack_from("<Q", rec, at)[0]
body = bytearray(rec[:-8]); struct.pack_into("<Q", body, at, 2**64 - 1)
forged = bytes(body) + struct.pack("<Q", fnv(body))
def load(b, r):
    try:
        s.LoadBucketState(iter([pb.BucketStateChunk(session_id=sid, bucket_id=b, total_bytes=len(r), data=r)]), timeout=30)
        return "OK"
    except grpc.RpcError as e:
        return err(e)
register(sid, 3, 20000)
out["records"] = {"saved_step": saved_step, "forged_into_fresh": load(3, forged),
                  "genuine_after_exchanges": load(2, rec), "genuine_into_fresh": load(3, rec)}
s.Goodbye(pb.GoodbyeRequest(session_id=sid), timeout=10)
print(json.dumps(out))
"""


def main():
    vuid = uid(VICTIM)
    # 1. Directory squatting: the attacker makes the victim's default directory first.
    squat = f"/tmp/spex-{vuid}"
    shutil.rmtree(squat, ignore_errors=True)
    as_user(ATTACKER, ["mkdir", "-m", "0777", squat])
    os.chmod(squat, 0o777)
    log = os.path.join(W, "squat.log")
    p = popen_as(VICTIM, ["timeout", "30", "mpirun", "-np", "1", SPEXD, "--job=squat", "--log_level=info"], log)
    p.wait(40)
    text = open(log).read()
    bound = os.path.exists(os.path.join(squat, "squat"))
    record("squat_default_socket_directory", bound or "owned by uid" not in text,
           "daemon refused: " + next((l for l in text.splitlines() if "owned by" in l), text[-200:]).strip()[:200])
    shutil.rmtree(squat, ignore_errors=True)

    # 2. An impostor socket where the victim's trainer looks.
    pub = private_dir("root", "pub", 0o1777)
    fake = os.path.join(pub, "node.sock")
    imp = popen_as(ATTACKER, [PY, "-c", IMPOSTOR, fake], os.path.join(W, "impostor.log"))
    for _ in range(100):
        if os.path.exists(fake):
            break
        time.sleep(0.05)
    r = py_as(VICTIM, "import spex,sys\ntry:\n spex.Client(sys.argv[1], connect_timeout=3)\n print('CONNECTED')\n"
                      "except spex.SpexSecurityError as e:\n print('REFUSED', e)\nexcept Exception as e:\n print('OTHER', e)",
              fake)
    record("impostor_socket", "REFUSED" not in r.stdout, r.stdout.strip()[:200])
    stop(imp)

    # The victim's daemon, its socket deliberately open to everyone (0666 in a 0711 directory) so
    # that the kernel-credential layer is what stops the others; the attacker is a read-only
    # monitor (--allow_uids), the stranger nothing.
    vdir = private_dir(VICTIM, "victim", 0o711)
    tldir = private_dir(VICTIM, "victim-timelines", 0o700)
    vsock = os.path.join(vdir, "node.sock")
    vlog = os.path.join(W, "victim-spexd.log")
    daemon = start_daemon(VICTIM, vsock, vlog, "--local_trainers=2", "--socket_mode=0666",
                          f"--allow_uids={uid(ATTACKER)}", f"--timeline_dir={tldir}", "--max_connections=16",
                          "--dense_fallback=off")
    stop_file = os.path.join(W, "stop-job")
    job = popen_as(VICTIM, [PY, "-c", JOB, vsock, stop_file], os.path.join(W, "job.log"))
    sid, tpid = 0, 0
    for _ in range(300):  # the session ids and pid, as root sees them (the "log" a thief reads)
        r = subprocess.run([PY, "-c", "import grpc,sys\nfrom spex.proto import spex_pb2 as pb, spex_pb2_grpc as g\n"
                            "s=g.SpexStub(grpc.insecure_channel('unix:'+sys.argv[1]))\n"
                            "print(*[f'{x.session_id} {x.pid}' for x in s.ListSessions(pb.ListSessionsRequest(),timeout=5).sessions])",
                            vsock], capture_output=True, text=True, env=os.environ)
        parts = r.stdout.split()
        if len(parts) >= 4:
            sid, tpid = int(parts[0]), int(parts[1])
            break
        time.sleep(0.1)
    if not sid:
        print("victim job did not start:", open(os.path.join(W, "job.log")).read()[-800:], open(vlog).read()[-800:])
        return 2
    record("forged_pid_recorded", tpid != job.pid and not _is_child(tpid, job.pid),
           f"session pid {tpid} (the job's process {job.pid})")

    # 3. A foreign process (the stranger) connecting and calling.
    r = py_as(STRANGER, GRPC_PROBE, vsock, str(sid), str(tpid))
    out = json.loads(r.stdout or "{}")
    record("foreign_process_connecting", any(v[0] == "OK" for v in out.values()) or not out,
           "; ".join(f"{k}={v[0]}" for k, v in out.items()) or r.stderr[-200:])

    # 4-7. The monitor user with a stolen id, a guessed id, a forged pid, density and timeline.
    r = py_as(ATTACKER, GRPC_PROBE, vsock, str(sid), str(tpid))
    out = json.loads(r.stdout or "{}")
    ids_leaked = out.get("ListSessions", ["", ""])[0] == "OK" and str(sid) in out["ListSessions"][1]
    record("list_sessions_leaks_ids", ids_leaked, str(out.get("ListSessions")))
    for name in ("Exchange_stolen", "Register_stolen", "Goodbye_stolen"):
        record(f"stolen_session_id:{name.split('_')[0]}", out.get(name, ["?"])[0] != "PERMISSION_DENIED",
               str(out.get(name)))
    record("guessed_session_id", out.get("Goodbye_guessed", ["?"])[0] not in ("NOT_FOUND", "PERMISSION_DENIED"),
           str(out.get("Goodbye_guessed")))
    record("forged_pid_hello", out.get("Hello_forged_pid", ["?"])[0] == "OK", str(out.get("Hello_forged_pid")))
    record("set_density_by_another_user", out.get("SetDensity", ["?"])[0] == "OK", str(out.get("SetDensity")))
    record("stalled_load_stream_by_another_user", out.get("LoadBucketState_stalled", ["?"])[0] != "PERMISSION_DENIED",
           str(out.get("LoadBucketState_stalled")))
    record("timeline_by_another_user", out.get("StartTimeline", ["?"])[0] == "OK" or
           os.path.exists("/tmp/spex-hostile-tl.json"), str(out.get("StartTimeline")))

    # 8. A hostile process of the victim's own user with the stolen id (another pid).
    r = py_as(VICTIM, GRPC_PROBE, vsock, str(sid), str(tpid))
    out = json.loads(r.stdout or "{}")
    for name in ("Exchange_stolen", "Goodbye_stolen"):
        record(f"same_user_other_process:{name.split('_')[0]}", out.get(name, ["?"])[0] != "PERMISSION_DENIED",
               str(out.get(name)))

    # 9. Timeline paths outside --timeline_dir (the owner asking: still refused).
    escaped = False
    details = []
    for path in ("/etc/spex-hostile.json", os.path.join(tldir, "..", "escape.json"), os.path.join(W, "x.json")):
        r = py_as(VICTIM, "import grpc,sys\nfrom spex.proto import spex_pb2 as pb, spex_pb2_grpc as g\n"
                          "s=g.SpexStub(grpc.insecure_channel('unix:'+sys.argv[1]))\ntry:\n"
                          " s.StartTimeline(pb.StartTimelineRequest(path=sys.argv[2]),timeout=5); print('OK')\n"
                          " s.StopTimeline(pb.StopTimelineRequest(),timeout=5)\n"
                          "except grpc.RpcError as e: print(e.code().name)", vsock, path)
        details.append(f"{os.path.basename(path)}={r.stdout.strip()}")
        escaped |= "OK" in r.stdout or os.path.exists(os.path.normpath(path))
    record("timeline_outside_directory", escaped, " ".join(details))

    # 10. Connection floods: the stranger (refused at accept) and the monitor (over the limit).
    for user in (STRANGER, ATTACKER):
        r = py_as(user, FLOOD, vsock, "300")
        opened, alive = (r.stdout.split() + ["0", "0"])[:2]
        record(f"connection_flood:{user}", int(alive) > 16, f"{opened} connected, {alive} kept open by spexd")

    # 11. Truncated segments, in the attacker's own 2-node world (its own job), beside the victim's.
    adir = private_dir(ATTACKER, "attacker", 0o700)
    asocks = [os.path.join(adir, f"node{r}.sock") for r in (0, 1)]
    ad = popen_as(ATTACKER, ["mpirun", "-np", "2", "--bind-to", "none", SPEXD,
                             f"--socket={os.path.join(adir, 'node{rank}.sock')}", "--log_level=info", "--threads=1",
                             "--local_trainers=1", "--dense_fallback=off"], os.path.join(W, "attacker-spexd.log"))
    for _ in range(300):
        if all(os.path.exists(s) for s in asocks) or ad.poll() is not None:
            break
        time.sleep(0.1)
    r = py_as(ATTACKER, TRUNCATE, *asocks, timeout=150)
    try:
        t = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        t = {"error": (r.stdout + r.stderr)[-300:]}
    alive = ad.poll() is None
    exact = t.get("good_steps_exact") and t.get("next_job_exact")
    for b, what in ((0, "truncated_segment_behind_header"), (1, "truncated_segment_to_nothing")):
        said = str(t.get(f"node1_bucket{b}", "OK"))
        failed = said.startswith("DATA_LOSS") and "shrank the bucket's shared segment" in said  # node 0's reason
        prompt = t.get(f"node1_bucket{b}_seconds", 99) < 5
        record(what, not (alive and exact and failed and prompt),
               f"daemons alive={alive}, node 1: {t.get(f'node1_bucket{b}')} after {t.get(f'node1_bucket{b}_seconds')} s; "
               f"node 0: {t.get('node0_bucket0') if b == 0 else 'silent'}; good steps and next job exact={exact}"
               + ("" if "error" not in t else f" {t['error']}"))
    stop(ad)

    # 12. The resource limits, on the attacker's own daemon.
    ldir = private_dir(ATTACKER, "limits", 0o700)
    ltl = private_dir(ATTACKER, "limits-timelines", 0o700)
    lsock = os.path.join(ldir, "node.sock")
    ld = start_daemon(ATTACKER, lsock, os.path.join(W, "limits-spexd.log"), "--local_trainers=2",
                      "--rpc_threads=6", "--max_streams_per_connection=2", "--max_exchange_wait=2s",
                      "--max_connections=12", f"--timeline_dir={ltl}", "--timeline_max_bytes=20000",
                      "--dense_fallback=off")
    r = py_as(ATTACKER, LIMITS, lsock, ltl, timeout=150)
    try:
        t = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        t = {"error": (r.stdout + r.stderr)[-400:]}
    alive = ld.poll() is None
    after = alive and t.get("job_after_exact") is True
    w = t.get("max_exchange_wait", [99, ""])
    record("limit:max_exchange_wait", not (after and 1.5 <= w[0] < 10 and w[1].startswith("DEADLINE_EXCEEDED")
                                           and "--max_exchange_wait" in w[1]), f"{w}")
    sec = t.get("streams_seconds", [])
    record("limit:max_streams_per_connection", not (after and len(sec) == 4 and sum(x < 3 for x in sec) == 2),
           f"4 waiting calls on one connection ended after {sec} s (2 at a time)")
    th = t.get("threads", [])
    # Refused by spexd (naming --rpc_threads), or by gRPC's own pool when every thread is busy
    # at that moment, some of them refusing (also RESOURCE_EXHAUSTED; timing decides which).
    ours = [x for x in th if x.startswith("RESOURCE_EXHAUSTED") and "--rpc_threads" in x]
    refused = ours + [x for x in th if x == "RESOURCE_EXHAUSTED: Server Threadpool Exhausted"]
    waited = [x for x in th if x.startswith("DEADLINE_EXCEEDED")]
    others = sorted(set(th) - set(refused) - set(waited))
    # 3 may wait at once; a refused call's connection is free again, so a late one may wait too.
    record("limit:rpc_threads", not (after and len(th) == 8 and len(refused) >= 3 and ours and
                                     not others and t.get("short_call_during_flood") == "OK"),
           f"{len(refused)} of {len(th)} waiting calls refused ({len(ours)} by spexd: {ours[:1]}), {len(waited)} "
           f"waited, other answers "
           f"{others}, GetStats during the flood: {t.get('short_call_during_flood')}")
    c = str(t.get("connection_over_limit"))
    record("limit:max_connections", not (after and c.startswith("DaemonUnavailableError") and "--max_connections" in c),
           c)
    tl = t.get("timeline", {})
    record("limit:timeline_max_bytes", not (after and 0 < tl.get("bytes", 1 << 30) <= 20000 + 4096
                                            and tl.get("mode") == "0o600" and tl.get("valid_json")),
           f"{tl}; job on the same daemon afterwards exact={t.get('job_after_exact')}"
           + ("" if "error" not in t else f" {t['error']}"))
    stop(ld)

    # 13. Checkpoint streams and records, on the attacker's own daemon.
    cdir = private_dir(ATTACKER, "ckpt", 0o700)
    csock = os.path.join(cdir, "node.sock")
    cd = start_daemon(ATTACKER, csock, os.path.join(W, "ckpt-spexd.log"), "--local_trainers=1",
                      "--rpc_threads=16", "--max_daemon_bytes=1073741824", "--max_checkpoint_streams=4",
                      "--checkpoint_stream_timeout=2s", "--min_sparse_elements=0", "--dense_fallback=off")
    r = py_as(ATTACKER, CKPT, csock, timeout=150)
    try:
        t = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        t = {"error": (r.stdout + r.stderr)[-400:]}
    alive = cd.poll() is None
    sv = t.get("save", {})
    record("checkpoint_save_stalls_node",
           not (alive and sv.get("exchanges_during", 0) >= 2
                and sv.get("worst_exchange_s", 99) < 0.6 * sv.get("first_chunk_s", 0)),
           f"{sv}: the slowest exchange of another bucket while the record was copied and encoded, "
           f"against the time to its first chunk" + ("" if "error" not in t else f" {t['error']}"))
    st = t.get("streams", [])
    # The session's limit is the daemon's here: a record's memory is refused naming either.
    mem = ("--max_session_bytes", "--max_daemon_bytes")
    capped = [x for x in st if x[1].startswith("RESOURCE_EXHAUSTED") and
              ("--max_checkpoint_streams" in x[1] or any(f in x[1] for f in mem))]
    kinds = sorted({x[1][:60] for x in st})
    cancelled = [x for x in st if x[1].startswith("CANCELLED") and 1.5 <= x[0] < 6]
    record("checkpoint_streams_bypass_limits",
           not (alive and len(st) == 15 and len(cancelled) <= 2 and len(capped) + len(cancelled) == 15
                and all(x[0] < 1 for x in capped) and t.get("stats_during") == "OK"
                and any(f in str(t.get("register_during")) for f in mem) and t.get("register_after") == "OK"
                and str(t.get("unread_save")).startswith("CANCELLED")),
           f"15 stalled loads: {len(capped)} refused at once, {len(cancelled)} cancelled at the timeout "
           f"({st[:1]} .. {st[-1:]}; answers {kinds}); GetStats {t.get('stats_during')}; a registration during: "
           f"{str(t.get('register_during'))[:120]}, after: {t.get('register_after')} "
           f"({t.get('register_after_s')} s); an unread save: "
           f"{str(t.get('unread_save'))[:60]} (read on after 3.5 s)")
    rc = t.get("records", {})
    record("checkpoint_record_forged",
           not (alive and str(rc.get("forged_into_fresh")).startswith("DATA_LOSS")
                and str(rc.get("genuine_after_exchanges")).startswith("FAILED_PRECONDITION")
                and rc.get("genuine_into_fresh") == "OK" and rc.get("saved_step") == 2),
           f"{rc}")
    stop(cd)

    # 14. spexrun's and the client's attacks (hostile_spexrun.py): -x values on command lines, a
    # SIGKILLed spexrun, a squatted /tmp/spex-<uid>, a host name as an ssh option, a symlink on
    # the way to the socket.
    import hostile_spexrun
    hostile_spexrun.attacks(hostile_spexrun.helpers(sys.modules[__name__], VICTIM, ATTACKER, STRANGER))

    # The victim's job finishes.
    open(stop_file, "w").close()
    try:
        job.wait(120)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
    lines = open(os.path.join(W, "job.log")).read().strip().splitlines()
    try:
        j = json.loads(lines[-1])
    except (ValueError, IndexError):
        j = {"steps": 0, "bad": 1, "errors": lines[-3:]}
    disturbed = 1 if (j["bad"] or j["steps"] < 40 or daemon.poll() is not None) else 0
    print(f"victim job: {j['steps']} steps, {j['bad']} bad, daemon alive={daemon.poll() is None} {j['errors']}")
    stop(daemon)
    tried = len(results)
    succeeded = sum(1 for _, s, _ in results if s)
    print(f"HOSTILE-TENANT FIGURE: attacks tried {tried}, succeeded {succeeded}, jobs disturbed {disturbed}")
    with open(os.path.join(W, "figure.json"), "w") as f:
        json.dump({"tried": tried, "succeeded": succeeded, "disturbed": disturbed,
                   "attacks": [[a, s, d] for a, s, d in results]}, f)
    return 0 if succeeded == 0 and disturbed == 0 else 1


def _is_child(pid, parent):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().split(")")[1].split()[1]) == parent
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
