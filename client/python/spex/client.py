"""The Python client of spexd, doing exactly what the C++ client (client/client.h) does.

A trainer connects to its node's daemon (Hello), registers each gradient bucket once (the
daemon returns a shared segment that is mapped here), and per step writes its gradients into
the bucket's input slot and exchanges: through the doorbell in the shared segments (no RPC on
the hot path; see proto/contract/layout.h) or through the Exchange RPC. The output slot then
holds the average over every trainer of every node.

    with spex.Client(socket="/tmp/x/node0.sock", local_rank=0, local_size=2) as c:
        b = c.register_bucket(0, n)           # b.input / b.output are numpy views of shm
        b.input[:] = grads                     # or b.write(tensor); b.input_tensor for torch
        avg = c.exchange(b)                    # numpy view of the output slot

With device="cuda" (a daemon started with --device=cuda) buckets live in the daemon's GPU memory
(CUDA IPC, opened once per bucket): b.input_tensor / b.output_tensor are torch CUDA tensors, and
exchange(b, stream=...) orders the exchange on the stream (default: the current torch stream):
    with spex.Client(sock, device="cuda") as c:
        b = c.register_bucket(0, n)
        b.input_tensor.copy_(grads)            # queued on the current stream
        avg = c.exchange(b)                    # CUDA tensor; work queued after it sees the average
"""

from __future__ import annotations

import mmap
import os
import socket as _socket
import time
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

import grpc
import numpy as np

from . import _native
from . import layout as L
from . import shm
from .cuda import CudaRuntime, CudartRuntime, IpcHandleCache, IpcMapping, stream_handle
from .errors import (
    BucketOrderError,
    DaemonUnavailableError,
    ExchangeTimeoutError,
    OwnInputRefused,
    SessionLostError,
    SpexError,
    SpexTypeError,
    SpexValueError,
    from_rpc_error,
)
from .paths import check_server, client_socket_path
from .proto import spex_pb2 as pb
from .proto import spex_pb2_grpc as pb_grpc

PROTOCOL_VERSION = 1
MODES = ("doorbell", "rpc")
DEVICES = ("cpu", "cuda")
RECONNECT_WAIT_S = 3.0  # how long a liveness probe waits for the daemon to answer again


def _env_int(name: str) -> Optional[int]:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise SpexValueError(f"${name}={value!r} is not an integer") from None


class _DeviceView:
    """Where a device bucket's data is: its opened CUDA IPC buffer and the input/output addresses."""

    __slots__ = ("mapping", "input", "output")

    def __init__(self, mapping: IpcMapping, input_ptr: int, output_ptr: int):
        self.mapping = mapping
        self.input = input_ptr
        self.output = output_ptr


# A bucket's data types (docs/dtypes.md): the numpy view of its slots (bfloat16's bit patterns as
# int16: numpy has no bfloat16; torch.from_numpy takes no uint16) and the proto enum.
_NUMPY_DTYPES = {"float32": np.float32, "bfloat16": np.int16, "float16": np.float16}
_PROTO_DTYPES = {"float32": "DTYPE_FLOAT32", "bfloat16": "DTYPE_BFLOAT16", "float16": "DTYPE_FLOAT16"}
_DTYPE_ALIASES = {"float32": "float32", "fp32": "float32", "float": "float32", "bfloat16": "bfloat16",
                  "bf16": "bfloat16", "float16": "float16", "fp16": "float16", "half": "float16"}


def dtype_name(dtype: Any) -> str:
    """The bucket type for `dtype`: a name ("float32", "bfloat16", "float16", or "fp32", "bf16",
    "fp16"), a torch dtype or a numpy dtype; SpexTypeError naming the accepted ones otherwise."""
    if dtype is None:
        return "float32"
    text = str(dtype).replace("torch.", "")
    if not isinstance(dtype, str):
        try:
            text = np.dtype(dtype).name if not hasattr(dtype, "is_floating_point") else text
        except TypeError:
            pass
    name = _DTYPE_ALIASES.get(text)
    if name is None:
        raise SpexTypeError(f"spex buckets hold float32, bfloat16 or float16; got {dtype!r}: convert the data "
                            f"(e.g. tensor.float()) or register one of those")
    return name


