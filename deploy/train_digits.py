#!/usr/bin/env python3
"""The main job: real data-parallel training through spex, against plain PyTorch DDP. Starts a
spex cluster (spexd under mpirun, default 2 nodes x 2 trainers) -- by default on emulated hosts
(--network=emulated: one network namespace per node on a bridge, 1 Gbit/s each way, every node's
trainers inside its host, so DDP's own gloo all-reduce crosses the same slow links as spex), or on
this machine's loopback (--network=loopback) -- then trains a model (--model: an MLP on
scikit-learn's digits, a word-level LSTM language model on Debian's fortunes text, or a CNN on
Fashion-MNIST from Debian's dataset-fashion-mnist; mainjob/models.py) with PyTorch DDP (gloo
process group, one process per trainer) once per run in --runs (default: `gloo` = DDP's own
all-reduce, what a user runs without spex; PyTorch's own compression hooks `fp16` and
`powersgd:1`, what a DDP user on a slow network would try next; `dense` = spex without
compression; `micro` at density 0.1, which reached each workload's target in DDP's steps), printing one line per epoch (loss, test accuracy, step
time, exchange time, achieved density from GetStats) and a comparison table (time per step, time
to --target-acc, final accuracy, speed-up over the first run, DDP); writes per-step and per-epoch
CSVs, summary.json and a PNG plot (accuracy against wall-clock time) under --results.

Runs: NAME[:DENSITY][/MOD...] with NAME a spexd compressor (dense, micro, topk, dgc, sidco_e, ...;
modifiers: /wN DGC's density warm-up, 4x the target per remaining epoch over the first N epochs;
/aF Accordion's adaptive density, F times the target in critical epochs (the first two, and any
after which the norm of the update accumulated over the last epoch differed from the epoch
before's by half or more), the target otherwise;
/mc DGC's momentum correction (the hook's momentum_correction=--momentum), the momentum kept per trainer before the exchange and the optimizer
run without it; /lm the same without momentum factor masking (the hook's momentum_masking=False: local
momentum before error feedback), the optimizer
run without it; /layer one DDP bucket per parameter tensor, so selection is layer-wise; /global one
DDP bucket for the whole model, so selection is global; without either, DDP's 25 MB buckets), or a
PyTorch peer registered as its documentation says: `gloo` (plain DDP all-reduce, no spex), `fp16`
(fp16_compress_hook), `bf16` (bf16_compress_hook; skipped, saying why, where this torch's gloo
cannot all-reduce bfloat16, as torch 1.13's cannot), `powersgd[:RANK]` (powerSGD_hook,
matrix_approximation_rank RANK (default 1), error feedback and warm start on, plain all-reduce
for the first 10% of the steps as PyTorch advises). PowerSGD over gloo hangs or fails ("op.preamble
.length <= op.nbytes") with several DDP buckets: the hook issues its P and Q all-reduces from
future callbacks, and with two buckets those callbacks issue them in different orders on
different ranks (TRAIN_DIGITS_TRACE_COLLECTIVES=1 prints every rank's collectives: the 6th was
(2000,) on ranks 0 and 2 and (2010,) on ranks 1 and 3), so gloo pairs mismatched collectives.
powersgd runs therefore put the whole model in one DDP bucket (bucket_cap_mb, and
dist._DEFAULT_FIRST_BUCKET_BYTES, which caps DDP's first bucket at 1 MB after its rebuild and which
DDP's source says users may set; --powersgd-buckets ddp keeps DDP's bucketing to see the failure). A compressor (or --param) the daemon does not accept stops
the job before training, with the daemon's list of accepted names. The daemons run with
--dense_fallback=off --min_sparse_elements=1024 --fp16_values unless --spexd-arg says otherwise, so
that a sparse run is really sparse (and its values travel as float16); every bucket a sparse run exchanged dense is reported with the reason
(under --min_sparse_elements, or the daemon's dense-fallback probe), and the table shows the
achieved density from GetStats.

    python3 deploy/train_digits.py --spexd bazel-bin/daemon/spexd [--runs gloo,fp16,powersgd:1,dense,micro:0.1]
        [--network emulated|loopback] [--nodes 2] [--rate 1gbit] [--latency-us 0] [--trainers 2]
        [--epochs 4] [--hidden 3200] [--target-acc 95] [--results DIR]

Needs the spex package (client/python; deploy/main_job.sh installs it into .venv). This file is
the program; its parts are the package mainjob/ beside it (flags, runs, models, hooks, the
training of one run, the launcher, the report).
"""

import json
import os
import signal
import sys
from typing import Any, Dict, List, Optional

# The package mainjob/ beside this file (also when started by path from elsewhere, as each
# trainer process is).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mainjob import report  # noqa: E402
from mainjob.cli import DEFAULT_SPEXD_ARGS, parse_args, resolve_defaults  # noqa: E402
from mainjob.launch import check_compressor, launch, open_cluster  # noqa: E402
from mainjob.models import WORKLOADS  # noqa: E402
from mainjob.runs import is_peer, parse_runs  # noqa: E402
from mainjob.train import worker  # noqa: E402


