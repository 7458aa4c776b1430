"""One trainer process of the main job (one DDP rank): it trains every run in turn, each from the
same initial parameters, and writes per-rank step rows and (rank 0) the run's epochs and GetStats
findings for report.py. One run = one configuration (hook, compressor, bucketing) trained for
--epochs on the workload of models.py."""

import csv
import hashlib
import json
import os
import time
from typing import Any, Dict, List, Optional

from mainjob import hooks
from mainjob.models import WORKLOADS
from mainjob.procs import cpu_seconds
from mainjob.runs import accordion_epoch, is_peer


def params_digest(model) -> str:
    import torch

    h = hashlib.sha1()
    for p in model.parameters():
        d = p.detach().contiguous()
        # The tensor's own bytes, no copy (tobytes() copied each tensor first: 2.4x the time).
        h.update(memoryview((d.view(torch.int16) if d.dtype == torch.bfloat16 else d).numpy()).cast("B"))
    return h.hexdigest()[:16]


def layer_nonzero(model) -> Dict[str, List[int]]:
    """[non-zero, elements] of each parameter's gradient (after the exchange: the averaged
    update), grouped by the module that owns it."""
    import torch

    out: Dict[str, List[int]] = {}
    modules = dict(model.named_children())
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        key = name.split(".")[0]
        if key.isdigit():  # nn.Sequential's children are numbered: name them by kind too
            key = f"{type(modules[key]).__name__.lower()}{key}"
        acc = out.setdefault(key, [0, 0])
        acc[0] += int(torch.count_nonzero(p.grad))  # no boolean tensor: 4x faster than (g != 0).sum()
        acc[1] += p.grad.numel()
    return out


