#!/usr/bin/python3
"""Index sets from real gradients for the scale harness (docs/scale.md, "Inputs").

record: trains the main job's MLP (64-3200-3200-10 on digits, 10,483,210 parameters) or LSTM
(embedding 5000x128, LSTM 256, 2,320,264 parameters, on Debian's fortunes), built by
deploy/mainjob/models.py, for a few hundred steps of plain SGD with momentum on the dense average
of P virtual workers' gradients (each worker its own shard of the training set), and at a few
steps (early, middle, late) computes every worker's own gradient on a batch of its shard (the
main job's per-process batch, 16) and writes its top-k index set at each density:

    /usr/bin/python3 bench/scale/record_selections.py record --model mlp --workers 64 \
        --out /tmp/sel_mlp.bin [--steps 200 --record-at 10,100,199 --densities 0.01,0.001]

The selection is **plain top-k by magnitude of that step's gradient**, not the accumulated
gradient with error feedback that spexd's topk compressor selects from (keeping 64 residuals of
10.5M floats and selecting on all of them every step was too slow for 2 cores); error feedback
spreads a selection over more positions over time, so these sets are, if anything, more skewed
than the compressor's.

resample: writes the harness's index file (`scale_harness --indices FILE`) for a bucket of n
elements and P nodes from one recorded step and density:

    /usr/bin/python3 bench/scale/record_selections.py resample --recording /tmp/sel_mlp.bin \
        --record-step -1 --density 0.01 --n 25557032 --nodes 64 --out /tmp/mlp_25M_d01.idx

Sizes other than the model's own are not gradients of that size: each recorded worker's set is
stretched (or shrunk) to n by its index-density profile (the skew of the MLP's selection at
ResNet-50's size, say). Position j of the new bucket covers [j, j+1) x n0/n of the recorded one;
its mass m_j is the fraction of that span the worker selected; the k = density x n positions with
the smallest u_j / m_j are kept, u_j a uniform number drawn from j alone (the same on every
worker, so positions the workers share stay shared). At n = n0 this is the recorded set. Nodes
beyond the recorded workers reuse worker (node mod workers)'s set shifted by (node div workers)
x 7919 positions (mod n): the same density profile at the 64 kilobyte scale, not new workers.

stats: per recorded step and density, the union's size over the workers and the busiest of P
equal regions over the mean (Ok-Topk's skew before its rebalancing).

Recording file (little-endian): b"SPXSEL01", uint32 workers, uint32 records, uint64 n, then per
record: uint32 step, float32 density, uint64 k, then per worker uint32 bytes + zlib of its
sorted indices' deltas (uint32, the first from 0).
Index file (harness): b"SPXIDX01", uint32 nodes, uint32 0, uint64 n, uint64 offset[nodes + 1]
(in entries), then every node's sorted uint32 indices.
"""
import argparse
import json
import os
import struct
import sys
import time
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SHIFT = 7919  # nodes beyond the recorded workers: worker (node mod W)'s set shifted by this


def write_recording(path, n, workers, records):
    with open(path, "wb") as f:
        f.write(b"SPXSEL01" + struct.pack("<IIQ", workers, len(records), n))
        for step, density, sets in records:
            k = len(sets[0])
            f.write(struct.pack("<IfQ", step, density, k))
            for s in sets:
                z = zlib.compress(np.diff(s.astype(np.int64), prepend=0).astype("<u4").tobytes(), 6)
                f.write(struct.pack("<I", len(z)) + z)


