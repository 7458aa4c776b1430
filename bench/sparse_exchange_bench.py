#!/usr/bin/python3
"""Sparse exchange benchmark (issue 4 item 8): every compressor against dense, same daemons, same run.

Part 1. --nodes local spexd daemons under ONE mpirun (1 trainer per daemon, to fit the machine's
memory and cores), flags --dense_fallback=off --min_sparse_elements=0 (no dense probe). For each
density, bench/sparse_exchange_trainer runs on every node: for every registered compressor in
turn it opens a fresh session and registers two buckets of --elements floats (ResNet-50's
25,557,032): a dense one and the compressor's, and does --warmup + --steps steps, each exchanging
the dense bucket and then the compressor's, with gradient-like inputs (heavy-tailed
per-coordinate scale that persists between steps, fresh normal noise per step and node; see the
trainer's header). So dense is timed interleaved with every compressor, under the same load.
All trainers start each exchange from a shared barrier; a step's time is the slowest node's
Exchange (ring to published), and the p50 over the timed steps is reported with the ratio
paired dense p50 / compressor p50 (>1: faster than dense). From each step's ExchangeStats: phases
(reduce_local, compress, collective, decode; mean over nodes of the per-node median), achieved
density (this node's selection / n, mean over nodes and steps), gathered elements (A: union,
B: sum of counts) and bytes sent/received per node (medians). A plain MPI_Allreduce of the same
buffer on the same number of ranks is timed too (bench/mpi_allreduce_baseline), for reference.

Part 2. Gathered elements per step against k = density * n as nodes grow: real daemons at
--nodes (from part 1) and at --real_nodes2 (a second mpirun with micro, exdyna, topk only), and
the simulator kernels/reference_cluster.h (bench/gathered_volume_sim: the real compressors and
controllers on N nodes in one process) at --sim_nodes on --sim_elements floats. The source of
every figure is printed beside it.

Prints tables and writes <out>.json and <out>.csv (default bench/results/sparse_exchange.*).
Run from the repository root with /usr/bin/python3 (it builds the binaries with bazel and copies
them aside, so concurrent rebuilds do not change what runs). It is a benchmark, not a test:
about 15-25 minutes with the defaults on a loaded 2-core machine.
"""
import argparse, csv, json, os, shutil, signal, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_btl_tcp_if_include="lo",
           OMPI_MCA_oob_tcp_if_include="lo")
TARGETS = {"spexd": "//daemon:spexd", "sparse_exchange_trainer": "//bench:sparse_exchange_trainer",
           "gathered_volume_sim": "//bench:gathered_volume_sim",
           "mpi_allreduce_baseline": "//bench:mpi_allreduce_baseline"}
PHASES = ("reduce_local", "compress", "collective", "decode")


def build(skip):
    if not skip:
        subprocess.run(["bazel", "build", *TARGETS.values()], cwd=ROOT, check=True)
    bin_dir = subprocess.run(["bazel", "info", "bazel-bin"], cwd=ROOT, check=True, capture_output=True,
                             text=True).stdout.strip()
    tmp = tempfile.mkdtemp(prefix="spex-sxb-bin.")
    out = {}
    for name, label in TARGETS.items():
        src = os.path.join(bin_dir, label[2:].replace(":", "/"))
        out[name] = shutil.copy2(src, os.path.join(tmp, name))
    return out


def median(v):
    return statistics.median(v) if v else float("nan")


