#!/usr/bin/python3
"""engine_ab.py's sparse workload (micro@0.01 on one bucket of --elements floats, 2 daemons of 1
trainer, --dense_fallback=off) with each daemon's per-phase times read from GetStats: the check
that tells a slower engine from a busier machine. Per run, on each node, the bucket's mean wall
and CPU seconds per exchange of every phase (spexctl stats --json, BucketStats.mean_phases),
and each spexd's whole CPU (every thread, start-up included) per exchange. The means cover every
exchange, the 3 warm-up steps the trainers' p50 leaves out included. CPU time is what the engine
thread did; wall time adds the wait for a core and for the other node. Builds run ABBA (then BAAB) per round, as in engine_ab.py, and the ratio B / A per phase is
the median over rounds of each round's mean B / mean A (both nodes averaged).

  /usr/bin/python3 bench/engine_ab_phases.py --dir_a /tmp/old --dir_b /tmp/new --rounds 2

Each --dir holds daemon/spexd and client/spex_trainer; --spexctl is any build's spexctl (the
stats message is read by field name, older daemons answer it alike).
"""
import argparse, csv, json, os, statistics, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import exchange_bench as xb  # noqa: E402  (Daemons, ENV)


def stats(spexctl, sock):
    out = subprocess.run([spexctl, f"--socket={sock}", "stats", "--json"], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    return json.loads(out)


def daemons_cpu(tag):
    """Each spexd of this run (its command line names `tag`): CPU seconds since its start (all
    its threads) and its thread count, from /proc."""
    out = []
    tick = os.sysconf("SC_CLK_TCK")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            if not cmd[0].endswith(b"/spexd") or not any(tag.encode() in a for a in cmd):
                continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out.append({"cpu_s": (int(fields[11]) + int(fields[12])) / tick,
                        "threads": int(fields[17])})
        except OSError:
            continue
    return out


def run(bin_dir, spexctl, elements, steps):
    """One run: the trainers' fastest-node exchange p50 (ms) and each node's phases."""
    d = xb.Daemons(bin_dir, 2, 1, ["--dense_fallback=off"])
    try:
        procs = [subprocess.Popen([f"{bin_dir}/client/spex_trainer", f"--socket={d.sock(n)}",
                                   "--local_size=1", f"--buckets={elements}", f"--steps={steps + 3}",
                                   "--quiet", f"--csv={d.dir}/steps{n}.csv", "--compressor=micro",
                                   "--density=0.01"], env=xb.ENV, stdout=subprocess.DEVNULL)
                 for n in range(2)]
        if any(p.wait() for p in procs):
            raise RuntimeError("trainer failed")
        # A bucket's stats outlive its trainers: read once, at the end.
        last = [stats(spexctl, d.sock(n)) for n in range(2)]
        procs_cpu = daemons_cpu(d.dir)
    finally:
        d.stop()
    nodes = []
    for s in last:
        b = s["buckets"][0]
        nodes.append({"exchanges": int(b["exchanges"]),
                      "wall": {p["phase"]: p.get("seconds", 0.0) for p in b["mean_phases"]},
                      "cpu": {p["phase"]: p.get("cpu_seconds", 0.0) for p in b["mean_phases"]}})
    # engine_ab.trainers' reduction, on the CSVs this run wrote.
    fastest = {}
    for n in range(2):
        with open(f"{d.dir}/steps{n}.csv") as f:
            for row in csv.DictReader(f):
                st = int(row["step"])
                if st >= 3:
                    fastest[st] = min(fastest.get(st, 1e30), float(row["exchange_ms"]))
    return {"exchange_ms_p50": statistics.median(fastest.values()), "nodes": nodes,
            "daemons": procs_cpu}


def mean_over_nodes(r, kind, phase):
    return statistics.mean(n[kind].get(phase, 0.0) for n in r["nodes"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir_a", required=True)
    ap.add_argument("--dir_b", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--elements", type=int, default=4 * 1024 * 1024)
    ap.add_argument("--spexctl", default=os.path.join(xb.ROOT, "bazel-bin/client/spexctl"))
    ap.add_argument("--out", default="bench/results/engine_ab_phases.json")
    args = ap.parse_args()
    runs = {"a": [], "b": []}
    per_round = []
    for r in range(args.rounds):
        got = {"a": [], "b": []}
        for which in ("abba" if r % 2 == 0 else "baab"):
            v = run(args.dir_a if which == "a" else args.dir_b, args.spexctl, args.elements, args.steps)
            got[which].append(v)
            runs[which].append(v)
            print(f"round {r} {which}: exchange p50 {v['exchange_ms_p50']:.2f} ms; cpu ms/exchange "
                  + " ".join(f"{p}={1e3 * mean_over_nodes(v, 'cpu', p):.2f}"
                             for p in ("reduce_local", "compress", "collective", "decode"))
                  + f"; spexd cpu s {[x['cpu_s'] for x in v['daemons']]}"
                  + f" threads {[x['threads'] for x in v['daemons']]}", flush=True)
        per_round.append(got)
    phases = [p for p in runs["a"][0]["nodes"][0]["wall"]]
    table = {}
    for kind in ("wall", "cpu"):
        for p in phases + ["engine_total"]:
            def val(x, p=p, kind=kind):
                if p == "engine_total":
                    return sum(mean_over_nodes(x, kind, q) for q in phases)
                return mean_over_nodes(x, kind, p)
            ratios = []
            for got in per_round:
                a = statistics.mean(val(x) for x in got["a"])
                b = statistics.mean(val(x) for x in got["b"])
                ratios.append(b / a if a > 0 else float("nan"))
            table[f"{kind}:{p}"] = {
                "a_ms": 1e3 * statistics.median(val(x) for x in runs["a"]),
                "b_ms": 1e3 * statistics.median(val(x) for x in runs["b"]),
                "ratio": statistics.median(ratios), "round_ratio": ratios}
    rt = []
    for got in per_round:
        rt.append(statistics.mean(x["exchange_ms_p50"] for x in got["b"]) /
                  statistics.mean(x["exchange_ms_p50"] for x in got["a"]))
    # The daemons' whole CPU (every thread, start-up included) per exchange, both nodes averaged.
    def proc_ms(x):
        return 1e3 * statistics.mean(d["cpu_s"] for d in x["daemons"]) / x["nodes"][0]["exchanges"]
    pr = [statistics.mean(proc_ms(x) for x in got["b"]) / statistics.mean(proc_ms(x) for x in got["a"])
          for got in per_round]
    table["spexd_cpu_per_exchange"] = {
        "a_ms": statistics.median(proc_ms(x) for x in runs["a"]),
        "b_ms": statistics.median(proc_ms(x) for x in runs["b"]),
        "ratio": statistics.median(pr), "round_ratio": pr}
    table["exchange_ms_p50"] = {
        "a_ms": statistics.median(x["exchange_ms_p50"] for x in runs["a"]),
        "b_ms": statistics.median(x["exchange_ms_p50"] for x in runs["b"]),
        "ratio": statistics.median(rt), "round_ratio": rt}
    print(f"{'measure':26} {'A ms':>8} {'B ms':>8} {'B/A':>6}  per-round B/A")
    for k, v in table.items():
        print(f"{k:26} {v['a_ms']:8.3f} {v['b_ms']:8.3f} {v['ratio']:6.3f}  "
              + " ".join(f"{x:.3f}" for x in v["round_ratio"]))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "load_avg": os.getloadavg(), "table": table, "runs": runs}, f,
                  indent=1)


if __name__ == "__main__":
    main()
