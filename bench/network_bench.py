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
--dense_fallback=auto (--probe_steps=--auto-probe-steps) and micro runs, paired with dense as
before, and beside a forced-sparse twin bucket (registered with dense_fallback=off), in two
sessions (the twin after auto's bucket, then before it, since the bucket right after the dense
exchange is the slower one): what `auto` chose after its probe, and its time over --auto-steps
steps of both sessions against the faster of the forced-sparse twin and the dense bucket in those
same steps (the goal: within 5%), against the faster of dense
and sparse as its own probe measured them (steps 2.. of the probe), and against the first
session's (sessions differ by 10-30% here). --auto-only runs only this session.

Crossover: the rate below which sparse stops winning is found between measured rates when
several are given; besides, from each run's phases (collective = wire, the rest = compute) it is
extrapolated as rate * (dense_wire - sparse_wire) / (sparse_compute - dense_compute), i.e. the wire
time scaled by 1/rate. Where cores are shared (more hosts than cores), the compute phases include
the other hosts' work: the output says so and also gives the 'own cores' estimate: per-node
compute measured in a configuration where every host had a core of its own (the 2-host runs on
2 cores; for micro and exdyna, whose nodes select from a 1/N share of the bucket, that
over-states a larger cluster's compute) plus the wire time measured on the emulated link. The
extrapolated crossover assumes the wire is the limit; where the emulated link is CPU-bound (10
Gbit/s on 2 cores) it is not.

    .venv/bin/python bench/network_bench.py [--hosts 2,4] [--rates 1gbit] [--densities 0.001,0.01]
        [--compressors micro,exdyna,topk,dgc,sidco_e,sage] [--steps 3] [--warmup 1] [--out PREFIX]
    .venv/bin/python bench/network_bench.py --merge A.json,B.json,... --out PREFIX   # pieces into one

Writes <out>.json and <out>.png (default bench/results/network.*). Needs the spex package (the
.venv deploy/main_job.sh makes), root (namespaces) and
the built binaries (bazel build -c opt //daemon:spexd //bench:sparse_exchange_trainer, or
--spexd / --trainer). About 2-3 minutes per (host count, rate) at 1 and 10 Gbit/s with the defaults,
8-11 minutes at 100 Mbit/s (dense takes 9-14 s per exchange there).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
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
    # Each trainer writes into its own files, not a pipe: the trainers wait for each other at
    # every step, so one blocked on a full pipe that nobody reads yet would stall them all.
    procs, files = [], []
    for n in range(cluster.nodes):
        cmd = [trainer, f"--socket={cluster.socket(n)}", f"--elements={args.elements}", f"--barrier={barrier}",
               f"--parties={cluster.nodes}", *extra]
        out = tempfile.TemporaryFile(mode="w+")
        err = tempfile.TemporaryFile(mode="w+")
        files.append((out, err))
        procs.append(cluster.popen(n, cmd, stdout=out, stderr=err, text=True))
    rows = []
    for p, (out, err) in zip(procs, files):
        p.wait()
        out.seek(0)
        err.seek(0)
        if p.returncode != 0:
            raise RuntimeError(f"trainer failed ({p.returncode}): {err.read()[-2000:]}")
        rows += [json.loads(line) for line in out.read().splitlines() if line.startswith("{")]
        out.close()
        err.close()
    return rows


def steps_of(rows, what, paired=None, warm=False):
    """{(density, step, session): [node rows]} of one configuration."""
    by = {}
    for r in rows:
        if r["compressor"] != what or (paired is not None and r["paired_with"] != paired):
            continue
        if r["warmup"] and not warm:
            continue
        by.setdefault((r["density"], r["step"], r.get("session", "")), []).append(r)
    return by


PHASES = ("reduce_local_ms", "compress_ms", "collective_ms", "decode_ms", "publish_ms")


def phases(by):
    """Median over steps of the node-median phase times; `other` is the daemon's time outside
    the named phases, `trainer_side` the trainer's exchange time beyond the daemon's total."""
    med = lambda f: statistics.median(statistics.median(x[f] for x in v) for v in by.values())  # noqa: E731
    out = {f: med(f) for f in PHASES}
    total, exch = med("daemon_total_ms"), med("exchange_ms")
    out["other_ms"] = total - sum(out[f] for f in PHASES)
    out["trainer_side_ms"] = exch - total
    return out


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
                        # Where a step's time goes (node medians of the median step): the daemon's
                        # phases, the rest of its time (control round: the commit vote), and the
                        # trainer's side (doorbell to result minus the daemon's total).
                        "sparse_phases_ms": phases(sp), "dense_phases_ms": phases(de),
                        "sparse_bytes_sent": med(sp, "bytes_sent"), "dense_bytes_sent": med(de, "bytes_sent"),
                        "achieved_density": statistics.mean(x["achieved_density"] for v in sp.values() for x in v),
                        "pattern": sorted({x["pattern"] for v in sp.values() for x in v})})
    return out


