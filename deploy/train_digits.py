#!/usr/bin/env python3
"""The main job: real data-parallel training through spex, against plain PyTorch DDP. Starts a
spex cluster (spexd under mpirun, default 2 nodes x 2 trainers) -- by default on emulated hosts
(--network=emulated: one network namespace per node on a bridge, 1 Gbit/s each way, every node's
trainers inside its host, so DDP's own gloo all-reduce crosses the same slow links as spex), or on
this machine's loopback (--network=loopback) -- then trains an MLP on scikit-learn's digits with
PyTorch DDP (gloo process group, one process per trainer) once per run in --runs (default: `gloo`
= DDP's own all-reduce, what a user runs without spex; PyTorch's own compression hooks `fp16` and
`powersgd:1`, what a DDP user on a slow network would try next; `dense` = spex without
compression; `micro` at density 0.01), printing one line per epoch (loss, test accuracy, step
time, exchange time, achieved density from GetStats) and a comparison table (time per step, time
to --target-acc, final accuracy, speed-up over the first run, DDP); writes per-step and per-epoch
CSVs, summary.json and a PNG plot (accuracy against wall-clock time) under --results.

Runs: NAME[:DENSITY][/MOD...] with NAME a spexd compressor (dense, micro, topk, dgc, sidco_e, ...;
modifiers: /wN DGC's density warm-up, 4x the target per remaining epoch over the first N epochs;
/mc DGC's momentum correction (the hook's momentum_correction=--momentum), the momentum kept per trainer before the exchange and the optimizer
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
--dense_fallback=off --min_sparse_elements=1024 unless --spexd-arg says otherwise, so that a
sparse run is really sparse; every bucket a sparse run exchanged dense is reported with the reason
(under --min_sparse_elements, or the daemon's dense-fallback probe), and the table shows the
achieved density from GetStats.

    python3 deploy/train_digits.py --spexd bazel-bin/daemon/spexd [--runs gloo,fp16,powersgd:1,dense,micro:0.01]
        [--network emulated|loopback] [--nodes 2] [--rate 1gbit] [--latency-us 0] [--trainers 2]
        [--epochs 4] [--hidden 3200] [--target-acc 95] [--results DIR]

Needs the spex package (client/python; deploy/main_job.sh installs it into .venv).
"""

import argparse
import csv
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import signal
import time
from typing import Any, Dict, List, Optional

DEFAULT_SPEXD_ARGS = ["--threads=1", "--dense_fallback=off", "--min_sparse_elements=1024", "--log_level=warning"]


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default="gloo,fp16,powersgd:1,dense,micro:0.01",
                   help="comma-separated NAME[:DENSITY] (default %(default)s)")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                   help="the spex runs' model type: bf16 trains a bfloat16 MLP through bfloat16 buckets "
                        "(DDP built by spex.torch.half_ddp; docs/dtypes.md); the gloo and PyTorch-hook runs stay "
                        "float32 (gloo has no bfloat16 all-reduce in torch 1.13)")
    p.add_argument("--network", choices=["emulated", "loopback"], default="emulated",
                   help="emulated: every node on its own emulated host (network namespace, --rate, --latency-us; "
                        "needs root); loopback: every node on this machine (default %(default)s)")
    p.add_argument("--nodes", "--hosts", type=int, default=2, help="daemons (emulated hosts)")
    p.add_argument("--rate", default="1gbit", help="emulated link rate per host, each way (tc syntax; default %(default)s)")
    p.add_argument("--latency-us", type=int, default=0, help="emulated one-way latency per host (microseconds)")
    p.add_argument("--trainers", type=int, default=2, help="DDP processes per node")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch", type=int, default=16, help="per-process batch size")
    p.add_argument("--hidden", type=int, default=3200,
                   help="width of the MLP's two hidden layers (default %(default)s: 10.5M parameters, 42 MB of "
                        "gradients per step, so that dense communication dominates at 1 Gbit/s)")
    p.add_argument("--target-acc", type=float, default=95.0, help="test accuracy (%%) for the time-to-accuracy column")
    p.add_argument("--model", choices=["mlp", "lstm"], default="mlp",
                   help="mlp (default): the MLP on digits; lstm: a word-level LSTM language model on English text "
                        "(Debian's fortunes files), judged by test perplexity (--target-ppl)")
    p.add_argument("--vocab", type=int, default=5000, help="lstm: vocabulary size (most frequent words + <unk>)")
    p.add_argument("--bptt", type=int, default=35, help="lstm: tokens per training sequence")
    p.add_argument("--steps-per-epoch", type=int, default=40,
                   help="lstm: training steps per epoch (the corpus has far more; an epoch is a slice of it)")
    p.add_argument("--target-ppl", type=float, default=200.0,
                   help="lstm: test perplexity for the time-to-target column (default %(default)s)")
    p.add_argument("--lr", type=float, default=None, help="SGD learning rate (default 0.05 for mlp, 0.5 for lstm)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    p.add_argument("--mode", choices=["doorbell", "rpc"], default="doorbell", help="spex exchange path")
    p.add_argument("--powersgd-buckets", choices=["one", "ddp"], default="one",
                   help="one (default): powersgd runs put the whole model in one DDP bucket (bucket_cap_mb and "
                        "dist._DEFAULT_FIRST_BUCKET_BYTES above the gradient size), because PyTorch's PowerSGD hook over gloo with several buckets can issue its "
                        "collectives in different orders on different ranks (hang or gloo enforce); ddp: DDP's own "
                        "bucketing (--bucket-cap-mb), to see that failure")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--results", default=None, help="results directory (default bench/results/train_digits)")
    p.add_argument("--spexd", default=None, help="spexd binary (default $SPEXD or bazel-bin/daemon/spexd)")
    p.add_argument("--spexd-arg", action="append", default=[],
                   help="spexd flag (repeatable); default: " + " ".join(DEFAULT_SPEXD_ARGS))
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="compressor parameter for every sparse run (repeatable)")
    p.add_argument("--stats-every", type=int, default=1, help="GetStats every N steps on rank 0 (0: per epoch)")
    p.add_argument("--check-every", type=int, default=10,
                   help="compare a SHA-1 of the parameters across ranks every N steps (0: never; it costs a pass over "
                        "the parameters, so not every step by default)")
    p.add_argument("--pin", choices=["auto", "node", "none"], default="auto",
                   help="loopback: node: node n's daemon and trainers run on node n's own cores (with 2 nodes on 2 "
                        "cores, a core each), as on real hosts; none: the scheduler places them; auto (default): node "
                        "when daemons and trainers outnumber the cores. Emulated hosts always have their own CPU sets "
                        "(deploy/emulated_cluster.sh)")
    p.add_argument("--quiet", action="store_true", help="no per-epoch lines")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# What a DDP user would run instead of spex, registered exactly as PyTorch documents them: `gloo`
