#!/usr/bin/env python3
"""The check of spexd's --auto_decide=model against the simulation (docs/scale.md#where-spex-picks).

It exists to answer "does auto pick within 10% of the best of dense, the all-gather and Ok-Topk at
every simulated point" from the sweeps already run (spex_scale.py sweep), without simulating
again. At every point where all three exchanges were simulated it replays the daemon's rule
(daemon/engine/exchange_choice.h) on the cost model's times stored with the point: the cheapest
candidate decides unless others are within CLOSE (1.5x) of it; those close ones are probed, and a
probe is taken to find the simulation's fastest among them (it measures the same exchanges; on a
real cluster it measures them with noise). It reports, per platform, where each exchange wins,
how many points the model decided and how many it left to the probes, and the regret (auto's
simulated time over the fastest) of the model alone and of auto.

    python3 bench/scale/auto_check.py bench/results/scale_*.json --out bench/results/scale_auto_check.json
    python3 bench/scale/auto_check.py --skewed bench/results/scale_skew_*.json   # selections of real gradients

Points with selections of real gradients (spex_scale.py skew: they carry a label) are checked only
with --skewed, and then only they (per recording, wire and bucket size).
"""

import argparse
import csv
import json
import sys

CLOSE = 1.5  # kModelCloseFactor in daemon/engine/exchange_choice.h
NAMES = ("dense", "allgather", "oktopk")
SIM = {"dense": "dense", "allgather": "gather", "oktopk": "oktopk"}


def check_point(r):
    """The replay at one point, or None where an exchange was not simulated."""
    t = r["times_s"]
    if any(SIM[n] not in t for n in NAMES):
        return None
    model = {n: r["model_s"][f"{n}_s"] for n in NAMES}
    sim = {n: t[SIM[n]] for n in NAMES}
    best_model = min(NAMES, key=lambda n: model[n])  # ties: dense, allgather, oktopk (order)
    close = [n for n in NAMES if model[n] <= CLOSE * model[best_model]]
    auto = best_model if len(close) == 1 else min(close, key=lambda n: sim[n])
    fastest = min(NAMES, key=lambda n: sim[n])
    return {
        "topology": r["topology"], "gbps": r["gbps"], "link_latency_us": r["link_latency_us"],
        "nodes": r["nodes"], "density": r["density"], "elements": r["elements"],
        "label": r.get("label", "uniform"), "wire": r.get("wire", "float32"),
        "sim_ms": {n: sim[n] * 1e3 for n in NAMES}, "model_ms": {n: model[n] * 1e3 for n in NAMES},
        "fastest": fastest, "model_pick": best_model, "close": close, "auto": auto,
        "model_regret": sim[best_model] / sim[fastest], "auto_regret": sim[auto] / sim[fastest],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweeps", nargs="+")
    ap.add_argument("--out", help="JSON of every point (and a .csv beside it)")
    ap.add_argument("--skewed", action="store_true",
                    help="check the skew sweeps' points (selections of real gradients) instead")
    a = ap.parse_args()
    points = {}  # a point swept twice: the later file's
    for path in a.sweeps:
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict) or "close_factor" in data:
            continue  # not a sweep (the model's grid, the calibration, this script's own output)
        for r in data.get("points", []):
            if "times_s" not in r or "model_s" not in r or bool(r.get("label")) != a.skewed:
                continue
            key = (r["topology"], r["gbps"], r["link_latency_us"], r["density"], r["nodes"],
                   r["elements"], r.get("label", ""), r.get("wire", "float32"))
            points[key] = r
    rows, skipped = [], 0
    for key in sorted(points):
        c = check_point(points[key])
        if c is None:
            skipped += 1
        else:
            rows.append(c)
    groups = {}
    for c in rows:
        key = (c["topology"], c["gbps"], c["link_latency_us"], c["density"], c["label"], c["wire"],
               c["elements"])
        groups.setdefault(key, []).append(c)
    print("| platform | density | P simulated | fastest (P) | model decided / probed | "
          "model alone: worst | auto: worst |")
    print("|---|---|---|---|---|---|---|")
    for key in sorted(groups):
        g = sorted(groups[key], key=lambda c: c["nodes"])
        topo, gbps, lat, d, label, wire, elements = key
        wins = []
        for c in g:
            if wins and wins[-1][0] == c["fastest"]:
                wins[-1][2] = c["nodes"]
            else:
                wins.append([c["fastest"], c["nodes"], c["nodes"]])
        win_text = ", ".join(f"{n} ({lo}-{hi})" if lo != hi else f"{n} ({lo})" for n, lo, hi in wins)
        decided = sum(len(c["close"]) == 1 for c in g)
        mw = max(g, key=lambda c: c["model_regret"])
        aw = max(g, key=lambda c: c["auto_regret"])
        what = f", {label} {wire} {elements:,}" if a.skewed else ""
        print(f"| {topo}, {gbps:g} Gbit/s, {lat:g} us/link{what} | {d:g} | {g[0]['nodes']}-{g[-1]['nodes']} "
              f"| {win_text} | {decided} / {len(g) - decided} | {mw['model_regret']:.3f} (P={mw['nodes']}) "
              f"| {aw['auto_regret']:.3f} (P={aw['nodes']}) |")
    within = sum(c["auto_regret"] <= 1.10 for c in rows)
    model_within = sum(c["model_regret"] <= 1.10 for c in rows)
    probed = sum(len(c["close"]) > 1 for c in rows)
    print(f"\n{len(rows)} points with all three exchanges simulated ({skipped} without): auto within "
          f"10% of the fastest at {within}, the model alone at {model_within}; the model decided "
          f"{len(rows) - probed}, left {probed} to the probes; worst auto "
          f"{max(c['auto_regret'] for c in rows):.3f}, model alone "
          f"{max(c['model_regret'] for c in rows):.3f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"close_factor": CLOSE, "points": rows}, f, indent=1)
        with open(a.out.rsplit(".", 1)[0] + ".csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["topology", "gbps", "link_latency_us", "density", "nodes", "sim_dense_ms",
                        "sim_allgather_ms", "sim_oktopk_ms", "model_dense_ms", "model_allgather_ms",
                        "model_oktopk_ms", "fastest", "model_pick", "close", "auto",
                        "model_regret", "auto_regret"])
            for c in rows:
                w.writerow([c["topology"], c["gbps"], c["link_latency_us"], c["density"], c["nodes"]]
                           + [f"{c['sim_ms'][n]:.4f}" for n in NAMES]
                           + [f"{c['model_ms'][n]:.4f}" for n in NAMES]
                           + [c["fastest"], c["model_pick"], "+".join(c["close"]), c["auto"],
                              f"{c['model_regret']:.4f}", f"{c['auto_regret']:.4f}"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