def measure(args, compressors, densities, ncpu):
    """Runs every (host count, rate) of args; returns results["configs"]."""
    from spex.emulated import EmulatedCluster

    base = ["--threads=1", "--min_sparse_elements=0", "--log_level=warning"]
    configs = []
    for hosts in [int(h) for h in args.hosts.split(",")]:
        for rate in args.rates.split(","):
            cfg = {"hosts": hosts, "rate": rate, "shared_cores": hosts > ncpu, "steps": args.steps,
                   "warmup": args.warmup}
            t0 = time.time()
            c = EmulatedCluster(args.spexd, hosts=hosts, trainers=1, rate=rate, args=base + ["--dense_fallback=off"])
            try:
                if args.auto_only:
                    cfg["runs"] = []
                    cfg["auto"] = measure_auto(args, c, densities, [])
                    continue
                c.start()
                print(f"== {c.description}", flush=True)
                rows = run_trainers(c, args.trainer, args, [f"--compressors={','.join(compressors)}",
                                                            f"--densities={args.densities}", f"--warmup={args.warmup}",
                                                            f"--steps={args.steps}", "--pair_dense=true"])
                cfg["runs"] = summarize(rows, compressors, densities)
                for r in cfg["runs"]:
                    ph = r["sparse_phases_ms"]
                    print(f"  {r['compressor']:>8}@{r['density']:<6g} sparse {r['sparse_ms']:8.1f} ms  dense "
                          f"{r['dense_ms']:8.1f} ms  x{r['speedup']:6.2f}  (compress {r['compress_ms']:.1f} ms, "
                          f"wire {r['sparse_wire_ms']:.1f} vs {r['dense_wire_ms']:.1f} ms, other "
                          f"{ph['other_ms']:.1f}, trainer side {ph['trainer_side_ms']:.1f})", flush=True)
                # --dense_fallback=auto on micro.
                c.stop()
                cfg["auto"] = measure_auto(args, c, densities, cfg["runs"])
            finally:
                c.cleanup()
                cfg["seconds"] = time.time() - t0
                configs.append(cfg)
    return configs


