"""Device buckets for Python trainers: what proto/contract/cuda_ipc_descriptor.h, client/ipc_handle_cache.h
and client/client.cc do for the C++ client, when the daemon serves CUDA buffers (spexd --device=cuda).

The daemon keeps a device bucket's data (every trainer's input slot and the shared output) in
one CUDA IPC buffer on its GPU, with one interprocess event per input slot (event r: trainer r's
input is written) and one for the output (event `slots`: the daemon's result is written); the
BucketHeader with the doorbell counters stays in host shm. A trainer opens the memory and event
handles once (IpcHandleCache) and reuses them every step; its bucket tensors are torch CUDA
tensors over the opened memory (the CUDA Array Interface, no copies).

Every CUDA call goes through a CudaRuntime, a small interface: CudartRuntime calls libcudart
through ctypes; tests plug in a fake whose "device memory" is host memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import glob
import os
import re
import threading
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

from . import layout as L
from .errors import CudaRuntimeError, SpexError, SpexTypeError, SpexValueError

IPC_HANDLE_BYTES = 64  # cudaIpcMemHandle_t / cudaIpcEventHandle_t (CUDA_IPC_HANDLE_SIZE)
MAX_IPC_EVENTS = L.MAX_LOCAL_TRAINERS + 1  # one per input slot plus the output
CUDART_ENV = "SPEX_CUDART"
CUDART_DIR = "/usr/local/cuda/lib64"
_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1  # cudaIpcMemLazyEnablePeerAccess


@dataclass(frozen=True)
class CudaIpcHandles:
    """A decoded spex.v1.CudaIpcDescriptor: the memory handle, one event handle per slot (inputs,
    then the output), the buffer's size in bytes and the daemon's GPU ordinal."""

    memory: bytes
    events: Tuple[bytes, ...]
    size: int
    device: int


def decode_descriptor(d: Any) -> CudaIpcHandles:
    """Checks and decodes a CudaIpcDescriptor (as DecodeCudaIpcDescriptor in C++). Raises
    SpexValueError naming the field: a handle that is not 64 bytes, an all-zero memory handle,
    no events or more than MAX_IPC_EVENTS, size 0, a negative device ordinal."""
    memory = _handle(d.mem_handle, "mem_handle")
    if not any(memory):
        raise SpexValueError("CUDA IPC descriptor: mem_handle is all zeros (not one cudaIpcGetMemHandle filled)")
    if not 1 <= len(d.event_handles) <= MAX_IPC_EVENTS:
        raise SpexValueError(f"CUDA IPC descriptor: event_handles has {len(d.event_handles)} handles; expected one "
                             f"per slot, 1 to {MAX_IPC_EVENTS}")
    events = tuple(_handle(e, f"event_handles[{i}]") for i, e in enumerate(d.event_handles))
    if d.size == 0:
        raise SpexValueError("CUDA IPC descriptor: size is 0")
    if d.device_ordinal < 0:
        raise SpexValueError(f"CUDA IPC descriptor: device_ordinal {d.device_ordinal} is negative")
    return CudaIpcHandles(memory, events, int(d.size), int(d.device_ordinal))


def _handle(raw: bytes, field: str) -> bytes:
    if len(raw) != IPC_HANDLE_BYTES:
        raise SpexValueError(f"CUDA IPC descriptor: {field} has {len(raw)} bytes; a CUDA IPC handle has "
                             f"{IPC_HANDLE_BYTES}")
    return bytes(raw)


def stream_handle(stream: Any) -> Optional[int]:
    """A stream argument as a cudaStream_t value: None stays None (the caller's current torch
    stream), an int is taken as is (0 = the legacy default stream), a torch.cuda.Stream gives
    its `cuda_stream`."""
    if stream is None:
        return None
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    handle = getattr(stream, "cuda_stream", None)
    if isinstance(handle, int):
        return handle
    raise SpexTypeError(f"stream must be a torch.cuda.Stream, a cudaStream_t as int, or None; got "
                        f"{type(stream).__name__}")


class CudaRuntime:
    """The CUDA calls a trainer needs for device buckets (the Python IpcOpener). Pointers, events
    and streams are ints (a device address, a cudaEvent_t, a cudaStream_t; 0 = the legacy default
    stream); `device` is the GPU ordinal the daemon named. Failures raise CudaRuntimeError naming
    the call. The last three methods are the torch side: tensors over device memory, the current
    stream, the devices a torch future holding such tensors synchronises."""

    def open_memory(self, handle: bytes, device: int) -> int:
        """cudaIpcOpenMemHandle: the base address of the buffer."""
        raise NotImplementedError

    def close_memory(self, base: int, device: int) -> None:
        """cudaIpcCloseMemHandle; never raises."""
        raise NotImplementedError

    def open_event(self, handle: bytes, device: int) -> int:
        """cudaIpcOpenEventHandle: the event."""
        raise NotImplementedError

    def close_event(self, event: int, device: int) -> None:
        """cudaEventDestroy of an opened IPC event; never raises."""
        raise NotImplementedError

    def record_event(self, event: int, stream: int, device: int) -> None:
        """cudaEventRecord(event, stream): what a waiter sees is the work queued on `stream` so far."""
        raise NotImplementedError

    def wait_event(self, event: int, stream: int, device: int) -> None:
        """cudaStreamWaitEvent(stream, event): work queued on `stream` later waits (on the GPU)
        for the event's last record."""
        raise NotImplementedError

    def tensor(self, pointer: int, elements: int, device: int, writable: bool, dtype: str = "float32") -> Any:
        """A torch tensor of `elements` values of `dtype` ("float32", "bfloat16" or "float16": the
        bucket's type) over the device memory at `pointer`, no copy.
        `writable` is False for a bucket's output: a runtime may refuse writes to it (the fake
        does); CudartRuntime cannot, as torch has no read-only CUDA tensors."""
        raise NotImplementedError

    def current_stream(self, device: int) -> int:
        """The calling thread's current torch stream on `device` (a cudaStream_t)."""
        raise NotImplementedError

    def future_devices(self, device: int) -> Optional[List[Any]]:
        """`devices` for a torch.futures.Future completed with this device's tensors (None: a
        future that synchronises no stream)."""
        raise NotImplementedError


