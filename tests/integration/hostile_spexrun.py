"""The hostile-tenant suite's attacks on spexrun and the client's socket check (called by
hostile_tenant.py, which passes its helpers; kept apart so that the two files change apart):

- the victim's spexrun with -x HF_TOKEN and a forwarded SPEX_* value, on a host reached through
  an rsh agent (a logging stand-in for ssh that runs the command here) and mpirun: another user
  reads every process's command line (and tries their environments) for the values;
- the victim's spexrun killed with SIGKILL: its mpirun, spexd, agent, trainer, socket directory
  and segments must be gone within seconds;
- the attacker's symlink where the victim's /tmp/spex-<uid> goes: spexrun must refuse before it
  creates anything where the link leads;
- a host name that ssh would read as an option (-I loads a library): refused, the rsh agent
  never called;
- the attacker's symlink on the way to the victim's socket (sticky public directory, then
  "link/.."): the victim's client must refuse, as the kernel goes through the attacker's link."""

import glob
import os
import secrets
import shutil
import signal
import subprocess
import time

# A trainer that says it runs, then waits for a stop file (argv[1]).
HOLD = r'''
import os, sys, time
print("holding", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.1)
'''

# Run as another user: which processes' command lines (and readable environments) hold a value
# (given reversed: its own command line must not hold them).
SCAN = r'''
import os, sys
values = [v[::-1].encode() for v in sys.argv[1:]]
cmd, env = [], []
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    for name, out in (("cmdline", cmd), ("environ", env)):
        try:
            data = open(f"/proc/{pid}/{name}", "rb").read()
        except OSError:
            continue
        if any(v in data for v in values):
            out.append(f"{pid}:{data[:160]!r}")
print(len(cmd), len(env), cmd[:2], env[:2])
'''

CLIENT = r'''
import spex, sys
try:
    spex.Client(sys.argv[1], connect_timeout=3)
    print("CONNECTED")
except spex.SpexSecurityError as e:
    print("REFUSED", e)
except Exception as e:
    print("OTHER", type(e).__name__, e)
'''

LISTEN = r'''
import os, socket, sys, time
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(4)
print("listening", flush=True); time.sleep(60)
'''


def _procs(marker):
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
            zombie = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
        except (OSError, IndexError):
            continue
        if marker.encode() in cmd and not zombie:
            out.append(int(pid))
    return out


def _argv(pid):
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace").split("\0")
    except OSError:
        return []


