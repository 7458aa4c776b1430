#!/usr/bin/python3
"""Ok-Topk (global selection topk and all) against the all-gather exchange on real daemons (issue 15 item 4).

For each node count of --nodes: one mpirun of that many spexd with --sparse_allreduce=allgather,
then one with --sparse_allreduce=oktopk per --globals value (--oktopk_global=topk: Ok-Topk proper,
about k sums kept; all: every sum kept, the all-gather's result) (otherwise the same flags: --dense_fallback=off
--min_sparse_elements=0, 1 trainer per daemon), each running bench/sparse_exchange_trainer with
--compressors at --densities on one bucket of --elements floats (gradient-like inputs whose large
coordinates are shared by the nodes; see that trainer's header), --warmup + --steps exchanges,
--pair_dense=false. Per (nodes, density, compressor, mode), over the timed steps and nodes:
  - received / k: bytes a node received per exchange (the daemon's ExchangeStats, wire chunks with
    their 48-byte headers) divided by 8 k bytes, k = max(1, floor(density x n)): the (index, fp32
    value) pairs received, in units of k. All-gather: about (P-1) x k. Ok-Topk: the region's share
    of the other nodes' selections plus the other owners' kept entries: with "all" the union of the
    selections minus this node's region, with "topk" about 2k(P-1)/P;
  - the entries kept / k (ExchangeStats' gathered under oktopk: the union with "all", about k with
    "topk");
  - exchange p50 (the slowest node per step) and its ratio oktopk / allgather, both measured in
    this run on this machine (loopback MPI over shared cores: latency, not bandwidth, dominates).
Prints a table and writes <out>.json and <out>.png. Run from the repository root with /usr/bin/python3.
"""
import argparse, json, math, os, statistics, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sparse_exchange_bench as sxb  # noqa: E402  (its Daemons, run_trainers and build)

sxb.TARGETS = {"spexd": "//daemon:spexd", "sparse_exchange_trainer": "//bench:sparse_exchange_trainer"}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", default="2,4")
    p.add_argument("--elements", type=int, default=1 << 20)
    p.add_argument("--densities", default="0.001,0.01")
    p.add_argument("--compressors", default="topk,dgc")
    # A reused threshold keeps more than k until the residuals settle (about 1/density exchanges
    # from a cold start): the default warm-up measures the steady state at d = 0.01.
    p.add_argument("--warmup", type=int, default=120)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--threads", type=int, default=1, help="spexd --threads")
    p.add_argument("--skip_build", action="store_true")
    p.add_argument("--globals", default="topk,all", help="--oktopk_global values to run")
    p.add_argument("--out", default="bench/results/oktopk_daemons")
    args = p.parse_args()
    bins = sxb.build(args.skip_build)
    compressors = args.compressors.split(",")
    results = []
    t0 = time.time()
    for nodes in [int(x) for x in args.nodes.split(",")]:
        by_mode = {}
        modes = [("allgather", ["--sparse_allreduce=allgather"])] + [
            (f"oktopk_{g}", ["--sparse_allreduce=oktopk", f"--oktopk_global={g}"]) for g in args.globals.split(",")]
        for mode, flags in modes:
            rows = sxb.run_trainers(bins, nodes, compressors, args, flags + [f"--threads={args.threads}"],
                                    trainer_flags=("--pair_dense=false",))
            by_mode[mode] = [r for r in rows if not r["warmup"]]
        for d in [float(x) for x in args.densities.split(",")]:
            k = max(1, math.floor(d * args.elements))
            for c in compressors:
                row = {"nodes": nodes, "density": d, "compressor": c, "k": k}
                for mode, rows in by_mode.items():
                    mine = [r for r in rows if r["compressor"] == c and r["density"] == d]
                    steps = sorted({r["step"] for r in mine})
                    slowest = [max(r["exchange_ms"] for r in mine if r["step"] == s) for s in steps]
                    row[mode] = {
                        "received_per_k": statistics.median(r["bytes_received"] for r in mine) / (8 * k),
                        "selected_per_k": statistics.median(r["selected"] for r in mine) / k,
                        "gathered_per_k": statistics.median(r["gathered"] for r in mine) / k,
                        "exchange_p50_ms": statistics.median(slowest),
                        "pattern": mine[0]["pattern"],
                    }
                for mode in by_mode:
                    if mode == "allgather":
                        continue
                    row[mode]["received_ratio"] = row[mode]["received_per_k"] / row["allgather"]["received_per_k"]
                    row[mode]["time_ratio"] = row[mode]["exchange_p50_ms"] / row["allgather"]["exchange_p50_ms"]
                results.append(row)
    print(f"\n{args.elements} floats, 1 trainer per spexd, loopback, {args.steps} timed steps "
          f"(medians over steps and nodes); ratios are oktopk / allgather from this run")
    oks = [m for m in results[0] if m.startswith("oktopk_")]
    print("nodes density compressor | allgather: recv/k p50 ms | " +
          " | ".join(f"{m}: kept/k recv/k p50 ms recv-ratio time-ratio" for m in oks))
    for r in results:
        a = r["allgather"]
        line = (f"{r['nodes']:5d} {r['density']:7g} {r['compressor']:10s} | "
                f"{a['received_per_k']:7.3f} {a['exchange_p50_ms']:7.2f}")
        for m in oks:
            o = r[m]
            line += (f" | {o['gathered_per_k']:7.3f} {o['received_per_k']:7.3f} {o['exchange_p50_ms']:7.2f} "
                     f"{o['received_ratio']:6.3f}x {o['time_ratio']:6.3f}x")
        print(line)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    plot(results, oks, args)
    with open(args.out + ".json", "w") as f:
        json.dump({"elements": args.elements, "steps": args.steps, "warmup": args.warmup, "rows": results}, f,
                  indent=1)
    print(f"wrote {args.out}.json ({time.time() - t0:.0f} s)")


def plot(results, oks, args):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = [f"{r['nodes']}n {r['compressor']}\nd={r['density']:g}" for r in results]
    x = range(len(results))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    modes = ["allgather"] + oks
    w = 0.8 / len(modes)
    color = {m: f"C{j}" for j, m in enumerate(modes)}
    for j, m in enumerate(modes):
        ax1.bar([i + j * w for i in x], [r[m]["received_per_k"] for r in results], w, label=m, color=color[m])
    ax1.set_ylabel("pairs received per node per exchange / k")
    ax1.set_title("volume (median over steps and nodes)")
    for j, m in enumerate(oks):
        ax2.bar([i + (j + 1) * w for i in x], [r[m]["time_ratio"] for r in results], w, label=m, color=color[m])
    ax2.axhline(1.0, color="k", lw=0.8)
    ax2.set_ylabel("exchange p50, oktopk / allgather")
    ax2.set_title("time (loopback MPI, shared 2-core machine)")
    for ax in (ax1, ax2):
        ax.set_xticks([i + 0.4 - w / 2 for i in x])
        ax.set_xticklabels(labels, fontsize=7)
        ax.legend(fontsize=8)
    fig.suptitle(f"Ok-Topk vs all-gather on real spexd, {args.elements} floats, 1 trainer per daemon")
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=110)
    print(f"wrote {args.out}.png")


if __name__ == "__main__":
    sys.exit(main())
