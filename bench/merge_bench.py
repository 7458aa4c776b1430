#!/usr/bin/python3
"""Gradient merging: one training step of ResNet-50's layers on real daemons, per merger
(a program, not a test; issue 14 item 7).

The step: every node's trainer (client/spex_trainer --mode=overlap) has one bucket per ResNet-50
parameter tensor (161 buckets, 25,557,032 floats; ids in the order backprop produces them) and
hands each in at the moment a backprop profile says its gradient is ready, then waits for every
result, as PyTorch DDP's communication hook does. The profile is
bench/results/resnet50_backward.json (bench/resnet50_profile.py: each tensor's ready time as a
fraction of a backward pass of PyTorch's own autograd on a hand-written ResNet-50); the step is a
--forward_ms forward pass (no buckets) and a --backward_ms backward pass scaled from it, both
slept, not computed, so they take no core from the daemons. Inputs are gradient-like (written
once, kept). `--nodes` spexd under one mpirun per run (--threads=1, --dense_fallback=off, every
other flag at its default: tensors under --min_sparse_elements, the batch norms and biases, go
dense), --compressor at --density.

Per merger of --mergers (none, fixed, omgs, rgmerge, each at its defaults, so with
--merge_overlap; rgmerge_model is rgmerge --rgmerge_plan=model and omgs_mgs omgs --omgs_mode=mgs,
each with its plan agreed at step --warmup - 1; omgs_ahead is omgs --omgs_select=ahead;
rgmerge_linger is rgmerge --rgmerge_linger=auto; rgmerge_late / rgmerge_early are rgmerge with
--rgmerge_bind=late / early; NAME_serial, e.g. rgmerge_serial, is NAME with
--merge_overlap=false; NAME_block is NAME with --mpi_wait_max_sleep_us=0, every collective
waiting inside MPI, spexd's default before the size-dependent wait; NAME_allpassive is NAME with
--mpi_passive_wait_min_bytes=0, every collective waiting passively), two arrival schedules: `even` (every node's trainer on the profile) and
`skewed` (node N-1's trainer --late_ms late on every bucket). Runs go in the order given, then again reversed (ABBA), and
both halves' steps are pooled. Per (schedule, merger), over the steps after --warmup:
  step_ms      the step from its start to every result, the slowest node per step (p50)
  tail_ms      from a node's last bucket handed in to its last result: the communication backprop
               did not hide (p50, on the node that handed in last, i.e. the late one when skewed)
  wait_ms      what the other nodes' tail adds to that: waiting for the slowest node (p50)
  exchanges    exchanges per step of node 0's engine (spex_merge_groups_total: one per merge
               group or bucket exchanged alone; counted over every step, warm-up included)
  reduces_reused_per_step  node 0's group members whose local reduce a later round reused
               (spex_merge_reduces_reused_total; in the JSON: offered by node 0 but left by the
               round for a later group)
  busy_ms      the engine's time in those exchanges per step (spex_merge_group_seconds_total:
               each group from its round to its publish; with --merge_overlap one group's time
               on the wire and the next group's preparation overlap, so the sum can exceed the
               step: compare busy_ms and overlap only between runs with the same setting)
  overlap      1 - tail_ms / busy_ms, clamped to [0, 1]: the share of the engine's exchange time
               hidden behind the backward pass
  phase_ms     node 0's time per step in each exchange phase (spex_merge_phase_seconds_total: once
               per group; every step): reduce_local, compress (the selection), collective (the
               wire, waiting for the other nodes included), decode, publish (printed: compress
               and collective)
and each merger's step time over none's (the same run's). NAME@LABEL (e.g. rgmerge@2) runs NAME
again under its own label, as the same configuration's twin in the same run: its ratio to NAME
(printed, and stored as aa_even / aa_skewed) is the measure's own noise (an A/A check).
Goals (issue 14): rgmerge's step time below each of none, fixed and omgs under skew, and no worse
than the best of them when even.

    /usr/bin/python3 bench/merge_bench.py [--nodes 4] [--mergers none,fixed,omgs,rgmerge]
        [--compressor topk] [--density 0.01] [--forward_ms 60] [--backward_ms 120] [--late_ms 30]
        [--warmup 5] [--steps 20] [--scale 1] [--repeat 1] [--spexd PATH] [--spex_trainer PATH] [--skip_build] [--out bench/results/merge]
    .venv/bin/python bench/merge_bench.py --network emulated [--rate 1gbit] [--latency_us 500] ...

With --network emulated (root; the spex package, hence .venv/bin/python) every node is a host of
the emulated cluster (deploy/emulated_cluster.sh: a network namespace, --rate each way and
--latency_us one way, a core per host where the machine has one) and each trainer runs inside its
host; by default the daemons run on this machine's loopback.

On this 2-core machine the daemons' compression of every node shares two cores (4 nodes: each
node's selection over 25.6M floats waits for the others'), so the exchanges take longer than on a
cluster with a core per node; on loopback there is no bandwidth or latency to save: the figures
compare the mergers with each other under the same handicap. Writes <out>.json and <out>.png.
"""
import argparse
import csv
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")