def read_recording(path):
    """Returns (n, workers, [(step, density, [sorted uint32 arrays per worker])])."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"SPXSEL01":
        sys.exit(f"{path}: not a selection recording")
    workers, nrec, n = struct.unpack_from("<IIQ", data, 8)
    off = 24
    records = []
    for _ in range(nrec):
        step, density, k = struct.unpack_from("<IfQ", data, off)
        off += 16
        sets = []
        for _ in range(workers):
            (zb,) = struct.unpack_from("<I", data, off)
            off += 4
            d = np.frombuffer(zlib.decompress(data[off:off + zb]), dtype="<u4")
            off += zb
            sets.append(np.cumsum(d, dtype=np.uint64).astype(np.uint32))
        records.append((step, round(density, 6), sets))
    return n, workers, records


def write_index_file(path, n, sets):
    offs = np.zeros(len(sets) + 1, dtype="<u8")
    offs[1:] = np.cumsum([len(s) for s in sets])
    with open(path + ".tmp", "wb") as f:
        f.write(b"SPXIDX01" + struct.pack("<IIQ", len(sets), 0, n))
        f.write(offs.tobytes())
        for s in sets:
            f.write(np.ascontiguousarray(s, dtype="<u4").tobytes())
    os.replace(path + ".tmp", path)


def read_index_file(path, nodes=None):
    """(n, [sorted uint32 arrays]) of an index file, its first `nodes` sets."""
    with open(path, "rb") as f:
        head = f.read(24)
        if head[:8] != b"SPXIDX01":
            sys.exit(f"{path}: not an index file")
        total, _, n = struct.unpack_from("<IIQ", head, 8)
        offs = np.frombuffer(f.read(8 * (total + 1)), dtype="<u8")
        sets = []
        for r in range(nodes or total):
            f.seek(24 + 8 * (total + 1) + 4 * int(offs[r]))
            sets.append(np.frombuffer(f.read(4 * int(offs[r + 1] - offs[r])), dtype="<u4"))
    return n, sets


def uniform_of(j, seed=12345):
    """A uniform number in (0, 1) drawn from position j alone (splitmix64 of j)."""
    with np.errstate(over="ignore"):
        z = j.astype(np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return ((z >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)


def resample(sel, n0, n, k):
    """The k positions of a bucket of n elements that follow `sel`'s density over [0, n0)."""
    sel = np.asarray(sel, dtype=np.int64)
    if n == n0 and len(sel) == k:
        return sel.astype(np.uint32)
    s = n / n0  # new positions per recorded one
    lo = np.floor(sel * s).astype(np.int64)
    hi = np.minimum(np.ceil((sel + 1) * s).astype(np.int64), n)  # new cells touched: [lo, hi)
    cnt = hi - lo
    rep = np.repeat(np.arange(len(sel)), cnt)
    j = np.repeat(lo, cnt) + (np.arange(len(rep)) - np.repeat(np.cumsum(cnt) - cnt, cnt))
    # Overlap of recorded cell [i, i+1) with new cell j's span [j/s, (j+1)/s), as a fraction of
    # the span.
    a = np.maximum(sel[rep].astype(np.float64), j / s)
    b = np.minimum(sel[rep].astype(np.float64) + 1, (j + 1) / s)
    w = np.clip(b - a, 0, None) * s
    uj, inv = np.unique(j, return_inverse=True)
    mass = np.bincount(inv, weights=w)
    keep = mass > 0
    uj, mass = uj[keep], mass[keep]
    if len(uj) < k:  # not enough mass (rounding): the neighbours of the selected cells follow
        extra = np.setdiff1d(np.clip(np.concatenate([uj - 1, uj + 1]), 0, n - 1), uj)
        uj = np.concatenate([uj, extra])
        mass = np.concatenate([mass, np.full(len(extra), 1e-9)])
    order = np.argsort(uniform_of(uj) / mass, kind="stable")[:k]
    return np.sort(uj[order]).astype(np.uint32)


