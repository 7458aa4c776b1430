"""Tests of the Python client's device buckets (spex.Client(device="cuda"), spex.cuda, the DDP
hook on CUDA buckets) without a GPU: torch here is a CPU-only build and no machine of the project
has a GPU. The CUDA runtime is the fake of fake_cuda.py (device memory = host memory, tensors
that report cuda:N), and the daemon is a fake spex.v1 server that serves CUDA buffers the way
spexd --device=cuda does (the real spexd serves them only with a GPU). Also: the real spexd on
this machine refusing a CUDA client, and the real libcudart runtime saying why it cannot work
here. Nothing here ran on a GPU."""

import os
import unittest
from typing import Any, List

import numpy as np
import torch

import spex
import spex.torch
from spex import cuda
from spex import layout as L
from spex.proto import spex_pb2 as pb
from spex_test_util import ClusterTestCase, run_threads

from fake_cuda import FakeCudaDaemon, FakeCudaRuntime, FakeGpu, fake_cuda_tensor


class FakeParam:
    """A DDP bucket's parameter as the hook sees it: its identity, its data type (the hook
    refuses a bucket mixing types) and its size (the checkpoint's layout key)."""

    dtype = torch.float32

    def __init__(self, elements: int = 1):
        self.elements = elements

    def numel(self) -> int:
        return self.elements


TRAINERS = 2
ORDINAL = 3


def descriptor(**change: Any) -> Any:
    """A valid CudaIpcDescriptor for 2 trainers (3 events), with fields replaced by `change`."""
    fields = dict(mem_handle=bytes(range(1, 65)), event_handles=[bytes([e]) * 64 for e in range(1, 4)],
                  size=L.device_bucket_bytes(1000, 2), device_ordinal=ORDINAL)
    fields.update(change)
    return pb.CudaIpcDescriptor(**fields)


class DescriptorTest(unittest.TestCase):
    def test_valid_descriptor_decodes(self):
        h = cuda.decode_descriptor(descriptor())
        self.assertEqual(h.memory, bytes(range(1, 65)))
        self.assertEqual(len(h.events), 3)
        self.assertEqual(h.size, L.device_bucket_bytes(1000, 2))
        self.assertEqual(h.device, ORDINAL)

    def test_bad_handle_lengths_name_the_field(self):
        with self.assertRaisesRegex(spex.SpexValueError, r"mem_handle has 63 bytes; a CUDA IPC handle has 64"):
            cuda.decode_descriptor(descriptor(mem_handle=bytes(range(1, 64))))
        events = [bytes(64), bytes(65), bytes(64)]
        with self.assertRaisesRegex(spex.SpexValueError, r"event_handles\[1\] has 65 bytes"):
            cuda.decode_descriptor(descriptor(event_handles=events))

    def test_zero_handle_no_events_size_and_device_are_refused(self):
        cases = [
            (dict(mem_handle=bytes(64)), "mem_handle is all zeros"),
            (dict(event_handles=[]), "event_handles has 0 handles"),
            (dict(event_handles=[b"e" * 64] * (L.MAX_LOCAL_TRAINERS + 2)), "1 to 33"),
            (dict(size=0), "size is 0"),
            (dict(device_ordinal=-1), "device_ordinal -1 is negative"),
        ]
        for change, message in cases:
            with self.subTest(change=list(change)):
                with self.assertRaises(spex.SpexValueError) as cm:
                    cuda.decode_descriptor(descriptor(**change))
                self.assertIn(message, str(cm.exception))

    def test_cache_refuses_other_kinds_and_stale_descriptors_without_opening(self):
        gpu = FakeGpu(ORDINAL)
        rt = FakeCudaRuntime(gpu)
        cache = cuda.IpcHandleCache(rt)
        with self.assertRaisesRegex(spex.SpexValueError, "not CUDA IPC"):
            cache.attach(pb.BufferDescriptor(shm=pb.ShmDescriptor(name="/x", size=4096)))
        a = gpu.allocate(L.device_bucket_bytes(10, 2), 3)
        good = pb.BufferDescriptor(cuda_ipc=pb.CudaIpcDescriptor(
            mem_handle=a.memory_handle, event_handles=a.event_handles, size=a.nbytes, device_ordinal=ORDINAL))
        m = cache.attach(good)
        self.assertIs(cache.attach(good), m)  # reused, one more user
        self.assertEqual((rt.memory_opens, rt.event_opens, m.users), (1, 3, 2))
        stale = pb.BufferDescriptor()
        stale.CopyFrom(good)
        stale.cuda_ipc.size = a.nbytes - 4096
        with self.assertRaisesRegex(spex.SpexError, "already open with a different size"):
            cache.attach(stale)
        self.assertEqual((rt.memory_opens, rt.event_opens), (1, 3))
        self.assertFalse(cache.release(m))
        self.assertTrue(cache.release(m))
        self.assertEqual((rt.memory_closes, rt.event_closes, cache.open_count), (1, 3, 0))
        with self.assertRaisesRegex(spex.SpexError, "closed"):
            cache.record(m, 0, 0)

    def test_device_layout_offsets(self):
        self.assertEqual(L.device_input_offset(1025, 0), 0)
        self.assertEqual(L.device_input_offset(1025, 1), 8192)
        self.assertEqual(L.device_output_offset(1025, 2), 2 * 8192)
        self.assertEqual(L.device_bucket_bytes(1025, 2), 3 * 8192)

    def test_stream_arguments(self):
        class Stream:
            cuda_stream = 0x55

        self.assertIsNone(cuda.stream_handle(None))
        self.assertEqual(cuda.stream_handle(7), 7)
        self.assertEqual(cuda.stream_handle(Stream()), 0x55)
        with self.assertRaisesRegex(spex.SpexTypeError, "torch.cuda.Stream"):
            cuda.stream_handle("default")


