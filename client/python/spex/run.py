"""spexrun: starts a spex job on several hosts the way `horovodrun` and `torchrun` do.

    spexrun -H host1:4,host2:4 -- python3 train.py          # 2 hosts, 4 trainers each
    spexrun --hostfile hosts.txt -- python3 train.py         # "host slots=4" lines (Open MPI's form)
    spexrun -- python3 train.py                              # inside a SLURM allocation
    spexrun --emulated 2 -- python3 train.py                 # 2 emulated hosts of this machine

What it does, in order:
1. One `spexd` per host, all in one MPI world under Open MPI's `mpirun` (ssh to reach other
   hosts, or --rsh-agent), with `--local_trainers` = the host's slots and its socket at
   /tmp/spex-<uid>/spexrun-<id>/node<i>.sock.
2. One agent per host (this module run with --agent, through the same ssh or rsh agent; on this
   host directly): it waits until its daemon answers the gRPC health check, reports "ready", and
   when every host is ready starts the host's trainers with the environment torchrun gives
   (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, MASTER_ADDR,
   MASTER_PORT) plus SPEX_SOCKET, so `init_process_group(init_method="env://")` and
   `spex.torch.register(ddp)` need no arguments. Every output line is prefixed
   `[RANK,LOCAL_RANK]<stdout>:` or `<stderr>:` and streamed live.
3. When every trainer has exited 0, the daemons are stopped and spexrun exits 0. When a trainer
   exits non-zero or dies, or a daemon or agent goes away, the other trainers and the daemons are
   stopped and spexrun exits non-zero naming the rank (or host) and its status. Ctrl-C and
   SIGTERM stop everything. An agent whose connection closes (ssh gone) stops its trainers; a
   watchdog process (--watchdog) stops the daemons when spexrun itself dies (SIGKILL).

No variable's value goes on a command line (every user of a host can read those): -x variables
reach an agent here in its environment, an agent on another host through its stdin (AGENT_BOOT).

The agent protocol is line based: an agent's stdout carries the trainers' tagged lines and its
own control lines, which start with CONTROL; spexrun writes "go" (start the trainers) and
"stop" to its stdin, and a closed stdin means stop.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket as _socket
import subprocess
import sys
import threading
import time
import queue
from dataclasses import dataclass
from typing import Dict, IO, List, Optional, Sequence, Tuple

from .cluster import _signal, children_of, find_spexd
from .paths import private_directory_problem

CONTROL = "@spexrun@ "
# How an agent on another host starts (python -c AGENT_BOOT --agent ...): it reads one JSON line
# of variables from its stdin (byte by byte, so nothing after the line is taken from the agent),
# puts them in its environment and becomes `python -m spex.run --agent ...`. The values thus
# never appear on a command line there or here. Only the standard library: PYTHONPATH may be
# among the variables.
AGENT_BOOT = """import json, os, sys
line = b""
while not line.endswith(b"\\n"):
    c = os.read(0, 1)
    if not c:
        sys.exit(0)
    line += c
