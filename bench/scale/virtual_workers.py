#!/usr/bin/env python3
"""Time to accuracy at scale (docs/scale.md#time-to-accuracy-at-scale): the main job's MLP
(deploy/mainjob: the same model, data, SGD, lr, momentum, per-worker batch, evaluation and
target) trained by P virtual workers in ONE process. Every step each worker computes its gradient
on its own shard's batch (a loop of forward/backward on one model: every worker holds the same
parameters, since every worker applies the same average), and the P gradients go through

  ddp        their dense average (DDP's all-reduce; the main job's `gloo` run),
  micro:D    spex's real compressor with error feedback: kernels/reference_cluster.h, P nodes x 1
             trainer (or --layout NxT), through the C ABI of reference_cluster_c.cc (ctypes),
             one cluster per DDP bucket in DDP's layout (one bucket of every parameter at step 0,
             then DDP's rebuilt 25 MB buckets: [4.b 4.w 2.b 2.w] and [0.b 0.w]), as spexd sees
             them through spex.torch; /aF: Accordion's adaptive density as the main job's /aF,
  powersgd:R PyTorch's powerSGD_hook written out for virtual workers (one bucket, as the main job
             runs it; error feedback, warm start, plain all-reduce for the first 10% of the
             planned steps, at least 2),

then the one model applies the average with the main job's optimizer. The test set is evaluated
after every step; the main job's figure is the first END OF AN EPOCH at or past the target (its
evaluation comes once per epoch).

Commands:
  run      train runs for one P; writes a JSON of per-step accuracy and the steps to target
  check-powersgd   this file's PowerSGD against PyTorch's powerSGD_hook under DDP over gloo
           (2 processes on this machine, a small MLP, a few steps)
  compute  time one worker's forward+backward at the per-worker batch, and the compressor's
           selection per node (timed: run it under flock /tmp/bench.lock)
  project  steps x (compute + exchange(P)) from the runs, the compute figures and the cost model
           (bench/scale/spex_scale.py): bench/results/scale_tta.json/.csv
  plot     log-log plot of the projection

The C library: bazel build //bench/scale:libreference_cluster_c.so (or --lib PATH).
"""

import argparse
import ctypes
import csv
import json
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "deploy"))
DEFAULT_LIB = os.path.join(ROOT, "bazel-bin", "bench", "scale", "libreference_cluster_c.so")


# ---------------------------------------------------------------------------------------------
# The C ABI (reference_cluster_c.cc)

class ReferenceClusterLib:
    def __init__(self, path=None):
        path = path or os.environ.get("SPEX_RC_LIB") or DEFAULT_LIB
        if not os.path.isfile(path):
            sys.exit(f"virtual_workers: {path} not found: bazel build //bench/scale:libreference_cluster_c.so")
        lib = ctypes.CDLL(path)
        c_f = ctypes.POINTER(ctypes.c_float)
        lib.spex_rc_create.restype = ctypes.c_void_p
        lib.spex_rc_create.argtypes = [ctypes.c_char_p, ctypes.c_double, ctypes.c_char_p, ctypes.c_uint64,
                                       ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                                       ctypes.c_int]
        lib.spex_rc_step.restype = ctypes.c_int
        lib.spex_rc_step.argtypes = [ctypes.c_void_p, ctypes.c_uint64, c_f, ctypes.c_int64, c_f, ctypes.c_char_p,
                                     ctypes.c_int]
        lib.spex_rc_set_density.restype = ctypes.c_int
        lib.spex_rc_set_density.argtypes = [ctypes.c_void_p, ctypes.c_double, ctypes.c_char_p, ctypes.c_int]
        lib.spex_rc_gathered.restype = ctypes.c_uint64
        lib.spex_rc_gathered.argtypes = [ctypes.c_void_p]
        lib.spex_rc_counts.restype = None
        lib.spex_rc_counts.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]
        lib.spex_rc_residual.restype = None
        lib.spex_rc_residual.argtypes = [ctypes.c_void_p, ctypes.c_int, c_f]
        lib.spex_rc_pattern.restype = ctypes.c_char_p
        lib.spex_rc_pattern.argtypes = [ctypes.c_void_p]
        lib.spex_rc_destroy.restype = None
        lib.spex_rc_destroy.argtypes = [ctypes.c_void_p]
        self.lib = lib


class Cluster:
    """ReferenceCluster of `nodes` x `trainers` for one bucket of `elements` floats."""

    def __init__(self, rc: ReferenceClusterLib, compressor, density, elements, nodes, trainers=1, params="",
                 error_feedback=True, threads=1):
        self.lib = rc.lib
        self.nodes, self.trainers, self.n = nodes, trainers, elements
        err = ctypes.create_string_buffer(512)
        self.h = self.lib.spex_rc_create(compressor.encode(), density, params.encode(), elements, nodes, trainers,
                                         1 if error_feedback else 0, threads, err, len(err))
        if not self.h:
            raise RuntimeError(f"ReferenceCluster({compressor}, {density}, {elements}): {err.value.decode()}")

    def step(self, step, inputs, out):
        """inputs: float32 numpy array [nodes * trainers, >= n] whose rows start n floats of each
        trainer (a column slice of a wider array is fine: rows must be C-contiguous within); out:
        float32 numpy array of n, overwritten with the average."""
        import numpy as np

        assert inputs.dtype == np.float32 and out.dtype == np.float32 and out.flags.c_contiguous
        assert inputs.shape[0] == self.nodes * self.trainers and inputs.shape[1] >= self.n
        assert inputs.strides[1] == 4
        stride = inputs.strides[0] // 4
        err = ctypes.create_string_buffer(512)
        ptr = inputs.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        if self.lib.spex_rc_step(self.h, step, ptr, stride, out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), err,
                                 len(err)) != 0:
            raise RuntimeError(f"ReferenceCluster step {step}: {err.value.decode()}")

    def set_density(self, density):
        err = ctypes.create_string_buffer(512)
        if self.lib.spex_rc_set_density(self.h, density, err, len(err)) != 0:
            raise RuntimeError(f"ReferenceCluster set_density({density}): {err.value.decode()}")

    def gathered(self):
        return int(self.lib.spex_rc_gathered(self.h))

    def counts(self):
        c = (ctypes.c_uint64 * self.nodes)()
        self.lib.spex_rc_counts(self.h, c)
        return list(c)

    def residual(self, node):
        import numpy as np

        r = np.empty(self.n, dtype=np.float32)
        self.lib.spex_rc_residual(self.h, node, r.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))
        return r

    def pattern(self):
        return self.lib.spex_rc_pattern(self.h).decode()

    def close(self):
        if self.h:
            self.lib.spex_rc_destroy(self.h)
            self.h = None

    def __del__(self):
        self.close()