def node_sets(sets, n0, n, k, nodes):
    out = []
    for r in range(nodes):
        base = resample(sets[r % len(sets)], n0, n, k)
        shift = (r // len(sets)) * SHIFT
        out.append(np.sort((base.astype(np.int64) + shift) % n).astype(np.uint32) if shift else base)
    return out


def skew_stats(sets, n, parts):
    """Union size over the sets and the busiest of `parts` equal regions over the mean."""
    union = np.unique(np.concatenate(sets)).size
    bounds = np.linspace(0, n, parts + 1).astype(np.int64)
    per = np.zeros(parts)
    for s in sets:
        per += np.diff(np.searchsorted(s, bounds))
    return union, float(per.max() / per.mean())


def cmd_record(a):
    import torch
    sys.path.insert(0, os.path.join(REPO, "deploy", "mainjob"))
    import models  # the main job's workloads

    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    rng = np.random.default_rng(a.seed)
    if a.model == "mlp":
        cfg = {"seed": a.seed, "hidden": 3200}
        wl = models.DigitsMLP()
        xtr, ytr, _, _ = wl.load(cfg)
        model = wl.build(cfg)
        ntrain = len(xtr)

        def loss_of(idx):
            return torch.nn.functional.cross_entropy(model(xtr[idx]), ytr[idx])
        lr = a.lr or 0.05
    else:
        cfg = {"seed": a.seed, "vocab": 5000, "bptt": 35}
        train, _ = models.load_text(cfg["seed"], cfg["vocab"], cfg["bptt"])
        model = models.lstm_model(cfg["vocab"])
        ntrain = len(train)

        def loss_of(idx):
            seq = train[idx]
            return torch.nn.functional.cross_entropy(
                model(seq[:, :-1]).reshape(-1, cfg["vocab"]), seq[:, 1:].reshape(-1))
        lr = a.lr or 0.5
    params = [p for p in model.parameters()]
    n = sum(p.numel() for p in params)
    shards = np.array_split(rng.permutation(ntrain), a.workers)
    opt = torch.optim.SGD(params, lr=lr, momentum=0.9)
    densities = [float(x) for x in a.densities.split(",")]
    record_at = sorted({(int(x) if int(x) >= 0 else a.steps + int(x)) for x in a.record_at.split(",")})
    records = []
    print(f"record: {a.model}, {n:,} parameters, {a.workers} workers (shards of {len(shards[0])}), "
          f"{a.steps} steps; record at {record_at}", flush=True)
    t0 = time.time()
    for step in range(a.steps):
        if step in record_at:
            sets = {d: [] for d in densities}
            for wk in range(a.workers):
                idx = torch.tensor(rng.choice(shards[wk], a.record_batch, replace=False))
                model.zero_grad()
                loss_of(idx).backward()
                g = torch.cat([p.grad.reshape(-1) for p in params]).abs()
                for d in densities:
                    k = max(1, int(d * n))
                    sets[d].append(np.sort(torch.topk(g, k, sorted=False).indices.numpy()).astype(np.uint32))
            for d in densities:
                u, sk = skew_stats(sets[d], n, a.workers)
                print(f"  step {step} d={d}: union of {a.workers} = {u:,} ({u / (d * n):.1f}k), "
                      f"busiest of {a.workers} regions {sk:.2f}x the mean", flush=True)
                records.append((step, d, sets[d]))
        # One training step: every worker's batch from its shard, the dense average.
        idx = torch.tensor(np.concatenate([rng.choice(s, a.train_batch, replace=False) for s in shards]))
        model.zero_grad()
        loss = loss_of(idx)
        loss.backward()
        opt.step()
        if step % 20 == 0 or step == a.steps - 1:
            print(f"  step {step} loss {loss.item():.4f} ({time.time() - t0:.0f} s)", flush=True)
    write_recording(a.out, n, a.workers, records)
    print(f"record: {a.out} ({os.path.getsize(a.out) / 1e6:.1f} MB)")


def pick(records, step, density):
    steps = sorted({r[0] for r in records})
    want = steps[step] if step < len(steps) and step >= -len(steps) else step
    for r in records:
        if r[0] == want and abs(r[1] - density) < 1e-9:
            return r
    sys.exit(f"no record at step {want} density {density} (steps {steps})")


def cmd_resample(a):
    n0, workers, records = read_recording(a.recording)
    step, d, sets = pick(records, a.record_step, a.density)
    k = max(1, int(np.floor(a.density * a.n)))
    out = node_sets(sets, n0, a.n, k, a.nodes)
    write_index_file(a.out, a.n, out)
    u, sk = skew_stats(out, a.n, a.nodes)
    print(json.dumps({"index_file": a.out, "recording": os.path.basename(a.recording),
                      "recorded_step": step, "density": d, "n": a.n, "k": k, "nodes": a.nodes,
                      "union": u, "union_over_k": round(u / k, 3),
                      "busiest_region_over_mean": round(sk, 3)}))


def cmd_stats(a):
    n0, workers, records = read_recording(a.recording)
    for step, d, sets in records:
        for p in [int(x) for x in a.nodes.split(",")]:
            if p > workers:
                continue
            u, sk = skew_stats(sets[:p], n0, p)
            print(json.dumps({"step": step, "density": d, "nodes": p, "k": len(sets[0]),
                              "union_over_k": round(u / len(sets[0]), 3),
                              "busiest_region_over_mean": round(sk, 3)}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--model", choices=("mlp", "lstm"), required=True)
    r.add_argument("--workers", type=int, default=64)
    r.add_argument("--steps", type=int, default=200)
    r.add_argument("--record-at", default="10,100,-1", help="steps (negative: from the end)")
    r.add_argument("--densities", default="0.01,0.001")
    r.add_argument("--train-batch", type=int, default=4, help="per worker, training steps")
    r.add_argument("--record-batch", type=int, default=16, help="per worker, recorded gradients")
    r.add_argument("--lr", type=float, default=0)
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--out", required=True)
    r.set_defaults(fn=cmd_record)
    s = sub.add_parser("resample")
    s.add_argument("--recording", required=True)
    s.add_argument("--record-step", type=int, default=-1, help="index into the recorded steps")
    s.add_argument("--density", type=float, required=True)
    s.add_argument("--n", type=int, required=True)
    s.add_argument("--nodes", type=int, required=True)
    s.add_argument("--out", required=True)
    s.set_defaults(fn=cmd_resample)
    t = sub.add_parser("stats")
    t.add_argument("--recording", required=True)
    t.add_argument("--nodes", default="4,8,16,32,64")
    t.set_defaults(fn=cmd_stats)
    a = ap.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