def build():
    subprocess.run(["bazel", "build", "//daemon:spexd", "//client:spex_trainer"], cwd=ROOT, check=True)


def metric_of(text, name):
    """The value of a node-wide sample `name` in a /metrics page."""
    for line in text.splitlines():
        m = re.match(rf"^{name}(\{{[^}}]*\}})? (\S+)$", line)
        if m:
            return float(m.group(2))
    raise RuntimeError(f"{name} not in the metrics")


def phases_of(text):
    """Seconds per exchange phase, once per merge group (spex_merge_phase_seconds_total), in a
    /metrics text."""
    out = {}
    for line in text.splitlines():
        m = re.match(r'^spex_merge_phase_seconds_total\{[^}]*phase="([a-z_]+)"[^}]*\} (\S+)$', line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def reused_of(text):
    """spex_merge_reduces_reused_total of a /metrics text; NaN from a spexd without it."""
    try:
        return metric_of(text, "spex_merge_reduces_reused_total")
    except RuntimeError:
        return float("nan")


def metrics_text(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def metric(port, name):
    """The value of a node-wide sample `name` from spexd's /metrics on 127.0.0.1:port."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return metric_of(r.read().decode(), name)


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trainer_cmd(args, socket, n, d, sizes, arrival_file, late_us):
    return [TRAINER, f"--socket={socket}",
            "--mode=overlap", f"--buckets={','.join(map(str, sizes))}", f"--arrival_us=@{arrival_file}",
            f"--late_us={late_us if n == args.nodes - 1 else 0}", "--inputs=gradient",
            f"--compressor={args.compressor}", f"--density={args.density}",
            f"--steps={args.warmup + args.steps}", "--quiet", f"--csv={d}/steps{n}.csv"]


def read_rows(args, d):
    rows = []
    for n in range(args.nodes):
        with open(f"{d}/steps{n}.csv") as f:
            rows += [dict(r, node=n) for r in csv.DictReader(f)]
    return rows


# The trainer binary (--spex_trainer).
TRAINER = os.path.join(ROOT, "bazel-bin/client/spex_trainer")


# rgmerge with one flag changed, by --mergers name.
RGMERGE_VARIANTS = {"rgmerge_linger": ["--rgmerge_linger=auto"], "rgmerge_late": ["--rgmerge_bind=late"],
                    "rgmerge_early": ["--rgmerge_bind=early"]}


def merger_flags(merger, args):
    """spexd's flags for a --mergers entry: NAME, or NAME_serial (the same merger with
    --merge_overlap=false: every group's collectives on the engine thread). rgmerge_model is
    rgmerge --rgmerge_plan=model with the plan agreed at step --warmup - 1, so it runs from the
    first measured step on."""
    flags = []
    merger = merger.split("@", 1)[0]  # NAME@LABEL: NAME again under another label (an A/A twin)
    if merger.endswith("_block"):
        merger = merger[:-len("_block")]
        flags.append("--mpi_wait_max_sleep_us=0")
    elif merger.endswith("_allpassive"):
        merger = merger[:-len("_allpassive")]
        flags.append("--mpi_passive_wait_min_bytes=0")
    if merger.endswith("_serial"):
        merger = merger[:-len("_serial")]
        flags.append("--merge_overlap=false")
    plan_step = f"--merge_plan_step={max(1, args.warmup - 1)}"
    if merger == "rgmerge_model":
        merger = "rgmerge"
        flags += ["--rgmerge_plan=model", plan_step]
    elif merger == "omgs_mgs":
        merger = "omgs"
        flags += ["--omgs_mode=mgs", plan_step]
    elif merger == "omgs_ahead":
        merger = "omgs"
        flags += ["--omgs_select=ahead"]
    elif merger in RGMERGE_VARIANTS:
        flags += RGMERGE_VARIANTS[merger]
        merger = "rgmerge"
    return [f"--merger={merger}", *flags]


def run_once_emulated(args, merger, sizes, arrival_file, late_us):
    """run_once on the emulated cluster: one host (network namespace, --rate each way, --latency_us
    one way) per node, spexd under mpirun across the hosts, each trainer inside its host. The
    metrics port is picked free in this namespace, not in the hosts' own: a daemon that cannot bind
    it there fails at start, and the run starts again on another port (three tries)."""
    from spex.errors import SpexError
    for attempt in range(3):
        try:
            return run_once_emulated_port(args, merger, sizes, arrival_file, late_us)
        except SpexError as e:
            if "--metrics_address" not in str(e) or attempt == 2:
                raise
            print(f"  {merger}: metrics port taken inside a host, starting again", flush=True)


def run_once_emulated_port(args, merger, sizes, arrival_file, late_us):
    from spex.emulated import EmulatedCluster

    d = tempfile.mkdtemp(prefix="spex-merge.")
    port = free_port()
    c = EmulatedCluster(args.spexd, hosts=args.nodes, trainers=1,
                        rate=args.rate, latency_us=args.latency_us,
                        args=["--threads=1", "--dense_fallback=off", "--log_level=warning", *merger_flags(merger, args),
                              f"--metrics_address=127.0.0.1:{port}"])
    try:
        c.start()
        trainers = []
        for n in range(args.nodes):
            trainers.append(c.popen(n, trainer_cmd(args, c.socket(n), n, d, sizes, arrival_file, late_us),
                                    stdout=subprocess.DEVNULL, stderr=open(f"{d}/trainer{n}.err", "w")))
        for t in trainers:
            t.wait()
        for n, t in enumerate(trainers):
            if t.returncode != 0:
                raise RuntimeError(f"trainer {n} failed: {open(f'{d}/trainer{n}.err').read()[-2000:]}")
        # Node 0's metrics, read from inside its host (the daemon listens in that namespace).
        fetch = c.popen(0, ["/usr/bin/python3", "-c", "import sys, urllib.request; sys.stdout.write("
                            f"urllib.request.urlopen('http://127.0.0.1:{port}/metrics', timeout=10).read().decode())"],
                        stdout=subprocess.PIPE, text=True)
        text, _ = fetch.communicate(timeout=30)
        groups, busy = metric_of(text, "spex_merge_groups_total"), metric_of(text, "spex_merge_group_seconds_total")
        return read_rows(args, d), groups, busy, phases_of(text), reused_of(text)
    finally:
        c.cleanup()
        shutil.rmtree(d, ignore_errors=True)


def run_once(args, merger, sizes, arrival_file, late_us):
    """One mpirun of the daemons with --merger=merger, one trainer per node; returns the per-step
    rows of every node and node 0's engine counters."""
    if args.network == "emulated":
        return run_once_emulated(args, merger, sizes, arrival_file, late_us)
    d = tempfile.mkdtemp(prefix="spex-merge.")
    port = free_port()
    log = open(os.path.join(d, "spexd.log"), "w")
    daemons = subprocess.Popen(
        ["mpirun", "-np", str(args.nodes), args.spexd,
         f"--socket={d}/node{{rank}}.sock", "--local_trainers=1", "--threads=1", "--dense_fallback=off",
         "--log_level=info" if merger.startswith(("rgmerge_model", "omgs_mgs")) else "--log_level=warning",
         *merger_flags(merger, args), f"--metrics_address=127.0.0.1:{port}"],
        env=ENV, stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            if all(os.path.exists(f"{d}/node{n}.sock") for n in range(args.nodes)):
                break
            if daemons.poll() is not None:
                raise RuntimeError(open(log.name).read())
            time.sleep(0.1)
        else:
            raise RuntimeError("daemons did not start")
        trainers = []
        for n in range(args.nodes):
            cmd = trainer_cmd(args, f"{d}/node{n}.sock", n, d, sizes, arrival_file, late_us)
            trainers.append(subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL,
                                             stderr=open(f"{d}/trainer{n}.err", "w")))
        for t in trainers:
            t.wait()
        for n, t in enumerate(trainers):
            if t.returncode != 0:
                raise RuntimeError(f"trainer {n} failed: {open(f'{d}/trainer{n}.err').read()[-2000:]}")
        # The metrics of node 0 (the first daemon of the host serves on `port`).
        text = metrics_text(port)
        groups = metric_of(text, "spex_merge_groups_total")
        busy = metric_of(text, "spex_merge_group_seconds_total")
        if merger.startswith(("rgmerge_model", "omgs_mgs")):
            log.flush()
            plans = [l.split("): ", 1)[-1].strip() for l in open(log.name) if "plan over" in l]
            if not plans:
                raise RuntimeError(f"{merger}: no daemon logged its plan: {open(log.name).read()[-2000:]}")
            print(f"  {merger} plan (node log): {plans[0]}", flush=True)
        return read_rows(args, d), groups, busy, phases_of(text), reused_of(text)
    finally:
        if daemons.poll() is None:
            daemons.send_signal(signal.SIGTERM)
            try:
                daemons.wait(timeout=60)
            except subprocess.TimeoutExpired:
                daemons.kill()
                daemons.wait()
        log.close()
        shutil.rmtree(d, ignore_errors=True)


def summarize(args, runs):
    """runs: [(rows, groups, busy, phases, reused, round)] of one (schedule, merger), pooled."""
    step, tail, wait = [], [], []
    groups = busy = reused = 0.0
    total_steps = 0
    phases = {}
    for rows, g, b, ph, ru, _ in runs:
        groups += g
        busy += b
        reused += ru
        for k, v in ph.items():
            phases[k] = phases.get(k, 0.0) + v
        total_steps += args.warmup + args.steps
        by_step = {}
        for r in rows:
            s = int(r["step"])
            if s >= args.warmup:
                by_step.setdefault(s, []).append(r)
        for s, rs in by_step.items():
            if len(rs) != args.nodes:
                continue
            ms = [float(r["exchange_ms"]) for r in rs]
            tails = [float(r["exchange_ms"]) - float(r["last_start_ms"]) for r in rs]
            # The node that handed in last (largest last-start on the shared monotonic clock).
            ends = [int(r["start_ns"]) / 1e6 + float(r["last_start_ms"]) for r in rs]
            last = max(range(len(rs)), key=lambda i: ends[i])
            step.append(max(ms))
            tail.append(tails[last])
            others = [tails[i] for i in range(len(rs)) if i != last]
            wait.append(statistics.median(others) - tails[last] if others else 0.0)
    busy_ms = busy / total_steps * 1e3
    t = statistics.median(tail)
    return {
        "step_ms": statistics.median(step),
        "step_ms_p90": sorted(step)[int(0.9 * (len(step) - 1))],
        "tail_ms": t,
        "wait_ms": statistics.median(wait),
        "exchanges_per_step": groups / total_steps,
        # Node 0's merge group members whose local reduce a later round reused, per step.
        "reduces_reused_per_step": reused / total_steps,
        "busy_ms": busy_ms,
        "overlap": max(0.0, min(1.0, 1.0 - t / busy_ms)) if busy_ms > 0 else 0.0,
        "steps": len(step),
        # Node 0's time per step in each exchange phase, summed over its buckets (every step,
        # warm-up included): compress is the selection's compute, collective the wire.
        "phase_ms": {k: v / total_steps * 1e3 for k, v in sorted(phases.items())},
    }


def plot(result, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    schedules = list(result["schedules"])
    mergers = result["mergers"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in ((axes[0], "step_ms", "step time, p50 (ms)"), (axes[1], "exchanges_per_step", "exchanges per step")):
        w = 0.8 / len(mergers)
        for i, m in enumerate(mergers):
            ax.bar([j + i * w for j in range(len(schedules))], [result["schedules"][s][m][key] for s in schedules],
                   w, label=m)
        ax.set_xticks([j + 0.4 - w / 2 for j in range(len(schedules))])
        ax.set_xticklabels(schedules)
        ax.set_ylabel(label)
    axes[0].legend()
    net = "loopback" if result.get("network", "loopback") == "loopback" else \
        f"emulated hosts, {result['rate']}, +{result['latency_us']} us one way"
    fig.suptitle(f"ResNet-50 step on {result['nodes']} daemons ({net}, {result['cores']} cores): "
                 f"{result['compressor']}@{result['density']}, backward {result['backward_ms']} ms")
    fig.tight_layout()
    fig.savefig(out + ".png", dpi=100)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--mergers", default="none,fixed,omgs,rgmerge")
    ap.add_argument("--compressor", default="topk")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--forward_ms", type=float, default=60)
    ap.add_argument("--backward_ms", type=float, default=120)
    ap.add_argument("--late_ms", type=float, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every tensor's size (a smaller model)")
    ap.add_argument("--profile", default=os.path.join(ROOT, "bench/results/resnet50_backward.json"))
    ap.add_argument("--network", choices=("loopback", "emulated"), default="loopback",
                    help="emulated: one emulated host per node (deploy/emulated_cluster.sh; root, and the "
                         "spex package: run with .venv/bin/python)")
    ap.add_argument("--rate", default="1gbit", help="--network=emulated: each host's rate, each way")
    ap.add_argument("--latency_us", type=int, default=0, help="--network=emulated: one-way latency per host")
    ap.add_argument("--repeat", type=int, default=1,
                    help="ABBA rounds: each round runs every merger twice per schedule; with more than one, "
                         "rgmerge's ratio to the best other merger is also given per round (median, min, max)")
    ap.add_argument("--spex_trainer", default=None,
                    help="the trainer binary (default bazel-bin/client/spex_trainer; a copy that a rebuild "
                         "cannot replace mid-run)")
    ap.add_argument("--spexd", default=os.path.join(ROOT, "bazel-bin/daemon/spexd"),
                    help="the daemon binary (another build, to compare two versions)")
    ap.add_argument("--skip_build", action="store_true")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/merge"))
    args = ap.parse_args()
    if args.spex_trainer:
        global TRAINER
        TRAINER = args.spex_trainer
    if not args.skip_build:
        build()
    profile = json.load(open(args.profile))
    sizes = [max(1, int(t["elements"] * args.scale)) for t in profile["ready"]]
    arrival = [int((args.forward_ms + t["fraction"] * args.backward_ms) * 1e3) for t in profile["ready"]]
    mergers = args.mergers.split(",")
    fd, arrival_file = tempfile.mkstemp(prefix="spex-arrival.")
    with os.fdopen(fd, "w") as f:
        f.write(",".join(map(str, arrival)))
    schedules = {"even": 0, "skewed": int(args.late_ms * 1e3)}
    raw = {s: {m: [] for m in mergers} for s in schedules}
    t0 = time.time()
    try:
        for rnd in range(max(1, args.repeat)):
            for order in (mergers, mergers[::-1]):
                for s, late in schedules.items():
                    for m in order:
                        raw[s][m].append(run_once(args, m, sizes, arrival_file, late) + (rnd,))
                        print(f"  round {rnd} {s:6} {m:15} done ({time.time() - t0:.0f} s)", flush=True)
    finally:
        os.unlink(arrival_file)
    result = {"nodes": args.nodes, "network": args.network, "compressor": args.compressor, "density": args.density,
              "forward_ms": args.forward_ms, "backward_ms": args.backward_ms, "late_ms": args.late_ms,
              "buckets": len(sizes), "elements": sum(sizes), "warmup": args.warmup, "steps": args.steps,
              "cores": os.cpu_count(), "mergers": mergers, "profile": os.path.relpath(args.profile, ROOT),
              "seconds": time.time() - t0, "schedules": {}}
    if args.network == "emulated":
        result.update(rate=args.rate, latency_us=args.latency_us)
    for s in schedules:
        result["schedules"][s] = {m: summarize(args, raw[s][m]) for m in mergers}
        base = result["schedules"][s].get("none")
        print(f"{s} arrival ({len(sizes)} buckets, {sum(sizes):,} floats, {args.nodes} daemons"
              f"{', node %d %g ms late' % (args.nodes - 1, args.late_ms) if schedules[s] else ''}):")
        print(f"  {'merger':15} {'step ms':>8} {'/none':>6} {'tail ms':>8} {'wait ms':>8} {'exch/step':>9} "
              f"{'busy ms':>8} {'overlap':>7} {'select ms':>9} {'wire ms':>8}")
        for m in mergers:
            r = result["schedules"][s][m]
            if base:
                r["step_vs_none"] = r["step_ms"] / base["step_ms"]
            print(f"  {m:15} {r['step_ms']:8.1f} {r.get('step_vs_none', float('nan')):6.3f} {r['tail_ms']:8.1f} "
                  f"{r['wait_ms']:8.1f} {r['exchanges_per_step']:9.1f} {r['busy_ms']:8.1f} {r['overlap']:7.2f} "
                  f"{r['phase_ms'].get('compress', 0.0):9.1f} {r['phase_ms'].get('collective', 0.0):8.1f}")
    if "rgmerge" in mergers:
        for s in schedules:
            rs = result["schedules"][s]
            # Not rgmerge's variants, and no A/A twin (a second draw of the same merger would
            # lower the best of the others by chance alone).
            others = [m for m in mergers if not m.startswith("rgmerge") and "@" not in m]
            best = min(rs[m]["step_ms"] for m in others) if others else float("nan")
            result[f"rgmerge_vs_best_other_{s}"] = rs["rgmerge"]["step_ms"] / best
            print(f"{s}: rgmerge / best of {','.join(others)} = {rs['rgmerge']['step_ms'] / best:.3f}")
            if args.repeat > 1 and others:
                # Per ABBA round: the same ratio from that round's runs alone, so the spread between
                # rounds shows how far one round's figure can be trusted.
                ratios = []
                for rnd in range(args.repeat):
                    per = {m: summarize(args, [r for r in raw[s][m] if r[-1] == rnd])["step_ms"]
                           for m in ["rgmerge", *others]}
                    ratios.append(per["rgmerge"] / min(per[m] for m in others))
                result[f"rgmerge_vs_best_other_{s}_rounds"] = ratios
                print(f"{s}: per round {' '.join(f'{x:.3f}' for x in ratios)}; median "
                      f"{statistics.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}")
    # A/A: NAME@LABEL runs exactly NAME, so its ratio to NAME is this machine's noise at that
    # number of steps: a difference between two mergers smaller than it is not resolved.
    twins = [m for m in mergers if "@" in m and m.split("@", 1)[0] in mergers]
    for s in schedules:
        rs = result["schedules"][s]
        for m in twins:
            a = m.split("@", 1)[0]
            ratio = rs[m]["step_ms"] / rs[a]["step_ms"]
            result.setdefault(f"aa_{s}", {})[m] = ratio
            print(f"{s}: A/A {m} / {a} = {ratio:.3f} (the same configuration twice)")
    print(f"({os.cpu_count()} cores shared by every daemon's compression, "
          f"{'loopback links' if args.network == 'loopback' else 'emulated links'}: see the header)")
    with open(args.out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    plot(result, args.out)
    print(f"wrote {args.out}.json and {args.out}.png")


if __name__ == "__main__":
    sys.exit(main())