class Daemons:
    def __init__(self, spexd, nodes, extra):
        self.dir = tempfile.mkdtemp(prefix="spex-sxb.")
        self.nodes = nodes
        self.log = open(os.path.join(self.dir, "spexd.log"), "w")
        self.proc = subprocess.Popen(["mpirun", "-np", str(nodes), spexd, f"--socket={self.dir}/node{{rank}}.sock",
                                      "--local_trainers=1", "--log_level=warning", "--dense_fallback=off",
                                      "--min_sparse_elements=0", *extra],
                                     env=ENV, stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(600):
            if all(os.path.exists(self.sock(n)) for n in range(nodes)):
                return
            if self.proc.poll() is not None:
                raise RuntimeError(open(self.log.name).read())
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("daemons did not start")

    def sock(self, n):
        return f"{self.dir}/node{n}.sock"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def run_trainers(bins, nodes, compressors, args, extra_daemon_flags, trainer_flags=()):
    """One mpirun of `nodes` daemons; every density runs the `compressors` list in order."""
    d = Daemons(bins["spexd"], nodes, extra_daemon_flags)
    try:
        barrier = os.path.join(d.dir, "barrier")
        with open(barrier, "wb") as f:
            f.write(b"\0" * 64)
        procs = []
        for n in range(nodes):
            cmd = [bins["sparse_exchange_trainer"], f"--socket={d.sock(n)}", f"--elements={args.elements}",
                   f"--densities={args.densities}", f"--compressors={','.join(compressors)}",
                   f"--warmup={args.warmup}", f"--steps={args.steps}", f"--barrier={barrier}", f"--parties={nodes}",
                   *trainer_flags]
            procs.append(subprocess.Popen(cmd, env=ENV, stdout=open(f"{d.dir}/t{n}.jsonl", "w"),
                                          stderr=subprocess.PIPE, text=True))
        errs = [p.communicate()[1] for p in procs]
        if any(p.returncode for p in procs):
            raise RuntimeError("trainer failed:\n" + "\n".join(errs) + open(d.log.name).read())
        for e in errs:
            if e.strip():
                print(e.strip(), file=sys.stderr)
        rows = []
        for n in range(nodes):
            with open(f"{d.dir}/t{n}.jsonl") as f:
                rows += [json.loads(line) for line in f if line.strip()]
        return rows
    finally:
        d.stop()


def summarize(rows, nodes):
    """Per (density, compressor): p50 of the per-step slowest node's exchange, and stats medians."""
    out = {}
    keys = sorted({(r["density"], r["compressor"], r["paired_with"]) for r in rows})
    keys += sorted({(d, "dense", "*") for d, c, _ in keys if c == "dense"})
    for key in keys:
        rs = [r for r in rows if (r["density"], r["compressor"]) == key[:2] and key[2] in ("*", r["paired_with"])
              and not r["warmup"]]
        by_step = {}
        for r in rs:
            by_step.setdefault((r["paired_with"], r["step"]), []).append(r)
        slowest = [max(x["exchange_ms"] for x in v) for v in by_step.values() if len(v) == nodes]
        per_node = {}
        for r in rs:
            per_node.setdefault(r["node"], []).append(r)
        s = {"density": key[0], "compressor": key[1], "paired_with": key[2], "nodes": nodes, "timed_steps": len(slowest),
             "pattern": rs[0]["pattern"], "p50_ms": median(slowest),
             "min_ms": min(slowest), "max_ms": max(slowest),
             "daemon_total_p50_ms": median([r["daemon_total_ms"] for r in rs]),
             "achieved_density": statistics.mean(r["achieved_density"] for r in rs),
             "selected_per_node": median([r["selected"] for r in rs]),
             "gathered": median([r["gathered"] for r in rs]),
             "bytes_sent": median([r["bytes_sent"] for r in rs]),
             "bytes_received": median([r["bytes_received"] for r in rs]),
             "fell_back_to_dense": any(r["fell_back_to_dense"] for r in rs)}
        for ph in PHASES:
            s[f"{ph}_ms"] = statistics.mean(median([r[f"{ph}_ms"] for r in v]) for v in per_node.values())
        out[key] = s
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=25557032)
    ap.add_argument("--densities", default="0.001,0.01")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--compressors", default="", help="comma-separated (default: every registered one)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="spexd --threads (worker threads per daemon)")
    ap.add_argument("--real_nodes2", type=int, default=2, help="node count of the extra real-daemon gathered-volume "
                    "run with micro, exdyna, topk (0: skip)")
    ap.add_argument("--sim_nodes", default="2,4,8")
    ap.add_argument("--sim_elements", type=int, default=3194629, help="simulator bucket (default n/8 of ResNet-50)")
    ap.add_argument("--skip_build", action="store_true")
    ap.add_argument("--spexd", default="", help="run this spexd binary instead of the one built (A/B comparisons)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "sparse_exchange"))
    args = ap.parse_args()
    bins = build(args.skip_build)
    if args.spexd:
        bins["spexd"] = shutil.copy2(args.spexd, os.path.join(os.path.dirname(bins["spexd"]), "spexd.given"))
    names = [c for c in (args.compressors.split(",") if args.compressors else
                         subprocess.run([bins["sparse_exchange_trainer"], "--list_compressors"], check=True,
                                        capture_output=True, text=True).stdout.split()) if c and c != "dense"]
    load0 = os.getloadavg()
    t0 = time.time()
    base = json.loads(subprocess.run(["mpirun", "-np", str(args.nodes), bins["mpi_allreduce_baseline"],
                                      str(args.elements), "10"], env=ENV, check=True, capture_output=True,
                                     text=True).stdout.strip().splitlines()[-1])
    daemon_flags = [f"--threads={args.threads}"]
    rows = (run_trainers(bins, args.nodes, names, args, daemon_flags))
    summary = summarize(rows, args.nodes)
    base2 = json.loads(subprocess.run(["mpirun", "-np", str(args.nodes), bins["mpi_allreduce_baseline"],
                                       str(args.elements), "10"], env=ENV, check=True, capture_output=True,
                                      text=True).stdout.strip().splitlines()[-1])
    allreduce_ms = median([base["allreduce_p50_ms"], base2["allreduce_p50_ms"]])
    load1 = os.getloadavg()
    table = []
    print(f"\nPart 1: {args.elements} floats, {args.nodes} spexd under one mpirun, 1 trainer each, "
          f"--threads={args.threads} --dense_fallback=off --min_sparse_elements=0; {args.warmup} warm-up + "
          f"{args.steps} timed steps per compressor; p50 of the slowest node's exchange per step.")
    print(f"Load average before {load0[0]:.2f}, after {load1[0]:.2f} (2-core machine shared with other builds). "
          f"MPI_Allreduce of the same buffer, {args.nodes} ranks: p50 {base['allreduce_p50_ms']:.1f} ms before, "
          f"{base2['allreduce_p50_ms']:.1f} ms after.")
    for dens in [float(x) for x in args.densities.split(",")]:
        pooled = summary[(dens, "dense", "*")]
        print(f"\ndensity {dens:g}: dense p50 over all pairs {pooled['p50_ms']:.1f} ms = "
              f"{pooled['p50_ms'] / allreduce_ms:.2f}x MPI_Allreduce ({allreduce_ms:.1f} ms); 'vs dense' = p50 of the "
              f"dense bucket exchanged beside each compressor in the same steps / the compressor's p50")
        print(f"{'compressor':13s} {'pat':3s} {'p50 ms':>8s} {'dense ms':>8s} {'vs dense':>8s} {'density':>9s} "
              f"{'gathered':>10s} {'G/k':>6s} {'sent B':>10s} {'recv B':>10s} | {'reduce':>6s} {'compr':>6s} "
              f"{'coll':>6s} {'decode':>6s} ms")
        pooled["dense_p50_ms"] = pooled["p50_ms"]
        pooled["speedup_vs_dense"] = 1.0
        pooled["mpi_allreduce_p50_ms"] = allreduce_ms
        table.append(pooled)
        k = max(1, int(dens * args.elements))
        for name in ["dense", *names]:
            s = pooled if name == "dense" else summary[(dens, name, name)]
            if name != "dense":
                s["dense_p50_ms"] = summary[(dens, "dense", name)]["p50_ms"] if (dens, "dense", name) in summary \
                    else pooled["p50_ms"]
                s["speedup_vs_dense"] = s["dense_p50_ms"] / s["p50_ms"]
                s["mpi_allreduce_p50_ms"] = allreduce_ms
                table.append(s)
            s["gathered_over_k"] = s["gathered"] / k
            print(f"{name:13s} {s['pattern']:3s} {s['p50_ms']:8.1f} {s['dense_p50_ms']:8.1f} "
                  f"{s['speedup_vs_dense']:7.2f}x {s['achieved_density']:9.5f} {s['gathered']:10.0f} "
                  f"{s['gathered_over_k']:6.2f} {s['bytes_sent']:10.0f} {s['bytes_received']:10.0f} | " +
                  " ".join(f"{s[f'{ph}_ms']:6.1f}" for ph in PHASES))
    # Part 2
    volume = []
    trio = [c for c in ("micro", "exdyna", "topk") if c in names]
    for s in table:
        if s["compressor"] in trio and s["paired_with"] == s["compressor"]:
            k = max(1, int(s["density"] * args.elements))
            volume.append({"source": "daemons", "nodes": args.nodes, "elements": args.elements,
                           "density": s["density"], "compressor": s["compressor"], "k": k,
                           "gathered_p50": s["gathered"], "gathered_over_k": s["gathered"] / k})
    if args.real_nodes2 and trio:
        rows2 = (run_trainers(bins, args.real_nodes2, trio, args, daemon_flags, ["--pair_dense=false"]))
        for (dens, name, paired), s in sorted(summarize(rows2, args.real_nodes2).items()):
            if name != paired:
                continue
            k = max(1, int(dens * args.elements))
            volume.append({"source": "daemons", "nodes": args.real_nodes2, "elements": args.elements,
                           "density": dens, "compressor": name, "k": k, "gathered_p50": s["gathered"],
                           "gathered_over_k": s["gathered"] / k, "p50_ms": s["p50_ms"]})
    if args.sim_nodes and trio:
        out = subprocess.run([bins["gathered_volume_sim"], f"--elements={args.sim_elements}",
                              f"--nodes={args.sim_nodes}", f"--densities={args.densities}",
                              f"--compressors={','.join(trio)}"], check=True, capture_output=True, text=True).stdout
        volume += [json.loads(line) for line in out.splitlines() if line.strip()]
    print("\nPart 2: gathered elements per step / k (k = density x n); A: size of the index union, "
          "B: sum of the nodes' counts")
    print(f"{'source':9s} {'n':>9s} {'density':>7s} {'nodes':>5s} " +
          " ".join(f"{c + ' G/k':>12s}" for c in trio))
    groups = sorted({(v["source"], v["elements"], v["density"], v["nodes"]) for v in volume})
    for g in groups:
        cells = {v["compressor"]: v for v in volume if (v["source"], v["elements"], v["density"], v["nodes"]) == g}
        print(f"{g[0]:9s} {g[1]:9d} {g[2]:7g} {g[3]:5d} " +
              " ".join(f"{cells[c]['gathered_over_k']:12.3f}" if c in cells else f"{'-':>12s}" for c in trio))
    # Goals
    goals = []
    for s in table:
        if s["compressor"] == "micro":
            goals.append(f"micro >= 3x faster than dense at density {s['density']:g}: {s['speedup_vs_dense']:.2f}x "
                         f"-> {'met' if s['speedup_vs_dense'] >= 3 else 'MISSED'}")
    top_nodes = max((v["nodes"] for v in volume), default=0)
    for v in volume:
        if v["nodes"] == top_nodes and v["compressor"] in ("micro", "exdyna"):
            goals.append(f"{v['compressor']} gathered <= 1.2k at {top_nodes} nodes ({v['source']}, n={v['elements']}, "
                         f"d={v['density']:g}): {v['gathered_over_k']:.3f}k -> "
                         f"{'met' if v['gathered_over_k'] <= 1.2 else 'MISSED'}")
    print("\nGoals:")
    for g in goals:
        print("  " + g)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    meta = {"elements": args.elements, "nodes": args.nodes, "trainers_per_node": 1, "threads": args.threads,
            "warmup": args.warmup, "steps": args.steps, "load_before": load0, "load_after": load1,
            "mpi_allreduce_p50_ms": [base["allreduce_p50_ms"], base2["allreduce_p50_ms"]],
            "wall_s": time.time() - t0, "daemon_flags": ["--dense_fallback=off", "--min_sparse_elements=0",
                                                           *daemon_flags]}
    with open(args.out + ".json", "w") as f:
        json.dump({"meta": meta, "exchange": table, "gathered_volume": volume, "goals": goals}, f, indent=1)
    keys = sorted({k for r in table + volume for k in r})
    with open(args.out + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["table", *keys])
        w.writeheader()
        w.writerows([{"table": "exchange", **r} for r in table] + [{"table": "gathered_volume", **r} for r in volume])
    print(f"wrote {args.out}.json and .csv ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
