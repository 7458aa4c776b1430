#!/usr/bin/env python3
"""The dense exchange of a bfloat16 bucket against a float32 one on emulated hosts (issue 30;
docs/dtypes.md): 2 hosts (network namespaces, tc rate each way, deploy/emulated_cluster.sh),
one trainer per host, one spexd per host. Both buckets are dense and the same size. They run in
the same session, alternating per step (float32, then bfloat16, then float32, ...), so a load
change hits both alike. Each exchange is timed in the trainer (write + exchange + the result
read back, wall clock). Printed and written: the median per type and the ratio bfloat16 /
float32 (the goal: <= 0.55 at 1 Gbit/s), JSON and CSV and a plot under bench/results/.

    sudo python3 bench/half_dense_bench.py [--rate 1gbit] [--elements 8000000] [--steps 8]

Needs root (network namespaces) and the spex package importable (PYTHONPATH or a venv).
"""

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def trainer(args):
    """One host's trainer: both buckets, alternating, each exchange timed."""
    import numpy as np
    import torch

    import spex

    n = args.elements
    times = {"float32": [], "bfloat16": []}
    with spex.Client(args.socket) as c:
        b32 = c.register_bucket(0, n, compressor="dense")
        b16 = c.register_bucket(1, n, compressor="dense", dtype=torch.bfloat16)
        x = torch.randn(n, generator=torch.Generator().manual_seed(args.node))
        x16 = x.to(torch.bfloat16)
        x32 = x.numpy()
        for step in range(args.warmup + args.steps):
            for name, b, data in (("float32", b32, x32), ("bfloat16", b16, x16)):
                t0 = time.perf_counter()
                c.exchange(b, data)
                _ = float(b.output_tensor[0])
                if step >= args.warmup:
                    times[name].append(time.perf_counter() - t0)
        stats = {s.bucket_id: s for s in c.stats().buckets}
    phases = {name: {p.phase: p.seconds for p in stats[i].mean_phases} for name, i in (("float32", 0), ("bfloat16", 1))}
    with open(args.result, "w") as f:
        json.dump({"node": args.node, "times": times, "daemon_mean_phases_s": phases,
                   "bytes_sent": {"float32": stats[0].last.bytes_sent, "bfloat16": stats[1].last.bytes_sent}}, f)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--elements", type=int, default=8_000_000)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--spexd", default=os.path.join(ROOT, "bazel-bin", "daemon", "spexd"))
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "half_dense"))
    # Trainer mode (the driver starts it inside each host).
    p.add_argument("--trainer", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--socket", help=argparse.SUPPRESS)
    p.add_argument("--node", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.trainer:
        return trainer(args)

    from spex.emulated import EmulatedCluster

    why = EmulatedCluster.unavailable()
    if why:
        sys.exit(f"half_dense_bench: cannot emulate hosts here: {why}")
    tmp = tempfile.mkdtemp(prefix="half-dense-")
    hosts = 2
    with EmulatedCluster(args.spexd, hosts=hosts, trainers=1, rate=args.rate,
                         args=["--log_level=error"]) as cl:
        procs = []
        for node in range(hosts):
            result = os.path.join(tmp, f"node{node}.json")
            argv = [sys.executable, os.path.abspath(__file__), "--trainer", "--socket", cl.socket(node),
                    "--node", str(node), "--result", result, "--elements", str(args.elements),
                    "--steps", str(args.steps), "--warmup", str(args.warmup)]
            procs.append((cl.popen(node, argv, env=dict(os.environ)), result))
        for proc, _ in procs:
            if proc.wait(timeout=1800) != 0:
                sys.exit(f"half_dense_bench: a trainer failed (exit {proc.returncode})")
    res = [json.load(open(r)) for _, r in procs]
    med = {t: statistics.median(res[0]["times"][t]) for t in ("float32", "bfloat16")}
    ratio = med["bfloat16"] / med["float32"]
    summary = {"rate": args.rate, "hosts": hosts, "elements": args.elements, "steps": args.steps,
               "median_s": med, "ratio_bf16_over_f32": ratio, "bytes_sent": res[0]["bytes_sent"],
               "times": {f"node{r['node']}": r["times"] for r in res},
               "daemon_mean_phases_s": {f"node{r['node']}": r["daemon_mean_phases_s"] for r in res}}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(summary, f, indent=1)
    with open(args.out + ".csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["node", "dtype", "step", "seconds"])
        for r in res:
            for t, ts in r["times"].items():
                for i, s in enumerate(ts):
                    w.writerow([r["node"], t, i, f"{s:.6f}"])
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        for t in ("float32", "bfloat16"):
            ax.plot(res[0]["times"][t], marker="o", label=f"{t} (median {med[t] * 1e3:.0f} ms)")
        ax.set_xlabel("step")
        ax.set_ylabel("dense exchange (s)")
        ax.set_title(f"{args.elements:,} elements, {hosts} hosts at {args.rate}: bf16/f32 = {ratio:.3f}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.out + ".png", dpi=100)
    except ImportError:
        print("matplotlib missing: no plot")
    print(f"dense exchange, {args.elements} elements, {hosts} hosts at {args.rate}: float32 median "
          f"{med['float32'] * 1e3:.1f} ms, bfloat16 {med['bfloat16'] * 1e3:.1f} ms, ratio {ratio:.3f} "
          f"(goal <= 0.55); bytes sent per exchange {res[0]['bytes_sent']}")
    for t, ph in res[0]["daemon_mean_phases_s"].items():
        print(f"  node 0 daemon, {t}: " + " ".join(f"{k}={v * 1e3:.1f}ms" for k, v in ph.items() if v > 0))


if __name__ == "__main__":
    main()
