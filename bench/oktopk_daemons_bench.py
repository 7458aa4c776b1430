#!/usr/bin/python3
"""Ok-Topk (global selection all) against the all-gather exchange on real daemons (issue 15 item 4, in part).

For each node count of --nodes: one mpirun of that many spexd with --sparse_allreduce=allgather,
then one with --sparse_allreduce=oktopk (otherwise the same flags: --dense_fallback=off
--min_sparse_elements=0, 1 trainer per daemon), each running bench/sparse_exchange_trainer with
--compressors at --densities on one bucket of --elements floats (gradient-like inputs whose large
coordinates are shared by the nodes; see that trainer's header), --warmup + --steps exchanges,
--pair_dense=false. Per (nodes, density, compressor, mode), over the timed steps and nodes:
  - received / k: bytes a node received per exchange (the daemon's ExchangeStats, wire chunks with
    their 48-byte headers) divided by 8 k bytes, k = max(1, floor(density x n)): the (index, fp32
    value) pairs received, in units of k. All-gather: about (P-1) x k. Ok-Topk with the global
    selection "all" (what spexd runs): the region's share of the other nodes' selections plus the
    other owners' reduced entries, i.e. the union of the selections minus this node's region;
  - the union of the selections / k (the reduced entries written, ExchangeStats' gathered under
    oktopk);
  - exchange p50 (the slowest node per step) and its ratio oktopk / allgather, both measured in
    this run on this machine (loopback MPI over shared cores: latency, not bandwidth, dominates).
Prints a table and writes <out>.json. Run from the repository root with /usr/bin/python3.
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
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=1, help="spexd --threads")
    p.add_argument("--skip_build", action="store_true")
    p.add_argument("--out", default="bench/results/oktopk_daemons")
    args = p.parse_args()
    bins = sxb.build(args.skip_build)
    compressors = args.compressors.split(",")
    results = []
    t0 = time.time()
    for nodes in [int(x) for x in args.nodes.split(",")]:
        by_mode = {}
        for mode in ("allgather", "oktopk"):
            rows = sxb.run_trainers(bins, nodes, compressors, args,
                                    [f"--sparse_allreduce={mode}", f"--threads={args.threads}"],
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
                row["received_ratio"] = row["oktopk"]["received_per_k"] / row["allgather"]["received_per_k"]
                row["time_ratio"] = row["oktopk"]["exchange_p50_ms"] / row["allgather"]["exchange_p50_ms"]
                results.append(row)
    print(f"\n{args.elements} floats, 1 trainer per spexd, loopback, {args.steps} timed steps "
          f"(medians over steps and nodes)")
    print("nodes density compressor | selected/k | allgather: recv/k p50 ms | oktopk: union/k recv/k p50 ms "
          "| recv ratio | time ratio")
    for r in results:
        a, o = r["allgather"], r["oktopk"]
        print(f"{r['nodes']:5d} {r['density']:7g} {r['compressor']:10s} | {a['selected_per_k']:10.3f} | "
              f"{a['received_per_k']:10.3f} {a['exchange_p50_ms']:7.2f} | {o['gathered_per_k']:7.3f} "
              f"{o['received_per_k']:7.3f} {o['exchange_p50_ms']:7.2f} | {r['received_ratio']:10.3f} | "
              f"{r['time_ratio']:10.3f}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump({"elements": args.elements, "steps": args.steps, "warmup": args.warmup, "rows": results}, f,
                  indent=1)
    print(f"wrote {args.out}.json ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