class _IpcHandleStruct(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_ubyte * IPC_HANDLE_BYTES)]


def _as_struct(handle: bytes) -> _IpcHandleStruct:
    s = _IpcHandleStruct()
    ctypes.memmove(ctypes.addressof(s), handle, IPC_HANDLE_BYTES)
    return s


_CUDA_HINTS = {
    "cudaErrorInsufficientDriver": "no NVIDIA driver (or one older than the CUDA runtime)",
    "cudaErrorNoDevice": "no CUDA-capable device",
    "cudaErrorInvalidDevice": "no such GPU ordinal (is CUDA_VISIBLE_DEVICES the daemon's?)",
    "cudaErrorDevicesUnavailable": "every GPU is busy or in exclusive-process mode",
    "cudaErrorSystemDriverMismatch": "the NVIDIA kernel module and the user-space driver have different versions",
    "cudaErrorMemoryAllocation": "out of GPU memory",
}


def cudart_candidates() -> List[str]:
    """Where CudartRuntime looks for libcudart, in order: $SPEX_CUDART alone when set; else a
    libcudart this process already loaded (torch's, so both share one runtime and driver
    version), /usr/local/cuda/lib64/libcudart.so*, then the loader's search path."""
    explicit = os.environ.get(CUDART_ENV)
    if explicit:
        return [explicit]
    found: List[str] = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if line.strip() else ""
                if os.path.basename(path).startswith("libcudart.so") and path not in found:
                    found.append(path)
    except OSError:
        pass

    def version(p: str) -> Tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", p[p.rfind(".so"):]))

    for p in [os.path.join(CUDART_DIR, "libcudart.so")] + sorted(
            glob.glob(os.path.join(CUDART_DIR, "libcudart.so.*")), key=version, reverse=True):
        if os.path.exists(p) and p not in found:
            found.append(p)
    name = ctypes.util.find_library("cudart")
    if name and name not in found:
        found.append(name)
    return found