# ---------------------------------------------------------------------------------------------
# PyTorch's powerSGD_hook for virtual workers

def orthogonalize(matrix, eps=0.0):
    """powerSGD_hook's _orthogonalize (Gram-Schmidt on the columns, in place; eps 0 by default)."""
    import torch

    num_cols = matrix.shape[1]
    for i in range(num_cols):
        col = matrix[:, i:i + 1]
        if eps == 0:
            col /= torch.norm(col)
        else:
            col /= torch.norm(col) + eps
        if i + 1 < num_cols:
            rest = matrix[:, i + 1:]
            rest -= torch.sum(col * rest, dim=0) * col


class VirtualPowerSGD:
    """powerSGD_hook (torch 1.13) over W virtual workers of one DDP bucket. The hook's
    communication is three all-reduces of sums (uncompressed tensors, P = M Q, Q = M^T P) and
    everything between them is linear in the worker's matrix M_w (its gradient plus its error),
    so the all-reduced P and Q are those of the sum S = sum_w M_w: this class keeps S and the
    workers' errors as their sum E = sum_w e_w (e_w = M_w - M_hat, the hook's input_tensor_cp -
    input_tensor), which gives the hook's result exactly (up to float rounding). The first
    start_iter steps are a plain all-reduce (no error kept); Q starts from the hook's seeded
    random normal (np.random.RandomState(0) -> torch.manual_seed), orthogonalised, and is reused
    (warm start). `shapes`: the bucket's tensors in DDP's bucket order."""

    def __init__(self, shapes, rank, start_iter, world, min_compression_rate=2, random_seed=0):
        import numpy as np

        self.shapes, self.rank, self.start_iter, self.world = shapes, rank, start_iter, world
        self.iter = 0
        self.rng = np.random.RandomState(random_seed)
        self.error = None
        self.q_memory = None
        self.compress = []
        for s in shapes:
            n = s[0]
            m = math.prod(s[1:]) if len(s) > 1 else 1
            r = min(n, m, rank)
            ok = len(s) > 1 and n * m > (n + m) * r * min_compression_rate
            self.compress.append((ok, n, m, r))

    def exchange(self, total):
        """total: the bucket's flat sum of the W workers' gradients (a torch tensor, changed in
        place); returns the flat average every worker reads."""
        import torch

        if self.iter < self.start_iter:
            self.iter += 1
            return total.div_(self.world)
        if self.error is None:
            self.error = torch.zeros_like(total)
        else:
            total.add_(self.error)
        s_cp = total.clone()
        views, off = [], 0
        for s in self.shapes:
            k = math.prod(s)
            views.append(total[off:off + k])
            off += k
        mats = [v.view(c[1], c[2]) for v, c in zip(views, self.compress) if c[0]]
        unc = [v for v, c in zip(views, self.compress) if not c[0]]
        need_random = self.q_memory is None
        if need_random:
            self.q_memory = torch.empty(sum(c[2] * c[3] for c in self.compress if c[0]))
        ps, qs, qi = [], [], 0
        for c in self.compress:
            if c[0]:
                qs.append(self.q_memory[qi:qi + c[2] * c[3]].view(c[2], c[3]))
                qi += c[2] * c[3]
        if need_random:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.rng.randint(1_000_000_000))
                for q in qs:
                    q.copy_(torch.randn(*q.shape, dtype=total.dtype))
                    orthogonalize(q)
        else:
            for q in qs:
                orthogonalize(q)
        for m, q in zip(mats, qs):
            ps.append(torch.matmul(m, q))  # the all-reduced P: sum over workers of M_w Q
        for u in unc:
            u.div_(self.world)  # all-reduce of the uncompressed tensors, / world
        for p in ps:
            orthogonalize(p)
        for m, p, q in zip(mats, ps, qs):
            torch.matmul(m.t(), p, out=q)  # the all-reduced Q: sum of M_w^T P
        self.q_memory.div_(self.world)
        for m, p, q in zip(mats, ps, qs):
            torch.matmul(p, q.t(), out=m)
        # sum_w (input_cp_w - result): the compressed part S - W * M_hat, the uncompressed
        # S - W * (S / W) = 0.
        self.error = s_cp - total * self.world
        self.iter += 1
        return total


# ---------------------------------------------------------------------------------------------
# The training

def main_job_cfg(a):
    """The main job's configuration for the MLP (deploy/mainjob/cli.py's defaults)."""
    from mainjob.models import WORKLOADS

    w = WORKLOADS["mlp"]
    return {"model": "mlp", "hidden": a.hidden or w.default_hidden, "seed": a.seed, "batch": a.batch,
            "lr": a.lr if a.lr is not None else w.default_lr, "momentum": 0.9,
            "target_acc": w.default_target_acc, "steps_per_epoch": 40}


