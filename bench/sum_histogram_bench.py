#!/usr/bin/python3
"""MiCRO's local sum and selection with the histogram counted in the sum's pass, pinned, repeated, plotted.

Runs bazel-bin/bench/sum_histogram_bench (one node's step of micro: the residual plus two trainers'
gradients summed, then the selection; the fused variant counts the owned partition's histogram in
the sum's pass as spexd's CPU path does, the other counts it in the selection; interleaved step by
step on the same inputs, selections compared) --runs times pinned to one core with taskset, and
writes <out>.json (every step's times) and <out>.png (per-step sum + select time, unfused / fused,
and each phase).

    bazel build -c opt //bench:sum_histogram_bench
    /usr/bin/python3 bench/sum_histogram_bench.py [--runs 3] [--steps 40] [--octaves 1.25]
        [--cpu 1] [--out bench/results/sum_histogram]
"""
import argparse
import json
import os
import statistics

from pinned_runs import json_line_runs, quantile


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="bazel-bin/bench/sum_histogram_bench")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--bucket", type=int, default=3222538)
    ap.add_argument("--density", type=float, default=0.1)
    ap.add_argument("--octaves", type=float, default=1.25)
    ap.add_argument("--cpu", default="1", help="taskset core list; empty: not pinned")
    ap.add_argument("--out", default="bench/results/sum_histogram")
    a = ap.parse_args()
    rows = json_line_runs(
        [[a.bin, f"--steps={a.steps}", f"--bucket={a.bucket}", f"--density={a.density}",
          f"--octaves={a.octaves}", f"--seed={run + 1}"] for run in range(a.runs)],
        a.cpu, "sum_histogram_bench")
    med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    ratios = sorted((r["plain_sum_ms"] + r["plain_select_ms"]) / (r["fused_sum_ms"] + r["fused_select_ms"])
                    for r in rows)
    q = lambda f: quantile(ratios, f)  # noqa: E731
    below = sum(r["edge_bin"] < r["counted_from"] for r in rows)
    summary = {"elements": rows[0]["elements"], "selected": rows[0]["selected"], "steps": len(rows),
               "fused_sum_ms": med("fused_sum_ms"), "fused_select_ms": med("fused_select_ms"),
               "plain_sum_ms": med("plain_sum_ms"), "plain_select_ms": med("plain_select_ms"),
               "ratio_median": statistics.median(ratios), "ratio_q25": q(0.25), "ratio_q75": q(0.75),
               "edge_below_counted": below}
    s = summary
    print(f"{s['elements']:,} floats, {s['selected']:,} selected a step, {s['steps']} steps: "
          f"sum {s['plain_sum_ms']:.2f} -> {s['fused_sum_ms']:.2f} ms, select {s['plain_select_ms']:.2f} -> "
          f"{s['fused_select_ms']:.2f} ms (medians); sum + select unfused / fused per step: median "
          f"{s['ratio_median']:.2f}x (quartiles {s['ratio_q25']:.2f}-{s['ratio_q75']:.2f}); the edge fell below "
          f"the counted bins in {below} of {len(rows)} steps")
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump({"cpu": a.cpu, "runs": a.runs, "octaves": a.octaves, "density": a.density, "summary": summary,
                   "rows": rows}, f, indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        data = [[r["plain_sum_ms"] for r in rows], [r["fused_sum_ms"] for r in rows],
                [r["plain_select_ms"] for r in rows], [r["fused_select_ms"] for r in rows],
                [r["plain_sum_ms"] + r["plain_select_ms"] for r in rows],
                [r["fused_sum_ms"] + r["fused_select_ms"] for r in rows]]
        ax.boxplot(data, labels=["sum", "sum+hist", "select", "select\n(counted)", "both", "both\nfused"])
        ax.set_ylabel("ms per step")
        ax.set_title(f"micro@{a.density:g}, {s['elements']:,} floats, one node of 2: "
                     f"unfused / fused {s['ratio_median']:.2f}x", fontsize=9)
        fig.tight_layout()
        fig.savefig(a.out + ".png", dpi=110)
    except ImportError:
        print("matplotlib missing: no plot")
    print(f"wrote {a.out}.json and {a.out}.png")


if __name__ == "__main__":
    main()
