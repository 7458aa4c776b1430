"""A fake GPU for testing the Python client's device buckets where no GPU exists (torch here is a
CPU-only build): device memory is host memory, IPC handles are tokens, streams are ints.

- FakeGpu: allocations with fake CUDA IPC handles, their event record counts, and one ordered
  log that the fake runtime and the fake daemon both append to.
- FakeCudaRuntime: spex.cuda.CudaRuntime over a FakeGpu. It "opens" handles of the same process,
  counts opens and closes, and hands out tensors that report device cuda:N (a torch.Tensor
  subclass over the host memory), so the client's device checks run as they would on a GPU.
  record_event / wait_event log what the bucket's header said at that moment (ready[r] or
  published), which is how the tests check the order of events and doorbell.
- FakeCudaDaemon: a gRPC server speaking spex.v1 on a unix socket like spexd --device=cuda with one
  node: host shm doorbell and bucket headers, bucket data in FakeGpu memory with L + 1 events, an
  engine thread averaging the inputs once every trainer is ready (checking that each input event
  was recorded first), and the Exchange RPC.
"""

import mmap
import os
import struct
import tempfile
import threading
import time
from concurrent import futures
from typing import Any, Callable, Dict, List, Optional, Tuple

import grpc
import numpy as np
import torch

from spex import _native
from spex import layout as L
from spex.cuda import IPC_HANDLE_BYTES, CudaRuntime
from spex.errors import CudaRuntimeError
from spex.proto import spex_pb2 as pb
from spex.proto import spex_pb2_grpc as pb_grpc


class FakeCudaTensor(torch.Tensor):
    """A CPU tensor that says it lives on a GPU (subclasses per ordinal: see fake_cuda_type)."""

    ordinal = 0

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", type(self).ordinal)


_TYPES: Dict[int, type] = {}


def fake_cuda_type(ordinal: int) -> type:
    """The FakeCudaTensor subclass reporting cuda:<ordinal> (results of ops keep the type)."""
    if ordinal not in _TYPES:
        _TYPES[ordinal] = type(f"FakeCuda{ordinal}Tensor", (FakeCudaTensor,), {"ordinal": ordinal})
    return _TYPES[ordinal]


def fake_cuda_tensor(array: np.ndarray, ordinal: int) -> torch.Tensor:
    """A tensor over `array`'s memory that reports device cuda:<ordinal>."""
    return torch.from_numpy(array).as_subclass(fake_cuda_type(ordinal))


class Allocation:
    """Fake device memory of one bucket: bytes, IPC handles, records per event, and the bucket's
    host header (set by the daemon) so that the runtime can log what it said."""

    def __init__(self, ident: int, device: int, nbytes: int, events: int):
        self.id = ident
        self.device = device
        self.nbytes = nbytes
        self.memory = np.zeros(nbytes, dtype=np.uint8)
        self.base = self.memory.ctypes.data
        self.memory_handle = b"FAKEMEM!" + struct.pack("<Q", ident) + os.urandom(IPC_HANDLE_BYTES - 16)
        self.event_handles = [b"FAKEEVT!" + struct.pack("<QQ", ident, e) + bytes(IPC_HANDLE_BYTES - 24)
                              for e in range(events)]
        self.records = [0] * events
        self.header: Optional[mmap.mmap] = None
        self.slots = events - 1
        self.bucket_id = -1

    def floats(self, offset: int, elements: int) -> np.ndarray:
        return self.memory[offset:offset + 4 * elements].view(np.float32)

    def halves(self, offset: int, elements: int) -> np.ndarray:
        """A bfloat16/float16 bucket's bit patterns (uint16)."""
        return self.memory[offset:offset + 2 * elements].view(np.uint16)


