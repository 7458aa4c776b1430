"""Checkpoint and restore through real daemons and the DDP hook (issue 29): 4 DDP processes (gloo)
on 2 spexd x 2 trainers train an MLP for 6 steps, the hook's state_dict saved by torch.save
beside the model's and the optimiser's after step 3; the daemons and trainers are then stopped,
fresh daemons started, and fresh trainers resume from the files (load_state_dict after
register). DDP is built as users build it (defaults, find_unused_parameters=False): its first
iteration after the restart has one bucket of every parameter in model order, while the
checkpoint holds its rebuilt layout (two buckets, in reverse order), so the hook maps the saved
state per parameter. The parameters end bit-identical (SHA-1) to the uninterrupted run on every
rank for dense, micro, exdyna, topk, dgc, sage and sidco_e, each sparse one also under the
hook's momentum correction, and for micro with find_unused_parameters=True (no rebuild);
resumed without load_state_dict every sparse one differs. state_dict is a collective whose
world state lands in rank 0's dict: every rank resumes from rank 0's file. Also: another node's
rank's own dict and another compressor are refused by load_state_dict naming what differs; through the
Python client, a record streamed in several 512 KiB chunks loads, and a corrupt or truncated
record is refused (DATA_LOSS) while the daemon keeps serving. And, on a fake client: the hook's
records go back to the saved buckets, DDP buckets of another layout are mapped onto them per
parameter, another model is refused naming the parameter."""

import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

from spex_test_util import FakeClient, FakeGradBucket

STEPS, STOP = 6, 3
SPARSE = ["micro", "exdyna", "topk", "dgc", "sage", "sidco_e"]
# "/mc": under the hook's momentum correction (its u buffers are in the state_dict); "/unused":
# DDP built with find_unused_parameters=True (it keeps its initial layout, no rebuild).
COMPRESSORS = ["dense"] + SPARSE + [f"{c}/mc" for c in SPARSE] + ["micro/unused"]
DAEMON_FLAGS = ["--min_sparse_elements=0", "--dense_fallback=off"]
HIDDEN = 512  # 284,682 parameters: DDP's initial bucket holds all of them, its rebuilt layout two