def measure_auto(args, c, densities, runs):
    """--dense_fallback=auto on micro, on the stopped cluster `c`: restarts its daemons with
    --probe_steps=args.auto_probe_steps and runs micro paired with dense, as the first session.
    The probe alternates dense and sparse exchanges of the micro bucket, so the session itself
    measures both (steps 2.. of the probe; the first two are cold) before auto settles; auto's time
    after the probe is compared with the faster of those (`vs_best_session`), with the faster of a
    forced-sparse twin bucket (dense_fallback=off) and the paired dense bucket in the same steps
    (`vs_best_same_steps`, the goal's measure) and with the first session's sparse and dense times
    (`vs_best`)."""
    probe = args.auto_probe_steps
    c.args = [a for a in c.args if not a.startswith("--dense_fallback")] + [
        "--dense_fallback=auto", f"--probe_steps={probe}"]
    c.start()
    print(f"== {c.description} (--dense_fallback=auto --probe_steps={probe})", flush=True)
    settle = 2 * probe + 1  # the probe's steps and the first one after the decision
    # Two sessions, ABBA-style: the bucket right after the dense exchange runs on colder caches,
    # so auto's bucket comes first in one and the forced-sparse twin in the other; steps pooled.
    rows = []
    for forced_first in ("false", "true"):
        rows += run_trainers(c, args.trainer, args, ["--compressors=micro", f"--densities={args.densities}",
                                                     f"--warmup={settle}", f"--steps={args.auto_steps}",
                                                     "--pair_dense=true", "--pair_forced_sparse=true",
                                                     f"--forced_first={forced_first}"])
        for r in rows:
            r.setdefault("session", forced_first)
    nan = float("nan")
    auto = []
    for d in densities:
        every = {(k[1], k[2]): v for k, v in steps_of(rows, "micro", warm=True).items() if k[0] == d}

        def med(pick):
            xs = [max(x["exchange_ms"] for x in v) for (st, _), v in sorted(every.items()) if pick(st, v)]
            return statistics.median(xs) if xs else nan

        probe_sparse = med(lambda st, v: 2 <= st < 2 * probe and all(x["pattern"] != "D" for x in v))
        probe_dense = med(lambda st, v: 2 <= st < 2 * probe and all(x["pattern"] == "D" for x in v))
        t = med(lambda st, v: st >= settle)
        chose = sorted({x["pattern"] for (st, _), v in every.items() if st >= settle for x in v})
        de_all = steps_of(rows, "dense", paired="micro")
        de = {k: v for k, v in de_all.items() if k[0] == d}
        auto_dense = statistics.median(max(x["exchange_ms"] for x in v) for v in de.values()) if de else nan
        best_session = min(probe_sparse, probe_dense)
        # The forced-sparse twin (dense_fallback=off) and the paired dense bucket, in the same
        # steps as auto after its probe: the goal's measure, auto against the faster of the two.
        forced = {(k[1], k[2]): v for k, v in steps_of(rows, "micro_forced", warm=True).items() if k[0] == d}
        forced_ms = statistics.median(max(x["exchange_ms"] for x in v) for (st, _), v in forced.items()
                                      if st >= settle) if forced else nan
        dense_after = statistics.median(max(x["exchange_ms"] for x in v) for k, v in de_all.items()
                                        if k[0] == d and k[1] >= settle) if de_all else nan
        best_steady = min(forced_ms, dense_after)
        # Per step, auto's bucket over the forced-sparse twin of the same step (the slowest node of
        # each). Each session puts one of the two first after the dense exchange, so that cost
        # falls on each in half the pairs; the median and quartiles of the pooled ratios.
        pairs = sorted(max(x["exchange_ms"] for x in every[k]) / max(x["exchange_ms"] for x in forced[k])
                       for k in every if k[0] >= settle and k in forced)
        q = statistics.quantiles(pairs, n=4) if len(pairs) >= 2 else [nan, nan, nan]
        ref = next((r for r in runs if r["compressor"] == "micro" and r["density"] == d), None)
        best = min(ref["sparse_ms"], ref["dense_ms"]) if ref else nan
        auto.append({"density": d, "auto_ms": t, "paired_dense_ms": auto_dense, "chose": chose,
                     "probe_sparse_ms": probe_sparse, "probe_dense_ms": probe_dense,
                     "forced_sparse_ms": forced_ms, "dense_same_steps_ms": dense_after,
                     "vs_best_same_steps": t / best_steady if best_steady == best_steady else None,
                     "vs_forced_paired": q[1] if pairs else None, "vs_forced_paired_quartiles": [q[0], q[2]],
                     "pairs": len(pairs),
                     "vs_best_session": t / best_session if best_session == best_session else None,
                     "best_ms": best,
                     "faster": ("sparse" if ref["sparse_ms"] <= ref["dense_ms"] else "dense") if ref else None,
                     "vs_best": t / best if best == best else None})
        print(f"  auto micro@{d:g}: chose {'/'.join(chose)} ({'sparse' if 'D' not in chose else 'dense'}), "
              f"{t:.1f} ms; its probe in the same session: sparse {probe_sparse:.1f} ms, dense {probe_dense:.1f} ms "
              f"-> {t / best_session:.2f}x the faster; in the same steps forced sparse {forced_ms:.1f} ms, "
              f"dense {dense_after:.1f} ms -> {t / best_steady:.2f}x the faster; per step over forced sparse "
              f"{q[1]:.2f}x (quartiles {q[0]:.2f}-{q[2]:.2f}, {len(pairs)} pairs)"
              + (f"; {t / best:.2f}x the first session's faster" if best == best else ""), flush=True)
    return auto


