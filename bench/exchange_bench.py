#!/usr/bin/env python3
"""Benchmarks of the walking skeleton, each against a baseline measured in the same run.

(a) Round trip of an empty exchange (1-element bucket) on one node through the doorbell and
    through the Exchange RPC, p50/p99 over --iters iterations, beside a two-process futex
    ping-pong (sleeping and spinning): spexd once with --spin_us=0 and once with spinning.
(b) Dense exchange of --elements floats (ResNet-50's 25,557,032) across 2 and 4 local daemons
    (1 trainer each), against a plain MPI_Allreduce of the same buffer with the same ranks.
(c) The cost of observing: the round trip of (a) with spexd's metrics (--metrics_address) and
    timeline (--timeline) off and on, interleaved over --observe_rounds rounds in the same run;
    per round the ratio of each p50 to the same round's "off" (paired: the machine's state drifts
    between rounds), reported as the median over rounds.

--parts picks which run (default: all three); --spexd_args adds flags to every spexd.

Prints a table with ratios and writes bench/results/exchange.json and exchange.csv.
Run with /usr/bin/python3 from the repository root after `bazel build //...`.
"""
import argparse, csv, json, os, re, shlex, signal, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_btl_tcp_if_include="lo",
           OMPI_MCA_oob_tcp_if_include="lo")
SPEXD_ARGS = []  # --spexd_args: added to every spexd


