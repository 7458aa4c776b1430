"""A checkpoint resumed on another world (docs/checkpoint.md#another-world), through real daemons
and the DDP hook: 4 DDP processes (gloo) on 2 spexd x 2 trainers train an MLP for 3 steps with
micro under the hook's momentum correction; every rank calls state_dict (a collective) and rank
0's dict, the world's state, is saved with torch.save. On 1 spexd x 4, 4 client threads exchange
3 steps of a micro bucket and the node's record is saved (no DDP: one world of trainer processes
less, for the suite's time). The daemons and
trainers are stopped, and the checkpoints resumed on other worlds: 2x2 -> 1x2, 2x2 -> 3x1 and
1x4 -> 2x2. On each, before the trainers start, one client per new node loads every old node's
record resized (as the hook's local rank 0 does) and saves its bucket again: summed over the new
nodes and divided by the new world's trainers, the residual equals the old nodes' sum divided by
the old world's trainers, element by element, to float rounding, and each element lies on one
new node. Then, on 3x1 (one world of trainer processes, for the suite's time), the trainers
resume from rank 0's file: the hook warns that the resume is not exact, every trainer's
momentum-correction buffer starts as the mean of the old trainers', and the resized job trains 2
steps in step on every rank (equal, finite parameters). Refused, naming what differs: another
compressor, another model (another hidden size: its parameters do not fill the saved
buckets)."""

import json
import os
import struct
import subprocess
import sys
import tempfile
import time
import unittest

STOP, MORE = 3, 2
HIDDEN = 256
COMPRESSOR, DENSITY, MOMENTUM = "micro", 0.1, 0.9
DAEMON_FLAGS = ["--min_sparse_elements=0", "--dense_fallback=off"]
# (old nodes, old trainers per node) -> (new nodes, new trainers per node)
RESIZES = [((2, 2), (1, 2)), ((2, 2), (3, 1)), ((1, 4), (2, 2))]
# The resizes whose DDP trainers also resume (each costs a world of trainer processes: the suite's
# time); the others are checked through the daemons' records only.
TRAINED = [((2, 2), (3, 1))]


def residual_of(record: bytes):
    """The residual (float32) of a daemon's bucket record (daemon/engine/checkpoint.cc's
    EncodeBucketCheckpoint, format version 2), with its world and step."""
    import numpy as np

    at = 0

    def take(fmt):
        nonlocal at
        v = struct.unpack_from("<" + fmt, record, at)
        at += struct.calcsize("<" + fmt)
        return v if len(v) > 1 else v[0]

    def string():
        nonlocal at
        n = take("Q")
        at += n

    magic, version = take("IH")
    assert (magic, version) == (0x4B435053, 2), (hex(magic), version)
    world = take("iii")
    take("Q")  # bucket id
    elements = take("Q")
    string()  # compressor
    for _ in range(take("Q")):  # parameters
        string()
        string()
    take("d")  # density
    string()  # policy
    take("I")  # dtype
    step = take("Q")
    take("BQQBQQQBQf")  # mode, probes, the sparse all-reduce probe, Ok-Topk
    bounds = take("Q")  # Ok-Topk's region bounds (uint32), skipped
    at += 4 * bounds
    n = take("Q")
    assert n == elements, (n, elements)
    residual = np.frombuffer(record, dtype="<f4", count=n, offset=at)
    return residual, world, step


