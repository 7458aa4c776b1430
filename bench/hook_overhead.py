#!/usr/bin/python3
"""What the spex hook costs a trainer per step, beside DDP's own all-reduce (a program, not a test).

One node: one spexd (LocalCluster, 1 node x --trainers) and --trainers DDP processes on a gloo
group over loopback. The model is a stack of --layers square Linear layers of --width (a model
whose backward is cheap, so that what the exchange costs the trainer is visible), split by DDP
into buckets of --bucket-mb. Every configuration runs in every trainer on the same model, in ABBA
order over --rounds (A B ... B A), --steps timed steps after --warmup:

  local       backward without DDP (no exchange: the compute every other row pays too)
  ddp         DDP's own all-reduce (gloo)
  fp16        DDP with PyTorch's fp16_compress_hook
  spex-copy   DDP with the spex hook copying DDP's bucket into the input slot (zero_copy=False),
              the daemon's dense path (compressor dense)
  spex        the same with the hook's default, zero copy (DDP's bucket is the daemon's input)
  spex-micro  DDP with the spex hook (zero copy), micro at --density

Per configuration, per trainer step (medians over the trainers' passes): the step's wall time
(zero_grad + backward, which waits for DDP's exchange); the trainer process's CPU time (every
thread: /proc/self/task/*/schedstat, nanoseconds on a core), split into the main thread (autograd
runs the hooks there on the CPU) and the other threads (gloo's, and the spex hook's worker); for
the spex rows also the time spent inside the hook's call (the copy into the shared segment, for
spex-copy, + ringing the daemon; wall and main-thread CPU), the worker thread's CPU (waits for the result, completes
DDP's future), and, measured alone in the same run, the copy of a bucket of gradients into the
segment (torch's copy_). The daemon's CPU is not the trainer's and is not counted (the main job
reports it). Ratios are against `ddp` in the same run.

    .venv/bin/python bench/hook_overhead.py [--trainers 2] [--width 1024] [--layers 4]
        [--bucket-mb 4] [--steps 30] [--warmup 5] [--rounds 1] [--density 0.01] [--out PREFIX]

Writes <out>.json and <out>.png (default bench/results/hook_overhead.*). Needs the built spexd
(bazel build //daemon:spexd; --spexd, else $SPEXD, else bazel-bin/daemon/spexd) and the spex package installed (the .venv deploy/main_job.sh makes).
On 2 shared cores the daemon, gloo's threads and the trainers compete for the same cores, so
the wall times include waiting for a core; the CPU columns are what each part used.
"""
import argparse
import json
import os
import statistics
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIGS = ("local", "ddp", "fp16", "spex-copy", "spex", "spex-micro")