os.environ.update(json.loads(line))
os.execv(sys.executable, [sys.executable, "-m", "spex.run", *sys.argv[1:]])
"""
# Environment variables an agent on another host gets from the launcher (as mpirun's -x would
# pass them), besides the ones named with -x: the Python and library search paths, the virtual
# environment, and spex's and Open MPI's own settings.
FORWARD_PREFIXES = ("SPEX_", "OMPI_MCA_", "NCCL_", "CUDA_VISIBLE_DEVICES")
FORWARD_NAMES = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "OMP_NUM_THREADS")
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


class LaunchError(Exception):
    """A bad command line or host list: the message says what to fix."""


@dataclass
class Host:
    name: str
    slots: int


# -- host lists ---------------------------------------------------------------------------------

_HOST_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check_host(name: str, where: str) -> None:
    if not name:
        raise LaunchError(f"{where}: empty host name")
    if name.startswith("-"):
        # ssh and mpirun would read it as an option (-oProxyCommand=... runs a command).
        raise LaunchError(f"{where}: '{name}' is not a host name: it starts with '-', which ssh and mpirun would "
                          f"read as an option; give the host's name or address")
    if not _HOST_RE.match(name):
        raise LaunchError(f"{where}: '{name}' is not a host name (letters, digits, '.', '-', '_')")


def _check_slots(text: str, host: str, where: str) -> int:
    try:
        slots = int(text)
    except ValueError:
        raise LaunchError(f"{where}: slots of '{host}' must be a whole number, got '{text}'") from None
    if slots < 1:
        raise LaunchError(f"{where}: '{host}' has {slots} slots; every host needs at least 1 (host:N, N >= 1)")
    return slots


def _unique(hosts: List[Host], where: str) -> List[Host]:
    seen = set()
    for h in hosts:
        if h.name in seen:
            raise LaunchError(f"{where}: host '{h.name}' is listed twice; give it once with all of its slots "
                              f"(host:N)")
        seen.add(h.name)
    if not hosts:
        raise LaunchError(f"{where}: no hosts")
    return hosts


def parse_hosts(spec: str) -> List[Host]:
    """`host1:4,host2:4` (a host without `:N` has 1 slot, as for horovodrun)."""
    hosts = []
    for item in spec.split(","):
        item = item.strip()
        name, sep, slots = item.partition(":")
        _check_host(name, f"-H {spec}")
        hosts.append(Host(name, _check_slots(slots, name, f"-H {spec}") if sep else 1))
    return _unique(hosts, f"-H {spec}")


def read_hostfile(path: str) -> List[Host]:
    """Open MPI's and DeepSpeed's hostfile form: a host per line, `host slots=N` (or `host:N`,
    or `host` for 1 slot); `#` starts a comment."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise LaunchError(f"--hostfile {path}: {e.strerror}") from None
    hosts = []
    for n, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{n}"
        fields = line.split()
        name, sep, slots = fields[0].partition(":")
        _check_host(name, where)
        count = _check_slots(slots, name, where) if sep else 1
        for extra in fields[1:]:
            key, eq, value = extra.partition("=")
            if key in ("slots", "max_slots", "max-slots") and eq:
                if key == "slots":
                    count = _check_slots(value, name, where)
            else:
                raise LaunchError(f"{where}: unknown field '{extra}' (expected 'host slots=N')")
        hosts.append(Host(name, count))
    return _unique(hosts, f"--hostfile {path}")


def expand_hostlist(text: str) -> List[str]:
    """SLURM's compact host list: `node[01-03,7],gpu1` -> node01, node02, node03, node7, gpu1
    (several bracket groups in one name multiply out)."""
    names: List[str] = []
    depth, start = 0, 0
    for i, c in enumerate(text + ","):
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        elif c == "," and depth == 0:
            part = text[start:i].strip()
            if part:
                names.extend(_expand_one(part))
            start = i + 1
    return names


def _expand_one(name: str) -> List[str]:
    m = re.search(r"\[([^\]]*)\]", name)
    if not m:
        return [name]
    head, tail = name[:m.start()], name[m.end():]
    out = []
    for r in m.group(1).split(","):
        lo, dash, hi = r.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise LaunchError(f"SLURM host list: cannot read range '{r}' in '{name}'")
        width = len(lo)
        for v in range(int(lo), int(hi if dash else lo) + 1):
            out.extend(_expand_one(f"{head}{v:0{width}d}{tail}"))
    return out


def expand_tasks_per_node(text: str) -> List[int]:
    """SLURM_TASKS_PER_NODE: `2(x3),1` -> [2, 2, 2, 1]."""
    out = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise LaunchError(f"SLURM_TASKS_PER_NODE: cannot read '{part}' in '{text}'")
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return out


def slurm_hosts(env: Dict[str, str]) -> Optional[List[Host]]:
    """The allocation's hosts and slots (tasks per node), or None outside SLURM."""
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        return None
    names = expand_hostlist(nodelist)
    for n in names:
        _check_host(n, f"SLURM host list {nodelist}")
    tasks = env.get("SLURM_TASKS_PER_NODE") or env.get("SLURM_JOB_CPUS_PER_NODE")
    per_node = expand_tasks_per_node(tasks) if tasks else [1] * len(names)
    if len(per_node) != len(names):
        raise LaunchError(f"SLURM allocation: {len(names)} hosts ({nodelist}) but {len(per_node)} task counts "
                          f"({tasks}); pass -H to choose hosts and slots")
    return _unique([Host(n, s) for n, s in zip(names, per_node) if s > 0], "SLURM allocation")


def is_local(name: str) -> bool:
    return name in LOCAL_NAMES or name == _socket.gethostname() or name == _socket.getfqdn()


# -- the agent: one per host --------------------------------------------------------------------

def daemon_healthy(path: str, timeout: float = 2.0) -> bool:
    """Whether the spexd at `path` answers grpc.health.v1.Health/Check with SERVING (called
    generically: the request for the whole server is empty, SERVING is field 1 = 1)."""
    if not os.path.exists(path):
        return False
    import grpc
    channel = grpc.insecure_channel("unix:" + path)
    try:
        check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        return check(b"", timeout=timeout) == b"\x08\x01"
    except grpc.RpcError:
        return False
    finally:
        channel.close()