def worker(cfg):
    import warnings

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import spex.torch
    from spex.errors import SpexError, SpexValueError
    from spex_test_util import digest

    rank, world = cfg["rank"], cfg["world"]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=cfg["rendezvous"], rank=rank, world_size=world)
    out = {"rank": rank}

    def make(hidden=HIDDEN):
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(32, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))

    def batch(step):
        gen = torch.Generator().manual_seed(1000 * rank + step)
        return torch.randn(8, 32, generator=gen), torch.randint(0, 10, (8,), generator=gen)

    def hook(ddp):
        return spex.torch.register(ddp, compressor=COMPRESSOR, density=DENSITY, socket=cfg["socket"],
                                   momentum_correction=MOMENTUM)

    model = make()
    ddp = DDP(model)
    if cfg["phase"] == "save":
        state = hook(ddp)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(STOP):
            x, y = batch(step)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
        spex_state = state.state_dict()  # every rank: a collective
        if rank == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "spex": spex_state}, cfg["file"])
    else:
        saved = torch.load(cfg["file"])
        # Refusals first (before any step of these states): another compressor, another model.
        other = spex.torch.SpexHookState(ddp, compressor="topk", density=DENSITY, socket=cfg["socket"],
                                         momentum_correction=MOMENTUM)  # not registered with DDP
        try:
            other.load_state_dict(saved["spex"])
            out["other compressor"] = "accepted"
        except SpexValueError as e:
            out["other compressor"] = str(e)
        other.close()
        small = DDP(make(HIDDEN // 2))
        other = hook(small)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            other.load_state_dict(saved["spex"])
        x, y = batch(0)
        try:
            torch.nn.functional.cross_entropy(small(x), y).backward()
            out["other model"] = "accepted"
        except (SpexError, RuntimeError) as e:
            out["other model"] = str(e)
        other.close()
        del small
        dist.barrier()
        # The resize.
        state = hook(ddp)
        model.load_state_dict(saved["model"])
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        opt.load_state_dict(saved["opt"])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            state.load_state_dict(saved["spex"])
        out["warnings"] = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        # Every trainer's momentum starts as the old trainers' mean (kept until the first step).
        worst = 0.0
        for entry, old in zip(state._restore["buckets"], saved["spex"]["buckets"]):
            mean = torch.stack([u.double() for u in old["momentum"].values()]).mean(0).float()
            worst = max(worst, float((entry["momentum"] - mean).abs().max()))
        out["momentum error"] = worst
        for step in range(STOP, STOP + MORE):
            x, y = batch(step)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
        out["digest"] = digest(model)
        out["finite"] = all(bool(torch.isfinite(p).all()) for p in model.parameters())
        state.close()
    with open(os.path.join(cfg["dir"], f"{cfg['phase']}-{cfg['tag']}-rank{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


def run_trainers(c, directory, phase, tag, shape, file):
    """shape[0] x shape[1] DDP processes on cluster c; returns every rank's results."""
    nodes, local = shape
    world = nodes * local
    procs = []
    t0 = time.monotonic()
    try:
        for rank in range(world):
            cfg = {"rank": rank, "world": world, "socket": c.socket(rank // local), "phase": phase, "tag": tag,
                   "dir": directory, "file": file, "rendezvous": f"file://{directory}/rdv-{phase}-{tag}"}
            env = dict(os.environ, LOCAL_RANK=str(rank % local), LOCAL_WORLD_SIZE=str(local), OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), json.dumps(cfg)], env=env))
        for p in procs:
            p.wait(timeout=max(1, 120 - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise AssertionError(f"{phase} {tag}: DDP workers did not finish within 120 s (a hang)")
    codes = [p.returncode for p in procs]
    if codes != [0] * world:
        raise AssertionError(f"{phase} {tag}: a DDP worker failed (exit codes {codes}; see the log above)")
    results = []
    for rank in range(world):
        with open(os.path.join(directory, f"{phase}-{tag}-rank{rank}.json")) as f:
            results.append(json.load(f))
    return results


def clients_state(c, shape, elements=11018, steps=3):
    """A checkpoint taken without DDP (one world of trainer processes less, for the suite's time):
    shape[1] client threads per node exchange `steps` random steps of one micro bucket, then every
    node's local rank 0 saves its record; in the form of the hook's rank 0 state_dict."""
    import threading

    import numpy as np

    import spex
    from spex_test_util import run_threads

    nodes, local = shape
    records = {}
    done = threading.Barrier(nodes * local)

    def trainer(node, rank):
        client = spex.Client(c.socket(node), local_rank=rank, local_size=local)
        try:
            b = client.register_bucket(7, elements, COMPRESSOR, DENSITY)
            rng = np.random.default_rng(100 * node + rank)
            for _ in range(steps):
                client.exchange(b, rng.standard_normal(elements).astype(np.float32))
            if rank == 0:
                records[node] = client.save_bucket_state(b)
            done.wait(60)
        finally:
            client.close()

    for r in run_threads([lambda n=n, r=r: trainer(n, r) for n in range(nodes) for r in range(local)]):
        if isinstance(r, BaseException):
            raise r
    return {"world": {"node_count": nodes, "local_trainers": local},
            "buckets": [{"index": 0, "id": 7, "elements": elements, "records": records}]}


def resized_residuals(c, shape, spex_state):
    """Every new node's residual of every saved bucket after loading every old node's record
    resized, through one client per node (the daemon's records saved right after the loads)."""
    import spex

    nodes, local = shape
    got = {}
    for node in range(nodes):
        client = spex.Client(c.socket(node), local_rank=0, local_size=local)
        try:
            for e in spex_state["buckets"]:
                b = client.register_bucket(e["id"], e["elements"], COMPRESSOR, DENSITY)
                for k in sorted(e["records"]):
                    client.load_bucket_state(b, e["records"][k], resize=True)
                residual, world, step = residual_of(client.save_bucket_state(b))
                got[(node, e["index"])] = (residual.copy(), world, step)
        finally:
            client.close()
    return got


class ResizeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from spex_test_util import cluster

        cls.dir = tempfile.mkdtemp(prefix="resize-", dir=os.environ.get("TEST_TMPDIR", "/tmp"))
        cls.saved, cls.checked, cls.resumed = {}, {}, {}
        import torch

        # 2x2 through DDP and the hook (every resize it resumes); 1x4 through clients (its records
        # only are resized).
        saved = {}
        for old in sorted({o for o, _ in RESIZES}):
            tag = f"{old[0]}x{old[1]}"
            c = cluster(old[0], old[1], *DAEMON_FLAGS)
            try:
                if any(o == old for o, _ in TRAINED):
                    run_trainers(c, cls.dir, "save", tag, old, os.path.join(cls.dir, f"{tag}.pt"))
                    saved[old] = torch.load(os.path.join(cls.dir, f"{tag}.pt"))["spex"]
                else:
                    saved[old] = clients_state(c, old)
            finally:
                c.cleanup()

        for old, new in RESIZES:
            tag = f"{old[0]}x{old[1]}-to-{new[0]}x{new[1]}"
            file = os.path.join(cls.dir, f"{old[0]}x{old[1]}.pt")
            cls.saved[(old, new)] = saved[old]
            c = cluster(new[0], new[1], *DAEMON_FLAGS)
            try:
                cls.checked[(old, new)] = resized_residuals(c, new, cls.saved[(old, new)])
                if (old, new) in TRAINED:
                    cls.resumed[(old, new)] = run_trainers(c, cls.dir, "resume", tag, new, file)
            finally:
                c.cleanup()

    def test_the_residual_keeps_each_elements_share_of_the_average(self):
        import numpy as np

        for (old, new), got in self.checked.items():
            spex_state = self.saved[(old, new)]
            self.assertEqual(spex_state["world"], {"node_count": old[0], "local_trainers": old[1]})
            for e in spex_state["buckets"]:
                what = f"{old} -> {new}, bucket {e['index']}"
                olds = [residual_of(e["records"][k]) for k in range(old[0])]
                self.assertEqual([w for _, w, _ in olds], [(old[0], k, old[1]) for k in range(old[0])], what)
                want = sum(r.astype(np.float64) for r, _, _ in olds) / (old[0] * old[1])
                self.assertGreater(np.abs(want).max(), 0, f"{what}: nothing unsent (the test is void)")
                news = [got[(j, e["index"])] for j in range(new[0])]
                self.assertEqual({s for _, _, s in news}, {olds[0][2]}, f"{what}: the step carries over")
                total = sum(r.astype(np.float64) for r, _, _ in news) / (new[0] * new[1])
                err = np.abs(total - want) / (1e-30 + np.abs(want).max())
                self.assertLess(float(err.max()), 1e-6, what)
                holders = sum((r != 0).astype(int) for r, _, _ in news)
                self.assertLessEqual(int(holders.max()), 1, f"{what}: an element on two nodes")
                for j, (r, _, _) in enumerate(news):
                    off = np.ones(len(r), dtype=bool)
                    off[j::new[0]] = False
                    self.assertFalse(r[off].any(), f"{what}: node {j} holds elements of another node")

    def test_the_resized_job_trains_in_step_and_says_it_is_not_exact(self):
        for (old, new), ranks in self.resumed.items():
            what = f"{old} -> {new}"
            self.assertEqual(len({r["digest"] for r in ranks}), 1, f"{what}: ranks differ")
            for r in ranks:
                self.assertTrue(r["finite"], what)
                self.assertLess(r["momentum error"], 1e-6, what)
                self.assertEqual(len(r["warnings"]), 1, f"{what}: {r['warnings']}")
                self.assertIn(f"a checkpoint of {old[0]} node(s) x {old[1]} trainer(s) on {new[0]} x {new[1]}",
                              r["warnings"][0])
                self.assertIn("compressors' state starts afresh", r["warnings"][0])

    def test_another_compressor_or_model_is_refused_naming_it(self):
        for (old, new), ranks in self.resumed.items():
            for r in ranks:
                self.assertIn("compressor='micro'", r["other compressor"])
                self.assertIn("compressor='topk'", r["other compressor"])
                self.assertIn("the model differs from the saved one", r["other model"])


if __name__ == "__main__" and len(sys.argv) == 2 and sys.argv[1].startswith("{"):
    worker(json.loads(sys.argv[1]))
