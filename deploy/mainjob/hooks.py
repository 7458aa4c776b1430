"""The communication hooks a main-job run registers on DDP: DDP's own all-reduce and PyTorch's
compression hooks (fp16, bf16, PowerSGD) as PyTorch documents them, each timed like the spex
hook's exchanges, or the spex hook itself; and a tracer of the collectives a rank issues."""

import time
from typing import Any, Dict, List, Optional

from mainjob.runs import is_peer


def allreduce_mean(world: int, bucket):
    """DDP's default all-reduce hook (sum over the gloo group, then / world), as a hook of its own
    so that TimedHook times the gloo baseline's exchanges like the spex hook's."""
    import torch.distributed as dist

    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].div_(world))


class TimedHook:
    """A PyTorch communication hook with its own state (DDP's all-reduce, fp16/bf16_compress_hook,
    powerSGD_hook), timed from the hook call to its result like the spex hook's exchanges."""

    def __init__(self, hook, state):
        self.hook = hook
        self.state = state
        self.times: List[float] = []

    def pop_timings(self) -> List[Any]:
        out, self.times = self.times, []
        return [(0, 0, 0, t) for t in out]


def timed_hook(state: TimedHook, bucket):
    t0 = time.perf_counter()

    def done(f):
        state.times.append(time.perf_counter() - t0)
        return f.value()

    return state.hook(state.state, bucket).then(done)


def peer_hook(run: Dict[str, Any], total_steps: int):
    """(state, hook) for a PyTorch peer run, with PyTorch's documented settings."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if run["compressor"] == "fp16":
        return TimedHook(default_hooks.fp16_compress_hook, None), timed_hook
    if run["compressor"] == "bf16":
        return TimedHook(default_hooks.bf16_compress_hook, None), timed_hook
    # PowerSGD: error feedback and warm start on (PyTorch's defaults and advice), plain
    # all-reduce for the first 10% of the steps ("start with 10% of total training steps"; at
    # least 2, the minimum DDP allows with error feedback).
    st = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=run["powersgd_rank"],
                                     start_powerSGD_iter=max(2, total_steps // 10), use_error_feedback=True,
                                     warm_start=True)
    return TimedHook(powerSGD_hook.powerSGD_hook, st), timed_hook


def bf16_unsupported() -> Optional[str]:
    """Why this torch's gloo cannot all-reduce bfloat16 (torch 1.13: "Invalid scalar type"), or
    None. Every rank fails the same way, so all of them skip the run."""
    import torch
    import torch.distributed as dist

    # A group of its own: a failed collective can leave the group it ran on unusable.
    probe = dist.new_group(backend="gloo")
    try:
        dist.all_reduce(torch.zeros(4, dtype=torch.bfloat16), group=probe)
    except RuntimeError as e:
        return f"this torch ({torch.__version__}) cannot all-reduce bfloat16 over gloo: {str(e).splitlines()[0]}"
    return None


def first_density(run: Dict[str, Any]) -> float:
    """The density of a sparse run's first epoch: 4x the target per warm-up epoch (/wN), F times
    it (/aF, whose first epochs count as critical), else the target."""
    if run.get("warmup_epochs"):
        return min(1.0, run["density"] * 4.0 ** run["warmup_epochs"])
    if run.get("adaptive_factor"):
        return min(1.0, run["density"] * run["adaptive_factor"])
    return run["density"]


def register(ddp, cfg: Dict[str, Any], run: Dict[str, Any], steps_total: int, run_index: int):
    """Registers the run's hook on `ddp`; returns its state (pop_timings() after each step), which
    for a spex run is the spex.torch.SpexHookState (GetStats, density, close)."""
    if run["compressor"] == "gloo":
        state: Any = TimedHook(allreduce_mean, cfg["world"])
        ddp.register_comm_hook(state, timed_hook)
        return state
    if is_peer(run):
        state, hook = peer_hook(run, steps_total)
        ddp.register_comm_hook(state, hook)
        return state
    import spex.torch

    # Each run gets its own bucket ids, so nothing of a previous run can be mistaken for it. The
    # buckets are registered at the first epoch's density: a density warm-up (/wN) or adaptive
    # density (/aF) starts above the target, and set_density changes only buckets that exist.
    state = spex.torch.SpexHookState(ddp, compressor=run["compressor"], density=first_density(run),
                                     params=run.get("params") or None, socket=cfg["socket"],
                                     local_rank=cfg["local_rank"], local_size=cfg["local_size"], mode=cfg["mode"],
                                     id_base=run_index << 32, zero_copy=cfg.get("zero_copy", True),
                                     momentum_correction=cfg["momentum"] if run.get("momentum_correction") else None,
                                     momentum_masking=run.get("momentum_masking", True))
    ddp.register_comm_hook(state, spex.torch.hook)
    return state


def trace_collectives(rank: int) -> None:
    """Prints every all_reduce this process issues, numbered, with its shape and thread: gloo
    pairs the n-th collective of every rank, so lists that differ between ranks show why a hook
    hangs (TRAIN_DIGITS_TRACE_COLLECTIVES=1; a diagnosis aid, off by default)."""
    import threading

    import torch.distributed as dist

    inner, count = dist.all_reduce, [0]

    def traced(tensor, *a, **kw):
        count[0] += 1
        print(f"collective rank {rank} #{count[0]} all_reduce {tuple(tensor.shape)} "
              f"({threading.current_thread().name})", flush=True)
        return inner(tensor, *a, **kw)

    dist.all_reduce = traced
