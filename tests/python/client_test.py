"""Tests of the spex Python client against real daemons (spexd under mpirun): the shared-segment
layout against proto/contract/layout.h, the generated stubs, the native atomics, exact averages
over the doorbell and RPC paths, and every bad input a trainer can meet turning into a clear
exception instead of a hang; and that the installed package takes nothing from a checkout
(PackageLookupTest)."""

import filecmp
import mmap
import os
import re
import socket
import stat
import subprocess
import tempfile
import threading
import time
import unittest
from unittest import mock

import numpy as np

import spex
from spex import _native
from spex import layout as L
from spex.cluster import find_spexd
from spex.emulated import find_script
from spex.errors import SpexError
from spex_test_util import REPO, ClusterTestCase, run_threads


def header_constants():
    """Integer constants and offsetof static_asserts of proto/contract/layout.h."""
    with open(os.path.join(REPO, "proto", "contract", "layout.h")) as f:
        text = f.read()
    consts = {m.group(1): int(m.group(2), 0)
              for m in re.finditer(r"constexpr\s+\w+\s+(k\w+)\s*=\s*(0x[0-9a-fA-F]+|\d+)\s*;", text)}
    offsets = {(m.group(1), m.group(2)): int(m.group(3))
               for m in re.finditer(r"static_assert\(offsetof\((\w+),\s*(\w+)\)\s*==\s*(\d+)\);", text)}
    return consts, offsets


class LayoutTest(unittest.TestCase):
    def test_offsets_match_daemon_header(self):
        consts, offsets = header_constants()
        self.assertGreaterEqual(len(offsets), 13, "layout.h's static_asserts were not found")
        expected = {
            ("DoorbellSegment", "ring"): L.DOORBELL_RING_OFFSET,
            ("DoorbellSegment", "engine_sleeping"): L.DOORBELL_ENGINE_SLEEPING_OFFSET,
            ("DoorbellSegment", "shutdown"): L.DOORBELL_SHUTDOWN_OFFSET,
            ("DoorbellSegment", "attached"): L.DOORBELL_ATTACHED_OFFSET,
            ("BucketHeader", "bucket_id"): L.BUCKET_ID_OFFSET,
            ("BucketHeader", "elements"): L.BUCKET_ELEMENTS_OFFSET,
            ("BucketHeader", "slots"): L.BUCKET_SLOTS_OFFSET,
            ("BucketHeader", "dtype"): L.BUCKET_DTYPE_OFFSET,
            ("BucketHeader", "slot_stride"): L.BUCKET_SLOT_STRIDE_OFFSET,
            ("BucketHeader", "published"): L.BUCKET_PUBLISHED_OFFSET,
            ("BucketHeader", "waiters"): L.BUCKET_WAITERS_OFFSET,
            ("BucketHeader", "status"): L.BUCKET_STATUS_OFFSET,
            ("BucketHeader", "attached"): L.BUCKET_ATTACHED_OFFSET,
            ("BucketHeader", "ready"): L.BUCKET_READY_OFFSET,
            ("BucketReadyLine", "ready_ns"): L.BUCKET_READY_NS_OFFSET,
        }
        for key, value in expected.items():
            self.assertIn(key, offsets, f"layout.h has no static_assert for {key}")
            self.assertEqual(offsets[key], value, f"offset of {key[0]}::{key[1]}")
        self.assertEqual(set(offsets) - set(expected), set(), "layout.h asserts offsets the client does not mirror")
        self.assertEqual(consts["kLayoutVersion"], L.LAYOUT_VERSION)
        self.assertEqual(consts["kDoorbellMagic"], L.DOORBELL_MAGIC)
        self.assertEqual(consts["kBucketMagic"], L.BUCKET_MAGIC)
        self.assertEqual(consts["kMaxLocalTrainers"], L.MAX_LOCAL_TRAINERS)
        self.assertEqual(consts["kPageBytes"], L.PAGE_BYTES)

    def test_slot_arithmetic(self):
        self.assertEqual(L.slot_stride(1), 4096)
        self.assertEqual(L.slot_stride(1024), 4096)
        self.assertEqual(L.slot_stride(1025), 8192)
        self.assertEqual(L.input_offset(1025, 1), 4096 + 8192)
        self.assertEqual(L.output_offset(1025, 2), 4096 + 2 * 8192)
        self.assertEqual(L.bucket_bytes(1025, 2), 4096 + 3 * 8192)
        self.assertEqual(L.ready_offset(3), 256 + 3 * 64)
        with self.assertRaises(ValueError):
            L.ready_offset(L.MAX_LOCAL_TRAINERS)

    def test_ready_lines_fit_the_header_page(self):
        self.assertLessEqual(L.ready_offset(L.MAX_LOCAL_TRAINERS - 1) + 8, L.PAGE_BYTES)
        self.assertLessEqual(L.bucket_attached_offset(L.MAX_LOCAL_TRAINERS - 1) + 4, L.BUCKET_READY_OFFSET)


class StubsTest(unittest.TestCase):
    def test_every_rpc_of_the_proto_has_a_stub(self):
        from spex.proto import spex_pb2, spex_pb2_grpc

        with open(os.path.join(REPO, "proto", "spex.proto")) as f:
            text = f.read()
        rpcs = set(re.findall(r"^\s*rpc\s+(\w+)\s*\(", text, re.M))
        self.assertGreaterEqual(len(rpcs), 8)
        service = spex_pb2.DESCRIPTOR.services_by_name["Spex"]
        self.assertEqual({m.name for m in service.methods}, rpcs)
        self.assertEqual(service.full_name, "spex.v1.Spex")
        for rpc in rpcs:
            self.assertTrue(hasattr(spex_pb2_grpc.SpexStub, "__init__"))
            self.assertTrue(hasattr(spex_pb2_grpc.SpexServicer, rpc), rpc)

    def test_stubs_are_generated_into_the_installed_package(self):
        from spex.proto import spex_pb2_grpc

        path = os.path.abspath(spex_pb2_grpc.__file__)
        self.assertNotIn(os.path.join("client", "python"), path, "stubs imported from the source tree")
        with open(path) as f:
            self.assertIn("from spex.proto import spex_pb2", f.read())

    def test_messages_round_trip(self):
        from spex.proto import spex_pb2 as pb

        req = pb.RegisterBucketRequest(session_id=7, bucket_id=2**63, elements=5,
                                       compressor=pb.CompressorConfig(name="micro", density=0.01))
        back = pb.RegisterBucketRequest.FromString(req.SerializeToString())
        self.assertEqual(back.bucket_id, 2**63)
        self.assertEqual(back.compressor.name, "micro")


