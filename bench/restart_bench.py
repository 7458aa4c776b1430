#!/usr/bin/env python3
"""What a failure costs a job under `spexrun --max-restarts`: on emulated hosts (3 x 2 trainers
by default), the main job's MLP on scikit-learn's digits (deploy/mainjob/models.py, DigitsMLP)
trained through spex with a checkpoint every --ckpt-every steps, as docs/checkpoint.md's
resilient script does (one file, rank 0 writes it, every rank loads it after a restart). Three
runs, each started through the launcher library (spex.launcher):

- uninterrupted: the reference;
- same-size: one host's daemon SIGKILLed once the job passed --kill-at steps; spexrun restarts
  the same world;
- smaller: the same failure with --min-hosts 2: the restart leaves the failed host out and runs
  on 2 hosts, the 3-host world's checkpoint resized onto them by the hook (where the hook
  refuses it, the script continues with fresh spex state, and the JSON says so).

For each: the time from the kill to the first completed step of the restarted job (spexrun's
stop, the emulated cluster rebuilt, daemons, torch imports, process group, checkpoint load, the
step), split into the kill to spexrun's decision to restart, to the trainers started again (every
new daemon answering), and to the trainers resumed (checkpoint loaded); the steps lost (the last step completed before the failure minus the step resumed from),
and the final test accuracy against the uninterrupted run's at the same step count. Writes JSON
(--out). A benchmark, not a test: run it by hand, as root (network namespaces), with the spex
package installed (deploy/main_job.sh's venv) and spexd built:

    nice -n 10 .venv/bin/python bench/restart_bench.py --spexd bazel-bin/daemon/spexd
"""

import argparse
import glob
import json
import os
import shutil
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The trainer: docs/checkpoint.md's resilient loop on the main job's MLP. Every completed step
# appends "step wall-time" to the rank's log of this start; rank 0 evaluates at the end.
TRAINER = r'''
import json, os, sys, time
import torch, torch.distributed as dist
sys.path.insert(0, os.path.join(os.environ["BENCH_REPO"], "deploy"))
from mainjob.models import DigitsMLP
import spex, spex.torch

cfg = json.loads(os.environ["BENCH_CFG"])
os.chdir(cfg["dir"])
restart = int(os.environ["SPEX_RESTART_COUNT"])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
work = DigitsMLP()
data = work.load({"seed": 0})
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(work.build({"hidden": cfg["hidden"]}))
spex_state = spex.torch.register(model, compressor=cfg["compressor"], density=cfg["density"])
opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=0.9)
ckpt, start, fresh = "ckpt.pt", 0, ""
if os.path.exists(ckpt):
    saved = torch.load(ckpt)
    model.load_state_dict(saved["model"]), opt.load_state_dict(saved["opt"])
    try:
        spex_state.load_state_dict(saved["spex"])
    except spex.SpexValueError as e:
        fresh = str(e)
    start = saved["step"]
log = open(f"log-r{restart}-rank{rank}.txt", "a", buffering=1)
log.write(f"start {start} {world} {time.time()} {json.dumps(fresh)}\n")
n = data[0].shape[0]
for step in range(start, cfg["steps"]):
    g = torch.Generator().manual_seed(step * 1000 + rank)
    idx = torch.randint(0, n, (cfg["batch"],), generator=g)
    opt.zero_grad()
    work.loss(model, data, idx, {}, torch.float32).backward()
    opt.step()
    if step % cfg["ckpt_every"] == cfg["ckpt_every"] - 1:
        state = {"model": model.state_dict(), "opt": opt.state_dict(), "spex": spex_state.state_dict(),
                 "step": step + 1}
        if rank == 0:
            torch.save(state, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
    log.write(f"step {step + 1} {time.time()}\n")
if rank == 0:
    with torch.no_grad():
        acc, _ = work.evaluate(model.module, data, {}, torch.float32)
    with open("final.json", "w") as f:
        json.dump({"acc": acc, "steps": cfg["steps"], "world": world, "restart": restart}, f)
spex_state.close()
'''


def read_log(path):
    """One rank's log of one start: [{"kind": "start"|"step", "step", "t", ...}]."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                parts = line.rstrip("\n").split(" ", 4)
                if parts[0] == "start" and len(parts) == 5:
                    out.append({"kind": "start", "step": int(parts[1]), "world": int(parts[2]), "t": float(parts[3]),
                                "fresh": json.loads(parts[4])})
                elif parts[0] == "step" and len(parts) == 3:
                    out.append({"kind": "step", "step": int(parts[1]), "t": float(parts[2])})
    except (OSError, ValueError):
        pass
    return out


def last_step(directory, restart):
    steps = [e["step"] for path in glob.glob(os.path.join(directory, f"log-r{restart}-rank*.txt"))
             for e in read_log(path) if e["kind"] == "step"]
    return max(steps, default=0)


def kill_daemon(launcher, node):
    """SIGKILLs the spexd of MPI rank `node` in the launcher's current emulated cluster."""
    for pid in launcher.cluster.daemon_pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if env.get(b"OMPI_COMM_WORLD_RANK") == str(node).encode():
            os.kill(pid, 9)
            return pid
    raise RuntimeError(f"no spexd of node {node} found")


