#!/usr/bin/python3
"""A backprop profile of ResNet-50 (a program, not a test; the input of bench/merge_bench.py).

ResNet-50 (torchvision's layout: 7x7 stem, bottleneck stages of 3, 4, 6 and 3 blocks, widths
64-2048, batch norm after every convolution, a 1000-way classifier; 161 parameter tensors,
25,557,032 parameters), written out here because Debian's PyTorch comes without torchvision, runs
on this machine's CPU with PyTorch's own autograd. A hook on every parameter stamps the moment
its gradient is ready; the profile is, per parameter in the order the gradients became ready, its
element count and that moment as a fraction of the backward pass, the median over --runs passes
after one warm-up pass, plus the forward/backward time ratio. merge_bench.py scales the fractions
to the backward time it is told to emulate: the shape is measured, the absolute time is the
benchmark's choice (this CPU is far slower than the GPUs a job would use).

    /usr/bin/python3 bench/resnet50_profile.py [--batch 4] [--size 112] [--runs 3] [--threads 2]
        [--out bench/results/resnet50_backward.json]
"""
import argparse
import json
import os
import statistics
import time

import torch
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Bottleneck(nn.Module):
    def __init__(self, cin, width, stride):
        super().__init__()
        cout = 4 * width
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNet50(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers, cin = [], 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for b in range(blocks):
                layers.append(Bottleneck(cin, width, stride if b == 0 else 1))
                cin = 4 * width
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(2048, 1000)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = nn.functional.max_pool2d(x, 3, 2, 1)
        x = self.layers(x)
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--size", type=int, default=112, help="input image side (pixels)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/resnet50_backward.json"))
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model = ResNet50()
    params = list(model.named_parameters())
    total = sum(p.numel() for _, p in params)
    assert len(params) == 161 and total == 25557032, (len(params), total)
    stamps = {}

    def hook_for(name):
        def hook(grad):
            stamps[name] = time.perf_counter()
            return grad
        return hook

    for name, p in params:
        p.register_hook(hook_for(name))
    x = torch.randn(args.batch, 3, args.size, args.size)
    target = torch.randint(0, 1000, (args.batch,))
    fractions = {name: [] for name, _ in params}
    forward_s, backward_s = [], []
    for run in range(args.runs + 1):
        model.zero_grad(set_to_none=True)
        stamps.clear()
        t0 = time.perf_counter()
        loss = nn.functional.cross_entropy(model(x), target)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if run == 0:
            continue  # warm-up
        forward_s.append(t1 - t0)
        backward_s.append(t2 - t1)
        for name in fractions:
            fractions[name].append((stamps[name] - t1) / (t2 - t1))
    ready = sorted(((statistics.median(f), name) for name, f in fractions.items()))
    sizes = dict((name, p.numel()) for name, p in params)
    profile = {
        "model": "resnet50",
        "parameters": total,
        "tensors": len(params),
        "batch": args.batch,
        "image_side": args.size,
        "threads": args.threads,
        "forward_s": statistics.median(forward_s),
        "backward_s": statistics.median(backward_s),
        "note": "measured on this machine's CPU with PyTorch's autograd; merge_bench.py uses the shape "
                "(order, sizes, fractions of the backward pass), not the absolute times",
        "ready": [{"name": name, "elements": sizes[name], "fraction": round(frac, 6)} for frac, name in ready],
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(profile, f, indent=1)
    print(f"forward {profile['forward_s'] * 1e3:.0f} ms, backward {profile['backward_s'] * 1e3:.0f} ms "
          f"(batch {args.batch}, {args.size}x{args.size}); first gradient ready at "
          f"{ready[0][0]:.3f}, last at {ready[-1][0]:.3f} of the backward pass; wrote {args.out}")


if __name__ == "__main__":
    main()