def load_cudart(path: Optional[str] = None) -> ctypes.CDLL:
    """Loads libcudart (`path`, else the first of cudart_candidates() that loads); raises
    CudaRuntimeError saying what was tried and how to fix it."""
    tried: List[str] = []
    for p in [path] if path else cudart_candidates():
        try:
            return ctypes.CDLL(p)
        except OSError as e:
            tried.append(f"{p} ({e})")
    where = "; ".join(tried) if tried else f"nothing found (no ${CUDART_ENV}, nothing in {CUDART_DIR})"
    raise CudaRuntimeError(
        f"cannot load the CUDA runtime library (libcudart) for device buckets: {where}. Install the CUDA "
        f"runtime (looked for where torch loaded it, then in {CUDART_DIR}) or point ${CUDART_ENV} at "
        f"libcudart.so; or use spex.Client(device='cpu') with a spexd started with --device=cpu")


class _CudaArrayView:
    """What torch.as_tensor turns into a CUDA tensor over existing device memory without a copy
    (the CUDA Array Interface, version 2: no stream to synchronise, ordering is ours). The data's
    read-only flag is always False: torch refuses True ("the read only flag is not supported",
    first seen on a GPU), and its tensors have no read-only state to carry it anyway, so the output
    tensor of a device bucket is writable memory the trainer must only read."""

    def __init__(self, pointer: int, elements: int, typestr: str = "<f4"):
        self.__cuda_array_interface__ = {"shape": (elements,), "typestr": typestr, "data": (pointer, False),
                                         "strides": None, "version": 2}


# The CUDA Array Interface's type of each bucket type; it has no bfloat16, so a bfloat16 bucket is
# viewed as int16 and reinterpreted (Tensor.view(torch.bfloat16): same memory, no copy).
_TYPESTRS = {"float32": "<f4", "float16": "<f2", "bfloat16": "<i2"}


def _cuda_torch() -> Any:
    import torch

    if getattr(torch.version, "cuda", None) is None:
        raise CudaRuntimeError(f"torch {torch.__version__} was built without CUDA (torch.version.cuda is None): "
                               f"device buckets need a CUDA build of PyTorch, or use spex.Client(device='cpu')")
    return torch