class NativeTest(unittest.TestCase):
    def setUp(self):
        self.buf = mmap.mmap(-1, 4096)
        self.addCleanup(self.buf.close)

    def test_atomics(self):
        _native.store32(self.buf, 64, 0xFFFFFFFF)
        self.assertEqual(_native.add32(self.buf, 64, 1), 0xFFFFFFFF)
        self.assertEqual(_native.load32(self.buf, 64), 0)  # wraps like std::atomic<uint32_t>
        self.assertEqual(_native.add32(self.buf, 64, -1), 0)
        self.assertEqual(_native.load32(self.buf, 64), 0xFFFFFFFF)
        _native.store64(self.buf, 256, 2**40 + 3)
        self.assertEqual(_native.load64(self.buf, 256), 2**40 + 3)
        self.assertEqual(int.from_bytes(self.buf[256:264], "little"), 2**40 + 3)

    def test_bad_offsets_raise(self):
        with self.assertRaisesRegex(ValueError, "outside"):
            _native.load32(self.buf, 4094)
        with self.assertRaisesRegex(ValueError, "outside"):
            _native.store64(self.buf, -8, 1)
        with self.assertRaisesRegex(ValueError, "aligned"):
            _native.load64(self.buf, 4)
        with self.assertRaises(TypeError):
            _native.load32(b"\0" * 8, 0)  # read-only buffer

    def test_wait_times_out_and_stops(self):
        t0 = time.monotonic()
        self.assertEqual(_native.wait_equal32(self.buf, 64, 1, 68, self.buf, 72, 0, 50_000_000), 1)
        self.assertGreaterEqual(time.monotonic() - t0, 0.04)
        self.assertEqual(_native.load32(self.buf, 68), 0, "waiters counter not restored")
        _native.store32(self.buf, 72, 1)
        self.assertEqual(_native.wait_equal32(self.buf, 64, 1, 68, self.buf, 72, 0, 5_000_000_000), 2)

    def test_futex_wakes_a_waiter(self):
        def publish():
            time.sleep(0.2)
            _native.store32(self.buf, 64, 5)
            if _native.load32(self.buf, 68):
                _native.futex_wake(self.buf, 64)

        t = threading.Thread(target=publish)
        t.start()
        t0 = time.monotonic()
        rc = _native.wait_equal32(self.buf, 64, 5, 68, self.buf, 72, 0, 10_000_000_000)
        took = time.monotonic() - t0
        t.join()
        self.assertEqual(rc, 0)
        self.assertLess(took, 2.0)
        self.assertEqual(_native.load32(self.buf, 68), 0)


def trainer_loop(sock, local_rank, local_size, rank, world, sizes, steps, mode):
    with spex.Client(sock, local_rank=local_rank, local_size=local_size, exchange_timeout=30) as c:
        buckets = [c.register_bucket(i, n) for i, n in enumerate(sizes)]
        for step in range(steps):
            for b in buckets:
                m = mode if mode != "alternate" else ("rpc" if (step + b.id) % 2 else "doorbell")
                pattern = (np.arange(b.elements) % 13).astype(np.float32)
                out = c.exchange(b, pattern * (rank + 1) + step, mode=m)
                want = pattern * (world + 1) / 2 + step  # mean over ranks of pattern*(r+1) + step
                if not np.array_equal(out, want.astype(np.float32)):
                    bad = int(np.argmax(out != want))
                    raise AssertionError(f"rank {rank} bucket {b.id} step {step}: out[{bad}]={out[bad]} "
                                         f"want {want[bad]}")
        stats = c.stats()
        return {s.bucket_id: s.exchanges for s in stats.buckets}


class ExchangeTest(ClusterTestCase):
    def run_cluster(self, nodes, trainers, mode):
        cl = self.start_cluster(nodes, trainers)
        world = nodes * trainers
        sizes = [1, 1000, 4097, 65536]
        fns = [lambda n=n, l=l: trainer_loop(cl.socket(n), l, trainers, n * trainers + l, world, sizes, 4, mode)
               for n in range(nodes) for l in range(trainers)]
        for r in run_threads(fns):
            if isinstance(r, BaseException):
                raise r
            self.assertEqual(r, {i: 4 for i in range(len(sizes))})

    def test_doorbell_2_nodes_x_2_trainers_exact(self):
        self.run_cluster(2, 2, "doorbell")

    def test_rpc_and_alternating_paths_exact(self):
        self.run_cluster(2, 2, "alternate")

    def test_views_share_memory_with_tensors(self):
        import torch

        cl = self.start_cluster(1, 1)
        with spex.Client(cl.socket(0)) as c:
            b = c.register_bucket(3, 10)
            b.input_tensor.copy_(torch.arange(10, dtype=torch.float32))
            self.assertEqual(float(b.input[7]), 7.0)  # same memory, no copy
            out = c.exchange(b)
            self.assertFalse(out.flags.writeable)
            self.assertTrue(torch.equal(b.output_tensor, torch.arange(10, dtype=torch.float32)))
            self.assertEqual(b.output_tensor.data_ptr(), out.ctypes.data)
            self.assertEqual(b.next_step, 1)
            self.assertEqual(b.compressor, "dense")

    def test_own_input_is_read_instead_of_the_slot(self):
        import torch

        cl = self.start_cluster(1, 1)
        with spex.Client(cl.socket(0)) as c:
            whole = torch.zeros(30)
            mine = whole[7:17]  # a view at an offset: its storage moves, the view follows
            b = c.register_bucket(6, 10, own_input=mine)
            self.assertTrue(b.own_input)
            self.assertTrue(whole.is_shared(), "own_input's storage is in shared memory now")
            self.assertEqual(b.input_tensor.data_ptr(), mine.data_ptr())
            mine.copy_(torch.arange(10, dtype=torch.float32))
            self.assertEqual(float(b.input[3]), 3.0)  # the numpy view is the tensor's memory
            self.assertTrue(torch.equal(torch.from_numpy(c.exchange(b).copy()), torch.arange(10.0)))
            mine.mul_(3)  # read at every exchange, not copied at registration
            self.assertTrue(torch.equal(torch.from_numpy(c.exchange(b, mode="rpc").copy()), 3 * torch.arange(10.0)))
            c.exchange(b, torch.ones(10))  # write() goes into the tensor
            self.assertTrue(torch.equal(mine, torch.ones(10)))
            self.assertEqual(float(b.output[9]), 1.0)
            plain = c.register_bucket(7, 10)
            self.assertFalse(plain.own_input)

    def test_submit_stamps_when_the_input_was_ready(self):
        cl = self.start_cluster(1, 1)
        with spex.Client(cl.socket(0)) as c:
            b = c.register_bucket(4, 10)
            self.assertEqual(_native.load64(b.header, L.ready_ns_offset(0)), 0)
            before = time.monotonic_ns()
            c.exchange(b, np.ones(10, np.float32))
            stamp = _native.load64(b.header, L.ready_ns_offset(0))
            self.assertGreaterEqual(stamp, before)  # CLOCK_MONOTONIC, the daemon's clock
            self.assertLessEqual(stamp, time.monotonic_ns())
            c.exchange(b, np.ones(10, np.float32), mode="rpc")  # the daemon stamps for the RPC
            self.assertGreater(_native.load64(b.header, L.ready_ns_offset(0)), stamp)

    def test_stats_and_sessions(self):
        cl = self.start_cluster(1, 1)
        with spex.Client(cl.socket(0), client_name="stats-test") as c:
            b = c.register_bucket(5, 100)
            for _ in range(3):
                c.exchange(b, np.ones(100, np.float32))
            stats = c.stats()
            self.assertEqual([(s.bucket_id, s.exchanges, s.elements) for s in stats.buckets], [(5, 3, 100)])
            sessions = c.sessions()
            self.assertEqual([(s.pid, s.client) for s in sessions], [(os.getpid(), "stats-test")])

    def test_set_density(self):
        cl = self.start_cluster(1, 1)
        with spex.Client(cl.socket(0)) as c:
            v1 = c.set_density(0.05)
            v2 = c.set_density(0.02)
            self.assertGreaterEqual(v1, 1)
            self.assertGreater(v2, v1)
            with self.assertRaisesRegex(spex.SpexValueError, r"\(0, 1\]"):
                c.set_density(0.0)

    def test_unregister_removes_the_bucket(self):
        cl = self.start_cluster(1, 1)
        with spex.Client(cl.socket(0)) as c:
            b = c.register_bucket(1, 16)
            c.unregister_bucket(b)
            with self.assertRaisesRegex(spex.SpexValueError, "not registered"):
                c.exchange(b)
            self.assertEqual(list(c.stats().buckets), [])
            b2 = c.register_bucket(2, 16)  # the daemon keeps serving
            c.exchange(b2, np.zeros(16, np.float32))


