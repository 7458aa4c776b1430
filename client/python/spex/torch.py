"""PyTorch DistributedDataParallel communication hook that exchanges gradients through spexd.

    ddp = DDP(model, process_group=gloo_group)
    state = spex.torch.register(ddp, compressor="micro", density=0.01)   # or, the plain form:
    state = spex.torch.SpexHookState(ddp, compressor="micro", density=0.01)
    ddp.register_comm_hook(state, spex.torch.hook)

Every DDP process is one trainer of its node's daemon (local_rank/local_size from the
arguments or $LOCAL_RANK/$LOCAL_WORLD_SIZE, as torchrun sets them); the daemon averages over
all trainers of all nodes, so the DDP world must be nodes x local trainers.

Per bucket, the hook hands DDP's flat gradient buffer to the daemon and rings the doorbell at
once (on the autograd thread), so the daemon starts while backward goes on. On the CPU the
buffer itself is the bucket's input (zero_copy, the default): at registration its storage moves
into shared memory in place (as Tensor.share_memory_(); DDP's views of it follow) and the daemon
maps it read-only, so no step copies the gradients; otherwise (CUDA buckets, momentum
correction, a resumed layout mapped per parameter, zero_copy=False, or a daemon that cannot take
the memory) the hook copies the buffer into the bucket's shared input slot; one worker thread per process waits for the results in FIFO order and completes the
returned futures with the output slot (a tensor over shared memory, no copy; DDP copies it into
the gradients before the next step). Bucket ids are id_base + generation * 2**20 + DDP's bucket
index: DDP rebuilds its buckets after the first iteration (the same layout on every rank, synced
from rank 0), and each layout generation gets fresh ids, the previous generation being
unregistered first, so ids agree across nodes and the daemon's canonical order (ascending
(step, id)) matches the order DDP hands buckets over.

Checkpoints (docs/checkpoint.md): `state.state_dict()` holds the exchange state of every current
bucket (residuals, compressor state, density, step; the daemon's opaque records) with the
bucket's parameters, and `state.load_state_dict(d)` gives it back to the restarted job: every
rank calls both (collectives over DDP's process group); rank 0's dict holds every node's state
and goes into torch.save beside the model's and the optimiser's; every rank loads it after
register and before the first step, on the saved world (exactly) or another (resized: the
residuals redistributed, the compressors fresh). A resumed hook exchanges
the saved buckets (same ids, same parameters in the same order), whatever layout DDP hands it:
a fresh DDP's first iteration uses its initial layout (one bucket of every parameter, unless
find_unused_parameters=True) and rebuilds after it, so the hook copies each DDP bucket's
gradients parameter by parameter into the saved buckets, rings each saved bucket once all its
parameters are in, and completes the DDP bucket's future with its parameters' averages copied
back. Where DDP's bucket holds exactly one saved bucket's parameters in its order (after the
rebuild, as a rule) that copy is skipped, as without a checkpoint.

Half-precision models (docs/dtypes.md): a DDP bucket of bfloat16 or float16 gradients becomes
a bucket of that type (half the shared memory and, by default, half the dense wire bytes); the
daemon sums and compresses it in float32 and rounds the average once. A DDP bucket mixing types
is refused. torch 1.13 on CPU cannot build DDP around a bfloat16 model over gloo (its initial
broadcast: "Invalid scalar type"): build it with spex.torch.half_ddp(model), which checks that
every rank holds the same parameters instead of broadcasting them.

CUDA models (device="cuda", a daemon started with --device=cuda): the buckets live in the daemon's
GPU memory. The hook copies DDP's CUDA bucket into the device input tensor on the current stream
and records the input's IPC event there before ringing; the worker makes its current stream wait
for the output's event and completes a CUDA-aware future with the device output tensor (no copy),
so DDP's stream waits for the result. A CUDA bucket on a CPU hook, or a CPU bucket on a CUDA
hook, is refused with SpexTypeError naming the fix.
"""

import pickle
import queue
import threading
import time
import warnings
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from .client import DEVICES, MODES, Bucket, Client
from .cuda import CudaRuntime
from .errors import OwnInputRefused, SpexError, SpexTypeError, SpexValueError

GENERATION_STRIDE = 1 << 20
# The gradient types a DDP bucket may hold (docs/dtypes.md).
_BUCKET_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# 2: the world's state in one dict (state_dict is a collective; docs/checkpoint.md). 1: one
# node's records per rank, still loaded onto the same world.
STATE_DICT_VERSION = 2


