#!/usr/bin/python3
"""Ok-Topk against the all-gather exchange on the emulated cluster (a program, not a test; issue 15).

bench/oktopk_daemons_bench.py measures the two on loopback, where latency and the shared cores
decide and bandwidth costs nothing. Here the daemons run on the emulated cluster
(deploy/emulated_cluster.sh: one network namespace per host, a tbf rate each way, a core per host
where the machine has one), so the volume Ok-Topk saves has a price: for each host count of
--hosts at --rate, one cluster of spexd (--dense_fallback=off --min_sparse_elements=0
--threads=1) and one bench/sparse_exchange_trainer per host inside its namespace, which runs every
(density, compressor) of --densities x --compressors with its bucket registered as
`sparse_allreduce=allgather`, then `oktopk`, then `oktopk` and `allgather` again (ABBA, so a drift
of the machine's load over the run falls on both alike), --warmup + --steps exchanges each (the
default warm-up lets Ok-Topk's reused threshold settle). Inputs are the trainer's heavy-tailed
gradients (never a constant). Per (hosts, compressor, density, mode), over the timed steps of both
sessions: the exchange time (p50 of the slowest node per step), the daemon's collective phase
(the wire), and the bytes a node received per exchange in units of k pairs (8 k bytes); then the
ratios oktopk / allgather of the same run.

    .venv/bin/python bench/oktopk_network_bench.py [--hosts 2,4] [--rate 1gbit]
        [--elements 4194304] [--densities 0.001,0.01] [--compressors topk]
        [--warmup 30] [--steps 10] [--out bench/results/oktopk_network]

A (compressor, density) pair takes 4 x (warm-up + steps) exchanges per host count, each with its
untimed input generation, barrier and stats poll (for 25,557,032 floats at 4 hosts about 0.4 s
an exchange here). Ok-Topk's reused threshold needs about 1/density exchanges to settle, so a
short warm-up measures it before it has.

Needs root (namespaces), the spex Python package (the .venv deploy/main_job.sh makes) and the
built binaries (bazel build //daemon:spexd //bench:sparse_exchange_trainer). Writes <out>.json
and <out>.png. With more hosts than cores the hosts share cores, and the compute of every host
lands in every exchange's time: the output says so.
"""
import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from network_bench import run_trainers  # noqa: E402

MODES = ("allgather", "oktopk")


def summarize(rows, hosts, compressors, densities, elements):
    out = []
    for c in compressors:
        for d in densities:
            k = max(1, int(d * elements))
            per = {}
            for m in MODES:
                by = {}  # (session's bucket, step) -> its nodes' rows
                for r in rows:
                    if r["compressor"] != c or r["density"] != d or r["warmup"] or r["sparse_allreduce"] != m:
                        continue
                    by.setdefault((r["bucket"], r["step"]), []).append(r)
                steps = [v for v in by.values() if len(v) == hosts]
                if not steps:
                    continue
                per[m] = {
                    "exchange_ms": statistics.median(max(x["exchange_ms"] for x in s) for s in steps),
                    "wire_ms": statistics.median(statistics.median(x["collective_ms"] for x in s) for s in steps),
                    "received_per_k": statistics.median(x["bytes_received"] for s in steps for x in s) / (8.0 * k),
                    "kept_per_k": statistics.median(x["gathered"] for s in steps for x in s) / k,
                    "samples": len(steps),
                }
            if len(per) == 2:
                a, o = per["allgather"], per["oktopk"]
                out.append({"compressor": c, "density": d, "k": k, **{m: per[m] for m in MODES},
                            "time_ratio": o["exchange_ms"] / a["exchange_ms"],
                            "wire_ratio": o["wire_ms"] / a["wire_ms"] if a["wire_ms"] > 0 else None,
                            "received_ratio": o["received_per_k"] / a["received_per_k"]})
    return out


