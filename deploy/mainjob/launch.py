"""The main job's cluster and trainer processes: spexd on emulated hosts or on loopback (through
spex.emulated.EmulatedCluster / spex.cluster.LocalCluster, both of which start the daemon world
with spex.world.start_daemon_world, as spexrun does), the daemon's check of each run's
compressor, and one process per DDP trainer, stopped by PID if any fails."""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

from mainjob.procs import cpu_seconds, daemons_by_node


def check_compressor(socket: str, local_size: int, run: Dict[str, Any]) -> Optional[str]:
    """None when the daemon accepts the run's compressor, density and params, else its message
    (which lists the accepted compressor names or parameters). Registers nothing."""
    import spex

    with spex.Client(socket, local_rank=0, local_size=local_size, client_name="train_digits-check") as c:
        try:
            c.validate_compressor(run["compressor"], run["density"], run.get("params") or None)
        except spex.SpexValueError as e:
            return str(e)
    return None


def open_cluster(args: argparse.Namespace, spexd_args: List[str], out: str):
    """The cluster to start (a context manager), or None after saying why emulated hosts cannot be had."""
    from spex.cluster import LocalCluster
    from spex.emulated import EmulatedCluster

    log = os.path.join(out, "spexd.log")
    if args.network == "emulated":
        why = EmulatedCluster.unavailable()
        if why:
            print(f"train_digits: ERROR: --network=emulated: {why}. Run as root on a machine that permits network "
                  f"namespaces, or use --network=loopback (no slow link: spex has no bandwidth to win back there).",
                  flush=True)
            return None
        return EmulatedCluster(args.spexd, hosts=args.nodes, trainers=args.trainers, args=spexd_args,
                               rate=args.rate, latency_us=args.latency_us, log=log)
    return LocalCluster(args.spexd, nodes=args.nodes, trainers=args.trainers, args=spexd_args, log=log,
                        pin=args.pin)


def trainer_cfg(args: argparse.Namespace, runs: List[Dict[str, Any]], cluster, rank: int, rendezvous: str,
                daemon_of: Dict[int, int]) -> Dict[str, Any]:
    """What one trainer process needs (handed over as JSON on its command line)."""
    node, local = divmod(rank, args.trainers)
    return {"rank": rank, "world": args.nodes * args.trainers, "local_rank": local, "local_size": args.trainers,
            "socket": cluster.socket(node), "rendezvous": rendezvous, "seed": args.seed,
            "hidden": args.hidden, "bucket_cap_mb": args.bucket_cap_mb, "runs": runs, "mode": args.mode,
            "zero_copy": args.zero_copy == "on",
            "lr": args.lr, "momentum": args.momentum, "batch": args.batch, "epochs": args.epochs,
            "stats_every": args.stats_every, "check_every": args.check_every, "quiet": args.quiet,
            "modules_every": args.modules_every,
            "powersgd_one_bucket": args.powersgd_buckets == "one", "model": args.model, "vocab": args.vocab,
            "bptt": args.bptt, "steps_per_epoch": args.steps_per_epoch, "dtype": args.dtype,
            "test_size": args.test_size, "daemon_pid": daemon_of.get(node, 0) if local == 0 else 0}


def trainer_env(args: argparse.Namespace, cluster, rank: int) -> Dict[str, str]:
    node, local = divmod(rank, args.trainers)
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(args.nodes * args.trainers), LOCAL_RANK=str(local),
               LOCAL_WORLD_SIZE=str(args.trainers), SPEX_SOCKET=cluster.socket(node), OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1")
    # glibc returns every freed block over 32 MB to the kernel, so each step's fresh 40 MB
    # gradient of a large layer page-faults again (x5-25 the matmul's time here); keep them.
    env.setdefault("MALLOC_MMAP_THRESHOLD_", str(1 << 32))
    env.setdefault("MALLOC_TRIM_THRESHOLD_", str(1 << 32))
    if args.network == "emulated":
        env["GLOO_SOCKET_IFNAME"] = "eth0"
    return env


def wait_all(procs: List[subprocess.Popen], log_path: str) -> None:
    """Waits for every trainer; if one fails, stops the others (by PID) and raises."""
    failed = None
    while failed is None and any(p.poll() is None for p in procs):
        time.sleep(0.05)
        failed = next(((r, p.returncode) for r, p in enumerate(procs) if p.poll() not in (None, 0)), None)
    failed = failed or next(((r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0), None)
    if failed is None:
        return
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    raise RuntimeError(f"rank {failed[0]} exited with status {failed[1]} (daemon log: {log_path})")


def launch(runs: List[Dict[str, Any]], args: argparse.Namespace, cluster, program: str) -> float:
    """Starts one process per trainer (`program --worker CFG`; they train every run in turn) and
    waits for them; if one fails, stops the others (by PID) and raises. Returns the wall time."""
    rdv = tempfile.mkdtemp(prefix="rdv-", dir=cluster.dir)
    # On emulated hosts DDP's process group meets at rank 0's host over the emulated network (and
    # gloo sends through eth0, the host's throttled link); on loopback through a file.
    rendezvous = f"tcp://{cluster.addr(0)}:29500" if args.network == "emulated" else f"file://{rdv}/rdv"
    daemon_of = daemons_by_node(cluster.daemon_pids())
    procs = []
    for rank in range(args.nodes * args.trainers):
        cfg = trainer_cfg(args, runs, cluster, rank, rendezvous, daemon_of)
        # cluster.popen runs it on the node's cores when the cluster pins (--pin).
        procs.append(cluster.popen(rank // args.trainers, [sys.executable, program, "--worker", json.dumps(cfg)],
                                   env=trainer_env(args, cluster, rank)))
    t0 = time.perf_counter()
    daemons = cluster.daemon_pids()
    cpu0 = cpu_seconds(daemons)
    wait_all(procs, cluster.log_path)
    wall = time.perf_counter() - t0
    # What the daemons cost the trainers' cores: CPU seconds of every spexd (all threads) over
    # the training's wall time, polling in collectives included.
    cpu = cpu_seconds(daemons) - cpu0
    print(f"train_digits: the {len(daemons)} daemon(s) used {cpu:.1f} CPU-seconds in {wall:.1f} s of training "
          f"({cpu / wall:.2f} cores of {os.cpu_count()})", flush=True)
    return wall