class TorchViewTest(unittest.TestCase):
    """The CUDA Array Interface that CudartRuntime.tensor hands torch must be one torch's parser
    accepts. torch checks its fields before it needs CUDA, so this CPU-only build shows it: the
    view gets as far as initialising CUDA. (On an H200 the first version, which flagged the output
    view read-only, failed every device exchange with "the read only flag is not supported".)"""

    def test_torch_parses_the_interface_up_to_cuda(self):
        view = cuda._CudaArrayView(0x1000, 4)
        self.assertEqual(view.__cuda_array_interface__["data"], (0x1000, False))
        try:
            t = torch.as_tensor(view, device=torch.device("cuda", 0))
        except TypeError as e:  # a field torch refuses: the bug this guards
            self.fail(f"torch refused the CUDA Array Interface: {e}")
        except (RuntimeError, AssertionError) as e:  # this torch has no CUDA: expected here
            self.assertRegex(str(e), "(?i)cuda")
        else:  # a CUDA build: a view of the pointer, no copy
            self.assertEqual(t.data_ptr(), 0x1000)

    def test_half_typestrs_parse_up_to_cuda(self):
        """The typestrs of half buckets' views (float16 <f2, bfloat16 <i2 viewed as bfloat16):
        torch accepts them, and a CPU array of each type views as the bucket's type."""
        for dtype, want in (("float16", torch.float16), ("bfloat16", torch.int16)):
            view = cuda._CudaArrayView(0x2000, 8, cuda._TYPESTRS[dtype])
            try:
                torch.as_tensor(view, device=torch.device("cuda", 0))
            except TypeError as e:
                self.fail(f"torch refused the {dtype} CUDA Array Interface: {e}")
            except (RuntimeError, AssertionError) as e:
                self.assertRegex(str(e), "(?i)cuda")
            host = np.zeros(8, dtype=np.dtype(cuda._TYPESTRS[dtype]))
            self.assertEqual(torch.from_numpy(host).dtype, want)
        self.assertEqual(torch.zeros(8, dtype=torch.int16).view(torch.bfloat16).dtype, torch.bfloat16)


class RealRuntimeHereTest(unittest.TestCase):
    """libcudart through ctypes on this GPU-less machine: it loads (or says clearly why not) and
    every call says why it cannot work."""

    def test_missing_library_is_a_clear_error(self):
        with self.assertRaises(spex.CudaRuntimeError) as cm:
            cuda.CudartRuntime("/nonexistent/libcudart.so.99")
        for part in ("cannot load the CUDA runtime library", "/nonexistent/libcudart.so.99", "$SPEX_CUDART",
                     "device='cpu'"):
            self.assertIn(part, str(cm.exception))

    def test_environment_override_is_the_only_candidate(self):
        old = os.environ.get(cuda.CUDART_ENV)
        os.environ[cuda.CUDART_ENV] = "/opt/x/libcudart.so.12"
        try:
            self.assertEqual(cuda.cudart_candidates(), ["/opt/x/libcudart.so.12"])
        finally:
            if old is None:
                del os.environ[cuda.CUDART_ENV]
            else:
                os.environ[cuda.CUDART_ENV] = old

    def test_real_calls_say_why_they_fail_here(self):
        try:
            rt = cuda.CudartRuntime()
        except spex.CudaRuntimeError as e:  # no CUDA runtime installed: that error must be clear
            self.assertIn("cannot load the CUDA runtime library", str(e))
            return
        with self.assertRaises(spex.CudaRuntimeError) as cm:
            rt.open_memory(bytes(range(1, 65)), 0)
        msg = str(cm.exception)
        self.assertRegex(msg, r"^(cudaSetDevice\(0\)|cudaIpcOpenMemHandle): ")
        self.assertIn("cudaError", msg)  # the CUDA error's name, e.g. cudaErrorInsufficientDriver
        with self.assertRaises(spex.CudaRuntimeError) as cm:
            rt.wait_event(0x1000, 0, 0)
        self.assertIn("cudaError", str(cm.exception))
        if torch.version.cuda is None:
            with self.assertRaisesRegex(spex.CudaRuntimeError, "built without CUDA"):
                rt.current_stream(0)
            with self.assertRaisesRegex(spex.CudaRuntimeError, "built without CUDA"):
                rt.tensor(0x1000, 4, 0, True)