def bucket_cap(cfg: Dict[str, Any], run: Dict[str, Any], model):
    """(bucket_cap_mb, first-bucket bytes or None) for the run's bucketing."""
    params = list(model.parameters())
    n_bytes = sum(p.numel() * p.element_size() for p in params)
    if run.get("bucketing") == "layer":
        # Layer-wise selection: every parameter tensor its own DDP bucket (caps under the smallest
        # tensor; DDP never splits a tensor), so each is selected on its own.
        smallest = min(p.numel() * p.element_size() for p in params)
        return smallest / 2 / 2**20, max(1, smallest // 2)
    if run.get("bucketing") == "global" or (run["compressor"] == "powersgd" and cfg["powersgd_one_bucket"]):
        # One DDP bucket: the hook's later all-reduces are issued from future callbacks, whose
        # order across several buckets can differ between ranks; gloo then pairs mismatched
        # collectives (hang, or "op.preamble.length <= op.nbytes"). With one bucket there is one
        # chain per step. bucket_cap_mb alone is not enough: after its first iteration DDP
        # rebuilds its buckets with the first one capped at dist._DEFAULT_FIRST_BUCKET_BYTES
        # (1 MB), which DDP's source says users may set; both go above the gradient size.
        # (The same single bucket makes a /global spex run's selection global over the model.)
        cap = max(cfg["bucket_cap_mb"], 2 * n_bytes / 2**20)
        return cap, int(cap * 2**20)
    return cfg["bucket_cap_mb"], None


def make_ddp(cfg: Dict[str, Any], run: Dict[str, Any], model, half: bool):
    """The DDP module over `model` with the run's bucketing."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    cap, first = bucket_cap(cfg, run, model)
    saved = dist._DEFAULT_FIRST_BUCKET_BYTES
    if first is not None:
        dist._DEFAULT_FIRST_BUCKET_BYTES = first
    # --dtype bf16: the spex runs train a bfloat16 model (the same initial parameters on every
    # rank, checked by half_ddp instead of DDP's broadcast, which gloo cannot do in bfloat16).
    if half:
        import spex.torch

        ddp = spex.torch.half_ddp(model.to(torch.bfloat16), bucket_cap_mb=cap)
    else:
        ddp = DDP(model, bucket_cap_mb=cap)
    dist._DEFAULT_FIRST_BUCKET_BYTES = saved  # the reducer keeps the value it was built with
    return ddp


class StatsReader:
    """Rank 0 reads GetStats after every step: achieved density, and which buckets of a sparse
    run went dense (and why), reported once per bucket and reason. GetStats holds each bucket's
    last exchange, recorded just after the result is published, so a read can see the step
    before: exchanges are counted once per (bucket, step) seen."""

    def __init__(self, spex_state, run: Dict[str, Any], quiet: bool):
        self.spex, self.run, self.quiet = spex_state, run, quiet
        self.dense_notes: Dict[Any, Dict[str, Any]] = {}
        self.seen = set()
        self.bucket_exchanges = self.dense_exchanges = 0
        self.patterns: Dict[str, int] = {}

    def densities(self, report):
        """(achieved, gathered) density of a report, element-weighted; None for an empty one."""
        if not report:
            return None
        elems = sum(b["elements"] for b in report)
        return (sum(b["achieved_density"] * b["elements"] for b in report) / elems,
                sum(b["gathered_density"] * b["elements"] for b in report) / elems)

    def after_step(self, step: int):
        report = self.spex.exchange_report()
        for b in report:
            if (b["bucket_id"], b["step"]) in self.seen:
                continue
            self.seen.add((b["bucket_id"], b["step"]))
            self.bucket_exchanges += 1
            self.patterns[b["pattern"]] = self.patterns.get(b["pattern"], 0) + 1
            if b["dense"]:
                self.note_dense(b, step)
        return self.densities(report)

    def note_dense(self, b: Dict[str, Any], step: int) -> None:
        self.dense_exchanges += 1
        key = (b["elements"], b["why"][:40])
        note = self.dense_notes.setdefault(key, {"elements": b["elements"], "why": b["why"], "count": 0,
                                                 "first_step": step, "bucket_id": b["bucket_id"]})
        note["count"] += 1
        if note["count"] == 1 and not self.quiet:
            print(f"[{self.run['label']:>12}] NOTE: bucket {b['bucket_id']} ({b['elements']} elements) was "
                  f"exchanged DENSE at step {step}, not {self.run['compressor']}: {b['why']}", flush=True)

    def summary(self) -> Dict[str, Any]:
        return {"bucket_exchanges": self.bucket_exchanges, "dense_exchanges": self.dense_exchanges,
                "dense_notes": list(self.dense_notes.values()), "patterns": self.patterns}


class Run:
    """One run on this rank: the model, its DDP, hook and optimizer, and what it recorded."""

    def __init__(self, cfg: Dict[str, Any], run: Dict[str, Any], data, run_index: int):
        import torch

        self.cfg, self.run, self.data = cfg, run, data
        self.workload = WORKLOADS[cfg["model"]]
        torch.manual_seed(cfg["seed"])
        self.model = self.workload.build(cfg)
        half = cfg.get("dtype") == "bf16" and self.workload.half_ok and not is_peer(run)
        self.dtype = torch.bfloat16 if half else torch.float32
        self.ddp = make_ddp(cfg, run, self.model, half)
        self.steps_per_epoch = self.workload.steps_per_epoch(len(data[0]), cfg["world"], cfg)
        self.run_index = run_index
        self.layer_nz: Dict[str, List[int]] = {}
        self.layer_nz_steps = 0
        self.step_rows: List[List[Any]] = []
        self.epoch_rows: List[Dict[str, Any]] = []
        self.step = 0
        # Accordion-style adaptive density (/aF; rank 0): the update accumulated over each epoch,
        # its norms, and per epoch the density set and whether the epoch was taken as critical.
        self.delta: Optional[List[Any]] = None
        self.delta_norms: List[float] = []
        self.adaptive: List[Dict[str, Any]] = []
        # Seconds this rank spent in the harness's own checks (parameter digests, per-module
        # density counts, GetStats reads; not the barrier after a digest): what a user's training
        # loop would not do. The time to target leaves them out (report.py); wall_s keeps them.
        self.harness_s = 0.0
        self.eval_count = 0

    def start(self) -> None:
        """Registers the hook and builds the optimizer."""
        import torch

        cfg, run = self.cfg, self.run
        self.state = hooks.register(self.ddp, cfg, run, self.steps_per_epoch * cfg["epochs"], self.run_index)
        self.spex_state = self.state if not is_peer(run) else None
        self.stats = StatsReader(self.spex_state, run, cfg["quiet"]) if self.spex_state is not None else None
        # Momentum correction moves the momentum into the hook (before the exchange); the optimizer
        # then applies the averaged update as it is.
        self.opt = torch.optim.SGD(self.model.parameters(), lr=cfg["lr"],
                                   momentum=0.0 if run.get("momentum_correction") else cfg["momentum"])

    def train_step(self, idx, epoch: int, acc: Dict[str, List[float]]) -> None:
        import torch.distributed as dist

        cfg, rank = self.cfg, self.cfg["rank"]
        t0 = time.perf_counter()
        cpu0 = time.process_time()  # this trainer's CPU (all its threads) over the step
        dcpu0 = cpu_seconds([cfg["daemon_pid"]]) if cfg.get("daemon_pid") else None
        self.opt.zero_grad(set_to_none=True)
        loss = self.workload.loss(self.ddp, self.data, idx, cfg, self.dtype)
        loss.backward()
        self.opt.step()
        step_s = time.perf_counter() - t0
        cpu_s = time.process_time() - cpu0
        # The node's daemon over the step (/proc: clock ticks, so a step's figure is coarse and
        # the mean over steps is what counts); local rank 0 only, one row per daemon.
        dcpu_s = f"{cpu_seconds([cfg['daemon_pid']]) - dcpu0:.6f}" if dcpu0 is not None else ""
        t_harness = time.perf_counter()
        every = cfg.get("modules_every", 1)
        if rank == 0 and every and self.step % every == 0:  # what the averaged update held, per module
            self.layer_nz_steps += 1  # (untimed; step() keeps .grad)
            for key, (nz, n) in layer_nonzero(self.model).items():
                a = self.layer_nz.setdefault(key, [0, 0])
                a[0] += nz
                a[1] += n
        self.harness_s += time.perf_counter() - t_harness
        if rank == 0 and self.run.get("adaptive_factor"):  # Accordion's rule: the run's own cost
            self.accumulate_update()
        timings = self.state.pop_timings()
        exchange_s = sum(t[3] for t in timings)
        density = gath = float("nan")
        t_harness = time.perf_counter()
        if self.stats is not None and rank == 0 and cfg["stats_every"] and self.step % cfg["stats_every"] == 0:
            found = self.stats.after_step(self.step)
            if found:
                density, gath = found
                acc["density"].append(density)
                acc["gathered"].append(gath)
        acc["loss"].append(loss.item())
        acc["exch"].append(exchange_s)
        acc["step"].append(step_s)
        digest = params_digest(self.model) if cfg["check_every"] and self.step % cfg["check_every"] == 0 else ""
        # The harness's time is this rank's own checks; the barrier below is not in it: waiting
        # there also takes up the ranks' skew, which training without the check would pay in
        # the next exchange, so it stays in the time to target (the conservative side).
        self.harness_s += time.perf_counter() - t_harness
        if digest:
            # Hashing 42 MB takes each rank a different time on shared cores; meeting here
            # (untimed) keeps that skew out of the next step's exchange time, which would
            # otherwise include waiting for the slowest hasher.
            dist.barrier()
        self.step_rows.append([self.step, epoch, f"{loss.item():.6f}", f"{step_s:.6f}", f"{exchange_s:.6f}",
                               len(timings), f"{density:.6f}", f"{gath:.6f}", digest, f"{cpu_s:.6f}", dcpu_s])
        self.step += 1

    def accumulate_update(self) -> None:
        """Adds the step's averaged update (rank 0's .grad after the exchange) to the epoch's sum.
        With error feedback the updates sent add up to the gradients less the residual, so the
        sum stands in for Accordion's accumulated gradient."""
        import torch

        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.delta is None:
            self.delta = [torch.zeros_like(p.grad, dtype=torch.float32) for p in params]
        for d, p in zip(self.delta, params):
            d.add_(p.grad.float())

    def adaptive_density(self, epoch: int) -> None:
        """Accordion's rule per epoch (mainjob.runs.accordion_epoch) over the accumulated
        update's norms. Rank 0 sets it; every daemon switches at the same step."""
        if self.delta is not None:
            self.delta_norms.append(float(sum(float(d.pow(2).sum()) for d in self.delta)) ** 0.5)
            for d in self.delta:
                d.zero_()
        rule = accordion_epoch(self.delta_norms, self.run["density"], self.run["adaptive_factor"])
        self.spex_state.set_density(rule["density"])
        self.adaptive.append({"epoch": epoch, **rule})

    def train_epoch(self, epoch: int, t_run: float) -> None:
        import torch
        import torch.distributed as dist

        cfg, run, rank, world = self.cfg, self.run, self.cfg["rank"], self.cfg["world"]
        warm = run.get("warmup_epochs", 0)
        if self.spex_state is not None and rank == 0 and warm and epoch <= warm:
            # DGC's warm-up: the density falls 4x per epoch to the target over the first `warm`
            # epochs (all nodes switch at the same step; the daemons agree on it).
            self.spex_state.set_density(min(1.0, run["density"] * 4.0 ** (warm - epoch)))
        if self.spex_state is not None and rank == 0 and run.get("adaptive_factor"):
            self.adaptive_density(epoch)
        t_epoch = time.perf_counter()
        perm = torch.randperm(len(self.data[0]), generator=torch.Generator().manual_seed(cfg["seed"] * 100003 + epoch))
        mine = perm[rank::world]
        acc: Dict[str, List[float]] = {"loss": [], "exch": [], "step": [], "density": [], "gathered": []}
        batch = cfg["batch"]
        for s in range(self.steps_per_epoch):
            self.train_step(mine[s * batch:(s + 1) * batch], epoch, acc)
        # Every rank starts the next epoch together: the all-reduce of the evaluation's sums is
        # the meeting point.
        test_acc, ppl = self.evaluate()
        t_harness = time.perf_counter()
        if not cfg["check_every"] and self.step_rows:
            # --check-every 0: the parameters are still compared across ranks, once an epoch (its
            # last step's row), where the evaluation's all-reduce has just brought the ranks together.
            self.step_rows[-1][8] = params_digest(self.model)
        if self.stats is not None and rank == 0 and not cfg["stats_every"]:
            found = self.stats.densities(self.spex_state.exchange_report())
            if found:
                acc["density"].append(found[0])
                acc["gathered"].append(found[1])
        self.harness_s += time.perf_counter() - t_harness
        self.record_epoch(epoch, acc, test_acc, ppl, t_run, t_epoch)

    def evaluate(self):
        """(test accuracy %, test perplexity or None) on the held-out entries, each rank taking
        every world-th entry (as a DistributedSampler would) and the sums added over the ranks, so
        the evaluation costs the job what one pass over the test set costs, not one per rank."""
        import math

        import torch
        import torch.distributed as dist

        rank, world = self.cfg["rank"], self.cfg["world"]
        xte, yte = self.data[2], self.data[3]
        mine = slice(rank, None, world)
        with torch.no_grad():
            correct, count, nll = self.workload.eval_sums(self.model, xte[mine], yte[mine] if yte is not None else None,
                                                          self.cfg, self.dtype)
        sums = torch.tensor([correct, count, nll if nll is not None else 0.0], dtype=torch.float64)
        dist.all_reduce(sums)
        correct, count, nll_sum = int(sums[0]), int(sums[1]), float(sums[2])
        self.eval_count = count  # every held-out entry once (tests/python/train_digits_test.py)
        return 100.0 * correct / count, (math.exp(nll_sum / count) if nll is not None else None)

    def record_epoch(self, epoch, acc, test_acc, ppl, t_run, t_epoch) -> None:
        mean = lambda v: (sum(v) / len(v)) if v else float("nan")  # noqa: E731
        row = {"epoch": epoch, "loss": mean(acc["loss"]), "test_acc": test_acc, "test_ppl": ppl,
               "exchange_ms": 1e3 * mean(acc["exch"]), "step_ms": 1e3 * mean(acc["step"]),
               "wall_s": time.perf_counter() - t_run, "harness_s": self.harness_s,
               "test_count": self.eval_count, "density": mean(acc["density"]),
               "gathered_density": mean(acc["gathered"]), "epoch_s": time.perf_counter() - t_epoch}
        self.epoch_rows.append(row)
        if self.cfg["rank"] == 0 and not self.cfg["quiet"]:
            print(f"[{self.run['label']:>12}] epoch {epoch + 1:3d}/{self.cfg['epochs']}  loss {row['loss']:.4f}  "
                  + (f"test ppl {ppl:8.1f}  " if ppl is not None else "") +
                  f"test acc {test_acc:6.2f}%  step {row['step_ms']:8.2f} ms  exchange {row['exchange_ms']:8.2f} "
                  f"ms/step  density {row['density']:.4f} (gathered {row['gathered_density']:.4f})  "
                  f"({row['epoch_s']:.2f} s)", flush=True)

    def finish(self, run_s: float) -> None:
        """Closes the spex hook and writes this rank's steps (rank 0: the run's epochs too)."""
        out, rank = self.run["out"], self.cfg["rank"]
        buckets = []
        if self.spex_state is not None:
            buckets = [b.elements for b in self.spex_state.buckets]
            if rank == 0:
                with open(os.path.join(out, "getstats.txt"), "w") as f:
                    f.write(str(self.spex_state.stats()))
            self.spex_state.close()
        with open(os.path.join(out, f"steps.rank{rank}.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["step", "epoch", "loss", "step_s", "exchange_s", "exchanges", "density", "gathered_density",
                        "params_sha1", "cpu_s", "daemon_cpu_s"])
            w.writerows(self.step_rows)
        if rank == 0:
            stats = self.stats.summary() if self.stats is not None else StatsReader(None, self.run, True).summary()
            with open(os.path.join(out, "epochs.json"), "w") as f:
                json.dump({"epochs": self.epoch_rows, "run_s": run_s, "steps": self.step, "buckets": buckets,
                           **stats, "layer_nonzero": self.layer_nz,
                           "layer_nonzero_steps": self.layer_nz_steps, "adaptive": self.adaptive}, f)