class Agent:
    """Runs on one host: waits for its daemon, starts its trainers on "go", tags their output,
    reports their exits, and stops them on "stop", a closed stdin or SIGTERM."""

    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.out_lock = threading.Lock()
        self.procs: List[subprocess.Popen] = []
        self.stopping = threading.Event()

    def emit(self, text: str) -> None:
        with self.out_lock:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

    def control(self, text: str) -> None:
        self.emit(CONTROL + text)

    def trainer_env(self, local_rank: int) -> Dict[str, str]:
        a = self.a
        env = dict(os.environ)  # -x variables included: they came in the agent's environment
        env.update({
            "RANK": str(a.rank_base + local_rank), "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(a.world), "LOCAL_WORLD_SIZE": str(a.local_size),
            "GROUP_RANK": str(a.node), "GROUP_WORLD_SIZE": str(a.nodes),
            "ROLE_RANK": str(a.rank_base + local_rank), "ROLE_WORLD_SIZE": str(a.world),
            "MASTER_ADDR": a.master_addr, "MASTER_PORT": str(a.master_port),
            "SPEX_SOCKET": a.socket, "SPEXRUN": "1",
        })
        # As torchrun: one thread per trainer unless the user chose, when a host runs several.
        if a.local_size > 1:
            env.setdefault("OMP_NUM_THREADS", "1")
        return env

    def pump(self, stream: IO[bytes], tag: str) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            self.emit(f"{tag}{line}")
        stream.close()

    def stop_trainers(self) -> None:
        self.stopping.set()
        live = [p for p in self.procs if p.poll() is None]
        for p in live:
            _killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.a.grace
        for p in live:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs:
            _killpg(p.pid, signal.SIGKILL)  # also what a trainer left behind in its group

    def report_exit(self, rank: int, proc: subprocess.Popen) -> None:
        self.control(f"exit {rank} {proc.wait()}")

    def watch_stdin(self) -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        self.stop_trainers()

    def run(self) -> int:
        a = self.a
        signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=self.stop_trainers, daemon=True).start())
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # spexrun decides; Ctrl-C reaches it too
        deadline = time.monotonic() + a.start_timeout
        while not daemon_healthy(a.socket):
            if time.monotonic() > deadline:
                self.control(f"error spexd on {_socket.gethostname()} did not answer its health check at "
                             f"{a.socket} within {a.start_timeout:g} s")
                return 3
            time.sleep(0.1)
        self.control("ready")
        line = sys.stdin.readline()
        if line.strip() != "go":  # stopped (or spexrun gone) before the start
            self.remove_socket_dir()
            return 0
        threading.Thread(target=self.watch_stdin, daemon=True).start()
        pumps = []
        for lr in range(a.local_size):
            rank = a.rank_base + lr
            try:
                p = subprocess.Popen(a.command, env=self.trainer_env(lr), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
            except OSError as e:
                self.control(f"exit {rank} 127 cannot start {a.command[0]}: {e.strerror}")
                self.stop_trainers()
                return 0
            self.procs.append(p)
            for stream, kind in ((p.stdout, "stdout"), (p.stderr, "stderr")):
                t = threading.Thread(target=self.pump, args=(stream, f"[{rank},{lr}]<{kind}>:"), daemon=True)
                t.start()
                pumps.append(t)
        waiters = [threading.Thread(target=self.report_exit, args=(a.rank_base + lr, p), daemon=True)
                   for lr, p in enumerate(self.procs)]
        for t in waiters:
            t.start()
        for t in waiters:
            t.join()
        for t in pumps:
            t.join(timeout=5)
        # Stay until the launcher says stop (it then stops the daemons), so that this host's
        # socket directory can go once its daemon removed its socket.
        self.stopping.wait()
        self.remove_socket_dir()
        return 0

    def remove_socket_dir(self, wait: float = 10.0) -> None:
        """Removes the daemon's socket directory on this host when spexrun made it (spexrun-*)
        and the daemon has removed its socket (within `wait` seconds)."""
        parent = os.path.dirname(self.a.socket)
        if not os.path.basename(parent).startswith("spexrun-"):
            return
        deadline = time.monotonic() + wait
        while os.path.exists(self.a.socket) and time.monotonic() < deadline:
            time.sleep(0.1)
        try:
            os.rmdir(parent)
        except OSError:
            pass


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def agent_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="spexrun --agent")
    p.add_argument("--node", type=int, required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--socket", required=True)
    p.add_argument("--rank-base", type=int, required=True)
    p.add_argument("--local-size", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--master-addr", required=True)
    p.add_argument("--master-port", type=int, required=True)
    p.add_argument("--start-timeout", type=float, default=60.0)
    p.add_argument("--grace", type=float, default=3.0)
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    if a.command and a.command[0] == "--":
        a.command = a.command[1:]
    return Agent(a).run()


# -- the watchdog: stops the daemon world when spexrun dies ---------------------------------------

def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def watchdog_main(argv: Sequence[str]) -> int:
    """spexrun --watchdog LAUNCHER_PID GRACE: reads what spexrun started from its stdin, one JSON
    list a line (["mpirun", PID, SOCKET_DIR], ["emulated", SCRIPT, DIR, OWN]), until ["done"]
    (spexrun stopped it all itself) or end-of-file (spexrun died: SIGKILL, a crash). Then:
    SIGTERM to mpirun (it forwards it to every spexd, which removes its socket and segments),
    SIGKILL to its process group after GRACE + 10 s, the segments of daemons that did not stop
    cleanly and the socket directory removed; an emulated cluster is torn down (every process in
    its hosts, the namespaces, sockets and segments). The agents end by themselves: their stdin
    closed too."""
    launcher, grace = argv[0], float(argv[1])
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # a terminal's signals are spexrun's to handle
    told: List[List[str]] = []
    for line in sys.stdin:
        try:
            words = json.loads(line)
        except ValueError:
            continue
        if words == ["done"]:
            return 0
        if isinstance(words, list) and words:
            told.append([str(w) for w in words])
    if not told:
        return 0

    def say(text: str) -> None:  # to spexrun's stderr, which may have gone with it
        try:
            sys.stderr.write(f"spexrun (watchdog): {text}\n")
            sys.stderr.flush()
        except OSError:
            pass

    for words in told:
        if words[0] == "mpirun" and len(words) == 3:
            pid, socket_dir = int(words[1]), words[2]
            if _alive(pid) and socket_dir.encode() in _cmdline(pid):  # not a reused pid
                say(f"spexrun (pid {launcher}) is gone; stopping its daemons (mpirun pid {pid})")
                daemons = children_of(pid)
                _signal(pid, signal.SIGTERM)
                deadline = time.monotonic() + grace + 10
                while _alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.1)
                _killpg(pid, signal.SIGKILL)
                for d in daemons:  # a daemon SIGKILLed here left its segments
                    if not _alive(d):
                        for name in os.listdir("/dev/shm"):
                            if name.startswith(f"spex-{d}-"):
                                try:
                                    os.unlink(os.path.join("/dev/shm", name))
                                except OSError:
                                    pass
            shutil.rmtree(socket_dir, ignore_errors=True)
        elif words[0] == "emulated" and len(words) == 4:
            say(f"spexrun (pid {launcher}) is gone; tearing its emulated cluster down")
            subprocess.run(["bash", words[1], "down", words[2]], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            if words[3] == "1":
                shutil.rmtree(words[2], ignore_errors=True)
    return 0


def make_private_dirs(path: str) -> None:
    """Creates `path` and its parent (/tmp/spex-<uid>) with mode 0700 where missing, and refuses
    (LaunchError naming the owner and the fix) either when another user owns it or its symlink,
    or others can write it: checked before anything is created inside, so spexrun never follows
    another user's symlink."""
    for d in (os.path.dirname(path), path):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        except OSError as e:
            raise LaunchError(f"cannot create the socket directory {d}: {e.strerror}") from None
        problem = private_directory_problem(d, os.getuid())
        if problem is not None:
            raise LaunchError(problem)


# -- the launcher -------------------------------------------------------------------------------

def signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def describe_status(code: int) -> str:
    return f"was killed by {signal_name(code)}" if code < 0 else f"exited with status {code}"


class Launcher:
    def __init__(self, a: argparse.Namespace, hosts: List[Host]):
        self.a = a
        self.hosts = hosts
        self.world = sum(h.slots for h in hosts)
        self.job = f"spexrun-{os.getpid()}-{random.randrange(1 << 16):04x}"
        self.events: "queue.Queue[Tuple]" = queue.Queue()
        self.agents: List[Optional[subprocess.Popen]] = [None] * len(hosts)
        self.agent_tail: List[List[str]] = [[] for _ in hosts]
        self.daemons: Optional[subprocess.Popen] = None
        self.cluster = None  # an EmulatedCluster with --emulated
        self.daemon_tail: List[str] = []
        self.out_lock = threading.Lock()
        self.socket_dir = f"/tmp/spex-{os.getuid()}/{self.job}"
        self.from_slurm = a.hosts is None and a.hostfile is None and a.emulated is None and \
            slurm_hosts(dict(os.environ)) is not None
        self.watchdog: Optional[subprocess.Popen] = None

    # -- the watchdog: the daemons end with spexrun, even a SIGKILLed one --

    def start_watchdog(self) -> None:
        """Starts `spexrun --watchdog` (its own session, so a signal to spexrun's process group
        leaves it): spexrun holds the only write end of its stdin, so when spexrun ends without
        saying "done" (SIGKILL, a crash) it reads end-of-file and stops what it was told of."""
        try:
            self.watchdog = subprocess.Popen([sys.executable, "-m", "spex.run", "--watchdog", str(os.getpid()),
                                              str(self.a.grace)], stdin=subprocess.PIPE,
                                             stdout=subprocess.DEVNULL, start_new_session=True)
        except OSError as e:
            self.say(f"warning: cannot start the watchdog ({e.strerror}): if spexrun is killed with SIGKILL, "
                     f"stop its daemons by hand")

    def watch(self, words: List[str]) -> None:
        """Tells the watchdog what to stop should spexrun die (one JSON list a line)."""
        if self.watchdog is None:
            return
        try:
            self.watchdog.stdin.write((json.dumps(words) + "\n").encode())
            self.watchdog.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def stop_watchdog(self) -> None:
        """Everything is stopped: the watchdog leaves without doing anything."""
        if self.watchdog is None:
            return
        self.watch(["done"])
        try:
            self.watchdog.stdin.close()
            self.watchdog.wait(timeout=10)
        except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
            pass
        self.watchdog = None

    def say(self, text: str) -> None:
        with self.out_lock:
            sys.stderr.write(f"spexrun: {text}\n")
            sys.stderr.flush()

    # -- daemons --

    def socket(self, node: int) -> str:
        if self.cluster is not None:
            return self.cluster.socket(node)
        return f"{self.socket_dir}/node{node}.sock"

    def master_addr(self) -> str:
        name = self.hosts[0].name
        if self.cluster is not None:
            return self.cluster.addr(0)
        return "127.0.0.1" if is_local(name) and len(self.hosts) == 1 else name

    def start_daemons(self) -> None:
        a = self.a
        flags = list(a.spexd_arg or [])
        if a.emulated:
            from .emulated import EmulatedCluster
            self.cluster = EmulatedCluster(a.spexd, hosts=a.emulated, trainers=a.slots, args=flags, rate=a.rate,
                                           latency_us=a.latency_us, start_timeout=a.start_timeout)
            self.say(self.cluster.up())
            self.watch(["emulated", self.cluster.script, self.cluster.dir, str(int(self.cluster._own_dir))])
            self.cluster.start()
            return
        spexd = find_spexd(a.spexd)
        make_private_dirs(self.socket_dir)
        cmd = ["mpirun", "--bind-to", "none"]
        if a.rsh_agent:
            cmd += ["--mca", "plm_rsh_agent", a.rsh_agent]
        for n, h in enumerate(self.hosts):
            if n:
                cmd.append(":")
            cmd += ["-np", "1", "--host", h.name, spexd, f"--socket={self.socket(n)}",
                    f"--local_trainers={h.slots}", *flags]
        env = dict(os.environ)
        if os.getuid() == 0:
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        if len(self.hosts) == 1 and is_local(self.hosts[0].name):
            env.setdefault("OMPI_MCA_btl_tcp_if_include", "lo")
            env.setdefault("OMPI_MCA_oob_tcp_if_include", "lo")
        if self.world > (os.cpu_count() or 1):
            env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
        self.daemons = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.watch(["mpirun", str(self.daemons.pid), self.socket_dir])
        threading.Thread(target=self._pump_daemons, daemon=True).start()

    def _pump_daemons(self) -> None:
        proc = self.daemons
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            self.daemon_tail = (self.daemon_tail + [line])[-30:]
            if self.a.daemon_output:
                with self.out_lock:
                    sys.stderr.write(f"[spexd]{line}\n")
                    sys.stderr.flush()
        self.events.put(("daemons", proc.wait()))

    def daemons_log(self) -> str:
        if self.cluster is not None:
            return self.cluster.log_tail(30)
        return "\n".join(self.daemon_tail)

    def stop_daemons(self) -> None:
        if self.cluster is not None:
            self.cluster.cleanup()
            self.cluster = None
            return
        proc = self.daemons
        if proc is None:
            return
        if proc.poll() is None:
            _signal(proc.pid, signal.SIGTERM)  # mpirun forwards it to every spexd
            try:
                proc.wait(timeout=self.a.grace + 10)
            except subprocess.TimeoutExpired:
                _killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        try:
            os.rmdir(self.socket_dir)
        except OSError:
            pass

    # -- agents --

    def agent_command(self, n: int, rank_base: int, port: int) -> List[str]:
        a, h = self.a, self.hosts[n]
        cmd = [sys.executable, "-m", "spex.run", "--agent", "--node", str(n), "--nodes", str(len(self.hosts)),
               "--socket", self.socket(n), "--rank-base", str(rank_base), "--local-size", str(h.slots),
               "--world", str(self.world), "--master-addr", self.master_addr(), "--master-port", str(port),
               "--start-timeout", str(a.start_timeout), "--grace", str(a.grace)]
        return cmd + ["--", *a.command]

    def x_env(self) -> Dict[str, str]:
        """The variables named with -x (NAME: this process's value, "" when unset)."""
        out = {}
        for kv in self.a.x or []:
            k, eq, v = kv.partition("=")
            out[k] = v if eq else os.environ.get(k, "")
        return out

    def forwarded_env(self) -> Dict[str, str]:
        """What an agent on another host gets: the forwarded variables and the -x ones."""
        out = {k: v for k, v in os.environ.items() if k in FORWARD_NAMES or k.startswith(FORWARD_PREFIXES)}
        out.update(self.x_env())
        return out

    def start_agent(self, n: int, rank_base: int, port: int) -> subprocess.Popen:
        """Starts host n's agent. No variable's value goes on a command line, which every user of
        a host can read (/proc/PID/cmdline, ps): an agent on this host (or an emulated one) gets
        the -x variables in its environment; an agent on another host is started as
        AGENT_BOOT, which reads the forwarded and -x variables from its stdin (one JSON line,
        written here) before it becomes the agent."""
        h = self.hosts[n]
        argv = self.agent_command(n, rank_base, port)
        pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if self.cluster is not None:
            return self.cluster.popen(n, argv, env={**os.environ, **self.x_env()}, **pipes)
        if is_local(h.name):
            return subprocess.Popen(argv, env={**os.environ, **self.x_env()}, **pipes)
        boot = [sys.executable, "-c", AGENT_BOOT, *argv[3:]]  # argv[:3]: python -m spex.run
        if self.from_slurm and not self.a.rsh_agent:
            # Inside the allocation: a step on that host (srun forwards the working directory,
            # and stdin to the step's one task); --overlap shares the CPUs the daemons' step
            # holds.
            cmd = ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={h.name}", "--overlap", "--kill-on-bad-exit=0",
                   "--quiet", *boot]
        else:
            remote = f"cd {shlex.quote(os.getcwd())} 2>/dev/null; exec " + " ".join(shlex.quote(x) for x in boot)
            rsh = shlex.split(self.a.rsh_agent) if self.a.rsh_agent else ["ssh", "-o", "BatchMode=yes", "-T"]
            # "--": nothing after it is an option of the agent, whatever the host's name.
            cmd = [*rsh, "--", h.name, remote]
        proc = subprocess.Popen(cmd, **pipes)
        try:
            proc.stdin.write((json.dumps(self.forwarded_env()) + "\n").encode())
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the agent is gone already: pump_agent reports it
        return proc

    def pump_agent(self, n: int, proc: subprocess.Popen) -> None:
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            if line.startswith(CONTROL):
                self.events.put(("agent", n, line[len(CONTROL):]))
                continue
            m = re.match(r"^\[\d+,\d+\]<(stdout|stderr)>:", line)
            if m is None:  # the agent's own words (or ssh's): kept for the error message
                self.agent_tail[n] = (self.agent_tail[n] + [line])[-10:]
                line = f"[{self.host_label(n)}]{line}"
            with self.out_lock:
                stream = sys.stdout if m is not None and m.group(1) == "stdout" else sys.stderr
                stream.write(line + "\n")
                stream.flush()
        self.events.put(("agent_gone", n, proc.wait()))

    def tell_agents(self, word: str) -> None:
        for p in self.agents:
            if p is None or p.stdin is None or p.stdin.closed:
                continue
            try:
                p.stdin.write((word + "\n").encode())
                p.stdin.flush()
            except (BrokenPipeError, OSError):
                pass

    def stop_agents(self) -> None:
        self.tell_agents("stop")
        deadline = time.monotonic() + self.a.grace + 15
        for p in self.agents:
            if p is None:
                continue
            try:
                p.stdin.close()
            except (BrokenPipeError, OSError):
                pass
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(p.pid, signal.SIGKILL)
                p.wait(timeout=5)

    # -- the job --

    def where(self, rank: int) -> str:
        base = 0
        for n, h in enumerate(self.hosts):
            if rank < base + h.slots:
                return f"{self.host_label(n)}, local rank {rank - base}"
            base += h.slots
        return "?"

    def agent_name(self) -> str:
        if self.a.rsh_agent:
            return self.a.rsh_agent
        return "srun" if self.from_slurm else "ssh -o BatchMode=yes"

    def host_label(self, n: int) -> str:
        return self.cluster.hostname(n) if self.cluster is not None else self.hosts[n].name

    def run(self) -> int:
        a = self.a
        port = a.master_port or random.randrange(29500, 39500)
        self.start_watchdog()
        self.say(f"{len(self.hosts)} host(s) ({', '.join(f'{self.host_label(n)}:{h.slots}' for n, h in enumerate(self.hosts))}), "
                 f"{self.world} trainers; job {self.job}")
        self.start_daemons()
        base = 0
        for n, h in enumerate(self.hosts):
            self.agents[n] = self.start_agent(n, base, port)
            threading.Thread(target=self.pump_agent, args=(n, self.agents[n]), daemon=True).start()
            base += h.slots
        ready = set()
        deadline = time.monotonic() + a.start_timeout + 10
        while len(ready) < len(self.hosts):
            try:
                ev = self.events.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                missing = [self.host_label(n) for n in range(len(self.hosts)) if n not in ready]
                self.say(f"no answer from the agent on {', '.join(missing)} within {a.start_timeout + 10:g} s "
                         f"(can spexrun reach it with '{self.agent_name()}'?)")
                return 1
            if ev[0] == "agent" and ev[2] == "ready":
                ready.add(ev[1])
            elif ev[0] == "agent" and ev[2].startswith("error "):
                self.say(f"{ev[2][6:]}. The daemons' last lines:\n{self.daemons_log()}")
                return 1
            elif ev[0] == "agent_gone":
                said = "\n".join(self.agent_tail[ev[1]]) or "(nothing)"
                self.say(f"the agent on host {self.host_label(ev[1])} exited with status {ev[2]} before its daemon "
                         f"was ready: can spexrun reach {self.host_label(ev[1])} with "
                         f"'{self.agent_name()}', and is spex installed there for "
                         f"{sys.executable}? It said:\n{said}")
                return 1
            elif ev[0] == "daemons":
                self.say(f"the daemons (mpirun) exited with status {ev[1]} while starting:\n{self.daemons_log()}")
                return 1
            elif ev[0] == "signal":
                return 128 + ev[1]
        self.say("every daemon answers its health check; starting the trainers")
        self.tell_agents("go")
        left = self.world
        running = [h.slots for h in self.hosts]  # per host: trainers not yet exited
        while left:
            ev = self.events.get()
            if ev[0] == "agent" and ev[2].startswith("exit "):
                parts = ev[2].split(" ", 3)
                rank, code = int(parts[1]), int(parts[2])
                left -= 1
                running[ev[1]] -= 1
                if code != 0:
                    extra = f" ({parts[3]})" if len(parts) > 3 else ""
                    self.say(f"rank {rank} ({self.where(rank)}) {describe_status(code)}{extra}; stopping the job")
                    return code if code > 0 else 128 - code
            elif ev[0] == "agent_gone" and running[ev[1]] > 0:
                self.say(f"the agent on {self.host_label(ev[1])} exited with status {ev[2]} while its trainers "
                         f"ran (connection lost?); stopping the job")
                return 1
            elif ev[0] == "daemons":
                self.say(f"the daemons (mpirun) exited with status {ev[1]} while the trainers ran; stopping the job. "
                         f"Their last lines:\n{self.daemons_log()}")
                return 1
            elif ev[0] == "signal":
                self.say(f"{signal_name(-ev[1])} received; stopping the job")
                return 128 + ev[1]
        self.say(f"all {self.world} trainers exited 0")
        return 0

    def shutdown(self) -> None:
        """Stops the trainers (through their agents) and the daemons at the same time."""
        agents = threading.Thread(target=self.stop_agents, daemon=True)
        agents.start()
        if self.cluster is None:
            self.stop_daemons()
        agents.join()
        # An emulated cluster's teardown also ends every process left in its hosts, agents
        # included, so it comes after the agents had their chance to stop their trainers.
        self.stop_daemons()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="spexrun", usage="spexrun [-H host1:N,host2:N | --hostfile FILE | --emulated N] [options] -- CMD ARGS...",
        description="Starts one spexd per host and the hosts' trainers with torchrun's environment plus "
                    "SPEX_SOCKET. Without -H, --hostfile or --emulated: the SLURM allocation's hosts, else "
                    "this host with one slot.")
    p.add_argument("-H", "--hosts", help="hosts and their trainer slots: host1:4,host2:4")
    p.add_argument("--hostfile", help="a file with a host per line: 'host slots=N'")
    p.add_argument("--emulated", type=int, metavar="N", help="run on N emulated hosts of this machine (root)")
    p.add_argument("--slots", type=int, default=2, help="trainers per emulated host (default 2)")
    p.add_argument("--rate", default="1gbit", help="emulated link rate each way (default 1gbit; none: unlimited)")
    p.add_argument("--latency-us", type=int, default=0, help="emulated one-way latency in microseconds")
    p.add_argument("--spexd", help="the spexd binary (default $SPEXD, else bazel-bin/daemon/spexd)")
    p.add_argument("--spexd-arg", action="append", metavar="FLAG",
                   help="a spexd flag, e.g. --spexd-arg=--compressor=micro (repeatable)")
    p.add_argument("--rsh-agent", metavar="CMD",
                   help="how to reach other hosts (default: ssh -o BatchMode=yes; srun inside a SLURM allocation)")
    p.add_argument("-x", action="append", metavar="NAME[=VALUE]",
                   help="pass an environment variable to the trainers (repeatable); values travel in the "
                        "agents' environment or their ssh connection, never on a command line")
    p.add_argument("--master-port", type=int, default=0, help="MASTER_PORT (default: a random port)")
    p.add_argument("--start-timeout", type=float, default=60.0,
                   help="seconds every daemon has to answer its health check (default 60)")
    p.add_argument("--grace", type=float, default=3.0,
                   help="seconds between SIGTERM and SIGKILL when stopping trainers (default 3)")
    p.add_argument("--daemon-output", action="store_true", help="stream the daemons' output with a [spexd] prefix")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    return p


