#!/usr/bin/python3
"""Ok-Topk volume benchmark (issue 15; a program, not a test): received elements per node per
exchange / k, the all-gather exchange (pattern B) against the Ok-Topk exchange with global
selection topk, on simulated nodes (bench/oktopk_volume_sim: N threads over the in-process
collective running the real exchange functions, each node with its own residual and the topk
compressor's rule, k = d * elements). Volume only, no times.

The all-gather runs --ag-warmup/--ag-steps exchanges (its volume does not depend on the residual);
Ok-Topk runs --warmup exchanges first (the residuals grow for about 1/d exchanges after a cold
start, and a threshold reused across that growth keeps more than k) and then --steps measured
ones, which include exact selections (every --recompute-every) and reused thresholds.
The crossover per density is the smallest node count at which Ok-Topk's received volume (the
mean over nodes, p50 over exchanges; and separately the busiest node's) is below the all-gather's.

    /usr/bin/python3 bench/oktopk_volume.py [--nodes 2,4,8,16,32,64] [--densities 0.001,0.01]
        [--elements 200000] [--warmup 200] [--steps 64] [--out bench/results/oktopk]

Writes <out>.json and <out>.png. Needs bazel build //bench:oktopk_volume_sim (or --sim).
About 5 minutes with the defaults on 2 shared cores (64 threads for the 64-node configuration).
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(sim, exchanges, args, warmup, steps):
    cmd = [sim, f"--exchanges={exchanges}", f"--nodes={args.nodes}", f"--densities={args.densities}",
           f"--elements={args.elements}", f"--warmup={warmup}", f"--steps={steps}",
           f"--recompute_every={args.recompute_every}", f"--rebalance_every={args.rebalance_every}"]
    print("+", " ".join(cmd), file=sys.stderr)
    proc = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    for r in rows:
        print(json.dumps(r), file=sys.stderr)
    return rows


def crossovers(rows):
    out = []
    for d in sorted({r["density"] for r in rows}):
        ag = {r["nodes"]: r for r in rows if r["density"] == d and r["exchange"] == "allgather"}
        ok = {r["nodes"]: r for r in rows if r["density"] == d and r["exchange"] == "oktopk"}
        nodes = sorted(set(ag) & set(ok))
        entry = {"density": d}
        for key, name in (("received_p50_over_k", "mean_node"),
                          ("received_node_max_p50_over_k", "busiest_node")):
            wins = [n for n in nodes if ok[n][key] < ag[n][key]]
            first = next((n for n in nodes if all(m in wins for m in nodes if m >= n)), None)
            entry[name] = {"first_nodes_where_oktopk_receives_less": first,
                           "measured_nodes": nodes,
                           "ratios_oktopk_over_allgather": {str(n): round(ok[n][key] / ag[n][key], 4)
                                                            for n in nodes}}
        out.append(entry)
    return out


def plot(results, out):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("oktopk_volume: no matplotlib, no plot", file=sys.stderr)
        return
    rows = results["rows"]
    dens = sorted({r["density"] for r in rows})
    fig, axes = plt.subplots(1, len(dens), figsize=(6.2 * len(dens), 4.6), squeeze=False)
    for ax, d in zip(axes[0], dens):
        for ex, color in (("allgather", "C0"), ("oktopk", "C3")):
            rs = sorted((r for r in rows if r["density"] == d and r["exchange"] == ex), key=lambda r: r["nodes"])
            x = [r["nodes"] for r in rs]
            ax.plot(x, [r["received_p50_over_k"] for r in rs], marker="o", color=color,
                    label=f"{ex}: mean over nodes (p50)")
            if ex == "oktopk":
                ax.plot(x, [r["received_node_max_p50_over_k"] for r in rs], marker="^", ls="--", color=color,
                        label="oktopk: busiest node (p50)")
                ax.plot(x, [r["received_node_max_max_over_k"] for r in rs], marker="v", ls=":", color=color,
                        label="oktopk: busiest node (max)")
        ax.axhline(2.0, color="k", lw=0.8, ls="--", label="2k")
        k = next(r["k"] for r in rows if r["density"] == d)
        ax.set(xscale="log", yscale="log", xlabel="nodes (simulated)", ylabel="received elements per node / k",
               title=f"d={d:g}, k={k}, {results['elements']:,} elements")
        ax.set_xticks(sorted({r["nodes"] for r in rows}))
        ax.set_xticklabels([str(n) for n in sorted({r["nodes"] for r in rows})])
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(f"all-gather vs Ok-Topk (global topk, exact every {results['recompute_every']}, "
                 f"regions every {results['rebalance_every']}; {results['steps']} exchanges after "
                 f"{results['warmup']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(out + ".png", dpi=100)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default="2,4,8,16,32,64")
    p.add_argument("--densities", default="0.001,0.01")
    p.add_argument("--elements", type=int, default=200000)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--ag-warmup", type=int, default=2)
    p.add_argument("--ag-steps", type=int, default=8)
    p.add_argument("--recompute-every", type=int, default=32)
    p.add_argument("--rebalance-every", type=int, default=64)
    p.add_argument("--sim", default=os.path.join(ROOT, "bazel-bin", "bench", "oktopk_volume_sim"))
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "oktopk"))
    args = p.parse_args()
    if not os.path.exists(args.sim):
        sys.exit(f"oktopk_volume: no simulator at {args.sim}: bazel build //bench:oktopk_volume_sim "
                 "or pass --sim")
    rows = run(args.sim, "allgather", args, args.ag_warmup, args.ag_steps)
    rows += run(args.sim, "oktopk", args, args.warmup, args.steps)
    results = {"source": "simulator", "elements": args.elements, "warmup": args.warmup, "steps": args.steps,
               "recompute_every": args.recompute_every, "rebalance_every": args.rebalance_every,
               "rows": rows, "crossovers": crossovers(rows)}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(results, f, indent=1)
    plot(results, args.out)
    for c in results["crossovers"]:
        for name in ("mean_node", "busiest_node"):
            e = c[name]
            print(f"d={c['density']:g} {name}: oktopk receives less from {e['first_nodes_where_oktopk_receives_less']} "
                  f"nodes on; oktopk/allgather {e['ratios_oktopk_over_allgather']}")


if __name__ == "__main__":
    main()
