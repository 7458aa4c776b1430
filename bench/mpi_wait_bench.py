#!/usr/bin/python3
"""How spexd waits for its MPI collectives (a program, not a test): --mpi_wait_max_sleep_us=0
(the engine's all-reduces and all-gathers block inside MPI, which polls: a core busy for the whole
wait) against passive waits (non-blocking collectives tested between sleeps that grow with the
wait, up to the flag's value, for collectives of at least --mpi_passive_wait_min_bytes), on the
emulated cluster.

Per --rates, one cluster of --hosts hosts (deploy/emulated_cluster.sh, a trainer per host inside
its namespace, bench/sparse_exchange_trainer as network_bench.py runs it: a --elements-float dense
bucket and a micro bucket at --density, exchanged every step, dense first); the daemons restart
per setting of --settings, in ABBA order (A B B A over --rounds), on the same network. A setting
is `N` (--mpi_wait_max_sleep_us=N --mpi_passive_wait_min_bytes=0: every collective passive when
N > 0, none when 0), `default` (spexd's defaults) or `LABEL:FLAG FLAG ...`; settings are separated
by ';'. --compressors dense exchanges the dense bucket alone (the daemons' CPU is then that of a
daemon waiting on a dense exchange). Per setting, pooled over its passes: the dense and the micro
exchange's p50 (the slowest node's time per step); the daemons' CPU use in cores per daemon (1.0 =
one core busy the whole time): over the trainers' whole run (utime + stime of every spexd, input
generation and start-up included), over the timed dense exchanges only (sampled every 20 ms,
from the first node's start to the last node's end of each exchange), and the same window's
busy time (every daemon thread's time running or waiting for a core, /proc schedstat: what a
polling thread asks for whatever the machine's load, where its CPU time is only the share it got);
the engine thread's CPU over the dense exchanges' collective phase (GetStats' phase CPU time);
and the machine's 1-minute load average at the end of each pass. Ratios are against the first
setting, same run.

    .venv/bin/python bench/mpi_wait_bench.py [--hosts 2] [--rates 100mbit,1gbit,10gbit]
        [--settings '0;1000'] [--compressors micro|dense] [--density 0.01] [--warmup 1]
        [--steps 4] [--rounds 1] [--out PREFIX]

Writes <out>.json and <out>.png (default bench/results/mpi_wait.*). Needs root, the spex
package (.venv) and the built binaries (//daemon:spexd, //bench:sparse_exchange_trainer).
"""
import argparse
import json
import os
import statistics
import sys
import threading
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


def busy_seconds(pids):
    """Seconds every thread of the processes spent running or waiting for a core (schedstat): a
    thread polling in MPI wants its core the whole time, however loaded the machine is, while
    its CPU time is only the share the scheduler gave it."""
    total = 0
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    run, wait = f.read().split()[:2]
                total += int(run) + int(wait)
            except (OSError, ValueError):
                pass
    return total / 1e9


class Sampler:
    """Samples (time.monotonic, CPU seconds, busy seconds) of the daemons every 20 ms."""

    def __init__(self, pids):
        self.pids, self.samples, self.stop = pids, [], threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while True:
            self.samples.append((time.monotonic(), cpu_seconds(self.pids), busy_seconds(self.pids)))
            if self.stop.wait(0.02):
                return

    def finish(self):
        self.stop.set()
        self.thread.join()
        self.samples.append((time.monotonic(), cpu_seconds(self.pids), busy_seconds(self.pids)))

    def at(self, t, k):
        """Sample field k (1: CPU, 2: busy) at time t, interpolated."""
        s = self.samples
        for (t0, *a), (t1, *b) in zip(s, s[1:]):
            if t0 <= t <= t1:
                f = (t - t0) / (t1 - t0) if t1 > t0 else 0.0
                return a[k - 1] + f * (b[k - 1] - a[k - 1])
        return s[0][k] if t < s[0][0] else s[-1][k]

    def over(self, intervals, k):
        """Field k's increase summed over the intervals [(t0, t1)], per second of them."""
        spent = sum(self.at(b, k) - self.at(a, k) for a, b in intervals)
        wall = sum(b - a for a, b in intervals)
        return spent / wall if wall > 0 else float("nan")


