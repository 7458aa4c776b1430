"""An emulated multi-host spex cluster on one machine: N hosts as network namespaces on a bridge
with a rate limit per host in both directions, optional one-way latency, its own hostname,
/etc/netns files and (where the machine has a core per host) its own CPU. spexd runs one rank
per host under an mpirun inside the cluster's login host, started by spex.world.start_daemon_world
(as LocalCluster's and spexrun's daemons are) with the MPI settings the script wrote for the
network; `popen(node, argv)` starts a process (a trainer) inside a host, so everything it sends
to other hosts (DDP's own gloo all-reduce too) crosses the emulated links.
The network is built and torn down by deploy/emulated_cluster.sh (shipped in the package, see
find_script); teardown is by process id and
leaves no namespace, /etc/netns entry, socket or shared-memory segment behind, also after a
failure (the `with` block, or `emulated_cluster.sh down --stale` after a killed owner).

    with EmulatedCluster(os.environ["SPEXD"], hosts=2, trainers=2, rate="1gbit") as cluster:
        p = cluster.popen(0, ["python3", "train.py"], env={"SPEX_SOCKET": cluster.socket(0)})

Needs root and network namespaces; `EmulatedCluster.unavailable()` says why not (None when it
can run), and start() raises EmulationUnavailable with that message.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from typing import Dict, IO, List, Optional, Sequence

from .cluster import LocalCluster, find_spexd
from .errors import SpexError
from .world import WorldNode

SUBNET = "10.77.0"


class EmulationUnavailable(SpexError):
    """This machine cannot emulate hosts (not root, no network namespaces, no tc tbf...)."""


def find_script(explicit: Optional[str] = None) -> str:
    """The emulated-cluster script: `explicit`, else $SPEX_EMULATED_CLUSTER, else the copy that
    ships inside this package (spex/deploy/emulated_cluster.sh, from deploy/ at install time).
    The package never looks into a source checkout."""
    for c, what in ((explicit, "the script argument"), (os.environ.get("SPEX_EMULATED_CLUSTER"), "$SPEX_EMULATED_CLUSTER")):
        if c:
            if os.path.isfile(c):
                return os.path.abspath(c)
            raise SpexError(f"emulated-cluster script not found at {c} (from {what})")
    shipped = os.path.join(os.path.dirname(os.path.abspath(__file__)), "deploy", "emulated_cluster.sh")
    if os.path.isfile(shipped):
        return shipped
    raise SpexError(f"emulated-cluster script not found: this spex package has no {shipped} (it was installed "
                    "without the source tree's deploy/); set SPEX_EMULATED_CLUSTER to deploy/emulated_cluster.sh")


class EmulatedCluster(LocalCluster):
    """`hosts` emulated hosts, one spexd each (`nodes` == `hosts`), `trainers` per host. stop()
    and kill() are LocalCluster's (by the daemons' PIDs, which daemon_pids() finds in the hosts;
    kill() removes the killed daemons' segments with spex.shm.remove_segments_of); both leave the
    network up, cleanup() and down() tear it down.

    Args:
        spexd: path of the spexd binary (see find_spexd).
        hosts: emulated hosts (MPI ranks).
        trainers: --local_trainers of every daemon.
        args: extra spexd flags.
        rate: tc rate of every host's link, each way ("1gbit", "100mbit", ...; "none": unlimited).
        latency_us: one-way delay added to every packet a host sends (0: none).
        cpus: "auto" (host i on core i-1, modulo the cores) or "none" (unpinned).
        script: deploy/emulated_cluster.sh (see find_script).
        dir: state directory (sockets, logs; default a new one under /tmp, removed on cleanup).
        log: file for mpirun's and the daemons' output.
    """

    def __init__(self, spexd: Optional[str] = None, hosts: int = 2, trainers: int = 2, args: Sequence[str] = (),
                 rate: str = "1gbit", latency_us: int = 0, cpus: str = "auto", script: Optional[str] = None,
                 dir: Optional[str] = None, log: Optional[str] = None, start_timeout: float = 60.0):
        if hosts < 1 or trainers < 1:
            raise ValueError(f"hosts and trainers must be >= 1, got {hosts} x {trainers}")
        self.spexd = find_spexd(spexd)
        self.script = find_script(script)
        self.nodes = self.hosts = hosts
        self.trainers = trainers
        self.args = list(args)
        self.rate = rate
        self.latency_us = int(latency_us)
        self.cpus = cpus
        self._own_dir = dir is None
        self.dir = dir or tempfile.mkdtemp(prefix="spex-emu-", dir="/tmp")
        self.log_path = log or os.path.join(self.dir, "spexd.log")
        self.start_timeout = start_timeout
        self.proc: Optional[subprocess.Popen] = None
        self._log: Optional[IO[bytes]] = None
        self._up = False
        self.description = ""

    @staticmethod
    def unavailable(script: Optional[str] = None) -> Optional[str]:
        """None when this machine can emulate hosts, else why not."""
        try:
            path = find_script(script)
        except SpexError as e:
            return str(e)
        r = subprocess.run(["bash", path, "check"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return None if r.returncode == 0 else r.stdout.strip()

    def socket(self, node: int) -> str:
        if not 0 <= node < self.nodes:
            raise ValueError(f"node {node} is not in 0..{self.nodes - 1}")
        return os.path.join(self.dir, "sock", f"node{node}.sock")

    def hostname(self, node: int) -> str:
        """Node `node`'s hostname inside the cluster (host1..hostN)."""
        return f"host{node + 1}"

    def addr(self, node: int) -> str:
        """Node `node`'s address on the emulated network."""
        return f"{SUBNET}.{node + 1}"

    def mpi_env(self, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        """`base` (default this process's environment) with the MPI settings the script wrote for
        this cluster's network (DIR/mpi.env, after up()): `KEY=VALUE` lines set KEY, `KEY?=VALUE`
        lines only where `base` has no KEY (as the script's own `mpirun` does)."""
        env = dict(os.environ if base is None else base)
        path = os.path.join(self.dir, "mpi.env")
        try:
            with open(path) as f:
                lines = f.read().splitlines()
        except OSError as e:
            raise SpexError(f"the emulated cluster in {self.dir} has no MPI settings ({path}: {e.strerror}); "
                            f"is it up, and is {self.script} as new as this spex package?") from None
        for line in lines:
            key, sep, value = line.partition("=")
            if not sep:
                continue
            if key.endswith("?"):
                if not env.get(key[:-1]):
                    env[key[:-1]] = value
            else:
                env[key] = value
        return env

    def world_nodes(self) -> List[WorldNode]:
        """The daemon world: node n on host n+1 (mpirun's rsh agent enters it), on its socket."""
        return [WorldNode(self.socket(n), self.trainers, host=self.hostname(n)) for n in range(self.nodes)]

    def up(self) -> str:
        """Builds the network (no daemons). Returns the script's description line."""
        why = self.unavailable(self.script)
        if why:
            raise EmulationUnavailable(why)
        os.makedirs(self.dir, exist_ok=True)
        cmd = ["bash", self.script, "up", self.dir, "--hosts", str(self.hosts), "--rate", self.rate,
               "--latency-us", str(self.latency_us), "--cpus", self.cpus, "--owner", str(os.getpid())]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            raise SpexError(f"emulated cluster did not come up: {r.stdout.strip()}")
        self._up = True
        self.description = r.stdout.strip().splitlines()[-1]
        return self.description

    def start(self) -> "EmulatedCluster":
        """Builds the network, starts spexd on every host (start_daemon_world: mpirun inside the
        login host, the network's MPI settings) and waits for every socket."""
        if self.proc is not None:
            raise SpexError("cluster already started")
        try:
            if not self._up:
                self.up()
            self.start_world(self.world_nodes(), self.mpi_env(),
                             prefix=["bash", self.script, "exec", self.dir, "login"])
        except BaseException:
            self.cleanup()
            raise
        return self

    def popen(self, node: int, argv: Sequence[str], env: Optional[Dict[str, str]] = None,
              **kwargs) -> subprocess.Popen:
        """Starts `argv` inside host `node` (its network, hostname and CPU set)."""
        return subprocess.Popen(["bash", self.script, "exec", self.dir, self.hostname(node), *argv], env=env,
                                **kwargs)

    def set_rate(self, rate: str) -> None:
        """Changes every host's rate (both directions)."""
        subprocess.run(["bash", self.script, "rate", self.dir, rate], check=True)
        self.rate = rate

    def daemon_pids(self) -> List[int]:
        """PIDs of the spexd processes (inside the hosts' namespaces: not mpirun's children), while
        running: this spexd with one of this cluster's sockets as its first argument."""
        sockets = {f"--socket={s}".encode() for s in self.sockets}
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if len(argv) > 1 and argv[0] == self.spexd.encode() and argv[1] in sockets:
                pids.append(int(entry))
        return sorted(pids)

    def down(self) -> None:
        """Tears the network down (idempotent): every process left in the hosts by PID, the
        namespaces, /etc/netns entries, sockets, segments."""
        subprocess.run(["bash", self.script, "down", self.dir], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self._up = False

    def cleanup(self) -> None:
        try:
            self.stop()
        finally:
            self.down()
            if self._log is not None:
                self._log.close()
                self._log = None
            if self._own_dir:
                shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "EmulatedCluster":
        return self.start()
