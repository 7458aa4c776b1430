"""The Python client's device buckets and the DDP hook against a real spexd --device=cuda, on a
machine WITH a GPU (tests/cuda/gpu_check.sh starts the daemon and two of these, one per local
trainer; none of this project's build machines has a GPU, so it is not part of the suite).

    python3 gpu_python_check.py SOCKET LOCAL_RANK PORT

1. spex.Client(device="cuda"): a 1,048,576-float dense bucket, integer inputs (every sum exact),
   exchanged through the doorbell and the RPC path, 4 steps each, on a side stream: the output
   tensor must equal the exact average of both trainers' inputs.
2. spex.torch.register(ddp, device="cuda", compressor="dense"): a CUDA model in a gloo DDP world
   of the two trainers, 3 steps; every gradient DDP hands back must equal the mean of both ranks'
   local gradients (computed on a copy of the model without DDP, all_gathered over gloo on the
   CPU), within 1e-6 relative.
3. Half buckets on the GPU (docs/dtypes.md): a bfloat16 and a float16 dense bucket of 1,048,576
   values and a bfloat16 topk@0.01 bucket, 4 steps: the dense output must equal, bit for bit,
   torch's rounding of the float32 average of the widened inputs (the daemon widens, sums in
   float32 and rounds once on the GPU, half.cu); the topk output's non-zeros at step 0 equal it
   at their positions and are about 1% of the bucket.
Exits 0 and prints "python cuda OK" on success.
"""

import os
import sys

import torch
import torch.distributed as dist

import spex
import spex.torch


def check_client(sock: str, rank: int) -> None:
    n = 1 << 20
    torch.cuda.set_device(0)
    side = torch.cuda.Stream()
    with spex.Client(sock, local_rank=rank, local_size=2, device="cuda") as c:
        b = c.register_bucket(0, n, compressor="dense")
        assert b.on_device and b.input_tensor.is_cuda, "the bucket is not on the GPU"
        base = torch.arange(n, device="cuda", dtype=torch.float32) % 1000
        for step in range(8):
            mode = "doorbell" if step < 4 else "rpc"
            with torch.cuda.stream(side):
                mine = base * (rank + 1) + step
                out = c.exchange(b, mine, mode=mode, stream=side)
                want = (base * 1 + step + base * 2 + step) / 2
                if not torch.equal(out, want):
                    bad = (out != want).nonzero()[0].item()
                    raise SystemExit(f"client step {step} ({mode}): output[{bad}] = "
                                     f"{out[bad].item()}, want {want[bad].item()}")
        c.unregister_bucket(b)
    print(f"rank {rank}: client device bucket exact over 8 steps (doorbell and rpc)", flush=True)


def check_half_client(sock: str, rank: int) -> None:
    n = 1 << 20
    torch.cuda.set_device(0)
    with spex.Client(sock, local_rank=rank, local_size=2, device="cuda") as c:
        buckets = [(c.register_bucket(10, n, compressor="dense", dtype=torch.bfloat16), torch.bfloat16),
                   (c.register_bucket(11, n, compressor="dense", dtype=torch.float16), torch.float16),
                   (c.register_bucket(12, n, compressor="topk", density=0.01, dtype=torch.bfloat16),
                    torch.bfloat16)]
        base = (torch.arange(n, device="cuda", dtype=torch.float32) % 1999 - 999) / 37
        for step in range(4):
            mode = "doorbell" if step % 2 == 0 else "rpc"
            for b, dtype in buckets:
                if not b.on_device or b.input_tensor.dtype != dtype:
                    raise SystemExit(f"bucket {b.id} is not a {dtype} device bucket")
                mine = (base * (rank + 1) + step).to(dtype)
                out = c.exchange(b, mine, mode=mode)
                widened = [(base * (r + 1) + step).to(dtype).float() for r in range(2)]
                want = ((widened[0] + widened[1]) * 0.5).to(dtype)
                if out.dtype != dtype:
                    raise SystemExit(f"half bucket {b.id}: output tensor of {out.dtype}, not {dtype}")
                if b.id != 12 and not torch.equal(out.view(torch.int16), want.view(torch.int16)):
                    bad = (out.view(torch.int16) != want.view(torch.int16)).nonzero()[0].item()
                    raise SystemExit(f"half bucket {b.id} step {step} ({mode}): output[{bad}] = "
                                     f"{out[bad].item()}, want {want[bad].item()}")
                if b.id == 12 and step == 0:
                    nz = out != 0
                    count = int(nz.sum().item())
                    if not 0.005 * n <= count <= 0.02 * n or not torch.equal(out[nz].float(), want[nz].float()):
                        raise SystemExit(f"half topk bucket step 0: {count} non-zeros, or values off the "
                                         f"average")
        for b, _ in buckets:
            c.unregister_bucket(b)
    print(f"rank {rank}: bfloat16/float16 device buckets rounded once, exact over 4 steps", flush=True)


def check_ddp(sock: str, rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10)).cuda()
    local = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10)).cuda()
    local.load_state_dict(model.state_dict())
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    state = spex.torch.register(ddp, compressor="dense", socket=sock, local_rank=rank,
                                local_size=2, device="cuda", id_base=1 << 20)
    try:
        gen = torch.Generator().manual_seed(100 + rank)
        for step in range(3):
            x = torch.randn(64, 512, generator=gen).cuda()
            y = torch.randint(0, 10, (64,), generator=gen).cuda()
            ddp.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            local.zero_grad()
            torch.nn.functional.cross_entropy(local(x), y).backward()
            for (name, p), q in zip(ddp.module.named_parameters(), local.parameters()):
                mine = q.grad.detach().cpu()
                both = [torch.empty_like(mine) for _ in range(2)]
                dist.all_gather(both, mine)
                want = (both[0] + both[1]) / 2
                got = p.grad.detach().cpu()
                err = (got - want).abs().max().item()
                if err > 1e-6 * (want.abs().max().item() + 1e-12):
                    raise SystemExit(f"ddp step {step} {name}: max error {err}")
            # Both copies take the same averaged step, so they stay equal.
            with torch.no_grad():
                for p, q in zip(ddp.module.parameters(), local.parameters()):
                    p -= 0.1 * p.grad
                    q.copy_(p)
    finally:
        state.close()
        dist.destroy_process_group()
    print(f"rank {rank}: DDP hook on CUDA buckets matches the mean gradient over 3 steps", flush=True)


def main() -> None:
    sock, rank, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    check_client(sock, rank)
    check_half_client(sock, rank)
    check_ddp(sock, rank, port)
    print("python cuda OK", flush=True)


if __name__ == "__main__":
    main()
