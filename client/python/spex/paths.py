"""Where the node's spexd listens by default, as daemon/util/paths.h defines it:

    /tmp/spex-<uid>/<job>/<hostname>[.<i>].sock

<job> is $SPEX_JOB, else $SLURM_JOB_ID, else "default"; ".<i>" is added when several daemons
share a host (i = $SPEX_LOCAL_DAEMON). $SPEX_SOCKET, when set, overrides the whole path."""

from __future__ import annotations

import os
import socket as _socket
from typing import Optional


def default_job() -> str:
    """The job name: $SPEX_JOB, else $SLURM_JOB_ID, else "default"."""
    return os.environ.get("SPEX_JOB") or os.environ.get("SLURM_JOB_ID") or "default"


def default_socket_path(job: Optional[str] = None, local_index: int = -1) -> str:
    """The daemon's default socket for `job` (local_index < 0: no ".<i>" suffix)."""
    path = f"/tmp/spex-{os.getuid()}/{job or default_job()}/{_socket.gethostname()}"
    if local_index >= 0:
        path += f".{local_index}"
    return path + ".sock"


def client_socket_path(job: Optional[str] = None) -> str:
    """What a trainer connects to when given no explicit socket: $SPEX_SOCKET, else the default
    path with the daemon index $SPEX_LOCAL_DAEMON when set."""
    explicit = os.environ.get("SPEX_SOCKET")
    if explicit:
        return explicit
    idx = os.environ.get("SPEX_LOCAL_DAEMON")
    return default_socket_path(job, int(idx) if idx else -1)