def one_run(args, name, kill, min_hosts):
    from spex.hosts import Host
    from spex.launcher import LaunchConfig, Launcher

    directory = tempfile.mkdtemp(prefix=f"restart-bench-{name}-", dir="/tmp")
    cfg = {"dir": directory, "hidden": args.hidden, "steps": args.steps, "batch": args.batch,
           "ckpt_every": args.ckpt_every, "lr": args.lr, "compressor": args.compressor, "density": args.density}
    trainer = os.path.join(directory, "trainer.py")
    with open(trainer, "w") as f:
        f.write(TRAINER)
    os.environ.update(BENCH_CFG=json.dumps(cfg), BENCH_REPO=REPO)
    config = LaunchConfig([sys.executable, trainer], emulated=args.hosts, slots=args.slots, rate=args.rate,
                          spexd=args.spexd, spexd_args=["--log_level=error", "--threads=1", *args.spexd_arg],
                          max_restarts=1 if kill else 0, min_hosts=min_hosts)
    launcher = Launcher(config, [Host(f"host{i + 1}", args.slots) for i in range(args.hosts)])
    said = []  # (time, line) of everything spexrun says: when it told the agents to start again
    say = launcher.say
    launcher.say = lambda text: (said.append((time.time(), text)), say(text))
    result = {}
    started = time.time()
    thread = threading.Thread(target=lambda: result.update(rc=launcher.run()), daemon=True)
    thread.start()
    killed_at = killed_step = None
    try:
        if kill:
            while thread.is_alive() and last_step(directory, 0) < args.kill_at:
                time.sleep(0.02)
            if thread.is_alive():
                killed_step = last_step(directory, 0)
                killed_at = time.time()
                kill_daemon(launcher, args.hosts - 1)  # the last host's daemon
        thread.join(timeout=args.timeout)
    finally:
        launcher.shutdown()
        launcher.stop_watchdog()
    out = {"name": name, "rc": result.get("rc"), "wall_s": time.time() - started}
    try:
        with open(os.path.join(directory, "final.json")) as f:
            out.update(json.load(f))
    except OSError:
        out["error"] = "no final.json: the job did not finish"
    if kill:
        events = [e for p in glob.glob(os.path.join(directory, "log-r1-rank*.txt")) for e in read_log(p)]
        starts = [e for e in events if e["kind"] == "start"]
        first = min((e["t"] for e in events if e["kind"] == "step"), default=None)
        resumed = starts[0]["step"] if starts else None
        out.update({
            "killed_at_step": killed_step,
            "resumed_from_step": resumed,
            "steps_lost": killed_step - resumed if resumed is not None and killed_step is not None else None,
            "restarted_world": starts[0]["world"] if starts else None,
            "failure_to_restart_decided_s": next((t - killed_at for t, x in said if x.startswith("restart 1 ")), None),
            "failure_to_trainers_started_s": next((t - killed_at for t, x in said if x.endswith("(restart 1)")), None),
            "failure_to_trainers_resumed_s": min(e["t"] for e in starts) - killed_at if starts else None,
            "failure_to_first_step_s": first - killed_at if first is not None else None,
            "spex_state": ("fresh: " + starts[0]["fresh"]) if starts and starts[0]["fresh"] else "loaded",
        })
    shutil.rmtree(directory, ignore_errors=True)
    print(json.dumps(out), flush=True)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spexd", default=os.environ.get("SPEXD", os.path.join(REPO, "bazel-bin/daemon/spexd")))
    p.add_argument("--hosts", type=int, default=3)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--hidden", type=int, default=256, help="the MLP's width (the main job's default is 3200)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--ckpt-every", type=int, default=25)
    p.add_argument("--kill-at", type=int, default=60, help="kill once the job completed this many steps")
    p.add_argument("--compressor", default="micro")
    p.add_argument("--density", type=float, default=0.01)
    p.add_argument("--runs", default="uninterrupted,same-size,smaller")
    p.add_argument("--spexd-arg", action="append", default=[],
                   help="one more spexd flag (repeatable), e.g. --spexd-arg=--dense_fallback=off")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--out", default=os.path.join(REPO, "bench", "results", "restart_bench.json"))
    args = p.parse_args()
    runs = {"uninterrupted": (False, None), "same-size": (True, None), "smaller": (True, args.hosts - 1)}
    results = []
    for name in args.runs.split(","):
        kill, min_hosts = runs[name]
        results.append(one_run(args, name, kill, min_hosts))
    ref = next((r for r in results if r["name"] == "uninterrupted" and "acc" in r), None)
    for r in results:
        if ref is not None and "acc" in r:
            r["acc_minus_uninterrupted"] = r["acc"] - ref["acc"]
    summary = {"conditions": {k: v for k, v in vars(args).items() if k not in ("out",)},
               "machine": f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the end",
               "runs": results}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=1)
    for r in results:
        print(f"{r['name']:14s} acc {r.get('acc', float('nan')):.2f}"
              + (f" ({r['acc_minus_uninterrupted']:+.2f})" if "acc_minus_uninterrupted" in r else "")
              + (f"  kill at step {r['killed_at_step']}, resumed from {r['resumed_from_step']} "
                 f"({r['steps_lost']} lost), world {r['restarted_world']}, failure to: restart "
                 f"{r['failure_to_restart_decided_s']:.1f} s, trainers started {r['failure_to_trainers_started_s']:.1f} s, "
                 f"resumed {r['failure_to_trainers_resumed_s']:.1f} s, first step {r['failure_to_first_step_s']:.1f} s; "
                 f"spex state {r['spex_state']}"
                 if r.get("failure_to_first_step_s") is not None else ""))
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