def sparse_node(sock, sizes, steps):
    """One trainer of a 1-trainer node: registers a bucket per (id, compressor, elements) with
    density 0.01, exchanges the same input on every node over the RPC path (stats back) and the
    doorbell path in turn; returns per bucket the stats of every RPC step and the outputs."""
    out = {}
    with spex.Client(sock, local_rank=0, local_size=1, exchange_timeout=30) as c:
        buckets = [(c.register_bucket(i, n, compressor=name, density=0.01), name) for i, name, n in sizes]
        for b, name in buckets:
            self_check = (b.compressor, b.density)
            assert self_check == (name, 0.01), self_check
        for step in range(steps):
            for b, name in buckets:
                rng = np.random.default_rng(1000 * b.id + step)  # the same on every node
                x = (rng.standard_normal(b.elements) + np.sign(rng.standard_normal(b.elements)) * 0.01)
                b.write(x.astype(np.float32))
                if step % 2 == 0:
                    st = c.exchange_rpc(b, step)
                    b.next_step = step + 1
                else:
                    c.exchange(b)
                    st = None
                rec = out.setdefault(b.id, {"stats": [], "out": [], "x": []})
                rec["stats"].append(None if st is None else
                                    (st.pattern, st.achieved_density, st.gathered_elements, st.target_density,
                                     st.fell_back_to_dense, st.compressor))
                rec["out"].append(np.array(b.output))
                rec["x"].append(x.astype(np.float32))
    return out


