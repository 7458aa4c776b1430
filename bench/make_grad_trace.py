#!/usr/bin/python3
"""Records a real gradient trace for bench/compressors_bench (compression-ratio error of the
MiCRO/ExDyna threshold controls): an MLP 64-1024-1024-10 (1,126,410 parameters) trained on
scikit-learn's digits by 4 simulated data-parallel workers (each its own shard and batch, plain
SGD with momentum on the dense average of the 4 gradients), dumping every worker's flat gradient
of every step.

Run with Debian's Python (torch 1.13 CPU and scikit-learn):
    /usr/bin/python3 bench/make_grad_trace.py --out /tmp/spex_grad_trace.bin --steps 300

File format (little-endian), about steps * workers * params * 2 bytes (2.7 GB for the defaults):
    header, 40 bytes:
        char[8]  magic   b"SPXGRAD1"
        uint32   version 1
        uint32   workers
        uint32   steps
        uint32   dtype   1 = float16 scaled (the only one)
        uint64   params  (floats per gradient)
        uint64   header_bytes 40
    then for step in 0..steps-1, for worker in 0..workers-1, one record:
        float32  scale
        float16  g[params]        the gradient is g[i] * scale (float16 value times the scale)
    The scale is max|g| / 32768 per record, so each record keeps float16's 11 significant bits
    relative to its own largest entry (entries below about 2^-39 of the maximum round to zero).
Parameters are flattened in model.parameters() order (weights then bias, layer by layer).
"""
import argparse
import struct
import sys
import time

import numpy as np
import torch
from sklearn.datasets import load_digits


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/spex_grad_trace.bin")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32, help="per-worker batch")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    rng = np.random.default_rng(args.seed)
    digits = load_digits()
    x = digits.data.astype(np.float32) / 16.0
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    y = digits.target.astype(np.int64)
    order = rng.permutation(len(x))
    test, train = order[:300], order[300:]
    shards = np.array_split(train, args.workers)

    model = torch.nn.Sequential(
        torch.nn.Linear(64, args.hidden), torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, 10))
    params = list(model.parameters())
    nparams = sum(p.numel() for p in params)
    opt = torch.optim.SGD(params, lr=args.lr, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    t0 = time.time()
    with open(args.out, "wb") as f:
        f.write(b"SPXGRAD1" + struct.pack("<IIIIQQ", 1, args.workers, args.steps, 1, nparams, 40))
        for step in range(args.steps):
            grads = []
            for w in range(args.workers):
                idx = rng.choice(shards[w], size=args.batch, replace=False)
                model.zero_grad()
                loss = loss_fn(model(xt[idx]), yt[idx])
                loss.backward()
                g = torch.cat([p.grad.reshape(-1) for p in params]).numpy().astype(np.float32)
                grads.append(g.copy())
                m = float(np.abs(g).max())
                scale = m / 32768.0 if m > 0 else 1.0
                f.write(struct.pack("<f", scale))
                f.write((g / scale).astype(np.float16).tobytes())
            avg = np.mean(grads, axis=0)
            off = 0
            for p in params:
                p.grad = torch.from_numpy(avg[off:off + p.numel()].reshape(p.shape).copy())
                off += p.numel()
            opt.step()
            if step % 50 == 0 or step == args.steps - 1:
                with torch.no_grad():
                    acc = (model(xt[test]).argmax(1) == yt[test]).float().mean().item()
                print(f"step {step:4d} loss {loss.item():.4f} test accuracy {acc:.3f} "
                      f"({time.time() - t0:.1f} s)", flush=True)
    print(f"wrote {args.out}: {args.steps} steps x {args.workers} workers x {nparams} params",
          file=sys.stderr)


if __name__ == "__main__":
    main()