def plot(results, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    cfgs = results["configs"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    labels, t, v = [], [], []
    for cfg in cfgs:
        for r in cfg["runs"]:
            labels.append(f"{cfg['hosts']}h {r['compressor']}@{r['density']:g}")
            t.append(r["time_ratio"])
            v.append(r["received_ratio"])
    x = range(len(labels))
    for ax, vals, title in ((axes[0], t, "exchange time, oktopk / allgather"),
                            (axes[1], v, "received per node, oktopk / allgather")):
        ax.bar(x, vals, color=["tab:green" if y <= 1 else "tab:red" for y in vals])
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
    fig.suptitle(f"Ok-Topk vs all-gather on the emulated cluster at {results['rate']}, "
                 f"{results['elements']:,} floats, {results['cores']} cores", fontsize=10)
    fig.tight_layout()
    fig.savefig(out + ".png", dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", default="2,4")
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--elements", type=int, default=4194304)
    p.add_argument("--densities", default="0.001,0.01")
    p.add_argument("--compressors", default="topk")
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--spexd", default=os.path.join(ROOT, "bazel-bin", "daemon", "spexd"))
    p.add_argument("--trainer", default=os.path.join(ROOT, "bazel-bin", "bench", "sparse_exchange_trainer"))
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "oktopk_network"))
    args = p.parse_args()
    from spex.emulated import EmulatedCluster

    why = EmulatedCluster.unavailable()
    if why:
        sys.exit(f"oktopk_network_bench: cannot emulate hosts here: {why}")
    ncpu = os.cpu_count() or 1
    compressors = args.compressors.split(",")
    densities = [float(x) for x in args.densities.split(",")]
    results = {"elements": args.elements, "rate": args.rate, "cores": ncpu, "warmup": args.warmup,
               "steps": args.steps, "configs": []}
    base = ["--threads=1", "--min_sparse_elements=0", "--dense_fallback=off", "--log_level=warning"]
    all_rows = []
    for hosts in [int(h) for h in args.hosts.split(",")]:
        t0 = time.time()
        c = EmulatedCluster(args.spexd, hosts=hosts, trainers=1, rate=args.rate, args=base)
        try:
            c.start()
            print(f"== {c.description}", flush=True)
            rows = run_trainers(c, args.trainer, args, [
                f"--compressors={args.compressors}", f"--densities={args.densities}",
                f"--warmup={args.warmup}", f"--steps={args.steps}", "--pair_dense=false",
                "--sparse_allreduces=allgather,oktopk,oktopk,allgather"])
        finally:
            c.cleanup()
        runs = summarize(rows, hosts, compressors, densities, args.elements)
        cfg = {"hosts": hosts, "shared_cores": hosts > ncpu, "seconds": round(time.time() - t0, 1), "runs": runs}
        results["configs"].append(cfg)
        all_rows += [dict(r, hosts=hosts) for r in rows]
        for r in runs:
            a, o = r["allgather"], r["oktopk"]
            print(f"  {r['compressor']:>5}@{r['density']:<6g} exchange allgather {a['exchange_ms']:7.1f} ms, "
                  f"oktopk {o['exchange_ms']:7.1f} ms (x{r['time_ratio']:.2f}); wire {a['wire_ms']:6.1f} vs "
                  f"{o['wire_ms']:6.1f} ms; received/k {a['received_per_k']:.2f} vs {o['received_per_k']:.2f} "
                  f"(x{r['received_ratio']:.2f}); kept/k {o['kept_per_k']:.2f}", flush=True)
        if hosts > ncpu:
            print(f"  ({hosts} hosts share {ncpu} cores: every exchange's time includes the other hosts' "
                  "compute; the received volume is unaffected)")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(results, f, indent=1)
    # Every node's row of every exchange (warm-up included), for a closer look; large.
    with open(args.out + ".rows.jsonl", "w") as f:
        for r in all_rows:
            f.write(json.dumps(r) + "\n")
    plot(results, args.out)
    print(f"wrote {args.out}.json, {args.out}.rows.jsonl and {args.out}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