def worker(cfg):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import spex.torch
    from spex.errors import SpexValueError
    from spex_test_util import digest

    rank = cfg["rank"]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=cfg["rendezvous"], rank=rank, world_size=4)
    out = {"rank": rank}

    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(32, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN),
                                   torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 10))

    def batch(step):
        gen = torch.Generator().manual_seed(1000 * rank + step)
        return torch.randn(8, 32, generator=gen), torch.randint(0, 10, (8,), generator=gen)

    def train(compressor, first, last, load=None, save=None):
        """Steps [first, last); saves the checkpoint `save` after step STOP (and trains on)."""
        model = make()
        name, _, mod = compressor.partition("/")
        ddp = DDP(model, find_unused_parameters=(mod == "unused"))
        mc = 0.9 if mod == "mc" else None
        state = spex.torch.register(ddp, compressor=name, density=0.1, socket=cfg["socket"], momentum_correction=mc)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.0 if mc else 0.9)
        if load is not None:
            saved = torch.load(load)
            model.load_state_dict(saved["model"])
            opt.load_state_dict(saved["opt"])
            if saved.get("spex") is not None:
                state.load_state_dict(saved["spex"])
        for step in range(first, last):
            x, y = batch(step)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
            if save is not None and step + 1 == STOP:
                # Every rank calls state_dict (a collective); rank 0's dict holds the world's state,
                # and every rank saves its file here so that the others' can be shown refused.
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "spex": state.state_dict()},
                           save)
        result = digest(model)
        state.close()
        dist.barrier()
        return result

    def ckpt(c, r=rank):
        return os.path.join(cfg["dir"], f"{c.replace('/', '-')}-rank{r}.pt")

    if cfg["phase"] == "first":
        for c in COMPRESSORS:
            out[f"whole {c}"] = train(c, 0, STEPS, save=ckpt(c))
    else:
        for c in COMPRESSORS:
            # Rank 0's file (the world's state) on every rank; micro also from each rank's own file.
            out[f"resumed {c}"] = train(c, STOP, STEPS, load=ckpt(c, 0))
            if c == "micro/mc":
                out[f"resumed own {c}"] = train(c, STOP, STEPS, load=ckpt(c))
            if c == "dense":
                continue  # dense keeps no state: resumed without it, it is the same
            # The same resume without the exchange state (the model and optimiser restored).
            saved = torch.load(ckpt(c, 0))
            saved["spex"] = None
            torch.save(saved, ckpt(c) + ".nospex")
            out[f"unrestored {c}"] = train(c, STOP, STEPS, load=ckpt(c) + ".nospex")
        # Refusals before any step: another node's rank's own dict (it holds its node's state only),
        # another compressor's.
        ddp = DDP(make())
        state = spex.torch.register(ddp, compressor="micro", density=0.1, socket=cfg["socket"])
        other = torch.load(ckpt("micro", 3 if rank < 2 else 1))["spex"]  # the other node's local rank 1
        try:
            state.load_state_dict(other)
            out["other node"] = "accepted"
        except SpexValueError as e:
            out["other node"] = str(e)
        try:
            state.load_state_dict(torch.load(ckpt("dgc", 0))["spex"])
            out["other compressor"] = "accepted"
        except SpexValueError as e:
            out["other compressor"] = str(e)
        state.close()
    with open(os.path.join(cfg["dir"], f"{cfg['phase']}-rank{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


def run_phase(directory, phase):
    """Fresh daemons and 4 fresh trainer processes for one phase; returns every rank's results."""
    from spex_test_util import cluster

    c = cluster(2, 2, *DAEMON_FLAGS)
    procs = []
    t0 = time.monotonic()
    try:
        for rank in range(4):
            cfg = {"rank": rank, "socket": c.socket(rank // 2), "phase": phase, "dir": directory,
                   "rendezvous": f"file://{directory}/rdv-{phase}"}
            env = dict(os.environ, LOCAL_RANK=str(rank % 2), LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), json.dumps(cfg)], env=env))
        for p in procs:
            p.wait(timeout=max(1, 150 - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise AssertionError(f"phase {phase}: DDP workers did not finish within 150 s (a hang)")
    finally:
        c.cleanup()
    codes = [p.returncode for p in procs]
    if codes != [0, 0, 0, 0]:
        raise AssertionError(f"phase {phase}: a DDP worker failed (exit codes {codes}; see the log above)")
    results = []
    for rank in range(4):
        with open(os.path.join(directory, f"{phase}-rank{rank}.json")) as f:
            results.append(json.load(f))
    return results


class DdpCheckpointTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="ckpt-", dir=os.environ.get("TEST_TMPDIR", "/tmp"))
        cls.first = run_phase(cls.dir, "first")
        cls.second = run_phase(cls.dir, "second")

    def test_resumed_job_ends_bit_identical_to_the_uninterrupted_one(self):
        for c in COMPRESSORS:
            for first, second in zip(self.first, self.second):
                self.assertEqual(second[f"resumed {c}"], first[f"whole {c}"], f"{c}, rank {first['rank']}")
                if f"resumed own {c}" in second:
                    self.assertEqual(second[f"resumed own {c}"], first[f"whole {c}"], f"{c} (own file)")
            self.assertEqual(len({r[f"whole {c}"] for r in self.first}), 1, f"{c}: ranks differ")

    def test_resume_without_the_exchange_state_differs(self):
        for c in COMPRESSORS:
            if c == "dense":
                continue
            for first, second in zip(self.first, self.second):
                self.assertNotEqual(second[f"unrestored {c}"], first[f"whole {c}"], f"{c}, rank {first['rank']}")

    def test_another_nodes_dict_or_compressor_is_refused_naming_it(self):
        for r in self.second:
            node = r["rank"] // 2
            self.assertIn(f"the records of nodes [{1 - node}] of 2", r["other node"])
            self.assertIn(f"this trainer needs nodes [{node}]", r["other node"])
            self.assertIn("load the dict state_dict returned on rank 0", r["other node"])
            self.assertIn("compressor='dgc'", r["other compressor"])
            self.assertIn("compressor='micro'", r["other compressor"])


class ClientCheckpointTest(unittest.TestCase):
    def test_chunked_record_loads_and_corrupt_ones_are_refused(self):
        import numpy as np

        import spex
        from spex.errors import SpexError
        from spex_test_util import cluster

        c = cluster(1, 1, *DAEMON_FLAGS)
        self.addCleanup(c.cleanup)
        client = spex.Client(c.socket(0), local_rank=0, local_size=1)
        n = 600_000  # a record of about 2.4 MB: three chunks
        a = client.register_bucket(1, n, "topk", 0.01)
        rng = np.random.default_rng(0)
        for _ in range(2):
            client.exchange(a, rng.standard_normal(n).astype(np.float32))
        record = client.save_bucket_state(a)
        self.assertGreater(len(record), 2 * client.STATE_CHUNK_BYTES)
        b = client.register_bucket(2, n, "topk", 0.01)
        corrupt = bytearray(record)
        corrupt[len(record) // 2] ^= 1
        for bad, code in ((bytes(corrupt), "DATA_LOSS"), (record[:-100], "DATA_LOSS"), (b"", "DATA_LOSS")):
            with self.assertRaises(SpexError) as e:
                client.load_bucket_state(b, bad)
            self.assertEqual(e.exception.code, code, str(e.exception))
        small = client.register_bucket(3, n // 2, "topk", 0.01)
        with self.assertRaises(SpexError) as e:
            client.load_bucket_state(small, record)
        self.assertIn("elements", str(e.exception))
        client.unregister_bucket(small)
        client.load_bucket_state(b, record)  # accepted (another id, same layout)
        client.unregister_bucket(b)  # at step 0 it would come before bucket 1 (daemon order)
        x = rng.standard_normal(n).astype(np.float32)
        want = np.array(client.exchange(a, x))  # the step after the save, uninterrupted
        client.close()
        # A restarted trainer (a new job on the daemon: the buckets start over) loads the record.
        again = spex.Client(c.socket(0), local_rank=0, local_size=1)
        self.addCleanup(again.close)
        fresh = again.register_bucket(1, n, "topk", 0.01)
        again.load_bucket_state(fresh, record)
        self.assertTrue(np.array_equal(np.array(again.exchange(fresh, x)), want),
                        "the restored bucket continues as the saved one")

class HookStateTest(unittest.TestCase):
    """state_dict / load_state_dict of the hook on a fake client: the records go back to the saved
    buckets; DDP buckets of another layout are mapped onto them per parameter; another model is
    refused naming the parameter."""

    def make(self, results=None, out_features=2):
        import torch

        import spex.torch

        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, out_features))

        class Ddp:
            process_group = None

            def parameters(self):
                return model.parameters()

        client = FakeClient(results)
        state = spex.torch.SpexHookState(Ddp(), client=client)
        self.addCleanup(state.close)
        return state, client, list(model.parameters())

    def test_records_go_back_to_the_same_layout(self):
        state, _, p = self.make()
        state(FakeGradBucket(0, [p[3], p[2]])).wait()
        state(FakeGradBucket(1, [p[1], p[0]])).wait()
        saved = state.state_dict()
        self.assertEqual([(b["index"], b["params"], b["records"]) for b in saved["buckets"]],
                         [(0, [3, 2], {0: b"record of 0"}), (1, [1, 0], {0: b"record of 1"})])
        fresh, client, q = self.make()
        fresh.load_state_dict(saved)
        out = fresh(FakeGradBucket(0, [q[3], q[2]])).wait()
        fresh(FakeGradBucket(1, [q[1], q[0]])).wait()
        self.assertEqual(client.loaded, [(0, b"record of 0"), (1, b"record of 1")])
        self.assertEqual(out.data_ptr(), fresh.buckets[0].output_tensor.data_ptr(), "the same layout: no copies")

    def test_another_layout_is_mapped_per_parameter(self):
        import torch

        state, _, p = self.make()
        state(FakeGradBucket(0, [p[3], p[2]])).wait()  # the saved (rebuilt) layout: 2 + 6, 3 + 12 elements
        state(FakeGradBucket(1, [p[1], p[0]])).wait()
        saved = state.state_dict()
        # The resumed job's first iteration: DDP's initial layout, one bucket in model order.
        results = [torch.arange(100.0, 115.0), torch.arange(200.0, 208.0)]  # saved bucket 1 is complete first
        fresh, client, q = self.make(results)
        fresh.load_state_dict(saved)
        g = [torch.full((t.numel(),), float(i + 1)) for i, t in enumerate(q)]
        out = fresh(FakeGradBucket(0, q, buffer=torch.cat(g))).wait()
        self.assertEqual(client.loaded, [(0, b"record of 0"), (1, b"record of 1")])
        self.assertEqual([b.elements for b in fresh.buckets], [8, 15])
        self.assertEqual(client.handed[0].tolist(), [2.0] * 3 + [1.0] * 12)  # saved bucket 1: p1, p0
        self.assertEqual(client.handed[1].tolist(), [4.0] * 2 + [3.0] * 6)  # saved bucket 0: p3, p2
        want = torch.cat([results[0][3:], results[0][:3], results[1][2:], results[1][:2]])  # p0, p1, p2, p3
        self.assertTrue(torch.equal(out, want), f"{out} != {want}")
        # DDP's rebuilt layout is the saved one again: no copies, and no new buckets.
        ids = [b.id for b in fresh.buckets]
        out = fresh(FakeGradBucket(0, [q[3], q[2]])).wait()
        fresh(FakeGradBucket(1, [q[1], q[0]])).wait()
        self.assertEqual([b.id for b in fresh.buckets], ids)
        self.assertEqual(out.data_ptr(), fresh.buckets[0].output_tensor.data_ptr())

    def test_a_layout_saved_before_ddps_rebuild_is_followed_and_said_inexact(self):
        state, _, p = self.make()
        state.ddp.find_unused_parameters = False  # DDP as usual: it rebuilds after its first iteration
        state(FakeGradBucket(0, [p[0], p[1], p[2], p[3]])).wait()
        saved = state.state_dict()
        self.assertFalse(saved["settled"])
        fresh, client, q = self.make()
        fresh.ddp.find_unused_parameters = False
        fresh.load_state_dict(saved)
        with self.assertWarnsRegex(RuntimeWarning, "saved before DDP rebuilt its buckets"):
            fresh(FakeGradBucket(0, [q[0], q[1], q[2], q[3]])).wait()
        self.assertEqual(client.loaded, [(0, b"record of 0")])
        fresh.ddp._has_rebuilt_buckets = True  # DDP rebuilt: the hook follows, as the saved job did
        fresh(FakeGradBucket(0, [q[3], q[2]])).wait()
        fresh(FakeGradBucket(1, [q[1], q[0]])).wait()
        self.assertEqual([b.id for b in fresh.buckets], [1 << 20, (1 << 20) + 1])
        self.assertTrue(fresh.state_dict()["settled"])

    def test_another_model_is_refused_naming_the_parameter(self):
        from spex.errors import SpexError

        state, _, p = self.make()
        state(FakeGradBucket(0, [p[3], p[2], p[1], p[0]])).wait()
        saved = state.state_dict()
        fresh, client, q = self.make(out_features=5)
        fresh.load_state_dict(saved)
        with self.assertRaises(SpexError) as e:
            fresh(FakeGradBucket(0, [q[0], q[1], q[2], q[3]]))
        self.assertIn("held 23 elements", str(e.exception))
        self.assertIn("the model differs from the saved one", str(e.exception))
        self.assertEqual(client.loaded, [])

    def test_another_world_loads_every_nodes_record_resized(self):
        import warnings

        state, _, p = self.make()
        state(FakeGradBucket(0, [p[3], p[2], p[1], p[0]])).wait()
        saved = state.state_dict()
        # As if saved on 2 nodes x 1 trainer: both nodes' records (this fake world is 1 x 1).
        saved["world"] = {"node_count": 2, "local_trainers": 1}
        saved["buckets"][0]["records"] = {0: b"node 0", 1: b"node 1"}
        fresh, client, q = self.make()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fresh.load_state_dict(saved)
        self.assertIn("resuming a checkpoint of 2 node(s) x 1 trainer(s) on 1 x 1", str(caught[0].message))
        fresh(FakeGradBucket(0, [q[3], q[2], q[1], q[0]])).wait()
        self.assertEqual(client.loaded, [(0, b"node 0", "resized"), (0, b"node 1", "resized")])
        # A node's records missing (a rank's own dict, not rank 0's) is refused before anything loads.
        del saved["buckets"][0]["records"][1]
        other, client, _ = self.make()
        with self.assertRaisesRegex(Exception, r"the records of nodes \[0\] of 2 .* a resize onto another world "
                                               r"needs nodes \[0, 1\]"):
            other.load_state_dict(saved)
        self.assertEqual(client.loaded, [])

    def test_after_the_first_step_or_not_a_state_dict_is_refused(self):
        from spex.errors import SpexError, SpexValueError

        state, _, p = self.make()
        with self.assertRaises(SpexValueError):
            state.load_state_dict({"version": 99})
        state(FakeGradBucket(0, [p[0]])).wait()
        with self.assertRaises(SpexError):
            state.load_state_dict(state.state_dict())


if __name__ == "__main__" and len(sys.argv) == 2 and sys.argv[1].startswith("{"):
    worker(json.loads(sys.argv[1]))