def _own_input_file(t: Any, dt: str, n: int, bucket_id: int) -> Tuple[int, int]:
    """(descriptor, byte offset) of a CPU tensor's memory for RegisterBucketRequest.own_input, after
    moving its storage into shared memory in place (what Tensor.share_memory_() does with the
    file_descriptor strategy: the tensor and every view of its storage follow; a storage already
    there stays)."""
    import torch

    if not isinstance(t, torch.Tensor):
        raise SpexTypeError(f"bucket {bucket_id}: own_input must be a torch tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise SpexTypeError(f"bucket {bucket_id}: own_input must be a CPU tensor (host buckets), got one on "
                            f"{t.device}")
    if t.dtype != getattr(torch, dt):
        raise SpexTypeError(f"bucket {bucket_id} holds {dt}; own_input is {t.dtype}")
    if t.numel() != n or not t.is_contiguous():
        raise SpexValueError(f"bucket {bucket_id}: own_input must be a contiguous tensor of {n} elements, got "
                             f"{t.numel()} (contiguous: {t.is_contiguous()})")
    storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()._storage
    if not t.is_shared():
        # PyTorch sizes the new /dev/shm file without reserving its pages: where /dev/shm cannot
        # hold it (a container's 64 MB default), the copy into it would end this process with a
        # bus error. Refuse instead (the hook then copies into the daemon's slot).
        try:
            st = os.statvfs("/dev/shm")
            free = st.f_bavail * st.f_frsize
        except OSError:
            free = None
        need = storage.nbytes() if hasattr(storage, "nbytes") else storage.size()
        if free is not None and need > free // 2:
            raise OwnInputRefused(f"bucket {bucket_id}: own_input's storage ({need >> 20} MiB) would take more than "
                                  f"half of what /dev/shm has free ({free >> 20} MiB); enlarge /dev/shm (a container's "
                                  f"--shm-size) or register without own_input")
    try:
        fd, _ = storage._share_fd_cpu_()
    except (AttributeError, RuntimeError) as e:
        raise OwnInputRefused(f"bucket {bucket_id}: cannot move own_input's storage into shared memory ({e}); "
                              f"register without own_input") from e
    return int(fd), int(t.storage_offset()) * t.element_size()


def _torch_view(t: Any, dtype: str) -> Any:
    """A torch tensor over the numpy view of a slot, as the bucket's type (bfloat16 from int16 bits)."""
    if dtype == "bfloat16":
        import torch

        return t.view(torch.bfloat16)
    return t


