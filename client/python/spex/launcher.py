"""The launcher as a library: `Launcher(LaunchConfig(...), hosts).run()` (or `launch(config)`)
starts one spexd per host in one daemon world (spex.world), one agent per host (spex.agent) and,
once every daemon answers its health check, the hosts' trainers with torchrun's environment plus
SPEX_SOCKET; it streams their tagged output, and stops everything when a trainer, a daemon or an
agent fails, on SIGINT/SIGTERM, or, through its watchdog (`spexrun --watchdog`, its own session),
when the launcher itself dies. With `max_restarts` it starts the daemon world and the trainers
again after a failure (torchrun's --max-restarts), the restart count in the trainers'
environment, and with `min_hosts` it leaves failing hosts out while at least that many remain.
The `spexrun` command line (spex.run) is a thin shell over this module.

No variable's value goes on a command line (every user of a host can read those): -x variables
reach an agent here in its environment, an agent on another host through its stdin (AGENT_BOOT).
"""

from __future__ import annotations

import json
import os
import queue
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .agent import AGENT_BOOT, CONTROL, _killpg
from .cluster import _signal, children_of, find_spexd
from .hosts import Host, LaunchError, is_local
from .paths import private_directory_problem
from .shm import remove_segments_of
from .world import WorldNode, parse_cpu_list, start_daemon_world

# Environment variables an agent on another host gets from the launcher (as mpirun's -x would
# pass them), besides the ones named with -x: the Python and library search paths, the virtual
# environment, and spex's and Open MPI's own settings.
FORWARD_PREFIXES = ("SPEX_", "OMPI_MCA_", "NCCL_", "CUDA_VISIBLE_DEVICES")
FORWARD_NAMES = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "OMP_NUM_THREADS")
# After a trainer's failure, how long the launcher still collects events before it names the
# cause: a killed daemon or a lost host makes trainers fail too, and the cause named (and the
# host left out) is the daemon's or the host's, not a trainer's that failed first.
SETTLE_S = 1.5


@dataclass
class LaunchConfig:
    """What a launch needs; spexrun's flags map onto these fields one to one."""

    command: List[str]  # the trainer's command line, e.g. ["python3", "train.py"]
    emulated: Optional[int] = None  # N emulated hosts of this machine instead of real ones
    slots: int = 2  # trainers per emulated host
    rate: str = "1gbit"  # emulated link rate each way
    latency_us: int = 0  # emulated one-way latency
    spexd: Optional[str] = None  # the spexd binary (default $SPEXD, else spexd on PATH)
    spexd_args: List[str] = field(default_factory=list)  # flags of every spexd
    rsh_agent: Optional[str] = None  # how to reach other hosts (default ssh; srun inside SLURM)
    x: List[str] = field(default_factory=list)  # -x: "NAME" (this process's value) or "NAME=VALUE"
    master_port: int = 0  # MASTER_PORT (0: a random port per start)
    start_timeout: float = 60.0  # seconds every daemon has to answer its health check
    grace: float = 3.0  # seconds between SIGTERM and SIGKILL when stopping trainers
    daemon_output: bool = False  # stream the daemons' output with a [spexd] prefix
    max_restarts: int = 0  # starts after a failure before giving up (torchrun's --max-restarts)
    min_hosts: Optional[int] = None  # leave failing hosts out while at least this many remain
    from_slurm: bool = False  # the hosts are a SLURM allocation's (agents start as job steps)
    daemon_cpus: Optional[str] = None  # every host's daemon on these cores ("0-1"), trainers on the rest

    def check(self, hosts: Sequence[Host]) -> None:
        """Raises LaunchError naming what to fix."""
        if not self.command:
            raise LaunchError("no command to run: spexrun [options] -- CMD ARGS... (e.g. -- python3 train.py)")
        if self.max_restarts < 0:
            raise LaunchError(f"--max-restarts {self.max_restarts}: give 0 (no restart) or more")
        if self.min_hosts is not None:
            if self.min_hosts < 1:
                raise LaunchError(f"--min-hosts {self.min_hosts}: give at least 1")
            if self.min_hosts > len(hosts):
                raise LaunchError(f"--min-hosts {self.min_hosts}: the job has only {len(hosts)} host(s)")
            if self.max_restarts == 0:
                raise LaunchError(f"--min-hosts {self.min_hosts} leaves failing hosts out of a restart: give "
                                  f"--max-restarts N too")
        if self.daemon_cpus is not None:
            if self.emulated:
                raise LaunchError("--daemon-cpus: emulated hosts have CPU sets of their own (one core each where "
                                  "the machine has them); give it with -H or --hostfile")
            try:
                parse_cpu_list(self.daemon_cpus)
            except ValueError as e:
                raise LaunchError(f"--daemon-cpus: {e}") from None