def exchange_intervals(rows, compressor):
    """[(t0, t1)] in seconds of CLOCK_MONOTONIC: per timed step of `compressor`, from the first
    node's start to the last node's end of its exchange."""
    by = {}
    for r in rows:
        if r["compressor"] == compressor and not r["warmup"] and "t0_ns" in r:
            by.setdefault((r["density"], r["step"]), []).append(r)
    return [(min(x["t0_ns"] for x in v) / 1e9, max(x["t1_ns"] for x in v) / 1e9) for v in by.values()]


def engine_collective_cores(rows, compressor):
    """The daemons' engine threads' CPU time over the collective phase per second of it (the
    phase timings of GetStats), pooled over the timed steps of every node."""
    mine = [r for r in rows if r["compressor"] == compressor and not r["warmup"]]
    wall = sum(r["collective_ms"] for r in mine)
    cpu = sum(r.get("collective_cpu_ms", 0.0) for r in mine)
    return cpu / wall if wall > 0 else float("nan")


def p50(rows, compressor, paired=None):
    by = nb.steps_of(rows, compressor, paired=paired)
    return statistics.median(max(x["exchange_ms"] for x in v) for v in by.values())


def parse_settings(text):
    """[(label, [flags])] of --settings."""
    out = []
    for item in text.split(";"):
        item = item.strip()
        if not item:
            continue
        if item.lstrip("-").isdigit():
            out.append((item, [f"--mpi_wait_max_sleep_us={int(item)}", "--mpi_passive_wait_min_bytes=0"]))
        elif item == "default":
            out.append((item, []))
        elif ":" in item:
            label, flags = item.split(":", 1)
            out.append((label, flags.split()))
        else:
            raise SystemExit(f"--settings: '{item}' is not N, default or LABEL:FLAGS")
    return out


def measure(args):
    from spex.emulated import EmulatedCluster

    base = ["--threads=1", "--min_sparse_elements=0", "--log_level=warning", "--dense_fallback=off"]
    flags_of = dict(parse_settings(args.settings))
    settings = [label for label, _ in parse_settings(args.settings)]
    dense_only = args.compressors == "dense"
    order = []
    for _ in range(args.rounds):
        order += settings + settings[::-1]
    configs = []
    for rate in args.rates.split(","):
        c = EmulatedCluster(args.spexd, hosts=args.hosts, trainers=1, rate=rate, args=base)
        passes = []
        try:
            for v in order:
                c.args = base + flags_of[v]
                c.start()
                pids = c.daemon_pids()
                if len(pids) != args.hosts:
                    raise RuntimeError(f"found {len(pids)} spexd processes, expected {args.hosts}")
                sampler = Sampler(pids)
                cpu0, t0 = cpu_seconds(pids), time.monotonic()
                rows = nb.run_trainers(c, args.trainer, args, [
                    f"--compressors={args.compressors}", f"--densities={args.density}",
                    f"--warmup={args.warmup}", f"--steps={args.steps}", f"--pair_dense={not dense_only}".lower()])
                cpu1, t1 = cpu_seconds(pids), time.monotonic()
                sampler.finish()
                c.stop()
                dense_iv = exchange_intervals(rows, "dense")
                row = {"setting": v, "dense_ms": p50(rows, "dense", paired="dense" if dense_only else "micro"),
                       "micro_ms": float("nan") if dense_only else p50(rows, "micro"),
                       "daemon_cores": (cpu1 - cpu0) / (t1 - t0) / args.hosts, "seconds": t1 - t0,
                       # Over the timed dense exchanges only (first node's start to last node's
                       # end of each), per daemon: CPU time, and the time its threads ran or
                       # waited for a core (what polling asks for, whatever the load).
                       "dense_daemon_cores": sampler.over(dense_iv, 1) / args.hosts,
                       "dense_daemon_busy_cores": sampler.over(dense_iv, 2) / args.hosts,
                       "dense_engine_collective_cores": engine_collective_cores(rows, "dense"),
                       "loadavg_1m": os.getloadavg()[0]}
                passes.append(row)
                print(f"  {c.description} {v} ({' '.join(flags_of[v]) or 'defaults'}): dense "
                      f"{row['dense_ms']:.1f} ms, micro {row['micro_ms']:.1f} ms, daemon "
                      f"{row['daemon_cores']:.3f} cores; during dense exchanges: daemon "
                      f"{row['dense_daemon_cores']:.3f} cores, busy {row['dense_daemon_busy_cores']:.3f}, "
                      f"engine in collective {row['dense_engine_collective_cores']:.3f}; load "
                      f"{row['loadavg_1m']:.2f}", flush=True)
        finally:
            c.cleanup()
        summary = []
        for v in settings:
            mine = [p for p in passes if p["setting"] == v]
            summary.append({"setting": v, **{k: statistics.mean(p[k] for p in mine)
                                             for k in ("dense_ms", "micro_ms", "daemon_cores", "dense_daemon_cores",
                                                       "dense_daemon_busy_cores", "dense_engine_collective_cores",
                                                       "loadavg_1m")}})
        first = summary[0]
        for s in summary:
            s["dense_vs_first"] = s["dense_ms"] / first["dense_ms"]
            s["micro_vs_first"] = s["micro_ms"] / first["micro_ms"]
            s["cores_vs_first"] = s["daemon_cores"] / first["daemon_cores"] if first["daemon_cores"] else float("nan")
        configs.append({"rate": rate, "hosts": args.hosts, "compressors": args.compressors,
                        "settings": {label: flags_of[label] for label in settings},
                        "passes": passes, "summary": summary})
    return configs


