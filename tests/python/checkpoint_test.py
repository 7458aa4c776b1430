"""Checkpoint and restore through real daemons and the DDP hook (issue 29): 4 DDP processes (gloo)
on 2 spexd x 2 trainers train a small MLP for 6 steps without a stop, and again stopped after 3
steps with the hook's state_dict saved by torch.save beside the model's and the optimiser's; the
daemons and trainers are then stopped, fresh daemons started, and fresh trainers resume from the
files (load_state_dict after register): the parameters end bit-identical (SHA-1) to the
uninterrupted run on every rank for micro, dgc, sage and micro under the hook's momentum
correction; resumed without load_state_dict they differ. Also: another rank's dict (another node) and another compressor are refused by
load_state_dict naming what differs; through the Python client, a record streamed in several
512 KiB chunks loads, and a corrupt or truncated record is refused (DATA_LOSS) while the daemon
keeps serving. And, on a fake client: the hook's records go back to buckets of the same layout,
another layout is refused naming both."""

import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

from spex_test_util import FakeClient, FakeGradBucket

STEPS, STOP = 6, 3
# "micro/mc": micro under the hook's momentum correction (its u buffers are in the state_dict).
COMPRESSORS = ["micro", "dgc", "sage", "micro/mc"]
DAEMON_FLAGS = ["--min_sparse_elements=0", "--dense_fallback=off"]


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
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))

    def batch(step):
        gen = torch.Generator().manual_seed(1000 * rank + step)
        return torch.randn(8, 32, generator=gen), torch.randint(0, 10, (8,), generator=gen)

    def train(compressor, first, last, load=None, save=None):
        model = make()
        # find_unused_parameters=True: DDP keeps its initial bucket layout (no rebuild), so the
        # resumed job's first step has the layout the checkpoint was saved with.
        ddp = DDP(model, find_unused_parameters=True)
        name, _, mod = compressor.partition("/")
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
        if save is not None:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "spex": state.state_dict()}, save)
        result = digest(model)
        state.close()
        dist.barrier()
        return result

    def ckpt(c, r=rank):
        return os.path.join(cfg["dir"], f"{c.replace('/', '-')}-rank{r}.pt")

    if cfg["phase"] == "first":
        for c in COMPRESSORS:
            out[f"whole {c}"] = train(c, 0, STEPS)
            out[f"first {c}"] = train(c, 0, STOP, save=ckpt(c))
    else:
        for c in COMPRESSORS:
            out[f"resumed {c}"] = train(c, STOP, STEPS, load=ckpt(c))
            # The same resume without the exchange state (the model and optimiser restored).
            saved = torch.load(ckpt(c))
            saved["spex"] = None
            torch.save(saved, ckpt(c) + ".nospex")
            out[f"unrestored {c}"] = train(c, STOP, STEPS, load=ckpt(c) + ".nospex")
        # Refusals before any step: another node's dict, another compressor's.
        ddp = DDP(make(), find_unused_parameters=True)
        state = spex.torch.register(ddp, compressor="micro", density=0.1, socket=cfg["socket"])
        other = torch.load(ckpt("micro", (rank + 2) % 4))["spex"]
        try:
            state.load_state_dict(other)
            out["other node"] = "accepted"
        except SpexValueError as e:
            out["other node"] = str(e)
        try:
            state.load_state_dict(torch.load(ckpt("dgc"))["spex"])
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
            self.assertEqual(len({r[f"whole {c}"] for r in self.first}), 1, f"{c}: ranks differ")

    def test_resume_without_the_exchange_state_differs(self):
        for c in COMPRESSORS:
            for first, second in zip(self.first, self.second):
                self.assertNotEqual(second[f"unrestored {c}"], first[f"whole {c}"], f"{c}, rank {first['rank']}")

    def test_another_world_or_compressor_is_refused_naming_it(self):
        for r in self.second:
            self.assertIn(f"saved on node {1 - r['rank'] // 2} of 2", r["other node"])
            self.assertIn(f"this trainer's daemon is node {r['rank'] // 2} of 2", r["other node"])
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
    """state_dict / load_state_dict of the hook on a fake client: the records go to the buckets
    of the same layout in the first iteration; another layout is refused naming both."""

    def make(self):
        import torch

        import spex.torch

        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))

        class Ddp:
            process_group = None

            def parameters(self):
                return model.parameters()

        client = FakeClient()
        state = spex.torch.SpexHookState(Ddp(), client=client)
        self.addCleanup(state.close)
        return state, client, list(model.parameters())

    def test_records_go_back_to_the_same_layout(self):
        state, _, p = self.make()
        state(FakeGradBucket(0, [p[3], p[2]])).wait()
        state(FakeGradBucket(1, [p[1], p[0]])).wait()
        saved = state.state_dict()
        self.assertEqual([(b["index"], b["params"], b["record"]) for b in saved["buckets"]],
                         [(0, [3, 2], b"record of 0"), (1, [1, 0], b"record of 1")])
        fresh, client, q = self.make()
        fresh.load_state_dict(saved)
        fresh(FakeGradBucket(0, [q[3], q[2]])).wait()
        fresh(FakeGradBucket(1, [q[1], q[0]])).wait()
        self.assertEqual(client.loaded, [(0, b"record of 0"), (1, b"record of 1")])

    def test_another_layout_is_refused_naming_both(self):
        from spex.errors import SpexError

        state, _, p = self.make()
        state(FakeGradBucket(0, [p[3], p[2], p[1], p[0]])).wait()
        saved = state.state_dict()
        fresh, client, q = self.make()
        fresh.load_state_dict(saved)
        with self.assertRaises(SpexError) as e:
            fresh(FakeGradBucket(0, [q[0], q[1], q[2], q[3]]))
        self.assertIn("holds parameters [0, 1, 2, 3]", str(e.exception))
        self.assertIn("held [3, 2, 1, 0]", str(e.exception))
        self.assertIn("find_unused_parameters=True", str(e.exception))
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