# The bucket types a fake buffer is viewed as: bytes per element, and the header's dtype code.
_ELEM_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _widen(bits: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (bits.astype(np.uint32) << 16).view(np.float32)
    return bits.view(np.float16).astype(np.float32)


def _narrow(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 -> the half type's bits, round to nearest even (finite values: the fake's inputs)."""
    if dtype == "bfloat16":
        u = values.astype(np.float32).view(np.uint32).astype(np.uint64)
        return ((u + 0x7fff + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return values.astype(np.float16).view(np.uint16)


class FakeGpu:
    """Allocations by handle and the shared ordered log of (kind, bucket id, event, stream,
    observed) tuples: ("record" | "wait", ...) from runtimes, ("publish", bucket, step, ...) from
    the daemon."""

    def __init__(self, ordinal: int = 0):
        self.ordinal = ordinal
        self.lock = threading.Lock()
        self.allocations: List[Allocation] = []
        self.log: List[Tuple[Any, ...]] = []

    def allocate(self, nbytes: int, events: int) -> Allocation:
        with self.lock:
            a = Allocation(len(self.allocations) + 1, self.ordinal, nbytes, events)
            self.allocations.append(a)
            return a

    def by_memory_handle(self, handle: bytes) -> Optional[Allocation]:
        with self.lock:
            return next((a for a in self.allocations if a.memory_handle == handle), None)

    def by_event_handle(self, handle: bytes) -> Optional[Tuple[Allocation, int]]:
        with self.lock:
            for a in self.allocations:
                if handle in a.event_handles:
                    return a, a.event_handles.index(handle)
        return None

    def append(self, entry: Tuple[Any, ...]) -> None:
        with self.lock:
            self.log.append(entry)

    def entries(self, kind: Optional[str] = None) -> List[Tuple[Any, ...]]:
        with self.lock:
            return [e for e in self.log if kind is None or e[0] == kind]


class FakeCudaRuntime(CudaRuntime):
    """spex.cuda.CudaRuntime over a FakeGpu. `fail_event_open` (an int n) makes the n-th event open
    fail, as cudaIpcOpenEventHandle can."""

    def __init__(self, gpu: FakeGpu):
        self.gpu = gpu
        self.memory_opens = self.memory_closes = self.event_opens = self.event_closes = 0
        self.fail_event_open: Optional[int] = None
        self._open: Dict[int, int] = {}  # base -> open count
        self._events: Dict[int, Tuple[Allocation, int]] = {}
        self._next_event = 0x7000
        self._local = threading.local()
        self._lock = threading.Lock()

    def set_stream(self, stream: int) -> None:
        """The calling thread's "current torch stream"."""
        self._local.stream = stream

    def open_memory(self, handle: bytes, device: int) -> int:
        a = self.gpu.by_memory_handle(handle)
        if a is None:
            raise CudaRuntimeError("cudaIpcOpenMemHandle: fake: not a handle of this fake GPU (cudaErrorInvalidValue)")
        if a.device != device:
            raise CudaRuntimeError(f"cudaIpcOpenMemHandle: fake: memory of GPU {a.device} opened on {device}")
        with self._lock:
            self.memory_opens += 1
            self._open[a.base] = self._open.get(a.base, 0) + 1
        return a.base

    def close_memory(self, base: int, device: int) -> None:
        with self._lock:
            self.memory_closes += 1
            self._open[base] -= 1
            if not self._open[base]:
                del self._open[base]

    def open_event(self, handle: bytes, device: int) -> int:
        found = self.gpu.by_event_handle(handle)
        with self._lock:
            self.event_opens += 1
            if self.fail_event_open is not None and self.event_opens == self.fail_event_open:
                raise CudaRuntimeError("cudaIpcOpenEventHandle: fake failure (cudaErrorInvalidResourceHandle)")
            if found is None:
                raise CudaRuntimeError("cudaIpcOpenEventHandle: fake: not an event of this fake GPU")
            self._next_event += 16
            self._events[self._next_event] = found
            return self._next_event

    def close_event(self, event: int, device: int) -> None:
        with self._lock:
            self.event_closes += 1
            del self._events[event]

    def _event(self, event: int, device: int) -> Tuple[Allocation, int]:
        with self._lock:
            found = self._events.get(event)
        if found is None:
            raise CudaRuntimeError(f"fake: event {event:#x} is not open (cudaErrorInvalidResourceHandle)")
        if found[0].device != device:
            raise CudaRuntimeError(f"fake: event of GPU {found[0].device} used on {device}")
        return found

    @staticmethod
    def _observed(a: Allocation, index: int) -> int:
        """ready[index] for an input event, published for the output event."""
        if a.header is None:
            return -1
        if index < a.slots:
            return _native.load64(a.header, L.ready_offset(index))
        return _native.load32(a.header, L.BUCKET_PUBLISHED_OFFSET)

    def record_event(self, event: int, stream: int, device: int) -> None:
        a, index = self._event(event, device)
        with self._lock:
            a.records[index] += 1
        self.gpu.append(("record", a.bucket_id, index, stream, self._observed(a, index)))

    def wait_event(self, event: int, stream: int, device: int) -> None:
        a, index = self._event(event, device)
        self.gpu.append(("wait", a.bucket_id, index, stream, self._observed(a, index)))

    def tensor(self, pointer: int, elements: int, device: int, writable: bool,
               dtype: str = "float32") -> torch.Tensor:
        with self._lock:
            opened = list(self._open)
        eb = _ELEM_BYTES[dtype]
        for a in self.gpu.allocations:
            if a.base in opened and a.base <= pointer and pointer + eb * elements <= a.base + a.nbytes:
                if a.device != device:
                    raise AssertionError(f"fake GPU: memory of GPU {a.device} viewed as cuda:{device}")
                if dtype == "float32":
                    return fake_cuda_tensor(a.floats(pointer - a.base, elements), device)
                bits = a.halves(pointer - a.base, elements)
                t = torch.from_numpy(bits.view(np.int16)).view(getattr(torch, dtype))
                return t.as_subclass(fake_cuda_type(device))
        raise AssertionError(f"fake GPU: no open IPC buffer holds {elements} {dtype} values at {pointer:#x}")

    def current_stream(self, device: int) -> int:
        return getattr(self._local, "stream", 0)

    def future_devices(self, device: int) -> Optional[List[Any]]:
        return None  # torch here has no CUDA: the futures are plain ones


def _create_shm(name: str, size: int) -> mmap.mmap:
    fd = os.open("/dev/shm" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


class _FakeBucket:
    def __init__(self, bucket_id: int, elements: int, header_name: str, header: mmap.mmap, alloc: Allocation):
        self.id = bucket_id
        self.elements = elements
        self.header_name = header_name
        self.header = header
        self.alloc = alloc
        self.sessions: set = set()
        self.errors: Dict[int, str] = {}
        self.dtype = "float32"


class FakeCudaDaemon(pb_grpc.SpexServicer):
    """spex.v1 as spexd --device=cuda serves it on one node with `trainers` local trainers, data in
    `gpu`'s memory. `serve_cuda=False` answers like a CPU daemon's Hello refusal; `mutate(resp)`
    may change every RegisterBucket reply (for refusal tests). `hellos` and `unregistered`
    record what trainers asked."""

    def __init__(self, gpu: FakeGpu, trainers: int = 2, serve_cuda: bool = True,
                 mutate: Optional[Callable[[Any], None]] = None):
        self.gpu = gpu
        self.trainers = trainers
        self.serve_cuda = serve_cuda
        self.mutate = mutate
        self.hellos: List[Any] = []
        self.unregistered: List[int] = []
        self._dir = tempfile.mkdtemp(prefix="spex-fake-cuda-")
        self.socket = os.path.join(self._dir, "fake.sock")
        self._prefix = f"/spex-fakecuda-{os.getpid()}-{os.urandom(6).hex()}"
        self._lock = threading.Lock()
        self._sessions: Dict[int, int] = {}  # session id -> local rank
        self._next_session = 1
        self._buckets: Dict[int, _FakeBucket] = {}
        self._shm_names: List[str] = []
        self._stop = threading.Event()
        self.bell = _create_shm(self._prefix + "-bell", L.PAGE_BYTES)
        self._shm_names.append(self._prefix + "-bell")
        _native.store32(self.bell, L.DOORBELL_MAGIC_OFFSET, L.DOORBELL_MAGIC)
        _native.store32(self.bell, L.DOORBELL_VERSION_OFFSET, L.LAYOUT_VERSION)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        pb_grpc.add_SpexServicer_to_server(self, self._server)
        self._server.add_insecure_port("unix:" + self.socket)
        self._engine = threading.Thread(target=self._run_engine, name="fake-cuda-engine", daemon=True)

    def start(self) -> "FakeCudaDaemon":
        self._server.start()
        self._engine.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._server.stop(0).wait(5)
        self._engine.join(5)
        for name in self._shm_names:
            try:
                os.unlink("/dev/shm" + name)
            except FileNotFoundError:
                pass
        try:
            os.unlink(self.socket)
        except FileNotFoundError:
            pass
        os.rmdir(self._dir)

    def __enter__(self) -> "FakeCudaDaemon":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def bucket_allocation(self, bucket_id: int) -> Allocation:
        with self._lock:
            return self._buckets[bucket_id].alloc

    # -- spex.v1 ----------------------------------------------------------------------------

    def Hello(self, req: Any, ctx: grpc.ServicerContext) -> Any:
        self.hellos.append(req)
        if self.serve_cuda and req.device != pb.DEVICE_CUDA:
            ctx.abort(grpc.StatusCode.FAILED_PRECONDITION,
                      "this spexd serves CUDA buffers (fake); a trainer asking for host buffers needs a daemon "
                      "started with --device=cpu, or must ask for DEVICE_CUDA")
        if not self.serve_cuda and req.device == pb.DEVICE_CUDA:
            ctx.abort(grpc.StatusCode.FAILED_PRECONDITION,
                      "this spexd serves host (CPU) buffers; CUDA buffers need a daemon started with --device=cuda")
        if req.local_size != self.trainers:
            ctx.abort(grpc.StatusCode.FAILED_PRECONDITION, f"local_size {req.local_size} != {self.trainers}")
        with self._lock:
            sid = self._next_session
            self._next_session += 1
            self._sessions[sid] = req.local_rank
        return pb.HelloResponse(
            session_id=sid, node_rank=0, node_count=1, local_trainers=self.trainers, spin_us=0,
            doorbell=pb.BufferDescriptor(shm=pb.ShmDescriptor(name=self._prefix + "-bell", size=L.PAGE_BYTES)),
            daemon_version="fake-cuda", device=pb.DEVICE_CUDA if self.serve_cuda else pb.DEVICE_CPU)

    def _rank(self, session_id: int, ctx: grpc.ServicerContext) -> int:
        with self._lock:
            rank = self._sessions.get(session_id)
        if rank is None:
            ctx.abort(grpc.StatusCode.NOT_FOUND, f"no session {session_id}")
        return rank

    def RegisterBucket(self, req: Any, ctx: grpc.ServicerContext) -> Any:
        rank = self._rank(req.session_id, ctx)
        n = req.elements
        dtype = {pb.DTYPE_BFLOAT16: "bfloat16", pb.DTYPE_FLOAT16: "float16"}.get(req.dtype, "float32")
        eb = _ELEM_BYTES[dtype]
        if n == 0:
            ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bucket {req.bucket_id}: elements must be > 0")
        with self._lock:
            b = self._buckets.get(req.bucket_id)
            if b is None:
                name = f"{self._prefix}-b{req.bucket_id}-{len(self._shm_names)}"
                header = _create_shm(name, L.PAGE_BYTES)
                self._shm_names.append(name)
                for off, value in ((L.BUCKET_MAGIC_OFFSET, L.BUCKET_MAGIC), (L.BUCKET_VERSION_OFFSET, L.LAYOUT_VERSION),
                                   (L.BUCKET_SLOTS_OFFSET, self.trainers)):
                    _native.store32(header, off, value)
                _native.store64(header, L.BUCKET_ID_OFFSET, req.bucket_id)
                _native.store64(header, L.BUCKET_ELEMENTS_OFFSET, n)
                _native.store64(header, L.BUCKET_SLOT_STRIDE_OFFSET, L.slot_stride(n, eb))
                _native.store32(header, L.BUCKET_DTYPE_OFFSET, L.DTYPE_CODES[dtype])
                alloc = self.gpu.allocate(L.device_bucket_bytes(n, self.trainers, eb), self.trainers + 1)
                alloc.header, alloc.bucket_id = header, req.bucket_id
                b = self._buckets[req.bucket_id] = _FakeBucket(req.bucket_id, n, name, header, alloc)
                b.dtype = dtype
            elif b.elements != n:
                ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bucket {req.bucket_id} has {b.elements} elements")
            elif b.dtype != dtype:
                ctx.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"bucket {req.bucket_id} is registered as {b.dtype}; this request says {dtype}")
            b.sessions.add(req.session_id)
            a = b.alloc
        resp = pb.RegisterBucketResponse(
            buffer=pb.BufferDescriptor(shm=pb.ShmDescriptor(name=b.header_name, size=L.PAGE_BYTES)),
            layout=pb.BucketLayout(header_offset=0, elements=n),
            compressor=pb.CompressorConfig(name="dense", density=1.0),
            next_step=_native.load32(b.header, L.BUCKET_PUBLISHED_OFFSET),
            device_buffer=pb.BufferDescriptor(cuda_ipc=pb.CudaIpcDescriptor(
                mem_handle=a.memory_handle, event_handles=a.event_handles, size=a.nbytes, device_ordinal=a.device)),
            device_layout=pb.BucketLayout(input_offset=L.device_input_offset(n, rank, eb),
                                          output_offset=L.device_output_offset(n, self.trainers, eb), elements=n))
        if self.mutate is not None:
            self.mutate(resp)
        return resp

    def UnregisterBucket(self, req: Any, ctx: grpc.ServicerContext) -> Any:
        self._rank(req.session_id, ctx)
        with self._lock:
            b = self._buckets.get(req.bucket_id)
            if b is None or req.session_id not in b.sessions:
                ctx.abort(grpc.StatusCode.NOT_FOUND, f"bucket {req.bucket_id} is not registered by this session")
            b.sessions.discard(req.session_id)
            if not b.sessions:
                del self._buckets[req.bucket_id]
        self.unregistered.append(req.bucket_id)
        return pb.UnregisterBucketResponse()

    def Exchange(self, req: Any, ctx: grpc.ServicerContext) -> Any:
        rank = self._rank(req.session_id, ctx)
        with self._lock:
            b = self._buckets.get(req.bucket_id)
        if b is None:
            ctx.abort(grpc.StatusCode.NOT_FOUND, f"no bucket {req.bucket_id}")
        if _native.load64(b.header, L.ready_offset(rank)) < req.step + 1:
            _native.store64(b.header, L.ready_offset(rank), req.step + 1)
        deadline = time.monotonic() + 30
        while _native.load32(b.header, L.BUCKET_PUBLISHED_OFFSET) < req.step + 1:
            if time.monotonic() > deadline:
                ctx.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"bucket {req.bucket_id} step {req.step} not published")
            time.sleep(0.0005)
        if req.step in b.errors:
            ctx.abort(grpc.StatusCode.FAILED_PRECONDITION, b.errors[req.step])
        return pb.ExchangeResponse(stats=pb.ExchangeStats(bucket_id=b.id, step=req.step, compressor="dense"))

    def ListSessions(self, req: Any, ctx: grpc.ServicerContext) -> Any:
        with self._lock:
            sessions = [pb.SessionInfo(session_id=s, local_rank=r) for s, r in self._sessions.items()]
        return pb.ListSessionsResponse(sessions=sessions)

    def Goodbye(self, req: Any, ctx: grpc.ServicerContext) -> Any:
        with self._lock:
            self._sessions.pop(req.session_id, None)
            for b in self._buckets.values():
                b.sessions.discard(req.session_id)
        return pb.GoodbyeResponse()

    # -- the engine -------------------------------------------------------------------------

    def _run_engine(self) -> None:
        while not self._stop.wait(0.0003):
            with self._lock:
                buckets = list(self._buckets.values())
            for b in buckets:
                self._step(b)

    def _step(self, b: _FakeBucket) -> None:
        """Publishes b's next step once every trainer marked its input ready: each input event
        must have been recorded for this step before (else the step fails, as a GPU would read
        stale data), then the average goes to the output and the output event is recorded."""
        step = _native.load32(b.header, L.BUCKET_PUBLISHED_OFFSET)
        if any(_native.load64(b.header, L.ready_offset(r)) < step + 1 for r in range(self.trainers)):
            return
        a, n = b.alloc, b.elements
        late = [r for r in range(self.trainers) if a.records[r] < step + 1]
        status = 0
        if late:
            b.errors[step] = f"bucket {b.id} step {step}: input events of trainers {late} not recorded before ready"
            status = 1
        elif b.dtype != "float32":  # widened, summed and averaged in float32, rounded once
            eb = _ELEM_BYTES[b.dtype]
            inputs = [_widen(a.halves(L.device_input_offset(n, r, eb), n), b.dtype) for r in range(self.trainers)]
            avg = np.multiply(np.sum(inputs, axis=0, dtype=np.float32), np.float32(1.0 / self.trainers))
            a.halves(L.device_output_offset(n, self.trainers, eb), n)[:] = _narrow(avg, b.dtype)
            a.records[self.trainers] += 1
        else:
            inputs = [a.floats(L.device_input_offset(n, r), n) for r in range(self.trainers)]
            out = a.floats(L.device_output_offset(n, self.trainers), n)
            np.multiply(np.sum(inputs, axis=0, dtype=np.float32), np.float32(1.0 / self.trainers), out=out)
            a.records[self.trainers] += 1
        self.gpu.append(("publish", b.id, step, None, status))
        _native.store32(b.header, L.BUCKET_STATUS_OFFSET, status)
        _native.store32(b.header, L.BUCKET_PUBLISHED_OFFSET, step + 1)
        _native.futex_wake(b.header, L.BUCKET_PUBLISHED_OFFSET)
