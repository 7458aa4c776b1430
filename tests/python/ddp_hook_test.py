"""Tests of the spex DDP communication hook: 4 DDP processes (gloo) on 2 daemons x 2 trainers.
Every process trains the same model twice in lockstep, once through the spex hook (dense) and
once with DDP's own gloo all-reduce, and records after every step the parameters' digest and
the largest difference to the gloo model; also DDP's bucket rebuild (fresh bucket ids per
generation, the previous generation unregistered), zero copy (DDP's own bucket as the daemon's
input, the same bits as copying it, dense and micro), the RPC path with the plain
register_comm_hook form, a float16 model under torch's GradScaler (the hook must skip exactly
the steps DDP skips, after a step whose node sums are past float16's range), and the errors for a float64 model, a wrong world size, an unknown
compressor or parameter given to spex.torch.register, and nodes whose bucket ids differ (the
daemon's "bucket order differs", which must reach backward() on every rank, never hang)."""

import copy
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest
import warnings

STEPS = 6
HIDDEN = 512  # 301,066 parameters: one bucket before DDP's rebuild, two after


def cpu_gradscaler():
    """torch's GradScaler on the CPU. torch 1.13 runs it on CUDA only: its constructor disables
    it without CUDA, scale() asserts a CUDA tensor, and its two kernels
    (_amp_foreach_non_finite_check_and_unscale_, _amp_update_scale_) have no CPU version. This
    subclass keeps GradScaler's own step/unscale_/update logic and does what those kernels do,
    in Python; the gradients are float16 (a float16 model with no float32 master copy)."""
    from unittest import mock

    import torch
    import torch.cuda.amp.grad_scaler as gs

    def update_scale(scale, growth_tracker, found_inf, growth, backoff, interval):
        if found_inf.item() > 0:
            scale.mul_(backoff)
            growth_tracker.fill_(0)
        elif growth_tracker.item() + 1 == interval:
            scale.mul_(growth)
            growth_tracker.fill_(0)
        else:
            growth_tracker.add_(1)
        return scale

    torch._amp_update_scale_ = update_scale

    class CpuGradScaler(gs.GradScaler):
        def __init__(self, **kwargs):
            with mock.patch.object(gs, "amp_definitely_not_available", return_value=False):
                super().__init__(**kwargs)

        def scale(self, outputs):
            if self._scale is None:
                self._lazy_init_scale_growth_tracker(outputs.device)
            return outputs * self._scale

        def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
            with torch.no_grad():
                for group in optimizer.param_groups:
                    for p in group["params"]:
                        if p.grad is None:
                            continue
                        if not torch.isfinite(p.grad).all():
                            found_inf.fill_(1.0)
                        p.grad.copy_(p.grad.float() * inv_scale)
            return {found_inf.device: found_inf}

    return CpuGradScaler