def compressor_params(args) -> Dict[str, str]:
    params = {}
    for kv in args.param:
        k, eq, v = kv.partition("=")
        if not eq or not k:
            sys.exit(f"train_digits: --param {kv!r} is not KEY=VALUE")
        params[k] = v
    return params


def plan_runs(runs: List[Dict[str, Any]], cluster, args, out: str) -> Optional[int]:
    """Checks every spex run's compressor with the daemon and makes each run's directory; an exit
    status (2) when the daemon refuses one, else None."""
    for run in runs:
        if not is_peer(run):
            why = check_compressor(cluster.socket(0), args.trainers, run)
            if why is not None:
                print(f"train_digits: ERROR: run {run['label']}: {why}", flush=True)
                return 2
        run["out"] = os.path.join(out, run["label"].replace("@", "_").replace("/", "_"))
        os.makedirs(run["out"], exist_ok=True)
    return None


def finish(runs, args, out: str, wall: float, title: str, pinned: str) -> int:
    """Summarises, writes and prints the results; 1 when any run's parameters differed between ranks."""
    results = [report.summarize(run, args.nodes * args.trainers, args.target_acc,
                                args.target_ppl if args.model == "lstm" else None) for run in runs]
    for r in results:
        if "unsupported" in r:
            print(f"train_digits: run {r['label']} was not run: {r['unsupported']}")
    results = [r for r in results if "unsupported" not in r]
    if results:
        report.write_outputs(results, out, title)
        report.print_table(results)
        report.print_speedup_table(results)
        report.print_layer_table(results)
        print(report.honesty_note(args, os.cpu_count() or 1, pinned))
    print(f"\ntraining processes ran {wall:.1f} s for {len(results)} run(s)")
    print(f"per-step CSV: {out}/steps.csv, per-epoch CSV: {out}/epochs.csv, plot: {out}/train_digits.png, "
          f"summary: {out}/summary.json, daemon log: {out}/spexd.log")
    bad = [r["label"] for r in results if not r["params_identical"]]
    if bad:
        print(f"ERROR: parameters differ between ranks in run(s) {', '.join(bad)}")
        return 1
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv, __doc__.split("\n\n")[0])
    if args.worker is not None:
        worker(json.loads(args.worker))
        # Everything is written and the process group destroyed: leave without finalizing the
        # interpreter. In torch 1.13 a gloo worker thread that holds the last reference to a
        # tensor made in Python takes the GIL to free it, and during finalization that ends in
        # "terminate called without an active exception" (SIGABRT), which failed a whole main job
        # after its last run (once in about 20 invocations on 2026-11-30).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    runs = parse_runs(args.runs)
    resolve_defaults(args)
    # SIGTERM unwinds like Ctrl-C, so the cluster (and on emulated hosts the network) is torn down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = os.path.abspath(args.results or os.path.join(repo, "bench", "results", "train_digits"))
    os.makedirs(out, exist_ok=True)
    spexd_args = args.spexd_arg or DEFAULT_SPEXD_ARGS
    params = compressor_params(args)
    for run in runs:
        if run["compressor"] != "dense" and not is_peer(run):
            run["params"] = params
    model_desc, n_params = WORKLOADS[args.model].describe(args)
    where = (f"emulated hosts at {args.rate} each way" + (f", +{args.latency_us} us one-way" if args.latency_us else "")
             if args.network == "emulated" else "this machine's loopback")
    print(f"train_digits: {args.nodes} nodes x {args.trainers} trainers on {where} (DDP over gloo, "
          f"{args.nodes * args.trainers} processes), {model_desc}, "
          f"{args.epochs} epochs, batch {args.batch}/process, runs: {', '.join(r['label'] for r in runs)}; "
          f"spexd {' '.join(spexd_args)}; results in {out}", flush=True)
    cluster_cm = open_cluster(args, spexd_args, out)
    if cluster_cm is None:
        return 3
    pinned = ""
    with cluster_cm as cluster:
        if args.network == "emulated":
            print(f"train_digits: {cluster.description}", flush=True)
        else:
            pinned = cluster.pin_description()
            print(f"train_digits: {pinned}", flush=True)
        status = plan_runs(runs, cluster, args, out)
        if status is not None:
            return status
        wall = launch(runs, args, cluster, os.path.abspath(__file__))
    title = (f"{args.nodes} nodes x {args.trainers} trainers, {where}, {model_desc.split(' (')[0]} "
             f"{n_params / 1e6:.1f}M parameters, {os.cpu_count() or 1} cores")
    return finish(runs, args, out, wall, title, pinned)


if __name__ == "__main__":
    sys.exit(main())