class SpexHookState:
    """State of the spex DDP communication hook (pass it with `hook` to register_comm_hook).

    Args:
        ddp: the DistributedDataParallel model (lets the hook see DDP's bucket rebuild and
            check the world size); may be None with the plain form, then a rebuild is detected
            from bucket 0's layout.
        client: an existing spex.Client; by default one is opened with socket/job/local_rank/
            local_size and closed by close().
        compressor, density, params: what the daemon runs for these buckets (None: the
            daemon's defaults), e.g. "dense", "micro", "topk", density in (0, 1].
        mode: "doorbell" (shared-memory hot path) or "rpc" (the Exchange RPC).
        id_base: added to every bucket id (give two DDP models sharing a daemon different bases,
            multiples of 2**32).
        exchange_timeout: seconds one exchange may take before it fails.
        device: "cpu" (host buffers, CPU models) or "cuda" (the daemon's GPU buffers, CUDA models;
            spexd --device=cuda); default: the given client's, else "cpu".
        cuda_runtime: the CUDA calls of a device="cuda" client this state opens (tests: a fake).
        momentum_correction: DGC's momentum correction with this momentum factor m in (0, 1),
            e.g. 0.9 (None: off). The hook keeps u = m u + g per DDP bucket (float32, on the
            gradients' device), hands u to the daemon instead of g, and zeroes u wherever the
            averaged result is non-zero (momentum factor masking). The optimiser must then run
            WITHOUT momentum (torch.optim.SGD(..., momentum=0)): the hook applies it before
            the exchange. Sparse compressors only; u is saved by state_dict. docs/clients.md.
        momentum_masking: with momentum_correction, whether u is zeroed where the result is
            non-zero (DGC's momentum factor masking, the default). False keeps u as it is (local
            momentum before error feedback): the update then equals momentum SGD's whenever the
            selection is dense, where masking would leave SGD without momentum for every
            element selected at each step.
        zero_copy: CPU buckets: DDP's own bucket buffer is the bucket's input (Client.register_bucket's
            own_input: its storage moves into shared memory when the bucket is registered, and the
            daemon reads it there), so the hook copies nothing into the input slot. Where the daemon
            cannot take it (OwnInputRefused: e.g. another user's spexd) the hook warns once and
            copies. Not used with momentum_correction (u is handed over) or for a resumed layout
            mapped per parameter. False: always copy.
    """

    def __init__(self, ddp: Optional[torch.nn.parallel.DistributedDataParallel] = None, *,
                 client: Optional[Client] = None, socket: Optional[str] = None, job: Optional[str] = None,
                 local_rank: Optional[int] = None, local_size: Optional[int] = None,
                 compressor: Optional[str] = None, density: Optional[float] = None,
                 params: Optional[Dict[str, str]] = None, mode: str = "doorbell", id_base: int = 0,
                 exchange_timeout: float = 300.0, device: Optional[str] = None,
                 cuda_runtime: Optional[CudaRuntime] = None, momentum_correction: Optional[float] = None,
                 zero_copy: bool = True, momentum_masking: bool = True):
        if device is not None and device not in DEVICES:
            raise SpexValueError(f"device must be one of {DEVICES}, got {device!r}")
        if client is not None and device is not None and device != client.device:
            raise SpexValueError(f"device={device!r} but the given client was opened with device={client.device!r}")
        if mode not in MODES:
            raise SpexValueError(f"mode must be one of {MODES}, got {mode!r}")
        if density is not None and not 0 < density <= 1:
            raise SpexValueError(f"density must be in (0, 1], got {density}")
        if id_base < 0 or id_base % GENERATION_STRIDE:
            raise SpexValueError(f"id_base must be a non-negative multiple of {GENERATION_STRIDE}, got {id_base}")
        if momentum_correction is not None:
            if not isinstance(momentum_correction, (int, float)) or not 0 < momentum_correction < 1:
                raise SpexValueError(f"momentum_correction must be a momentum factor in (0, 1), e.g. 0.9, or None "
                                     f"(off); got {momentum_correction!r}")
            if compressor == "dense":
                raise SpexValueError("momentum_correction needs a sparse compressor: under compressor='dense' "
                                     "every element of the result is non-zero, so momentum factor masking would "
                                     "clear the momentum every step; use the optimiser's momentum with dense")
        self.ddp = ddp
        self.compressor = compressor
        self.density = density
        self.params = dict(params or {})
        self.mode = mode
        self.id_base = id_base
        self.momentum_correction = None if momentum_correction is None else float(momentum_correction)
        self.momentum_masking = bool(momentum_masking)
        self.zero_copy = bool(zero_copy)
        # Momentum correction's u per DDP bucket index (float32; reset with the buckets when DDP
        # rebuilds them, as the daemon's residuals are).
        self._u: Dict[int, torch.Tensor] = {}
        self._own_client = client is None
        self.client = client or Client(socket, job=job, local_rank=local_rank, local_size=local_size,
                                       client_name="torch-hook", exchange_timeout=exchange_timeout,
                                       device=device or "cpu", cuda_runtime=cuda_runtime)
        try:
            self._check_model_device()
            self._check_world_size()
            # A typo in the compressor's name or parameters fails here, with the daemon's list of
            # accepted names, not at the first backward inside DDP.
            if compressor is not None or density is not None or self.params:
                self.client.validate_compressor(compressor, density, self.params)
        except Exception:
            self.close()
            raise
        self.generation = -1
        self._buckets: Dict[int, Bucket] = {}
        self._sigs: Dict[int, Tuple[int, Tuple[int, ...]]] = {}
        self._layout: Dict[int, List[int]] = {}  # per bucket index: _param_key
        self._rebuilt = bool(getattr(ddp, "_has_rebuilt_buckets", False))
        self._error: Optional[BaseException] = None
        self._timings: List[Tuple[int, int, int, float]] = []
        self._timings_lock = threading.Lock()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        # load_state_dict's records by DDP bucket index, applied as the hook registers the
        # buckets of its first generation (None: nothing to apply). Plain form only (no DDP model:
        # the saved parameters cannot be told apart, so the layout must be the saved one).
        self._pending: Optional[Dict[int, Dict[str, Any]]] = None
        # With a DDP model, load_state_dict's whole dict, turned into the saved layout in the first
        # iteration (_restore_layout).
        self._restore: Optional[Dict[str, Any]] = None
        # The saved layout of a resumed job (_restore_layout): the hook's buckets are the saved
        # ones and DDP's buckets are mapped onto them per parameter. _keep: it stays for the whole
        # job (it was saved after DDP's rebuild, or from a DDP that does not rebuild); otherwise
        # DDP's rebuild starts a generation of DDP's layout, as in the uninterrupted job.
        self._mapped = False
        self._keep = False
        self._where: Dict[int, Tuple[int, int, int]] = {}  # parameter index -> (bucket, offset, numel)
        self._plans: Dict[Any, List[Tuple[int, int, int, int]]] = {}  # DDP bucket signature -> copies
        self._left: Dict[int, int] = {}  # per saved bucket: elements still to come this iteration
        self._futs: Dict[int, Tuple[Any, Any]] = {}  # per saved bucket: (result, masked) this iteration
        self._closed = False
        self._held: Any = None  # the last collective's tensors (_gather_objects)
        self._worker = threading.Thread(target=self._run, name="spex-hook-worker", daemon=True)
        self._worker.start()

    def _device_problem(self, where: Any, what: str) -> Optional[str]:
        """Why a tensor of `what` on `where` does not fit this hook's buffers, naming the fix."""
        if self.client.device == "cpu" and where.type != "cpu":
            return (f"{what} is on {where} but this hook's client asked spexd for host buffers: pass device='cuda' to "
                    f"spex.torch.register / SpexHookState (it needs a spexd started with --device=cuda), or train "
                    f"on the CPU")
        if self.client.device == "cuda" and where.type != "cuda":
            return (f"{what} is on {where} but this hook exchanges the daemon's CUDA buffers (device='cuda'): put "
                    f"the model on the daemon's GPU, or use device='cpu' with a spexd started with --device=cpu")
        return None

    def _check_model_device(self) -> None:
        params = getattr(self.ddp, "parameters", None)
        if params is None:
            return
        for p in params():
            problem = self._device_problem(p.device, "the DDP model")
            if problem:
                raise SpexTypeError(problem)
            return  # DDP keeps one model on one device

    def _check_world_size(self) -> None:
        group = getattr(self.ddp, "process_group", None)
        if group is not None:
            world = group.size()
        elif dist.is_available() and dist.is_initialized():
            world = dist.get_world_size()
        else:
            return
        if world != self.client.world_size:
            raise SpexValueError(
                f"the DDP process group has {world} ranks but spexd at {self.client.socket} averages over "
                f"{self.client.node_count} nodes x {self.client.hello.local_trainers} local trainers = "
                f"{self.client.world_size}: start one DDP process per trainer slot (--local_trainers) of every "
                f"node's daemon")

    # -- the hook -----------------------------------------------------------------------------

    def _signature(self, grad_bucket: Any) -> Tuple[int, Tuple[int, ...], str]:
        return (grad_bucket.buffer().numel(), tuple(id(p) for p in grad_bucket.parameters()),
                str(grad_bucket.buffer().dtype))

    def _new_generation(self) -> None:
        for b in list(self._buckets.values()):
            self.client.unregister_bucket(b)
        self._buckets.clear()
        self._sigs.clear()
        self._layout.clear()
        self._u.clear()
        self._mapped = self._keep = False
        self._where.clear()
        self._plans.clear()
        self._left.clear()
        self._futs.clear()
        self.generation += 1

    def _begin_iteration(self, grad_bucket: Any) -> None:
        if self._pending is not None and self.generation >= 0:
            # The first iteration registered every bucket: a record left over had no bucket.
            left, self._pending = sorted(self._pending), None
            if left:
                raise SpexError(f"the checkpoint's DDP buckets {left} had no bucket in this job's first iteration: "
                                f"the bucket layout differs from when it was saved")
        rebuilt = bool(getattr(self.ddp, "_has_rebuilt_buckets", False))
        if self.generation < 0:
            if self._restore is not None:
                restore, self._restore = self._restore, None
                self._restore_layout(restore)
            else:
                self._new_generation()
        elif self._mapped:
            if rebuilt != self._rebuilt and not self._keep:
                self._new_generation()  # a layout saved before DDP's rebuild: follow it, as the saved job did
        elif rebuilt != self._rebuilt or self._sigs.get(0) != self._signature(grad_bucket):
            self._new_generation()
        self._rebuilt = rebuilt
        if self._mapped:
            unfinished = sorted(j for j, n in self._left.items() if n > 0)
            if unfinished:
                raise SpexError(f"the checkpoint's buckets {unfinished} did not get all their parameters' gradients "
                                f"in the last iteration: DDP's buckets no longer hold the saved parameters")
            self._left = {j: b.elements for j, b in self._buckets.items()}
            self._futs = {}

    def _bucket_for(self, grad_bucket: Any) -> Bucket:
        index = grad_bucket.index()
        if index >= GENERATION_STRIDE:
            raise SpexValueError(f"DDP bucket index {index} exceeds {GENERATION_STRIDE - 1}")
        sig = self._signature(grad_bucket)
        b = self._buckets.get(index)
        if b is None:
            bucket_id = self.id_base + self.generation * GENERATION_STRIDE + index
            # A CUDA bucket lives where its gradients are: the daemon places this trainer's buffers on
            # that GPU (spexd --devices; docs/design.md#multi-gpu).
            where = grad_bucket.buffer().device
            b = self._register(bucket_id, grad_bucket, where)
            self._buckets[index] = b
            self._sigs[index] = sig
            self._layout[index] = self._param_key(grad_bucket)
            if self.momentum_correction is not None:
                if getattr(b, "compressor", None) == "dense":
                    raise SpexValueError(f"momentum_correction needs a sparse compressor, but spexd runs DDP bucket "
                                         f"{index} dense (its default compressor): pass compressor= (e.g. "
                                         f"'micro'), or drop momentum_correction and use the optimiser's momentum")
                self._u[index] = torch.zeros(sig[0], dtype=torch.float32, device=where)
            if self._pending is not None:
                self._apply_pending(index, b, grad_bucket)
        elif self._sigs[index] != sig:
            raise SpexError(
                f"DDP bucket {index} changed ({self._sigs[index][0]} -> {sig[0]} elements or other parameters) "
                f"while bucket 0 did not: spex cannot tell that DDP rebuilt its buckets. Pass the DDP model to "
                f"SpexHookState(ddp=...) (spex.torch.register does)")
        return b

    def _register(self, bucket_id: int, grad_bucket: Any, where: Any) -> Bucket:
        """Registers DDP bucket `grad_bucket` as `bucket_id`: with DDP's buffer as its own input
        (zero copy) where that can be, else with the input slot."""
        buf = grad_bucket.buffer()
        kwargs = dict(dtype=buf.dtype, cuda_device=where.index if where.type == "cuda" else None)
        if (self.zero_copy and where.type == "cpu" and self.momentum_correction is None
                and buf.is_contiguous()):
            try:
                return self.client.register_bucket(bucket_id, buf.numel(), self.compressor, self.density,
                                                   self.params, own_input=buf, **kwargs)
            except OwnInputRefused as e:
                self.zero_copy = False  # once: every later bucket would be refused alike
                warnings.warn(f"spex: DDP's bucket memory cannot be the daemon's input ({e}); copying each "
                              f"bucket into its shared slot instead", RuntimeWarning, stacklevel=3)
        return self.client.register_bucket(bucket_id, buf.numel(), self.compressor, self.density, self.params,
                                           **kwargs)

    def __call__(self, grad_bucket: Any) -> "torch.futures.Future[torch.Tensor]":
        """Hands one DDP bucket to the daemon; returns a future holding the averaged bucket."""
        if self._closed:
            raise SpexError("the spex hook state is closed")
        if self._error is not None:
            raise SpexError(f"the spex hook stopped after an earlier error: {self._error}") from self._error
        buf = grad_bucket.buffer()
        if buf.dtype not in _BUCKET_DTYPES:
            raise SpexTypeError(f"spex exchanges float32, bfloat16 or float16 gradients; DDP bucket "
                                f"{grad_bucket.index()} holds {buf.dtype}: convert the model (model.float(), "
                                f"model.to(torch.bfloat16))")
        mixed = sorted({str(p.dtype) for p in grad_bucket.parameters() if p.dtype != buf.dtype})
        if mixed:
            raise SpexTypeError(f"DDP bucket {grad_bucket.index()} mixes data types ({buf.dtype} with "
                                f"{', '.join(mixed)}): spex buckets hold one type; convert the model to one type")
        problem = self._device_problem(buf.device, f"DDP bucket {grad_bucket.index()}")
        if problem:
            raise SpexTypeError(problem)
        if grad_bucket.index() == 0:
            self._begin_iteration(grad_bucket)
        elif self.generation < 0:
            raise SpexError(f"DDP handed over bucket {grad_bucket.index()} before bucket 0")
        if self._mapped:
            return self._mapped_call(grad_bucket, buf)
        b = self._bucket_for(grad_bucket)
        fut = self._future(b)
        self._hand_over(grad_bucket.index(), b, buf.reshape(-1), fut)
        return self._masked(grad_bucket.index(), fut)

    def _hand_over(self, index: int, b: Bucket, src: torch.Tensor, fut: Any) -> None:
        """Puts src (the bucket's gradients) into b's input slot, rings and queues fut for the worker."""
        u = self._u.get(index)
        if u is not None:  # momentum correction: hand over u = m u + g
            src = u.mul_(self.momentum_correction).add_(src)
        # Device buckets: the copy is queued on the current stream, where submit / record_input
        # record the input's IPC event after it.
        # Zero copy: src is the bucket's own input already (the daemon reads DDP's buffer).
        if src is not b.input_tensor and not (getattr(b, "own_input", False)
                                              and src.data_ptr() == b.input_tensor.data_ptr()):
            b.input_tensor.copy_(src)
        t0 = time.perf_counter()
        if self.mode == "doorbell":
            step = self.client.submit(b)
        else:
            self.client.record_input(b)
            step = b.next_step
        self._queue.put((b, step, fut, t0))

    def _masked(self, index: int, fut: Any) -> Any:
        """fut, or under momentum correction a future that first masks u where the result is non-zero."""
        u = self._u.get(index)
        if u is None or not self.momentum_masking:
            return fut

        def mask(f: "torch.futures.Future[torch.Tensor]") -> torch.Tensor:
            # Momentum factor masking, with the union of the nodes' selections: the hook sees
            # only the average (DGC masks with the node's own selection, a subset).
            out = f.value()
            u.masked_fill_(out.reshape(-1) != 0, 0.0)
            return out

        return fut.then(mask)

    def _mapped_call(self, grad_bucket: Any, buf: torch.Tensor) -> "torch.futures.Future[torch.Tensor]":
        """A DDP bucket of a resumed job, mapped onto the saved buckets per parameter."""
        sig = self._signature(grad_bucket)
        plan = self._plans.get(sig)
        if plan is None:
            plan = self._plans[sig] = self._plan(grad_bucket)
        flat = buf.reshape(-1)
        touched: List[int] = []
        for j, src, dst, n in plan:
            if j not in touched:
                touched.append(j)
            b = self._buckets[j]
            if j not in self._futs:
                fut = self._future(b)
                self._futs[j] = (fut, self._masked(j, fut))
            if n == b.elements == flat.numel():  # DDP's bucket is this saved bucket: no copies
                self._left[j] = 0
                self._hand_over(j, b, flat, self._futs[j][0])
                return self._futs[j][1]
            b.input_tensor[dst:dst + n].copy_(flat[src:src + n])
            self._left[j] -= n
            if self._left[j] == 0:  # every parameter of the saved bucket is in: ring it
                self._hand_over(j, b, b.input_tensor, self._futs[j][0])
        parts = [self._futs[j][1] for j in touched]

        def gather(f: Any) -> torch.Tensor:
            outs = {j: p.value() for j, p in zip(touched, f.value())}
            for j, src, dst, n in plan:
                flat[src:src + n].copy_(outs[j].reshape(-1)[dst:dst + n])
            return buf

        return torch.futures.collect_all(parts).then(gather)

    def _plan(self, grad_bucket: Any) -> List[Tuple[int, int, int, int]]:
        """(saved bucket, offset in DDP's bucket, offset in the saved bucket, elements) of each
        run of consecutive parameters of a DDP bucket."""
        index = {id(p): i for i, p in enumerate(self.ddp.parameters())}
        plan: List[List[int]] = []
        offset = 0
        for p in grad_bucket.parameters():
            i = index.get(id(p), -1)
            where = self._where.get(i)
            if where is None or where[2] != p.numel():
                raise SpexError(f"DDP bucket {grad_bucket.index()} holds parameter {i} ({p.numel()} elements), which "
                                f"no bucket of the checkpoint holds with that size: the model differs from the saved "
                                f"one")
            j, dst, n = where
            last = plan[-1] if plan else None
            if last is not None and last[0] == j and last[1] + last[3] == offset and last[2] + last[3] == dst:
                last[3] += n
            else:
                plan.append([j, offset, dst, n])
            offset += n
        if offset != grad_bucket.buffer().numel():
            raise SpexError(f"DDP bucket {grad_bucket.index()} holds {grad_bucket.buffer().numel()} elements, its "
                            f"parameters {offset}: spex maps buckets without padding between parameters")
        if grad_bucket.buffer().device.type != "cpu" and not (len(plan) == 1 and plan[0][3] == offset ==
                                                              self._buckets[plan[0][0]].elements):
            raise SpexError(f"DDP bucket {grad_bucket.index()} is not one of the checkpoint's buckets, and mapping "
                            f"CUDA buckets per parameter is not implemented: build DDP with "
                            f"find_unused_parameters=True (it keeps its initial layout) in both runs")
        return [tuple(x) for x in plan]  # type: ignore[misc]

    def _future(self, b: Bucket) -> "torch.futures.Future[torch.Tensor]":
        """A future for b's result: CUDA-aware for device buckets (completing it records an event
        on the worker's stream, which waited for the output; DDP's stream then waits for that)."""
        if b.on_device:
            devices = self.client.cuda_runtime.future_devices(b.cuda_device)
            if devices:
                return torch.futures.Future(devices=devices)
        return torch.futures.Future()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            b, step, fut, t0 = item
            if self._error is not None:
                fut.set_exception(SpexError(f"the spex hook stopped after an earlier error: {self._error}"))
                continue
            try:
                if self.mode == "doorbell":
                    self.client.wait(b, step)  # device buckets: this thread's stream waits for the output
                else:
                    self.client.exchange_rpc(b, step)
                    b.next_step = step + 1
                    self.client.wait_output(b)
                dt = time.perf_counter() - t0
                with self._timings_lock:
                    self._timings.append((b.id, b.elements, step, dt))
                fut.set_result(b.output_tensor)
            except BaseException as e:  # noqa: BLE001 - every failure goes to DDP through the future
                self._error = e
                fut.set_exception(e)

    # -- checkpoints ----------------------------------------------------------------------------

    def _param_key(self, grad_bucket: Any) -> List[int]:
        """The bucket's parameters as indices into the DDP model's parameters (their sizes in
        the plain form without a DDP model), in the bucket's order."""
        params = list(grad_bucket.parameters())
        if self.ddp is not None:
            index = {id(p): i for i, p in enumerate(self.ddp.parameters())}
            return [index.get(id(p), -1) for p in params]
        return [-int(p.numel()) for p in params]

    def _settled(self) -> bool:
        """Whether the current layout stays for the rest of the job: DDP has rebuilt its buckets
        (it does so once) or never will (find_unused_parameters=True without static_graph), or
        the layout is a resumed job's that was settled when saved."""
        if self._mapped:
            return self._keep
        return self._settled_ddp()

    def _settled_ddp(self) -> bool:
        """Whether DDP's bucket layout stays as it is: it has rebuilt it, or never will."""
        ddp = self.ddp
        if ddp is None:
            return False
        if getattr(ddp, "_has_rebuilt_buckets", False):
            return True
        return not (getattr(ddp, "static_graph", False) or not getattr(ddp, "find_unused_parameters", True))

    def _world(self) -> Dict[str, int]:
        return {"node_rank": int(self.client.node_rank), "node_count": int(self.client.node_count),
                "local_trainers": int(self.client.hello.local_trainers)}

    def _group(self) -> Any:
        """The process group state_dict gathers over: DDP's, else the default one if there is one."""
        group = getattr(self.ddp, "process_group", None)
        if group is None and dist.is_available() and dist.is_initialized():
            group = dist.group.WORLD
        return group

    def state_dict(self) -> Dict[str, Any]:
        """The exchange state of the current buckets, for torch.save beside the model and the
        optimiser. A collective: call it between steps (after optimizer.step()) on every rank of
        DDP's process group. Every rank's dict holds its node's records and its own
        momentum-correction buffers (enough to resume on the same world from each rank's own
        file); the group's rank 0 also gathers every node's records (from each node's local rank
        0) and every trainer's buffers, so its dict holds the world's state: saved and loaded on
        every rank, it resumes the same world exactly or another world resized (load_state_dict).
        Before the first step it holds no buckets."""
        if self._error is not None:
            raise SpexError(f"the spex hook stopped after an earlier error: {self._error}") from self._error
        node, local = int(self.client.node_rank), int(self.client.local_rank)
        trainers = int(self.client.hello.local_trainers)
        records = {index: self.client.save_bucket_state(self._buckets[index]) for index in sorted(self._buckets)}
        momentum = {index: self._u[index].detach().to("cpu", copy=True) for index in sorted(self._u)}
        mine: Dict[str, Any] = {"node": node, "trainer": node * trainers + local,
                                "records": records if local == 0 else {}, "momentum": momentum}
        group, rank = self._group(), 0
        parts: List[Any] = [mine]
        if group is not None:
            rank = dist.get_rank(group)
            world_pg = group is dist.group.WORLD or group is dist.distributed_c10d._get_default_group()
            gathered = self._gather_objects(mine, group, 0 if world_pg else dist.get_global_rank(group, 0))
            if rank == 0:
                parts = gathered  # type: ignore[assignment]
        buckets = []
        for index in sorted(self._buckets):
            b = self._buckets[index]
            entry: Dict[str, Any] = {"index": index, "id": b.id - self.id_base, "elements": b.elements,
                                     "params": list(self._layout[index]), "records": {node: records[index]}}
            for p in parts:
                if index in p["records"]:
                    entry["records"][p["node"]] = p["records"][index]
            if index in self._u:
                entry["momentum"] = {p["trainer"]: p["momentum"][index] for p in parts}
            buckets.append(entry)
        return {"version": STATE_DICT_VERSION, "world": {"node_count": int(self.client.node_count),
                                                         "local_trainers": trainers},
                "taken_on_rank": rank, "compressor": self.compressor, "density": self.density,
                "params": dict(self.params), "momentum_correction": self.momentum_correction,
                "momentum_masking": self.momentum_masking,
                "generation": max(self.generation, 0), "settled": self._settled(), "buckets": buckets}

    def _gather_objects(self, obj: Any, group: Any, dst: int) -> Optional[List[Any]]:
        """dist.gather_object(obj) to the group's rank 0 (global rank `dst`): every rank's object,
        on that rank, in group rank order (None elsewhere). Its tensors stay referenced here until
        the next call: gloo's worker threads drop their references to a collective's tensors just
        after it completes, and in torch 1.13 a worker that drops the last reference to a tensor
        made in Python takes the GIL to free it; doing so while the interpreter exits ends the
        process with "terminate called without an active exception" (SIGABRT). A script that
        saved spex's state at its last step and exited hit that about once in 25 runs."""
        data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        size = torch.tensor([data.numel()], dtype=torch.long)
        sizes = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
        dist.all_gather(sizes, size, group=group)
        longest = max(int(n.item()) for n in sizes)
        padded = torch.zeros(longest, dtype=torch.uint8)
        padded[:data.numel()] = data
        outs = [torch.empty(longest, dtype=torch.uint8) for _ in range(world)] if rank == 0 else None
        dist.gather(padded, gather_list=outs, dst=dst, group=group)
        self._held = (size, sizes, padded, outs)
        if outs is None:
            return None
        return [pickle.loads(o[:int(n.item())].numpy().tobytes()) for o, n in zip(outs, sizes)]

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restores what state_dict saved: call it after register and before the first step, on
        every rank (a collective: the ranks agree, so that all load or all refuse). In the first
        iteration the hook registers the saved buckets, gives the daemon their records and maps
        DDP's buckets onto them per parameter (another model is refused there, naming the
        parameter).

        On the world it was saved on (nodes, trainers per node) the job continues exactly, from
        rank 0's dict or each rank's own. On another world it needs rank 0's dict (every node's
        state) and loads it resized (docs/checkpoint.md#another-world): every old node's residual
        is added, scaled by the ratio of the worlds' trainers, at the elements each new node takes,
        every trainer's momentum-correction buffer starts as the mean of the old trainers', and
        the compressors start afresh (a RuntimeWarning says so). Another compressor is refused.
        In the plain form (no DDP model) the records go to the DDP buckets of the same index,
        which must hold the saved layout."""
        problem: Optional[BaseException] = None
        try:
            plan = self._load_plan(state)
        except (SpexError, SpexValueError) as e:
            problem, plan = e, None
        group = self._group()
        if group is not None:
            ok = torch.tensor([0 if problem is not None else 1])
            dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)
            self._held = ok  # dropped here, not by gloo's worker (_gather_objects)
            if problem is None and not int(ok):
                problem = SpexValueError("another rank's spex state_dict cannot be loaded (its error names why), so "
                                         "no rank loads one: every rank resumes from the same dict (rank 0's, "
                                         "which holds the world's state)")
        if problem is not None:
            raise problem
        entries, resized = plan
        if resized is not None:
            warnings.warn(resized, RuntimeWarning, stacklevel=2)
        pending = {int(entry["index"]): entry for entry in entries}
        if self.ddp is not None:
            self._restore = dict(state, buckets=entries)
        else:
            self._pending = pending

    def _load_plan(self, state: Dict[str, Any]) -> Tuple[List[Dict[str, Any]], Optional[str]]:
        """load_state_dict's checks (nothing changes): the buckets as this trainer loads them, and
        the warning of a resized load (None when exact)."""
        if not isinstance(state, dict) or state.get("version") not in (1, STATE_DICT_VERSION):
            got = state.get("version") if isinstance(state, dict) else type(state).__name__
            raise SpexValueError(f"not a spex hook state_dict of version 1 or {STATE_DICT_VERSION} (got {got!r})")
        if self.generation >= 0:
            raise SpexError("load_state_dict after the first step: call it after register and before the "
                            "first forward/backward")
        mine = self._world()
        mine_c = (self.compressor, self.density, dict(self.params))
        saved_c = (state.get("compressor"), state.get("density"), state.get("params"))
        if saved_c != mine_c:
            raise SpexValueError(f"the checkpoint used compressor={saved_c[0]!r}, density={saved_c[1]!r}, "
                                 f"params={saved_c[2]!r}; this hook uses compressor={mine_c[0]!r}, "
                                 f"density={mine_c[1]!r}, params={mine_c[2]!r}")
        if state.get("momentum_correction") != self.momentum_correction:
            raise SpexValueError(f"the checkpoint used momentum_correction={state.get('momentum_correction')!r}; "
                                 f"this hook uses momentum_correction={self.momentum_correction!r}: register "
                                 f"the hook as it was when saved")
        if self.momentum_correction is not None and state.get("momentum_masking", True) != self.momentum_masking:
            raise SpexValueError(f"the checkpoint used momentum_masking={state.get('momentum_masking', True)!r}; "
                                 f"this hook uses momentum_masking={self.momentum_masking!r}: register "
                                 f"the hook as it was when saved")
        if state["version"] == 1:
            world = state.get("world")
            if world != mine:
                raise SpexValueError(f"the checkpoint (a version 1 dict: one node's state) was saved on node "
                                     f"{world.get('node_rank')} of {world.get('node_count')} with "
                                     f"{world.get('local_trainers')} trainer(s) per node; this trainer's daemon is "
                                     f"node {mine['node_rank']} of {mine['node_count']} with "
                                     f"{mine['local_trainers']}: restart with the same nodes and trainers per node "
                                     f"(and give each rank the dict it saved), or start without load_state_dict")
            entries, resized = list(state.get("buckets", [])), None
        else:
            entries, resized = self._entries_for_this_trainer(state, mine)
        for entry in entries:
            if "records" not in entry and not isinstance(entry.get("record"), (bytes, bytearray)):
                raise SpexValueError(f"bucket entry {entry.get('index')!r} of the state_dict has no record")
        return entries, resized

    def _entries_for_this_trainer(self, state: Dict[str, Any],
                                  mine: Dict[str, int]) -> Tuple[List[Dict[str, Any]], Optional[str]]:
        """A version 2 dict's buckets as this trainer loads them: on the saved world its node's
        record and its own momentum (an exact resume); on another world every old node's record
        to be added resized ("records") and the mean of the old trainers' momentum; with the
        warning of a resized load."""
        world = state.get("world") or {}
        nodes, trainers = int(world.get("node_count", 0)), int(world.get("local_trainers", 0))
        same = (nodes, trainers) == (mine["node_count"], mine["local_trainers"])
        entries = []
        for e in state.get("buckets", []):
            records, momentum = e.get("records") or {}, e.get("momentum")
            need = [mine["node_rank"]] if same else list(range(nodes))
            missing = sorted(set(need) - set(records))
            me = mine["node_rank"] * trainers + int(self.client.local_rank)
            need_u = [] if momentum is None else [me] if same else list(range(nodes * trainers))
            missing_u = sorted(set(need_u) - set(momentum or {}))
            if missing or missing_u:
                raise SpexValueError(f"the checkpoint (taken on rank {state.get('taken_on_rank')!r}) holds, of bucket "
                                     f"{e.get('index')!r}, the records of nodes {sorted(records)} of {nodes} and the "
                                     f"momentum of trainers {sorted(momentum or {})}; "
                                     f"{'this trainer' if same else 'a resize onto another world'} needs nodes "
                                     f"{need} and trainers {need_u}: load the dict state_dict returned on rank 0 "
                                     f"(it holds every node's) on every rank")
            entry = {k: v for k, v in e.items() if k not in ("records", "momentum")}
            if same:
                entry["record"] = records[mine["node_rank"]]
                if momentum is not None:
                    entry["momentum"] = momentum[me]
            else:
                entry["records"] = [records[k] for k in range(nodes)]
                if momentum is not None:
                    total = torch.stack([momentum[t].reshape(-1).double() for t in range(nodes * trainers)]).sum(0)
                    entry["momentum"] = (total / (nodes * trainers)).float()
            entries.append(entry)
        if same:
            return entries, None
        return entries, (f"spex: resuming a checkpoint of {nodes} node(s) x {trainers} trainer(s) on "
                         f"{mine['node_count']} x {mine['local_trainers']}: every node's residual is "
                         f"redistributed (the world's share of the average kept), momentum-correction buffers "
                         f"start as the old trainers' mean, and the compressors' state starts afresh; the job "
                         f"does not continue exactly (docs/checkpoint.md#another-world)")

    def _load_entry(self, b: Bucket, entry: Dict[str, Any]) -> None:
        """Gives the daemon a bucket's saved state: its record, or on another world every old
        node's record resized (by local rank 0 only: each residual is added once per node)."""
        if "records" in entry:
            if int(self.client.local_rank) == 0:
                for record in entry["records"]:
                    self.client.load_bucket_state(b, record, resize=True)
        else:
            self.client.load_bucket_state(b, entry["record"])

    def _restore_layout(self, state: Dict[str, Any]) -> None:
        """The first iteration of a resumed job: registers the saved buckets (their ids and
        parameters), loads their records and momentum, and maps DDP's buckets onto them."""
        entries = sorted(state.get("buckets", []), key=lambda e: int(e["index"]))
        self.generation = max(int(state.get("generation", 0)), 0)
        if not entries:  # saved before the first step: nothing to restore
            self.generation -= 1
            self._new_generation()
            return
        params = list(self.ddp.parameters())
        where: Dict[int, Tuple[int, int, int]] = {}
        for e in entries:
            offset = 0
            for i in e["params"]:
                if not isinstance(i, int) or not 0 <= i < len(params) or i in where:
                    raise SpexError(f"the checkpoint's bucket {e['index']} holds parameter {i}, which this model "
                                    f"{'has twice' if i in where else 'does not have'} ({len(params)} parameters): "
                                    f"the model differs from the saved one")
                where[i] = (int(e["index"]), offset, params[i].numel())
                offset += params[i].numel()
            if offset != e["elements"]:
                raise SpexError(f"the checkpoint's bucket {e['index']} held {e['elements']} elements, this model's "
                                f"parameters {list(e['params'])} have {offset}: the model differs from the saved one")
        trained = {i for i, p in enumerate(params) if p.requires_grad}
        if set(where) != trained:
            raise SpexError(f"this model trains parameters {sorted(trained - set(where))} that the checkpoint does "
                            f"not hold, and the checkpoint holds {sorted(set(where) - trained)} that it does not "
                            f"train: the model differs from the saved one")
        for e in entries:
            j, key = int(e["index"]), list(e["params"])
            mine = [params[i] for i in key]
            dtypes = sorted({str(p.dtype) for p in mine})
            if len(dtypes) != 1:
                raise SpexTypeError(f"the checkpoint's bucket {j} holds parameters of types {', '.join(dtypes)}: "
                                    f"spex buckets hold one type; convert the model to one type")
            where_dev = mine[0].device
            bucket_id = self.id_base + int(e.get("id", self.generation * GENERATION_STRIDE + j))
            b = self.client.register_bucket(bucket_id, e["elements"], self.compressor, self.density, self.params,
                                            dtype=mine[0].dtype,
                                            cuda_device=where_dev.index if where_dev.type == "cuda" else None)
            self._buckets[j] = b
            self._layout[j] = key
            if self.momentum_correction is not None:
                if getattr(b, "compressor", None) == "dense":
                    raise SpexValueError(f"momentum_correction needs a sparse compressor, but spexd runs bucket {j} "
                                         f"dense (its default compressor): pass compressor= (e.g. 'micro'), or drop "
                                         f"momentum_correction and use the optimiser's momentum")
                u = e.get("momentum")
                if u is None or u.numel() != b.elements:
                    raise SpexError(f"bucket {j}: the checkpoint has no momentum of {b.elements} elements for "
                                    f"momentum_correction")
                self._u[j] = u.reshape(-1).to(device=where_dev, dtype=torch.float32, copy=True)
            self._load_entry(b, e)
        self._where = where
        self._mapped = True
        self._keep = bool(state.get("settled", False))
        if not self._keep and not self._settled_ddp():
            warnings.warn("spex: this checkpoint was saved before DDP rebuilt its buckets (after the job's first "
                          "step); the job it came from ran its next step on the rebuilt layout, which this DDP "
                          "learns only in this iteration, so the resumed job does not continue exactly. Checkpoint "
                          "after the second step or later (docs/checkpoint.md)", RuntimeWarning, stacklevel=2)

    def _apply_pending(self, index: int, b: Bucket, grad_bucket: Any) -> None:
        entry = self._pending.pop(index, None)
        key = self._layout[index]
        if entry is None:
            raise SpexError(f"DDP bucket {index} ({b.elements} elements) has no state in the checkpoint (it saved "
                            f"buckets {sorted(self._pending) or 'none'} besides): the bucket layout differs from "
                            f"when it was saved")
        if entry["elements"] != b.elements or list(entry["params"]) != list(key):
            raise SpexError(f"DDP bucket {index} holds parameters {list(key)} ({b.elements} elements), the "
                            f"checkpoint's bucket {index} held {list(entry['params'])} ({entry['elements']} elements): "
                            f"the bucket layout differs from when it was saved. Pass the DDP model to "
                            f"SpexHookState(ddp=...) (spex.torch.register does): the hook then maps the checkpoint "
                            f"onto DDP's buckets per parameter")
        self._load_entry(b, entry)
        if index in self._u:
            u = entry.get("momentum")
            if u is None or u.numel() != b.elements:
                raise SpexError(f"DDP bucket {index}: the checkpoint has no momentum of {b.elements} elements for "
                                f"momentum_correction")
            self._u[index].copy_(u.reshape(-1))

    # -- observability and shutdown -------------------------------------------------------------

    def pop_timings(self) -> List[Tuple[int, int, int, float]]:
        """(bucket id, elements, step, seconds from submit to result) of every exchange since
        the last call."""
        with self._timings_lock:
            out, self._timings = self._timings, []
        return out

    @property
    def buckets(self) -> List[Bucket]:
        """The current generation's buckets, in DDP's bucket order."""
        return [self._buckets[i] for i in sorted(self._buckets)]

    def stats(self) -> Any:
        """The daemon's GetStats response."""
        return self.client.stats()

    def achieved_density(self) -> Optional[float]:
        """Element-weighted achieved density of the last exchange of this state's current
        buckets, from GetStats (None before the first exchange)."""
        ids = {b.id for b in self._buckets.values()}
        num = den = 0.0
        for s in self.client.stats().buckets:
            if s.bucket_id in ids and s.exchanges:
                num += s.last.achieved_density * s.elements
                den += s.elements
        return num / den if den else None

    def exchange_report(self, wait_s: float = 0.05) -> List[Dict[str, Any]]:
        """Per current bucket, what the daemon did at its last exchange (from GetStats): id,
        elements, compressor, pattern ("A"/"B" sparse, "D" dense), achieved density (this node's
        selection / elements), gathered density (what every node received / elements), and
        `dense` with `why` when a sparse compressor's bucket went dense: the daemon's
        --dense_fallback=auto probe (fell_back_to_dense), or pattern D without a fallback, which
        is a bucket under the daemon's --min_sparse_elements (always dense).

        The daemon records an exchange's stats just after publishing its result, so this waits
        up to `wait_s` seconds for the stats of every bucket's latest step this trainer saw
        completed (then reports what is there; a bucket's `step` says which step it is)."""
        want = {b.id: b.next_step - 1 for b in self._buckets.values()}
        deadline = time.monotonic() + wait_s
        while True:
            got = [s for s in self.client.stats().buckets if s.bucket_id in want and s.exchanges]
            if (all(s.last.step >= want[s.bucket_id] for s in got) and len(got) == sum(v >= 0 for v in want.values())
                    or time.monotonic() >= deadline):
                break
            time.sleep(0.0005)
        out = []
        for s in got:
            last = s.last
            sparse_asked = s.compressor != "dense"
            dense = sparse_asked and (last.fell_back_to_dense or last.pattern == "D")
            why = ""
            if dense and last.fell_back_to_dense:
                why = ("the daemon's dense fallback (--dense_fallback=auto) exchanged it dense: its probe "
                       "alternates sparse and dense for the first steps, then keeps dense when that was faster")
            elif dense:
                why = (f"{s.elements} elements is under the daemon's --min_sparse_elements: small buckets are "
                       f"always exchanged dense")
            out.append({"bucket_id": s.bucket_id, "elements": s.elements, "compressor": s.compressor,
                        "step": last.step, "pattern": last.pattern, "achieved_density": last.achieved_density,
                        "gathered_density": last.gathered_elements / s.elements if s.elements else 0.0,
                        "dense": dense, "why": why})
        return out

    def set_density(self, density: float) -> int:
        """Changes the target density of every sparse bucket of the daemons at run time (all
        nodes switch at the same step); returns the daemon's change counter."""
        return self.client.set_density(density)

    def close(self) -> None:
        """Stops the worker thread and closes the client if this state opened it."""
        if getattr(self, "_closed", True):
            if self._own_client and hasattr(self, "client"):
                self.client.close()
            return
        self._closed = True
        self._queue.put(None)
        self._worker.join(timeout=10)
        if self._own_client:
            self.client.close()


def hook(state: SpexHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The DDP communication hook: `ddp.register_comm_hook(state, spex.torch.hook)`. (DDP checks
    this signature: the parameter must be named `bucket`, annotated as dist.GradBucket.)"""
    return state(bucket)


def register(ddp: torch.nn.parallel.DistributedDataParallel, *, compressor: Optional[str] = None,
             density: Optional[float] = None, socket: Optional[str] = None, **kwargs: Any) -> SpexHookState:
    """Registers the spex hook on `ddp` and returns its state (call state.close() at the end).
    Other keyword arguments go to SpexHookState (local_rank, local_size, job, mode, params, ...)."""
    state = SpexHookState(ddp, compressor=compressor, density=density, socket=socket, **kwargs)
    ddp.register_comm_hook(state, hook)
    return state


def half_ddp(module: torch.nn.Module, **ddp_kwargs: Any) -> torch.nn.parallel.DistributedDataParallel:
    """DistributedDataParallel around a bfloat16/float16 `module` on a gloo process group, for
    the spex hook (docs/dtypes.md). torch 1.13's DDP broadcasts rank 0's parameters when it is
    built, and gloo cannot broadcast bfloat16 ("Invalid scalar type"); this builds DDP without
    that broadcast and instead checks that every rank holds the same parameters and buffers
    (SpexValueError naming the first rank that differs: seed every rank alike, e.g.
    torch.manual_seed(0) before building the model, or load the same checkpoint). Buffers are
    not broadcast before each forward either (broadcast_buffers=False unless given). Every rank
    must call it (it all-gathers a digest). Register the spex hook on the result as usual."""
    import hashlib

    from torch.nn.parallel import distributed as ddp_module

    group = ddp_kwargs.get("process_group")
    h = hashlib.sha1()
    for t in list(module.parameters()) + list(module.buffers()):
        d = t.detach().cpu().contiguous()
        if d.dtype == torch.bfloat16:
            d = d.view(torch.int16)
        h.update(str(tuple(d.shape)).encode())
        h.update(d.numpy().tobytes())
    world = dist.get_world_size(group)
    digests: List[Any] = [None] * world
    dist.all_gather_object(digests, h.hexdigest(), group=group)
    for r, d in enumerate(digests):
        if d != digests[0]:
            raise SpexValueError(f"rank {r}'s initial parameters differ from rank 0's: half_ddp does not broadcast "
                                 f"them (gloo cannot broadcast bfloat16); seed every rank alike "
                                 f"(torch.manual_seed) before building the model, or load the same checkpoint")
    ddp_kwargs.setdefault("broadcast_buffers", False)
    saved = ddp_module._sync_module_states
    ddp_module._sync_module_states = lambda **_: None  # checked equal above
    try:
        return torch.nn.parallel.DistributedDataParallel(module, **ddp_kwargs)
    finally:
        ddp_module._sync_module_states = saved


__all__ = ["SpexHookState", "hook", "register", "half_ddp", "GENERATION_STRIDE"]
