#!/usr/bin/python3
"""How spexd waits for its MPI collectives (a program, not a test): --mpi_wait_max_sleep_us=0
(the engine's all-reduces and all-gathers block inside MPI, which polls: a core busy for the whole
wait) against passive waits (non-blocking collectives tested between sleeps that grow with the
wait, up to the flag's value), on the emulated cluster.

Per --rates, one cluster of --hosts hosts (deploy/emulated_cluster.sh, a trainer per host inside
its namespace, bench/sparse_exchange_trainer as network_bench.py runs it: a --elements-float dense
bucket and a micro bucket at --density, exchanged every step, dense first); the daemons restart
per setting of --settings, in ABBA order (A B B A over --rounds), on the same network. Per setting,
pooled over its passes: the dense and the micro exchange's p50 (the slowest node's time per
step) and the daemons' CPU use (utime + stime of every spexd over the trainers' run, in cores per
daemon: 1.0 = one core busy the whole time). Ratios are against the first setting, same run.

    .venv/bin/python bench/mpi_wait_bench.py [--hosts 2] [--rates 100mbit,1gbit,10gbit]
        [--settings 0,1000] [--density 0.01] [--warmup 1] [--steps 4] [--rounds 1] [--out PREFIX]

Writes <out>.json and <out>.png (default bench/results/mpi_wait.*). Needs root, the spex
package (.venv) and the built binaries (//daemon:spexd, //bench:sparse_exchange_trainer).
"""
import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import network_bench as nb  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids):
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / TICK  # utime, stime
    return total


def p50(rows, compressor, paired=None):
    by = nb.steps_of(rows, compressor, paired=paired)
    return statistics.median(max(x["exchange_ms"] for x in v) for v in by.values())


def measure(args):
    from spex.emulated import EmulatedCluster

    base = ["--threads=1", "--min_sparse_elements=0", "--log_level=warning", "--dense_fallback=off"]
    settings = [int(s) for s in args.settings.split(",")]
    order = []
    for _ in range(args.rounds):
        order += settings + settings[::-1]
    configs = []
    for rate in args.rates.split(","):
        c = EmulatedCluster(args.spexd, hosts=args.hosts, trainers=1, rate=rate, args=base)
        passes = []
        try:
            for v in order:
                c.args = base + [f"--mpi_wait_max_sleep_us={v}"]
                c.start()
                pids = c.daemon_pids()
                if len(pids) != args.hosts:
                    raise RuntimeError(f"found {len(pids)} spexd processes, expected {args.hosts}")
                cpu0, t0 = cpu_seconds(pids), time.monotonic()
                rows = nb.run_trainers(c, args.trainer, args, [
                    "--compressors=micro", f"--densities={args.density}", f"--warmup={args.warmup}",
                    f"--steps={args.steps}", "--pair_dense=true"])
                cpu1, t1 = cpu_seconds(pids), time.monotonic()
                c.stop()
                row = {"setting": v, "dense_ms": p50(rows, "dense", paired="micro"),
                       "micro_ms": p50(rows, "micro"),
                       "daemon_cores": (cpu1 - cpu0) / (t1 - t0) / args.hosts, "seconds": t1 - t0}
                passes.append(row)
                print(f"  {c.description} --mpi_wait_max_sleep_us={v}: dense {row['dense_ms']:.1f} ms, "
                      f"micro {row['micro_ms']:.1f} ms, daemon {row['daemon_cores']:.2f} cores", flush=True)
        finally:
            c.cleanup()
        summary = []
        for v in settings:
            mine = [p for p in passes if p["setting"] == v]
            summary.append({"setting": v, **{k: statistics.mean(p[k] for p in mine)
                                             for k in ("dense_ms", "micro_ms", "daemon_cores")}})
        first = summary[0]
        for s in summary:
            s["dense_vs_first"] = s["dense_ms"] / first["dense_ms"]
            s["micro_vs_first"] = s["micro_ms"] / first["micro_ms"]
            s["cores_vs_first"] = s["daemon_cores"] / first["daemon_cores"] if first["daemon_cores"] else float("nan")
        configs.append({"rate": rate, "hosts": args.hosts, "passes": passes, "summary": summary})
    return configs


def report(configs):
    print(f"{'rate':>8} {'setting':>8} {'dense ms':>9} {'micro ms':>9} {'cores':>6}  dense/first "
          f"micro/first cores/first")
    for cfg in configs:
        for s in cfg["summary"]:
            print(f"{cfg['rate']:>8} {s['setting']:>8} {s['dense_ms']:9.1f} {s['micro_ms']:9.1f} "
                  f"{s['daemon_cores']:6.2f}  {s['dense_vs_first']:11.3f} {s['micro_vs_first']:11.3f} "
                  f"{s['cores_vs_first']:11.3f}")


def plot(configs, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    labels = [cfg["rate"] for cfg in configs]
    settings = [s["setting"] for s in configs[0]["summary"]]
    width = 0.8 / len(settings)
    for ax, key, title in zip(axes, ("dense_ms", "micro_ms", "daemon_cores"),
                              ("dense exchange p50 (ms)", "micro exchange p50 (ms)", "CPU per daemon (cores)")):
        for i, v in enumerate(settings):
            ys = [next(s[key] for s in cfg["summary"] if s["setting"] == v) for cfg in configs]
            ax.bar([x + i * width for x in range(len(configs))], ys, width, label=f"max sleep {v} us")
        ax.set_xticks([x + width * (len(settings) - 1) / 2 for x in range(len(configs))])
        ax.set_xticklabels(labels)
        ax.set_title(title)
        if key != "daemon_cores":
            ax.set_yscale("log")
    axes[0].legend()
    fig.suptitle(f"--mpi_wait_max_sleep_us, {configs[0]['hosts']} emulated hosts")
    fig.tight_layout()
    fig.savefig(out + ".png", dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--rates", default="100mbit,1gbit,10gbit")
    ap.add_argument("--settings", default="0,1000")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--elements", type=int, default=25557032)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--spexd", default=os.path.join(ROOT, "bazel-bin/daemon/spexd"))
    ap.add_argument("--trainer", default=os.path.join(ROOT, "bazel-bin/bench/sparse_exchange_trainer"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/mpi_wait"))
    args = ap.parse_args()
    configs = measure(args)
    report(configs)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump({"configs": configs, "cpus": os.cpu_count(),
                   "note": "daemons and trainers of every host share this machine's cores"}, f, indent=1)
    plot(configs, args.out)
    print(f"wrote {args.out}.json and {args.out}.png")


if __name__ == "__main__":
    main()