def ddp_layouts(model):
    """DDP's bucket layouts for the MLP at the main job's bucket_cap_mb 25 (checked with torch
    1.13's reducer): the first iteration one bucket of every parameter in parameter order, then the
    rebuilt buckets in the order gradients become ready (bucket 0 closes once past its 1 MB first-
    bucket cap with 2.weight in it). Lists of parameter indices per bucket."""
    n = len(list(model.parameters()))
    assert n == 6, "the MLP has 6 parameter tensors"
    return [[0, 1, 2, 3, 4, 5]], [[5, 4, 3, 2], [1, 0]]


class VirtualJob:
    def __init__(self, cfg, workers, layout, scaling, rc_lib):
        import torch
        from mainjob.models import WORKLOADS

        torch.set_num_threads(1)
        self.cfg, self.P, self.scaling = cfg, workers, scaling
        self.nodes, self.trainers = layout
        assert self.nodes * self.trainers == workers
        self.workload = WORKLOADS["mlp"]
        self.data = self.workload.load(cfg)
        self.rc_lib = rc_lib
        self.n_train = len(self.data[0])
        if scaling == "weak":  # the main job's per-worker batch; the global batch grows with P
            self.batch = cfg["batch"]
        else:  # the main job's global batch (4 x 16) split over P workers
            self.batch = max(1, 4 * cfg["batch"] // workers)
        self.steps_per_epoch = max(1, self.n_train // (workers * self.batch))
        self.eval_every_step = False
        # DDP's first iteration as one bucket of every parameter needs a second copy of the
        # workers' gradients in parameter order: 2.7 GB more at 64 workers. From 64 workers step 0
        # runs on the rebuilt layout's buckets instead (compressors and residuals dropped after
        # it, as the first layout's are).
        self.exact_first_layout = workers < 64
        # The step a bucket's compressor sees (micro's partition ownership): spex.torch numbers a
        # bucket's exchanges from 0, so the rebuilt buckets' step is the job's step - 1.
        # --global-step passes the job's step (the first runs of bench/results/scale_tta did).
        self.global_step = False

    def build(self):
        import torch

        torch.manual_seed(self.cfg["seed"])
        model = self.workload.build(self.cfg)
        return model

    def run(self, spec, max_steps, stop_at_target=True, quiet=False):
        """One run (a mainjob.runs spec dict); returns its record."""
        import numpy as np
        import torch

        cfg, P = self.cfg, self.P
        model = self.build()
        params = list(model.parameters())
        shapes = [tuple(p.shape) for p in params]
        sizes = [p.numel() for p in params]
        n = sum(sizes)
        opt = torch.optim.SGD(params, lr=cfg["lr"], momentum=cfg["momentum"])
        kind = "ddp" if spec["compressor"] in ("gloo", "dense") else spec["compressor"]
        first, rebuilt = ddp_layouts(model)
        order = [i for b in rebuilt for i in b]  # G's columns: the rebuilt buckets, back to back
        offs, o = {}, 0
        for i in order:
            offs[i] = o
            o += sizes[i]
        bucket_cols = []
        o = 0
        for b in rebuilt:
            k = sum(sizes[i] for i in b)
            bucket_cols.append((o, o + k))
            o += k
        kind_sum_only = kind in ("ddp", "powersgd")
        G = None if kind_sum_only else np.zeros((P, n), dtype=np.float32)
        Gt = None if G is None else torch.from_numpy(G)
        avg = np.zeros(n, dtype=np.float32)
        avg_t = torch.from_numpy(avg)
        density = spec.get("density", 1.0)
        adapt = spec.get("adaptive_factor", 0)
        cur_density = min(1.0, density * adapt) if adapt else density
        clusters = None
        gathered_log = []
        psgd = None
        if kind == "powersgd":
            total_steps = max_steps
            start = max(2, total_steps // 10)
            # one DDP bucket (the main job's --powersgd-buckets one), in the rebuilt order
            psgd = VirtualPowerSGD([shapes[i] for i in order], spec["powersgd_rank"], start, P)
        from mainjob.runs import accordion_epoch  # the main job's Accordion rule (/aF)
        delta = [torch.zeros_like(p) for p in params] if adapt else None
        delta_norms, adaptive = [], []
        acc_steps, t_compute, t_exchange = [], 0.0, 0.0
        reached_step = reached_epoch_step = None
        step = 0
        epoch = 0
        t_start = time.perf_counter()
        while step < max_steps:
            if adapt:  # Run.adaptive_density: at the start of every epoch
                if epoch > 0:
                    delta_norms.append(float(sum(float(d.pow(2).sum()) for d in delta)) ** 0.5)
                    for d in delta:
                        d.zero_()
                rule = accordion_epoch(delta_norms, density, adapt)
                cur_density = rule["density"]
                for c in (clusters or []):
                    c.set_density(cur_density)
                adaptive.append({"epoch": epoch, **rule})
            perm = torch.randperm(self.n_train, generator=torch.Generator().manual_seed(cfg["seed"] * 100003 + epoch))
            shards = [perm[w::P] for w in range(P)]
            for s in range(self.steps_per_epoch):
                if step >= max_steps:
                    break
                t0 = time.perf_counter()
                if G is None:
                    # DDP and PowerSGD need only the workers' sum (PowerSGD is linear in it:
                    # VirtualPowerSGD): the gradient of the global batch's mean loss is the mean
                    # of the workers' gradients, their batches being of equal size.
                    idx = torch.cat([shards[w][s * self.batch:(s + 1) * self.batch] for w in range(P)])
                    for p in params:
                        p.grad = None
                    loss = self.workload.loss(model, self.data, idx, cfg, torch.float32)
                    loss.backward()
                    for i in order:
                        avg_t[offs[i]:offs[i] + sizes[i]].copy_(params[i].grad.reshape(-1))
                else:
                    for w in range(P):
                        idx = shards[w][s * self.batch:(s + 1) * self.batch]
                        for p in params:
                            p.grad = None
                        loss = self.workload.loss(model, self.data, idx, cfg, torch.float32)
                        loss.backward()
                        for i in order:
                            Gt[w, offs[i]:offs[i] + sizes[i]].copy_(params[i].grad.reshape(-1))
                t1 = time.perf_counter()
                gathered = None
                if kind == "ddp":
                    pass  # avg_t holds the mean already
                elif kind == "powersgd":
                    avg_t.mul_(P)  # the workers' sum
                    avg_t.copy_(psgd.exchange(avg_t))
                else:
                    lay = first if step == 0 else rebuilt
                    if step == 0 and self.exact_first_layout:
                        # DDP's first iteration: one bucket of every parameter in parameter order
                        # (its own bucket, dropped at the rebuild as spex.torch unregisters it).
                        g0 = np.ascontiguousarray(np.concatenate(
                            [G[:, offs[i]:offs[i] + sizes[i]] for i in lay[0]], axis=1))
                        c0 = Cluster(self.rc_lib, spec["compressor"], cur_density, n, self.nodes, self.trainers,
                                     params=",".join(spec.get("param_list", [])))
                        out0 = np.empty(n, dtype=np.float32)
                        c0.step(step, g0, out0)
                        gathered = c0.gathered()
                        c0.close()
                        o = 0
                        for i in lay[0]:
                            avg[offs[i]:offs[i] + sizes[i]] = out0[o:o + sizes[i]]
                            o += sizes[i]
                    else:
                        if clusters is None or (step == 1 and not self.exact_first_layout):
                            # (without the exact first layout, step 0 ran on throwaway clusters of
                            # the rebuilt layout: fresh ones from step 1, as after DDP's rebuild)
                            for c in (clusters or []):
                                c.close()
                            clusters = [Cluster(self.rc_lib, spec["compressor"], cur_density, e - b, self.nodes,
                                                self.trainers, params=",".join(spec.get("param_list", [])))
                                        for b, e in bucket_cols]
                        gathered = 0
                        if self.global_step:
                            bstep = step
                        else:  # spex.torch numbers each bucket's exchanges from 0 (next_step)
                            bstep = step - (0 if step == 0 else 1)
                        for c, (b, e) in zip(clusters, bucket_cols):
                            c.step(bstep, G[:, b:e], avg[b:e])
                            gathered += c.gathered()
                    gathered_log.append(gathered)
                t2 = time.perf_counter()
                t_compute += t1 - t0
                t_exchange += t2 - t1
                for i in order:
                    params[i].grad = avg_t[offs[i]:offs[i] + sizes[i]].view(shapes[i]).clone()
                if adapt:
                    for d, p in zip(delta, params):
                        d.add_(p.grad)
                opt.step()
                step += 1
                end_of_epoch = s == self.steps_per_epoch - 1
                if not end_of_epoch and not self.eval_every_step:
                    continue
                with torch.no_grad():
                    test_acc, _ = self.workload.evaluate(model, self.data, cfg, torch.float32)
                acc_steps.append((step, round(test_acc, 3)))
                if reached_step is None and test_acc >= cfg["target_acc"]:
                    reached_step = step
                if reached_epoch_step is None and end_of_epoch and test_acc >= cfg["target_acc"]:
                    reached_epoch_step = step
                if not quiet and end_of_epoch:
                    print(f"[P={P} {spec['label']}] step {step} epoch {epoch} acc {test_acc:.2f}% "
                          f"loss {loss.item():.4f}" + (f" gathered {gathered}" if gathered is not None else "")
                          + f" ({time.perf_counter() - t_start:.0f} s)", flush=True)
            if stop_at_target and reached_epoch_step is not None:
                break
            epoch += 1
        for c in (clusters or []):
            c.close()
        return {"label": spec["label"], "spec": spec, "workers": P, "nodes": self.nodes, "trainers": self.trainers,
                "scaling": self.scaling, "per_worker_batch": self.batch, "global_batch": self.batch * P,
                "steps_per_epoch": self.steps_per_epoch, "lr": cfg["lr"], "max_steps": max_steps,
                "steps_run": step, "steps_to_target": reached_epoch_step, "first_step_at_target": reached_step,
                "target_acc": cfg["target_acc"], "acc_evaluated": acc_steps,
                "acc_per_epoch": [a for st, a in acc_steps if st % self.steps_per_epoch == 0],
                "mean_gathered": (sum(gathered_log[1:]) / len(gathered_log[1:])) if len(gathered_log) > 1 else None,
                "elements": n, "adaptive": adaptive,
                "powersgd_start_iter": psgd.start_iter if psgd else None,
                "step0_layout": "one bucket (DDP's first iteration)" if self.exact_first_layout else "rebuilt",
                "bucket_step": "job step" if self.global_step else "from 0 per bucket",
                "wall_s_untimed": {"workers": t_compute, "exchange": t_exchange}}


def parse_spec(item, params):
    from mainjob.runs import parse_runs

    spec = parse_runs("gloo" if item == "ddp" else item)[0]
    if params:
        spec["param_list"] = params
    return spec


def cmd_run(a):
    cfg = main_job_cfg(a)
    layout = tuple(int(x) for x in a.layout.split("x")) if a.layout else (a.workers, 1)
    job = VirtualJob(cfg, a.workers, layout, a.scaling, ReferenceClusterLib(a.lib))
    job.global_step = a.global_step
    results = []
    if a.out and os.path.exists(a.out) and a.resume:
        with open(a.out) as f:
            results = json.load(f)["runs"]
    done = {r["label"] for r in results}
    for item in a.runs.split(","):
        spec = parse_spec(item, a.param)
        if spec["label"] in done:
            continue
        r = job.run(spec, a.max_steps, stop_at_target=not a.full)
        print(f"[P={a.workers} {spec['label']}] steps to {cfg['target_acc']}%: {r['steps_to_target']} "
              f"(first step at target {r['first_step_at_target']}; {r['steps_run']} run)", flush=True)
        results.append(r)
        if a.out:
            with open(a.out, "w") as f:
                json.dump({"workers": a.workers, "layout": list(layout), "scaling": a.scaling, "cfg": cfg,
                           "runs": results}, f)


# ---------------------------------------------------------------------------------------------
# check-powersgd: against PyTorch's hook

def _psgd_worker(rank, world, init_method, steps, rank_r, start, out_path, hidden):
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                                torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
    cap = 4 * sum(p.numel() for p in model.parameters()) / 2**20 * 2
    saved = dist._DEFAULT_FIRST_BUCKET_BYTES
    dist._DEFAULT_FIRST_BUCKET_BYTES = int(cap * 2**20)
    ddp = DDP(model, bucket_cap_mb=cap)
    dist._DEFAULT_FIRST_BUCKET_BYTES = saved
    st = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=rank_r,
                                     start_powerSGD_iter=start, use_error_feedback=True, warm_start=True)
    ddp.register_comm_hook(st, powerSGD_hook.powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(123)
    xs = torch.randn(steps, world, 16, 64, generator=g)
    ys = torch.randint(0, 10, (steps, world, 16), generator=g)
    for s in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(xs[s, rank]), ys[s, rank]).backward()
        opt.step()
    if rank == 0:
        torch.save([p.detach().clone() for p in model.parameters()], out_path)
    dist.barrier()
    os._exit(0)  # gloo's teardown aborts now and then ("terminate called without an active exception")


def cmd_check_powersgd(a):
    """PyTorch's hook in `world` gloo processes against VirtualPowerSGD with as many virtual
    workers, the same model, data and seeds; prints the parameters' largest difference."""
    import shutil
    import tempfile

    import torch
    import torch.multiprocessing as mp

    world, steps, hidden = a.workers, a.steps, a.hidden_check
    work = tempfile.mkdtemp(prefix="psgd_check")
    out_path = os.path.join(work, "params.pt")
    # A file rendezvous, not a TCP port: a port from the pid collided between concurrent runs (each
    # in its own PID namespace under Bazel's sandbox) and with whatever else held it.
    init_method = "file://" + os.path.join(work, "rendezvous")
    start = 2
    mp.spawn(_psgd_worker, args=(world, init_method, steps, a.rank, start, out_path, hidden), nprocs=world, join=True)
    real = torch.load(out_path)
    shutil.rmtree(work, ignore_errors=True)
    torch.set_num_threads(1)

    def virtual(start_iter):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                                    torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
        params = list(model.parameters())
        # DDP's single bucket: the first iteration in parameter order, then the rebuilt (ready)
        # order; PowerSGD starts at iteration >= 2, after the rebuild, so only the latter matters.
        order = list(reversed(range(len(params))))
        psgd = VirtualPowerSGD([tuple(params[i].shape) for i in order], a.rank, start_iter, world)
        opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
        g = torch.Generator().manual_seed(123)
        xs = torch.randn(steps, world, 16, 64, generator=g)
        ys = torch.randint(0, 10, (steps, world, 16), generator=g)
        for s in range(steps):
            total = None
            for w in range(world):
                for p in params:
                    p.grad = None
                torch.nn.functional.cross_entropy(model(xs[s, w]), ys[s, w]).backward()
                flat = torch.cat([params[i].grad.reshape(-1) for i in order])
                total = flat if total is None else total + flat
            avg = psgd.exchange(total)
            o = 0
            for i in order:
                params[i].grad = avg[o:o + params[i].numel()].view_as(params[i]).clone()
                o += params[i].numel()
            opt.step()
        return [p.detach() for p in params]

    maxdiff = lambda xs, ys: max(float((x - y).abs().max()) for x, y in zip(xs, ys))  # noqa: E731
    diff = maxdiff(virtual(start), real)
    dense_diff = maxdiff(virtual(steps), real)  # never compressing: DDP's average
    scale = max(float(r.abs().max()) for r in real)
    print(json.dumps({"workers": world, "rank": a.rank, "steps": steps, "start_powerSGD_iter": start,
                      "hidden": hidden, "max_abs_diff": diff, "max_abs_diff_of_dense_average": dense_diff,
                      "max_abs_param": scale}))
    return diff


# ---------------------------------------------------------------------------------------------
# compute: the per-step compute, timed (run under flock /tmp/bench.lock)

def _median_time(fn, reps):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2]


def cmd_compute(a):
    """Medians of: one worker's forward+backward of the MLP at the per-worker batch (torch, 1
    thread, as the main job's trainers); one node's share of the reference cluster's micro step
    at P nodes (its step over P: accumulate, select, union, scatter; ReferenceCluster's scalar
    loops, an upper bound of spexd's SIMD path); PowerSGD's compute per worker at ranks 1 and 4
    (error feedback, the three matrix products per layer, the orthogonalisations) on one gradient."""
    import numpy as np
    import torch
    from mainjob.models import WORKLOADS

    torch.set_num_threads(1)
    cfg = main_job_cfg(a)
    wl = WORKLOADS["mlp"]
    data = wl.load(cfg)
    torch.manual_seed(cfg["seed"])
    model = wl.build(cfg)
    params = list(model.parameters())
    idx = torch.arange(a.batch)

    def fwd_bwd():
        for p in params:
            p.grad = None
        wl.loss(model, data, idx, cfg, torch.float32).backward()

    fwd_bwd()
    res = {"batch": a.batch, "torch_threads": 1, "reps": a.reps}
    res["fwd_bwd_s"] = _median_time(fwd_bwd, a.reps)
    order = [5, 4, 3, 2, 1, 0]
    flat = torch.cat([params[i].grad.reshape(-1) for i in order])
    shapes = [tuple(params[i].shape) for i in order]
    for r in (1, 4):
        ps = VirtualPowerSGD(shapes, r, 0, 1)
        ps.exchange(flat.clone())  # the first call draws Q
        res[f"powersgd{r}_s"] = _median_time(lambda: ps.exchange(flat.clone()), a.reps)
    rc = ReferenceClusterLib(a.lib)
    n = flat.numel()
    rng = np.random.default_rng(0)
    for nodes in [int(x) for x in a.nodes.split(",")]:
        g = np.empty((nodes, n), dtype=np.float32)
        for w in range(nodes):
            g[w] = flat.numpy() * rng.uniform(0.5, 1.5)
        out = np.empty(n, dtype=np.float32)
        for d in (0.01, 0.1):
            c = Cluster(rc, "micro", d, n, nodes)
            c.step(0, g, out)
            step = [1]

            def one():
                c.step(step[0], g, out)
                step[0] += 1

            t = _median_time(one, max(3, a.reps // 4))
            res[f"micro{d:g}_node_s_P{nodes}"] = t / nodes
            c.close()
        del g
    res["uptime"] = open("/proc/loadavg").read().strip()
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


# ---------------------------------------------------------------------------------------------
# project: steps x (compute + exchange)

RATES = (10, 100)
PROJECT_P = (16, 64, 256, 1024)


def exchange_times(nodes, gbps, latency_us, gathered, k_node, density):
    """Seconds per step of each method's exchange from the cost model (spex_scale.py, the
    daemon's exchange_cost.h): DDP's and PowerSGD's all-reduces (whatif's peers), spex's auto
    pick for a top-k compressor at k = density x n per node (whatif), and micro's own exchange,
    pattern A: the control round and vote, the counts' all-gather and the index-only all-gather of
    k_node indices (the model's all-gather term at k_node / 2 pairs of 8 bytes: the same bytes)
    and one float all-reduce of the union's `gathered` values."""
    sys.path.insert(0, HERE)
    import spex_scale

    shapes = spex_scale.MODELS["mlp"]()
    n = sum(spex_scale.numel(s) for s in shapes)
    peers = spex_scale.peer_model(nodes, gbps, latency_us, n, shapes)
    auto = spex_scale.model(nodes, gbps, latency_us, n, max(1, int(density * n)))
    idx = spex_scale.model(nodes, gbps, latency_us, n, max(1, (k_node + 1) // 2))
    cmd = [os.path.join(spex_scale.DEFAULT_OUT, "exchange_cost"), "allreduce", str(nodes), str(gbps),
           str(latency_us), str(4 * gathered)]
    ar = sum(json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout))
    pattern_a = idx["allgather_s"] + ar  # control + vote included in allgather_s
    return {"ddp": peers["ddp"], "powersgd1": peers["powersgd1"], "powersgd4": peers["powersgd4"],
            "spex_auto_topk": min(auto["dense_s"], auto["allgather_s"], auto["oktopk_s"]),
            "spex_auto_topk_pick": auto["best"], "micro_pattern_a": pattern_a, "dense_s": auto["dense_s"]}


METHODS = [("DDP (fp32 all-reduce)", "gloo", "ddp"), ("spex micro@0.01", "micro@0.01", "micro"),
           ("spex micro@0.1", "micro@0.1", "micro"), ("spex micro@0.05/a4", "micro@0.05/a4", "micro"),
           ("PowerSGD r=1", "powersgd-r1", "powersgd1"), ("PowerSGD r=4", "powersgd-r4", "powersgd4")]


def cmd_project(a):
    runs = {}
    for path in a.runs:
        with open(path) as f:
            d = json.load(f)
        if (d.get("layout") and d["layout"][1] != 1) or d.get("scaling", "weak") != "weak":
            continue  # the 2 x 2 check of the main job, or the other scaling model: not these points
        for r in d["runs"]:
            runs[(d["workers"], r["label"])] = r
    for path in a.partial:
        # a run stopped before its end (its JSON is written at the end): its log's evaluations
        import re

        acc, P, label = [], None, None
        with open(path) as f:
            for line in f:
                m = re.match(r"\[P=(\d+) (\S+)\] step (\d+) epoch (\d+) acc ([\d.]+)%", line)
                if m:
                    P, label = int(m.group(1)), m.group(2)
                    acc.append((int(m.group(3)), float(m.group(5))))
        if P is None or (P, label) in runs:
            continue
        spec = parse_spec("ddp" if label == "gloo" else label.replace("-r", ":"), [])
        runs[(P, label)] = {"label": label, "spec": spec, "workers": P, "steps_to_target": None,
                            "acc_per_epoch": [x for _, x in acc], "steps_run": acc[-1][0] if acc else 0,
                            "max_steps": None, "global_batch": None, "steps_per_epoch": None,
                            "mean_gathered": None, "powersgd_start_iter": None, "adaptive": [],
                            "elements": 10483210, "partial": f"stopped after {acc[-1][0] if acc else 0} steps"}
    with open(a.compute) as f:
        comp = json.load(f)
    measured_p = sorted({p for p, _ in runs})
    rows = []
    cache = {}
    for P in sorted(set(measured_p) | set(PROJECT_P)):
        src = max([p for p in measured_p if p <= P] or [min(measured_p)])
        for gbps in RATES:
            for name, label, kind in METHODS:
                r = runs.get((src, label))
                if r is None:
                    continue
                steps = r["steps_to_target"]
                density = r["spec"].get("density", 1.0)
                gathered = int(r["mean_gathered"] or density * r["elements"])
                k_node = max(1, gathered // P)  # micro's exclusive partitions: counts sum to the union
                key = (P, gathered, density)
                if (key, gbps) not in cache:
                    cache[(key, gbps)] = exchange_times(P, gbps, a.latency_us, gathered, k_node, density)
                ex = cache[(key, gbps)]
                if kind == "ddp":
                    exch, extra = ex["ddp"], 0.0
                elif kind == "micro":
                    exch = ex["micro_pattern_a"]
                    # the per-node figure measured at the largest node count <= P (the first
                    # epochs of /aF run at F x the density: the base density's figure is taken;
                    # a density not measured takes 0.01's)
                    dd = density if any(k.startswith(f"micro{density:g}_node_s_P") for k in comp) else 0.01
                    pn = [int(k.split("_P")[1]) for k in comp if k.startswith(f"micro{dd:g}_node_s_P")]
                    pn = [p for p in pn if p <= P] or pn
                    extra = comp[f"micro{dd:g}_node_s_P{max(pn)}"]
                else:
                    exch = ex[kind]
                    extra = comp[f"{kind}_s"]
                compute = comp["fwd_bwd_s"] + extra
                row = {"P": P, "gbps": gbps, "latency_us": a.latency_us, "method": name, "run": label,
                       "steps_from_P": src, "steps_to_target": steps, "compute_s": compute,
                       "fwd_bwd_s": comp["fwd_bwd_s"], "method_compute_s": extra, "exchange_s": exch,
                       "step_s": compute + exch,
                       "tta_s": steps * (compute + exch) if steps else None,
                       "tta_exchange_only_s": steps * exch if steps else None,
                       "union_elements": gathered if kind == "micro" else None}
                if kind == "micro":
                    row["spex_auto_topk_s"] = ex["spex_auto_topk"]
                    row["spex_auto_topk_pick"] = ex["spex_auto_topk_pick"]
                    row["dense_fallback_s"] = ex["dense_s"]
                rows.append(row)
    base = {(r["P"], r["gbps"]): r for r in rows if r["run"] == "gloo"}
    for r in rows:
        b = base.get((r["P"], r["gbps"]))
        r["speedup_vs_ddp"] = (b["tta_s"] / r["tta_s"]) if b and b["tta_s"] and r["tta_s"] else None
        r["speedup_vs_ddp_exchange_only"] = (b["tta_exchange_only_s"] / r["tta_exchange_only_s"]
                                            if b and b["tta_exchange_only_s"] and r["tta_exchange_only_s"]
                                            else None)
    out = {"model": "steps(P) x (compute + exchange(P)); compute: one worker's forward+backward at the per-worker "
                    "batch plus the method's own compute, measured here; exchange: the cost model",
           "latency_us": a.latency_us, "compute": comp,
           "steps": {f"{p}:{l}": {k: r[k] for k in ("steps_to_target", "acc_per_epoch", "steps_run", "max_steps",
                                                      "global_batch", "steps_per_epoch", "mean_gathered",
                                                      "powersgd_start_iter", "adaptive", "partial")
                                              if k in r}
                     for (p, l), r in sorted(runs.items())},
           "rows": rows}
    with open(a.out + ".json", "w") as f:
        json.dump(out, f, indent=1)
    with open(a.out + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()) + [k for k in ("spex_auto_topk_s", "spex_auto_topk_pick",
                                                                         "dense_fallback_s") if k not in rows[0]],
                           extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    print(f"project: {a.out}.json, {a.out}.csv ({len(rows)} rows)")


def cmd_plot(a):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(a.json) as f:
        d = json.load(f)
    fig, axes = plt.subplots(1, len(RATES), figsize=(6 * len(RATES), 4.5), sharey=True)
    for ax, gbps in zip(axes, RATES):
        for name, label, _ in METHODS:
            pts = [(r["P"], r["tta_s"]) for r in d["rows"] if r["gbps"] == gbps and r["run"] == label and r["tta_s"]]
            if not pts:
                continue
            pts.sort()
            line, = ax.plot([p for p, _ in pts], [t for _, t in pts], marker="o", label=name)
            ex = sorted((r["P"], r["tta_exchange_only_s"]) for r in d["rows"]
                        if r["gbps"] == gbps and r["run"] == label and r["tta_exchange_only_s"])
            ax.plot([p for p, _ in ex], [t for _, t in ex], marker=".", linestyle="--", color=line.get_color())
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("workers P (one per node)")
        ax.set_title(f"{gbps} Gbit/s, {d['latency_us']:g} us node to node")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("projected time to 95% (s); dashed: exchange only")
    axes[0].legend(fontsize=8)
    fig.suptitle("MLP (10.5M parameters), projected time to 95%: steps measured with virtual workers "
                 "(P > 64: 64's steps) x (compute measured on this CPU + cost-model exchange)", fontsize=9)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"plot: {a.out}")


def cmd_table(a):
    """Markdown tables of a projection: steps to the target per P, then per rate the projected
    time to the target (and the ratio to DDP's) per P and method."""
    with open(a.json) as f:
        d = json.load(f)
    steps = d["steps"]
    ps = sorted({int(k.split(":")[0]) for k in steps})
    print("| run | " + " | ".join(f"P = {p}" for p in ps) + " |")
    print("|---|" + "---|" * len(ps))
    for name, label, _ in METHODS:
        cells = []
        for p in ps:
            r = steps.get(f"{p}:{label}")
            if r is None:
                cells.append("not run")
            elif r["steps_to_target"]:
                cells.append(str(r["steps_to_target"]))
            else:
                last = r["acc_per_epoch"][-1] if r["acc_per_epoch"] else float("nan")
                why = "stopped" if r.get("partial") else "never"
                cells.append(f"{why} in {r['steps_run']} ({last:.1f}%)")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print()
    rows = d["rows"]
    pp = sorted({r["P"] for r in rows if r["P"] in PROJECT_P})
    find = lambda p, g, label: next((x for x in rows if x["P"] == p and x["gbps"] == g and x["run"] == label),  # noqa: E731
                                    None)
    print("Per step: compute measured here (ms), exchange from the cost model (ms) per rate and P\n")
    print("| method | compute | " + " | ".join(f"{g} Gbit/s, P = {p}" for g in RATES for p in pp) + " |")
    print("|---|---|" + "---|" * (len(pp) * len(RATES)))
    for name, label, _ in METHODS:
        any_row = next((x for x in rows if x["run"] == label and x["P"] in pp), None)
        if any_row is None:
            continue
        cells = []
        for g in RATES:
            for p in pp:
                r = find(p, g, label)
                cells.append(f"{1e3 * r['exchange_s']:.2f}" if r else "-")
        print(f"| {name} | {1e3 * any_row['compute_s']:.0f} | " + " | ".join(cells) + " |")
    print()
    for gbps in RATES:
        print(f"**{gbps} Gbit/s, {d['latency_us']:g} us node to node**: projected time to 95% in seconds "
              f"(speed-up over DDP; speed-up with compute left out)\n")
        print("| method | " + " | ".join(f"P = {p}" for p in pp) + " |")
        print("|---|" + "---|" * len(pp))
        for name, label, _ in METHODS:
            cells = []
            for p in pp:
                r = find(p, gbps, label)
                if r is None or not r["tta_s"]:
                    cells.append("-")
                    continue
                sp = r.get("speedup_vs_ddp")
                ex = r.get("speedup_vs_ddp_exchange_only")
                cells.append(f"{r['tta_s']:.2f} ({sp:.2f}x; {ex:.1f}x)")
            print(f"| {name} | " + " | ".join(cells) + " |")
        print()


# ---------------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=None, help="libreference_cluster_c.so (default: bazel-bin's, or $SPEX_RC_LIB)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train runs with P virtual workers")
    r.add_argument("--workers", type=int, required=True)
    r.add_argument("--layout", default=None, help="NODESxTRAINERS (default Px1; the main job is 2x2)")
    r.add_argument("--runs", default="ddp,micro:0.01,micro:0.1,micro:0.05/a4,powersgd:1,powersgd:4")
    r.add_argument("--scaling", choices=["weak", "strong"], default="weak",
                   help="weak: the main job's per-worker batch (global batch grows with P); strong: the main "
                        "job's global batch 64 split over P")
    r.add_argument("--max-steps", type=int, default=84)
    r.add_argument("--full", action="store_true", help="run max-steps even after the target")
    r.add_argument("--batch", type=int, default=16)
    r.add_argument("--hidden", type=int, default=None)
    r.add_argument("--lr", type=float, default=None)
    r.add_argument("--seed", type=int, default=0, help="the main job's --seed (default 0)")
    r.add_argument("--param", action="append", default=[], help="compressor KEY=VALUE (repeatable)")
    r.add_argument("--out", default=None)
    r.add_argument("--resume", action="store_true")
    r.add_argument("--global-step", action="store_true",
                   help="hand the compressors the job's step, not the bucket's own (offset by 1 after DDP's rebuild)")
    r.set_defaults(fn=cmd_run)
    c = sub.add_parser("check-powersgd", help="VirtualPowerSGD against PyTorch's powerSGD_hook over gloo")
    c.add_argument("--workers", type=int, default=2)
    c.add_argument("--rank", type=int, default=1)
    c.add_argument("--steps", type=int, default=6)
    c.add_argument("--hidden-check", type=int, default=32)
    c.set_defaults(fn=cmd_check_powersgd)
    m = sub.add_parser("compute", help="time the per-step compute (under flock /tmp/bench.lock)")
    m.add_argument("--batch", type=int, default=16)
    m.add_argument("--hidden", type=int, default=None)
    m.add_argument("--lr", type=float, default=None)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--reps", type=int, default=20)
    m.add_argument("--nodes", default="16,64", help="node counts of the micro per-node figure")
    m.add_argument("--out", default=None)
    m.set_defaults(fn=cmd_compute)
    j = sub.add_parser("project", help="projected time to accuracy: bench/results/scale_tta.json/.csv")
    j.add_argument("runs", nargs="+", help="JSONs of `run`")
    j.add_argument("--compute", required=True, help="JSON of `compute`")
    j.add_argument("--partial", action="append", default=[], help="log of a run stopped before its end")
    j.add_argument("--latency-us", type=float, default=4.0, help="node to node (the star's 2 us per link)")
    j.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "scale_tta"))
    j.set_defaults(fn=cmd_project)
    q = sub.add_parser("plot", help="log-log plot of the projection")
    q.add_argument("json")
    q.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "scale_tta.png"))
    q.set_defaults(fn=cmd_plot)
    t = sub.add_parser("table", help="markdown tables of the projection")
    t.add_argument("json")
    t.set_defaults(fn=cmd_table)
    a = ap.parse_args(argv)
    return a.fn(a)


if __name__ == "__main__":
    main()
