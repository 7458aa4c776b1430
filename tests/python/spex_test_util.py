"""Helpers shared by the Python tests: where the binaries and sources are, running trainer
threads and collecting their exceptions, and a cluster started per test case (stopped by PID)."""

import os
import threading
import unittest
from typing import Any, Callable, List, Optional

from spex.cluster import LocalCluster

REPO = os.environ.get("SPEX_REPO") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SPEXD = os.environ.get("SPEXD") or os.path.join(REPO, "bazel-bin", "daemon", "spexd")
QUIET = ["--log_level=error", "--threads=1"]


def digest(model) -> str:
    """SHA-1 of a torch model's parameters (equal on every rank when training stays in step)."""
    import hashlib

    h = hashlib.sha1()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def cluster(nodes: int, trainers: int, *extra: str) -> LocalCluster:
    """A started cluster; the caller stops it (use as a context manager or addCleanup)."""
    return LocalCluster(SPEXD, nodes=nodes, trainers=trainers, args=[*QUIET, *extra]).start()


def run_threads(fns: List[Callable[[], Any]], timeout: float = 60.0) -> List[Any]:
    """Runs every fn in its own thread; returns their results or exceptions, in order. A thread
    still running after `timeout` is a test failure (a hang), reported as TimeoutError."""
    results: List[Any] = [None] * len(fns)

    def wrap(i: int, fn: Callable[[], Any]) -> None:
        try:
            results[i] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            results[i] = e

    threads = [threading.Thread(target=wrap, args=(i, fn), daemon=True) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for i, t in enumerate(threads):
        t.join(timeout)
        if t.is_alive():
            results[i] = TimeoutError(f"thread {i} still running after {timeout} s")
    return results


class ClusterTestCase(unittest.TestCase):
    """A TestCase with `start_cluster`, stopping what it started when the case ends."""

    def start_cluster(self, nodes: int, trainers: int, *extra: str) -> LocalCluster:
        c = cluster(nodes, trainers, *extra)
        self.addCleanup(c.cleanup)
        return c

    def assertRaisesWithin(self, exc: type, seconds: float, fn: Callable[[], Any],
                           contains: Optional[List[str]] = None) -> BaseException:
        """fn() raises `exc` (whose message holds every string of `contains`) within `seconds`."""
        import time

        t0 = time.monotonic()
        result = run_threads([fn], timeout=seconds + 30)[0]
        took = time.monotonic() - t0
        self.assertIsInstance(result, exc, f"expected {exc.__name__}, got {result!r}")
        self.assertLess(took, seconds, f"{exc.__name__} took {took:.1f} s")
        for s in contains or []:
            self.assertIn(s, str(result))
        return result


class FakeBucket:
    """What SpexHookState uses of spex.Bucket (no daemon)."""

    def __init__(self, bucket_id, elements, compressor=None, dtype=None):
        import torch

        self.id, self.elements, self.on_device, self.next_step = bucket_id, elements, False, 0
        self.compressor = compressor
        self.input_tensor = torch.zeros(elements, dtype=dtype or torch.float32)
        self.output_tensor = torch.zeros(elements, dtype=dtype or torch.float32)


class FakeClient:
    """What SpexHookState uses of spex.Client, with no daemon: records the checkpoint calls and
    what the hook handed over (`handed`, one copy per step); each step's result is the next of
    `results` (tensors), or zeros when none are left."""

    device, node_rank, node_count, local_rank, world_size, socket = "cpu", 0, 1, 0, 1, "fake"

    class hello:  # noqa: N801 - mirrors the HelloResponse attribute
        local_trainers = 1

    def __init__(self, results=None, compressor="micro"):
        self.loaded, self.handed = [], []
        self.results = list(results or [])
        self.compressor = compressor

    def validate_compressor(self, compressor, density=None, params=None):
        pass

    def register_bucket(self, bucket_id, elements, *args, dtype=None, **kwargs):
        return FakeBucket(bucket_id, elements, self.compressor, dtype)

    def unregister_bucket(self, b):
        pass

    def submit(self, b):
        self.handed.append(b.input_tensor.clone())
        return 0

    def wait(self, b, step):
        b.output_tensor.copy_(self.results.pop(0) if self.results else b.output_tensor.new_zeros(b.elements))

    def save_bucket_state(self, b):
        return f"record of {b.id}".encode()

    def load_bucket_state(self, b, record, resize=False):
        self.loaded.append((b.id, record) if not resize else (b.id, record, "resized"))

    def close(self):
        pass


class FakeGradBucket:
    """A DDP GradBucket over `params` (their values as the gradients), or over `buffer`."""

    def __init__(self, index, params, buffer=None):
        import torch

        self._index, self._params = index, params
        self._buffer = buffer if buffer is not None else torch.cat([p.detach().reshape(-1) for p in params])

    def index(self):
        return self._index

    def buffer(self):
        return self._buffer

    def parameters(self):
        return self._params