def analyze(results):
    """Crossover rates (extrapolated per run, and measured between rates) and the 'own cores'
    estimate for configurations whose hosts share cores."""
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
            r.pop("own_cores_speedup_estimate", None)
            if cfg["shared_cores"] and (r["compressor"], r["density"]) in alone:
                sc, dcmp = alone[(r["compressor"], r["density"])]
                r["own_cores_speedup_estimate"] = (dcmp + r["dense_wire_ms"]) / (sc + r["sparse_wire_ms"])
    results["measured_crossovers"] = []
    keys = sorted({(r["compressor"], r["density"]) for c in results["configs"] for r in c["runs"]})
    for hosts in sorted({cfg["hosts"] for cfg in results["configs"]}):
        cf = [c for c in results["configs"] if c["hosts"] == hosts]
        for comp, d in keys:
            sp = [(rate_bits(c["rate"]), next((r["speedup"] for r in c["runs"] if r["compressor"] == comp
                                               and r["density"] == d), None)) for c in cf]
            sp = sorted((b, s) for b, s in sp if s is not None)
            for (b1, s1), (b2, s2) in zip(sp, sp[1:]):
                if (s1 - 1) * (s2 - 1) < 0:
                    results["measured_crossovers"].append(
                        {"hosts": hosts, "compressor": comp, "density": d, "between_bits": [b1, b2]})


def report(results):
    ncpu = results["cores"]
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
            v = a.get("vs_best_session")
            w = a.get("vs_best_same_steps")
            print(f"  auto micro@{a['density']:g}: chose {'/'.join(a['chose'])}, {a['auto_ms']:.1f} ms "
                  f"(dense beside it {a.get('paired_dense_ms', float('nan')):.1f} ms), "
                  + (f"{w:.2f}x the faster of forced sparse and dense in the same steps "
                     f"({'OK' if w <= 1.05 else 'over the 5% goal'}), " if w is not None else "")
                  + (f"{v:.2f}x the faster in its own probe, " if v is not None else "")
                  + (f"{a['vs_best']:.2f}x the first session's faster" if a.get("vs_best") else ""))
    for m in results.get("measured_crossovers", []):
        print(f"measured crossover: {m['hosts']} hosts, {m['compressor']}@{m['density']:g} between "
              f"{m['between_bits'][0] / 1e9:g} and {m['between_bits'][1] / 1e9:g} Gbit/s")