def worker(cfg):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import spex
    import spex.torch
    from spex_test_util import digest

    rank, world = cfg["rank"], cfg["world"]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=cfg["rendezvous"], rank=rank, world_size=world)
    out = {"rank": rank}
    CpuGradScaler = cpu_gradscaler()

    class HalfLinear(torch.nn.Module):
        """A float16 model whose forward the CPU runs in torch 1.13 (an elementwise product and
        a sum): the gradient of w is the input times the loss scale."""

        def __init__(self, n):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(n, dtype=torch.float16))

        def forward(self, x):
            return (self.w * x).sum()

    def make(seed=0, dtype=torch.float32):
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(64, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN),
                                   torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 10)).to(dtype)

    def lockstep(label, attach, steps):
        """Trains a spex-hooked and a gloo DDP model side by side on this rank's batches."""
        m_spex, m_ref = make(), make()
        d_spex = DDP(m_spex)
        d_ref = DDP(m_ref)
        state = attach(d_spex)
        o_spex = torch.optim.SGD(m_spex.parameters(), lr=0.1, momentum=0.9)
        o_ref = torch.optim.SGD(m_ref.parameters(), lr=0.1, momentum=0.9)
        gen = torch.Generator().manual_seed(1234 + rank)
        rec = {"digests": [], "max_diff": [], "buckets": [], "daemon_buckets": [], "own_input": []}
        for step in range(steps):
            x = torch.randn(8, 64, generator=gen)
            y = torch.randint(0, 10, (8,), generator=gen)
            for d, o in ((d_spex, o_spex), (d_ref, o_ref)):
                o.zero_grad()
                torch.nn.functional.cross_entropy(d(x), y).backward()
                o.step()
            rec["digests"].append(digest(m_spex))
            rec["max_diff"].append(max((a - b).abs().max().item()
                                       for a, b in zip(m_spex.parameters(), m_ref.parameters())))
            rec["buckets"].append([[b.id, b.elements] for b in state.buckets])
            rec["daemon_buckets"].append(sorted(s.bucket_id for s in state.client.stats().buckets))
            rec["own_input"].append([b.own_input for b in state.buckets])
        state.close()
        dist.barrier()  # every session said Goodbye before the next phase opens new ones
        out[label] = rec

    lockstep("doorbell", lambda d: spex.torch.register(d, compressor="dense", socket=cfg["socket"]), STEPS)
    # The same with the hook copying DDP's bucket into the slot (zero_copy=False), and sparse
    # (micro) both ways: DDP's own bucket as the daemon's input must give the same bits.
    lockstep("doorbell_copy", lambda d: spex.torch.register(d, compressor="dense", socket=cfg["socket"],
                                                            zero_copy=False, id_base=10 << 32), STEPS)
    lockstep("micro_zero_copy", lambda d: spex.torch.register(d, compressor="micro", density=0.05,
                                                              socket=cfg["socket"], id_base=11 << 32), STEPS)
    lockstep("micro_copy", lambda d: spex.torch.register(d, compressor="micro", density=0.05, socket=cfg["socket"],
                                                         zero_copy=False, id_base=12 << 32), STEPS)

    # A daemon that cannot take DDP's bucket (OwnInputRefused, e.g. another user's spexd): the
    # hook warns once and copies into the slots, with the same bits.
    def refusing(d):
        state = spex.torch.register(d, compressor="dense", socket=cfg["socket"], id_base=13 << 32)
        real = state.client.register_bucket

        def register(*args, **kwargs):
            if kwargs.get("own_input") is not None:
                raise spex.OwnInputRefused("RegisterBucket: own_input: refused by this test")
            return real(*args, **kwargs)

        state.client.register_bucket = register
        return state

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lockstep("refused", refusing, 3)
    out["refused_warnings"] = [str(w.message) for w in caught if "cannot be the daemon's input" in str(w.message)]

    def plain_rpc(d):
        state = spex.torch.SpexHookState(None, socket=cfg["socket"], mode="rpc", compressor="dense",
                                         id_base=1 << 32)
        d.register_comm_hook(state, spex.torch.hook)
        return state

    lockstep("rpc_plain", plain_rpc, 4)

    # A DDP world that is not nodes x local trainers is refused before anything is exchanged.
    sub = dist.new_group([0, 1])
    if rank in (0, 1):
        try:
            spex.torch.register(DDP(make(), process_group=sub), socket=cfg["socket"])
            out["world_error"] = None
        except spex.SpexValueError as e:
            out["world_error"] = str(e)
    dist.barrier()

    # An unknown compressor or parameter is refused by register() itself, naming what is accepted.
    for key, kwargs in (("compressor_error", {"compressor": "no_such_compressor", "density": 0.01}),
                        ("param_error", {"compressor": "dgc", "density": 0.01, "params": {"momentum": "0.9"}})):
        try:
            spex.torch.register(DDP(make()), socket=cfg["socket"], **kwargs)
            out[key] = None
        except spex.SpexValueError as e:
            out[key] = str(e)
    dist.barrier()

    # The two nodes number their buckets differently: the daemons refuse the first exchange
    # ("bucket order differs", FAILED_PRECONDITION) and backward raises it on every rank.
    node = rank // 2
    d_bad = DDP(make())
    state = spex.torch.register(d_bad, socket=cfg["socket"], compressor="topk", density=0.01,
                                id_base=(3 + node) << 32, exchange_timeout=30)
    t0 = time.monotonic()
    try:
        torch.nn.functional.cross_entropy(d_bad(torch.randn(8, 64)), torch.randint(0, 10, (8,))).backward()
        out["order_error"] = None
    except Exception as e:  # noqa: BLE001 - DDP wraps it in a RuntimeError
        out["order_error"] = f"{type(e).__name__}: {e}"
    out["order_error_s"] = time.monotonic() - t0
    out["order_error_type"] = type(state._error).__name__ if state._error is not None else None
    state.close()
    dist.barrier()

    # A bfloat16 model through the hook (docs/dtypes.md), built with spex.torch.half_ddp (torch
    # 1.13's DDP cannot broadcast bfloat16 over gloo): dense and micro@0.05, beside a float32
    # gloo model on the same batches; every rank's parameters identical after every step.
    for label, comp, density, base in (("bf16_dense", "dense", None, 5 << 32), ("bf16_micro", "micro", 0.05, 6 << 32)):
        m16, m32 = make(dtype=torch.bfloat16), make()
        d16, d32 = spex.torch.half_ddp(m16), DDP(m32)
        state = spex.torch.register(d16, socket=cfg["socket"], compressor=comp, density=density, id_base=base)
        o16 = torch.optim.SGD(m16.parameters(), lr=0.1)
        o32 = torch.optim.SGD(m32.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(4321 + rank)
        rec = {"digests": [], "max_diff": [], "dtypes": []}
        for step in range(4):
            x = torch.randn(8, 64, generator=gen)
            y = torch.randint(0, 10, (8,), generator=gen)
            for d, o, xx in ((d16, o16, x.to(torch.bfloat16)), (d32, o32, x)):
                o.zero_grad()
                torch.nn.functional.cross_entropy(d(xx).float(), y).backward()
                o.step()
            rec["digests"].append(digest(copy.deepcopy(m16).float()))  # exact: bf16 widens exactly
            rec["max_diff"].append(max((a.float() - b).abs().max().item()
                                       for a, b in zip(m16.parameters(), m32.parameters())))
            rec["dtypes"] = sorted({b.dtype for b in state.buckets})
        state.close()
        dist.barrier()
        out[label] = rec
    # Differing initial parameters are refused by half_ddp on every rank, naming the rank.
    try:
        spex.torch.half_ddp(make(seed=rank % 2, dtype=torch.bfloat16))
        out["half_ddp_error"] = None
    except spex.SpexValueError as e:
        out["half_ddp_error"] = str(e)
    # A DDP bucket mixing types (DDP itself buckets by type: a bucket object as the hook sees it).
    class Mixed:
        def index(self):
            return 0

        def buffer(self):
            return torch.zeros(20, dtype=torch.bfloat16)

        def parameters(self):
            return [torch.zeros(10, dtype=torch.bfloat16), torch.zeros(10)]

    probe = spex.torch.SpexHookState(None, socket=cfg["socket"], id_base=7 << 32)
    try:
        probe(Mixed())
        out["mixed_error"] = None
    except spex.SpexTypeError as e:
        out["mixed_error"] = str(e)
    probe.close()
    dist.barrier()

    # A float16 model under dynamic loss scaling (torch's GradScaler; docs/dtypes.md): through
    # the hook (topk, always sparse: pattern B; micro with the dense probe steps: pattern A and
    # a sparse bucket's dense step) and through DDP's own fp16 all-reduce, on the same
    # gradients. Step 2 hands in 40,000 on every rank at 64 positions: finite, and so is the
    # average, but a node's sum of two is past float16's range. Step 4 overflows on rank 3
    # (+Inf). Each run must skip exactly the steps DDP skips and keep DDP's scale after every
    # step; its parameters stay finite.
    out["gradscaler"] = {}
    for label, comp, params, base in (("ddp", None, None, None),
                                      ("topk", "topk", {"dense_fallback": "off"}, 8 << 32),
                                      ("micro", "micro", {}, 9 << 32)):
        model = HalfLinear(32768)
        ddp = DDP(model)
        state = None
        if comp is not None:
            state = spex.torch.register(ddp, socket=cfg["socket"], compressor=comp, density=0.01,
                                        params=params, id_base=base)
        opt = torch.optim.SGD(model.parameters(), lr=1e-6)
        scaler = CpuGradScaler(init_scale=1024.0, growth_interval=3)
        gen = torch.Generator().manual_seed(999 + rank)
        rec = {"scale": [], "skipped": [], "finite": True}
        for step in range(8):
            scale = scaler.get_scale()
            x = torch.randn(32768, generator=gen) * 0.01
            if step == 2:
                x[:64] = 40000.0 / scale  # the gradient is x times the scale: 40,000
            if step == 4 and rank == 3:
                x[7] = 1e5 / scale  # past 65,504: +Inf in float16
            opt.zero_grad()
            scaler.scale(ddp(x.half())).backward()
            scaler.step(opt)
            scaler.update()
            rec["scale"].append(scale)
            rec["skipped"].append(scaler.get_scale() < scale)
            rec["finite"] = rec["finite"] and bool(torch.isfinite(model.w).all())
        if state is not None:
            rec["dtypes"] = sorted({b.dtype for b in state.buckets})
            state.close()
        dist.barrier()
        out["gradscaler"][label] = rec

    # A float64 model: the hook refuses with a message naming the fix, backward raises it.
    d64 = DDP(make(dtype=torch.float64))
    state = spex.torch.register(d64, socket=cfg["socket"], id_base=2 << 32)
    try:
        d64(torch.randn(4, 64, dtype=torch.float64)).sum().backward()
        out["dtype_error"] = None
    except Exception as e:  # noqa: BLE001 - DDP wraps it in a RuntimeError
        out["dtype_error"] = f"{type(e).__name__}: {e}"
    state.close()
    with open(os.path.join(cfg["out"], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


class DdpHookTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from spex_test_util import cluster

        cls.cluster = cluster(2, 2)
        cls.dir = tempfile.mkdtemp(prefix="ddp-", dir=os.environ.get("TEST_TMPDIR", "/tmp"))
        procs = []
        t0 = time.monotonic()
        for rank in range(4):
            cfg = {"rank": rank, "world": 4, "socket": cls.cluster.socket(rank // 2),
                   "rendezvous": f"file://{cls.dir}/rdv", "out": cls.dir}
            env = dict(os.environ, LOCAL_RANK=str(rank % 2), LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), json.dumps(cfg)], env=env))
        try:
            for p in procs:
                p.wait(timeout=max(1, 150 - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise AssertionError("DDP workers did not finish within 150 s (a hang)")
        finally:
            cls.cluster.cleanup()
        cls.codes = [p.returncode for p in procs]
        cls.results = []
        for rank in range(4):
            path = os.path.join(cls.dir, f"rank{rank}.json")
            if os.path.exists(path):
                with open(path) as f:
                    cls.results.append(json.load(f))

    def setUp(self):
        self.assertEqual(self.codes, [0, 0, 0, 0], "a DDP worker failed (see the log above)")
        self.assertEqual(len(self.results), 4)

    def test_dense_hook_matches_gloo_allreduce(self):
        for r in self.results:
            for phase in ("doorbell", "rpc_plain"):
                diffs = r[phase]["max_diff"]
                self.assertTrue(all(d < 2e-5 for d in diffs), f"rank {r['rank']} {phase}: {diffs}")

    def test_parameters_identical_on_every_rank_after_every_step(self):
        for phase, steps in (("doorbell", STEPS), ("rpc_plain", 4)):
            per_rank = [r[phase]["digests"] for r in self.results]
            self.assertEqual(len(per_rank[0]), steps)
            for step in range(steps):
                self.assertEqual(len({d[step] for d in per_rank}), 1, f"{phase} step {step} differs")

    def test_zero_copy_hands_ddps_bucket_over_with_the_same_results(self):
        for r in self.results:
            for phase in ("doorbell", "micro_zero_copy"):
                self.assertTrue(all(all(step) for step in r[phase]["own_input"]),
                                f"rank {r['rank']} {phase}: the daemon did not take DDP's bucket: {r[phase]['own_input']}")
            for phase in ("doorbell_copy", "micro_copy"):
                self.assertFalse(any(any(step) for step in r[phase]["own_input"]), f"rank {r['rank']} {phase}")
            self.assertEqual(r["doorbell"]["digests"], r["doorbell_copy"]["digests"], f"rank {r['rank']} dense")
            self.assertEqual(r["micro_zero_copy"]["digests"], r["micro_copy"]["digests"], f"rank {r['rank']} micro")
            self.assertFalse(any(any(step) for step in r["refused"]["own_input"]), f"rank {r['rank']} refused")
            self.assertEqual(r["refused"]["digests"], r["doorbell_copy"]["digests"][:3], f"rank {r['rank']} refused")
            self.assertEqual(len(r["refused_warnings"]), 1, r["refused_warnings"])
            # Sparse training differs from the dense reference: the comparison is not vacuous.
            self.assertNotEqual(r["micro_copy"]["digests"][-1], r["doorbell_copy"]["digests"][-1])

    def test_rebuild_gets_new_bucket_ids_and_drops_the_old_ones(self):
        for r in self.results:
            buckets = r["doorbell"]["buckets"]
            self.assertEqual(buckets[0], [[0, 301066]], "generation 0: DDP's initial single bucket")
            gen1 = buckets[1]
            self.assertGreaterEqual(len(gen1), 2, f"DDP's rebuilt layout: {gen1}")
            self.assertEqual([b[0] for b in gen1], [(1 << 20) + i for i in range(len(gen1))])
            self.assertEqual(sum(b[1] for b in gen1), 301066)
            self.assertTrue(all(b == gen1 for b in buckets[1:]), "no further generations")
            self.assertEqual(r["doorbell"]["daemon_buckets"][-1], [b[0] for b in gen1],
                             "the daemon still holds generation 0")
            plain = r["rpc_plain"]["buckets"]
            self.assertEqual(plain[0], [[1 << 32, 301066]])
            self.assertEqual([b[0] for b in plain[-1]], [(1 << 32) + (1 << 20) + i for i in range(len(gen1))],
                             "the plain form (no DDP reference) follows the rebuild too")

    def test_world_size_mismatch_is_refused(self):
        for r in self.results[:2]:
            self.assertIsNotNone(r["world_error"])
            self.assertIn("2 ranks", r["world_error"])
            self.assertIn("2 nodes x 2 local trainers = 4", r["world_error"])

    def test_unknown_compressor_or_parameter_raises_at_register(self):
        for r in self.results:
            self.assertIsNotNone(r["compressor_error"])
            self.assertIn("unknown compressor 'no_such_compressor'; accepted: ", r["compressor_error"])
            for name in ("micro", "topk", "dgc", "exdyna"):
                self.assertIn(name, r["compressor_error"].split("accepted: ")[1])
            self.assertIsNotNone(r["param_error"])
            self.assertIn("dgc: unknown parameter 'momentum'; accepted: ", r["param_error"])

    def test_bucket_order_differing_between_nodes_raises_in_backward(self):
        for r in self.results:
            self.assertIsNotNone(r["order_error"], f"rank {r['rank']}: backward succeeded")
            self.assertIn("bucket order differs between nodes", r["order_error"])
            self.assertEqual(r["order_error_type"], "BucketOrderError")
            self.assertLess(r["order_error_s"], 20)

    def test_bf16_model_trains_through_the_hook(self):
        for label in ("bf16_dense", "bf16_micro"):
            digests = [self.results[r][label]["digests"] for r in range(4)]
            for step in range(4):
                self.assertEqual(len({d[step] for d in digests}), 1, f"{label} step {step}: ranks differ")
            for r in range(4):
                self.assertEqual(self.results[r][label]["dtypes"], ["bfloat16"], label)
        # bfloat16 training stays close to the float32 gloo run (bfloat16 keeps ~3 digits).
        for step, diff in enumerate(self.results[0]["bf16_dense"]["max_diff"]):
            self.assertLess(diff, 0.02, f"bf16 dense step {step}")

    def test_half_ddp_and_mixed_bucket_errors(self):
        for r in range(4):
            self.assertIn("initial parameters differ from rank 0's", self.results[r]["half_ddp_error"] or "")
            self.assertIn("rank 1", self.results[r]["half_ddp_error"])
            self.assertIn("mixes data types", self.results[r]["mixed_error"] or "")
            self.assertIn("torch.float32", self.results[r]["mixed_error"])

    def test_gradscaler_recovers_after_an_overflow_step_as_under_ddp(self):
        for r in self.results:
            runs = r["gradscaler"]
            ddp = runs["ddp"]
            self.assertEqual(ddp["skipped"], [s == 4 for s in range(8)], "DDP skips only the +Inf step")
            for label in ("topk", "micro"):
                self.assertEqual(runs[label]["dtypes"], ["float16"], label)
                self.assertEqual(runs[label]["skipped"], ddp["skipped"], f"rank {r['rank']} {label}")
                self.assertEqual(runs[label]["scale"], ddp["scale"], f"rank {r['rank']} {label}")
                self.assertTrue(runs[label]["finite"], f"rank {r['rank']} {label}: parameters not finite")

    def test_float64_model_raises_a_clear_error(self):
        for r in self.results:
            self.assertIsNotNone(r["dtype_error"])
            self.assertIn("float32", r["dtype_error"])
            self.assertIn("torch.float64", r["dtype_error"])


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]))