class CudartRuntime(CudaRuntime):
    """The real CUDA runtime, called through ctypes (see load_cudart for where libcudart comes
    from). Each call runs with the daemon's GPU current (cudaSetDevice), restoring the previous
    one after, as the C++ client's DeviceGuard does."""

    def __init__(self, path: Optional[str] = None):
        lib = load_cudart(path)
        c_int, c_void_p, c_uint = ctypes.c_int, ctypes.c_void_p, ctypes.c_uint
        signatures = {
            "cudaGetDevice": [ctypes.POINTER(c_int)],
            "cudaSetDevice": [c_int],
            "cudaIpcOpenMemHandle": [ctypes.POINTER(c_void_p), _IpcHandleStruct, c_uint],
            "cudaIpcCloseMemHandle": [c_void_p],
            "cudaIpcOpenEventHandle": [ctypes.POINTER(c_void_p), _IpcHandleStruct],
            "cudaEventDestroy": [c_void_p],
            "cudaEventRecord": [c_void_p, c_void_p],
            "cudaStreamWaitEvent": [c_void_p, c_void_p, c_uint],
            "cudaGetLastError": [],
        }
        try:
            for name, args in signatures.items():
                fn = getattr(lib, name)
                fn.argtypes, fn.restype = args, c_int
            for name in ("cudaGetErrorName", "cudaGetErrorString"):
                fn = getattr(lib, name)
                fn.argtypes, fn.restype = [c_int], ctypes.c_char_p
        except AttributeError as e:
            raise CudaRuntimeError(f"{lib._name} is not a usable CUDA runtime library: {e}") from None
        self.path: str = lib._name
        self._lib = lib

    def _check(self, code: int, what: str) -> None:
        if code == 0:
            return
        self._lib.cudaGetLastError()  # resets the runtime's last error, as the C++ side does
        name = (self._lib.cudaGetErrorName(code) or b"cudaError?").decode()
        text = (self._lib.cudaGetErrorString(code) or b"").decode()
        raise CudaRuntimeError(f"{what}: {_CUDA_HINTS.get(name, 'CUDA error')}: {name} ({text})")

    @contextlib.contextmanager
    def _on(self, device: int) -> Iterator[None]:
        previous = ctypes.c_int(-1)
        known = self._lib.cudaGetDevice(ctypes.byref(previous)) == 0
        switch = not known or previous.value != device
        if switch:
            self._check(self._lib.cudaSetDevice(device), f"cudaSetDevice({device})")
        try:
            yield
        finally:
            if switch and known:
                self._lib.cudaSetDevice(previous.value)

    def open_memory(self, handle: bytes, device: int) -> int:
        base = ctypes.c_void_p()
        with self._on(device):
            self._check(self._lib.cudaIpcOpenMemHandle(ctypes.byref(base), _as_struct(handle),
                                                       _IPC_MEM_LAZY_ENABLE_PEER_ACCESS), "cudaIpcOpenMemHandle")
        return int(base.value or 0)

    def close_memory(self, base: int, device: int) -> None:
        with contextlib.suppress(CudaRuntimeError), self._on(device):
            self._lib.cudaIpcCloseMemHandle(ctypes.c_void_p(base))

    def open_event(self, handle: bytes, device: int) -> int:
        event = ctypes.c_void_p()
        with self._on(device):
            self._check(self._lib.cudaIpcOpenEventHandle(ctypes.byref(event), _as_struct(handle)),
                        "cudaIpcOpenEventHandle")
        return int(event.value or 0)

    def close_event(self, event: int, device: int) -> None:
        with contextlib.suppress(CudaRuntimeError), self._on(device):
            self._lib.cudaEventDestroy(ctypes.c_void_p(event))

    def record_event(self, event: int, stream: int, device: int) -> None:
        with self._on(device):
            self._check(self._lib.cudaEventRecord(ctypes.c_void_p(event), ctypes.c_void_p(stream)),
                        "cudaEventRecord(IPC event)")

    def wait_event(self, event: int, stream: int, device: int) -> None:
        with self._on(device):
            self._check(self._lib.cudaStreamWaitEvent(ctypes.c_void_p(stream), ctypes.c_void_p(event), 0),
                        "cudaStreamWaitEvent(IPC event)")

    def tensor(self, pointer: int, elements: int, device: int, writable: bool, dtype: str = "float32") -> Any:
        torch = _cuda_torch()
        if dtype not in _TYPESTRS:
            raise CudaRuntimeError(f"no device tensor of {dtype!r}: the bucket types are {sorted(_TYPESTRS)}")
        t = torch.as_tensor(_CudaArrayView(pointer, elements, _TYPESTRS[dtype]), device=torch.device("cuda", device))
        if dtype == "bfloat16":
            t = t.view(torch.bfloat16)
        if t.data_ptr() != pointer or t.dtype != getattr(torch, dtype) or t.numel() != elements:
            raise CudaRuntimeError(f"torch.as_tensor copied the device buffer at {pointer:#x} instead of viewing it")
        return t

    def current_stream(self, device: int) -> int:
        return int(_cuda_torch().cuda.current_stream(device).cuda_stream)

    def future_devices(self, device: int) -> Optional[List[Any]]:
        return [_cuda_torch().device("cuda", device)]

    def __repr__(self) -> str:
        return f"CudartRuntime({self.path!r})"


class IpcMapping:
    """One opened CUDA IPC buffer of an IpcHandleCache: base device address, size, GPU ordinal and
    the opened events (inputs, then the output). Valid until the cache closes it."""

    def __init__(self, handles: CudaIpcHandles):
        self.handles = handles
        self.base = 0
        self.events: List[int] = []
        self.users = 0
        self.closed = False

    @property
    def size(self) -> int:
        return self.handles.size

    @property
    def device(self) -> int:
        return self.handles.device

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.users} users"
        return f"IpcMapping(base={self.base:#x}, size={self.size}, device={self.device}, {state})"


