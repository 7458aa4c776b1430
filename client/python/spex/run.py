"""spexrun: starts a spex job on several hosts the way `horovodrun` and `torchrun` do.

    spexrun -H host1:4,host2:4 -- python3 train.py          # 2 hosts, 4 trainers each
    spexrun --hostfile hosts.txt -- python3 train.py         # "host slots=4" lines (Open MPI's form)
    spexrun -- python3 train.py                              # inside a SLURM allocation
    spexrun --emulated 2 -- python3 train.py                 # 2 emulated hosts of this machine
    spexrun --max-restarts 3 --min-hosts 1 -H ... -- python3 train.py   # survive failures

This module is the command line only, a thin shell over the launcher library: spex.hosts (host
lists), spex.agent (the per-host agent, `spexrun --agent`), spex.launcher (LaunchConfig, Launcher,
launch, the watchdog `spexrun --watchdog`) and spex.world (the daemon world). What the launcher
does, in order:
1. One `spexd` per host, all in one MPI world under Open MPI's `mpirun` (ssh to reach other
   hosts, or --rsh-agent), with `--local_trainers` = the host's slots and its socket at
   /tmp/spex-<uid>/spexrun-<id>/node<i>.sock.
2. One agent per host: it waits until its daemon answers the gRPC health check, reports
   "ready", and when every host is ready starts the host's trainers with the environment
   torchrun gives plus SPEX_SOCKET and the restart count, so `init_process_group(init_method=
   "env://")` and `spex.torch.register(ddp)` need no arguments. Every output line is prefixed
   `[RANK,LOCAL_RANK]<stdout>:` or `<stderr>:` and streamed live.
3. When every trainer has exited 0, the daemons are stopped and spexrun exits 0. When a trainer
   exits non-zero or dies, or a daemon or agent goes away, the other trainers and the daemons are
   stopped; with --max-restarts everything starts again (failing hosts left out with
   --min-hosts), else (or once the restarts are spent) spexrun exits non-zero naming the rank
   (or host) and its status. Ctrl-C and SIGTERM stop everything. A watchdog stops the daemons
   when spexrun itself dies (SIGKILL).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List, Optional, Sequence

# The library's names, also reachable as spex.run.NAME (programs and tests written before the
# split use them).
from .agent import AGENT_BOOT, CONTROL, Agent, agent_main, daemon_healthy
from .hosts import (ENV_NAME_RE, LOCAL_NAMES, Host, LaunchError, expand_hostlist,
                    expand_tasks_per_node, is_local, parse_hosts, read_hostfile, slurm_hosts)
from .launcher import (FORWARD_NAMES, FORWARD_PREFIXES, LaunchConfig, Launcher, describe_status,
                       launch, make_private_dirs, signal_name, watchdog_main)

__all__ = ["AGENT_BOOT", "CONTROL", "Agent", "agent_main", "daemon_healthy", "ENV_NAME_RE", "LOCAL_NAMES", "Host",
           "LaunchError", "expand_hostlist", "expand_tasks_per_node", "is_local", "parse_hosts", "read_hostfile",
           "slurm_hosts", "FORWARD_NAMES", "FORWARD_PREFIXES", "LaunchConfig", "Launcher", "describe_status", "launch",
           "make_private_dirs", "signal_name", "watchdog_main", "build_parser", "resolve_hosts", "config_from_args",
           "main"]


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
    p.add_argument("--spexd", help="the spexd binary (default $SPEXD, else spexd on PATH)")
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
    p.add_argument("--max-restarts", type=int, default=0, metavar="N",
                   help="after a failed trainer, a dead daemon or a lost host, stop what is left and start the "
                        "daemons and trainers again, up to N times (torchrun's meaning; default 0); the trainers "
                        "get the count in SPEX_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT")
    p.add_argument("--min-hosts", type=int, metavar="M",
                   help="with --max-restarts: leave a failing host out of the restart (its agent lost, its daemon "
                        "dead, or its trainers failing twice in a row) while at least M hosts remain")
    p.add_argument("--daemon-cpus", metavar="LIST",
                   help="run every host's spexd on these cores (taskset's form: 0-1 or 0,8) and the host's "
                        "trainers on the others (default: the scheduler places both)")
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


def config_from_args(a: argparse.Namespace, env: Optional[Dict[str, str]] = None) -> LaunchConfig:
    """The LaunchConfig of a parsed command line."""
    env = dict(os.environ) if env is None else env
    command = list(a.command or [])
    if command and command[0] == "--":
        command = command[1:]
    return LaunchConfig(
        command=command, emulated=a.emulated, slots=a.slots, rate=a.rate, latency_us=a.latency_us, spexd=a.spexd,
        spexd_args=list(a.spexd_arg or []), rsh_agent=a.rsh_agent, x=list(a.x or []), master_port=a.master_port,
        start_timeout=a.start_timeout, grace=a.grace, daemon_output=a.daemon_output, max_restarts=a.max_restarts,
        min_hosts=a.min_hosts, daemon_cpus=a.daemon_cpus,
        from_slurm=a.hosts is None and a.hostfile is None and a.emulated is None and slurm_hosts(env) is not None)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--agent":
        return agent_main(argv[1:])
    if argv and argv[0] == "--watchdog":
        return watchdog_main(argv[1:])
    a = build_parser().parse_args(argv)
    try:
        config = config_from_args(a)
        if not config.command:
            raise LaunchError("no command to run: spexrun [options] -- CMD ARGS... (e.g. -- python3 train.py)")
        for kv in config.x:
            name = kv.partition("=")[0]
            if not ENV_NAME_RE.match(name):
                raise LaunchError(f"-x {kv}: '{name}' is not a variable name (letters, digits, '_'; not a digit "
                                  f"first): -x NAME passes this shell's value, -x NAME=VALUE a value")
        hosts = resolve_hosts(a, os.environ)
        if a.emulated is None and len(hosts) > 1 and any(h.name in LOCAL_NAMES for h in hosts):
            raise LaunchError("a local name (localhost) beside other hosts: name this host as the others reach it")
        config.check(hosts)
        if a.emulated is not None:
            from .emulated import EmulatedCluster
            why = EmulatedCluster.unavailable()
            if why:
                raise LaunchError(f"--emulated: {why}")
    except LaunchError as e:
        sys.stderr.write(f"spexrun: {e}\n")
        return 2
    return launch(config, hosts)


if __name__ == "__main__":
    sys.exit(main())