class SparseExchangeTest(ClusterTestCase):
    """Per-bucket compressors at registration: micro (pattern A), topk and dgc (pattern B),
    dense, and a sparse bucket under --min_sparse_elements that the daemon sends dense."""

    def test_per_bucket_compressors_on_2_nodes(self):
        cl = self.start_cluster(2, 1, "--dense_fallback=off", "--min_sparse_elements=16384")
        sizes = [(0, "micro", 40000), (1, "topk", 30000), (2, "dgc", 20000), (3, "dense", 5000), (4, "micro", 1000)]
        steps = 4
        res = run_threads([lambda n=n: sparse_node(cl.socket(n), sizes, steps) for n in range(2)])
        for r in res:
            if isinstance(r, BaseException):
                raise r
        expect = {0: "A", 1: "B", 2: "B", 3: "D", 4: "D"}
        for bid, name, n in sizes:
            for step in range(steps):
                a, b = res[0][bid]["out"][step], res[1][bid]["out"][step]
                self.assertTrue(np.array_equal(a, b), f"bucket {bid} step {step}: nodes' outputs differ")
            st = res[0][bid]["stats"][0]
            pattern, achieved, gathered, target, fell_back, comp = st
            self.assertEqual((pattern, comp, fell_back), (expect[bid], name, False), f"bucket {bid}")
            out0, x0 = res[0][bid]["out"][0], res[0][bid]["x"][0]
            if pattern == "D":
                self.assertAlmostEqual(achieved, 1.0)
                np.testing.assert_allclose(out0, x0, rtol=1e-6, atol=1e-7)
                continue
            self.assertAlmostEqual(target, 0.01)
            self.assertGreater(achieved, 0.002, f"bucket {bid}")
            self.assertLessEqual(achieved, 0.0105, f"bucket {bid}")
            # Step 0 (no residual yet), the same input on both nodes: every position received is
            # the exact average (= the input) where both nodes sent it (pattern A: the union is
            # sent by all; topk: both select the same), half of it where only one node's sampled
            # selection (dgc) holds it; every other position is 0.
            nz = np.flatnonzero(out0)
            self.assertGreater(len(nz), 0)
            self.assertLessEqual(len(nz), gathered)
            self.assertLessEqual(len(nz), 0.021 * n)
            if name == "dgc":
                full = np.isclose(out0[nz], x0[nz], rtol=1e-6)
                half = np.isclose(out0[nz], x0[nz] / 2, rtol=1e-6)
                self.assertTrue(np.all(full | half), f"bucket {bid}: values neither x nor x/2")
                self.assertGreater(full.sum(), len(nz) // 2)
            else:
                np.testing.assert_allclose(out0[nz], x0[nz], rtol=1e-6)
            if name == "topk":  # the 1% largest magnitudes, the same on both nodes
                k = len(nz)
                self.assertEqual(set(nz), set(np.argsort(-np.abs(x0), kind="stable")[:k]))

    def test_set_density_changes_the_target_at_run_time(self):
        cl = self.start_cluster(1, 1, "--dense_fallback=off")
        with spex.Client(cl.socket(0)) as c:
            b = c.register_bucket(0, 20000, compressor="topk", density=0.01)
            x = np.random.default_rng(0).standard_normal(20000).astype(np.float32)
            c.exchange(b, x, mode="rpc")
            self.assertAlmostEqual(b.last_rpc_stats.achieved_density, 0.01, places=3)
            c.set_density(0.05)
            c.exchange(b, x, mode="rpc")
            self.assertAlmostEqual(b.last_rpc_stats.target_density, 0.05, places=6)
            self.assertAlmostEqual(b.last_rpc_stats.achieved_density, 0.05, places=3)

    def test_per_bucket_nonfinite_policy(self):
        """RegisterBucket's nonfinite parameter overrides spexd --nonfinite (propagate) for one
        bucket: its NaN step fails naming the trainer, the other bucket's gives NaN, and the
        next clean step works for both."""
        cl = self.start_cluster(1, 1, "--dense_fallback=off", "--min_sparse_elements=0")
        with spex.Client(cl.socket(0)) as c:
            c.validate_compressor("topk", 0.01, {"nonfinite": "error"})
            with self.assertRaisesRegex(spex.SpexValueError, "accepted values propagate, error"):
                c.validate_compressor("topk", 0.01, {"nonfinite": "skip"})
            x = np.random.default_rng(1).standard_normal(5000).astype(np.float32)
            bad = x.copy()
            bad[123] = np.nan
            for mode in ("rpc", "doorbell"):
                with self.subTest(mode=mode):
                    base = 10 if mode == "rpc" else 20
                    strict = c.register_bucket(base, 5000, compressor="topk", density=0.01,
                                               params={"nonfinite": "error"})
                    loose = c.register_bucket(base + 1, 5000, compressor="topk", density=0.01)
                    with self.assertRaisesRegex(spex.SpexError,
                                                "non-finite gradient from local trainer 0 .*index 123"):
                        c.exchange(strict, bad, mode=mode)
                    out = c.exchange(loose, bad, mode=mode)
                    self.assertTrue(np.all(np.isnan(out)))
                    # The failed step is consumed: the next exchange is step 1, and it works.
                    for b in (strict, loose):
                        self.assertEqual(b.next_step, 1)
                        out = c.exchange(b, x, mode=mode)
                        self.assertTrue(np.all(np.isfinite(out)))
                        self.assertGreater(np.count_nonzero(out), 0)

    def test_per_bucket_sparse_allreduce(self):
        """RegisterBucket's sparse_allreduce parameter (the client's params, as the DDP hook
        passes them) overrides spexd --sparse_allreduce for one bucket. 2 nodes, two topk buckets
        fed the same inputs, one through Ok-Topk: with --oktopk_global=all its outputs equal the
        all-gather bucket's bit for bit, and it gathers fewer pairs (the union of the nodes'
        selections, not all of them). validate_compressor refuses a compressor that cannot use
        it (naming those that can) and an unknown value, as registration does; auto is accepted
        for every compressor."""
        cl = self.start_cluster(2, 1, "--dense_fallback=off", "--min_sparse_elements=0",
                                "--oktopk_global=all")
        n, steps = 20000, 3
        ok_param = {"sparse_allreduce": "oktopk"}

        def node(rank):
            refusals = []
            with spex.Client(cl.socket(rank), local_rank=0, local_size=1, exchange_timeout=30) as c:
                c.validate_compressor("topk", 0.01, ok_param)
                c.validate_compressor("micro", 0.01, {"sparse_allreduce": "allgather"})
                c.validate_compressor("topk", 0.01, {"sparse_allreduce": "auto"})
                c.validate_compressor("micro", 0.01, {"sparse_allreduce": "auto"})
                for comp, params in (("micro", ok_param), ("topk", {"sparse_allreduce": "okay"})):
                    try:
                        c.validate_compressor(comp, 0.01, params)
                        refusals.append(None)
                    except spex.SpexValueError as e:
                        refusals.append(str(e))
                buckets = (c.register_bucket(0, n, compressor="topk", density=0.01, params=ok_param),
                           c.register_bucket(1, n, compressor="topk", density=0.01))
                rows = []
                for step in range(steps):
                    common = np.random.default_rng(step).standard_normal(n)
                    own = np.random.default_rng(100 + 10 * step + rank).standard_normal(n)
                    x = (common + 0.3 * own).astype(np.float32)
                    row = []
                    for b in buckets:
                        b.write(x)
                        st = c.exchange_rpc(b, step)
                        b.next_step = step + 1
                        row.append((np.array(b.output), st.pattern, st.gathered_elements))
                    rows.append(row)
            return refusals, rows

        res = run_threads([lambda r=r: node(r) for r in range(2)])
        for r in res:
            if isinstance(r, BaseException):
                raise r
        for rank, (refusals, rows) in enumerate(res):
            micro, spelled = refusals
            self.assertIsNotNone(micro, "micro with sparse_allreduce=oktopk was accepted")
            self.assertIn("compressor micro cannot use the bucket parameter sparse_allreduce=oktopk", micro)
            self.assertRegex(micro, r"the compressors that can: dgc, .*topk; or use sparse_allreduce=allgather or auto")
            self.assertIsNotNone(spelled, "sparse_allreduce=okay was accepted")
            self.assertIn("accepted values allgather, oktopk, auto", spelled)
            for step, ((out_ok, pat_ok, got_ok), (out_ag, pat_ag, got_ag)) in enumerate(rows):
                where = f"node {rank} step {step}"
                self.assertEqual((pat_ok, pat_ag), ("B", "B"), where)
                self.assertTrue(np.array_equal(out_ok, out_ag), f"{where}: Ok-Topk output differs from the all-gather's")
                self.assertGreater(np.count_nonzero(out_ok), 0, where)
                self.assertEqual(got_ag, 2 * (n // 100), where)  # both nodes' k pairs
                self.assertLess(got_ok, got_ag, where)  # the union: the selections overlap
                self.assertGreaterEqual(got_ok, n // 100, where)

    def test_validate_compressor_lists_accepted_names_and_registers_nothing(self):
        cl = self.start_cluster(1, 1)
        with spex.Client(cl.socket(0)) as c:
            c.validate_compressor("micro", 0.01)
            c.validate_compressor("dgc", 0.01, {"sample_ratio": "0.05"})
            c.validate_compressor(None)
            with self.assertRaises(spex.SpexValueError) as cm:
                c.validate_compressor("mikro", 0.01)
            msg = str(cm.exception)
            self.assertIn("does not accept compressor 'mikro'", msg)
            self.assertIn(cl.socket(0), msg)
            accepted = msg.split("accepted: ")[1].split(", ")
            self.assertGreaterEqual(len(accepted), 18, accepted)
            for name in ("dense", "micro", "exdyna", "topk", "gtopk", "dgc", "sidco_e"):
                self.assertIn(name, accepted)
            with self.assertRaisesRegex(spex.SpexValueError, "dgc: unknown parameter 'momentum'; accepted: seed"):
                c.validate_compressor("dgc", 0.01, {"momentum": "0.9"})
            with self.assertRaisesRegex(spex.SpexValueError, "sample_ratio"):
                c.validate_compressor("dgc", 0.01, {"sample_ratio": "7"})
            with self.assertRaisesRegex(spex.SpexValueError, r"\(0, 1\]"):
                c.validate_compressor("topk", 2.0)
            self.assertEqual(list(c.stats().buckets), [], "validation registered a bucket")
            b = c.register_bucket(0, 100, compressor="micro", density=0.01)  # the session is intact
            c.exchange(b, np.ones(100, np.float32))


def half_node(socket: str, node: int, steps: int):
    """One trainer of 2 nodes: a bfloat16 dense bucket (torch), a float16 dense bucket (numpy),
    a float32 one and a bfloat16 topk bucket; returns every output and the buckets' wire bytes."""
    import torch

    out = {"bf16": [], "f16": [], "topk": []}
    with spex.Client(socket) as c:
        b16 = c.register_bucket(0, 5000, compressor="dense", dtype=torch.bfloat16)
        f16 = c.register_bucket(1, 5000, compressor="dense", dtype="float16")
        f32 = c.register_bucket(2, 5000, compressor="dense")
        tk = c.register_bucket(3, 40000, compressor="topk", density=0.01, dtype="bf16")
        for step in range(steps):
            g = torch.Generator().manual_seed(100 * node + step)
            x = torch.randn(5000, generator=g)
            c.exchange(b16, x.to(torch.bfloat16))
            out["bf16"].append(b16.output_tensor.float().clone())
            out["f16"].append(np.array(c.exchange(f16, x.numpy().astype(np.float16)), dtype=np.float32))
            c.exchange(f32, x.numpy())
            c.exchange(tk, torch.randn(40000, generator=g).to(torch.bfloat16))
            out["topk"].append(tk.output_tensor.float().clone())
        st = {s.bucket_id: s for s in c.stats().buckets}
        out["bytes"] = {k: st[i].last.bytes_sent for k, i in (("bf16", 0), ("f16", 1), ("f32", 2), ("topk", 3))}
        out["dtypes"] = (b16.input_tensor.dtype, f16.input.dtype, tk.output_tensor.dtype, repr(b16))
        out["stat_dtypes"] = [st[i].dtype for i in range(4)]
    return out


class HalfBucketTest(ClusterTestCase):
    """bfloat16 and float16 buckets through the Python client on 2 nodes (docs/dtypes.md): the
    dense average equals an oracle computed here (each node's value rounded to the bucket's type
    for the wire, summed in float32, halved, rounded once), half the float32 bucket's wire bytes;
    a bfloat16 topk bucket; the bad input."""

    def test_bf16_and_fp16_buckets_on_2_nodes(self):
        import torch

        cl = self.start_cluster(2, 1, "--dense_fallback=off", "--min_sparse_elements=0")
        steps = 3
        res = run_threads([lambda n=n: half_node(cl.socket(n), n, steps) for n in range(2)])
        for r in res:
            if isinstance(r, BaseException):
                raise r
        for step in range(steps):
            xs = [torch.randn(5000, generator=torch.Generator().manual_seed(100 * n + step)) for n in range(2)]
            for key, t in (("bf16", torch.bfloat16), ("f16", torch.float16)):
                wire = [x.to(t).float() for x in xs]  # each node's input, already of the bucket's type
                want = ((wire[0] + wire[1]) * 0.5).to(t).float()
                for node in range(2):
                    got = torch.as_tensor(np.asarray(res[node][key][step], dtype=np.float32))
                    self.assertTrue(torch.equal(got, want), f"{key} step {step} node {node}")
            self.assertTrue(torch.equal(res[0]["topk"][step], res[1]["topk"][step]), "topk outputs differ")
            self.assertGreater(int((res[0]["topk"][step] != 0).sum()), 0)
        by = res[0]["bytes"]
        self.assertEqual(by["bf16"] * 2, by["f32"], by)
        self.assertEqual(by["f16"] * 2, by["f32"], by)
        self.assertEqual(res[0]["dtypes"][:3], (torch.bfloat16, np.float16, torch.bfloat16))
        self.assertIn("dtype='bfloat16'", res[0]["dtypes"][3])
        self.assertEqual(res[0]["stat_dtypes"], ["bfloat16", "float16", "float32", "bfloat16"])

    def test_half_bad_input(self):
        import torch

        cl = self.start_cluster(1, 2)
        with spex.Client(cl.socket(0), local_rank=0, local_size=2) as a, \
                spex.Client(cl.socket(0), local_rank=1, local_size=2) as b:
            ba = a.register_bucket(0, 8, dtype="bfloat16")
            with self.assertRaisesRegex(spex.SpexValueError, "registered as bfloat16; this request says float16"):
                b.register_bucket(0, 8, dtype="float16")
            with self.assertRaisesRegex(spex.SpexTypeError, "float32, bfloat16 or float16; got 'int8'"):
                b.register_bucket(1, 8, dtype="int8")
            with self.assertRaisesRegex(spex.SpexValueError, "wire_values"):
                b.register_bucket(2, 8, dtype="float16", params={"wire_values": "int4"})
            with self.assertRaisesRegex(spex.SpexTypeError, r"holds bfloat16; got a tensor of torch.float32"):
                ba.write(torch.zeros(8))
            with self.assertRaisesRegex(spex.SpexTypeError, "numpy lacks"):
                ba.write(np.zeros(8, np.float32))
            f16 = b.register_bucket(3, 8, dtype=np.float16)
            with self.assertRaisesRegex(spex.SpexTypeError, r"holds float16; got a numpy array of float32"):
                f16.write(np.zeros(8, np.float32))
            # An unknown enum value on the wire (a newer client) is refused naming the known ones.
            import spex.proto.spex_pb2 as pb

            with self.assertRaisesRegex(spex.SpexError, "unknown data type 9"):
                a._rpc("RegisterBucket", pb.RegisterBucketRequest(session_id=a.session_id, bucket_id=5,
                                                                  elements=8, dtype=9), 10)
            # The daemon keeps serving: a good bf16 exchange of both trainers.
            bb = b.register_bucket(0, 8, dtype=torch.bfloat16)
            res = run_threads([lambda: a.exchange(ba, torch.full((8,), 1.0, dtype=torch.bfloat16)) is not None,
                               lambda: b.exchange(bb, torch.full((8,), 2.0, dtype=torch.bfloat16)) is not None])
            self.assertEqual(res, [True, True])
            self.assertTrue(torch.equal(ba.output_tensor, torch.full((8,), 1.5, dtype=torch.bfloat16)))


class BadInputTest(ClusterTestCase):
    def test_wrong_dtype_and_size(self):
        import torch

        cl = self.start_cluster(1, 1)
        with spex.Client(cl.socket(0)) as c:
            b = c.register_bucket(0, 8)
            with self.assertRaisesRegex(spex.SpexTypeError, "float64.*float32|float32.*float64"):
                b.write(np.zeros(8, np.float64))
            with self.assertRaisesRegex(spex.SpexTypeError, r"torch\.float16"):
                c.exchange(b, torch.zeros(8, dtype=torch.float16))
            with self.assertRaisesRegex(spex.SpexValueError, "registered with 8 elements; got an array of 9"):
                b.write(np.zeros(9, np.float32))
            with self.assertRaisesRegex(spex.SpexValueError, "8 elements; got a tensor of 4"):
                c.exchange(b, torch.zeros(2, 2))
            with self.assertRaisesRegex(spex.SpexTypeError, "list"):
                b.write([0.0] * 8)
            self.assertEqual(b.next_step, 0, "a rejected exchange must not advance the step")
            c.exchange(b, torch.ones(2, 4))  # 8 elements in any shape are fine
            self.assertEqual(float(b.output[0]), 1.0)

    def test_own_input_errors_register_nothing(self):
        import torch

        cl = self.start_cluster(1, 1)
        with spex.Client(cl.socket(0)) as c:
            with self.assertRaisesRegex(spex.SpexTypeError, "own_input must be a torch tensor"):
                c.register_bucket(0, 8, own_input=np.zeros(8, np.float32))
            with self.assertRaisesRegex(spex.SpexTypeError, "holds float32; own_input is torch.float64"):
                c.register_bucket(0, 8, own_input=torch.zeros(8, dtype=torch.float64))
            with self.assertRaisesRegex(spex.SpexValueError, "contiguous tensor of 8 elements, got 9"):
                c.register_bucket(0, 8, own_input=torch.zeros(9))
            with self.assertRaisesRegex(spex.SpexValueError, r"contiguous tensor of 8 elements, got 8 \(contiguous: False"):
                c.register_bucket(0, 8, own_input=torch.zeros(16)[::2])
            # /dev/shm too small for the storage (a container's default): refused before it moves.
            small = mock.Mock(f_bavail=10, f_frsize=4096)
            t = torch.zeros(8192)
            with mock.patch("os.statvfs", return_value=small):
                with self.assertRaisesRegex(spex.OwnInputRefused, "half of what /dev/shm has free"):
                    c.register_bucket(0, 8192, own_input=t)
            self.assertFalse(t.is_shared())
            self.assertEqual(list(c.stats().buckets), [])
            b = c.register_bucket(0, 8)
            self.assertFalse(b.own_input)
            c.exchange(b, np.ones(8, np.float32))

    def test_registration_errors(self):
        cl = self.start_cluster(1, 2)
        with self.assertRaisesRegex(spex.SpexError, "--local_trainers=3"):
            spex.Client(cl.socket(0), local_rank=0, local_size=3)
        with spex.Client(cl.socket(0), local_rank=0, local_size=2) as c:
            with self.assertRaisesRegex(spex.SpexValueError, "local_rank 0 is held by session"):
                spex.Client(cl.socket(0), local_rank=0, local_size=2)
            c.register_bucket(0, 10)
            with self.assertRaisesRegex(spex.SpexValueError, "already registered"):
                c.register_bucket(0, 10)
            with self.assertRaisesRegex(spex.SpexValueError, "unknown compressor 'nonsense'"):
                c.register_bucket(1, 10, compressor="nonsense")
            with self.assertRaisesRegex(spex.SpexValueError, r"density must be in \(0, 1\]"):
                c.register_bucket(2, 10, density=1.5)
            with self.assertRaisesRegex(spex.SpexValueError, "positive integer"):
                c.register_bucket(3, 0)
            with spex.Client(cl.socket(0), local_rank=1, local_size=2) as c1:
                with self.assertRaisesRegex(spex.SpexValueError, "registered with 10 elements"):
                    c1.register_bucket(0, 11)
        with self.assertRaisesRegex(spex.SpexValueError, "local_rank 2 must be in 0..1"):
            spex.Client(cl.socket(0), local_rank=2, local_size=2)

    def test_no_daemon_at_the_socket(self):
        missing = "/tmp/spex-test-no-such-dir/node0.sock"
        with self.assertRaises(spex.DaemonUnavailableError) as cm:
            spex.Client(missing)
        self.assertIn(missing, str(cm.exception))
        self.assertIn("spexd --socket=", str(cm.exception))
        self.assertIn("SPEX_SOCKET", str(cm.exception))

    def test_stale_socket_file(self):
        import tempfile

        d = tempfile.mkdtemp(prefix="spex-stale-", dir="/tmp")
        self.addCleanup(lambda: __import__("shutil").rmtree(d, ignore_errors=True))
        path = os.path.join(d, "node0.sock")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(path)  # a socket file nobody listens on, as a crashed daemon leaves
        s.close()
        self.assertRaisesWithin(spex.DaemonUnavailableError, 5, lambda: spex.Client(path),
                                contains=[path, "stale", "start the daemon"])

    def test_exchange_timeout_when_a_local_trainer_is_missing(self):
        cl = self.start_cluster(1, 2)
        with spex.Client(cl.socket(0), local_rank=0, local_size=2, exchange_timeout=1.5) as c, \
                spex.Client(cl.socket(0), local_rank=1, local_size=2) as c1:
            b = c.register_bucket(0, 64)
            c1.register_bucket(0, 64)  # registered but never exchanges
            self.assertRaisesWithin(spex.ExchangeTimeoutError, 5, lambda: c.exchange(b),
                                    contains=["bucket 0 step 0 not published", "same buckets"])

    def test_bucket_order_differs_between_nodes(self):
        cl = self.start_cluster(2, 1)

        def node(n):
            with spex.Client(cl.socket(n), local_rank=0, local_size=1, exchange_timeout=30) as c:
                b = c.register_bucket(0, 100 + n)  # same id, different sizes on the two nodes
                return c.exchange(b, np.ones(100 + n, np.float32))

        results = run_threads([lambda: node(0), lambda: node(1)], timeout=40)
        for r in results:
            self.assertIsInstance(r, spex.BucketOrderError, repr(r))
            self.assertIn("bucket order differs", str(r))
            self.assertEqual(r.code, "FAILED_PRECONDITION")

    def test_bucket_order_differs_over_rpc(self):
        cl = self.start_cluster(2, 1)

        def node(n):
            with spex.Client(cl.socket(n), local_rank=0, local_size=1, exchange_timeout=30) as c:
                b = c.register_bucket(n, 100)  # different ids on the two nodes
                return c.exchange(b, np.ones(100, np.float32), mode="rpc")

        for r in run_threads([lambda: node(0), lambda: node(1)], timeout=40):
            self.assertIsInstance(r, spex.BucketOrderError, repr(r))


class LocalClusterPinTest(ClusterTestCase):
    """LocalCluster(pin=...): node n's daemon and the processes popen(n) starts on node n's cores."""

    def pinned_cluster(self, nodes, trainers, pin):
        from spex.cluster import LocalCluster
        from spex_test_util import QUIET, SPEXD

        c = LocalCluster(SPEXD, nodes=nodes, trainers=trainers, args=QUIET, pin=pin)
        self.addCleanup(c.cleanup)
        return c.start()

    def daemon_node(self, cl, pid):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        for n in range(cl.nodes):
            if f"--socket={cl.socket(n)}".encode() in argv:
                return n
        self.fail(f"daemon {pid} has none of the cluster's sockets: {argv}")

    def test_node_pinning_binds_daemons_and_trainers_and_exchanges_exactly(self):
        cl = self.pinned_cluster(2, 1, "node")
        allowed = sorted(os.sched_getaffinity(0))
        self.assertEqual(cl.pin, "node")
        pids = cl.daemon_pids()
        self.assertEqual(len(pids), 2)
        seen = set()
        for pid in pids:
            n = self.daemon_node(cl, pid)
            seen.add(n)
            want = cl.node_cpus(n)
            self.assertTrue(want and set(want) <= set(allowed), want)
            self.assertEqual(os.sched_getaffinity(pid), set(want), f"daemon of node {n}")
        self.assertEqual(seen, {0, 1})
        if len(allowed) >= 2:
            self.assertFalse(set(cl.node_cpus(0)) & set(cl.node_cpus(1)), "nodes share no core")
        self.assertIn("node 1 on core(s)", cl.pin_description())

        # popen(n) runs on node n's cores, and the caller's own preexec_fn still runs after it.
        marker = os.path.join(cl.dir, "preexec-ran")
        p = cl.popen(1, ["sleep", "5"], preexec_fn=lambda: open(marker, "w").close())
        self.addCleanup(p.wait)
        self.addCleanup(p.kill)
        self.assertEqual(os.sched_getaffinity(p.pid), set(cl.node_cpus(1)))
        self.assertTrue(os.path.exists(marker))

        # The per-node launch still forms one world: an exact dense average across both nodes.
        def node(n):
            with spex.Client(cl.socket(n), local_rank=0, local_size=1, exchange_timeout=30) as c:
                b = c.register_bucket(0, 1000)
                return np.array(c.exchange(b, np.full(1000, 2.0 * n + 1, np.float32)))

        for r in run_threads([lambda: node(0), lambda: node(1)], timeout=60):
            self.assertIsInstance(r, np.ndarray, repr(r))
            np.testing.assert_array_equal(r, np.full(1000, 2.0, np.float32))

    def test_no_pinning_leaves_placement_to_the_scheduler(self):
        cl = self.pinned_cluster(2, 1, "none")
        everything = os.sched_getaffinity(0)
        for pid in cl.daemon_pids():  # mpirun's default would bind 2 ranks to a core each
            self.assertEqual(os.sched_getaffinity(pid), everything)
        self.assertIsNone(cl.node_cpus(0))
        self.assertIn("not pinned", cl.pin_description())

    def test_core_shares_and_choices(self):
        from spex.cluster import LocalCluster
        from spex_test_util import SPEXD

        cl = LocalCluster(SPEXD, nodes=3, trainers=2, pin="node")
        self.addCleanup(cl.cleanup)
        cl._cpus = [0, 1, 2, 3, 4, 5, 6, 7]  # as on an 8-core machine
        self.assertEqual([cl.node_cpus(n) for n in range(3)], [[0, 1], [2, 3], [4, 5]])
        cl._cpus = [4, 6]  # fewer cores than nodes: nodes share them in turn
        self.assertEqual([cl.node_cpus(n) for n in range(3)], [[4], [6], [4]])
        with self.assertRaises(ValueError):
            cl.node_cpus(3)
        with self.assertRaises(ValueError) as e:
            LocalCluster(SPEXD, nodes=2, trainers=1, pin="rank")
        self.assertIn("pin must be one of none, node, auto", str(e.exception))
        ncpu = len(os.sched_getaffinity(0))
        # auto: pinned exactly when daemons and trainers outnumber the cores
        busy = LocalCluster(SPEXD, nodes=2, trainers=ncpu, pin="auto")
        self.addCleanup(busy.cleanup)
        self.assertEqual(busy.pin, "node")
        if ncpu >= 2:
            idle = LocalCluster(SPEXD, nodes=1, trainers=1, pin="auto")
            self.addCleanup(idle.cleanup)
            self.assertEqual(idle.pin, "none")


class DaemonRestartTest(ClusterTestCase):
    def test_daemon_restarted_between_exchanges(self):
        from spex.cluster import LocalCluster
        from spex_test_util import QUIET, SPEXD

        cl = self.start_cluster(1, 1)
        c = spex.Client(cl.socket(0), exchange_timeout=60)
        self.addCleanup(c.close)
        b = c.register_bucket(0, 32)
        c.exchange(b, np.ones(32, np.float32))
        cl.stop()  # SIGTERM: the daemon sets the doorbell's shutdown flag
        again = LocalCluster(SPEXD, nodes=1, trainers=1, args=QUIET, socket_dir=cl.dir).start()
        self.addCleanup(again.stop)
        self.assertRaisesWithin(spex.SessionLostError, 10, lambda: c.exchange(b, np.ones(32, np.float32)),
                                contains=["restarted", "restart every trainer"])
        with self.assertRaises(spex.SessionLostError):
            c.exchange(b, np.ones(32, np.float32), mode="rpc")

    def test_daemon_killed_and_restarted_during_a_wait(self):
        from spex.cluster import LocalCluster
        from spex_test_util import QUIET, SPEXD

        cl = self.start_cluster(1, 2)
        c = spex.Client(cl.socket(0), local_rank=0, local_size=2, exchange_timeout=120, probe_interval=0.5)
        self.addCleanup(c.close)
        b = c.register_bucket(0, 32)
        waiting = threading.Event()

        def exchange():
            waiting.set()
            return c.exchange(b, np.ones(32, np.float32))  # trainer 1 never comes: waits

        def crash_and_restart():
            waiting.wait()
            time.sleep(0.5)
            cl.kill()  # SIGKILL: no shutdown flag, the trainer must notice by itself
            again = LocalCluster(SPEXD, nodes=1, trainers=2, args=QUIET, socket_dir=cl.dir).start()
            self.addCleanup(again.stop)

        t0 = time.monotonic()
        r, _ = run_threads([exchange, crash_and_restart], timeout=30)
        self.assertIsInstance(r, spex.DaemonUnavailableError, repr(r))  # SessionLostError is one
        self.assertLess(time.monotonic() - t0, 15)

    def test_daemon_stopped_during_a_wait(self):
        cl = self.start_cluster(1, 2)
        c = spex.Client(cl.socket(0), local_rank=0, local_size=2, exchange_timeout=120)
        self.addCleanup(c.close)
        b = c.register_bucket(0, 32)
        threading.Timer(0.5, cl.stop).start()
        self.assertRaisesWithin(spex.DaemonUnavailableError, 10, lambda: c.exchange(b, np.ones(32, np.float32)),
                                contains=[cl.socket(0), "shut down"])


class DaemonWorldTest(unittest.TestCase):
    """One function starts every daemon world (spex.world.start_daemon_world): EmulatedCluster's
    daemons too, on its hosts through mpirun inside its login host, with the MPI settings its
    script wrote for the network; checked on the command built, nothing started."""

    def emulated(self, **kwargs):
        from spex.emulated import EmulatedCluster
        from spex_test_util import SPEXD

        tmp = tempfile.TemporaryDirectory(prefix="spex-world-", dir="/tmp")
        self.addCleanup(tmp.cleanup)
        return EmulatedCluster(SPEXD, script=find_script(), dir=tmp.name, **kwargs)

    def test_emulated_daemons_start_through_start_daemon_world(self):
        from spex.emulated import EmulatedCluster
        from spex.world import WorldNode, daemon_world_command

        cl = self.emulated(hosts=3, trainers=2, args=["--threads=1"])
        with open(os.path.join(cl.dir, "mpi.env"), "w") as f:
            f.write("OMPI_MCA_btl=tcp,self\nOMPI_MCA_plm_rsh_agent=/x/rsh\n"
                    "OMPI_MCA_coll_tuned_allreduce_algorithm?=4\n")
        cl._up = True  # the network is not built: only the daemon world's start is checked
        calls = []

        def fake_start(spexd, nodes, flags=(), **kwargs):
            calls.append((spexd, list(nodes), list(flags), kwargs))
            return subprocess.Popen(["true"])

        env = {"PATH": os.environ.get("PATH", ""), "OMPI_MCA_btl": "vader,self"}
        with mock.patch("spex.cluster.start_daemon_world", fake_start), mock.patch.dict(os.environ, env, clear=True), \
                mock.patch.object(EmulatedCluster, "_answers", staticmethod(lambda path: True)):
            cl.start()
            cl.stop()
        self.assertEqual(len(calls), 1)
        spexd, nodes, flags, kwargs = calls[0]
        self.assertEqual(spexd, cl.spexd)
        self.assertEqual(nodes, [WorldNode(cl.socket(n), 2, host=f"host{n + 1}") for n in range(3)])
        self.assertEqual(flags, ["--threads=1"])
        self.assertEqual(kwargs["prefix"], ["bash", cl.script, "exec", cl.dir, "login"])
        # The network's settings win over the environment's; `?=` ones only fill a gap.
        self.assertEqual(kwargs["env"]["OMPI_MCA_btl"], "tcp,self")
        self.assertEqual(kwargs["env"]["OMPI_MCA_plm_rsh_agent"], "/x/rsh")
        self.assertEqual(kwargs["env"]["OMPI_MCA_coll_tuned_allreduce_algorithm"], "4")
        self.assertEqual(cl.mpi_env({"OMPI_MCA_coll_tuned_allreduce_algorithm": "2"})
                         ["OMPI_MCA_coll_tuned_allreduce_algorithm"], "2")
        self.assertEqual(kwargs["stdout"].name, cl.log_path)

        # The command: mpirun inside the login host, one application context per emulated host.
        cmd = daemon_world_command(spexd, nodes, flags, prefix=kwargs["prefix"])
        self.assertEqual(cmd[:8], ["bash", cl.script, "exec", cl.dir, "login", "mpirun", "--bind-to", "none"])
        self.assertEqual(" ".join(cmd[8:]).split(" : "),
                         [f"-np 1 --host host{n + 1} {cl.spexd} --socket={cl.socket(n)} --local_trainers=2 --threads=1"
                          for n in range(3)])

    def test_a_world_that_exits_while_starting_is_named(self):
        from spex.cluster import LocalCluster
        from spex_test_util import SPEXD

        cl = LocalCluster(SPEXD, nodes=1, trainers=1, args=["--no_such_spexd_flag"], start_timeout=60)
        self.addCleanup(cl.cleanup)
        with self.assertRaisesRegex(SpexError, r"(?s)spexd exited with [1-9]\d* while starting:.*no_such_spexd_flag"):
            cl.start()
        self.assertIsNone(cl.proc)

    def test_emulated_cluster_without_mpi_settings_says_so(self):
        cl = self.emulated(hosts=2, trainers=1)
        with self.assertRaisesRegex(SpexError, r"no MPI settings .*mpi\.env"):
            cl.mpi_env()


def executable(path: str) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("#!/bin/sh\nexit 0\n")
    os.chmod(path, 0o755)
    return path


class PackageLookupTest(unittest.TestCase):
    """The installed package finds what it needs without a source checkout: the emulated-cluster
    script ships inside it (package data copied from deploy/ at install time), and spexd comes from
    the documented settings only (the spexd argument, $SPEXD, then PATH), never from bazel-bin of
    the current or the source directory; without one of them the error names SPEXD."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        # A directory that looks like a checkout (deploy/, bazel-bin/) as the working directory:
        # the package must not take anything from it.
        self.cwd = self.tmp.name
        executable(os.path.join(self.cwd, "deploy", "emulated_cluster.sh"))
        executable(os.path.join(self.cwd, "bazel-bin", "daemon", "spexd"))
        old = os.getcwd()
        os.chdir(self.cwd)
        self.addCleanup(os.chdir, old)
        self.package = os.path.dirname(os.path.abspath(spex.__file__))
        self.assertFalse(self.package.startswith(os.path.realpath(REPO)),
                         f"the test must import the installed package, not the source tree ({self.package})")

    def env(self, **values):
        clean = {k: v for k, v in os.environ.items() if k not in ("SPEXD", "SPEX_EMULATED_CLUSTER")}
        clean.update(values)
        return mock.patch.dict(os.environ, clean, clear=True)

    def test_script_ships_with_the_package(self):
        with self.env():
            script = find_script()
        self.assertEqual(os.path.dirname(os.path.dirname(script)), self.package)
        self.assertTrue(filecmp.cmp(script, os.path.join(REPO, "deploy", "emulated_cluster.sh"), shallow=False))
        self.assertTrue(os.stat(script).st_mode & stat.S_IXUSR, "the shipped script lost its mode")
        delayer = os.path.join(os.path.dirname(script), "emulated", "nfq_delay.c")
        self.assertTrue(filecmp.cmp(delayer, os.path.join(REPO, "deploy", "emulated", "nfq_delay.c"), shallow=False))

    def test_script_setting_wins_and_a_wrong_one_is_named(self):
        mine = executable(os.path.join(self.cwd, "mine.sh"))
        with self.env(SPEX_EMULATED_CLUSTER=mine):
            self.assertEqual(find_script(), mine)
        with self.env(SPEX_EMULATED_CLUSTER=os.path.join(self.cwd, "missing.sh")):
            with self.assertRaisesRegex(SpexError, r"SPEX_EMULATED_CLUSTER"):
                find_script()

    def test_spexd_not_taken_from_bazel_bin(self):
        with self.env(PATH="/nonexistent"):
            with self.assertRaisesRegex(SpexError, r"set SPEXD"):
                find_spexd()

    def test_spexd_from_setting_then_path(self):
        bin_dir = os.path.join(self.cwd, "bin")
        on_path = executable(os.path.join(bin_dir, "spexd"))
        with self.env(PATH=bin_dir):
            self.assertEqual(find_spexd(), on_path)
        other = executable(os.path.join(self.cwd, "other", "spexd"))
        with self.env(SPEXD=other, PATH=bin_dir):
            self.assertEqual(find_spexd(), other)
            self.assertEqual(find_spexd(on_path), on_path)
        with self.env(SPEXD=os.path.join(self.cwd, "missing"), PATH=bin_dir):
            with self.assertRaisesRegex(SpexError, r"\$SPEXD"):
                find_spexd()


if __name__ == "__main__":
    unittest.main()