def report(configs):
    print(f"{'rate':>8} {'setting':>10} {'dense ms':>9} {'micro ms':>9} {'cores':>6} {'in dense':>9} "
          f"{'busy':>6} {'engine':>7} {'load':>5}  dense/first micro/first cores/first")
    for cfg in configs:
        for s in cfg["summary"]:
            print(f"{cfg['rate']:>8} {s['setting']:>10} {s['dense_ms']:9.1f} {s['micro_ms']:9.1f} "
                  f"{s['daemon_cores']:6.3f} {s['dense_daemon_cores']:9.3f} {s['dense_daemon_busy_cores']:6.3f} "
                  f"{s['dense_engine_collective_cores']:7.3f} {s['loadavg_1m']:5.2f}  {s['dense_vs_first']:11.3f} "
                  f"{s['micro_vs_first']:11.3f} {s['cores_vs_first']:11.3f}")
    print("cores: CPU per daemon over the trainers' whole run; in dense: CPU per daemon over the timed dense "
          "exchanges; busy: the time its threads ran or waited for a core over them (polling wants a core "
          "whatever the load); engine: the engine thread's CPU over the collective phase (GetStats)")


def plot(configs, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [("dense_ms", "dense exchange p50 (ms)"), ("micro_ms", "micro exchange p50 (ms)"),
            ("daemon_cores", "CPU per daemon (cores)")]
    if configs[0].get("compressors") == "dense":
        keys = [keys[0], keys[2]]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.4 * len(keys), 4))
    labels = [cfg["rate"] for cfg in configs]
    settings = [s["setting"] for s in configs[0]["summary"]]
    width = 0.8 / len(settings)
    for ax, (key, title) in zip(axes, keys):
        for i, v in enumerate(settings):
            ys = [next(s[key] for s in cfg["summary"] if s["setting"] == v) for cfg in configs]
            ax.bar([x + i * width for x in range(len(configs))], ys, width, label=str(v))
        ax.set_xticks([x + width * (len(settings) - 1) / 2 for x in range(len(configs))])
        ax.set_xticklabels(labels)
        ax.set_title(title)
        if key != "daemon_cores":
            ax.set_yscale("log")
    axes[0].legend()
    fig.suptitle(f"spexd's MPI waits, {configs[0]['hosts']} emulated hosts")
    fig.tight_layout()
    fig.savefig(out + ".png", dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--rates", default="100mbit,1gbit,10gbit")
    ap.add_argument("--settings", default="0;1000")
    ap.add_argument("--compressors", default="micro", choices=("micro", "dense"))
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
