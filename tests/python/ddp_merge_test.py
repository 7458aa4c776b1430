"""The spex DDP communication hook, unchanged, under every merger: 4 DDP processes (gloo) on 2
daemons x 2 trainers, DDP buckets of 0.1 MB so a step has several buckets to merge, one
spex-hooked model per process (one DDP model per daemon job, as in training: a static plan may
group any of the job's buckets, so a process that waited on one model before running another's
backward could stall, see --merger in docs/spexd.md). Per spexd --merger configuration:
  dense  the hooked model trains in lockstep with a copy under DDP's own gloo all-reduce, and
         their parameters stay within 2e-5 after every step;
  topk   at d = 0.01, every bucket sparse from the first step (--dense_fallback=off
         --min_sparse_elements=1: no dense probe steps), each step's averaged gradient is checked
         against a reference built from every rank's own gradient: per node acc = residual + the
         sum of its two trainers' gradients, and every element of 4 x the result must be the sum
         of acc over the nodes that sent it (none, node 0, node 1 or both: pattern B), the
         residual then zeroed where a node sent; each node sent about d x the model's elements
         (within one per bucket). An exchange returning zeros, the dense sum, or values not from
         acc fails. omgs selects behind (its default), but its threshold leaves each of the
         model's three DDP buckets (all over 40000 elements) in a group of its own; rgmerge's
         model plan selects ahead.
In every configuration the parameters are identical on every rank after every step. The
measuring plans (rgmerge's model, omgs's mgs) agree on their plan at step 3 and run it from
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

DENSITY = 0.01
NODES, TRAINERS = 2, 2
# top-k on every bucket from the first step: no dense probe steps, no bucket too small to sparsify.
SPARSE_ALWAYS = ["--dense_fallback=off", "--min_sparse_elements=1"]

CONFIGS = {  # name: (compressor, spexd flags)
    "fixed": ("dense", ["--merger=fixed", "--fixed_cycle_ms=1"]),
    "omgs": ("topk", ["--merger=omgs", "--omgs_threshold_elements=40000", *SPARSE_ALWAYS]),
    "omgs_mgs": ("dense", ["--merger=omgs", "--omgs_mode=mgs", "--merge_plan_step=3"]),
    "rgmerge": ("dense", ["--merger=rgmerge"]),
    "rgmerge_model": ("topk", ["--merger=rgmerge", "--rgmerge_plan=model", "--merge_plan_step=3", *SPARSE_ALWAYS]),
}


class TopkReference:
    """Pattern B with error feedback, element by element, from every rank's own gradient (rank r
    is local trainer r % 2 of node r // 2). It does not know the merger's groups: which elements a
    node sent is read off the result (the subset of nodes whose acc sums to it), and the count of
    them is checked against d x the elements instead."""

    def __init__(self, n):
        self.n = n
        self.reset()

    def reset(self):
        """No residual: the hook registered new buckets (DDP rebuilt its buckets after the first
        step), which start from zero in the daemon."""
        import torch

        self.residual = [torch.zeros(self.n) for _ in range(NODES)]

    def step(self, grads, result):
        """grads: every rank's flat local gradient; result: the hook's averaged one. Returns
        (elements no subset explains, worst relative error, elements each node sent)."""
        import torch

        acc = [self.residual[n] + sum(grads[n * TRAINERS + t] for t in range(TRAINERS)) for n in range(NODES)]
        target = result * (NODES * TRAINERS)  # a power of two: exact
        cands = torch.stack([torch.zeros_like(acc[0]), acc[0], acc[1], acc[0] + acc[1]])
        err = (cands - target).abs()
        best_err, best = err.min(0)
        scale = acc[0].abs() + acc[1].abs()
        rel = best_err / scale.clamp_min(1e-30)
        bad = int(((best_err > 1e-5 * scale) & (best_err > 1e-30)).sum())
        sent = [(best == 1) | (best == 3), (best == 2) | (best == 3)]
        for n in range(NODES):
            self.residual[n] = torch.where(sent[n], torch.zeros_like(acc[n]), acc[n])
        return bad, float(rel.max()), [int(s.sum()) for s in sent]


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

    out = {"rank": rank, "max_diff": [], "digests": [], "buckets": 0, "reference": []}
    m_spex, m_ref = make(), make()
    d_spex = DDP(m_spex, bucket_cap_mb=0.1)
    d_ref = DDP(m_ref, bucket_cap_mb=0.1)
    state = spex.torch.register(d_spex, compressor=cfg["compressor"], density=DENSITY, socket=cfg["socket"])
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (m_spex, m_ref)]
    n = sum(p.numel() for p in m_spex.parameters())
    reference = TopkReference(n) if cfg["compressor"] == "topk" and rank == 0 else None
    generation = None  # the hook's bucket generation the reference's residuals belong to
    gen = torch.Generator().manual_seed(99 + rank)
    for _ in range(STEPS):
        x = torch.randn(8, 64, generator=gen)
        y = torch.randint(0, 10, (8,), generator=gen)
        if cfg["compressor"] == "topk":
            # This rank's own gradient, as DDP hands it to the hook (the module without DDP).
            own = torch.autograd.grad(torch.nn.functional.cross_entropy(m_spex(x), y), list(m_spex.parameters()))
            flat = torch.cat([g.reshape(-1) for g in own])
            grads = [torch.empty_like(flat) for _ in range(world)]
            dist.all_gather(grads, flat)
        for d, o in zip((d_spex, d_ref), opts):
            o.zero_grad()
            torch.nn.functional.cross_entropy(d(x), y).backward()
            if d is d_spex and reference is not None:
                if state.generation != generation:  # DDP rebuilt its buckets: new buckets, no residual
                    reference.reset()
                    generation = state.generation
                result = torch.cat([p.grad.reshape(-1) for p in m_spex.parameters()])
                bad, worst, sent = reference.step(grads, result)
                out["reference"].append({"bad": bad, "worst": worst, "sent": sent, "n": n})
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
        if compressor == "topk":
            self.check_topk(name, results[0])

    def check_topk(self, name, r):
        self.assertEqual(len(r["reference"]), STEPS, f"{name}: rank 0 checked too few steps")
        for step, ref in enumerate(r["reference"]):
            self.assertEqual(ref["bad"], 0, f"{name} step {step}: {ref['bad']} elements of the result are no "
                             f"sum of the nodes' acc (worst relative error {ref['worst']:.3g})")
            # k = max(1, floor(d n)) per exchanged bucket or group: within one per bucket of d x n.
            want = DENSITY * ref["n"]
            for node, sent in enumerate(ref["sent"]):
                self.assertLessEqual(abs(sent - want), r["buckets"] + 1,
                                     f"{name} step {step}: node {node} sent {sent} elements, top-k at d = {DENSITY} "
                                     f"sends about {want:.0f}")

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