# (DDP's own all-reduce), `fp16` / `bf16` (torch.distributed.algorithms.ddp_comm_hooks'
# fp16_compress_hook / bf16_compress_hook) and `powersgd[:RANK]` (powerSGD_hook with PowerSGDState).
PEERS = ("gloo", "fp16", "bf16", "powersgd")


def is_peer(run: Dict[str, Any]) -> bool:
    return run["compressor"] in PEERS


MODIFIERS = ("mc", "layer", "global")


def parse_runs(spec: str) -> List[Dict[str, Any]]:
    """Run specs NAME[:DENSITY][/MOD...]: /wN density warm-up, /mc momentum correction, /layer
    and /global bucketing (see the module's documentation)."""
    runs = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        head, *mods = item.split("/")
        name, _, dens = head.partition(":")
        warm, flags = "", []
        for m in mods:
            if m.startswith("w") and m[1:].isdigit():
                warm = m[1:]
            elif m in MODIFIERS and m not in flags:
                flags.append(m)
            else:
                sys.exit(f"train_digits: run {item!r}: unknown modifier /{m} (known: /wN density warm-up over N "
                         f"epochs, /mc momentum correction, /layer one DDP bucket per tensor, /global one DDP "
                         f"bucket for the model)")
        if (warm or "mc" in flags) and name in ("dense", *PEERS):
            sys.exit(f"train_digits: run {item!r}: /wN and /mc need a sparse spex compressor")
        if flags and name in PEERS:
            sys.exit(f"train_digits: run {item!r}: /layer, /global and /mc apply to spex runs only")
        if "layer" in flags and "global" in flags:
            sys.exit(f"train_digits: run {item!r}: /layer and /global exclude each other")
        if name == "powersgd":
            # PowerSGD's parameter is its matrix approximation rank (PyTorch's default 1).
            if dens and not (dens.isdigit() and int(dens) >= 1):
                sys.exit(f"train_digits: run {item!r}: powersgd:RANK needs a whole rank >= 1")
            rank = int(dens or 1)
            runs.append({"name": name, "compressor": name, "density": 1.0, "powersgd_rank": rank,
                         "label": f"powersgd-r{rank}"})
            continue
        if name in PEERS and dens:
            sys.exit(f"train_digits: run {item!r}: {name} takes no density")
        density = float(dens) if dens else (1.0 if name in ("dense", *PEERS) else 0.01)
        if not 0 < density <= 1:
            sys.exit(f"train_digits: density of run {item!r} must be in (0, 1]")
        label = (name if name in ("dense", *PEERS) else f"{name}@{density:g}") + (f"/w{warm}" if warm else "")
        label += "".join(f"/{f}" for f in flags)
        runs.append({"name": name, "compressor": name, "density": density, "warmup_epochs": int(warm or 0),
                     "momentum_correction": "mc" in flags,
                     "bucketing": "layer" if "layer" in flags else "global" if "global" in flags else "ddp",
                     "label": label})
    if not runs:
        sys.exit("train_digits: --runs names no run")
    return runs


def layer_nonzero(model) -> Dict[str, List[int]]:
    """[non-zero, elements] of each parameter's gradient (after the exchange: the averaged
    update), grouped by the module that owns it."""
    out: Dict[str, List[int]] = {}
    modules = dict(model.named_children())
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        key = name.split(".")[0]
        if key.isdigit():  # nn.Sequential's children are numbered: name them by kind too
            key = f"{type(modules[key]).__name__.lower()}{key}"
        acc = out.setdefault(key, [0, 0])
        acc[0] += int((p.grad != 0).sum())
        acc[1] += p.grad.numel()
    return out


# ----------------------------------------------------------------------------------------------
# Worker: one DDP process (one spex trainer).


def load_data(seed: int):
    import numpy as np
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y)
    mu, sd = xtr.mean(0), xtr.std(0) + 1e-6
    f = lambda a: torch.tensor(((a - mu) / sd).astype(np.float32))  # noqa: E731
    return f(xtr), torch.tensor(ytr), f(xte), torch.tensor(yte)


FORTUNES = "/usr/share/games/fortunes"


def load_text(seed: int, vocab: int, bptt: int):
    """Debian's fortunes (about 440,000 words of English: quotations, jokes, definitions; the
    package `fortunes`), entries split on '%' lines, ASCII-art files left out, shuffled by entry
    with `seed`, 95% for training. Lower-cased words and punctuation; the `vocab`-1 most frequent
    tokens keep an id, the rest are <unk>; entries end with <eos>. Returns train and test
    sequences of bptt+1 tokens (LongTensors [N, bptt+1])."""
    import random
    import re

    import torch

    if not os.path.isdir(FORTUNES):
        sys.exit(f"train_digits: --model lstm needs {FORTUNES} (Debian package fortunes; deploy/setup.sh installs it)")
    entries = []
    for name in sorted(os.listdir(FORTUNES)):
        path = os.path.join(FORTUNES, name)
        if name.endswith((".dat", ".u8")) or "art" in name or os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            entries += [e for e in re.split(r"^%$", f.read(), flags=re.M) if e.strip()]
    random.Random(seed).shuffle(entries)
    tok = [re.findall(r"[a-z']+|[.,!?;:]", e.lower()) + ["<eos>"] for e in entries]
    counts: Dict[str, int] = {}
    cut = int(len(tok) * 0.95)
    for t in tok[:cut]:
        for w in t:
            counts[w] = counts.get(w, 0) + 1
    words = sorted(counts, key=lambda w: (-counts[w], w))[:vocab - 1]
    ids = {w: i + 1 for i, w in enumerate(words)}  # 0 = <unk>

    def seqs(part):
        flat = [ids.get(w, 0) for t in part for w in t]
        n = len(flat) // (bptt + 1)
        return torch.tensor(flat[:n * (bptt + 1)], dtype=torch.long).view(n, bptt + 1)

    return seqs(tok[:cut]), seqs(tok[cut:])


def lstm_model(vocab: int):
    """Embedding 128 -> LSTM 256 -> Linear to the vocabulary (the embedding's gradient touches
    only the batch's words: very sparse and very uneven)."""
    import torch

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, 128)
            self.lstm = torch.nn.LSTM(128, 256, batch_first=True)
            self.dec = torch.nn.Linear(256, vocab)

        def forward(self, x):
            return self.dec(self.lstm(self.emb(x))[0])

    return LM()


def params_digest(model) -> str:
    import torch

    h = hashlib.sha1()
    for p in model.parameters():
        d = p.detach().contiguous()
        h.update((d.view(torch.int16) if d.dtype == torch.bfloat16 else d).numpy().tobytes())
    return h.hexdigest()[:16]


def allreduce_mean(world: int, bucket):
    """DDP's default all-reduce hook (sum over the gloo group, then / world), as a hook of its own
    so that TimedHook times the gloo baseline's exchanges like the spex hook's."""
    import torch.distributed as dist

    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].div_(world))