class Bucket:
    """A registered bucket: this trainer's input slot and the node's shared output slot.

    Host buckets (the default) are mapped from the daemon's shm segment: `input` and `output` are
    numpy float32 views (no copies), `input_tensor` and `output_tensor` torch tensors over the same
    memory. Device buckets (a client with device="cuda") live in the daemon's CUDA IPC buffer:
    `input_tensor` and `output_tensor` are torch CUDA tensors on GPU `cuda_device` over it (no
    copies; there are no numpy views). The output holds the average of the last exchange until
    the next one is published; copy what you keep."""

    def __init__(self, client: "Client", bucket_id: int, elements: int, mapping: mmap.mmap,
                 resp: "pb.RegisterBucketResponse", device: Optional[_DeviceView] = None,
                 dtype: str = "float32", own: Any = None):
        self._client = client
        self.id = bucket_id
        self.elements = elements
        # "float32", "bfloat16" or "float16": the type of the input slot and the output
        # (docs/dtypes.md). numpy has no bfloat16: a bfloat16 bucket's numpy views are int16 bit
        # patterns; its input_tensor / output_tensor are torch.bfloat16.
        self.dtype: str = dtype
        self.compressor: str = resp.compressor.name
        self.density: float = resp.compressor.density
        self.next_step: int = resp.next_step
        self._mapping: Optional[mmap.mmap] = mapping
        self._device = device
        self.on_device: bool = device is not None
        self.cuda_device: int = device.mapping.device if device is not None else -1
        self._input_offset = resp.layout.input_offset
        self._output_offset = resp.layout.output_offset
        self._input: Optional[np.ndarray] = None
        self._output: Optional[np.ndarray] = None
        if device is None:
            self._input = np.frombuffer(mapping, dtype=_NUMPY_DTYPES[dtype], count=elements,
                                        offset=resp.layout.input_offset)
            out = np.frombuffer(mapping, dtype=_NUMPY_DTYPES[dtype], count=elements, offset=resp.layout.output_offset)
            out.flags.writeable = False
            self._output = out
        self._input_tensor = None
        self._output_tensor = None
        # Zero-copy input (register_bucket's own_input, taken by the daemon): the input is the
        # caller's tensor, which the daemon reads; nothing is written into the slot.
        self.own_input: bool = own is not None
        if own is not None:
            import torch

            flat = own.detach().reshape(-1)
            self._input_tensor = flat
            self._input = (flat.view(torch.int16) if dtype == "bfloat16" else flat).numpy()
        self.last_rpc_stats: Optional[pb.ExchangeStats] = None
        self.closed = False

    @property
    def input(self) -> np.ndarray:
        """This trainer's input slot as a numpy float32 view of shared memory (host buckets; the
        own_input tensor's memory when the bucket has one)."""
        if self.on_device:
            raise SpexTypeError(f"bucket {self.id} lives in GPU memory (cuda:{self.cuda_device}): it has no numpy "
                                f"view; use input_tensor (a CUDA tensor) or write(tensor)")
        return self._input  # type: ignore[return-value]

    @property
    def output(self) -> np.ndarray:
        """The output slot as a read-only numpy float32 view of shared memory (host buckets)."""
        if self.on_device:
            raise SpexTypeError(f"bucket {self.id} lives in GPU memory (cuda:{self.cuda_device}): it has no numpy "
                                f"view; use output_tensor (a CUDA tensor)")
        return self._output  # type: ignore[return-value]

    @property
    def header(self) -> mmap.mmap:
        """The mapped segment (its first page is the BucketHeader)."""
        if self._mapping is None or self.closed:
            raise SpexError(f"bucket {self.id} was unregistered or its client closed")
        return self._mapping

    def _device_view(self) -> _DeviceView:
        if self._device is None or self.closed:
            raise SpexError(f"bucket {self.id} was unregistered or its client closed")
        return self._device

    @property
    def input_tensor(self):
        """This trainer's input slot as a torch tensor of the bucket's type: over the shared memory of
        `input` (host buckets), or a CUDA tensor over the daemon's device buffer (device buckets)."""
        if self._input_tensor is None:
            if self.on_device:
                dev = self._device_view()
                self._input_tensor = self._client.cuda_runtime.tensor(dev.input, self.elements, self.cuda_device,
                                                                      True, self.dtype)
            else:
                import torch

                self._input_tensor = _torch_view(torch.from_numpy(self.input), self.dtype)
        return self._input_tensor

    @property
    def output_tensor(self):
        """The output slot as a torch tensor of the bucket's type (shares memory, a CUDA tensor for
        device buckets; do not write to it)."""
        if self._output_tensor is None:
            if self.on_device:
                dev = self._device_view()
                self._output_tensor = self._client.cuda_runtime.tensor(dev.output, self.elements, self.cuda_device,
                                                                       False, self.dtype)
            else:
                import torch

                view = np.frombuffer(self.header, dtype=_NUMPY_DTYPES[self.dtype], count=self.elements,
                                     offset=self._output_offset)
                self._output_tensor = _torch_view(torch.from_numpy(view), self.dtype)
        return self._output_tensor

    def write(self, data: Any) -> None:
        """Copies `data` into the input slot: a numpy array or CPU torch tensor of the bucket's type
        for a host bucket, a CUDA tensor of its type for a device bucket (copied on the current stream), with
        exactly `elements` entries, any shape. Other dtypes, sizes or devices raise, never convert."""
        if self.closed:
            raise SpexError(f"bucket {self.id} was unregistered or its client closed")
        if isinstance(data, np.ndarray):
            if self.dtype == "bfloat16":
                raise SpexTypeError(f"bucket {self.id} holds bfloat16, which numpy lacks; got a numpy array of "
                                    f"{data.dtype}: write a torch.bfloat16 tensor")
            if data.dtype != _NUMPY_DTYPES[self.dtype]:
                raise SpexTypeError(f"bucket {self.id} holds {self.dtype}; got a numpy array of {data.dtype}: "
                                    f"convert it with .astype(np.{self.dtype})")
            if self.on_device:
                raise SpexTypeError(f"bucket {self.id} lives in GPU memory (cuda:{self.cuda_device}, a client with "
                                    f"device='cuda'); got a numpy array: write a CUDA tensor "
                                    f"(torch.from_numpy(a).to('cuda:{self.cuda_device}'))")
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
            if data.dtype != getattr(torch, self.dtype):
                raise SpexTypeError(f"bucket {self.id} holds {self.dtype}; got a tensor of {data.dtype}: "
                                    f"convert it with .to(torch.{self.dtype}) (or register the bucket with "
                                    f"dtype={str(data.dtype).replace('torch.', '')!r})")
            problem = tensor_device_problem(data.device, self.on_device, self.cuda_device)
            if problem:
                raise SpexTypeError(f"bucket {self.id}: {problem}")
            if data.numel() != self.elements:
                raise SpexValueError(f"bucket {self.id} was registered with {self.elements} elements; got a "
                                     f"tensor of {data.numel()} (shape {tuple(data.shape)})")
            self.input_tensor.copy_(data.detach().reshape(-1))
            return
        raise SpexTypeError(f"bucket {self.id}: expected a {self.dtype} numpy array or torch tensor, got "
                            f"{type(data).__name__}")

    def _release(self, cache: Optional[IpcHandleCache]) -> None:
        self.closed = True
        self._input_tensor = self._output_tensor = None
        mapping, self._mapping = self._mapping, None
        self._input = self._output = None
        if self._device is not None and cache is not None:
            cache.release(self._device.mapping)  # tensors still viewing it must not be used after this
        if mapping is not None:
            shm.release(mapping)  # stays mapped while outside arrays/tensors still view it

    def __repr__(self) -> str:
        where = f", cuda_device={self.cuda_device}" if self.on_device else ""
        if self.dtype != "float32":
            where += f", dtype={self.dtype!r}"
        return (f"Bucket(id={self.id}, elements={self.elements}, compressor={self.compressor!r}, "
                f"density={self.density}, next_step={self.next_step}{where})")


