#!/usr/bin/env python3
"""bench/scale/virtual_workers.py's two exchanges against independent arithmetic (seconds):

- the C ABI over ReferenceCluster (reference_cluster_c.cc, ctypes): the dense compressor's result
  is numpy's mean of the trainers' inputs; micro (pattern A) at 3 nodes and at 2 nodes x 2
  trainers, with every bucket a column slice of a wider array, keeps the step's sum (every node's
  residual plus nodes x trainers times the result equals the inputs' sum, step after step: error
  feedback), puts the exact mean at the union it reports and nothing elsewhere, and errors are
  reported, not crashed on;
- VirtualPowerSGD (PyTorch's powerSGD_hook for virtual workers) against the real hook under DDP
  over gloo in 2 processes on a small MLP: the same parameters after 6 steps (rank 1, start at
  iteration 2), where the dense average ends elsewhere.

Usage: virtual_workers_test.py [LIB] (default $SPEX_RC_LIB)."""

import json
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "scale"))

import numpy as np  # noqa: E402

import virtual_workers as vw  # noqa: E402

LIB = None


class ClusterAbiTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rc = vw.ReferenceClusterLib(LIB)

    def test_dense_is_numpys_mean(self):
        rng = np.random.default_rng(1)
        n = 1000
        wide = rng.standard_normal((3, n + 17)).astype(np.float32)
        c = vw.Cluster(self.rc, "dense", 1.0, n, nodes=3)
        self.assertEqual(c.pattern(), "D")
        out = np.empty(n, dtype=np.float32)
        c.step(0, wide[:, 5:5 + n], out)
        np.testing.assert_allclose(out, wide[:, 5:5 + n].mean(0), rtol=1e-6, atol=1e-7)
        self.assertEqual(c.gathered(), n)

    def check_micro(self, nodes, trainers):
        rng = np.random.default_rng(nodes * 10 + trainers)
        n, w = 4000, nodes * trainers
        c = vw.Cluster(self.rc, "micro", 0.05, n, nodes=nodes, trainers=trainers)
        self.assertEqual(c.pattern(), "A")
        out = np.empty(n, dtype=np.float32)
        residual = np.zeros((nodes, n), dtype=np.float64)
        for step in range(4):
            wide = rng.standard_normal((w, n + 100)).astype(np.float32)
            x = wide[:, 50:50 + n]
            c.step(step, x, out)
            acc = residual + x.astype(np.float64).reshape(nodes, trainers, n).sum(1)
            nz = out != 0
            self.assertGreater(nz.sum(), 0)
            self.assertLessEqual(nz.sum(), c.gathered())
            # the exact mean of the nodes' accumulated values at the union, 0 elsewhere
            np.testing.assert_allclose(out[nz], acc.sum(0)[nz] / w, rtol=1e-4, atol=1e-5)
            residual = np.stack([c.residual(r) for r in range(nodes)]).astype(np.float64)
            np.testing.assert_array_equal(residual[:, nz], 0.0)
            # error feedback keeps the sum: residuals + w * out == accumulated
            np.testing.assert_allclose(residual.sum(0) + w * out.astype(np.float64), acc.sum(0), rtol=1e-4,
                                       atol=1e-4)
            self.assertEqual(len(c.counts()), nodes)
            self.assertEqual(sum(c.counts()), c.gathered())  # micro's partitions are exclusive

    def test_micro_three_nodes(self):
        self.check_micro(3, 1)

    def test_micro_two_nodes_two_trainers(self):
        self.check_micro(2, 2)

    def test_errors_are_reported(self):
        with self.assertRaisesRegex(RuntimeError, "nosuch"):
            vw.Cluster(self.rc, "nosuch", 0.01, 100, nodes=2)
        with self.assertRaisesRegex(RuntimeError, "key=value"):
            vw.Cluster(self.rc, "micro", 0.01, 100, nodes=2, params="oops")
        c = vw.Cluster(self.rc, "micro", 0.01, 100, nodes=2)
        with self.assertRaisesRegex(RuntimeError, "density"):
            c.set_density(2.0)


class PowerSgdTest(unittest.TestCase):
    def test_matches_pytorch_hook(self):
        r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "scale", "virtual_workers.py"),
                            "check-powersgd", "--workers", "2", "--rank", "1", "--steps", "6"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        res = json.loads(r.stdout.strip().splitlines()[-1])
        self.assertLess(res["max_abs_diff"], 1e-6, res)
        # the check can fail: the dense average (no compression) ends far from the hook's result
        self.assertGreater(res["max_abs_diff_of_dense_average"], 1e-3, res)


if __name__ == "__main__":
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
        LIB = sys.argv.pop(1)
    unittest.main()
