"""Host lists for the launcher (spex.launcher, the `spexrun` CLI): `-H host1:4,host2:4`, Open
MPI's hostfile form, SLURM's allocation (compact host lists and tasks per node), with every host
name checked so that ssh and mpirun cannot read one as an option. Its own module so that a
program can build a host list without the launcher.
"""

from __future__ import annotations

import re
import socket as _socket
from dataclasses import dataclass
from typing import Dict, List, Optional

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


class LaunchError(Exception):
    """A bad command line or host list: the message says what to fix."""


@dataclass
class Host:
    name: str
    slots: int


_HOST_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # what -x accepts


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
