"""The launcher's per-host agent (`spexrun --agent`, started by spex.launcher on every host
through ssh, srun, an rsh agent or directly): it waits until its host's spexd answers the gRPC
health check, reports "ready", starts the host's trainers on "go" with torchrun's environment
plus SPEX_SOCKET and the restart count, tags their output lines, reports their exits, and stops
them on "stop", a closed stdin (spexrun or its connection gone) or SIGTERM.

The protocol is line based: the agent's stdout carries the trainers' tagged lines
(`[RANK,LOCAL_RANK]<stdout>:` / `<stderr>:`) and its own control lines, which start with
CONTROL; the launcher writes "go" and "stop" to its stdin.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket as _socket
import subprocess
import sys
import threading
import time
from typing import Dict, IO, List, Optional, Sequence

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
            # Which start of the job this is (0 first; spexrun --max-restarts), under spex's name
            # and torchrun's, so that scripts written for torchrun see it too.
            "SPEX_RESTART_COUNT": str(a.restart), "TORCHELASTIC_RESTART_COUNT": str(a.restart),
            "TORCHELASTIC_MAX_RESTARTS": str(a.max_restarts),
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

    def trainer_cpus(self) -> Optional[List[int]]:
        """With --daemon-cpus: this host's cores (the agent's own) less the daemon's; None
        without. ValueError naming the problem when the daemon's are not this host's or leave
        no core."""
        if self.a.daemon_cpus is None:
            return None
        from .world import parse_cpu_list
        mine, daemon = sorted(os.sched_getaffinity(0)), parse_cpu_list(self.a.daemon_cpus)
        foreign = [c for c in daemon if c not in mine]
        if foreign:
            raise ValueError(f"--daemon-cpus {self.a.daemon_cpus}: core(s) {','.join(map(str, foreign))} are not "
                             f"among {_socket.gethostname()}'s ({_cpu_text(mine)})")
        rest = [c for c in mine if c not in daemon]
        if not rest:
            raise ValueError(f"--daemon-cpus {self.a.daemon_cpus} leaves the trainers no core on "
                             f"{_socket.gethostname()} (its cores: {_cpu_text(mine)})")
        return rest

    def run(self) -> int:
        a = self.a
        signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=self.stop_trainers, daemon=True).start())
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # spexrun decides; Ctrl-C reaches it too
        try:
            cpus = self.trainer_cpus()
        except ValueError as e:
            self.control(f"error {e}")
            return 3
        # The trainers on the cores the daemon does not use (the daemon is on its own already:
        # mpirun started it under taskset).
        preexec = (lambda: os.sched_setaffinity(0, cpus)) if cpus is not None else None
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
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                     preexec_fn=preexec)
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


def _cpu_text(cpus: List[int]) -> str:
    return ",".join(map(str, cpus))


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
    p.add_argument("--restart", type=int, default=0)
    p.add_argument("--max-restarts", type=int, default=0)
    p.add_argument("--daemon-cpus", default=None)
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    if a.command and a.command[0] == "--":
        a.command = a.command[1:]
    return Agent(a).run()