def resolve_hosts(a: argparse.Namespace, env: Dict[str, str]) -> List[Host]:
    given = [x for x in ("hosts", "hostfile", "emulated") if getattr(a, x) is not None]
    if len(given) > 1:
        raise LaunchError("give one of -H, --hostfile and --emulated")
    if a.emulated is not None:
        if a.emulated < 1:
            raise LaunchError(f"--emulated {a.emulated}: needs at least 1 host")
        if a.slots < 1:
            raise LaunchError(f"--slots {a.slots}: every host needs at least 1 trainer")
        return [Host(f"host{i + 1}", a.slots) for i in range(a.emulated)]
    if a.hosts is not None:
        return parse_hosts(a.hosts)
    if a.hostfile is not None:
        return read_hostfile(a.hostfile)
    return slurm_hosts(env) or [Host("localhost", 1)]


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--agent":
        return agent_main(argv[1:])
    if argv and argv[0] == "--watchdog":
        return watchdog_main(argv[1:])
    parser = build_parser()
    a = parser.parse_args(argv)
    if a.command and a.command[0] == "--":
        a.command = a.command[1:]
    try:
        if not a.command:
            raise LaunchError("no command to run: spexrun [options] -- CMD ARGS... (e.g. -- python3 train.py)")
        for kv in a.x or []:
            name = kv.partition("=")[0]
            if not _ENV_NAME_RE.match(name):
                raise LaunchError(f"-x {kv}: '{name}' is not a variable name (letters, digits, '_'; not a digit "
                                  f"first): -x NAME passes this shell's value, -x NAME=VALUE a value")
        hosts = resolve_hosts(a, os.environ)
        if a.emulated is None and len(hosts) > 1 and any(h.name in LOCAL_NAMES for h in hosts):
            raise LaunchError("a local name (localhost) beside other hosts: name this host as the others reach it")
        if a.emulated is not None:
            from .emulated import EmulatedCluster
            why = EmulatedCluster.unavailable()
            if why:
                raise LaunchError(f"--emulated: {why}")
    except LaunchError as e:
        sys.stderr.write(f"spexrun: {e}\n")
        return 2
    launcher = Launcher(a, hosts)

    def on_signal(signum: int, _frame: object) -> None:
        launcher.events.put(("signal", signum))

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    rc = 1
    try:
        rc = launcher.run()
    except Exception as e:  # a failed start (no spexd, no emulation): say it, clean up, fail
        launcher.say(f"error: {e}")
        rc = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        launcher.shutdown()
        launcher.stop_watchdog()
    return rc


if __name__ == "__main__":
    sys.exit(main())