class IpcHandleCache:
    """Opened CUDA IPC buffers keyed by their memory handle: each is opened once (memory and every
    event) and reused every step. Counted per user: attach() adds one, release() drops one and
    closes the buffer with the last, so clients of one process may share a cache (CUDA opens a
    handle once per process). Thread-safe."""

    def __init__(self, runtime: CudaRuntime):
        self.runtime = runtime
        self._lock = threading.Lock()
        self._open: Dict[bytes, IpcMapping] = {}

    def attach(self, descriptor: Any) -> IpcMapping:
        """The mapping of a BufferDescriptor of the cuda_ipc kind, opened on first use. A memory
        handle already open with another size, device or event list (a stale or forged
        descriptor) is refused without opening anything."""
        if descriptor.WhichOneof("kind") != "cuda_ipc":
            raise SpexValueError("buffer descriptor is not CUDA IPC (a CPU-path daemon hands out POSIX shm buffers)")
        handles = decode_descriptor(descriptor.cuda_ipc)
        with self._lock:
            m = self._open.get(handles.memory)
            if m is not None:
                if m.handles != handles:
                    raise SpexError("CUDA IPC descriptor: this memory handle is already open with a different size, "
                                    "device or event list (a stale descriptor; re-register the bucket)")
                m.users += 1
                return m
            m = IpcMapping(handles)
            m.base = self.runtime.open_memory(handles.memory, handles.device)
            try:
                for e in handles.events:
                    m.events.append(self.runtime.open_event(e, handles.device))
            except BaseException:
                self._close(m)
                raise
            m.users = 1
            self._open[handles.memory] = m
            return m

    def release(self, mapping: IpcMapping) -> bool:
        """Drops one user of `mapping`; closes it (events, then memory) when that was the last.
        Returns True when it was closed now."""
        with self._lock:
            if self._open.get(mapping.handles.memory) is not mapping:
                return False
            mapping.users -= 1
            if mapping.users > 0:
                return False
            del self._open[mapping.handles.memory]
            self._close(mapping)
            return True

    def close(self) -> None:
        """Closes every buffer still open, whatever its users."""
        with self._lock:
            mappings, self._open = list(self._open.values()), {}
        for m in mappings:
            self._close(m)

    def _close(self, m: IpcMapping) -> None:
        for e in m.events:
            self.runtime.close_event(e, m.device)
        m.events = []
        if m.base:
            self.runtime.close_memory(m.base, m.device)
        m.base = 0
        m.closed = True

    @property
    def open_count(self) -> int:
        with self._lock:
            return len(self._open)

    def record(self, mapping: IpcMapping, slot: int, stream: int) -> None:
        """Records event `slot` of `mapping` on `stream` (a trainer: "my input slot is written")."""
        self.runtime.record_event(self._event(mapping, slot), stream, mapping.device)

    def wait(self, mapping: IpcMapping, slot: int, stream: int) -> None:
        """Makes `stream` wait for event `slot` of `mapping` (a trainer: the output's event, which
        the daemon recorded after writing the result)."""
        self.runtime.wait_event(self._event(mapping, slot), stream, mapping.device)

    @staticmethod
    def _event(mapping: IpcMapping, slot: int) -> int:
        if mapping.closed:
            raise SpexError("CUDA IPC buffer is closed (bucket unregistered or client closed)")
        if not 0 <= slot < len(mapping.events):
            raise SpexValueError(f"IPC event {slot} of a buffer with {len(mapping.events)}")
        return mapping.events[slot]


__all__ = [
    "CudaIpcHandles", "CudaRuntime", "CudartRuntime", "IpcHandleCache", "IpcMapping", "IPC_HANDLE_BYTES",
    "MAX_IPC_EVENTS", "cudart_candidates", "decode_descriptor", "load_cudart", "stream_handle",
]
