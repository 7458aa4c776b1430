"""The main job's flags (deploy/train_digits.py documents what they do together)."""

import argparse
from typing import List, Optional

from mainjob.models import WORKLOADS

# --fp16_values: the sparse values travel as float16 (error feedback keeps the rounding); with the
# delta index form (spexd's default) micro@0.1's exchange is 0.42x the bytes of uint32 indices and
# float32 values (docs/benchmarks.md, "Time to target with compact wire values").
DEFAULT_SPEXD_ARGS = ["--threads=1", "--dense_fallback=off", "--min_sparse_elements=1024", "--fp16_values",
                      "--mpi_sleep_beside_compute=auto", "--log_level=warning"]


def parse_args(argv: Optional[List[str]] = None, description: str = "") -> argparse.Namespace:
    """The flags; per-model defaults (--hidden, --target-acc, --epochs, --lr) filled in by resolve_defaults."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default="gloo,fp16,powersgd:1,dense,micro:0.1",
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
    p.add_argument("--epochs", type=int, default=None, help="training epochs (default 4; 8 for cnn)")
    p.add_argument("--batch", type=int, default=16, help="per-process batch size")
    p.add_argument("--hidden", type=int, default=None,
                   help="mlp: width of the MLP's two hidden layers (default 3200: 10.5M parameters, 42 MB of "
                        "gradients per step, so that dense communication dominates at 1 Gbit/s); cnn: width of the "
                        "CNN's hidden linear layer (default 1024: 3.27M parameters, 13 MB of gradients)")
    p.add_argument("--target-acc", type=float, default=None,
                   help="test accuracy (%%) for the time-to-accuracy column (default 95 for mlp, 80 for cnn)")
    p.add_argument("--model", choices=list(WORKLOADS), default="mlp",
                   help="mlp (default): the MLP on digits; lstm: a word-level LSTM language model on English text "
                        "(Debian's fortunes files), judged by test perplexity (--target-ppl); cnn: a convolutional "
                        "network on Fashion-MNIST (Debian's dataset-fashion-mnist)")
    p.add_argument("--vocab", type=int, default=5000, help="lstm: vocabulary size (most frequent words + <unk>)")
    p.add_argument("--bptt", type=int, default=35, help="lstm: tokens per training sequence")
    p.add_argument("--steps-per-epoch", type=int, default=40,
                   help="lstm and cnn: training steps per epoch (the data has far more; an epoch is a slice of it)")
    p.add_argument("--test-size", type=int, default=1000,
                   help="cnn: held-out images evaluated after every epoch (the first N of the 10,000 test images)")
    p.add_argument("--target-ppl", type=float, default=200.0,
                   help="lstm: test perplexity for the time-to-target column (default %(default)s)")
    p.add_argument("--lr", type=float, default=None, help="SGD learning rate (default 0.05 for mlp and cnn, 0.5 for lstm)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    p.add_argument("--mode", choices=["doorbell", "rpc"], default="doorbell", help="spex exchange path")
    p.add_argument("--zero-copy", choices=["on", "off"], default="on",
                   help="spex runs: on (default) hands DDP's own bucket memory to the daemon as the input "
                        "(SpexHookState zero_copy); off copies each bucket into the input slot, as before")
    p.add_argument("--powersgd-buckets", choices=["one", "ddp"], default="one",
                   help="one (default): powersgd runs put the whole model in one DDP bucket (bucket_cap_mb and "
                        "dist._DEFAULT_FIRST_BUCKET_BYTES above the gradient size), because PyTorch's PowerSGD hook over gloo with several buckets can issue its "
                        "collectives in different orders on different ranks (hang or gloo enforce); ddp: DDP's own "
                        "bucketing (--bucket-cap-mb), to see that failure")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--results", default=None, help="results directory (default bench/results/train_digits)")
    p.add_argument("--spexd", default=None, help="spexd binary (default $SPEXD, else spexd on PATH)")
    p.add_argument("--spexd-arg", action="append", default=[],
                   help="spexd flag (repeatable); default: " + " ".join(DEFAULT_SPEXD_ARGS))
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="compressor parameter for every sparse run (repeatable)")
    p.add_argument("--stats-every", type=int, default=1, help="GetStats every N steps on rank 0 (0: per epoch)")
    p.add_argument("--check-every", type=int, default=10,
                   help="compare a SHA-1 of the parameters across ranks every N steps (0: once an epoch, after the "
                        "evaluation; it costs a pass over the parameters, so not every step by default)")
    p.add_argument("--modules-every", type=int, default=10,
                   help="count each module's non-zero update entries on rank 0 every N steps (0: never; a pass over "
                        "the gradients, 13 ms a step on the MLP, so not every step by default)")
    p.add_argument("--pin", choices=["auto", "node", "none"], default="auto",
                   help="loopback: node: node n's daemon and trainers run on node n's own cores (with 2 nodes on 2 "
                        "cores, a core each), as on real hosts; none: the scheduler places them; auto (default): node "
                        "when daemons and trainers outnumber the cores. Emulated hosts always have their own CPU sets "
                        "(deploy/emulated_cluster.sh)")
    p.add_argument("--quiet", action="store_true", help="no per-epoch lines")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def resolve_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Fills the per-model defaults of --hidden, --target-acc, --epochs and --lr."""
    workload = WORKLOADS[args.model]
    if args.hidden is None:
        args.hidden = workload.default_hidden or 3200
    if args.target_acc is None:
        args.target_acc = workload.default_target_acc
    if args.epochs is None:
        args.epochs = workload.default_epochs
    if args.lr is None:
        args.lr = workload.default_lr
    return args