def tensor_device_problem(device: Any, on_device: bool, cuda_device: int) -> Optional[str]:
    """Why a tensor on `device` cannot go into a bucket (host, or a device bucket on GPU
    `cuda_device`), naming the fix; None when it can."""
    if not on_device and device.type != "cpu":
        return (f"the bucket lives in host memory (this client asked spexd for host buffers); got a tensor on "
                f"{device}: move it with .cpu(), or use spex.Client(device='cuda') with a spexd started with "
                f"--device=cuda")
    if on_device and device.type != "cuda":
        return (f"the bucket lives in GPU memory (cuda:{cuda_device}, a client with device='cuda'); got a tensor on "
                f"{device}: move it with .to('cuda:{cuda_device}'), or use spex.Client(device='cpu') with a spexd "
                f"started with --device=cpu")
    return None


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
        device: "cpu" (host buckets in shm) or "cuda" (device buckets in the daemon's GPU memory;
            the daemon must serve CUDA buffers: spexd --device=cuda). Each side refuses the other.
        cuda_runtime: the CUDA calls for device buckets (default: CudartRuntime, libcudart through
            ctypes); tests pass a fake.
        ipc_cache: an IpcHandleCache to share with other clients of this process (its runtime is
            then used); default: one of this client's own, closed by close().
        trust_server_uids: users besides this one and root whose daemon this client may use (also
            $SPEX_TRUST_SERVER_UIDS); a socket served by anyone else raises SpexSecurityError.
    """

    def __init__(self, socket: Optional[str] = None, *, job: Optional[str] = None,
                 local_rank: Optional[int] = None, local_size: Optional[int] = None,
                 client_name: str = "spex-py", connect_timeout: float = 10.0,
                 exchange_timeout: float = 300.0, probe_interval: float = 1.0, device: str = "cpu",
                 cuda_runtime: Optional[CudaRuntime] = None, ipc_cache: Optional[IpcHandleCache] = None,
                 trust_server_uids: Sequence[int] = ()):
        if device not in DEVICES:
            raise SpexValueError(f"device must be one of {DEVICES}, got {device!r}")
        if device == "cpu" and (cuda_runtime is not None or ipc_cache is not None):
            raise SpexValueError("cuda_runtime and ipc_cache are for device='cuda' clients")
        if ipc_cache is not None and cuda_runtime is not None and ipc_cache.runtime is not cuda_runtime:
            raise SpexValueError("ipc_cache uses another CUDA runtime than cuda_runtime: pass one of them")
        self.device = device
        self._ipc: Optional[IpcHandleCache] = None
        self._own_ipc = ipc_cache is None
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
        self.trust_server_uids = tuple(int(u) for u in trust_server_uids)
        self._check_socket()
        self._channel = grpc.insecure_channel("unix:" + self.socket)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=self.connect_timeout)
        except grpc.FutureTimeoutError:
            self._channel.close()
            raise DaemonUnavailableError(
                f"spexd at {self.socket} does not answer within {self.connect_timeout:g} s: it closes a "
                f"connection at once when --max_connections are open already or when your uid may not "
                f"connect (its log names the refused connection); else it is stuck or gone (restart the "
                f"daemon)") from None
        self._stub = pb_grpc.SpexStub(self._channel)
        req = pb.HelloRequest(job=self.job, local_rank=self.local_rank, local_size=self.local_size,
                              device=pb.DEVICE_CUDA if device == "cuda" else pb.DEVICE_CPU, client=client_name,
                              pid=os.getpid(), protocol_version=PROTOCOL_VERSION)
        try:
            self.hello: pb.HelloResponse = self._stub.Hello(req, timeout=self.connect_timeout)
        except grpc.RpcError as e:
            self._channel.close()
            raise self._device_refusal(from_rpc_error(e, "Hello", self.socket)) from None
        self.session_id: int = self.hello.session_id
        self._finalizer = weakref.finalize(self, _goodbye, self._stub, self._channel, self.session_id)
        if device == "cuda":
            if self.hello.device != pb.DEVICE_CUDA:
                self.close()
                raise SpexError(f"spexd at {self.socket} answered Hello with host buffers although this client asked "
                                f"for CUDA buffers (an older daemon?): start spexd with --device=cuda")
            try:
                self._ipc = ipc_cache or IpcHandleCache(cuda_runtime or CudartRuntime())
            except SpexError:
                self.close()
                raise
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

    def _device_refusal(self, err: SpexError) -> SpexError:
        """Hello refused because this client's device differs from the daemon's: the daemon's
        message, plus what to change on the Python side."""
        text = str(err)
        if err.code != "FAILED_PRECONDITION":
            return err
        if self.device == "cuda" and "serves host" in text:
            return SpexError(
                f"spex.Client(device='cuda'): spexd at {self.socket} serves host (CPU) buffers, so it cannot hand out "
                f"CUDA buffers. Start the node's spexd with --device=cuda (on a node with a usable GPU; with "
                f"--device=auto its log says why it took the CPU path), or use spex.Client(device='cpu') with CPU "
                f"tensors. (Daemon: {text})", err.code)
        if self.device == "cpu" and "serves CUDA" in text:
            return SpexError(
                f"spex.Client(device='cpu'): spexd at {self.socket} serves CUDA buffers (--device=cuda, or auto found "
                f"a GPU): pass device='cuda' to spex.Client (spex.torch.register(..., device='cuda')) and exchange "
                f"CUDA tensors, or start the daemon with --device=cpu. (Daemon: {text})", err.code)
        return err

    @property
    def cuda_runtime(self) -> CudaRuntime:
        """The CUDA runtime of a device='cuda' client."""
        if self._ipc is None:
            raise SpexError(f"this client asked spexd for host buffers (device={self.device!r}); it has no CUDA "
                            f"runtime")
        return self._ipc.runtime

    @property
    def ipc_cache(self) -> Optional[IpcHandleCache]:
        """The opened CUDA IPC buffers of a device='cuda' client (None for host clients)."""
        return self._ipc

    def _check_socket(self) -> None:
        if not os.path.exists(self.socket):
            raise DaemonUnavailableError(
                f"no spexd socket at {self.socket}: start the job with spexrun, which starts a daemon per "
                f"host and sets SPEX_SOCKET (spexrun -H host1:N,host2:N -- python3 train.py), or start the "
                f"node's daemon by hand first (mpirun -np NODES spexd --socket={self.socket} "
                f"--local_trainers={self.local_size}), or point SPEX_SOCKET at its socket")
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
            probe.close()
            raise DaemonUnavailableError(f"cannot connect to spexd at {self.socket}: {e.strerror or e}") from None
        try:
            # Gradients go only to a daemon of this user (or root, or trust_server_uids) behind a
            # directory nobody else can change, so the socket cannot be swapped after this check.
            check_server(self.socket, probe, self.trust_server_uids)
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
            b._release(self._ipc)
        self._buckets.clear()
        if self._ipc is not None and self._own_ipc:
            self._ipc.close()
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
                        density: Optional[float] = None, params: Optional[Dict[str, str]] = None,
                        dtype: Any = "float32", cuda_device: Optional[int] = None,
                        own_input: Any = None) -> Bucket:
        """Registers bucket `bucket_id` of `elements` values of `dtype` ("float32", "bfloat16",
        "float16", or a torch/numpy dtype; docs/dtypes.md) and maps its segment. A half bucket is
        summed and compressed in float32 by the daemon and its result rounded once to its type;
        params={"wire_values": "float32"} sends its values as float32.

        Every trainer of the job registers the same ids with the same sizes; within a step the
        daemon exchanges buckets in ascending id order, so number them in the order they become
        ready. `compressor`/`density` override the daemon's defaults for this bucket (e.g.
        "dense", "micro", "topk"; density in (0, 1]); `params` are compressor parameters.
        A device='cuda' client opens the bucket's CUDA IPC buffer here, once (see IpcHandleCache).
        `cuda_device` (device='cuda' only): the GPU ordinal the trainer's tensors live on, sent as
        RegisterBucketRequest.device_ordinal so a spexd serving several GPUs (--devices) places this
        trainer's input and output there (docs/design.md#multi-gpu); None: the daemon's home GPU.
        `own_input` (host buckets; zero-copy input): a contiguous CPU torch tensor of `elements`
        values of `dtype` that holds this trainer's input from now on instead of the input slot.
        Its storage moves into shared memory in place (as Tensor.share_memory_(); views follow)
        and the daemon maps it read-only and reads it at each exchange, so nothing is copied into
        the slot; `input` / `input_tensor` are views of it. Keep the storage alive and its size
        unchanged while the bucket is registered, and write it only between exchanges (after the
        result of the last one). `bucket.own_input` says whether the daemon took it (an older spexd
        ignores the field and the slot is used). OwnInputRefused: the storage cannot go into shared
        memory, or the daemon cannot take it; nothing is registered then.
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
        dt = dtype_name(dtype)
        cfg = pb.CompressorConfig(name=compressor or "", density=float(density or 0.0), params=params or {})
        req = pb.RegisterBucketRequest(session_id=self.session_id, bucket_id=int(bucket_id),
                                       elements=int(elements), dtype=getattr(pb, _PROTO_DTYPES[dt]), compressor=cfg)
        if cuda_device is not None:
            if self._ipc is None:
                raise SpexValueError(f"bucket {bucket_id}: cuda_device={cuda_device!r} is for device='cuda' clients; "
                                     f"this one asked spexd for host buffers")
            if not isinstance(cuda_device, (int, np.integer)) or isinstance(cuda_device, bool) or cuda_device < 0:
                raise SpexValueError(f"bucket {bucket_id}: cuda_device must be a GPU ordinal >= 0, got {cuda_device!r}")
            req.device_ordinal = int(cuda_device)
        if own_input is not None:
            if self._ipc is not None:
                raise SpexValueError(f"bucket {bucket_id}: own_input is for host buckets; this client asked spexd for "
                                     f"CUDA buffers (device='cuda')")
            fd, offset = _own_input_file(own_input, dt, int(elements), int(bucket_id))
            req.own_input.fd = fd
            req.own_input.offset = offset
        try:
            resp = self._rpc("RegisterBucket", req, self.connect_timeout)
        except SpexError as e:
            if own_input is not None and "own_input" in str(e):
                raise OwnInputRefused(str(e), e.code) from e
            raise
        eb = L.DTYPE_BYTES[dt]
        seg, lay = resp.buffer.shm, resp.layout
        n = int(elements)
        want_device = self._ipc is not None
        if resp.HasField("device_buffer") != want_device:
            self._unregister_quietly(int(bucket_id))
            raise SpexError(
                f"RegisterBucket (bucket {bucket_id}): this client asked for CUDA buffers (device='cuda') but spexd "
                f"described a host buffer; start spexd with --device=cuda" if want_device else
                f"RegisterBucket (bucket {bucket_id}): spexd described a CUDA buffer to a client that asked for host "
                f"buffers; use spex.Client(device='cuda')", "FAILED_PRECONDITION")
        # A device bucket's shm segment is its header page alone; a host bucket's holds the data too.
        host_fits = (seg.size >= L.PAGE_BYTES if want_device else
                     lay.input_offset + eb * n <= seg.size and lay.output_offset + eb * n <= seg.size)
        if not resp.buffer.HasField("shm") or lay.elements != n or lay.header_offset != 0 or not host_fits:
            raise SpexError(f"RegisterBucket: the daemon described a layout that does not fit its buffer "
                            f"(bucket {bucket_id})")
        mapping = shm.attach(seg.name, seg.size)
        ok = (_native.load32(mapping, L.BUCKET_MAGIC_OFFSET) == L.BUCKET_MAGIC
              and _native.load32(mapping, L.BUCKET_VERSION_OFFSET) == L.LAYOUT_VERSION
              and _native.load64(mapping, L.BUCKET_ELEMENTS_OFFSET) == n
              and _native.load32(mapping, L.BUCKET_SLOTS_OFFSET) == self.local_size)
        code = _native.load32(mapping, L.BUCKET_DTYPE_OFFSET) if ok else 0
        if ok and code != L.DTYPE_CODES[dt]:
            shm.release(mapping)
            self._unregister_quietly(int(bucket_id))
            raise SpexError(f"bucket {bucket_id}: the daemon's segment holds data type code {code}, not {dt}'s "
                            f"{L.DTYPE_CODES[dt]}: client and daemon versions differ (an older spexd serves float32 "
                            f"only: upgrade it)")
        if not ok:
            shm.release(mapping)
            raise SpexError("bucket segment has an unexpected layout: client and daemon versions differ")
        device = None
        if want_device:
            try:
                device = self._attach_device(int(bucket_id), n, resp, eb)
            except SpexError:
                shm.release(mapping)
                self._unregister_quietly(int(bucket_id))
                raise
        bucket = Bucket(self, int(bucket_id), n, mapping, resp, device, dt,
                        own_input if own_input is not None and resp.own_input else None)
        _native.store32(mapping, L.bucket_attached_offset(self.local_rank), 1)
        self._buckets[bucket.id] = bucket
        return bucket

    def _attach_device(self, bucket_id: int, n: int, resp: "pb.RegisterBucketResponse", eb: int = 4) -> _DeviceView:
        """Opens (or reuses) the reply's CUDA IPC buffer and locates this trainer's input and the
        output in it, checking that both fit and that there is one event per trainer plus the output."""
        assert self._ipc is not None
        try:
            m = self._ipc.attach(resp.device_buffer)
        except SpexError as e:
            raise type(e)(f"bucket {bucket_id}: {e}", e.code) from None
        dl = resp.device_layout
        problem = None
        if dl.elements != n or dl.input_offset + eb * n > m.size or dl.output_offset + eb * n > m.size:
            problem = (f"RegisterBucket: the daemon described a device layout that does not fit its buffer "
                       f"(bucket {bucket_id}: {n} elements, input at {dl.input_offset}, output at {dl.output_offset}, "
                       f"{m.size} bytes)")
        elif len(m.events) != self.local_size + 1:
            problem = (f"RegisterBucket: the CUDA buffer of bucket {bucket_id} has {len(m.events)} IPC events; "
                       f"expected one per local trainer plus the output ({self.local_size + 1})")
        if problem:
            self._ipc.release(m)
            raise SpexError(problem)
        return _DeviceView(m, m.base + dl.input_offset, m.base + dl.output_offset)

    def _unregister_quietly(self, bucket_id: int) -> None:
        """Withdraws a registration this client could not use (the error that follows matters more)."""
        try:
            self._rpc("UnregisterBucket", pb.UnregisterBucketRequest(session_id=self.session_id, bucket_id=bucket_id),
                      self.connect_timeout)
        except SpexError:
            pass

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
        bucket._release(self._ipc)

    @property
    def buckets(self) -> List[Bucket]:
        """The buckets this client registered, by id."""
        return [self._buckets[k] for k in sorted(self._buckets)]

    # -- exchange -----------------------------------------------------------------------------

    def exchange(self, bucket: Bucket, data: Any = None, mode: str = "doorbell", stream: Any = None) -> Any:
        """One exchange of the bucket's next step. Writes `data` into the input slot first when
        given (see Bucket.write). Returns the output slot holding the average of every trainer of
        every node: a read-only numpy view (host buckets) or the output CUDA tensor (device
        buckets). `mode` is "doorbell" (shared memory, no RPC on the hot path) or "rpc" (the
        Exchange RPC). Device buckets: the exchange follows the work queued on `stream` (None: the
        current torch stream of the bucket's GPU) and work queued there after it returns sees the
        average (record_input before, wait_output after)."""
        if mode not in MODES:
            raise SpexValueError(f"mode must be one of {MODES}, got {mode!r}")
        if data is not None:
            bucket.write(data)
        if mode == "rpc":
            step = bucket.next_step
            self.record_input(bucket, stream)
            try:
                self.exchange_rpc(bucket, step)
            except SpexError:
                # A published step is consumed even when it failed (a non-finite step under
                # nonfinite=error goes on with the next one); one never published (a timeout, a
                # shutdown) is retried as the same step.
                if _native.load32(bucket.header, L.BUCKET_PUBLISHED_OFFSET) == (step + 1) & 0xFFFFFFFF:
                    bucket.next_step = step + 1
                raise
            bucket.next_step = step + 1
            self.wait_output(bucket, stream)
        else:
            step = self.submit(bucket, stream)
            self.wait(bucket, step, stream)
        return bucket.output_tensor if bucket.on_device else bucket.output

    def _stream(self, stream: Any, device: int) -> int:
        handle = stream_handle(stream)
        return self.cuda_runtime.current_stream(device) if handle is None else handle

    def record_input(self, bucket: Bucket, stream: Any = None) -> None:
        """Device buckets: records this trainer's input event (IPC event local_rank) on `stream`
        (None: the current torch stream of the bucket's GPU), so the daemon reads the input slot
        only after the work queued there so far (the copy of the gradients). submit() and
        exchange() call it; call it yourself before exchange_rpc. Nothing for host buckets."""
        self._owned(bucket)
        if bucket.on_device:
            dev = bucket._device_view()
            assert self._ipc is not None
            self._ipc.record(dev.mapping, self.local_rank, self._stream(stream, bucket.cuda_device))

    def wait_output(self, bucket: Bucket, stream: Any = None) -> None:
        """Device buckets, after the result is published: makes `stream` (None: the current torch
        stream of the bucket's GPU) wait for the output's IPC event (index local_size), which the
        daemon recorded after writing the result; work queued there later sees the average.
        wait() and exchange() call it; call it yourself after exchange_rpc. Nothing for host buckets."""
        self._owned(bucket)
        if bucket.on_device:
            dev = bucket._device_view()
            assert self._ipc is not None
            self._ipc.wait(dev.mapping, self.local_size, self._stream(stream, bucket.cuda_device))

    def submit(self, bucket: Bucket, stream: Any = None) -> int:
        """Doorbell path, first half: marks this trainer's input of the bucket's next step as
        written (ready[r] = step + 1) and rings the node's doorbell. Returns the step; call
        wait(bucket, step) for the result. The input must not change until wait returns. Device
        buckets: records the input event on `stream` first (see record_input)."""
        self._owned(bucket)
        bell = self._bell
        assert bell is not None
        if _native.load32(bell, L.DOORBELL_SHUTDOWN_OFFSET):
            raise self._shutdown_error(bucket, bucket.next_step)
        step = bucket.next_step
        self.record_input(bucket, stream)
        # The ready stamp first (CLOCK_MONOTONIC, as the daemon's clock): the mergers' timings.
        _native.store64(bucket.header, L.ready_ns_offset(self.local_rank), time.monotonic_ns())
        _native.store64(bucket.header, L.ready_offset(self.local_rank), step + 1)
        _native.ring(bell, L.DOORBELL_RING_OFFSET, L.DOORBELL_ENGINE_SLEEPING_OFFSET)
        return step

    def wait(self, bucket: Bucket, step: int, stream: Any = None) -> None:
        """Doorbell path, second half: waits until the daemon published `step` of the bucket
        (spinning for the daemon's spin_us, then sleeping on a futex), then checks its status;
        on an error fetches the daemon's message through the Exchange RPC and raises it. Device
        buckets: then makes `stream` wait for the output (see wait_output)."""
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
            bucket.next_step = step + 1  # published, with an error: the next exchange is the next step
            self.exchange_rpc(bucket, step)  # raises the daemon's message for this step
            raise SpexError(f"bucket {bucket.id} step {step}: the daemon published error status {status} but "
                            f"the Exchange RPC reported success")
        bucket.next_step = step + 1
        self.wait_output(bucket, stream)

    def exchange_rpc(self, bucket: Bucket, step: int) -> "pb.ExchangeStats":
        """The Exchange RPC for (bucket, step): marks the input written if it is not yet and
        blocks until the result is published; returns that exchange's stats. Device buckets: no
        stream ordering here (call record_input before and wait_output after, or use
        exchange(mode="rpc"))."""
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

    # -- checkpointing (docs/checkpoint.md) -----------------------------------------------------

    STATE_CHUNK_BYTES = 1 << 19  # the daemon's chunk size for checkpoint records (its messages are < 1 MiB)

    def save_bucket_state(self, bucket: Bucket, timeout: float = 600.0) -> bytes:
        """This node's state of the bucket (residual, compressor state, density, step) as an
        opaque record, streamed from the daemon. Between steps only: after every result this
        trainer asked for, before handing in the next step."""
        self._check_open()
        if self._buckets.get(bucket.id) is not bucket:
            raise SpexValueError(f"bucket {bucket.id} is not registered by this client")
        req = pb.SaveBucketStateRequest(session_id=self.session_id, bucket_id=bucket.id)
        parts, total = [], 0
        try:
            for chunk in self._stub.SaveBucketState(req, timeout=timeout):
                parts.append(chunk.data)
                total = chunk.total_bytes
        except grpc.RpcError as e:
            raise from_rpc_error(e, "SaveBucketState", self.socket, self.session_id) from None
        record = b"".join(parts)
        if len(record) != total:
            raise SpexError(f"SaveBucketState(bucket {bucket.id}): {len(record)} of {total} bytes came")
        return record

    def load_bucket_state(self, bucket: Bucket, record: bytes, timeout: float = 600.0, *,
                          resize: bool = False) -> None:
        """Gives a record save_bucket_state returned (this node, an earlier run of the same
        world) back to the registered bucket before its first exchange. Refusals name what
        differs (world, size, compressor, policy; a corrupt record) and change nothing.

        resize=True: the record is of another world (other nodes or trainers per node); load
        every old node's record of the bucket, on one trainer of every node. The daemon adds
        each residual, scaled by the ratio of the worlds' trainers, at the elements this node
        takes (i mod nodes == node rank), and the compressor starts afresh
        (docs/checkpoint.md#another-world)."""
        self._check_open()
        if self._buckets.get(bucket.id) is not bucket:
            raise SpexValueError(f"bucket {bucket.id} is not registered by this client")
        if not isinstance(record, (bytes, bytearray, memoryview)):
            raise SpexTypeError(f"a bucket state record is bytes, got {type(record).__name__}")
        record = bytes(record)
        step = self.STATE_CHUNK_BYTES

        def chunks():
            for at in range(0, max(len(record), 1), step):
                yield pb.BucketStateChunk(session_id=self.session_id, bucket_id=bucket.id,
                                          total_bytes=len(record), data=record[at:at + step],
                                          resize=bool(resize))

        try:
            self._stub.LoadBucketState(chunks(), timeout=timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e, "LoadBucketState", self.socket, self.session_id) from None

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
        return (f"Client(socket={self.socket!r}, local_rank={self.local_rank}/{self.local_size}, "
                f"device={self.device!r}, {state})")


def connect(socket: Optional[str] = None, **kwargs: Any) -> Client:
    """Shorthand for Client(socket, **kwargs)."""
    return Client(socket, **kwargs)


__all__ = ["Bucket", "Client", "connect", "BucketOrderError", "DEVICES", "MODES", "tensor_device_problem"]