def thread_cpu_ns(tid=None):
    """CPU nanoseconds of one thread of this process (schedstat's first field), or of every
    thread when tid is None."""
    tids = [tid] if tid is not None else [int(t) for t in os.listdir("/proc/self/task")]
    total = 0
    for t in tids:
        try:
            with open(f"/proc/self/task/{t}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass  # a thread that ended
    return total


class HookMeter:
    """Wraps the spex hook state's __call__: time inside the call (wall, and the calling thread's
    CPU)."""

    def __init__(self, state):
        self.state, self.wall, self.cpu = state, 0.0, 0

    def __call__(self, bucket):
        import threading
        tid = threading.get_native_id()
        t0, c0 = time.perf_counter(), thread_cpu_ns(tid)
        fut = self.state(bucket)
        self.cpu += thread_cpu_ns(tid) - c0
        self.wall += time.perf_counter() - t0
        return fut


def metered_hook(meter, bucket):
    return meter(bucket)


def build(cfg, model, args, socket, rank, local_size):
    """(the module to train, the spex state or None, the hook meter or None)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    if cfg == "local":
        return model, None, None
    ddp = DDP(model, bucket_cap_mb=args.bucket_mb)
    if cfg == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif cfg.startswith("spex"):
        from spex.torch import SpexHookState
        compressor, density = ("micro", args.density) if cfg == "spex-micro" else ("dense", None)
        state = SpexHookState(ddp, compressor=compressor, density=density, socket=socket, local_rank=rank,
                              local_size=local_size, job=f"hook-overhead-{cfg}", zero_copy=cfg != "spex-copy")
        meter = HookMeter(state)
        ddp.register_comm_hook(meter, metered_hook)
        return ddp, state, meter
    del torch
    return ddp, None, None


def run_config(cfg, args, socket, rank, local_size):
    import torch
    torch.manual_seed(1)
    layers = [torch.nn.Linear(args.width, args.width) for _ in range(args.layers)]
    model = torch.nn.Sequential(*layers)
    x = torch.randn(args.batch, args.width)
    module, state, meter = build(cfg, model, args, socket, rank, local_size)
    worker_tid = state._worker.native_id if state is not None else None
    try:
        for _ in range(args.warmup):
            module.zero_grad(set_to_none=False)
            module(x).square().mean().backward()
        if meter is not None:
            meter.wall, meter.cpu = 0.0, 0
        main_tid = __import__("threading").get_native_id()
        w0 = thread_cpu_ns(worker_tid) if worker_tid else 0
        c0, m0, t0 = thread_cpu_ns(), thread_cpu_ns(main_tid), time.perf_counter()
        for _ in range(args.steps):
            module.zero_grad(set_to_none=False)
            module(x).square().mean().backward()
        wall = time.perf_counter() - t0
        cpu, main = thread_cpu_ns() - c0, thread_cpu_ns(main_tid) - m0
        s = args.steps
        row = {"config": cfg, "rank": rank, "step_ms": 1e3 * wall / s, "cpu_ms": 1e-6 * cpu / s,
               "main_cpu_ms": 1e-6 * main / s, "other_cpu_ms": 1e-6 * (cpu - main) / s}
        if meter is not None:
            row.update(hook_call_ms=1e3 * meter.wall / s, hook_call_cpu_ms=1e-6 * meter.cpu / s,
                       worker_cpu_ms=1e-6 * (thread_cpu_ns(worker_tid) - w0) / s)
            row["copy_ms"] = copy_ms(state)
        return row
    finally:
        if state is not None:
            state.close()


def copy_ms(state):
    """The copy of every bucket's gradients into its input slot, alone (median of 9, per step)."""
    import torch
    total = 0.0
    for b in state.buckets:
        src = torch.randn(b.elements)
        times = []
        for _ in range(9):
            t0 = time.perf_counter()
            b.input_tensor.copy_(src)
            times.append(time.perf_counter() - t0)
        total += statistics.median(times)
    return 1e3 * total


def trainer(rank, args, socket, port, queue):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=args.trainers)
    rows = []
    for order in schedule(args.rounds):
        rows.append(run_config(order, args, socket, rank, args.trainers))
        dist.barrier()
    dist.destroy_process_group()
    queue.put(rows)


def schedule(rounds):
    """ABBA: the configurations forwards, then backwards, `rounds` times."""
    out = []
    for _ in range(rounds):
        out += list(CONFIGS) + list(reversed(CONFIGS))
    return out


def summarise(rows):
    keys = ("step_ms", "cpu_ms", "main_cpu_ms", "other_cpu_ms", "hook_call_ms", "hook_call_cpu_ms",
            "worker_cpu_ms", "copy_ms")
    out = {}
    for cfg in CONFIGS:
        mine = [r for r in rows if r["config"] == cfg]
        out[cfg] = {k: statistics.median(r[k] for r in mine) for k in keys if all(k in r for r in mine)}
    base = out["ddp"]
    local = out["local"]
    for cfg, m in out.items():
        m["step_vs_ddp"] = m["step_ms"] / base["step_ms"]
        m["cpu_vs_ddp"] = m["cpu_ms"] / base["cpu_ms"]
        # What the exchange costs the trainer: its CPU beyond the backward alone.
        m["exchange_cpu_ms"] = m["cpu_ms"] - local["cpu_ms"]
    ddp_x = out["ddp"]["exchange_cpu_ms"]
    for m in out.values():
        m["exchange_cpu_vs_ddp"] = m["exchange_cpu_ms"] / ddp_x if ddp_x > 0 else None
    return out