def bazel_bin():
    subprocess.run(["bazel", "build", "-c", "opt", "//daemon:spexd", "//client:spex_trainer",
                    "//bench:exchange_latency", "//bench:mpi_allreduce_baseline"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return subprocess.run(["bazel", "info", "-c", "opt", "bazel-bin"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()


class Daemons:
    def __init__(self, bin_dir, nodes, trainers, extra=()):
        self.dir = tempfile.mkdtemp(prefix="spex-bench.")
        self.nodes = nodes
        self.log = open(os.path.join(self.dir, "spexd.log"), "w")
        self.proc = subprocess.Popen(["mpirun", "-np", str(nodes), f"{bin_dir}/daemon/spexd",
                                      f"--socket={self.dir}/node{{rank}}.sock",
                                      f"--local_trainers={trainers}", "--log_level=warning", *SPEXD_ARGS,
                                      *extra],
                                     env=ENV, stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(300):
            if all(os.path.exists(self.sock(n)) for n in range(nodes)):
                return
            if self.proc.poll() is not None:
                raise RuntimeError(open(self.log.name).read())
            time.sleep(0.1)
        raise RuntimeError("daemons did not start")

    def sock(self, n):
        return f"{self.dir}/node{n}.sock"

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)


def latency(bin_dir, iters, spin, extra=()):
    d = Daemons(bin_dir, 1, 1, [f"--spin_us={spin}", *extra])
    try:
        out = subprocess.run([f"{bin_dir}/bench/exchange_latency", f"--socket={d.sock(0)}", f"--iters={iters}"],
                             env=ENV, check=True, capture_output=True, text=True).stdout
    finally:
        d.stop()
    return json.loads(out)


def dense(bin_dir, nodes, elements, steps):
    base = json.loads(subprocess.run(["mpirun", "-np", str(nodes), f"{bin_dir}/bench/mpi_allreduce_baseline",
                                      str(elements), str(steps)], env=ENV, check=True, capture_output=True,
                                     text=True).stdout.strip().splitlines()[-1])
    d = Daemons(bin_dir, nodes, 1)
    try:
        procs = [subprocess.Popen([f"{bin_dir}/client/spex_trainer", f"--socket={d.sock(n)}", "--local_size=1",
                                   f"--buckets={elements}", f"--steps={steps + 3}", "--quiet",
                                   f"--csv={d.dir}/steps{n}.csv"], env=ENV, stdout=subprocess.PIPE, text=True)
                 for n in range(nodes)]
        for p in procs:
            p.wait()
            if p.returncode:
                raise RuntimeError("trainer failed")
    finally:
        d.stop()
    # Per step, the slowest node's exchange time includes the skew between nodes (one node's
    # trainer finished writing its gradients later); the fastest node's is the time from the
    # last node's "ready" to the result, the analogue of the baseline, which starts every
    # iteration from a barrier. Both are reported; the ratio uses the latter.
    slowest, fastest = {}, {}
    for n in range(nodes):
        with open(f"{d.dir}/steps{n}.csv") as f:
            for row in csv.DictReader(f):
                s, ms = int(row["step"]), float(row["exchange_ms"])
                if s >= 3:  # warm-up as the baseline
                    slowest[s] = max(slowest.get(s, 0.0), ms)
                    fastest[s] = min(fastest.get(s, 1e30), ms)
    p50 = lambda d: sorted(d.values())[len(d) // 2]
    return {"nodes": nodes, "elements": elements, "mpi_allreduce_p50_ms": base["allreduce_p50_ms"],
            "spex_dense_p50_ms": p50(fastest), "spex_dense_with_skew_p50_ms": p50(slowest),
            "ratio": p50(fastest) / base["allreduce_p50_ms"]}


# (c): what each configuration adds to spexd; {dir} is a fresh directory per run.
OBSERVE = (("off", []),
           ("metrics", ["--metrics_address=127.0.0.1:0"]),
           ("timeline", ["--timeline={dir}/timeline.json"]),
           ("metrics+timeline", ["--metrics_address=127.0.0.1:0", "--timeline={dir}/timeline.json"]))


def observe_cost(bin_dir, iters, spin, rounds):
    """Round trip p50/p99 per configuration, the configurations interleaved (rotated) per round."""
    per = {name: [] for name, _ in OBSERVE}
    for r in range(rounds):
        order = OBSERVE[r % len(OBSERVE):] + OBSERVE[:r % len(OBSERVE)]
        for name, flags in order:
            tmp = tempfile.mkdtemp(prefix="spex-observe.")
            per[name].append(latency(bin_dir, iters, spin, [f.format(dir=tmp) for f in flags]))
            timeline = os.path.join(tmp, "timeline.json")
            if os.path.exists(timeline):  # the daemon closed it: it must be a complete trace
                with open(timeline) as f:
                    n = sum(1 for e in json.load(f) if e.get("name") == "exchange")
                if n < iters:
                    raise RuntimeError(f"timeline {timeline} has {n} exchanges, expected >= {iters}")
                os.remove(timeline)
    out = {}
    for name, runs in per.items():
        out[name] = {k: statistics.median(run[k] for run in runs)
                     for k in ("doorbell_p50_us", "doorbell_p99_us", "rpc_p50_us", "rpc_p99_us")}
        out[name]["rounds"] = runs
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=10000)
    ap.add_argument("--elements", type=int, default=25557032)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--nodes", default="2,4")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "exchange"))
    ap.add_argument("--parts", default="latency,dense,observe",
                    help="which parts run: latency (a), dense (b), observe (c)")
    ap.add_argument("--spexd_args", default="", help="extra flags for every spexd (one string)")
    ap.add_argument("--observe_rounds", type=int, default=5)
    ap.add_argument("--observe_spin_us", type=int, default=0, help="spexd --spin_us in part (c)")
    args = ap.parse_args()
    SPEXD_ARGS.extend(shlex.split(args.spexd_args))
    parts = set(args.parts.split(","))
    bin_dir = bazel_bin()
    rows = []
    results = {}
    if "observe" in parts:
        obs = observe_cost(bin_dir, args.iters, args.observe_spin_us, args.observe_rounds)
        results["observe"] = obs
        off = obs["off"]
        print(f"observing cost: round trip of an empty exchange, spin {args.observe_spin_us} us, "
              f"median of {args.observe_rounds} interleaved rounds of {args.iters} iterations")
        for name, _ in OBSERVE:
            o = obs[name]
            for path in ("doorbell", "rpc"):
                p50, p99 = o[f"{path}_p50_us"], o[f"{path}_p99_us"]
                ratio = statistics.median(r[f"{path}_p50_us"] / b[f"{path}_p50_us"]
                                          for r, b in zip(o["rounds"], off["rounds"]))
                rows.append({"bench": "observe", "config": f"{path}, {name}", "p50_us": p50, "p99_us": p99,
                             "baseline": "same path, metrics and timeline off",
                             "baseline_us": off[f"{path}_p50_us"], "ratio": ratio})
                print(f"{name:17s} {path:9s} p50 {p50:8.1f} us  p99 {p99:8.1f} us  = {ratio:5.3f}x off "
                      f"(median of per-round ratios)")
    if not parts & {"latency", "dense"}:
        write(args.out, results, rows)
        return
    lat_sleep = latency(bin_dir, args.iters, 0)
    lat_spin = latency(bin_dir, args.iters, 50)
    floor = lat_sleep["futex_sleep_p50_us"]
    print(f"futex ping-pong floor: p50 {floor:.1f} us (sleeping, two processes pinned to two CPUs), "
          f"{lat_sleep['futex_spin_p50_us']:.2f} us (spinning); same CPU: "
          f"{lat_sleep.get('futex_same_core_p50_us', float('nan')):.1f} us (a context switch, for reference)")
    for name, lat in (("no spin", lat_sleep), ("spin 50us", lat_spin)):
        for path in ("doorbell", "rpc"):
            p50, p99 = lat[f"{path}_p50_us"], lat[f"{path}_p99_us"]
            rows.append({"bench": "latency", "config": f"{path}, {name}", "p50_us": p50, "p99_us": p99,
                         "baseline": "futex ping-pong p50 (sleeping)", "baseline_us": floor, "ratio": p50 / floor})
            print(f"{path:9s} {name:10s} p50 {p50:8.1f} us  p99 {p99:8.1f} us  = {p50 / floor:5.2f}x the futex floor")
    for n in [int(x) for x in args.nodes.split(",")] if "dense" in parts else []:
        r = dense(bin_dir, n, args.elements, args.steps)
        rows.append({"bench": "dense", "config": f"{n} daemons", "p50_ms": r["spex_dense_p50_ms"],
                     "p50_with_skew_ms": r["spex_dense_with_skew_p50_ms"],
                     "baseline": "MPI_Allreduce p50", "baseline_ms": r["mpi_allreduce_p50_ms"], "ratio": r["ratio"]})
        print(f"dense {args.elements} floats, {n} daemons: spex p50 {r['spex_dense_p50_ms']:.1f} ms "
              f"(slowest node, with skew: {r['spex_dense_with_skew_p50_ms']:.1f} ms), "
              f"MPI_Allreduce p50 {r['mpi_allreduce_p50_ms']:.1f} ms  = {r['ratio']:.2f}x")
    results.update({"latency_no_spin": lat_sleep, "latency_spin": lat_spin})
    write(args.out, results, rows)


def write(out, results, rows):
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out + ".json", "w") as f:
        json.dump({**results, "rows": rows}, f, indent=1)
    keys = sorted({k for r in rows for k in r})
    with open(out + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {out}.json and .csv")


if __name__ == "__main__":
    sys.exit(main())
