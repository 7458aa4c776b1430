"""The Python client of spexd, doing exactly what the C++ client (client/client.h) does.

A trainer connects to its node's daemon (Hello), registers each gradient bucket once (the
daemon returns a shared segment that is mapped here), and per step writes its gradients into
the bucket's input slot and exchanges: through the doorbell in the shared segments (no RPC on
the hot path; see daemon/memory/layout.h) or through the Exchange RPC. The output slot then
holds the average over every trainer of every node.

    with spex.Client(socket="/tmp/x/node0.sock", local_rank=0, local_size=2) as c:
        b = c.register_bucket(0, n)           # b.input / b.output are numpy views of shm
        b.input[:] = grads                     # or b.write(tensor); b.input_tensor for torch
        avg = c.exchange(b)                    # numpy view of the output slot
"""

from __future__ import annotations

import mmap
import os
import socket as _socket
import time
import weakref
from typing import Any, Dict, List, Optional

import grpc
import numpy as np

from . import _native
from . import layout as L
from . import shm
from .errors import (
    BucketOrderError,
    DaemonUnavailableError,
    ExchangeTimeoutError,
    SessionLostError,
    SpexError,
    SpexTypeError,
    SpexValueError,
    from_rpc_error,
)
from .paths import client_socket_path
from .proto import spex_pb2 as pb
from .proto import spex_pb2_grpc as pb_grpc

PROTOCOL_VERSION = 1
MODES = ("doorbell", "rpc")
RECONNECT_WAIT_S = 3.0  # how long a liveness probe waits for the daemon to answer again


def _env_int(name: str) -> Optional[int]:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise SpexValueError(f"${name}={value!r} is not an integer") from None


class Bucket:
    """A registered bucket: this trainer's input slot and the node's shared output slot, mapped
    from the daemon's segment. `input` and `output` are numpy float32 views (no copies);
    `input_tensor` and `output_tensor` are torch tensors over the same memory. The output holds
    the average of the last exchange until the next one is published; copy what you keep."""

    def __init__(self, client: "Client", bucket_id: int, elements: int, mapping: mmap.mmap,
                 resp: "pb.RegisterBucketResponse"):
        self._client = client
        self.id = bucket_id
        self.elements = elements
        self.compressor: str = resp.compressor.name
        self.density: float = resp.compressor.density
        self.next_step: int = resp.next_step
        self._mapping: Optional[mmap.mmap] = mapping
        self._input_offset = resp.layout.input_offset
        self._output_offset = resp.layout.output_offset
        self.input: np.ndarray = np.frombuffer(mapping, dtype=np.float32, count=elements,
                                               offset=resp.layout.input_offset)
        out = np.frombuffer(mapping, dtype=np.float32, count=elements, offset=resp.layout.output_offset)
        out.flags.writeable = False
        self.output: np.ndarray = out
        self._input_tensor = None
        self._output_tensor = None
        self.last_rpc_stats: Optional[pb.ExchangeStats] = None
        self.closed = False

    @property
    def header(self) -> mmap.mmap:
        """The mapped segment (its first page is the BucketHeader)."""
        if self._mapping is None or self.closed:
            raise SpexError(f"bucket {self.id} was unregistered or its client closed")
        return self._mapping

    @property
    def input_tensor(self):
        """This trainer's input slot as a float32 torch tensor (shares memory with `input`)."""
        if self._input_tensor is None:
            import torch

            self._input_tensor = torch.from_numpy(self.input)
        return self._input_tensor

    @property
    def output_tensor(self):
        """The output slot as a float32 torch tensor (shares memory; do not write to it)."""
        if self._output_tensor is None:
            import torch

            view = np.frombuffer(self.header, dtype=np.float32, count=self.elements, offset=self._output_offset)
            self._output_tensor = torch.from_numpy(view)
        return self._output_tensor

    def write(self, data: Any) -> None:
        """Copies `data` (a float32 numpy array or CPU torch tensor with exactly `elements`
        entries, any shape) into the input slot. Other dtypes or sizes raise, never convert."""
        if self.closed:
            raise SpexError(f"bucket {self.id} was unregistered or its client closed")
        if isinstance(data, np.ndarray):
            if data.dtype != np.float32:
                raise SpexTypeError(f"bucket {self.id} holds float32; got a numpy array of {data.dtype}: "
                                    f"convert it with .astype(np.float32)")
            if data.size != self.elements:
                raise SpexValueError(f"bucket {self.id} was registered with {self.elements} elements; got an "
                                     f"array of {data.size} (shape {data.shape})")
            np.copyto(self.input, data.reshape(-1))
            return
        try:
            import torch
        except ImportError:  # pragma: no cover - torch is optional
            torch = None
        if torch is not None and isinstance(data, torch.Tensor):
            if data.dtype != torch.float32:
                raise SpexTypeError(f"bucket {self.id} holds float32; got a tensor of {data.dtype}: "
                                    f"convert it with .float() (or register float32 parameters)")
            if data.device.type != "cpu":
                raise SpexTypeError(f"bucket {self.id} lives in host memory; got a tensor on {data.device}: "
                                    f"this spexd serves CPU buffers only")
            if data.numel() != self.elements:
                raise SpexValueError(f"bucket {self.id} was registered with {self.elements} elements; got a "
                                     f"tensor of {data.numel()} (shape {tuple(data.shape)})")
            self.input_tensor.copy_(data.detach().reshape(-1))
            return
        raise SpexTypeError(f"bucket {self.id}: expected a float32 numpy array or torch tensor, got "
                            f"{type(data).__name__}")

    def _release(self) -> None:
        self.closed = True
        self._input_tensor = self._output_tensor = None
        mapping, self._mapping = self._mapping, None
        self.input = self.output = None  # type: ignore[assignment]
        if mapping is not None:
            shm.release(mapping)  # stays mapped while outside arrays/tensors still view it

    def __repr__(self) -> str:
        return (f"Bucket(id={self.id}, elements={self.elements}, compressor={self.compressor!r}, "
                f"density={self.density}, next_step={self.next_step})")


