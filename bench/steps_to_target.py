#!/usr/bin/env python3
"""Collects the steps to the target of the main job's runs into one table, against DDP's (gloo)
steps on the same workload. It exists because steps to target, unlike time, do not depend on the
network or the load (training is deterministic), so each configuration can be its own short
loopback invocation of deploy/train_digits.py, one results directory per run:

    DIR/<model>/<run>/summary.json      (deploy/train_digits.py --model M --runs R --results ...)

and this script reads them all and writes DIR/summary.csv and DIR/summary.json: per model and run
the steps to the target (the first evaluation at or past it; evaluations come once per epoch, so
the figure is a multiple of the epoch's steps), the ratio to gloo's steps on that model, the
final and best accuracy or perplexity, the accuracy or perplexity after every epoch, and for /aF runs
the density each epoch ran at. A run that never reached the target within its epochs gets
no ratio ("never"). Usage: bench/steps_to_target.py [DIR] (default bench/results/steps_to_target).
"""

import csv
import glob
import json
import os
import sys


def per_epoch(run_dir):
    """The test perplexity (language model) or accuracy after each epoch, from the run's
    epochs.json (in the subdirectory the job names after the run)."""
    for path in glob.glob(os.path.join(run_dir, "**", "epochs.json"), recursive=True):
        with open(path) as f:
            epochs = json.load(f).get("epochs", [])
        return [round(e["test_ppl"] if e.get("test_ppl") is not None else e["test_acc"], 1) for e in epochs]
    return []


def load(root):
    rows = []
    for model in sorted(os.listdir(root)):
        mdir = os.path.join(root, model)
        if not os.path.isdir(mdir):
            continue
        for run in sorted(os.listdir(mdir)):
            path = os.path.join(mdir, run, "summary.json")
            if not os.path.exists(path):
                continue
            with open(path) as f:
                for r in json.load(f):
                    spe = r["steps"] // r["epochs"]
                    e = r.get("epochs_to_target")
                    rows.append({"model": model, "run": r["label"], "dir": run, "epochs": r["epochs"],
                                 "steps_per_epoch": spe, "target": r["target"],
                                 "steps_to_target": e * spe if e is not None else None,
                                 "final": r["final"], "best_acc": round(r["best_acc"], 2),
                                 "best_ppl": r.get("best_ppl"), "step_ms_loopback": round(r["step_ms"], 1),
                                 "achieved_density": r.get("achieved_density"),
                                 "per_epoch": " ".join(str(v) for v in per_epoch(os.path.join(mdir, run))),
                                 "adaptive_densities": " ".join(str(a["density"]) for a in r.get("adaptive", []))})
    return rows


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "bench/results/steps_to_target"
    rows = load(root)
    base = {r["model"]: r["steps_to_target"] for r in rows if r["run"] == "gloo"}
    for r in rows:
        b, s = base.get(r["model"]), r["steps_to_target"]
        r["ratio_to_ddp"] = round(s / b, 3) if b and s is not None else None
    keys = list(rows[0]) if rows else []
    with open(os.path.join(root, "summary.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(root, "summary.json"), "w") as f:
        json.dump(rows, f, indent=1)
    for r in rows:
        steps = r["steps_to_target"] if r["steps_to_target"] is not None else f"never in {r['epochs']} epochs"
        ratio = f"{r['ratio_to_ddp']:.2f}x" if r["ratio_to_ddp"] is not None else "-"
        print(f"{r['model']:5} {r['run']:24} steps to {r['target']}: {steps!s:>18}  x DDP {ratio:>6}  final {r['final']}")


if __name__ == "__main__":
    main()