def attacks(h):
    """h: the suite's helpers and names (W, SPEXD, PY, ENV, VICTIM, ATTACKER, STRANGER, uid,
    as_user, py_as, popen_as, private_dir, record)."""
    W, PY, VICTIM, ATTACKER = h["W"], h["PY"], h["VICTIM"], h["ATTACKER"]
    record, uid = h["record"], h["uid"]
    vuid = uid(VICTIM)
    vlogs = h["private_dir"](VICTIM, "spexrun-victim", 0o755)
    rsh = os.path.join(W, "fake-ssh")  # logs its arguments, then runs the command on this host
    with open(rsh, "w") as f:
        f.write('#!/bin/sh\nprintf "%s\\n" "$@" >> "$RSH_LOG"\n[ "$1" = -- ] && shift\nshift\nexec sh -c "$*"\n')
    os.chmod(rsh, 0o755)
    hold = os.path.join(W, "hold.py")
    with open(hold, "w") as f:
        f.write(HOLD)
    os.chmod(hold, 0o644)
    stop_file = os.path.join(vlogs, "stop")
    env = {**h["ENV"], "SPEXD": h["SPEXD"], "RSH_LOG": os.path.join(vlogs, "rsh.log")}

    def spexrun(args, extra=None, log="spexrun.log"):
        return subprocess.Popen([shutil.which("runuser"), "-u", VICTIM, "--", PY, "-m", "spex.run", *args],
                                env={**env, **(extra or {})}, stdout=open(os.path.join(W, log), "w"),
                                stderr=subprocess.STDOUT, cwd=W)

    def start_job(hosts, extra_args, extra_env, log):
        """The victim's spexrun with a trainer that holds; (runuser's Popen, spexrun's pid or
        None when the trainer did not start, the output so far)."""
        if os.path.exists(stop_file):
            os.unlink(stop_file)
        p = spexrun(["-H", hosts, *extra_args, "--spexd-arg=--log_level=error", "--", PY, hold, stop_file],
                    extra_env, log=log)
        deadline = time.monotonic() + 90
        said = ""
        while time.monotonic() < deadline and p.poll() is None and "holding" not in said:
            time.sleep(0.2)
            said = open(os.path.join(W, log)).read()
        pids = [q for q in _procs(hold) if _argv(q)[:4] == [PY, "-m", "spex.run", "-H"]]
        return p, (pids[0] if pids and "holding" in said else None), said

    shutil.rmtree(f"/tmp/spex-{vuid}", ignore_errors=True)
    # 1. -x values on command lines, on a "remote" host (rsh agent + mpirun through it).
    token, forwarded = secrets.token_hex(16), secrets.token_hex(16)
    p, pid, said = start_job("spexremote:1", ["--rsh-agent", rsh, "-x", "HF_TOKEN"],
                             {"HF_TOKEN": token, "SPEX_HOSTILE_FORWARDED": forwarded}, "spexrun-x.log")
    if pid is None:
        record("spexrun_x_values_on_command_lines", True, f"the victim's job did not start: {said[-300:]}")
    else:
        r = h["py_as"](h["STRANGER"], SCAN, token[::-1], forwarded[::-1])
        parts = (r.stdout or "9 9").split(" ", 2)
        in_cmd, in_env = int(parts[0]), int(parts[1])
        log = open(os.path.join(vlogs, "rsh.log")).read()
        record("spexrun_x_values_on_command_lines", in_cmd > 0 or in_env > 0 or token in log or forwarded in log,
               f"another user found the values on {in_cmd} command lines and in {in_env} environments "
               f"{r.stdout.strip()[:200]}; ssh's arguments held them: {token in log or forwarded in log}")
        os.kill(pid, signal.SIGTERM)
    open(stop_file, "w").close()
    try:
        p.wait(60)
    except subprocess.TimeoutExpired:
        p.kill()

    # 2. The victim's spexrun SIGKILLed (the OOM killer, kill -9): its world must end with it.
    before_seg = set(glob.glob("/dev/shm/spex-*"))
    p, pid, said = start_job("localhost:1", [], {}, "spexrun-kill.log")
    if pid is None:
        record("spexrun_sigkill_leaves_daemon_world", True, f"the victim's job did not start: {said[-300:]}")
    else:
        job = f"spexrun-{pid}-"
        dirs = glob.glob(f"/tmp/spex-{vuid}/{job}*")
        world = _procs(job)
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30 and (_procs(job) or _procs(hold) or any(os.path.exists(d) for d in dirs)):
            time.sleep(0.2)
        left = _procs(job) + _procs(hold)
        took = time.monotonic() - t0
        for q in left:
            os.kill(q, signal.SIGKILL)
        time.sleep(0.5)
        pids = {str(q) for q in world}  # this world's daemons' segments: others may run beside
        segs = {g for g in set(glob.glob("/dev/shm/spex-*")) - before_seg if g.split("-")[1] in pids}
        dir_left = any(os.path.exists(d) for d in dirs)
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
        record("spexrun_sigkill_leaves_daemon_world", not world or bool(left) or len(dirs) != 1 or dir_left or
               bool(segs), f"spexrun {pid} SIGKILLed with {len(world)} processes of its world; after {took:.1f} s "
               f"left: {left} (mpirun, spexd, agent, trainer), socket directory {dirs} left: {dir_left}, "
               f"segments {sorted(segs)}")
        for name in segs:  # not left for the next case
            os.unlink(name)
    open(stop_file, "w").close()
    try:
        p.wait(60)
    except subprocess.TimeoutExpired:
        p.kill()

    # 3. The attacker's symlink where the victim's /tmp/spex-<uid> goes.
    base = f"/tmp/spex-{vuid}"
    shutil.rmtree(base, ignore_errors=True)
    target = h["private_dir"](ATTACKER, "attacker-spexrun-target", 0o777)
    h["as_user"](ATTACKER, ["ln", "-s", target, base])
    p = spexrun(["-H", "localhost:1", "--", "true"], log="spexrun-squat.log")
    seen = set()  # what the attacker sees appear in its directory meanwhile
    while p.poll() is None:
        seen.update(os.listdir(target))
        time.sleep(0.005)
    rc = p.wait()
    seen.update(os.listdir(target))
    said = open(os.path.join(W, "spexrun-squat.log")).read()
    record("spexrun_follows_a_squatted_symlink", rc == 0 or bool(seen) or "symlink owned by" not in said,
           f"exit {rc}, created where the link leads: {sorted(seen)}; {said.strip()[-200:]}")
    os.unlink(base)

    # 4. A host name ssh would read as an option.
    open(os.path.join(vlogs, "rsh.log"), "w").close()
    p = spexrun(["--hosts=-Ilibevil.so:1", "--rsh-agent", rsh, "--", "true"], log="spexrun-dash.log")
    rc = p.wait(60)
    said = open(os.path.join(W, "spexrun-dash.log")).read()
    called = open(os.path.join(vlogs, "rsh.log")).read()
    record("spexrun_host_name_as_option", rc == 0 or called != "" or "starts with '-'" not in said,
           f"exit {rc}, rsh agent called with {called.split()[:3]}; {said.strip()[-160:]}")

    # 5. The attacker's symlink on the way to the victim's socket: a sticky public directory (as
    # /tmp) holds the attacker's link to the attacker's own directory; the victim's socket sits
    # in that directory's parent, which the attacker controls (and could swap it in).
    pub = h["private_dir"]("root", "pub-links", 0o1777)
    att = h["private_dir"](ATTACKER, "attacker-area", 0o777)
    os.makedirs(os.path.join(att, "sub"), exist_ok=True)
    os.chown(os.path.join(att, "sub"), uid(ATTACKER), uid(ATTACKER))
    link = os.path.join(pub, "spexlink")
    h["as_user"](ATTACKER, ["ln", "-s", os.path.join(att, "sub"), link])
    if os.path.exists(os.path.join(att, "x.sock")):
        os.unlink(os.path.join(att, "x.sock"))
    listener = h["popen_as"](VICTIM, [PY, "-c", LISTEN, os.path.join(att, "x.sock")], os.path.join(W, "listen.log"))
    for _ in range(100):
        if os.path.exists(os.path.join(att, "x.sock")):
            break
        time.sleep(0.05)
    r = h["py_as"](VICTIM, CLIENT, os.path.join(link, "..", "x.sock"))
    record("socket_through_another_users_symlink", "REFUSED" not in r.stdout or "symlink owned by" not in r.stdout,
           (r.stdout or r.stderr).strip()[:200])
    h["stop"](listener)


def helpers(t, victim, attacker, stranger):
    """The helpers `attacks` takes, from the hostile_tenant module `t`, for these users."""
    return {"W": t.W, "SPEXD": t.SPEXD, "PY": t.PY, "ENV": t.ENV, "VICTIM": victim, "ATTACKER": attacker,
            "STRANGER": stranger, "uid": t.uid, "as_user": t.as_user, "py_as": t.py_as, "popen_as": t.popen_as,
            "private_dir": t.private_dir, "record": t.record, "stop": t.stop}


if __name__ == "__main__":
    # Alone (as root, the users existing, W holding spexd and a venv as hostile_tenant_test.sh
    # makes them): hostile_spexrun.py W SPEXD PY [VICTIM ATTACKER STRANGER].
    import sys

    import hostile_tenant

    t = hostile_tenant
    attacks(helpers(t, *(sys.argv[4:7] or [t.VICTIM, t.ATTACKER, t.STRANGER])))
    succeeded = sum(1 for _, s, _ in t.results if s)
    print(f"spexrun attacks tried {len(t.results)}, succeeded {succeeded}")
    sys.exit(1 if succeeded else 0)