class TimedHook:
    """A PyTorch communication hook with its own state (DDP's all-reduce, fp16/bf16_compress_hook,
    powerSGD_hook), timed from the hook call to its result like the spex hook's exchanges."""

    def __init__(self, hook, state):
        self.hook = hook
        self.state = state
        self.times: List[float] = []

    def pop_timings(self) -> List[Any]:
        out, self.times = self.times, []
        return [(0, 0, 0, t) for t in out]


def timed_hook(state: TimedHook, bucket):
    t0 = time.perf_counter()

    def done(f):
        state.times.append(time.perf_counter() - t0)
        return f.value()

    return state.hook(state.state, bucket).then(done)


def peer_hook(run: Dict[str, Any], total_steps: int):
    """(state, hook) for a PyTorch peer run, with PyTorch's documented settings."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if run["compressor"] == "fp16":
        return TimedHook(default_hooks.fp16_compress_hook, None), timed_hook
    if run["compressor"] == "bf16":
        return TimedHook(default_hooks.bf16_compress_hook, None), timed_hook
    # PowerSGD: error feedback and warm start on (PyTorch's defaults and advice), plain
    # all-reduce for the first 10% of the steps ("start with 10% of total training steps"; at
    # least 2, the minimum DDP allows with error feedback).
    st = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=run["powersgd_rank"],
                                     start_powerSGD_iter=max(2, total_steps // 10), use_error_feedback=True,
                                     warm_start=True)
    return TimedHook(powerSGD_hook.powerSGD_hook, st), timed_hook


def bf16_unsupported() -> Optional[str]:
    """Why this torch's gloo cannot all-reduce bfloat16 (torch 1.13: "Invalid scalar type"), or
    None. Every rank fails the same way, so all of them skip the run."""
    import torch
    import torch.distributed as dist

    # A group of its own: a failed collective can leave the group it ran on unusable.
    probe = dist.new_group(backend="gloo")
    try:
        dist.all_reduce(torch.zeros(4, dtype=torch.bfloat16), group=probe)
    except RuntimeError as e:
        return f"this torch ({torch.__version__}) cannot all-reduce bfloat16 over gloo: {str(e).splitlines()[0]}"
    return None


def train_one(cfg: Dict[str, Any], run: Dict[str, Any], data, run_index: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = cfg["rank"], cfg["world"]
    xtr, ytr, xte, yte = data
    out = run["out"]
    torch.manual_seed(cfg["seed"])
    h = cfg["hidden"]
    lstm = cfg["model"] == "lstm"
    if lstm:
        model = lstm_model(cfg["vocab"])
    else:
        model = torch.nn.Sequential(torch.nn.Linear(64, h), torch.nn.ReLU(), torch.nn.Linear(h, h), torch.nn.ReLU(),
                                    torch.nn.Linear(h, 10))
    bucket_cap_mb = cfg["bucket_cap_mb"]
    first_bucket = dist._DEFAULT_FIRST_BUCKET_BYTES
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if run.get("bucketing") == "layer":
        # Layer-wise selection: every parameter tensor its own DDP bucket (caps under the smallest
        # tensor; DDP never splits a tensor), so each is selected on its own.
        smallest = min(p.numel() * p.element_size() for p in model.parameters())
        bucket_cap_mb = smallest / 2 / 2**20
        dist._DEFAULT_FIRST_BUCKET_BYTES = max(1, smallest // 2)
    elif run.get("bucketing") == "global" or (run["compressor"] == "powersgd" and cfg["powersgd_one_bucket"]):
        # One DDP bucket: the hook's later all-reduces are issued from future callbacks, whose
        # order across several buckets can differ between ranks; gloo then pairs mismatched
        # collectives (hang, or "op.preamble.length <= op.nbytes"). With one bucket there is one
        # chain per step. bucket_cap_mb alone is not enough: after its first iteration DDP
        # rebuilds its buckets with the first one capped at dist._DEFAULT_FIRST_BUCKET_BYTES
        # (1 MB), which DDP's source says users may set; both go above the gradient size.
        # (The same single bucket makes a /global spex run's selection global over the model.)
        bucket_cap_mb = max(bucket_cap_mb, 2 * n_bytes / 2**20)
        dist._DEFAULT_FIRST_BUCKET_BYTES = int(bucket_cap_mb * 2**20)
    # --dtype bf16: the spex runs train a bfloat16 model (the same initial parameters on every
    # rank, checked by half_ddp instead of DDP's broadcast, which gloo cannot do in bfloat16).
    half = cfg.get("dtype") == "bf16" and not lstm and run["compressor"] != "gloo" and not is_peer(run)
    pdtype = torch.bfloat16 if half else torch.float32
    if half:
        import spex.torch

        model = model.to(torch.bfloat16)
        ddp = spex.torch.half_ddp(model, bucket_cap_mb=bucket_cap_mb)
    else:
        ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)
    dist._DEFAULT_FIRST_BUCKET_BYTES = first_bucket  # the reducer keeps the value it was built with
    steps_per_epoch = len(xtr) // (world * cfg["batch"])
    if lstm:
        steps_per_epoch = min(steps_per_epoch, cfg["steps_per_epoch"])
    steps_total = steps_per_epoch * cfg["epochs"]
    if run["compressor"] == "bf16":
        why = bf16_unsupported()
        if why is not None:
            if rank == 0:
                with open(os.path.join(out, "epochs.json"), "w") as f:
                    json.dump({"unsupported": why}, f)
                print(f"[{run['label']:>12}] NOT RUN: {why}", flush=True)
            dist.barrier()
            return
    if run["compressor"] == "gloo":
        state: Any = TimedHook(allreduce_mean, world)
        ddp.register_comm_hook(state, timed_hook)
    elif is_peer(run):
        state, hook = peer_hook(run, steps_total)
        ddp.register_comm_hook(state, hook)
    else:
        import spex.torch

        # Each run gets its own bucket ids, so nothing of a previous run can be mistaken for it.
        state = spex.torch.SpexHookState(ddp, compressor=run["compressor"], density=run["density"],
                                         params=run.get("params") or None, socket=cfg["socket"],
                                         local_rank=cfg["local_rank"], local_size=cfg["local_size"], mode=cfg["mode"],
                                         id_base=run_index << 32,
                                         momentum_correction=cfg["momentum"] if run.get("momentum_correction") else None)
        ddp.register_comm_hook(state, spex.torch.hook)
    spex_state = state if not is_peer(run) else None
    # Momentum correction moves the momentum into the hook (before the exchange); the optimizer
    # then applies the averaged update as it is.
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"],
                          momentum=0.0 if run.get("momentum_correction") else cfg["momentum"])
    layer_nz: Dict[str, List[int]] = {}
    batch = cfg["batch"]
    step_rows, epoch_rows = [], []
    step = 0
    # Rank 0 reads GetStats after every step: achieved density, and which buckets of a sparse
    # run went dense (and why), reported once per bucket and reason. GetStats holds each
    # bucket's last exchange, recorded just after the result is published, so a read can see the
    # step before: exchanges are counted once per (bucket, step) seen.
    dense_notes: Dict[Any, Dict[str, Any]] = {}
    seen = set()
    bucket_exchanges = dense_exchanges = 0
    patterns: Dict[str, int] = {}
    t_run = time.perf_counter()
    for epoch in range(cfg["epochs"]):
        warm = run.get("warmup_epochs", 0)
        if spex_state is not None and rank == 0 and warm and epoch <= warm:
            # DGC's warm-up: the density falls 4x per epoch to the target over the first `warm`
            # epochs (all nodes switch at the same step; the daemons agree on it).
            spex_state.set_density(min(1.0, run["density"] * 4.0 ** (warm - epoch)))
        t_epoch = time.perf_counter()
        perm = torch.randperm(len(xtr), generator=torch.Generator().manual_seed(cfg["seed"] * 100003 + epoch))
        mine = perm[rank::world]
        losses, exch, densities, gathered, step_times = [], [], [], [], []
        for s in range(steps_per_epoch):
            idx = mine[s * batch:(s + 1) * batch]
            t0 = time.perf_counter()
            cpu0 = time.process_time()  # this trainer's CPU (all its threads) over the step
            dcpu0 = cpu_seconds([cfg["daemon_pid"]]) if cfg.get("daemon_pid") else None
            opt.zero_grad(set_to_none=True)
            if lstm:
                seq = xtr[idx]
                loss = torch.nn.functional.cross_entropy(ddp(seq[:, :-1]).reshape(-1, cfg["vocab"]),
                                                         seq[:, 1:].reshape(-1))
            else:
                loss = torch.nn.functional.cross_entropy(ddp(xtr[idx].to(pdtype)).float(), ytr[idx])
            loss.backward()
            opt.step()
            step_s = time.perf_counter() - t0
            cpu_s = time.process_time() - cpu0
            # The node's daemon over the step (/proc: clock ticks, so a step's figure is coarse and
            # the mean over steps is what counts); local rank 0 only, one row per daemon.
            dcpu_s = f"{cpu_seconds([cfg['daemon_pid']]) - dcpu0:.6f}" if dcpu0 is not None else ""
            if rank == 0:  # what the averaged update held, per module (untimed; step() keeps .grad)
                for key, (nz, n) in layer_nonzero(model).items():
                    acc = layer_nz.setdefault(key, [0, 0])
                    acc[0] += nz
                    acc[1] += n
            timings = state.pop_timings()
            exchange_s = sum(t[3] for t in timings)
            density = gath = float("nan")
            if spex_state is not None and rank == 0 and cfg["stats_every"] and step % cfg["stats_every"] == 0:
                report = spex_state.exchange_report()
                if report:
                    elems = sum(b["elements"] for b in report)
                    density = sum(b["achieved_density"] * b["elements"] for b in report) / elems
                    gath = sum(b["gathered_density"] * b["elements"] for b in report) / elems
                    densities.append(density)
                    gathered.append(gath)
                for b in report:
                    if (b["bucket_id"], b["step"]) in seen:
                        continue
                    seen.add((b["bucket_id"], b["step"]))
                    bucket_exchanges += 1
                    patterns[b["pattern"]] = patterns.get(b["pattern"], 0) + 1
                    if not b["dense"]:
                        continue
                    dense_exchanges += 1
                    key = (b["elements"], b["why"][:40])
                    note = dense_notes.setdefault(key, {"elements": b["elements"], "why": b["why"], "count": 0,
                                                        "first_step": step, "bucket_id": b["bucket_id"]})
                    note["count"] += 1
                    if note["count"] == 1 and not cfg["quiet"]:
                        print(f"[{run['label']:>12}] NOTE: bucket {b['bucket_id']} ({b['elements']} elements) was "
                              f"exchanged DENSE at step {step}, not {run['compressor']}: {b['why']}", flush=True)
            losses.append(loss.item())
            exch.append(exchange_s)
            step_times.append(step_s)
            digest = params_digest(model) if cfg["check_every"] and step % cfg["check_every"] == 0 else ""
            if digest:
                # Hashing 42 MB takes each rank a different time on shared cores; meeting here
                # (untimed) keeps that skew out of the next step's exchange time, which would
                # otherwise include waiting for the slowest hasher.
                dist.barrier()
            step_rows.append([step, epoch, f"{loss.item():.6f}", f"{step_s:.6f}", f"{exchange_s:.6f}",
                              len(timings), f"{density:.6f}", f"{gath:.6f}", digest, f"{cpu_s:.6f}", dcpu_s])
            step += 1
        ppl = None
        with torch.no_grad():
            if lstm:  # perplexity and next-word accuracy on the held-out entries
                logits = model(xte[:, :-1]).reshape(-1, cfg["vocab"])
                target = xte[:, 1:].reshape(-1)
                ppl = float(torch.exp(torch.nn.functional.cross_entropy(logits, target)))
                acc = (logits.argmax(1) == target).float().mean().item() * 100
            else:
                acc = (model(xte.to(pdtype)).float().argmax(1) == yte).float().mean().item() * 100
        dist.barrier()  # the same for the evaluation: every rank starts the next epoch together
        if spex_state is not None and rank == 0 and not cfg["stats_every"]:
            report = spex_state.exchange_report()
            if report:
                elems = sum(b["elements"] for b in report)
                densities.append(sum(b["achieved_density"] * b["elements"] for b in report) / elems)
                gathered.append(sum(b["gathered_density"] * b["elements"] for b in report) / elems)
        row = {"epoch": epoch, "loss": sum(losses) / len(losses), "test_acc": acc, "test_ppl": ppl,
               "exchange_ms": 1e3 * sum(exch) / len(exch), "step_ms": 1e3 * sum(step_times) / len(step_times),
               "wall_s": time.perf_counter() - t_run,
               "density": (sum(densities) / len(densities)) if densities else float("nan"),
               "gathered_density": (sum(gathered) / len(gathered)) if gathered else float("nan"),
               "epoch_s": time.perf_counter() - t_epoch}
        epoch_rows.append(row)
        if rank == 0 and not cfg["quiet"]:
            print(f"[{run['label']:>12}] epoch {epoch + 1:3d}/{cfg['epochs']}  loss {row['loss']:.4f}  "
                  + (f"test ppl {ppl:8.1f}  " if ppl is not None else "") +
                  f"test acc {acc:6.2f}%  step {row['step_ms']:8.2f} ms  exchange {row['exchange_ms']:8.2f} ms/step  "
                  f"density {row['density']:.4f} (gathered {row['gathered_density']:.4f})  ({row['epoch_s']:.2f} s)",
                  flush=True)
    run_s = time.perf_counter() - t_run
    buckets = []
    if spex_state is not None:
        buckets = [b.elements for b in spex_state.buckets]
        if rank == 0:
            with open(os.path.join(out, "getstats.txt"), "w") as f:
                f.write(str(spex_state.stats()))
        spex_state.close()
    with open(os.path.join(out, f"steps.rank{rank}.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "epoch", "loss", "step_s", "exchange_s", "exchanges", "density", "gathered_density",
                    "params_sha1", "cpu_s", "daemon_cpu_s"])
        w.writerows(step_rows)
    if rank == 0:
        with open(os.path.join(out, "epochs.json"), "w") as f:
            json.dump({"epochs": epoch_rows, "run_s": run_s, "steps": step, "buckets": buckets,
                       "bucket_exchanges": bucket_exchanges, "dense_exchanges": dense_exchanges,
                       "dense_notes": list(dense_notes.values()), "patterns": patterns,
                       "layer_nonzero": layer_nz}, f)
    # Every trainer said Goodbye before any opens the next run's session: the daemons then
    # start the next run as a new job (step 0, fresh buckets).
    dist.barrier()


def trace_collectives(rank: int) -> None:
    """Prints every all_reduce this process issues, numbered, with its shape and thread: gloo
    pairs the n-th collective of every rank, so lists that differ between ranks show why a hook
    hangs (TRAIN_DIGITS_TRACE_COLLECTIVES=1; a diagnosis aid, off by default)."""
    import threading

    import torch.distributed as dist

    inner, count = dist.all_reduce, [0]

    def traced(tensor, *a, **kw):
        count[0] += 1
        print(f"collective rank {rank} #{count[0]} all_reduce {tuple(tensor.shape)} "
              f"({threading.current_thread().name})", flush=True)
        return inner(tensor, *a, **kw)

    dist.all_reduce = traced


def worker(cfg: Dict[str, Any]) -> None:
    """One DDP process: trains every run in turn (one process start for all runs)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=cfg["rendezvous"], rank=cfg["rank"], world_size=cfg["world"])
    if os.environ.get("TRAIN_DIGITS_TRACE_COLLECTIVES"):
        trace_collectives(cfg["rank"])
    if cfg["model"] == "lstm":
        train, test = load_text(cfg["seed"], cfg["vocab"], cfg["bptt"])
        data = (train, None, test[:256], None)
    else:
        data = load_data(cfg["seed"])
    for i, run in enumerate(cfg["runs"]):
        train_one(cfg, run, data, i)
    dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------
