"""Mapping the POSIX shared-memory segments spexd creates (as client/shm_mapping.h does for C++) into
this process, as writable mmap objects that numpy arrays and torch tensors can view without copies."""

from __future__ import annotations

import mmap
import os

from .errors import SpexError


def attach(name: str, size: int) -> mmap.mmap:
    """Maps exactly `size` bytes of the shm segment `name` ("/spex-..."); fails clearly when the
    segment is gone (already unlinked by the daemon) or smaller than `size`."""
    if not name.startswith("/") or "/" in name[1:]:
        raise SpexError(f"invalid shm name {name!r} from the daemon")
    path = "/dev/shm" + name
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as e:
        raise SpexError(
            f"cannot open shared segment {name}: {e.strerror}. The daemon unlinks a segment once every local "
            f"trainer attached it; a trainer that joins late (or twice) cannot map it: restart the node's trainers"
        ) from e
    try:
        actual = os.fstat(fd).st_size
        if actual < size:
            raise SpexError(f"shared segment {name} has {actual} bytes, the daemon described {size}")
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def remove_segments_of(pid: int) -> None:
    """Unlinks the shared segments (/dev/shm/spex-<pid>-*) of spexd process `pid`: those of a
    daemon that died without removing them (killed, crashed); a daemon stopped cleanly removed its
    own. A segment already gone is not an error."""
    prefix = f"spex-{pid}-"
    for name in os.listdir("/dev/shm"):
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass


def release(mapping: mmap.mmap) -> bool:
    """Unmaps `mapping` unless arrays or tensors still view it (then it stays mapped until the
    last of them is garbage-collected). Returns True when it was unmapped now."""
    try:
        mapping.close()
        return True
    except BufferError:
        return False