class FakeDaemonCase(unittest.TestCase):
    """A FakeCudaDaemon on a FakeGpu per case, and helpers to connect trainers to it."""

    mutate = None

    def setUp(self):
        self.gpu = FakeGpu(ORDINAL)
        self.daemon = FakeCudaDaemon(self.gpu, trainers=TRAINERS, mutate=self.mutate).start()
        self.addCleanup(self.daemon.stop)

    def connect(self, rank: int, runtime: Any = None, **kw: Any) -> spex.Client:
        """A device='cuda' client of the fake daemon with `runtime` (default: a new fake one; none
        when an ipc_cache is given, whose runtime it takes)."""
        if "ipc_cache" not in kw:
            kw["cuda_runtime"] = runtime or FakeCudaRuntime(self.gpu)
        c = spex.Client(self.daemon.socket, local_rank=rank, local_size=TRAINERS, device="cuda",
                        exchange_timeout=20, **kw)
        self.addCleanup(c.close)
        return c


def values(rank: int, step: int, bucket: int, n: int) -> np.ndarray:
    """Small integers: every average of 2 trainers is exact in float32."""
    return ((np.arange(n) % 97) * (rank + 1) + 3 * step + bucket - 40).astype(np.float32)


def expected(step: int, bucket: int, n: int) -> np.ndarray:
    return np.mean([values(r, step, bucket, n) for r in range(TRAINERS)], axis=0).astype(np.float32)


