#!/usr/bin/python3
"""Two builds of spexd against each other on the same exchanges, ABBA in one run: the check
that a change inside the engine that must not change behaviour (a refactoring) did not change
its speed either.

Each of --dir_a and --dir_b holds daemon/spexd, client/spex_trainer and bench/exchange_latency
(copy them aside from bazel-bin, built with -c opt, before and after the change). Per round,
in the order A B B A (the second round B A A B, and so on), every workload runs on each build:
  rtt        the round trip of an empty exchange (1 element, 1 node, doorbell): p50 in us
             (exchange_bench.py part (a), spinning off)
  dense      --dense_elements floats, 2 daemons of 1 trainer: per-step exchange p50 in ms, the
             fastest node's (exchange_bench.py part (b), without its MPI baseline)
  sparse     the same bucket through micro at density 0.01 (the per-bucket sparse path)
  merged     --merged_buckets buckets of --merged_elements floats, topk at 0.01, 2 daemons with
             --merger=fixed (the merge-group path and the wire stage, --merge_overlap)
and the ratio B / A per workload: the median over rounds of each round's B/A (paired, as the
machine drifts between rounds), beside the pooled p50s. Writes --out (JSON) and prints a table.

  /usr/bin/python3 bench/engine_ab.py --dir_a /tmp/old --dir_b /tmp/new --rounds 2
"""
import argparse, csv, json, os, statistics, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import exchange_bench as xb  # noqa: E402  (Daemons, latency, ENV)


def trainers(bin_dir, nodes, buckets, steps, compressor, extra):
    d = xb.Daemons(bin_dir, nodes, 1, extra)
    try:
        procs = [subprocess.Popen([f"{bin_dir}/client/spex_trainer", f"--socket={d.sock(n)}",
                                   "--local_size=1", f"--buckets={buckets}", f"--steps={steps + 3}",
                                   "--quiet", f"--csv={d.dir}/steps{n}.csv",
                                   *([f"--compressor={compressor}", "--density=0.01"]
                                     if compressor else [])],
                                  env=xb.ENV, stdout=subprocess.DEVNULL)
                 for n in range(nodes)]
        for p in procs:
            if p.wait():
                raise RuntimeError("trainer failed")
    finally:
        d.stop()
    # Per step, the fastest node's exchange time, summed over the step's buckets.
    fastest = {}
    for n in range(nodes):
        per = {}
        with open(f"{d.dir}/steps{n}.csv") as f:
            for row in csv.DictReader(f):
                s = int(row["step"])
                if s >= 3:
                    per[s] = per.get(s, 0.0) + float(row["exchange_ms"])
        for s, ms in per.items():
            fastest[s] = min(fastest.get(s, 1e30), ms)
    return statistics.median(fastest.values())


def workloads(args):
    merged = ",".join([str(args.merged_elements)] * args.merged_buckets)
    return {
        "rtt": lambda b: xb.latency(b, args.iters, 0)["doorbell_p50_us"],
        "dense": lambda b: trainers(b, 2, args.dense_elements, args.steps, "", ["--dense_fallback=off"]),
        "sparse": lambda b: trainers(b, 2, args.dense_elements, args.steps, "micro",
                                     ["--dense_fallback=off"]),
        "merged": lambda b: trainers(b, 2, merged, args.steps, "topk",
                                     ["--dense_fallback=off", "--merger=fixed"]),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir_a", required=True, help="the baseline build (before)")
    ap.add_argument("--dir_b", required=True, help="the build under test (after)")
    ap.add_argument("--rounds", type=int, default=2, help="ABBA rounds (each runs A and B twice)")
    ap.add_argument("--iters", type=int, default=3000)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--dense_elements", type=int, default=4 * 1024 * 1024)
    ap.add_argument("--merged_buckets", type=int, default=16)
    ap.add_argument("--merged_elements", type=int, default=65536)
    ap.add_argument("--workloads", default="rtt,dense,sparse,merged")
    ap.add_argument("--out", default="bench/results/engine_ab.json")
    args = ap.parse_args()
    todo = {k: v for k, v in workloads(args).items() if k in args.workloads.split(",")}
    runs = {k: {"a": [], "b": [], "round_ratio": []} for k in todo}
    for r in range(args.rounds):
        order = "abba" if r % 2 == 0 else "baab"
        for name, run in todo.items():
            got = {"a": [], "b": []}
            for which in order:
                v = run(args.dir_a if which == "a" else args.dir_b)
                got[which].append(v)
                runs[name][which].append(v)
                print(f"round {r} {name} {which}: {v:.3f}", flush=True)
            runs[name]["round_ratio"].append(statistics.mean(got["b"]) / statistics.mean(got["a"]))
    out = {"args": vars(args), "load_avg": os.getloadavg(), "workloads": {}}
    print(f"{'workload':8} {'A p50':>10} {'B p50':>10} {'B/A':>7}  per-round B/A")
    for name, v in runs.items():
        ratio = statistics.median(v["round_ratio"])
        out["workloads"][name] = dict(v, a_median=statistics.median(v["a"]),
                                      b_median=statistics.median(v["b"]), ratio=ratio)
        print(f"{name:8} {statistics.median(v['a']):10.3f} {statistics.median(v['b']):10.3f} "
              f"{ratio:7.3f}  {' '.join(f'{x:.3f}' for x in v['round_ratio'])}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
