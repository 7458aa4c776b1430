"""One function that starts a spex daemon world: one spexd per node under one Open MPI mpirun
(one application context per node, in node order, so MPI rank n is node n), each with its socket,
its --local_trainers and optionally its own cores. spexrun's launcher (spex.launcher),
LocalCluster (spex.cluster) and EmulatedCluster (spex.emulated; mpirun inside the emulated
cluster's login host, its network's MPI settings as `env`) all start their daemons through
start_daemon_world, so the command line and the MPI settings are written once; the main job
(deploy/mainjob) starts its daemons through LocalCluster or EmulatedCluster.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from typing import Dict, IO, List, Optional, Sequence, Union


def parse_cpu_list(text: str) -> List[int]:
    """A CPU list as taskset -c and cpusets write it: `0-3,8` -> [0, 1, 2, 3, 8]. ValueError
    naming the part it cannot read."""
    cpus = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()) or (dash and int(hi) < int(lo)):
            raise ValueError(f"cannot read '{part}' in the CPU list '{text}' (e.g. 0-3,8)")
        cpus.update(range(int(lo), int(hi if dash else lo) + 1))
    return sorted(cpus)


@dataclass
class WorldNode:
    """One node of a daemon world."""

    socket: str  # the daemon's socket path on its host
    trainers: int  # its --local_trainers
    host: Optional[str] = None  # mpirun's --host (None: wherever mpirun places it, this host here)
    cpus: Optional[Sequence[int]] = None  # run the daemon on these cores only (taskset -c)


def daemon_world_command(spexd: str, nodes: Sequence[WorldNode], flags: Sequence[str] = (),
                         mpirun: str = "mpirun", rsh_agent: Optional[str] = None,
                         prefix: Sequence[str] = ()) -> List[str]:
    """mpirun's command line: `prefix` (a command that runs mpirun, e.g. inside an emulated
    cluster's login host), mpirun's own binding off (placement is the scheduler's, the node's
    `cpus`, or the CPU set the host's rsh agent gives), then one application context per node."""
    if not nodes:
        raise ValueError("a daemon world needs at least one node")
    cmd = [*prefix, mpirun, "--bind-to", "none"]
    if rsh_agent:
        cmd += ["--mca", "plm_rsh_agent", rsh_agent]
    for n, node in enumerate(nodes):
        if node.trainers < 1:
            raise ValueError(f"node {n}: trainers must be >= 1, got {node.trainers}")
        if n:
            cmd.append(":")
        cmd += ["-np", "1"]
        if node.host is not None:
            cmd += ["--host", node.host]
        if node.cpus is not None:
            cmd += ["taskset", "-c", ",".join(map(str, node.cpus))]
        cmd += [spexd, f"--socket={node.socket}", f"--local_trainers={node.trainers}", *flags]
    return cmd


def start_daemon_world(spexd: str, nodes: Sequence[WorldNode], flags: Sequence[str] = (), *,
                       mpirun: str = "mpirun", rsh_agent: Optional[str] = None, prefix: Sequence[str] = (),
                       env: Optional[Dict[str, str]] = None, loopback: bool = False,
                       yield_when_idle: bool = False,
                       stdout: Union[int, IO[bytes], None] = subprocess.PIPE) -> subprocess.Popen:
    """Starts the daemon world and returns mpirun's process (its own session and process group,
    stdin closed, stderr into `stdout`). It does not wait for the sockets: the caller does
    (LocalCluster by connecting, spexrun's agents by the health check).

    prefix: a command mpirun runs under (EmulatedCluster: its script's `exec DIR login`).
    env: the environment (default this process's); mpirun may run as root when this is root.
    loopback: every node on this host: MPI's TCP traffic on `lo` unless the environment says
        otherwise.
    yield_when_idle: daemons and trainers outnumber the cores: MPI ranks yield while they poll
        (a polling daemon otherwise takes the core a trainer or its peer daemon needs), unless
        the environment says otherwise.
    """
    env = dict(os.environ if env is None else env)
    if os.getuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    if loopback:
        env.setdefault("OMPI_MCA_btl_tcp_if_include", "lo")
        env.setdefault("OMPI_MCA_oob_tcp_if_include", "lo")
    if yield_when_idle:
        env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    return subprocess.Popen(daemon_world_command(spexd, nodes, flags, mpirun, rsh_agent, prefix),
                            stdin=subprocess.DEVNULL,
                            stdout=stdout, stderr=subprocess.STDOUT, env=env, start_new_session=True)