class DeviceBucketTest(FakeDaemonCase):
    def test_hello_asks_for_cuda_and_buckets_are_views_of_the_ipc_buffer(self):
        clients = [self.connect(r) for r in range(TRAINERS)]
        self.assertEqual([h.device for h in self.daemon.hellos], [pb.DEVICE_CUDA] * TRAINERS)
        n = 3000
        buckets = [c.register_bucket(7, n) for c in clients]
        a = self.daemon.bucket_allocation(7)
        for rank, b in enumerate(buckets):
            self.assertTrue(b.on_device)
            self.assertEqual(b.cuda_device, ORDINAL)
            self.assertIn("cuda_device=3", repr(b))
            self.assertEqual(b.input_tensor.device, torch.device("cuda", ORDINAL))
            self.assertEqual(b.input_tensor.dtype, torch.float32)
            self.assertEqual(b.input_tensor.numel(), n)
            self.assertEqual(b.input_tensor.data_ptr(), a.base + L.device_input_offset(n, rank))
            self.assertEqual(b.output_tensor.data_ptr(), a.base + L.device_output_offset(n, TRAINERS))
            self.assertIs(b.input_tensor, b.input_tensor)  # made once
            with self.assertRaisesRegex(spex.SpexTypeError, "lives in GPU memory.*input_tensor"):
                b.input
            with self.assertRaisesRegex(spex.SpexTypeError, "lives in GPU memory.*output_tensor"):
                b.output
        # Writing through the tensor writes the fake device memory of this trainer's slot only.
        buckets[1].input_tensor.fill_(2.5)
        self.assertTrue(np.all(a.floats(L.device_input_offset(n, 1), n) == 2.5))
        self.assertTrue(np.all(a.floats(L.device_input_offset(n, 0), n) == 0))

    def test_handle_cache_opens_each_bucket_once_and_closes_on_unregister_and_close(self):
        rt = FakeCudaRuntime(self.gpu)
        peer = self.connect(1)
        c = self.connect(0, rt)
        sizes = {0: 1, 1: 1000, 2: 5000}
        mine = {i: c.register_bucket(i, n) for i, n in sizes.items()}
        theirs = {i: peer.register_bucket(i, n) for i, n in sizes.items()}
        for step in range(4):
            for i, n in sizes.items():
                mode = ("doorbell", "rpc")[step % 2]
                got = run_threads([lambda b=mine[i]: c.exchange(b, fake_cuda_tensor(values(0, step, i, n), ORDINAL),
                                                                mode=mode),
                                   lambda b=theirs[i]: peer.exchange(b, fake_cuda_tensor(values(1, step, i, n),
                                                                                         ORDINAL), mode=mode)])
                for g in got:
                    self.assertNotIsInstance(g, BaseException, repr(g))
        # One cudaIpcOpenMemHandle per bucket, one per event (2 inputs + output), none per step.
        self.assertEqual((rt.memory_opens, rt.event_opens), (3, 3 * (TRAINERS + 1)))
        self.assertEqual(c.ipc_cache.open_count, 3)
        c.unregister_bucket(mine[1])
        self.assertEqual((rt.memory_closes, rt.event_closes), (1, TRAINERS + 1))
        self.assertEqual(c.ipc_cache.open_count, 2)
        with self.assertRaisesRegex(spex.SpexError, "unregistered"):
            mine[1].input_tensor
        c.close()
        self.assertEqual((rt.memory_closes, rt.event_closes), (3, 3 * (TRAINERS + 1)))
        self.assertEqual(c.ipc_cache.open_count, 0)
        c.close()  # twice is fine
        self.assertEqual(rt.memory_closes, 3)

    def test_a_shared_cache_opens_once_per_process(self):
        rt = FakeCudaRuntime(self.gpu)
        cache = cuda.IpcHandleCache(rt)
        c0, c1 = self.connect(0, ipc_cache=cache), self.connect(1, ipc_cache=cache)
        b0, b1 = c0.register_bucket(4, 100), c1.register_bucket(4, 100)
        self.assertNotEqual(b0.input_tensor.data_ptr(), b1.input_tensor.data_ptr())
        self.assertEqual(b0.output_tensor.data_ptr(), b1.output_tensor.data_ptr())
        self.assertEqual((rt.memory_opens, cache.open_count), (1, 1))
        c0.close()
        self.assertEqual((rt.memory_closes, cache.open_count), (0, 1))  # c1 still uses it
        c1.close()
        self.assertEqual((rt.memory_closes, rt.event_closes, cache.open_count), (1, TRAINERS + 1, 0))
        with self.assertRaisesRegex(spex.SpexValueError, "another CUDA runtime"):
            spex.Client(self.daemon.socket, device="cuda", cuda_runtime=FakeCudaRuntime(self.gpu), ipc_cache=cache)

    def test_exact_averages_through_both_paths(self):
        sizes = [1, 1000, 4097]
        runtimes = [FakeCudaRuntime(self.gpu) for _ in range(TRAINERS)]
        clients = [self.connect(r, runtimes[r]) for r in range(TRAINERS)]

        def trainer(rank: int) -> List[Any]:
            c = clients[rank]
            buckets = [c.register_bucket(10 + i, n) for i, n in enumerate(sizes)]
            bad = []
            for step in range(6):
                mode = "rpc" if step % 3 == 2 else "doorbell"
                for i, b in enumerate(buckets):
                    out = c.exchange(b, fake_cuda_tensor(values(rank, step, i, sizes[i]), ORDINAL), mode=mode)
                    if out is not b.output_tensor or out.device.type != "cuda":
                        bad.append(f"exchange returned {type(out).__name__} on {out.device}, not the output tensor")
                    want = expected(step, i, sizes[i])
                    if not np.array_equal(out.numpy(), want):
                        bad.append(f"rank {rank} bucket {i} step {step} {mode}: {out.numpy()[:4]} != {want[:4]}")
                    if b.next_step != step + 1:
                        bad.append(f"next_step {b.next_step} after step {step}")
            return bad

        for r in run_threads([lambda r=r: trainer(r) for r in range(TRAINERS)], timeout=60):
            self.assertEqual(r, [])
        self.assertEqual(len(self.gpu.entries("publish")), 6 * len(sizes))
        self.assertTrue(all(e[4] == 0 for e in self.gpu.entries("publish")))

    def _ordering(self, mode: str) -> None:
        runtimes = [FakeCudaRuntime(self.gpu) for _ in range(TRAINERS)]
        clients = [self.connect(r, runtimes[r]) for r in range(TRAINERS)]
        n, steps = 500, 4

        class Stream:
            def __init__(self, handle: int):
                self.cuda_stream = handle

        def trainer(rank: int) -> None:
            runtimes[rank].set_stream(100 + rank)  # this thread's current torch stream
            c = clients[rank]
            b = c.register_bucket(1, n)
            for step in range(steps):
                b.write(fake_cuda_tensor(values(rank, step, 1, n), ORDINAL))
                explicit = Stream(200 + rank) if step == steps - 1 else None  # the stream argument wins
                c.exchange(b, mode=mode, stream=explicit)

        for r in run_threads([lambda r=r: trainer(r) for r in range(TRAINERS)], timeout=60):
            self.assertIsNone(r)
        log = self.gpu.entries()
        publishes = [i for i, e in enumerate(log) if e[0] == "publish"]
        self.assertEqual(len(publishes), steps)
        for rank in range(TRAINERS):
            records = [(i, e) for i, e in enumerate(log) if e[0] == "record" and e[2] == rank]
            waits = [(i, e) for i, e in enumerate(log) if e[0] == "wait" and e[3] in (100 + rank, 200 + rank)]
            self.assertEqual(len(records), steps, f"rank {rank}: one input event record per exchange")
            self.assertEqual(len(waits), steps, f"rank {rank}: one output event wait per exchange")
            for step in range(steps):
                stream = 200 + rank if step == steps - 1 else 100 + rank
                (ri, rec), (wi, wait) = records[step], waits[step]
                # The input event is recorded on the trainer's stream before its input is marked
                # ready (ready[rank] still says the previous step), the step is published after it,
                # and the output event (index = trainers) is waited on after the publish.
                self.assertEqual(rec[3:], (stream, step), f"rank {rank} step {step} record {rec}")
                self.assertEqual(wait[2:], (TRAINERS, stream, step + 1), f"rank {rank} step {step} wait {wait}")
                self.assertLess(ri, publishes[step])
                self.assertGreater(wi, publishes[step])
        self.assertTrue(all(e[4] == 0 for e in self.gpu.entries("publish")), "an input event was not recorded")

    def test_event_order_around_doorbell_exchanges(self):
        self._ordering("doorbell")

    def test_event_order_around_rpc_exchanges(self):
        self._ordering("rpc")

    def test_half_buckets_are_half_views_with_averages_rounded_once(self):
        """bfloat16 and float16 device buckets (docs/dtypes.md): 2-byte slots in the IPC buffer,
        the header's dtype, tensors of the bucket's type over the device memory, and the average
        of the widened inputs rounded once to the type, through both signalling paths."""
        for dtype in (torch.bfloat16, torch.float16):
            name = str(dtype).replace("torch.", "")
            with self.subTest(dtype=name):
                runtimes = [FakeCudaRuntime(self.gpu) for _ in range(TRAINERS)]
                clients = [self.connect(r, runtimes[r]) for r in range(TRAINERS)]
                n, bid = 3001, 40 + (dtype == torch.float16)
                buckets = [c.register_bucket(bid, n, dtype=dtype) for c in clients]
                a = self.daemon.bucket_allocation(bid)
                self.assertEqual(a.nbytes, L.device_bucket_bytes(n, TRAINERS, 2))
                for rank, b in enumerate(buckets):
                    self.assertEqual(b.dtype, name)
                    self.assertEqual(b.input_tensor.dtype, dtype)
                    self.assertEqual(b.output_tensor.dtype, dtype)
                    self.assertEqual(b.input_tensor.device, torch.device("cuda", ORDINAL))
                    self.assertEqual(b.input_tensor.data_ptr(), a.base + L.device_input_offset(n, rank, 2))
                    self.assertEqual(b.output_tensor.data_ptr(), a.base + L.device_output_offset(n, TRAINERS, 2))
                    with self.assertRaisesRegex(spex.SpexTypeError, f"holds {name}; got a tensor of torch.float32"):
                        b.write(fake_cuda_tensor(np.zeros(n, np.float32), ORDINAL))

                def trainer(rank: int) -> List[str]:
                    bad = []
                    for step in range(3):
                        grads = torch.from_numpy(values(rank, step, 5, n) / 7).to(dtype)
                        out = clients[rank].exchange(buckets[rank], grads.as_subclass(type(buckets[rank].input_tensor)),
                                                     mode="rpc" if step == 2 else "doorbell")
                        widened = [torch.from_numpy(values(r, step, 5, n) / 7).to(dtype).float()
                                   for r in range(TRAINERS)]
                        want = ((widened[0] + widened[1]) * 0.5).to(dtype)
                        got = torch.Tensor(out.float())
                        if out is not buckets[rank].output_tensor or not torch.equal(got, want.float()):
                            bad.append(f"rank {rank} step {step}: {got[:4].tolist()} != {want[:4].float().tolist()}")
                    return bad

                for r in run_threads([lambda r=r: trainer(r) for r in range(TRAINERS)], timeout=60):
                    self.assertEqual(r, [])

    def test_write_takes_cuda_float32_tensors_of_the_bucket_size_only(self):
        c = self.connect(0)
        self.connect(1)
        b = c.register_bucket(2, 10)
        b.write(fake_cuda_tensor(np.arange(10, dtype=np.float32).reshape(2, 5), ORDINAL))
        self.assertEqual(b.input_tensor.tolist(), list(range(10)))
        with self.assertRaises(spex.SpexTypeError) as cm:
            b.write(torch.zeros(10))
        self.assertIn("lives in GPU memory (cuda:3", str(cm.exception))
        self.assertIn(".to('cuda:3')", str(cm.exception))
        with self.assertRaisesRegex(spex.SpexTypeError, r"numpy array.*torch.from_numpy\(a\).to\('cuda:3'\)"):
            b.write(np.zeros(10, np.float32))
        with self.assertRaisesRegex(spex.SpexTypeError, "float64"):
            b.write(fake_cuda_tensor(np.zeros(10), ORDINAL))
        with self.assertRaisesRegex(spex.SpexValueError, "registered with 10 elements"):
            b.write(fake_cuda_tensor(np.zeros(11, np.float32), ORDINAL))

    def test_client_argument_checks(self):
        with self.assertRaisesRegex(spex.SpexValueError, "device must be one of"):
            spex.Client(self.daemon.socket, device="gpu")
        with self.assertRaisesRegex(spex.SpexValueError, "for device='cuda' clients"):
            spex.Client(self.daemon.socket, device="cpu", cuda_runtime=FakeCudaRuntime(self.gpu))

    def test_a_host_client_is_told_to_ask_for_cuda(self):
        with self.assertRaises(spex.SpexError) as cm:
            spex.Client(self.daemon.socket, local_rank=0, local_size=TRAINERS)
        self.assertIn("serves CUDA buffers", str(cm.exception))
        self.assertIn("pass device='cuda' to spex.Client", str(cm.exception))
        self.assertEqual(cm.exception.code, "FAILED_PRECONDITION")

    def test_open_failures_name_the_bucket_and_leave_nothing_open(self):
        rt = FakeCudaRuntime(self.gpu)
        rt.fail_event_open = 2
        c = self.connect(0, rt)
        with self.assertRaises(spex.CudaRuntimeError) as cm:
            c.register_bucket(5, 100)
        self.assertIn("bucket 5: cudaIpcOpenEventHandle", str(cm.exception))
        self.assertEqual((rt.memory_opens, rt.memory_closes, rt.event_closes), (1, 1, 1))
        self.assertEqual(c.ipc_cache.open_count, 0)
        self.assertEqual(self.daemon.unregistered, [5])  # the daemon does not wait for this trainer
        self.assertEqual(c.buckets, [])
        c.register_bucket(5, 100)  # the next attempt opens fine
        self.assertEqual(c.ipc_cache.open_count, 1)

    def test_the_real_runtime_here_fails_clearly(self):
        try:
            c = spex.Client(self.daemon.socket, local_rank=0, local_size=TRAINERS, device="cuda")
        except spex.CudaRuntimeError as e:  # no libcudart on this machine
            self.assertIn("cannot load the CUDA runtime library", str(e))
            return
        self.addCleanup(c.close)
        self.assertIsInstance(c.cuda_runtime, cuda.CudartRuntime)
        with self.assertRaises(spex.CudaRuntimeError) as cm:
            c.register_bucket(9, 100)
        self.assertRegex(str(cm.exception), r"^bucket 9: (cudaSetDevice\(3\)|cudaIpcOpenMemHandle): .*cudaError")
        self.assertEqual(self.daemon.unregistered, [9])