def plot(summary, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("hook_overhead: matplotlib not installed, no plot")
        return
    cfgs = [c for c in CONFIGS if c != "local"]
    fig, ax = plt.subplots(figsize=(7, 4))
    main = [summary[c]["main_cpu_ms"] - summary["local"]["main_cpu_ms"] for c in cfgs]
    other = [summary[c]["other_cpu_ms"] - summary["local"]["other_cpu_ms"] for c in cfgs]
    ax.bar(cfgs, main, label="main thread (beyond backward alone)")
    ax.bar(cfgs, other, bottom=main, label="other threads (gloo, spex worker)")
    ax.set_ylabel("trainer CPU per step for the exchange (ms)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trainers", type=int, default=2)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--bucket-mb", type=float, default=4.0)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--spexd", default=os.environ.get("SPEXD") or os.path.join(ROOT, "bazel-bin", "daemon", "spexd"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "hook_overhead"))
    args = ap.parse_args()
    import socket as _socket
    import torch.multiprocessing as mp
    from spex.cluster import LocalCluster
    with _socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with LocalCluster(args.spexd, nodes=1, trainers=args.trainers) as cluster:
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        procs = [ctx.Process(target=trainer, args=(r, args, cluster.socket(0), port, queue))
                 for r in range(args.trainers)]
        for p in procs:
            p.start()
        rows, got = [], 0
        while got < len(procs):
            try:
                rows += queue.get(timeout=5)
                got += 1
            except Exception:  # queue.Empty: check that every trainer is still alive
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    for p in procs:
                        p.kill()
                    raise SystemExit(f"hook_overhead: a trainer failed (exit {dead[0]}); see above")
        for p in procs:
            p.join()
    summary = summarise(rows)
    params = args.layers * (args.width * args.width + args.width)
    print(f"hook_overhead: 1 node x {args.trainers} trainers, {params} parameters in buckets of "
          f"{args.bucket_mb:g} MB, {args.steps} steps x {2 * args.rounds} passes (ABBA), "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    hdr = (f"{'config':<11}{'step ms':>9}{'x ddp':>7}{'cpu ms':>8}{'main':>7}{'other':>7}{'xchg cpu':>9}"
           f"{'x ddp':>7}{'hook call':>10}{'call cpu':>9}{'worker':>8}{'copy':>7}")
    print(hdr)
    for cfg in CONFIGS:
        m = summary[cfg]
        f = lambda k: f"{m[k]:.2f}" if m.get(k) is not None else "-"  # noqa: E731
        print(f"{cfg:<11}{f('step_ms'):>9}{f('step_vs_ddp'):>7}{f('cpu_ms'):>8}{f('main_cpu_ms'):>7}"
              f"{f('other_cpu_ms'):>7}{f('exchange_cpu_ms'):>9}{f('exchange_cpu_vs_ddp'):>7}"
              f"{f('hook_call_ms'):>10}{f('hook_call_cpu_ms'):>9}{f('worker_cpu_ms'):>8}{f('copy_ms'):>7}")
    zc, cp = summary["spex"], summary["spex-copy"]
    print(f"zero copy (spex) against copying into the slot (spex-copy), per trainer step: trainer CPU "
          f"{zc['cpu_ms']:.2f} vs {cp['cpu_ms']:.2f} ms ({zc['cpu_ms'] / cp['cpu_ms']:.3f}x), inside the hook's "
          f"calls {zc['hook_call_cpu_ms']:.2f} vs {cp['hook_call_cpu_ms']:.2f} ms "
          f"({zc['hook_call_cpu_ms'] / cp['hook_call_cpu_ms']:.3f}x), step {zc['step_ms'] / cp['step_ms']:.3f}x")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump({"args": vars(args), "parameters": params, "cores": os.cpu_count(),
                   "load_end": os.getloadavg()[0], "rows": rows, "summary": summary}, f, indent=1)
    plot(summary, args.out + ".png")
    print(f"hook_overhead: wrote {args.out}.json and {args.out}.png")


if __name__ == "__main__":
    main()
