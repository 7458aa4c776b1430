"""A daemon waiting in an MPI collective (its node's trainer is ready, the other node's is late)
still answers its control calls (GetStats, ListSessions) at once, whether the collective waits
inside MPI or passively; and waiting passively, its threads leave the CPU: they are neither
running nor runnable for most of the wait (per-thread /proc schedstat, which counts the time a
thread ran and the time it waited for a core, so the check holds on a loaded machine too)."""

import os
import threading
import time
import unittest

import numpy as np
import spex
from spex_test_util import ClusterTestCase

LATE_S = 2.5  # how long node 1's trainer keeps node 0's daemon waiting


def daemon_of_node(pids, node):
    """The spexd PID whose MPI rank (its environment's OMPI_COMM_WORLD_RANK) is `node`."""
    for pid in pids:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        if int(env.get(b"OMPI_COMM_WORLD_RANK", b"-1")) == node:
            return pid
    raise AssertionError(f"no spexd of node {node} among {pids}")


def busy_ns(pid):
    """Nanoseconds every thread of `pid` has spent running or waiting for a core (schedstat)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                run, wait = f.read().split()[:2]
            total += int(run) + int(wait)
        except (OSError, ValueError):
            pass
    return total


class WaitingDaemonTest(ClusterTestCase):
    def wait_on_late_node(self, *flags):
        """Node 0's trainer exchanges; node 1's trainer joins LATE_S later. Meanwhile node 0's
        daemon is asked for its stats and sessions. Returns (the calls' longest time in seconds,
        the busy cores of node 0's daemon over the wait)."""
        cl = self.start_cluster(2, 1, *flags)
        pid = daemon_of_node(cl.daemon_pids(), 0)
        n = 1 << 16
        c0 = spex.Client(cl.socket(0), exchange_timeout=60)
        c1 = spex.Client(cl.socket(1), exchange_timeout=60)
        self.addCleanup(c1.close)
        self.addCleanup(c0.close)
        b0, b1 = c0.register_bucket(0, n), c1.register_bucket(0, n)
        out = {}

        def node(c, b, value, delay):
            time.sleep(delay)
            out[value] = c.exchange(b, np.full(n, value, np.float32)).copy()

        threads = [threading.Thread(target=node, args=(c0, b0, 1.0, 0.0), daemon=True),
                   threading.Thread(target=node, args=(c1, b1, 3.0, LATE_S), daemon=True)]
        for t in threads:
            t.start()
        time.sleep(0.5)  # node 0's engine is in the step's first collective by now
        busy0, t0 = busy_ns(pid), time.monotonic()
        slowest = 0.0
        for _ in range(5):
            t = time.monotonic()
            stats = c0.stats()
            sessions = c0.sessions()
            slowest = max(slowest, time.monotonic() - t)
            self.assertEqual([s.bucket_id for s in stats.buckets], [0])
            self.assertEqual(len(sessions), 1)
            time.sleep(0.2)
        busy = (busy_ns(pid) - busy0) / 1e9 / (time.monotonic() - t0)
        self.assertFalse(1.0 in out, "node 0's exchange finished before node 1's trainer came")
        for t in threads:
            t.join(60)
        self.assertEqual(sorted(out), [1.0, 3.0])
        for v in out.values():
            self.assertTrue(np.all(v == 2.0))  # the mean of 1 and 3
        return slowest, busy

    def test_waiting_inside_mpi_answers(self):
        slowest, busy = self.wait_on_late_node("--mpi_wait_max_sleep_us=0")
        self.assertLess(slowest, 2.0)
        # Open MPI polls: the engine thread runs or waits for a core the whole time (the measure
        # the passive case is held to).
        self.assertGreater(busy, 0.8)

    def test_waiting_passively_answers_and_leaves_the_cpu(self):
        # Every collective passive: the step's first one (the control round, a few bytes) too.
        slowest, busy = self.wait_on_late_node("--mpi_wait_max_sleep_us=1000", "--mpi_passive_wait_min_bytes=0")
        self.assertLess(slowest, 2.0)
        self.assertLess(busy, 0.5, f"node 0's daemon was running or runnable {busy:.2f} of the wait")

    def test_sleeping_beside_compute_leaves_the_cpu_on_a_long_wait(self):
        # --mpi_sleep_beside_compute=on: node 0's trainer has handed in its only bucket, so
        # nobody computes beside the control round's wait; it tests back to back for 10 ms, then
        # sleeps as a passive wait does (the late node makes the wait 2.5 s).
        slowest, busy = self.wait_on_late_node("--mpi_sleep_beside_compute=on")
        self.assertLess(slowest, 2.0)
        self.assertLess(busy, 0.5, f"node 0's daemon was running or runnable {busy:.2f} of the wait")


if __name__ == "__main__":
    unittest.main()