# Launcher.


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


def cpu_seconds(pids: List[int]) -> float:
    """User + system CPU time of the processes (all their threads) so far; 0 for any gone."""
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass
    return total


def daemons_by_node(pids: List[int]) -> Dict[int, int]:
    """{node: spexd PID}, from each daemon's MPI rank in its environment (empty if unreadable)."""
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            out[int(env[b"OMPI_COMM_WORLD_RANK"])] = pid
        except (OSError, KeyError, ValueError):
            pass
    return out


def launch(runs: List[Dict[str, Any]], args: argparse.Namespace, cluster) -> float:
    """Starts one process per trainer (they train every run in turn) and waits for them; if one
    fails, stops the others (by PID) and raises. Returns the wall time."""
    world = args.nodes * args.trainers
    rdv = tempfile.mkdtemp(prefix="rdv-", dir=cluster.dir)
    emulated = args.network == "emulated"
    # On emulated hosts DDP's process group meets at rank 0's host over the emulated network (and
    # gloo sends through eth0, the host's throttled link); on loopback through a file.
    rendezvous = f"tcp://{cluster.addr(0)}:29500" if emulated else f"file://{rdv}/rdv"
    procs = []
    daemon_of = daemons_by_node(cluster.daemon_pids())
    for rank in range(world):
        node, local = divmod(rank, args.trainers)
        cfg = {"rank": rank, "world": world, "local_rank": local, "local_size": args.trainers,
               "socket": cluster.socket(node), "rendezvous": rendezvous, "seed": args.seed,
               "hidden": args.hidden, "bucket_cap_mb": args.bucket_cap_mb, "runs": runs, "mode": args.mode,
               "lr": args.lr, "momentum": args.momentum, "batch": args.batch, "epochs": args.epochs,
               "stats_every": args.stats_every, "check_every": args.check_every, "quiet": args.quiet,
               "powersgd_one_bucket": args.powersgd_buckets == "one", "model": args.model, "vocab": args.vocab,
               "bptt": args.bptt, "steps_per_epoch": args.steps_per_epoch, "dtype": args.dtype,
               "daemon_pid": daemon_of.get(node, 0) if local == 0 else 0}
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local),
                   LOCAL_WORLD_SIZE=str(args.trainers), SPEX_SOCKET=cluster.socket(node), OMP_NUM_THREADS="1",
                   OPENBLAS_NUM_THREADS="1")
        # glibc returns every freed block over 32 MB to the kernel, so each step's fresh 40 MB
        # gradient of a large layer page-faults again (x5-25 the matmul's time here); keep them.
        env.setdefault("MALLOC_MMAP_THRESHOLD_", str(1 << 32))
        env.setdefault("MALLOC_TRIM_THRESHOLD_", str(1 << 32))
        if emulated:
            env["GLOO_SOCKET_IFNAME"] = "eth0"
        # cluster.popen runs it on the node's cores when the cluster pins (--pin).
        procs.append(cluster.popen(node, [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(cfg)],
                                   env=env))
    t0 = time.perf_counter()
    daemons = cluster.daemon_pids()
    cpu0 = cpu_seconds(daemons)
    failed = None
    while failed is None and any(p.poll() is None for p in procs):
        time.sleep(0.05)
        failed = next(((r, p.returncode) for r, p in enumerate(procs) if p.poll() not in (None, 0)), None)
    failed = failed or next(((r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0), None)
    if failed is not None:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        raise RuntimeError(f"rank {failed[0]} exited with status {failed[1]} (daemon log: {cluster.log_path})")
    wall = time.perf_counter() - t0
    # What the daemons cost the trainers' cores: CPU seconds of every spexd (all threads) over
    # the training's wall time, polling in collectives included.
    cpu = cpu_seconds(daemons) - cpu0
    print(f"train_digits: the {len(daemons)} daemon(s) used {cpu:.1f} CPU-seconds in {wall:.1f} s of training "
          f"({cpu / wall:.2f} cores of {os.cpu_count()})", flush=True)
    return wall


def summarize(run: Dict[str, Any], world: int, target_acc: float = 95.0,
              target_ppl: Optional[float] = None) -> Dict[str, Any]:
    out = run["out"]
    with open(os.path.join(out, "epochs.json")) as f:
        ep = json.load(f)
    if "unsupported" in ep:
        return {"label": run["label"], "compressor": run["compressor"], "unsupported": ep["unsupported"]}
    per_rank = []
    for r in range(world):
        with open(os.path.join(out, f"steps.rank{r}.csv")) as f:
            per_rank.append(list(csv.DictReader(f)))
    steps = len(per_rank[0])
    mismatched = [i for i in range(steps) if len({rows[i]["params_sha1"] for rows in per_rank}) != 1]
    checked = sum(1 for r in per_rank[0] if r["params_sha1"])
    if any(len(rows) != steps for rows in per_rank):
        mismatched.append(-1)
    rows0 = per_rank[0]
    exch = [float(r["exchange_s"]) for r in rows0]
    step_s = [float(r["step_s"]) for r in rows0]
    dens = [float(r["density"]) for r in rows0 if r["density"] not in ("nan", "")]
    dens = [d for d in dens if d == d]
    gath = [float(r["gathered_density"]) for r in rows0 if r["gathered_density"] not in ("nan", "")]
    gath = [d for d in gath if d == d]
    epochs = ep["epochs"]
    lm = epochs[0].get("test_ppl") is not None and target_ppl is not None
    if lm:  # a language model: the target is a test perplexity (lower is better)
        reached = next((e for e in epochs if e["test_ppl"] <= target_ppl), None)
        target_label, final_label = f"ppl {target_ppl:g}", f"ppl {epochs[-1]['test_ppl']:.1f}"
    else:
        reached = next((e for e in epochs if e["test_acc"] >= target_acc), None)
        target_label, final_label = f"{target_acc:g}%", f"{epochs[-1]['test_acc']:.2f}%"
    pct = lambda v, q: 1e3 * sorted(v)[min(len(v) - 1, int(q * len(v)))]  # noqa: E731
    # After the first epoch: its first steps register the buckets (twice: DDP rebuilds its
    # buckets after the first iteration) and touch fresh memory, up to 10x a later step.
    later = [float(r["exchange_s"]) for r in rows0 if int(r["epoch"]) > 0] or exch
    # CPU seconds per step: every trainer's (mean over ranks and steps) and every daemon's (the
    # local rank 0 rows, one per node), over the same steps as step_ms.
    cpu = [float(r["cpu_s"]) for rows in per_rank for r in rows if r.get("cpu_s")]
    dcpu = [float(r["daemon_cpu_s"]) for rows in per_rank for r in rows if r.get("daemon_cpu_s")]
    return {
        "trainer_cpu_ms": 1e3 * sum(cpu) / len(cpu) if cpu else None,
        "daemon_cpu_ms": 1e3 * sum(dcpu) / len(dcpu) if dcpu else None,
        "target_acc": target_acc, "time_to_target_s": reached["wall_s"] if reached else None,
        "target": target_label, "final": final_label,
        "final_ppl": epochs[-1].get("test_ppl"), "best_ppl": min((e["test_ppl"] for e in epochs), default=None)
        if lm else None,
        "epochs_to_target": reached["epoch"] + 1 if reached else None,
        "exchange_ms_p50": pct(exch, 0.5), "exchange_ms_p90": pct(exch, 0.9),
        "exchange_ms_p50_after_epoch1": pct(later, 0.5), "exchange_ms_p90_after_epoch1": pct(later, 0.9),
        "label": run["label"], "compressor": run["compressor"], "target_density": run["density"],
        "steps": steps, "epochs": len(epochs),
        "final_acc": epochs[-1]["test_acc"], "best_acc": max(e["test_acc"] for e in epochs),
        "final_loss": epochs[-1]["loss"], "exchange_ms_per_step": 1e3 * sum(exch) / len(exch),
        "step_ms": 1e3 * sum(step_s) / len(step_s), "achieved_density": sum(dens) / len(dens) if dens else None,
        "gathered_density": sum(gath) / len(gath) if gath else None,
        "bucket_exchanges": ep.get("bucket_exchanges", 0), "dense_exchanges": ep.get("dense_exchanges", 0),
        "dense_notes": ep.get("dense_notes", []), "patterns": ep.get("patterns", {}),
        "layer_nonzero": ep.get("layer_nonzero", {}),
        "params_identical": not mismatched, "mismatched_steps": mismatched[:10], "checked_steps": checked,
        "train_s": ep["run_s"], "buckets": ep["buckets"], "epoch_rows": epochs,
        "step_rows": [{k: r[k] for k in ("step", "epoch", "loss", "step_s", "exchange_s", "density", "gathered_density")}
                      for r in rows0],
    }


def write_outputs(results: List[Dict[str, Any]], out: str, title: str = "") -> None:
    with open(os.path.join(out, "steps.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "step", "epoch", "loss", "step_s", "exchange_s", "achieved_density", "gathered_density"])
        for r in results:
            for s in r["step_rows"]:
                w.writerow([r["label"], s["step"], s["epoch"], s["loss"], s["step_s"], s["exchange_s"], s["density"],
                            s["gathered_density"]])
    with open(os.path.join(out, "epochs.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "epoch", "loss", "test_acc", "exchange_ms", "achieved_density", "gathered_density",
                    "epoch_s", "step_ms", "wall_s"])
        for r in results:
            for e in r["epoch_rows"]:
                w.writerow([r["label"], e["epoch"], f"{e['loss']:.6f}", f"{e['test_acc']:.3f}",
                            f"{e['exchange_ms']:.4f}", e["density"], e.get("gathered_density", ""),
                            f"{e['epoch_s']:.4f}", f"{e['step_ms']:.3f}", f"{e['wall_s']:.3f}"])
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump([{k: v for k, v in r.items() if k not in ("step_rows", "epoch_rows")} for r in results], f, indent=1)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("train_digits: matplotlib missing, no plot (deploy/setup.sh installs python3-matplotlib)")
        return
    fig, ax = plt.subplots(2, 2, figsize=(11, 7.5))
    for r in results:
        label = r["label"]
        st = [int(s["step"]) for s in r["step_rows"]]
        ax[0][0].plot(st, [float(s["loss"]) for s in r["step_rows"]], label=label, lw=0.8)
        if r.get("final_ppl") is not None:
            ax[0][1].plot([e["wall_s"] for e in r["epoch_rows"]], [e["test_ppl"] for e in r["epoch_rows"]],
                          label=label, marker=".")
        else:
            ax[0][1].plot([0.0] + [e["wall_s"] for e in r["epoch_rows"]],
                          [10.0] + [e["test_acc"] for e in r["epoch_rows"]], label=label, marker=".")
        ax[1][0].plot(st, [1e3 * float(s["exchange_s"]) for s in r["step_rows"]], label=label, lw=0.6)
        d = [(int(s["step"]), float(s["density"])) for s in r["step_rows"] if s["density"] not in ("nan", "")]
        d = [(a, b) for a, b in d if b == b]
        if d:
            ax[1][1].plot([a for a, _ in d], [b for _, b in d], label=label, lw=0.8)
    ax[0][0].set(title="training loss (rank 0)", xlabel="step", yscale="log")
    if results and results[0].get("final_ppl") is not None:
        ax[0][1].set(title="test perplexity against wall-clock time", xlabel="seconds since the run's start",
                     yscale="log")
    else:
        ax[0][1].set(title="test accuracy (%) against wall-clock time", xlabel="seconds since the run's start",
                     ylim=(0, 100))
    ax[1][0].set(title="exchange time per step (ms, sum over buckets)", xlabel="step", yscale="log")
    ax[1][1].set(title="achieved density (GetStats, node 0)", xlabel="step", yscale="log")
    for a in ax.flat:
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "train_digits.png"), dpi=110)
    plt.close(fig)


def print_speedup_table(results: List[Dict[str, Any]]) -> None:
    """Time per step, time to the target accuracy, final accuracy and the speed-up over the first
    run (DDP's own all-reduce by default), all measured in this run."""
    base = results[0]
    target = base["target"]
    w = max(12, *(len(r["label"]) for r in results)) + 2
    print(f"\nresult (baseline: {base['label']}; speed-ups are ratios of times measured in this run)")
    print(f"{'run':<{w}}{'step ms':>9}{'exch ms':>9}{'exch p50/p90':>15}{'later p50/p90':>15}{'speed-up':>10}"
          f"{f'to {target}':>11}{'steps':>7}{'speed-up':>10}{'final':>11}{'trainer CPU':>12}{'daemon CPU':>11}")
    cpu_ms = lambda v: f"{v:.1f}" if v is not None else "-"  # noqa: E731
    for r in results:
        tt, bt = r["time_to_target_s"], base["time_to_target_s"]
        tts = f"{tt:.1f} s" if tt is not None else "never"
        tsu = f"{bt / tt:.2f}x" if tt and bt else "-"
        steps = r["epochs_to_target"] * r["steps"] // r["epochs"] if r["epochs_to_target"] else "-"
        print(f"{r['label']:<{w}}{r['step_ms']:>9.1f}{r['exchange_ms_per_step']:>9.1f}"
              f"{r['exchange_ms_p50']:>7.1f}/{r['exchange_ms_p90']:<7.1f}"
              f"{r['exchange_ms_p50_after_epoch1']:>7.1f}/{r['exchange_ms_p90_after_epoch1']:<7.1f}"
              f"{base['step_ms'] / r['step_ms']:>9.2f}x"
              f"{tts:>11}{steps:>7}{tsu:>10}{r['final']:>11}"
              f"{cpu_ms(r.get('trainer_cpu_ms')):>12}{cpu_ms(r.get('daemon_cpu_ms')):>11}")
    for line in against_hooks(results):
        print(line)
    print("step ms: forward + backward (with the exchange) + optimizer step, mean over rank 0's steps; exch ms: "
          "from handing a bucket over to its result, summed over the step's buckets (p50/p90: all steps; later: "
          "after the first epoch); to X%: wall-clock time from the run's start to the first epoch whose test "
          "accuracy reached X% (or whose test perplexity fell to the target; evaluation included); steps: the "
          "training steps up to the end of that epoch; trainer CPU / daemon CPU: CPU milliseconds (user + system, "
          "all threads) per step of each trainer process and of each node's spexd over the same steps (a "
          "trainer's own exchange wait included; a daemon's polling in MPI included)")


def against_hooks(results: List[Dict[str, Any]]) -> List[str]:
    """Each spex run's time to the target against the fastest PyTorch compression hook of this
    run (fp16, bf16, PowerSGD): the comparison a DDP user on a slow network would make."""
    hooks = [r for r in results if r["compressor"] in ("fp16", "bf16", "powersgd")]
    if not hooks:
        return []
    reached = [r for r in hooks if r["time_to_target_s"]]
    if not reached:
        return [f"no PyTorch hook ({', '.join(r['label'] for r in hooks)}) reached {results[0]['target']}"]
    best = min(reached, key=lambda r: r["time_to_target_s"])
    lines = []
    for r in results:
        if is_peer(r):
            continue
        if r["time_to_target_s"]:
            lines.append(f"{r['label']} reached {r['target']} {best['time_to_target_s'] / r['time_to_target_s']:.2f}x "
                         f"sooner than the fastest PyTorch hook ({best['label']}, {best['time_to_target_s']:.1f} s)")
        else:
            lines.append(f"{r['label']} never reached {r['target']}; the fastest PyTorch hook "
                         f"({best['label']}) did in {best['time_to_target_s']:.1f} s")
    return lines


def print_table(results: List[Dict[str, Any]]) -> None:
    base = next((r for r in results if r["compressor"] == "dense"), results[-1])
    labels = [r["label"] for r in results]
    w = max(12, *(len(x) for x in labels)) + 2
    print(f"\ncomparison (baseline: {base['label']}; exchange = submit-to-result time summed over a step's buckets)")
    print(f"{'run':<{w}}{'final acc':>10}{'best acc':>10}{'vs base':>9}{'loss':>9}{'exch ms/step':>14}"
          f"{'vs base':>9}{'density':>9}{'gathered':>9}{'dense exch':>12}{'step ms':>9}  params identical on all ranks")
    for label, r in zip(labels, results):
        ratio = r["exchange_ms_per_step"] / base["exchange_ms_per_step"] if base["exchange_ms_per_step"] else float("nan")
        dens = f"{r['achieved_density']:.4f}" if r["achieved_density"] is not None else "-"
        gath = f"{r['gathered_density']:.4f}" if r["gathered_density"] is not None else "-"
        sparse = r["compressor"] != "dense" and not is_peer(r)
        dx = f"{r['dense_exchanges']}/{r['bucket_exchanges']}" if sparse else "-"
        same = f"{'yes' if r['params_identical'] else 'NO'} ({r['checked_steps']}/{r['steps']} steps checked)"
        print(f"{label:<{w}}{r['final_acc']:>9.2f}%{r['best_acc']:>9.2f}%{r['final_acc'] - base['final_acc']:>+9.2f}"
              f"{r['final_loss']:>9.4f}{r['exchange_ms_per_step']:>14.3f}{ratio:>8.2f}x{dens:>9}{gath:>9}{dx:>12}"
              f"{r['step_ms']:>9.2f}  {same}")
    print("density: the daemon's achieved density (this node's selection / elements, element-weighted, node 0); "
          "gathered: what every node received / elements (pattern A: the union of all nodes' selections); "
          "dense exch: bucket exchanges of a sparse run that went dense / all seen in GetStats after each step")
    for label, r in zip(labels, results):
        for n in r["dense_notes"]:
            print(f"  {label}: bucket of {n['elements']} elements went DENSE in {n['count']} exchange(s) from step "
                  f"{n['first_step']}: {n['why']}")
        if r["compressor"] != "dense" and not is_peer(r) and not r["dense_notes"] and r["bucket_exchanges"]:
            print(f"  {label}: every exchange seen was sparse ({r['bucket_exchanges']} bucket exchanges)")


def print_layer_table(results: List[Dict[str, Any]]) -> None:
    """Per module: the fraction of its elements that the averaged update (the gradient every
    trainer applied) held non-zero, over all steps, and the module's share of all non-zeros.
    With DDP's own all-reduce this is the gradient's natural sparsity (an embedding's gradient
    touches only the batch's words); with a compressor it shows where the selection went."""
    rows = [r for r in results if r.get("layer_nonzero")]
    if not rows:
        return
    mods = list(rows[0]["layer_nonzero"])
    sizes = {m: rows[0]["layer_nonzero"][m][1] // max(1, rows[0]["steps"]) for m in mods}
    w = max(12, *(len(r["label"]) for r in rows)) + 2
    print("\nupdate density by module (non-zero fraction of the averaged update over all steps, rank 0; "
          "in brackets: the module's share of all non-zeros)")
    print(f"{'run':<{w}}" + "".join(f"{f'{m} ({sizes[m]:,})':>24}" for m in mods))
    for r in rows:
        ln = r["layer_nonzero"]
        total = sum(v[0] for v in ln.values()) or 1
        cells = []
        for m in mods:
            nz, n = ln.get(m, [0, 0])
            cells.append(f"{nz / n if n else 0.0:>14.5f} ({100.0 * nz / total:>5.1f}%)")
        print(f"{r['label']:<{w}}" + "".join(f"{c:>24}" for c in cells))


def honesty_note(args: argparse.Namespace, ncpu: int, pinned: str = "") -> str:
    """What this machine's cores could and could not show."""
    procs = args.nodes * (args.trainers + 1)
    if args.network == "loopback":
        return (f"note: on loopback no link is slow, so there is no bandwidth for sparsification to win back; "
                f"{procs} processes share {ncpu} core(s), {pinned}")
    share = (f"each emulated host has its own core" if args.nodes <= ncpu else
             f"{args.nodes} emulated hosts share {ncpu} core(s), so hosts steal each other's compute and every "
             f"step's compute is slower than on real hosts")
    return (f"note: {share}; each host's {args.trainers} trainer(s) and daemon share its core(s), and the kernel's "
            f"network work for the emulated links (veth, tc) runs on the same {ncpu} core(s). Real hosts would have "
            f"more cores per node: compute-bound runs (sparse ones) would gain more than link-bound ones (DDP, dense), "
            f"so these speed-ups understate what separate machines on a {args.rate} network would see.")


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.worker is not None:
        worker(json.loads(args.worker))
        return 0
    runs = parse_runs(args.runs)
    if args.lr is None:
        args.lr = 0.5 if args.model == "lstm" else 0.05
    from spex.cluster import LocalCluster
    from spex.emulated import EmulatedCluster, EmulationUnavailable

    # SIGTERM unwinds like Ctrl-C, so the cluster (and on emulated hosts the network) is torn down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = os.path.abspath(args.results or os.path.join(repo, "bench", "results", "train_digits"))
    os.makedirs(out, exist_ok=True)
    spexd_args = args.spexd_arg or DEFAULT_SPEXD_ARGS
    params = {}
    for kv in args.param:
        k, eq, v = kv.partition("=")
        if not eq or not k:
            sys.exit(f"train_digits: --param {kv!r} is not KEY=VALUE")
        params[k] = v
    for run in runs:
        if run["compressor"] != "dense" and not is_peer(run):
            run["params"] = params
    h = args.hidden
    n_params = 64 * h + h + h * h + h + h * 10 + 10
    model_desc = f"MLP 64-{h}-{h}-10 ({n_params / 1e6:.2f}M parameters) on digits"
    if args.model == "lstm":
        v = args.vocab
        n_params = v * 128 + 4 * 256 * (128 + 256 + 2) + 256 * v + v
        model_desc = (f"LSTM language model (embedding {v}x128, LSTM 256, {n_params / 1e6:.2f}M parameters) on "
                      f"English text (Debian's fortunes), {args.steps_per_epoch} steps of {args.bptt} tokens per epoch")
    where = (f"emulated hosts at {args.rate} each way" + (f", +{args.latency_us} us one-way" if args.latency_us else "")
             if args.network == "emulated" else "this machine's loopback")
    print(f"train_digits: {args.nodes} nodes x {args.trainers} trainers on {where} (DDP over gloo, "
          f"{args.nodes * args.trainers} processes), {model_desc}, "
          f"{args.epochs} epochs, batch {args.batch}/process, runs: {', '.join(r['label'] for r in runs)}; "
          f"spexd {' '.join(spexd_args)}; results in {out}", flush=True)
    planned = []
    pinned = ""
    if args.network == "emulated":
        why = EmulatedCluster.unavailable()
        if why:
            print(f"train_digits: ERROR: --network=emulated: {why}. Run as root on a machine that permits network "
                  f"namespaces, or use --network=loopback (no slow link: spex has no bandwidth to win back there).",
                  flush=True)
            return 3
        cluster_cm: Any = EmulatedCluster(args.spexd, hosts=args.nodes, trainers=args.trainers, args=spexd_args,
                                          rate=args.rate, latency_us=args.latency_us,
                                          log=os.path.join(out, "spexd.log"))
    else:
        cluster_cm = LocalCluster(args.spexd, nodes=args.nodes, trainers=args.trainers, args=spexd_args,
                                  log=os.path.join(out, "spexd.log"), pin=args.pin)
    ncpu = os.cpu_count() or 1
    with cluster_cm as cluster:
        if args.network == "emulated":
            print(f"train_digits: {cluster.description}", flush=True)
        else:
            pinned = cluster.pin_description()
            print(f"train_digits: {pinned}", flush=True)
        for run in runs:
            if not is_peer(run):
                why = check_compressor(cluster.socket(0), args.trainers, run)
                if why is not None:
                    print(f"train_digits: ERROR: run {run['label']}: {why}", flush=True)
                    return 2
            run["out"] = os.path.join(out, run["label"].replace("@", "_").replace("/", "_"))
            os.makedirs(run["out"], exist_ok=True)
            planned.append(run)
        wall = launch(planned, args, cluster)
    results = [summarize(run, args.nodes * args.trainers, args.target_acc,
                         args.target_ppl if args.model == "lstm" else None) for run in planned]
    for r in results:
        if "unsupported" in r:
            print(f"train_digits: run {r['label']} was not run: {r['unsupported']}")
    results = [r for r in results if "unsupported" not in r]
    title = (f"{args.nodes} nodes x {args.trainers} trainers, {where}, {model_desc.split(' (')[0]} "
             f"{n_params / 1e6:.1f}M parameters, "
             f"{ncpu} cores")
    if results:
        write_outputs(results, out, title)
        print_table(results)
        print_speedup_table(results)
        print_layer_table(results)
        print(honesty_note(args, ncpu, pinned))
    print(f"\ntraining processes ran {wall:.1f} s for {len(results)} run(s)")
    print(f"per-step CSV: {out}/steps.csv, per-epoch CSV: {out}/epochs.csv, plot: {out}/train_digits.png, "
          f"summary: {out}/summary.json, daemon log: {out}/spexd.log")
    bad = [r["label"] for r in results if not r["params_identical"]]
    if bad:
        print(f"ERROR: parameters differ between ranks in run(s) {', '.join(bad)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
