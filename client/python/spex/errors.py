"""Exceptions of the spex client: every failure is one of these, with a message that says what
to fix. gRPC status codes from the daemon are translated by `from_rpc_error`."""

from __future__ import annotations

from typing import Optional

import grpc


class SpexError(RuntimeError):
    """Base class of every spex client error. `code` is the gRPC status name when the daemon
    reported the error (e.g. "FAILED_PRECONDITION"), else None."""

    def __init__(self, message: str, code: Optional[str] = None):
        super().__init__(message)
        self.code = code


class DaemonUnavailableError(SpexError, ConnectionError):
    """No daemon answers at the socket, or it shut down while this trainer was using it."""


class SessionLostError(DaemonUnavailableError):
    """The daemon no longer knows this trainer's session: it was restarted under a running
    trainer. A running job cannot rejoin; restart every trainer of the job."""


class SpexSecurityError(SpexError, PermissionError):
    """The daemon's socket is not safe to hand gradients to (served by another user, or in a
    directory another user controls), or the daemon refused this process (PERMISSION_DENIED:
    another user's daemon, or a session this process did not open)."""


class BucketOrderError(SpexError):
    """Nodes exchanged different buckets (ids, sizes or steps) at the same point: every node
    must register the same buckets and exchange them in the same order."""


class ExchangeTimeoutError(SpexError, TimeoutError):
    """An exchange was not published within the client's exchange timeout."""


class SpexValueError(SpexError, ValueError):
    """A request the daemon or the client rejected as invalid (sizes, ids, densities, ...)."""


class SpexTypeError(SpexError, TypeError):
    """Data of the wrong type (e.g. a tensor that is not float32)."""


class OwnInputRefused(SpexError):
    """A bucket's own_input (zero-copy input) could not be used: the tensor's storage cannot be
    put in shared memory, or the daemon cannot take it (another user's spexd without the right to
    ptrace the trainer, memory not in shared memory). Nothing was registered: register the bucket
    without own_input (the trainer then copies its input into the slot)."""


class NotImplementedByDaemon(SpexError, NotImplementedError):
    """The daemon does not implement this request (yet)."""


class CudaRuntimeError(SpexError):
    """A CUDA runtime call for a device bucket failed (the message names the call and the CUDA
    error), or the CUDA runtime library (libcudart) cannot be loaded."""


def from_rpc_error(err: grpc.RpcError, what: str, socket: str, session_id: int = 0) -> SpexError:
    """Translates a failed gRPC call `what` on the daemon at `socket` into a SpexError."""
    code = err.code() if hasattr(err, "code") else None
    details = err.details() if hasattr(err, "details") else str(err)
    name = code.name if code is not None else None
    msg = f"{what}: {details}"
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return DaemonUnavailableError(
            f"{what}: spexd at {socket} is not reachable ({details}); was the daemon stopped? "
            f"Start it (mpirun ... spexd --socket={socket}) and restart the training job",
            name,
        )
    if code == grpc.StatusCode.NOT_FOUND and "no session" in (details or ""):
        return SessionLostError(
            f"{what}: spexd at {socket} does not know this trainer's session {session_id}: the daemon was "
            f"restarted under a running trainer. A running job cannot rejoin a new daemon: restart every "
            f"trainer of the job",
            name,
        )
    if code == grpc.StatusCode.FAILED_PRECONDITION and "bucket order differs" in (details or ""):
        return BucketOrderError(msg, name)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return ExchangeTimeoutError(msg, name)
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.ALREADY_EXISTS):
        return SpexValueError(msg, name)
    if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
        return SpexSecurityError(msg, name)
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return NotImplementedByDaemon(f"{what}: this spexd does not implement it ({details})", name)
    return SpexError(msg, name)