class MismatchedRepliesTest(FakeDaemonCase):
    """RegisterBucket replies that do not fit what the client asked for, or do not fit at all."""

    def _refused(self, mutate: Any, contains: str, exc: type = spex.SpexError) -> None:
        self.daemon.mutate = mutate
        rt = FakeCudaRuntime(self.gpu)
        c = self.connect(0, rt)
        with self.assertRaises(exc) as cm:
            c.register_bucket(3, 1000)
        self.assertIn(contains, str(cm.exception))
        self.assertEqual((rt.memory_opens, rt.event_opens), (rt.memory_closes, rt.event_closes))
        self.assertEqual(c.ipc_cache.open_count, 0)
        self.assertEqual(self.daemon.unregistered, [3])

    def test_a_host_reply_to_a_cuda_client(self):
        self._refused(lambda r: r.ClearField("device_buffer"),
                      "asked for CUDA buffers (device='cuda') but spexd described a host buffer; start spexd with "
                      "--device=cuda")

    def test_events_other_than_one_per_trainer_plus_the_output(self):
        self._refused(lambda r: r.device_buffer.cuda_ipc.event_handles.pop(), "has 2 IPC events; expected one per "
                                                                                "local trainer plus the output (3)")

    def test_a_device_layout_past_the_buffer(self):
        def past(r: Any) -> None:
            r.device_layout.output_offset = r.device_buffer.cuda_ipc.size - 4

        self._refused(past, "device layout that does not fit its buffer")

    def test_a_malformed_descriptor_names_the_field(self):
        def short(r: Any) -> None:
            r.device_buffer.cuda_ipc.mem_handle = b"x" * 10

        self._refused(short, "bucket 3: CUDA IPC descriptor: mem_handle has 10 bytes", spex.SpexValueError)


