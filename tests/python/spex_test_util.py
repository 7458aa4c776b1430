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