def skip_unsupported(cfg: Dict[str, Any], run: Dict[str, Any]) -> bool:
    """True (and said so, on every rank alike) when this torch cannot run the run (bf16 over gloo)."""
    import torch.distributed as dist

    if run["compressor"] != "bf16":
        return False
    why = hooks.bf16_unsupported()
    if why is None:
        return False
    if cfg["rank"] == 0:
        with open(os.path.join(run["out"], "epochs.json"), "w") as f:
            json.dump({"unsupported": why}, f)
        print(f"[{run['label']:>12}] NOT RUN: {why}", flush=True)
    dist.barrier()
    return True


def train_one(cfg: Dict[str, Any], run: Dict[str, Any], data, run_index: int) -> None:
    import torch.distributed as dist

    r = Run(cfg, run, data, run_index)
    if skip_unsupported(cfg, run):
        return
    r.start()
    t_run = time.perf_counter()
    for epoch in range(cfg["epochs"]):
        r.train_epoch(epoch, t_run)
    r.finish(time.perf_counter() - t_run)
    # Every trainer said Goodbye before any opens the next run's session: the daemons then
    # start the next run as a new job (step 0, fresh buckets).
    dist.barrier()


def worker(cfg: Dict[str, Any]) -> None:
    """One DDP process: trains every run in turn (one process start for all runs)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=cfg["rendezvous"], rank=cfg["rank"], world_size=cfg["world"])
    if os.environ.get("TRAIN_DIGITS_TRACE_COLLECTIVES"):
        hooks.trace_collectives(cfg["rank"])
    data = WORKLOADS[cfg["model"]].load(cfg)
    for i, run in enumerate(cfg["runs"]):
        train_one(cfg, run, data, i)
    dist.destroy_process_group()
