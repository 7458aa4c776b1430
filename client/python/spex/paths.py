"""Where the node's spexd listens by default, as proto/contract/socket_paths.h defines it:

    <base>/<job>/<hostname>[.<i>].sock

<base> is $XDG_RUNTIME_DIR/spex when $XDG_RUNTIME_DIR is a directory this user owns that others
cannot write, else /tmp/spex-<uid>. <job> is $SPEX_JOB, else $SLURM_JOB_ID, else "default"; ".<i>"
is added when several daemons share a host (i = $SPEX_LOCAL_DAEMON). $SPEX_SOCKET, when set,
overrides the whole path.

Also the trainer's side of the socket checks (proto/contract/socket_paths.h CheckServerSocket): who
listens (SO_PEERCRED) and whether the socket's directory could be changed by another user."""

from __future__ import annotations

import os
import pwd
import socket as _socket
import stat
import struct
from typing import Iterable, Optional

_FIX = ("remove it (its owner or root can) or use a socket in a directory only you can write, e.g. "
        "spexd --socket=$XDG_RUNTIME_DIR/spex/node.sock (trainers: SPEX_SOCKET)")


def _who(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def default_socket_base() -> str:
    """$XDG_RUNTIME_DIR/spex when that directory is this user's and closed to others' writes,
    else /tmp/spex-<uid>."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime.startswith("/"):
        try:
            st = os.stat(runtime)
        except OSError:
            st = None
        if (st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
                and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
            return runtime + "/spex"
    return f"/tmp/spex-{os.getuid()}"


def _check_chain(directory: str, trusted: int, final_last: bool = True) -> Optional[str]:
    parts = [p for p in directory.split("/") if p]
    prefixes = ["/"] + ["/" + "/".join(parts[:i + 1]) for i in range(len(parts))]
    for i, path in enumerate(prefixes):
        final = final_last and i == len(prefixes) - 1
        try:
            st = os.lstat(path)
        except OSError as e:
            return f"cannot stat {path}: {e.strerror}"
        owner_ok = st.st_uid in (trusted, 0)
        if stat.S_ISLNK(st.st_mode):
            if not owner_ok:
                return (f"{path} is a symlink owned by {_who(st.st_uid)}, not by {_who(trusted)} or root: that "
                        f"user decides where the socket goes; {_FIX}")
            continue
        if not stat.S_ISDIR(st.st_mode):
            return f"{path} is not a directory"
        if (st.st_uid != trusted) if final else not owner_ok:
            return (f"socket directory {path} is owned by {_who(st.st_uid)}, not by {_who(trusted)}"
                    f"{'' if final else ' or root'}: another user may have created it to take over the daemon's "
                    f"socket; {_FIX}")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and (final or not st.st_mode & stat.S_ISVTX):
            return (f"socket directory {path} (mode {oct(st.st_mode & 0o7777)}) may be written by other users, "
                    f"who could replace the socket; chmod go-w {path} or {_FIX}")
    return None


def private_directory_problem(directory: str, trusted: int) -> Optional[str]:
    """Why another user than `trusted` (or root) could change what `directory` holds, or None
    (the rules of proto/contract/socket_paths.h CheckPrivateDirectory)."""
    problem = _check_chain(directory, trusted)
    if problem is None:
        resolved = os.path.realpath(directory)
        if resolved != directory:
            problem = _check_chain(resolved, trusted)
    return problem


def trusted_server_uids(extra: Iterable[int] = ()) -> set:
    """The users a trainer hands gradients to: itself, root, `extra` and $SPEX_TRUST_SERVER_UIDS."""
    uids = {os.getuid(), 0, *extra}
    for part in os.environ.get("SPEX_TRUST_SERVER_UIDS", "").split(","):
        if part.strip().isdigit():
            uids.add(int(part.strip()))
    return uids


def peer_uid(sock: _socket.socket) -> tuple:
    """(pid, uid, gid) of the process at the other end of a connected unix socket."""
    return struct.unpack("3i", sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, struct.calcsize("3i")))


def socket_directory(path: str) -> str:
    """The directory of `path` as the kernel reaches it and the C++ client checks it: the text
    before the last '/', a relative one under the working directory, with "." and ".." left in
    place. (os.path.abspath would drop "link/.." as text, while the kernel goes through the
    symlink first: the check would look at a directory the socket is not in.)"""
    slash = path.rfind("/")
    directory = "." if slash < 0 else "/" if slash == 0 else path[:slash]
    if not directory.startswith("/"):
        cwd = os.getcwd()
        directory = cwd if directory == "." else ("" if cwd == "/" else cwd) + "/" + directory
    return directory


def check_server(path: str, sock: _socket.socket, trusted: Iterable[int] = ()) -> int:
    """After `sock` connected to `path`: raises SpexSecurityError unless the listening process runs
    as a trusted user (trusted_server_uids) and the socket's directory is private to this user or
    to the server's. Returns the server's uid."""
    # Imported here: this module is also loaded on its own, outside the package (scripts that
    # only resolve the default path).
    from .errors import SpexSecurityError

    pid, uid, _ = peer_uid(sock)
    if uid not in trusted_server_uids(trusted):
        raise SpexSecurityError(
            f"the process listening at {path} (pid {pid}) runs as {_who(uid)}, not as you or root (you are "
            f"{_who(os.getuid())}): it may be another user's impostor waiting for your gradients. Use your own daemon's socket; if "
            f"this is your site's shared daemon, set SPEX_TRUST_SERVER_UIDS={uid}")
    directory = socket_directory(path)
    problem = private_directory_problem(directory, os.getuid())
    if problem is not None and uid != os.getuid() and private_directory_problem(directory, uid) is None:
        problem = None
    # A sticky directory (as /tmp) is safe too when the socket file is the server's or ours:
    # nobody else may remove or rename it there.
    if problem is not None:
        try:
            d, f = os.stat(directory), os.lstat(path)
            if (d.st_mode & stat.S_ISVTX and stat.S_ISSOCK(f.st_mode) and f.st_uid in (os.getuid(), uid)
                    and _check_chain(directory, os.getuid(), final_last=False) is None):
                problem = None
        except OSError:
            pass
    if problem is not None:
        raise SpexSecurityError(f"spexd at {path}: {problem}")
    return uid


def default_job() -> str:
    """The job name: $SPEX_JOB, else $SLURM_JOB_ID, else "default"."""
    return os.environ.get("SPEX_JOB") or os.environ.get("SLURM_JOB_ID") or "default"


def default_socket_path(job: Optional[str] = None, local_index: int = -1) -> str:
    """The daemon's default socket for `job` (local_index < 0: no ".<i>" suffix)."""
    path = f"{default_socket_base()}/{job or default_job()}/{_socket.gethostname()}"
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
