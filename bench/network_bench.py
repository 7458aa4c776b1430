#!/usr/bin/python3
"""Network benchmark (a program, not a test): the exchange of one bucket of --elements floats
(ResNet-50's 25,557,032) on the emulated cluster (deploy/emulated_cluster.sh: one network
namespace per host, tbf rate each way, a core per host where the machine has one), dense against
every sparse compressor of --compressors at every density, per host count and rate.

Inputs are realistic gradients, never a constant: bench/sparse_exchange_trainer's heavy-tailed
per-coordinate scale with fresh normal noise per step and node (like bench/make_grad_trace.py's
traces). One trainer per host, inside the host's namespace; every step's dense bucket is exchanged
just before the compressor's (paired, same load); a step's time is the slowest node's. Ratios are
dense p50 / sparse p50 of the same run. Then, per density, the daemons restart with
--dense_fallback=auto and micro runs --auto-steps steps: what `auto` chose after its probe and its
time against the faster of dense and sparse measured before (goal: within 5%).

Crossover: the rate below which sparse stops winning is found between measured rates when
several are given; besides, from each run's phases (collective = wire, the rest = compute) it is
extrapolated as rate * (dense_wire - sparse_wire) / (sparse_compute - dense_compute), i.e. the wire
time scaled by 1/rate. Where cores are shared (more hosts than cores), the compute phases include
the other hosts' work: the output says so and also gives the 'own cores' estimate: per-node
compute measured on 1 host alone (compressors on a private core) plus the wire time measured on
the emulated link.

    .venv/bin/python bench/network_bench.py [--hosts 2,4] [--rates 1gbit] [--densities 0.001,0.01]
        [--compressors micro,exdyna,topk,dgc,sidco_e,sage] [--steps 3] [--warmup 1] [--out PREFIX]

Writes <out>.json and <out>.png (default bench/results/network.*). Needs the spex package (the
.venv deploy/main_job.sh makes), root (namespaces) and
the built binaries (bazel build -c opt //daemon:spexd //bench:sparse_exchange_trainer, or
--spexd / --trainer). About 3 minutes per (host count, rate) at 1 Gbit/s with the defaults.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))



def rate_bits(r):
    r = r.lower().replace("bit", "")
    mult = {"k": 1e3, "m": 1e6, "g": 1e9}.get(r[-1], 1)
    return float(r[:-1] if r[-1] in "kmg" else r) * mult


def run_trainers(cluster, trainer, args, extra):
    barrier = os.path.join(cluster.dir, "barrier")
    with open(barrier, "wb") as f:
        f.write(b"\0" * 4096)
    procs = []
    for n in range(cluster.nodes):
        cmd = [trainer, f"--socket={cluster.socket(n)}", f"--elements={args.elements}", f"--barrier={barrier}",
               f"--parties={cluster.nodes}", *extra]
        procs.append(cluster.popen(n, cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    rows = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"trainer failed ({p.returncode}): {err[-2000:]}")
        rows += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return rows


def steps_of(rows, what, paired=None, warm=False):
    """{step: [node rows]} of one configuration."""
    by = {}
    for r in rows:
        if r["compressor"] != what or (paired is not None and r["paired_with"] != paired):
            continue
        if r["warmup"] and not warm:
            continue
        by.setdefault((r["density"], r["step"]), []).append(r)
    return by


def summarize(rows, compressors, densities):
    out = []
    for c in compressors:
        for d in densities:
            sp = {k: v for k, v in steps_of(rows, c).items() if k[0] == d}
            de = {k: v for k, v in steps_of(rows, "dense", paired=c).items() if k[0] == d}
            if not sp or not de:
                continue
            t_sp = statistics.median(max(x["exchange_ms"] for x in v) for v in sp.values())
            t_de = statistics.median(max(x["exchange_ms"] for x in v) for v in de.values())
            med = lambda by, f: statistics.median(statistics.median(x[f] for x in v) for v in by.values())  # noqa
            comp = lambda by: sum(med(by, f) for f in ("reduce_local_ms", "compress_ms", "decode_ms", "publish_ms"))  # noqa
            out.append({"compressor": c, "density": d, "sparse_ms": t_sp, "dense_ms": t_de, "speedup": t_de / t_sp,
                        "sparse_wire_ms": med(sp, "collective_ms"), "dense_wire_ms": med(de, "collective_ms"),
                        "sparse_compute_ms": comp(sp), "dense_compute_ms": comp(de),
                        "compress_ms": med(sp, "compress_ms"),
                        "achieved_density": statistics.mean(x["achieved_density"] for v in sp.values() for x in v),
                        "pattern": sorted({x["pattern"] for v in sp.values() for x in v})})
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", default="2,4")
    p.add_argument("--rates", default="1gbit", help="comma-separated tc rates, e.g. 100mbit,1gbit,10gbit")
    p.add_argument("--elements", type=int, default=25557032)
    p.add_argument("--densities", default="0.001,0.01")
    p.add_argument("--compressors", default="micro,exdyna,topk,dgc,sidco_e,sage")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--auto-steps", type=int, default=10, help="steps of the --dense_fallback=auto run (probe: 6)")
    p.add_argument("--spexd", default=os.path.join(ROOT, "bazel-bin", "daemon", "spexd"))
    p.add_argument("--trainer", default=os.path.join(ROOT, "bazel-bin", "bench", "sparse_exchange_trainer"))
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "network"))
    args = p.parse_args()
    from spex.emulated import EmulatedCluster

    why = EmulatedCluster.unavailable()
    if why:
        sys.exit(f"network_bench: cannot emulate hosts here: {why}")
    compressors = args.compressors.split(",")
    densities = [float(x) for x in args.densities.split(",")]
    ncpu = os.cpu_count() or 1
    base = ["--threads=1", "--min_sparse_elements=0", "--log_level=warning"]
    results = {"elements": args.elements, "cores": ncpu, "configs": []}
    for hosts in [int(h) for h in args.hosts.split(",")]:
        for rate in args.rates.split(","):
            cfg = {"hosts": hosts, "rate": rate, "shared_cores": hosts > ncpu}
            t0 = time.time()
            c = EmulatedCluster(args.spexd, hosts=hosts, trainers=1, rate=rate, args=base + ["--dense_fallback=off"])
            try:
                c.start()
                print(f"== {c.description}", flush=True)
                rows = run_trainers(c, args.trainer, args, [f"--compressors={','.join(compressors)}",
                                                            f"--densities={args.densities}", f"--warmup={args.warmup}",
                                                            f"--steps={args.steps}", "--pair_dense=true"])
                cfg["runs"] = summarize(rows, compressors, densities)
                for r in cfg["runs"]:
                    print(f"  {r['compressor']:>8}@{r['density']:<6g} sparse {r['sparse_ms']:8.1f} ms  dense "
                          f"{r['dense_ms']:8.1f} ms  x{r['speedup']:6.2f}  (compress {r['compress_ms']:.1f} ms, "
                          f"wire {r['sparse_wire_ms']:.1f} vs {r['dense_wire_ms']:.1f} ms)", flush=True)
                # --dense_fallback=auto on micro.
                c.stop()
                c.args = base + ["--dense_fallback=auto", "--probe_steps=3"]
                c.start()
                auto = []
                rows = run_trainers(c, args.trainer, args, ["--compressors=micro", f"--densities={args.densities}",
                                                            "--warmup=6", f"--steps={args.auto_steps - 6}",
                                                            "--pair_dense=false"])
                for d in densities:
                    by = {k: v for k, v in steps_of(rows, "micro").items() if k[0] == d}
                    t = statistics.median(max(x["exchange_ms"] for x in v) for v in by.values())
                    chose = sorted({x["pattern"] for v in by.values() for x in v})
                    ref = next((r for r in cfg["runs"] if r["compressor"] == "micro" and r["density"] == d), None)
                    best = min(ref["sparse_ms"], ref["dense_ms"]) if ref else float("nan")
                    auto.append({"density": d, "auto_ms": t, "chose": chose, "best_ms": best,
                                 "vs_best": t / best if best == best else None})
                    print(f"  auto micro@{d:g}: chose {'/'.join(chose)} ({'sparse' if 'D' not in chose else 'dense'}), "
                          f"{t:.1f} ms = {t / best:.2f}x the faster of dense and sparse", flush=True)
                cfg["auto"] = auto
            finally:
                c.cleanup()
            cfg["seconds"] = time.time() - t0
            results["configs"].append(cfg)
    # Crossover rates and the 'own cores' estimate.
    alone = {}
    for cfg in results["configs"]:
        if not cfg["shared_cores"]:
            for r in cfg["runs"]:
                alone.setdefault((r["compressor"], r["density"]), (r["sparse_compute_ms"], r["dense_compute_ms"]))
    for cfg in results["configs"]:
        bits = rate_bits(cfg["rate"])
        for r in cfg["runs"]:
            dc = r["sparse_compute_ms"] - r["dense_compute_ms"]
            dw = r["dense_wire_ms"] - r["sparse_wire_ms"]
            r["crossover_rate_bits"] = bits * dw / dc if dc > 0 and dw > 0 else None
            if cfg["shared_cores"] and (r["compressor"], r["density"]) in alone:
                sc, dcmp = alone[(r["compressor"], r["density"])]
                r["own_cores_speedup_estimate"] = (dcmp + r["dense_wire_ms"]) / (sc + r["sparse_wire_ms"])
    rates = sorted({cfg["rate"] for cfg in results["configs"]}, key=rate_bits)
    for hosts in sorted({cfg["hosts"] for cfg in results["configs"]}):
        cf = [c for c in results["configs"] if c["hosts"] == hosts]
        for comp in compressors:
            for d in densities:
                sp = [(rate_bits(c["rate"]), next((r["speedup"] for r in c["runs"] if r["compressor"] == comp
                                                   and r["density"] == d), None)) for c in cf]
                sp = sorted((b, s) for b, s in sp if s is not None)
                for (b1, s1), (b2, s2) in zip(sp, sp[1:]):
                    if (s1 - 1) * (s2 - 1) < 0:
                        results.setdefault("measured_crossovers", []).append(
                            {"hosts": hosts, "compressor": comp, "density": d, "between_bits": [b1, b2]})
    print("\nsummary (speed-up = dense p50 / sparse p50 in the same run; crossover = rate below which sparse "
          "stops winning, extrapolated from the wire and compute phases)")
    for cfg in results["configs"]:
        note = (f" -- {cfg['hosts']} hosts share {ncpu} cores: compute phases include the other hosts' work"
                if cfg["shared_cores"] else "")
        print(f"{cfg['hosts']} hosts @ {cfg['rate']}{note}")
        for r in cfg["runs"]:
            x = r["crossover_rate_bits"]
            xs = f"{x / 1e9:.2f} Gbit/s" if x else "sparse wins at any rate (or never)"
            own = (f", own cores (estimate) x{r['own_cores_speedup_estimate']:.2f}"
                   if r.get("own_cores_speedup_estimate") else "")
            print(f"  {r['compressor']:>8}@{r['density']:<6g} x{r['speedup']:6.2f}, crossover {xs}{own}")
        for a in cfg.get("auto", []):
            print(f"  auto micro@{a['density']:g}: {a['auto_ms']:.1f} ms, {a['vs_best']:.2f}x the faster one "
                  f"({'OK' if a['vs_best'] and a['vs_best'] <= 1.05 else 'over the 5% goal'})")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(results, f, indent=1)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("network_bench: no matplotlib, no plot")
        return 0
    cfgs = results["configs"]
    fig, axes = plt.subplots(1, len(cfgs), figsize=(5.5 * len(cfgs), 4.5), squeeze=False)
    for ax, cfg in zip(axes[0], cfgs):
        labels = [f"{r['compressor']}\n{r['density']:g}" for r in cfg["runs"]]
        ax.bar(range(len(labels)), [r["speedup"] for r in cfg["runs"]], color="tab:blue")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_yscale("log")
        ax.set_title(f"{cfg['hosts']} hosts @ {cfg['rate']}" + (" (shared cores)" if cfg["shared_cores"] else ""),
                     fontsize=9)
        ax.set_ylabel("dense time / sparse time")
    fig.suptitle(f"exchange of {args.elements:,} floats on the emulated cluster ({ncpu} cores)", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=100)
    print(f"wrote {args.out}.json and {args.out}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
