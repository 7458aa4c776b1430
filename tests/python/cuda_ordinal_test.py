"""The GPU ordinal of a Python trainer's device buckets (issue 33): Client.register_bucket
(cuda_device=N) sends RegisterBucketRequest.device_ordinal = N, as the C++ client does with
ClientOptions::cuda_device, and leaves it unset without one (the daemon's home GPU); the DDP hook
sends the ordinal of each bucket's CUDA gradients, so a spexd serving several GPUs (--devices)
places the trainer's buffers on its GPU, and a GPU the daemon does not serve is refused with the
daemon's message naming --devices. No GPU here: the fake CUDA runtime and daemon of fake_cuda.py,
the daemon recording every RegisterBucket request and refusing an ordinal it does not serve the
way spexd does."""

import unittest
from typing import Any, List

import grpc
import numpy as np
import torch

import spex
import spex.torch
from spex.proto import spex_pb2 as pb
from spex_test_util import run_threads

from fake_cuda import FakeCudaDaemon, FakeCudaRuntime, FakeGpu, fake_cuda_tensor

TRAINERS = 2
ORDINAL = 3  # the fake daemon's one GPU


class RecordingDaemon(FakeCudaDaemon):
    """Records RegisterBucket requests; an ordinal other than its GPU's is refused as spexd refuses a
    GPU outside --devices (FAILED_PRECONDITION, naming the flag and the GPUs it serves)."""

    def __init__(self, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        self.requests: List[Any] = []

    def RegisterBucket(self, req: Any, ctx: grpc.ServicerContext) -> Any:
        self.requests.append(req)
        if req.HasField("device_ordinal") and req.device_ordinal != self.gpu.ordinal:
            ctx.abort(grpc.StatusCode.FAILED_PRECONDITION,
                      f"bucket {req.bucket_id}: GPU {req.device_ordinal} is not served by this spexd "
                      f"(--devices={self.gpu.ordinal}); start spexd with --devices listing it")
        return super().RegisterBucket(req, ctx)


class FakeParam:
    dtype = torch.float32

    def __init__(self, elements: int):
        self.elements = elements

    def numel(self) -> int:
        return self.elements


class FakeGradBucket:
    def __init__(self, index: int, buffer: torch.Tensor, params: List[Any]):
        self._index, self._buffer, self._params = index, buffer, params

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def parameters(self) -> List[Any]:
        return self._params


class OrdinalTest(unittest.TestCase):
    def setUp(self):
        self.gpu = FakeGpu(ORDINAL)
        self.daemon = RecordingDaemon(self.gpu, trainers=TRAINERS).start()
        self.addCleanup(self.daemon.stop)

    def connect(self, rank: int) -> spex.Client:
        c = spex.Client(self.daemon.socket, local_rank=rank, local_size=TRAINERS, device="cuda",
                        exchange_timeout=20, cuda_runtime=FakeCudaRuntime(self.gpu))
        self.addCleanup(c.close)
        return c

    def test_register_bucket_sends_the_ordinal_and_nothing_without_one(self):
        c = self.connect(0)
        b = c.register_bucket(7, 1000, cuda_device=ORDINAL)
        self.assertTrue(self.daemon.requests[-1].HasField("device_ordinal"))
        self.assertEqual(self.daemon.requests[-1].device_ordinal, ORDINAL)
        self.assertEqual(b.cuda_device, ORDINAL)
        c.register_bucket(8, 1000)
        self.assertFalse(self.daemon.requests[-1].HasField("device_ordinal"))
        c.register_bucket(9, 1000, cuda_device=np.int64(ORDINAL))
        self.assertEqual(self.daemon.requests[-1].device_ordinal, ORDINAL)

    def test_bad_ordinals_are_refused_before_asking_the_daemon(self):
        c = self.connect(0)
        for bad in (-1, True, 1.0, "3"):
            with self.assertRaisesRegex(spex.SpexValueError, "cuda_device must be a GPU ordinal"):
                c.register_bucket(7, 1000, cuda_device=bad)
        self.assertEqual(self.daemon.requests, [])

    def test_an_unserved_gpu_is_the_daemons_refusal_naming_devices(self):
        c = self.connect(0)
        with self.assertRaisesRegex(spex.SpexError, "GPU 5 is not served.*--devices") as e:
            c.register_bucket(7, 1000, cuda_device=5)
        self.assertEqual(e.exception.code, "FAILED_PRECONDITION")

    def _hook(self) -> List[spex.torch.SpexHookState]:
        states = [spex.torch.SpexHookState(client=self.connect(r)) for r in range(TRAINERS)]
        for s in states:
            self.addCleanup(s.close)
        return states

    def test_the_hook_sends_its_gradients_ordinal(self):
        states = self._hook()
        n = 500

        def trainer(rank: int) -> np.ndarray:
            grads = fake_cuda_tensor(np.full(n, float(rank + 1), np.float32), ORDINAL)
            return states[rank](FakeGradBucket(0, grads, [FakeParam(n)])).wait().numpy().copy()

        outs = run_threads([lambda r=r: trainer(r) for r in range(TRAINERS)], timeout=60)
        for out in outs:
            self.assertTrue(np.all(out == 1.5))
        self.assertEqual(len(self.daemon.requests), TRAINERS)
        for req in self.daemon.requests:
            self.assertTrue(req.HasField("device_ordinal"))
            self.assertEqual(req.device_ordinal, ORDINAL)

    def test_the_hook_on_a_gpu_the_daemon_does_not_serve_is_refused(self):
        states = self._hook()
        grads = fake_cuda_tensor(np.ones(100, np.float32), 5)
        with self.assertRaisesRegex(spex.SpexError, "GPU 5 is not served.*--devices"):
            states[0](FakeGradBucket(0, grads, [FakeParam(100)]))
        self.assertEqual(self.daemon.requests[-1].device_ordinal, 5)


if __name__ == "__main__":
    unittest.main()