@dataclass
class Failure:
    """Why an attempt ended: the exit status spexrun returns, the cause in words and the hosts
    to blame (node index -> "trainer", "daemon" or "agent")."""

    code: int
    cause: str
    blame: Dict[int, str] = field(default_factory=dict)
    restartable: bool = True


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
                        remove_segments_of(d)
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


# Open MPI's words when one of its processes dies: "mpirun noticed that process rank 1 with PID
# 123 on node host2 exited on signal 9 (Killed)." MPI rank n is node n (spex.world).
_MPI_DEAD_RANK = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+)")


class Launcher:
    def __init__(self, config: LaunchConfig, hosts: List[Host]):
        self.a = config
        self.hosts = list(hosts)
        self.world = sum(h.slots for h in self.hosts)
        self.job = f"spexrun-{os.getpid()}-{random.randrange(1 << 16):04x}"
        self.events: "queue.Queue[Tuple]" = queue.Queue()
        self.agents: List[Optional[subprocess.Popen]] = [None] * len(self.hosts)
        self.agent_tail: List[List[str]] = [[] for _ in self.hosts]
        self.daemons: Optional[subprocess.Popen] = None
        self.cluster = None  # an EmulatedCluster with --emulated
        self.daemon_tail: List[str] = []
        self.daemon_pids: List[int] = []  # this host's spexd processes of the current start
        self.out_lock = threading.Lock()
        self.socket_dir = f"/tmp/spex-{os.getuid()}/{self.job}"
        self.from_slurm = config.from_slurm
        self.watchdog: Optional[subprocess.Popen] = None
        self.spexd = config.spexd  # the binary, found once when the job starts (run)
        self.restart = 0  # which start of the job this is
        self.signalled: Optional[int] = None
        self.strikes: Dict[str, int] = {}  # host name -> attempts in a row its trainers failed

    def on_signal(self, signum: int) -> None:
        """SIGINT/SIGTERM (from a handler): the job stops, no restart."""
        self.signalled = signum
        self.events.put(("signal", signum))

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
        a, events = self.a, self.events
        flags = list(a.spexd_args)
        if a.emulated:
            from .emulated import EmulatedCluster
            self.cluster = EmulatedCluster(self.spexd, hosts=len(self.hosts), trainers=a.slots, args=flags, rate=a.rate,
                                           latency_us=a.latency_us, start_timeout=a.start_timeout)
            self.say(self.cluster.up())
            self.watch(["emulated", self.cluster.script, self.cluster.dir, str(int(self.cluster._own_dir))])
            self.cluster.start()
            self.daemon_pids = self.cluster.daemon_pids()
            proc = self.cluster.proc
            threading.Thread(target=lambda: events.put(("daemons", proc.wait())), daemon=True).start()
            return
        spexd = self.spexd
        make_private_dirs(self.socket_dir)
        cpus = parse_cpu_list(a.daemon_cpus) if a.daemon_cpus is not None else None
        nodes = [WorldNode(self.socket(n), h.slots, host=h.name, cpus=cpus) for n, h in enumerate(self.hosts)]
        self.daemon_tail = []
        self.daemons = start_daemon_world(spexd, nodes, flags, rsh_agent=a.rsh_agent,
                                          loopback=len(self.hosts) == 1 and is_local(self.hosts[0].name),
                                          yield_when_idle=self.world > (os.cpu_count() or 1))
        self.watch(["mpirun", str(self.daemons.pid), self.socket_dir])
        self.daemon_pids = []  # this host's, once mpirun started them (stop_daemons looks)
        threading.Thread(target=self._pump_daemons, args=(self.daemons, events), daemon=True).start()

    def _pump_daemons(self, proc: subprocess.Popen, events: "queue.Queue[Tuple]") -> None:
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            self.daemon_tail = (self.daemon_tail + [line])[-30:]
            if self.a.daemon_output:
                with self.out_lock:
                    sys.stderr.write(f"[spexd]{line}\n")
                    sys.stderr.flush()
        events.put(("daemons", proc.wait()))

    def daemons_log(self) -> str:
        if self.cluster is not None:
            return self.cluster.log_tail(30)
        return "\n".join(self.daemon_tail)

    def dead_daemon(self) -> Optional[int]:
        """The node whose daemon mpirun saw die (from its message), if it said."""
        m = _MPI_DEAD_RANK.search(self.daemons_log())
        return int(m.group(1)) if m and int(m.group(1)) < len(self.hosts) else None

    def stop_daemons(self) -> None:
        if self.cluster is not None:
            self.cluster.cleanup()
            self.cluster = None
            self.remove_dead_daemons_segments()
            return
        proc = self.daemons
        if proc is None:
            return
        self.daemon_pids += [p for p in children_of(proc.pid) if p not in self.daemon_pids]
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
        self.remove_dead_daemons_segments()

    def remove_dead_daemons_segments(self) -> None:
        """The shared segments (/dev/shm/spex-<pid>-*) of this host's daemons that died without
        removing them (killed, crashed): a daemon stopped cleanly removed its own."""
        for pid in self.daemon_pids:
            if not _alive(pid):
                remove_segments_of(pid)
        self.daemon_pids = []

    # -- agents --

    def agent_command(self, n: int, rank_base: int, port: int) -> List[str]:
        a, h = self.a, self.hosts[n]
        cmd = [sys.executable, "-m", "spex.run", "--agent", "--node", str(n), "--nodes", str(len(self.hosts)),
               "--socket", self.socket(n), "--rank-base", str(rank_base), "--local-size", str(h.slots),
               "--world", str(self.world), "--master-addr", self.master_addr(), "--master-port", str(port),
               "--start-timeout", str(a.start_timeout), "--grace", str(a.grace), "--restart", str(self.restart),
               "--max-restarts", str(a.max_restarts)]
        if a.daemon_cpus is not None:
            cmd += ["--daemon-cpus", a.daemon_cpus]
        return cmd + ["--", *a.command]

    def x_env(self) -> Dict[str, str]:
        """The variables named with -x (NAME: this process's value, "" when unset)."""
        out = {}
        for kv in self.a.x:
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

    def pump_agent(self, n: int, proc: subprocess.Popen, events: "queue.Queue[Tuple]") -> None:
        label = self.host_label(n)
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            if line.startswith(CONTROL):
                events.put(("agent", n, line[len(CONTROL):]))
                continue
            m = re.match(r"^\[\d+,\d+\]<(stdout|stderr)>:", line)
            if m is None:  # the agent's own words (or ssh's): kept for the error message
                self.agent_tail[n] = (self.agent_tail[n] + [line])[-10:]
                line = f"[{label}]{line}"
            with self.out_lock:
                stream = sys.stdout if m is not None and m.group(1) == "stdout" else sys.stderr
                stream.write(line + "\n")
                stream.flush()
        events.put(("agent_gone", n, proc.wait()))

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

    def node_of(self, rank: int) -> int:
        base = 0
        for n, h in enumerate(self.hosts):
            base += h.slots
            if rank < base:
                return n
        return -1

    def agent_name(self) -> str:
        if self.a.rsh_agent:
            return self.a.rsh_agent
        return "srun" if self.from_slurm else "ssh -o BatchMode=yes"

    def host_label(self, n: int) -> str:
        return self.hosts[n].name

    def run(self) -> int:
        """Runs the job to its end: 0 when every trainer exited 0; else, once the restarts are
        spent (or on a signal), the last failure's status."""
        a = self.a
        try:  # once: a binary that is not there is no failure a restart can mend
            self.spexd = find_spexd(a.spexd)
        except Exception as e:
            self.say(f"error: {e}")
            return 1
        self.start_watchdog()
        self.say(f"{len(self.hosts)} host(s) ({', '.join(f'{self.host_label(n)}:{h.slots}' for n, h in enumerate(self.hosts))}), "
                 f"{self.world} trainers; job {self.job}"
                 + (f"; up to {a.max_restarts} restart(s)" if a.max_restarts else ""))
        while True:
            failure = self.attempt()
            if failure is None:
                return 0
            if not failure.restartable or self.signalled is not None:
                return failure.code
            if self.restart >= a.max_restarts:
                if a.max_restarts:
                    self.say(f"restart limit reached (--max-restarts {a.max_restarts}); the last failure: "
                             f"{failure.cause}")
                return failure.code
            started = time.monotonic()
            self.shutdown()  # what is left of this attempt: trainers, agents, daemons
            if self.signalled is not None:
                return failure.code
            left_out = self.leave_out(failure)
            self.restart += 1
            self.say(f"restart {self.restart} of {a.max_restarts} after: {failure.cause}"
                     + (f"; leaving {', '.join(left_out)} out" if left_out else "")
                     + f"; {len(self.hosts)} host(s), {self.world} trainers (stopped in {time.monotonic() - started:.1f} s)")

    def leave_out(self, failure: Failure) -> List[str]:
        """Drops the failed hosts from the next start when --min-hosts allows: a lost agent or a
        dead daemon at once, a host whose trainers failed in two attempts in a row. Returns the
        names left out."""
        names = [h.name for h in self.hosts]
        for n, name in enumerate(names):
            kind = failure.blame.get(n)
            self.strikes[name] = self.strikes.get(name, 0) + 1 if kind == "trainer" else 0
        if self.a.min_hosts is None:
            return []
        out = [n for n, kind in failure.blame.items() if kind in ("daemon", "agent") or self.strikes[names[n]] >= 2]
        if not out:
            return []
        if len(self.hosts) - len(out) < self.a.min_hosts:
            self.say(f"keeping {', '.join(names[n] for n in out)}: leaving it out would leave fewer than "
                     f"--min-hosts {self.a.min_hosts} host(s)")
            return []
        left = [h for n, h in enumerate(self.hosts) if n not in out]
        if self.a.emulated:  # a smaller emulated world: its hosts are host1..hostK again
            left = [Host(f"host{i + 1}", h.slots) for i, h in enumerate(left)]
        self.hosts = left
        self.world = sum(h.slots for h in left)
        return [names[n] for n in sorted(out)]

    def attempt(self) -> Optional[Failure]:
        """One start of the job: daemons, agents, trainers; returns None when every trainer
        exited 0, else why it failed (everything still running: shutdown() stops it)."""
        a = self.a
        self.events = queue.Queue()  # the last attempt's threads keep putting into theirs
        if self.signalled is not None:
            return Failure(128 + self.signalled, f"{signal_name(-self.signalled)} received", restartable=False)
        events = self.events
        port = a.master_port or random.randrange(29500, 39500)
        self.agents = [None] * len(self.hosts)
        self.agent_tail = [[] for _ in self.hosts]
        try:
            self.start_daemons()
        except Exception as e:  # no spexd, no emulation, a daemon that did not start
            self.say(f"error: {e}")
            return Failure(1, f"the daemons did not start: {e}")
        base = 0
        for n, h in enumerate(self.hosts):
            self.agents[n] = self.start_agent(n, base, port)
            threading.Thread(target=self.pump_agent, args=(n, self.agents[n], events), daemon=True).start()
            base += h.slots
        failure = self.wait_ready(events)
        if failure is not None:
            return failure
        if self.daemons is not None:  # every daemon is up: this host's, for their segments
            self.daemon_pids = children_of(self.daemons.pid)
        self.say("every daemon answers its health check; starting the trainers"
                 + (f" (restart {self.restart})" if self.restart else ""))
        self.tell_agents("go")
        return self.wait_trainers(events)

    def wait_ready(self, events: "queue.Queue[Tuple]") -> Optional[Failure]:
        a = self.a
        ready = set()
        deadline = time.monotonic() + a.start_timeout + 10
        while len(ready) < len(self.hosts):
            try:
                ev = events.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                missing = [n for n in range(len(self.hosts)) if n not in ready]
                cause = (f"no answer from the agent on {', '.join(self.host_label(n) for n in missing)} within "
                         f"{a.start_timeout + 10:g} s (can spexrun reach it with '{self.agent_name()}'?)")
                self.say(cause)
                return Failure(1, cause, {n: "agent" for n in missing})
            if ev[0] == "agent" and ev[2] == "ready":
                ready.add(ev[1])
            elif ev[0] == "agent" and ev[2].startswith("error "):
                self.say(f"{ev[2][6:]}. The daemons' last lines:\n{self.daemons_log()}")
                return Failure(1, ev[2][6:], {ev[1]: "daemon"})
            elif ev[0] == "agent_gone":
                said = "\n".join(self.agent_tail[ev[1]]) or "(nothing)"
                self.say(f"the agent on host {self.host_label(ev[1])} exited with status {ev[2]} before its daemon "
                         f"was ready: can spexrun reach {self.host_label(ev[1])} with "
                         f"'{self.agent_name()}', and is spex installed there for "
                         f"{sys.executable}? It said:\n{said}")
                return Failure(1, f"the agent on {self.host_label(ev[1])} exited with status {ev[2]} while starting",
                               {ev[1]: "agent"})
            elif ev[0] == "daemons":
                self.say(f"the daemons (mpirun) exited with status {ev[1]} while starting:\n{self.daemons_log()}")
                dead = self.dead_daemon()
                return Failure(1, f"the daemons (mpirun) exited with status {ev[1]} while starting",
                               {dead: "daemon"} if dead is not None else {})
            elif ev[0] == "signal":
                return Failure(128 + ev[1], f"{signal_name(-ev[1])} received", restartable=False)
        return None

    def wait_trainers(self, events: "queue.Queue[Tuple]") -> Optional[Failure]:
        left = self.world
        running = [h.slots for h in self.hosts]  # per host: trainers not yet exited
        failures: List[Failure] = []
        settle_until = None
        while left and (settle_until is None or time.monotonic() < settle_until):
            try:
                ev = events.get(timeout=None if settle_until is None else max(0.01, settle_until - time.monotonic()))
            except queue.Empty:
                break
            failure = None
            if ev[0] == "agent" and ev[2].startswith("exit "):
                parts = ev[2].split(" ", 3)
                rank, code = int(parts[1]), int(parts[2])
                left -= 1
                running[ev[1]] -= 1
                if code != 0 and not failures:
                    extra = f" ({parts[3]})" if len(parts) > 3 else ""
                    cause = f"rank {rank} ({self.where(rank)}) {describe_status(code)}{extra}"
                    self.say(f"{cause}; stopping the job")
                    failure = Failure(code if code > 0 else 128 - code, cause, {self.node_of(rank): "trainer"})
            elif ev[0] == "agent_gone" and running[ev[1]] > 0:
                cause = f"the agent on {self.host_label(ev[1])} exited with status {ev[2]} while its trainers ran " \
                        f"(host or connection lost?)"
                self.say(f"{cause}; stopping the job")
                failure = Failure(1, cause, {ev[1]: "agent"})
            elif ev[0] == "daemons":
                dead = self.dead_daemon()
                which = f"the daemon on {self.host_label(dead)} died" if dead is not None else "the daemons ended"
                cause = f"{which} (mpirun exited with status {ev[1]})"
                self.say(f"{cause} while the trainers ran; stopping the job. Their last lines:\n{self.daemons_log()}")
                failure = Failure(1, cause, {dead: "daemon"} if dead is not None else {})
            elif ev[0] == "signal":
                self.say(f"{signal_name(-ev[1])} received; stopping the job")
                return Failure(128 + ev[1], f"{signal_name(-ev[1])} received", restartable=False)
            if failure is not None:
                failures.append(failure)
                if not self.a.max_restarts or "trainer" not in failure.blame.values():
                    break  # no restart (no cause to weigh), or the cause is a daemon or a host
                if settle_until is None:
                    settle_until = time.monotonic() + SETTLE_S
        if not failures:
            self.say(f"all {self.world} trainers exited 0")
            return None
        # A dead daemon or a lost host makes trainers fail too: theirs is the cause.
        rank = {"daemon": 0, "agent": 1, "trainer": 2}
        failures.sort(key=lambda f: min((rank[k] for k in f.blame.values()), default=0))
        first = failures[0]
        for f in failures[1:]:  # other hosts lost or daemons dead in the same window count too
            for n, k in f.blame.items():
                if k != "trainer":
                    first.blame.setdefault(n, k)
        return first

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
        self.daemons = None


def launch(config: LaunchConfig, hosts: Sequence[Host], handle_signals: bool = True) -> int:
    """Runs a job to its end and leaves nothing behind; returns spexrun's exit status. With
    `handle_signals` (the main thread only) SIGINT and SIGTERM stop the job (status 128 + signal).

        from spex.launcher import LaunchConfig, launch
        from spex.hosts import parse_hosts
        launch(LaunchConfig(["python3", "train.py"], max_restarts=3), parse_hosts("host1:4,host2:4"))
    """
    config.check(hosts)
    launcher = Launcher(config, list(hosts))
    previous = {}
    if handle_signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda signum, _frame: launcher.on_signal(signum))
    rc = 1
    try:
        rc = launcher.run()
    except Exception as e:  # a failed start (no spexd, no emulation): say it, clean up, fail
        launcher.say(f"error: {e}")
        rc = 1
    finally:
        if handle_signals:
            for sig in previous:
                signal.signal(sig, signal.SIG_IGN)
        launcher.shutdown()
        launcher.stop_watchdog()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return rc