class FakeGradBucket:
    """What the hook reads of dist.GradBucket: index(), buffer(), parameters()."""

    def __init__(self, index: int, buffer: torch.Tensor, params: List[Any]):
        self._index, self._buffer, self._params = index, buffer, params

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def parameters(self) -> List[Any]:
        return self._params


class HookTest(FakeDaemonCase):
    def _hook_run(self, mode: str) -> None:
        runtimes = [FakeCudaRuntime(self.gpu) for _ in range(TRAINERS)]
        states = [spex.torch.SpexHookState(client=self.connect(r, runtimes[r]), mode=mode)
                  for r in range(TRAINERS)]
        for s in states:
            self.addCleanup(s.close)
        sizes, steps = [3000, 20], 3
        params = [FakeParam(n) for n in sizes]

        def trainer(rank: int) -> List[str]:
            runtimes[rank].set_stream(40 + rank)  # the autograd thread's current stream
            bad = []
            for step in range(steps):
                futs = []
                for i, n in enumerate(sizes):
                    grads = fake_cuda_tensor(values(rank, step, i, n), ORDINAL)
                    futs.append(states[rank](FakeGradBucket(i, grads, [params[i]])))
                for i, f in enumerate(futs):
                    out = f.wait()
                    b = states[rank].buckets[i]
                    if out is not b.output_tensor or out.device != torch.device("cuda", ORDINAL):
                        bad.append(f"bucket {i}: the future holds {type(out).__name__} on {out.device}, not the "
                                   f"device output tensor")
                    elif not np.array_equal(out.numpy(), expected(step, i, sizes[i])):
                        bad.append(f"rank {rank} bucket {i} step {step}: {out.numpy()[:3]}")
            return bad

        for r in run_threads([lambda r=r: trainer(r) for r in range(TRAINERS)], timeout=60):
            self.assertEqual(r, [])
        self.assertEqual([b.on_device for b in states[0].buckets], [True, True])
        # The copy and the input event on the autograd thread's stream; the output event waited on
        # by the worker thread (its current stream: 0) before it completes the future.
        for rank in range(TRAINERS):
            recs = [e for e in self.gpu.entries("record") if e[2] == rank]
            self.assertEqual({e[3] for e in recs}, {40 + rank})
            self.assertEqual(len(recs), steps * len(sizes))
        waits = self.gpu.entries("wait")
        self.assertEqual(len(waits), TRAINERS * steps * len(sizes))
        self.assertEqual({(e[2], e[3]) for e in waits}, {(TRAINERS, 0)})
        self.assertTrue(all(e[4] >= 1 for e in waits), "an output event was waited on before its publish")
        self.assertEqual(len(states[0].pop_timings()), steps * len(sizes))

    def test_hook_passes_cuda_buckets_through_the_doorbell(self):
        self._hook_run("doorbell")

    def test_hook_passes_cuda_buckets_through_the_rpc(self):
        self._hook_run("rpc")

    def test_hook_passes_half_cuda_buckets(self):
        """A bfloat16 and a float16 DDP bucket of CUDA gradients become device buckets of their
        type; the future holds the half output tensor, the average rounded once."""
        runtimes = [FakeCudaRuntime(self.gpu) for _ in range(TRAINERS)]
        states = [spex.torch.SpexHookState(client=self.connect(r, runtimes[r])) for r in range(TRAINERS)]
        for s in states:
            self.addCleanup(s.close)
        dtypes, n = [torch.bfloat16, torch.float16], 700
        params = []
        for dt in dtypes:
            p = FakeParam(n)
            p.dtype = dt
            params.append(p)

        def grads(rank: int, step: int, i: int) -> torch.Tensor:
            return torch.from_numpy(values(rank, step, i, n) / 3).to(dtypes[i])

        def trainer(rank: int) -> List[str]:
            bad = []
            for step in range(2):
                futs = [states[rank](FakeGradBucket(i, grads(rank, step, i).as_subclass(
                    type(fake_cuda_tensor(np.zeros(1, np.float32), ORDINAL))), [params[i]])) for i in range(2)]
                for i, f in enumerate(futs):
                    out = f.wait()
                    want = ((grads(0, step, i).float() + grads(1, step, i).float()) * 0.5).to(dtypes[i])
                    if out.dtype != dtypes[i] or not torch.equal(torch.Tensor(out.float()), want.float()):
                        bad.append(f"rank {rank} bucket {i} step {step}: {out.dtype} {out.float()[:3].tolist()}")
            return bad

        for r in run_threads([lambda r=r: trainer(r) for r in range(TRAINERS)], timeout=60):
            self.assertEqual(r, [])
        self.assertEqual([b.dtype for b in states[0].buckets], ["bfloat16", "float16"])
        self.assertEqual([b.on_device for b in states[0].buckets], [True, True])

    def test_cuda_hook_refuses_cpu_tensors_and_models(self):
        state = spex.torch.SpexHookState(client=self.connect(0))
        self.addCleanup(state.close)
        with self.assertRaises(spex.SpexTypeError) as cm:
            state(FakeGradBucket(0, torch.zeros(8), [FakeParam()]))
        for part in ("DDP bucket 0 is on cpu", "device='cuda'", "--device=cpu"):
            self.assertIn(part, str(cm.exception))
        with self.assertRaisesRegex(spex.SpexValueError, "the given client was opened with device='cuda'"):
            spex.torch.SpexHookState(client=state.client, device="cpu")
        # A model on the CPU is refused when the state is made, not inside backward.
        with self.assertRaisesRegex(spex.SpexTypeError, "the DDP model is on cpu"):
            spex.torch.SpexHookState(torch.nn.Linear(4, 2), socket=self.daemon.socket, local_rank=1,
                                     local_size=TRAINERS, device="cuda", cuda_runtime=FakeCudaRuntime(self.gpu))
        self.assertEqual(len(self.daemon.ListSessions(pb.ListSessionsRequest(), None).sessions), 1)


