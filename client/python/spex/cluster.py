"""A local spex cluster for tests, demos and the main job: N spexd daemons under one mpirun on
this machine (one per emulated node), each on its own socket in a private directory, stopped
by PID (SIGTERM to every spexd, which stops cleanly and removes its socket and segments; mpirun
then exits; SIGKILL to mpirun's process group only when that does not finish in time).

    with LocalCluster(nodes=2, trainers=2) as cluster:  # spexd from $SPEXD, else PATH
        client = spex.Client(cluster.socket(0), local_rank=0, local_size=2)

spex.emulated.EmulatedCluster has the same interface with every node on its own emulated host
(network namespace, rate limit, latency, CPU set).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket as _socket
import subprocess
import tempfile
import time
from typing import IO, Dict, List, Optional, Sequence

from .errors import SpexError
from .shm import remove_segments_of
from .world import WorldNode, start_daemon_world

MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    "OMPI_MCA_btl_tcp_if_include": "lo",
    "OMPI_MCA_oob_tcp_if_include": "lo",
}


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def children_of(pid: int) -> List[int]:
    """PIDs whose parent is `pid` (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces; the fields after its closing parenthesis do not.
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            out.append(int(entry))
    return sorted(out)


def find_spexd(explicit: Optional[str] = None) -> str:
    """The spexd binary: `explicit`, else $SPEXD, else `spexd` on $PATH. The package never looks
    into a source checkout (bazel-bin): point SPEXD at the binary you built or installed."""
    for c in (explicit, os.environ.get("SPEXD")):
        if c:
            if os.path.isfile(c) and os.access(c, os.X_OK):
                return os.path.abspath(c)
            raise SpexError(f"spexd not found at {c} (from {'the spexd argument' if c == explicit else '$SPEXD'}): "
                            "not an executable file; build it (bazel build //daemon:spexd -> bazel-bin/daemon/spexd) "
                            "and give its path")
    on_path = shutil.which("spexd")
    if on_path:
        return os.path.abspath(on_path)
    raise SpexError("spexd not found: set SPEXD to the spexd binary (e.g. SPEXD=$PWD/bazel-bin/daemon/spexd after "
                    "bazel build //daemon:spexd), pass its path, or put spexd on PATH")


class LocalCluster:
    """N spexd under mpirun on this host. `socket(n)` is node n's socket.

    Args:
        spexd: path of the spexd binary (see find_spexd).
        nodes: daemons (MPI ranks).
        trainers: --local_trainers of every daemon.
        args: extra spexd flags (e.g. ["--compressor=micro", "--density=0.01"]).
        socket_dir: directory for the sockets (default: a new one under /tmp; sockets need
            short paths, so do not use a deep test directory).
        log: file for mpirun's and the daemons' output (default socket_dir/spexd.log).
        start_timeout: seconds to wait for every socket.
        pin: "none" (default: the scheduler places every process), "node" (node n's daemon and
            every process `popen(n, ...)` starts run on node n's own cores, `node_cpus(n)`, as
            the processes of one real host share that host's cores and no other's), or "auto"
            ("node" when the daemons and trainers outnumber this process's cores).
    """

    PIN_CHOICES = ("none", "node", "auto")

    def __init__(self, spexd: Optional[str] = None, nodes: int = 2, trainers: int = 2,
                 args: Sequence[str] = (), socket_dir: Optional[str] = None, log: Optional[str] = None,
                 start_timeout: float = 30.0, mpirun: str = "mpirun", pin: str = "none"):
        if nodes < 1 or trainers < 1:
            raise ValueError(f"nodes and trainers must be >= 1, got {nodes} x {trainers}")
        if pin not in self.PIN_CHOICES:
            raise ValueError(f"pin must be one of {', '.join(self.PIN_CHOICES)}, got {pin!r}")
        self._cpus = sorted(os.sched_getaffinity(0))
        self.spexd = find_spexd(spexd)
        self.nodes = nodes
        self.trainers = trainers
        self.pin = ("node" if self.oversubscribed else "none") if pin == "auto" else pin
        self.args = list(args)
        self._own_dir = socket_dir is None
        self.dir = socket_dir or tempfile.mkdtemp(prefix="spex-", dir="/tmp")
        self.log_path = log or os.path.join(self.dir, "spexd.log")
        self.start_timeout = start_timeout
        self.mpirun = mpirun
        self.proc: Optional[subprocess.Popen] = None
        self._log: Optional[IO[bytes]] = None

    def socket(self, node: int) -> str:
        """Node `node`'s socket path."""
        if not 0 <= node < self.nodes:
            raise ValueError(f"node {node} is not in 0..{self.nodes - 1}")
        return os.path.join(self.dir, f"node{node}.sock")

    @property
    def sockets(self) -> List[str]:
        return [self.socket(n) for n in range(self.nodes)]

    def addr(self, node: int) -> str:
        """Node `node`'s network address (the loopback here; an EmulatedCluster's hosts differ)."""
        return "127.0.0.1"

    @property
    def oversubscribed(self) -> bool:
        """Whether the daemons and trainers outnumber the cores this process may use."""
        return self.nodes * (self.trainers + 1) > len(self._cpus)

    def node_cpus(self, node: int) -> Optional[List[int]]:
        """The cores node `node`'s processes run on with pin="node" (None without pinning): the
        cores this process may use, split into `nodes` equal contiguous shares when there are at
        least as many cores as nodes, else core `node` mod cores (nodes then share cores)."""
        self.socket(node)  # validates node
        if self.pin != "node":
            return None
        cpus, n = self._cpus, self.nodes
        if len(cpus) < n:
            return [cpus[node % len(cpus)]]
        per = len(cpus) // n
        return cpus[node * per:(node + 1) * per]

    def pin_description(self) -> str:
        """One line: where the nodes' processes run."""
        if self.pin != "node":
            return "not pinned (the scheduler places daemons and trainers)"
        return "pinned: " + ", ".join(f"node {n} on core(s) {','.join(map(str, self.node_cpus(n)))}"
                                      for n in range(self.nodes))

    def popen(self, node: int, argv: Sequence[str], env: Optional[Dict[str, str]] = None,
              **kwargs) -> subprocess.Popen:
        """Starts `argv` on node `node` (here: on this host, on the node's cores when pinned; see
        spex.emulated.EmulatedCluster). A caller's own `preexec_fn` runs after the pinning."""
        cpus = self.node_cpus(node)
        if cpus is not None:
            user_preexec = kwargs.pop("preexec_fn", None)

            def preexec(cpus=set(cpus), user_preexec=user_preexec) -> None:
                os.sched_setaffinity(0, cpus)
                if user_preexec is not None:
                    user_preexec()

            kwargs["preexec_fn"] = preexec
        return subprocess.Popen(list(argv), env=env, **kwargs)

    @property
    def pid(self) -> Optional[int]:
        """mpirun's PID while running."""
        return self.proc.pid if self.proc is not None else None

    def start(self) -> "LocalCluster":
        """Starts mpirun and waits until every node's socket accepts connections."""
        if self.proc is not None:
            raise SpexError("cluster already started")
        os.makedirs(self.dir, exist_ok=True)
        env = dict(os.environ)
        env.update(MPI_ENV)
        # MPI ranks busy-poll inside collectives. When daemons and trainers outnumber the cores,
        # a polling daemon takes the core a trainer (or its peer daemon) needs, and a share of
        # the exchanges stalls for a scheduler slice or more (the main job on 2 cores: micro's
        # p90 was 15x its p50, dense's step 5x slower); yielding removes that. With pin="node"
        # each spexd runs under taskset on its node's cores.
        nodes = [WorldNode(self.socket(n), self.trainers, cpus=self.node_cpus(n)) for n in range(self.nodes)]
        self.start_world(nodes, env, mpirun=self.mpirun, yield_when_idle=self.oversubscribed)
        return self

    def start_world(self, nodes: Sequence[WorldNode], env: Dict[str, str], **kwargs) -> None:
        """Starts the daemon world (spex.world.start_daemon_world with `kwargs`, spexd's and
        mpirun's output appended to the log) and waits until every node's socket accepts
        connections; if a daemon exits first or the time runs out, stops it (by PID) and raises
        SpexError with the log's tail. EmulatedCluster starts its world here too."""
        self._log = open(self.log_path, "ab")
        self.proc = start_daemon_world(self.spexd, nodes, self.args, env=env, stdout=self._log, **kwargs)
        deadline = time.monotonic() + self.start_timeout
        while not all(self._answers(s) for s in self.sockets):
            rc = self.proc.poll()
            if rc is not None or time.monotonic() > deadline:
                log = self.log_tail()
                self.stop()
                if rc is not None:
                    raise SpexError(f"spexd exited with {rc} while starting:\n{log}")
                raise SpexError(f"spexd did not open {self.nodes} sockets in {self.dir} within "
                                f"{self.start_timeout:g} s:\n{log}")
            time.sleep(0.05)

    @staticmethod
    def _answers(path: str) -> bool:
        if not os.path.exists(path):
            return False
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            s.connect(path)
            return True
        except OSError:
            return False
        finally:
            s.close()

    def daemon_pids(self) -> List[int]:
        """PIDs of the spexd processes mpirun started (its children), while running (an
        EmulatedCluster finds its own: they live in the hosts' namespaces)."""
        if self.proc is None:
            return []
        return children_of(self.proc.pid)

    def stop(self, timeout: float = 15.0) -> Optional[int]:
        """Stops the daemons cleanly: SIGTERM to every spexd PID (each removes its socket and
        segments; mpirun then exits), SIGTERM to mpirun if it is still there after `timeout`,
        SIGKILL to its process group as a last resort. Returns mpirun's exit status (None if
        never started)."""
        proc = self.proc
        rc = None
        if proc is not None:
            pids = self.daemon_pids()
            for pid in pids:
                _signal(pid, signal.SIGTERM)
            if not pids:
                _signal(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _signal(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.kill_group(proc.pid)
                    proc.wait(timeout=10)
            rc = proc.returncode
            self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        return rc

    def kill(self) -> None:
        """SIGKILLs the daemons and mpirun (its process group) at once: daemons that die without
        a clean shutdown, as after a crash. The shared segments they leave are removed (only
        theirs: /dev/shm/spex-<daemon pid>-*), so tests leave nothing behind."""
        pids = self.daemon_pids()
        proc, self.proc = self.proc, None
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        if proc is not None:
            self.kill_group(proc.pid)
            proc.wait(timeout=10)
        for pid in pids:
            remove_segments_of(pid)
        if self._log is not None:
            self._log.close()
            self._log = None

    @staticmethod
    def kill_group(pid: int) -> None:
        try:
            os.killpg(pid, signal.SIGKILL)  # mpirun was started as its own process group leader
        except ProcessLookupError:
            pass

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the daemons' log."""
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")
        except OSError:
            return "(no log)"

    def cleanup(self) -> None:
        """Stops the daemons and removes the socket directory (if this object created it)."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