def plot(results, out):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("network_bench: no matplotlib, no plot")
        return
    hosts = sorted({c["hosts"] for c in results["configs"]})
    fig, axes = plt.subplots(1, len(hosts), figsize=(6.5 * len(hosts), 4.8), squeeze=False)
    for ax, h in zip(axes[0], hosts):
        cf = sorted((c for c in results["configs"] if c["hosts"] == h), key=lambda c: rate_bits(c["rate"]))
        keys = sorted({(r["compressor"], r["density"]) for c in cf for r in c["runs"]})
        for i, (comp, d) in enumerate(keys):
            pts = [(rate_bits(c["rate"]) / 1e9, r["speedup"]) for c in cf for r in c["runs"]
                   if r["compressor"] == comp and r["density"] == d]
            ax.plot([a for a, _ in pts], [b for _, b in pts], marker="o", ls="-" if d == max(k[1] for k in keys) else "--",
                    color=f"C{sorted({k[0] for k in keys}).index(comp)}", label=f"{comp}@{d:g}", lw=1)
        for c in cf:
            for a in c.get("auto", []):
                # As the title says: the dense bucket exchanged beside auto's in its own session
                # (the first session's runs are absent with --auto-only).
                dense = a.get("paired_dense_ms")
                if dense and a["auto_ms"] == a["auto_ms"]:
                    ax.scatter([rate_bits(c["rate"]) / 1e9], [dense / a["auto_ms"]], marker="x", color="k", zorder=5)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set(xscale="log", yscale="log", xlabel="link rate per host, each way (Gbit/s)",
               ylabel="dense time / sparse time (same run)",
               title=f"{h} hosts" + (f" (share {results['cores']} cores)" if cf and cf[0]["shared_cores"] else
                                     " (a core each)"))
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=6, ncol=2)
    fig.suptitle(f"exchange of {results['elements']:,} floats on the emulated cluster ({results['cores']} cores); "
                 f"x: --dense_fallback=auto on micro (paired dense time / auto's time)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out + ".png", dpi=100)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", default="2,4")
    p.add_argument("--rates", default="1gbit", help="comma-separated tc rates, e.g. 100mbit,1gbit,10gbit")
    p.add_argument("--elements", type=int, default=25557032)
    p.add_argument("--densities", default="0.001,0.01")
    p.add_argument("--compressors", default="micro,exdyna,topk,dgc,sidco_e,sage")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--auto-steps", type=int, default=8, help="steps of the --dense_fallback=auto run after its probe")
    p.add_argument("--auto-probe-steps", type=int, default=4, help="its --probe_steps (the probe: twice as many steps)")
    p.add_argument("--auto-only", action="store_true", help="only the --dense_fallback=auto session")
    p.add_argument("--spexd", default=os.path.join(ROOT, "bazel-bin", "daemon", "spexd"))
    p.add_argument("--trainer", default=os.path.join(ROOT, "bazel-bin", "bench", "sparse_exchange_trainer"))
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "network"))
    p.add_argument("--merge", default="",
                   help="comma-separated JSONs of earlier runs (pieces): merge their configurations into --out "
                        "(crossovers and estimates recomputed across them) instead of measuring")
    args = p.parse_args()
    ncpu = os.cpu_count() or 1
    if args.merge:
        results = None
        for path in args.merge.split(","):
            with open(path) as f:
                piece = json.load(f)
            if results is None:
                results = {"elements": piece["elements"], "cores": piece["cores"], "configs": []}
            elif (piece["elements"], piece["cores"]) != (results["elements"], results["cores"]):
                sys.exit(f"network_bench: --merge: {path} measured {piece['elements']} elements on "
                         f"{piece['cores']} cores, the first piece {results['elements']} on {results['cores']}")
            results["configs"] += piece["configs"]
    else:
        from spex.emulated import EmulatedCluster

        why = EmulatedCluster.unavailable()
        if why:
            sys.exit(f"network_bench: cannot emulate hosts here: {why}")
        results = {"elements": args.elements, "cores": ncpu,
                   "configs": measure(args, args.compressors.split(","),
                                      [float(x) for x in args.densities.split(",")], ncpu)}
    analyze(results)
    report(results)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(results, f, indent=1)
    plot(results, args.out)
    print(f"wrote {args.out}.json and {args.out}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