def _goodbye(stub: pb_grpc.SpexStub, channel: grpc.Channel, session_id: int) -> None:
    try:
        stub.Goodbye(pb.GoodbyeRequest(session_id=session_id), timeout=5)
    except grpc.RpcError:
        pass  # the daemon is gone; nothing to release
    finally:
        channel.close()


class Client:
    """A session with the node's spexd.

    Args:
        socket: the daemon's unix socket; default $SPEX_SOCKET, else the default path for `job`
            (see spex.paths).
        job: job name ($SPEX_JOB / $SLURM_JOB_ID / "default" when empty).
        local_rank: this trainer's index on the node; default $LOCAL_RANK, else 0.
        local_size: trainers on this node (the daemon's --local_trainers); default
            $LOCAL_WORLD_SIZE, else 1.
        client_name: free text shown by `spexctl sessions`.
        connect_timeout: seconds to wait for the daemon to answer.
        exchange_timeout: seconds one exchange may take before ExchangeTimeoutError.
        probe_interval: while waiting for a result longer than this, check every so often that
            the daemon is alive and still knows this session (a restarted daemon raises
            SessionLostError instead of hanging).
    """

    def __init__(self, socket: Optional[str] = None, *, job: Optional[str] = None,
                 local_rank: Optional[int] = None, local_size: Optional[int] = None,
                 client_name: str = "spex-py", connect_timeout: float = 10.0,
                 exchange_timeout: float = 300.0, probe_interval: float = 1.0):
        self.job = job or ""
        self.socket: str = socket or client_socket_path(job or None)
        if local_rank is None:
            local_rank = _env_int("LOCAL_RANK")
        if local_size is None:
            local_size = _env_int("LOCAL_WORLD_SIZE")
        self.local_rank: int = 0 if local_rank is None else int(local_rank)
        self.local_size: int = 1 if local_size is None else int(local_size)
        if not 1 <= self.local_size <= L.MAX_LOCAL_TRAINERS:
            raise SpexValueError(f"local_size must be in 1..{L.MAX_LOCAL_TRAINERS}, got {self.local_size}")
        if not 0 <= self.local_rank < self.local_size:
            raise SpexValueError(f"local_rank {self.local_rank} must be in 0..{self.local_size - 1} (local_size)")
        self.connect_timeout = float(connect_timeout)
        self.exchange_timeout = float(exchange_timeout)
        self.probe_interval = float(probe_interval)
        self._buckets: Dict[int, Bucket] = {}
        self._bell: Optional[mmap.mmap] = None
        self._closed = False
        self._check_socket()
        self._channel = grpc.insecure_channel("unix:" + self.socket)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=self.connect_timeout)
        except grpc.FutureTimeoutError:
            self._channel.close()
            raise DaemonUnavailableError(
                f"spexd at {self.socket} does not answer within {self.connect_timeout:g} s (stale socket? "
                f"start the daemon)") from None
        self._stub = pb_grpc.SpexStub(self._channel)
        req = pb.HelloRequest(job=self.job, local_rank=self.local_rank, local_size=self.local_size,
                              device=pb.DEVICE_CPU, client=client_name, pid=os.getpid(),
                              protocol_version=PROTOCOL_VERSION)
        try:
            self.hello: pb.HelloResponse = self._stub.Hello(req, timeout=self.connect_timeout)
        except grpc.RpcError as e:
            self._channel.close()
            raise from_rpc_error(e, "Hello", self.socket) from None
        self.session_id: int = self.hello.session_id
        self._finalizer = weakref.finalize(self, _goodbye, self._stub, self._channel, self.session_id)
        if not self.hello.doorbell.HasField("shm"):
            self.close()
            raise SpexError("Hello: the daemon sent no doorbell segment (a CUDA-only daemon?)")
        try:
            self._bell = shm.attach(self.hello.doorbell.shm.name, self.hello.doorbell.shm.size)
        except SpexError:
            self.close()
            raise
        if (_native.load32(self._bell, L.DOORBELL_MAGIC_OFFSET) != L.DOORBELL_MAGIC
                or _native.load32(self._bell, L.DOORBELL_VERSION_OFFSET) != L.LAYOUT_VERSION):
            self.close()
            raise SpexError("doorbell segment has an unknown layout: client and daemon versions differ")
        _native.store32(self._bell, L.doorbell_attached_offset(self.local_rank), 1)

    # -- session ------------------------------------------------------------------------------

    def _check_socket(self) -> None:
        if not os.path.exists(self.socket):
            raise DaemonUnavailableError(
                f"no spexd socket at {self.socket}: start the node's daemon first "
                f"(mpirun -np NODES spexd --socket={self.socket} --local_trainers={self.local_size}), "
                f"or point SPEX_SOCKET at its socket")
        probe = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        probe.settimeout(self.connect_timeout)
        try:
            probe.connect(self.socket)
        except ConnectionRefusedError:
            raise DaemonUnavailableError(
                f"no spexd listens at {self.socket} (a stale socket file: the daemon stopped or crashed); "
                f"start the daemon (mpirun -np NODES spexd --socket={self.socket} "
                f"--local_trainers={self.local_size})") from None
        except OSError as e:
            raise DaemonUnavailableError(f"cannot connect to spexd at {self.socket}: {e.strerror or e}") from None
        finally:
            probe.close()

    @property
    def node_rank(self) -> int:
        """This node's rank in the daemons' world."""
        return self.hello.node_rank

    @property
    def node_count(self) -> int:
        """Number of nodes (daemons)."""
        return self.hello.node_count

    @property
    def world_size(self) -> int:
        """Trainers the daemon averages over: nodes x local trainers."""
        return self.hello.node_count * self.hello.local_trainers

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Says Goodbye (the daemon drops what only this session held) and unmaps the segments.
        Safe to call twice; errors from a daemon that is already gone are ignored."""
        if self._closed:
            return
        self._closed = True
        for b in list(self._buckets.values()):
            b._release()
        self._buckets.clear()
        self._finalizer()
        if self._bell is not None:
            shm.release(self._bell)
            self._bell = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise SpexError(f"the client of spexd at {self.socket} is closed")

    def _rpc(self, name: str, request: Any, timeout: float) -> Any:
        self._check_open()
        try:
            return getattr(self._stub, name)(request, timeout=timeout)
        except grpc.RpcError as e:
            err = from_rpc_error(e, name, self.socket, self.session_id)
        if isinstance(err, DaemonUnavailableError) and name != "Goodbye":
            err = self._refine_unavailable(err, name)
        raise err

    def _refine_unavailable(self, err: SpexError, doing: str) -> SpexError:
        """After a failed call: a daemon that answers again but no longer knows this session was
        restarted (SessionLostError); otherwise the original error stands."""
        try:
            known = self._session_known(wait=RECONNECT_WAIT_S)
        except DaemonUnavailableError:
            return err
        if not known:
            return self._session_lost(doing)
        return err

    # -- buckets ------------------------------------------------------------------------------

    def register_bucket(self, bucket_id: int, elements: int, compressor: Optional[str] = None,
                        density: Optional[float] = None, params: Optional[Dict[str, str]] = None) -> Bucket:
        """Registers bucket `bucket_id` of `elements` float32 values and maps its segment.

        Every trainer of the job registers the same ids with the same sizes; within a step the
        daemon exchanges buckets in ascending id order, so number them in the order they become
        ready. `compressor`/`density` override the daemon's defaults for this bucket (e.g.
        "dense", "micro", "topk"; density in (0, 1]); `params` are compressor parameters.
        """
        self._check_open()
        if bucket_id in self._buckets:
            raise SpexValueError(f"bucket {bucket_id} is already registered by this client")
        if not isinstance(elements, (int, np.integer)) or isinstance(elements, bool) or elements <= 0:
            raise SpexValueError(f"bucket {bucket_id}: elements must be a positive integer, got {elements!r}")
        if not isinstance(bucket_id, (int, np.integer)) or not 0 <= bucket_id < 2**64:
            raise SpexValueError(f"bucket id must be an integer in 0..2**64-1, got {bucket_id!r}")
        if density is not None and not 0 < density <= 1:
            raise SpexValueError(f"bucket {bucket_id}: density must be in (0, 1], got {density}")
        cfg = pb.CompressorConfig(name=compressor or "", density=float(density or 0.0), params=params or {})
        req = pb.RegisterBucketRequest(session_id=self.session_id, bucket_id=int(bucket_id),
                                       elements=int(elements), dtype=pb.DTYPE_FLOAT32, compressor=cfg)
        resp = self._rpc("RegisterBucket", req, self.connect_timeout)
        seg, lay = resp.buffer.shm, resp.layout
        n = int(elements)
        if (not resp.buffer.HasField("shm") or lay.elements != n or lay.input_offset + 4 * n > seg.size
                or lay.output_offset + 4 * n > seg.size or lay.header_offset != 0):
            raise SpexError(f"RegisterBucket: the daemon described a layout that does not fit its buffer "
                            f"(bucket {bucket_id})")
        mapping = shm.attach(seg.name, seg.size)
        ok = (_native.load32(mapping, L.BUCKET_MAGIC_OFFSET) == L.BUCKET_MAGIC
              and _native.load32(mapping, L.BUCKET_VERSION_OFFSET) == L.LAYOUT_VERSION
              and _native.load64(mapping, L.BUCKET_ELEMENTS_OFFSET) == n)
        if not ok:
            shm.release(mapping)
            raise SpexError("bucket segment has an unexpected layout: client and daemon versions differ")
        bucket = Bucket(self, int(bucket_id), n, mapping, resp)
        _native.store32(mapping, L.bucket_attached_offset(self.local_rank), 1)
        self._buckets[bucket.id] = bucket
        return bucket

    def validate_compressor(self, compressor: Optional[str], density: Optional[float] = None,
                            params: Optional[Dict[str, str]] = None) -> None:
        """Asks the daemon whether it accepts `compressor` (None: its default) with `density` and
        `params`, without registering anything: raises SpexValueError with the daemon's message
        (which lists the accepted compressor names, or the compressor's accepted parameters)
        when not. Sends a RegisterBucket of 0 elements: spexd checks the compressor before the
        size, so an acceptable compressor is answered by the size error alone."""
        self._check_open()
        if density is not None and not 0 < density <= 1:
            raise SpexValueError(f"density must be in (0, 1], got {density}")
        cfg = pb.CompressorConfig(name=compressor or "", density=float(density or 0.0),
                                  params={str(k): str(v) for k, v in (params or {}).items()})
        req = pb.RegisterBucketRequest(session_id=self.session_id, bucket_id=2**64 - 1, elements=0,
                                       dtype=pb.DTYPE_FLOAT32, compressor=cfg)
        try:
            self._rpc("RegisterBucket", req, self.connect_timeout)
        except SpexValueError as e:
            if "elements must be" in str(e):
                return  # the compressor passed; only the (deliberately) empty size was refused
            what = f"compressor {compressor!r}" if compressor else "the daemon's default compressor"
            msg = str(e).replace(f"RegisterBucket: bucket {2**64 - 1}: ", "")
            raise SpexValueError(f"spexd at {self.socket} does not accept {what} (density {density}, params "
                                 f"{dict(params or {})}): {msg}", e.code) from None
        raise SpexError("RegisterBucket accepted a bucket of 0 elements: this spexd is not the expected version")

    def unregister_bucket(self, bucket: Bucket) -> None:
        """Withdraws this trainer's registration (e.g. after DDP rebuilt its buckets). The bucket
        leaves the daemon's schedule at once; its views must not be used afterwards."""
        self._check_open()
        if self._buckets.get(bucket.id) is not bucket:
            raise SpexValueError(f"bucket {bucket.id} is not registered by this client")
        self._rpc("UnregisterBucket", pb.UnregisterBucketRequest(session_id=self.session_id, bucket_id=bucket.id),
                  self.connect_timeout)
        del self._buckets[bucket.id]
        bucket._release()

    @property
    def buckets(self) -> List[Bucket]:
        """The buckets this client registered, by id."""
        return [self._buckets[k] for k in sorted(self._buckets)]

    # -- exchange -----------------------------------------------------------------------------

    def exchange(self, bucket: Bucket, data: Any = None, mode: str = "doorbell") -> np.ndarray:
        """One exchange of the bucket's next step. Writes `data` into the input slot first when
        given (see Bucket.write). Returns the output slot (a read-only numpy view) holding the
        average of every trainer of every node. `mode` is "doorbell" (shared memory, no RPC on
        the hot path) or "rpc" (the Exchange RPC)."""
        if mode not in MODES:
            raise SpexValueError(f"mode must be one of {MODES}, got {mode!r}")
        if data is not None:
            bucket.write(data)
        if mode == "rpc":
            step = bucket.next_step
            self.exchange_rpc(bucket, step)
            bucket.next_step = step + 1
        else:
            step = self.submit(bucket)
            self.wait(bucket, step)
        return bucket.output

    def submit(self, bucket: Bucket) -> int:
        """Doorbell path, first half: marks this trainer's input of the bucket's next step as
        written (ready[r] = step + 1) and rings the node's doorbell. Returns the step; call
        wait(bucket, step) for the result. The input must not change until wait returns."""
        self._owned(bucket)
        bell = self._bell
        assert bell is not None
        if _native.load32(bell, L.DOORBELL_SHUTDOWN_OFFSET):
            raise self._shutdown_error(bucket, bucket.next_step)
        step = bucket.next_step
        _native.store64(bucket.header, L.ready_offset(self.local_rank), step + 1)
        _native.ring(bell, L.DOORBELL_RING_OFFSET, L.DOORBELL_ENGINE_SLEEPING_OFFSET)
        return step

    def wait(self, bucket: Bucket, step: int) -> None:
        """Doorbell path, second half: waits until the daemon published `step` of the bucket
        (spinning for the daemon's spin_us, then sleeping on a futex), then checks its status;
        on an error fetches the daemon's message through the Exchange RPC and raises it."""
        self._owned(bucket)
        bell = self._bell
        assert bell is not None
        want = (step + 1) & 0xFFFFFFFF
        deadline = time.monotonic() + self.exchange_timeout
        spin_ns = int(self.hello.spin_us) * 1000
        while True:
            slice_s = max(0.0, min(self.probe_interval, deadline - time.monotonic()))
            rc = _native.wait_equal32(bucket.header, L.BUCKET_PUBLISHED_OFFSET, want, L.BUCKET_WAITERS_OFFSET,
                                      bell, L.DOORBELL_SHUTDOWN_OFFSET, spin_ns, int(slice_s * 1e9))
            spin_ns = 0
            if rc == 0:
                break
            if rc == 2:
                raise self._shutdown_error(bucket, step)
            if time.monotonic() >= deadline:
                raise ExchangeTimeoutError(
                    f"bucket {bucket.id} step {step} not published within {self.exchange_timeout:g} s: are all "
                    f"local trainers and all nodes exchanging the same buckets? (spexctl stats shows progress)")
            self._probe(f"waiting for bucket {bucket.id} step {step}")
        status = _native.load32(bucket.header, L.BUCKET_STATUS_OFFSET)
        if status != 0:
            self.exchange_rpc(bucket, step)  # raises the daemon's message for this step
            raise SpexError(f"bucket {bucket.id} step {step}: the daemon published error status {status} but "
                            f"the Exchange RPC reported success")
        bucket.next_step = step + 1

    def exchange_rpc(self, bucket: Bucket, step: int) -> "pb.ExchangeStats":
        """The Exchange RPC for (bucket, step): marks the input written if it is not yet and
        blocks until the result is published; returns that exchange's stats."""
        self._owned(bucket)
        req = pb.ExchangeRequest(session_id=self.session_id, bucket_id=bucket.id, step=step)
        resp = self._rpc("Exchange", req, self.exchange_timeout)
        bucket.last_rpc_stats = resp.stats
        return resp.stats

    def _owned(self, bucket: Bucket) -> None:
        self._check_open()
        if self._buckets.get(bucket.id) is not bucket:
            raise SpexValueError(f"bucket {bucket.id} is not registered by this client (unregistered?)")

    def _session_known(self, wait: float) -> bool:
        """True when the daemon answers within `wait` seconds (reconnecting if the channel
        dropped) and knows this session; raises DaemonUnavailableError when it does not answer."""
        deadline = time.monotonic() + wait
        while True:
            left = deadline - time.monotonic()
            try:
                resp = self._stub.ListSessions(pb.ListSessionsRequest(), timeout=max(0.05, left),
                                               wait_for_ready=True)
                return any(s.session_id == self.session_id for s in resp.sessions)
            except grpc.RpcError as e:
                code = e.code() if hasattr(e, "code") else None
                transient = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED)
                if code not in transient:
                    raise from_rpc_error(e, "ListSessions", self.socket, self.session_id) from None
                if time.monotonic() + 0.1 >= deadline:
                    raise DaemonUnavailableError(
                        f"spexd at {self.socket} does not answer ({code.name}); was the daemon stopped? Start it "
                        f"(mpirun ... spexd --socket={self.socket}) and restart the training job",
                        code.name) from None
                time.sleep(0.1)  # a broken connection fails at once; the channel reconnects

    def _session_lost(self, doing: str) -> SessionLostError:
        return SessionLostError(
            f"{doing}: spexd at {self.socket} no longer knows this trainer's session {self.session_id}: the "
            f"daemon was restarted under a running trainer. A running job cannot rejoin a new daemon: restart "
            f"every trainer of the job")

    def _probe(self, doing: str) -> None:
        if not self._session_known(wait=max(RECONNECT_WAIT_S, self.probe_interval)):
            raise self._session_lost(doing)

    def _shutdown_error(self, bucket: Bucket, step: int) -> SpexError:
        doing = f"bucket {bucket.id} step {step}"
        try:
            known = self._session_known(wait=RECONNECT_WAIT_S)
        except DaemonUnavailableError:
            known = True  # nobody answers: the daemon is gone, not restarted
        if not known:
            return self._session_lost(doing)
        return DaemonUnavailableError(
            f"spexd at {self.socket} shut down during the exchange of {doing} (doorbell shutdown flag); restart "
            f"the daemons, then the training job")

    # -- control ------------------------------------------------------------------------------

    def stats(self, all_buckets: bool = True) -> "pb.GetStatsResponse":
        """GetStats: per-bucket exchanges, compressor, last exchange (achieved density, bytes,
        phase timings) and mean phase timings."""
        req = pb.GetStatsRequest(session_id=0 if all_buckets else self.session_id)
        return self._rpc("GetStats", req, 10.0)

    def sessions(self) -> List["pb.SessionInfo"]:
        """The trainer sessions the daemon serves."""
        return list(self._rpc("ListSessions", pb.ListSessionsRequest(), 10.0).sessions)

    def set_density(self, density: float) -> int:
        """Changes the target density of every sparse bucket at run time (all nodes switch at the
        same step). Returns the daemon's change counter."""
        if not 0 < density <= 1:
            raise SpexValueError(f"density must be in (0, 1], got {density}")
        return self._rpc("SetDensity", pb.SetDensityRequest(density=float(density)), 10.0).version

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"session {self.session_id}"
        return (f"Client(socket={self.socket!r}, local_rank={self.local_rank}/{self.local_size}, {state})")


def connect(socket: Optional[str] = None, **kwargs: Any) -> Client:
    """Shorthand for Client(socket, **kwargs)."""
    return Client(socket, **kwargs)


__all__ = ["Bucket", "Client", "connect", "BucketOrderError", "MODES"]
