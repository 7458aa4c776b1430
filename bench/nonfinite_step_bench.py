#!/usr/bin/python3
"""The cost of the --nonfinite check (issue 16 item 3), pinned, repeated, plotted.

Runs bazel-bin/bench/nonfinite_step_bench (one node's sparse step: the engine's checked reduce
into the second accumulator against the unchecked in-step reduce it replaced and against the same
reduce with the check off, interleaved step by step, outputs compared bit for bit) once per
--trainers value and --runs times each, pinned to one core with taskset, and writes
<out>.json (every run's per-step times and paired ratios) and <out>.png (the per-step time
ratios checked/before and checked/check-off as box plots, the 0.97-1.03 band marked).

    bazel build //bench:nonfinite_step_bench
    /usr/bin/python3 bench/nonfinite_step_bench.py [--trainers 1,2] [--runs 3] [--reps 41]
        [--cpu 1] [--n 25557032] [--out bench/results/nonfinite_step]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def quartiles(v):
    v = sorted(v)
    return v[len(v) // 4], v[len(v) // 2], v[(3 * len(v)) // 4]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="bazel-bin/bench/nonfinite_step_bench")
    ap.add_argument("--trainers", default="1,2")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=41)
    ap.add_argument("--n", type=int, default=25557032)
    ap.add_argument("--compressor", default="micro")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--cpu", default="1", help="taskset core list; empty: not pinned")
    ap.add_argument("--out", default="bench/results/nonfinite_step")
    a = ap.parse_args()
    if not os.path.exists(a.bin):
        sys.exit(f"{a.bin} not found: bazel build //bench:nonfinite_step_bench")
    results = []
    for trainers in [int(t) for t in a.trainers.split(",") if t]:
        steps = {"before": [], "checked": [], "check_off": []}
        reduce_ratio = []
        for run in range(a.runs):
            with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
                cmd = (["taskset", "-c", a.cpu] if a.cpu else []) + [
                    a.bin, f"--trainers={trainers}", f"--reps={a.reps}", f"--n={a.n}",
                    f"--compressor={a.compressor}", f"--density={a.density}",
                    f"--json={tmp.name}"]
                p = subprocess.run(cmd, capture_output=True, text=True)
                sys.stdout.write(p.stdout)
                if p.returncode != 0:
                    sys.exit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr}")
                with open(tmp.name) as f:
                    r = json.load(f)
            for k in steps:
                steps[k] += r["step_ms"][k]
            reduce_ratio += r["reduce_ratio_checked_vs_check_off"]
        vs_before = [c / b for c, b in zip(steps["checked"], steps["before"])]
        vs_off = [c / o for c, o in zip(steps["checked"], steps["check_off"])]
        qb, qo, qr = quartiles(vs_before), quartiles(vs_off), quartiles(reduce_ratio)
        results.append({
            "trainers": trainers, "steps": len(vs_before), "step_ms": steps,
            "median_step_ms": {k: statistics.median(v) for k, v in steps.items()},
            "ratio_checked_vs_before": dict(zip(("q1", "median", "q3"), qb)),
            "ratio_checked_vs_check_off": dict(zip(("q1", "median", "q3"), qo)),
            "reduce_ratio_checked_vs_check_off": reduce_ratio,
            "reduce_ratio_quartiles": dict(zip(("q1", "median", "q3"), qr)),
        })
        print(f"{trainers} trainer(s), {len(vs_before)} paired steps: checked/before "
              f"{qb[1]:.3f} (IQR {qb[0]:.3f}-{qb[2]:.3f}), checked/check-off {qo[1]:.3f} "
              f"(IQR {qo[0]:.3f}-{qo[2]:.3f}); reduce alone checked/check-off {qr[1]:.3f} "
              f"(IQR {qr[0]:.3f}-{qr[2]:.3f}, {len(reduce_ratio)} pairs)")
    try:
        with open("/proc/loadavg") as f:
            load = f.read().split()[:3]
    except OSError:
        load = []
    doc = {"compressor": a.compressor, "density": a.density, "n": a.n, "reps": a.reps,
           "runs": a.runs, "cpu": a.cpu, "loadavg_after": load, "results": results}
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump(doc, f, indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("nonfinite_step_bench: no matplotlib, no plot", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(9, 4))
    data, labels = [], []
    for r in results:
        s = r["step_ms"]
        data.append([c / b for c, b in zip(s["checked"], s["before"])])
        labels.append(f"{r['trainers']} tr.\nchecked / before")
        data.append([c / o for c, o in zip(s["checked"], s["check_off"])])
        labels.append(f"{r['trainers']} tr.\nchecked / check off")
        data.append(r["reduce_ratio_checked_vs_check_off"])
        labels.append(f"{r['trainers']} tr. reduce\nchecked / check off")
    ax.boxplot(data, labels=labels, whis=(5, 95), showfliers=False)
    ax.tick_params(axis="x", labelsize=7)
    ax.axhspan(0.97, 1.03, color="green", alpha=0.15, label="within 3%")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_ylabel("time ratio, paired (step or reduce alone)")
    ax.set_title(f"--nonfinite check cost: {a.compressor}@{a.density}, n={a.n}, "
                 f"pinned cpu {a.cpu or '-'}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(a.out + ".png", dpi=100)


if __name__ == "__main__":
    main()