class RealCpuDaemonTest(ClusterTestCase):
    def test_cpu_daemon_refuses_cuda_clients_and_cuda_tensors(self):
        c = self.start_cluster(1, 1)
        sock = c.socket(0)
        with self.assertRaises(spex.SpexError) as cm:
            spex.Client(sock, device="cuda")
        for part in ("spex.Client(device='cuda')", "serves host (CPU) buffers", "--device=cuda",
                     "spex.Client(device='cpu')"):
            self.assertIn(part, str(cm.exception))
        with spex.Client(sock) as host:
            self.assertEqual([s.client for s in host.sessions()], ["spex-py"])  # the refused Hello left nothing
            b = host.register_bucket(0, 16)
            self.assertFalse(b.on_device)
            self.assertEqual(b.cuda_device, -1)
            with self.assertRaises(spex.SpexTypeError) as cm:
                b.write(fake_cuda_tensor(np.zeros(16, np.float32), 0))
            self.assertIn("got a tensor on cuda:0", str(cm.exception))
            self.assertIn("spex.Client(device='cuda')", str(cm.exception))
            with self.assertRaisesRegex(spex.SpexError, "no CUDA runtime"):
                host.cuda_runtime
            state = spex.torch.SpexHookState(client=host)
            with self.assertRaises(spex.SpexTypeError) as cm:
                state(FakeGradBucket(0, fake_cuda_tensor(np.zeros(16, np.float32), 0), [FakeParam()]))
            self.assertIn("pass device='cuda' to spex.torch.register", str(cm.exception))
            state.close()
            np.testing.assert_array_equal(host.exchange(b, np.full(16, 3, np.float32)), np.full(16, 3, np.float32))


if __name__ == "__main__":
    unittest.main()
