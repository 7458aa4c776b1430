"""The spex DDP communication hook, unchanged, under every merger (issue 14 item 5): 4 DDP
processes (gloo) on 2 daemons x 2 trainers, DDP buckets of 0.1 MB so a step has several buckets to
merge, one spex-hooked model per process (one DDP model per daemon job, as in training: a static
plan may group any of the job's buckets, so a process that waited on one model before running
another's backward could stall, see --merger in docs/spexd.md). Per spexd --merger configuration:
  dense  the hooked model trains in lockstep with a copy under DDP's own gloo all-reduce, and
         their parameters stay within 2e-5 after every step;
  topk   at d = 0.01 (omgs: selection behind, its default), the parameters stay identical on
         every rank after every step.
The measuring plans (rgmerge's model, omgs's mgs) agree on their plan at step 3 and run it from
step 4, so the runs cover both halves."""

import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

STEPS = 7
HIDDEN = 1024  # 2.17 M parameters: several DDP buckets even before DDP's rebuild

CONFIGS = {  # name: (compressor, spexd flags)
    "fixed": ("dense", ["--merger=fixed", "--fixed_cycle_ms=1"]),
    "omgs": ("topk", ["--merger=omgs", "--omgs_threshold_elements=40000"]),
    "omgs_mgs": ("dense", ["--merger=omgs", "--omgs_mode=mgs", "--merge_plan_step=3"]),
    "rgmerge": ("dense", ["--merger=rgmerge"]),
    "rgmerge_model": ("topk", ["--merger=rgmerge", "--rgmerge_plan=model", "--merge_plan_step=3"]),
}


def worker(cfg):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import spex.torch
    from spex_test_util import digest

    rank, world = cfg["rank"], cfg["world"]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=cfg["rendezvous"], rank=rank, world_size=world)

    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(64, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN),
                                   torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
                                   torch.nn.Linear(HIDDEN, 10))

    out = {"rank": rank, "max_diff": [], "digests": [], "buckets": 0}
    m_spex, m_ref = make(), make()
    d_spex = DDP(m_spex, bucket_cap_mb=0.1)
    d_ref = DDP(m_ref, bucket_cap_mb=0.1)
    state = spex.torch.register(d_spex, compressor=cfg["compressor"], density=0.01, socket=cfg["socket"])
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (m_spex, m_ref)]
    gen = torch.Generator().manual_seed(99 + rank)
    for _ in range(STEPS):
        x = torch.randn(8, 64, generator=gen)
        y = torch.randint(0, 10, (8,), generator=gen)
        for d, o in zip((d_spex, d_ref), opts):
            o.zero_grad()
            torch.nn.functional.cross_entropy(d(x), y).backward()
            o.step()
        out["max_diff"].append(max((a - b).abs().max().item() for a, b in zip(m_spex.parameters(), m_ref.parameters())))
        out["digests"].append(digest(m_spex))
        out["buckets"] = max(out["buckets"], len(state.buckets))
    state.close()
    with open(os.path.join(cfg["out"], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


def run_config(name):
    from spex_test_util import cluster

    compressor, flags = CONFIGS[name]
    c = cluster(2, 2, *flags)
    d = tempfile.mkdtemp(prefix=f"ddpmerge-{name}-", dir=os.environ.get("TEST_TMPDIR", "/tmp"))
    procs = []
    t0 = time.monotonic()
    tail = ""
    try:
        for rank in range(4):
            cfg = {"rank": rank, "world": 4, "socket": c.socket(rank // 2), "rendezvous": f"file://{d}/rdv",
                   "out": d, "compressor": compressor}
            env = dict(os.environ, LOCAL_RANK=str(rank % 2), LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), json.dumps(cfg)], env=env))
        try:
            for p in procs:
                p.wait(timeout=max(1, 120 - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise AssertionError(f"{name}: DDP workers did not finish within 120 s (a hang): {c.log_tail(40)}")
        tail = c.log_tail(40)
    finally:
        c.cleanup()
    results = []
    for rank in range(4):
        path = os.path.join(d, f"rank{rank}.json")
        if os.path.exists(path):
            with open(path) as f:
                results.append(json.load(f))
    return compressor, [p.returncode for p in procs], results, tail


class DdpMergeTest(unittest.TestCase):
    def check(self, name):
        compressor, codes, results, tail = run_config(name)
        self.assertEqual(codes, [0, 0, 0, 0], f"{name}: a DDP worker failed; daemons: {tail}")
        self.assertEqual(len(results), 4)
        for r in results:
            self.assertGreaterEqual(r["buckets"], 3, f"{name}: too few DDP buckets to merge")
            self.assertEqual(len(r["max_diff"]), STEPS)
            if compressor == "dense":
                self.assertTrue(all(x < 2e-5 for x in r["max_diff"]),
                                f"{name} rank {r['rank']}: dense hook differs from gloo: {r['max_diff']}")
        for step in range(STEPS):
            self.assertEqual(len({r["digests"][step] for r in results}), 1,
                             f"{name}: parameters differ between ranks at step {step}")

    def test_fixed(self):
        self.check("fixed")

    def test_omgs(self):
        self.check("omgs")

    def test_omgs_mgs(self):
        self.check("omgs_mgs")

    def test_rgmerge(self):
        self.check("rgmerge")

    def test_rgmerge_model(self):
        self.check("rgmerge_model")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("{"):
        worker(json.loads(sys.argv[1]))
    else:
        unittest.main()
