#!/usr/bin/python3
"""MiCRO's and ExDyna's selection with and without the edge hint, pinned, repeated, plotted.

Runs bazel-bin/bench/histogram_select_bench (HistogramQuotaSelect over one node's partition of a
ResNet-50-sized bucket, heavy-tailed inputs with fresh noise every step, the hinted and the
hint-less call interleaved on the same inputs, selections compared) --runs times pinned to one
core with taskset, and writes <out>.json (every step's times) and <out>.png (per-step time ratio
hint-less / hinted per density as box plots).

    bazel build //bench:histogram_select_bench
    /usr/bin/python3 bench/histogram_select_bench.py [--runs 3] [--steps 21] [--nodes 2]
        [--cpu 1] [--out bench/results/histogram_select]
"""
import argparse
import json
import os
import statistics

from pinned_runs import json_line_runs, quantile


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="bazel-bin/bench/histogram_select_bench")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=21)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--densities", default="0.001,0.01")
    ap.add_argument("--cpu", default="1", help="taskset core list; empty: not pinned")
    ap.add_argument("--out", default="bench/results/histogram_select")
    a = ap.parse_args()
    cmd = [a.bin, f"--steps={a.steps}", f"--nodes={a.nodes}", f"--densities={a.densities}"]
    rows = json_line_runs([cmd] * a.runs, a.cpu, "histogram_select_bench")
    summary = []
    for d in sorted({r["density"] for r in rows}):
        rs = [r for r in rows if r["density"] == d]
        ratios = sorted(r["full_ms"] / r["hint_ms"] for r in rs)
        q = lambda f: quantile(ratios, f)  # noqa: E731
        s = {"density": d, "elements": rs[0]["elements"], "quota": rs[0]["quota"], "steps": len(rs),
             "full_ms_median": statistics.median(r["full_ms"] for r in rs),
             "hint_ms_median": statistics.median(r["hint_ms"] for r in rs),
             "speedup_median": statistics.median(ratios), "speedup_q25": q(0.25), "speedup_q75": q(0.75)}
        summary.append(s)
        print(f"d={d:g}: {s['elements']:,} floats, quota {s['quota']:,}: hint-less {s['full_ms_median']:.2f} ms, "
              f"hinted {s['hint_ms_median']:.2f} ms; per-step ratio median {s['speedup_median']:.2f}x "
              f"(quartiles {s['speedup_q25']:.2f}-{s['speedup_q75']:.2f}) over {s['steps']} steps")
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump({"nodes": a.nodes, "cpu": a.cpu, "runs": a.runs, "summary": summary, "rows": rows}, f, indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        ds = [s["density"] for s in summary]
        ax.boxplot([[r["full_ms"] / r["hint_ms"] for r in rows if r["density"] == d] for d in ds],
                   labels=[f"d={d:g}" for d in ds])
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_ylabel("hint-less / hinted time per step")
        ax.set_title(f"HistogramQuotaSelect, {summary[0]['elements']:,} floats (1/{a.nodes} of ResNet-50)",
                     fontsize=9)
        fig.tight_layout()
        fig.savefig(a.out + ".png", dpi=110)
    except ImportError:
        print("matplotlib missing: no plot")
    print(f"wrote {a.out}.json and {a.out}.png")


if __name__ == "__main__":
    main()
