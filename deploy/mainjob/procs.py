"""What /proc says about the main job's daemons: their CPU time, and which node each serves."""

import os
from typing import Dict, List


def cpu_seconds(pids: List[int]) -> float:
    """User + system CPU time of the processes (all their threads) so far; 0 for any gone."""
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass
    return total


def daemons_by_node(pids: List[int]) -> Dict[int, int]:
    """{node: spexd PID}, from each daemon's MPI rank in its environment (empty if unreadable)."""
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            out[int(env[b"OMPI_COMM_WORLD_RANK"])] = pid
        except (OSError, KeyError, ValueError):
            pass
    return out
