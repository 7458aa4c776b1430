"""The main job's workloads: for each model its data (all from Debian packages: scikit-learn's
digits, the fortunes files' English text, Fashion-MNIST), the network, one batch's loss, the
held-out evaluation and a one-line description. The training loop (train.py) sees only this
interface, so a fourth workload is one more class here and a name in WORKLOADS."""

import gzip
import os
import sys
from typing import Any, Dict, Optional, Tuple

FORTUNES = "/usr/share/games/fortunes"
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


class Workload:
    """One model on one dataset. Data is (x_train, y_train, x_test, y_test); y is None where the
    target is the input itself (the language model)."""

    name = ""
    default_lr = 0.05
    default_hidden = 0
    default_epochs = 4
    default_target_acc = 95.0
    sliced = False  # True: an epoch is --steps-per-epoch steps of the training set, not all of it
    half_ok = False  # --dtype bf16 trains this model in bfloat16

    def load(self, cfg: Dict[str, Any]):
        raise NotImplementedError

    def build(self, cfg: Dict[str, Any]):
        raise NotImplementedError

    def loss(self, ddp, data, idx, cfg: Dict[str, Any], dtype):
        import torch

        xtr, ytr = data[0], data[1]
        return torch.nn.functional.cross_entropy(ddp(self.inputs(xtr[idx]).to(dtype)).float(), ytr[idx])

    def inputs(self, x):
        return x

    def eval_sums(self, model, xte, yte, cfg: Dict[str, Any], dtype) -> Tuple[int, int, Optional[float]]:
        """(correct predictions, predictions, summed negative log-likelihood or None) over the
        held-out entries given: sums, so ranks can each take a share and add theirs up."""
        correct = int((model(self.inputs(xte).to(dtype)).float().argmax(1) == yte).sum())
        return correct, len(xte), None

    def evaluate(self, model, data, cfg: Dict[str, Any], dtype) -> Tuple[float, Optional[float]]:
        """(test accuracy %, test perplexity or None) over all the held-out entries."""
        import math

        correct, count, nll = self.eval_sums(model, data[2], data[3], cfg, dtype)
        return 100.0 * correct / count, (math.exp(nll / count) if nll is not None else None)

    def steps_per_epoch(self, n_train: int, world: int, cfg: Dict[str, Any]) -> int:
        steps = n_train // (world * cfg["batch"])
        return min(steps, cfg["steps_per_epoch"]) if self.sliced else steps

    def describe(self, args) -> Tuple[str, int]:
        """(description, parameter count)."""
        raise NotImplementedError


class DigitsMLP(Workload):
    """An MLP 64-H-H-10 on scikit-learn's digits (8x8 images, 1,797 of them, 25% held out)."""

    name = "mlp"
    default_hidden = 3200
    half_ok = True

    def load(self, cfg):
        import numpy as np
        import torch
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        x, y = load_digits(return_X_y=True)
        xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, random_state=cfg["seed"], stratify=y)
        mu, sd = xtr.mean(0), xtr.std(0) + 1e-6
        f = lambda a: torch.tensor(((a - mu) / sd).astype(np.float32))  # noqa: E731
        return f(xtr), torch.tensor(ytr), f(xte), torch.tensor(yte)

    def build(self, cfg):
        import torch

        h = cfg["hidden"]
        return torch.nn.Sequential(torch.nn.Linear(64, h), torch.nn.ReLU(), torch.nn.Linear(h, h), torch.nn.ReLU(),
                                   torch.nn.Linear(h, 10))

    def describe(self, args):
        h = args.hidden
        n_params = 64 * h + h + h * h + h + h * 10 + 10
        return f"MLP 64-{h}-{h}-10 ({n_params / 1e6:.2f}M parameters) on digits", n_params


class FortunesLSTM(Workload):
    """A word-level LSTM language model on Debian's fortunes, judged by test perplexity."""

    name = "lstm"
    default_lr = 0.5
    sliced = True

    def load(self, cfg):
        train, test = load_text(cfg["seed"], cfg["vocab"], cfg["bptt"])
        return train, None, test[:256], None

    def build(self, cfg):
        return lstm_model(cfg["vocab"])

    def loss(self, ddp, data, idx, cfg, dtype):
        import torch

        seq = data[0][idx]
        return torch.nn.functional.cross_entropy(ddp(seq[:, :-1]).reshape(-1, cfg["vocab"]), seq[:, 1:].reshape(-1))

    def eval_sums(self, model, xte, yte, cfg, dtype):
        """Next-word predictions right, predictions, and their summed negative log-likelihood
        (perplexity = exp(nll / predictions))."""
        import torch

        logits = model(xte[:, :-1]).reshape(-1, cfg["vocab"])
        target = xte[:, 1:].reshape(-1)
        nll = float(torch.nn.functional.cross_entropy(logits, target, reduction="sum"))
        return int((logits.argmax(1) == target).sum()), target.numel(), nll

    def describe(self, args):
        v = args.vocab
        n_params = v * 128 + 4 * 256 * (128 + 256 + 2) + 256 * v + v
        return (f"LSTM language model (embedding {v}x128, LSTM 256, {n_params / 1e6:.2f}M parameters) on "
                f"English text (Debian's fortunes), {args.steps_per_epoch} steps of {args.bptt} tokens per epoch",
                n_params)


class FashionCNN(Workload):
    """A convolutional network on Fashion-MNIST (28x28 grey images of clothes, 10 classes; 60,000
    for training, the first --test-size of the 10,000 test images held out): conv 5x5 32 - pool -
    conv 5x5 64 - pool - Linear 3136-H - Linear H-10. The convolutions hold 52K parameters and
    most of the compute; the first linear layer most of the gradient."""

    name = "cnn"
    default_hidden = 1024
    default_epochs = 8  # of 40 steps: 85% is at the edge of 320 steps for DDP, 80% is not
    default_target_acc = 80.0
    sliced = True
    MEAN, STD = 0.2860, 0.3530  # Fashion-MNIST's training pixels, scaled to [0, 1]

    def load(self, cfg):
        import torch

        xtr = torch.from_numpy(read_idx("train-images-idx3-ubyte.gz"))  # uint8, normalised per batch
        ytr = torch.from_numpy(read_idx("train-labels-idx1-ubyte.gz")).long()
        n = cfg["test_size"]
        xte = torch.from_numpy(read_idx("t10k-images-idx3-ubyte.gz")[:n])
        yte = torch.from_numpy(read_idx("t10k-labels-idx1-ubyte.gz")[:n]).long()
        return xtr, ytr, xte, yte

    def inputs(self, x):
        return ((x.float() / 255.0 - self.MEAN) / self.STD).unsqueeze(1)

    def build(self, cfg):
        import torch

        nn = torch.nn
        return nn.Sequential(nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(64 * 7 * 7, cfg["hidden"]), nn.ReLU(), nn.Linear(cfg["hidden"], 10))

    def describe(self, args):
        h = args.hidden
        n_params = (25 * 32 + 32) + (32 * 25 * 64 + 64) + (3136 * h + h) + (h * 10 + 10)
        return (f"CNN conv32-conv64-{h}-10 ({n_params / 1e6:.2f}M parameters) on Fashion-MNIST, "
                f"{args.steps_per_epoch} steps per epoch, {args.test_size} test images", n_params)


WORKLOADS = {w.name: w for w in (DigitsMLP(), FortunesLSTM(), FashionCNN())}


def read_idx(name: str):
    """One of Fashion-MNIST's IDX files (gzip; magic 0x0801 labels or 0x0803 images, big-endian
    sizes) as a numpy uint8 array."""
    import numpy as np

    path = os.path.join(FASHION_MNIST, name)
    if not os.path.isfile(path):
        sys.exit(f"train_digits: --model cnn needs {path} (Debian package dataset-fashion-mnist; deploy/setup.sh "
                 f"installs it)")
    with gzip.open(path, "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape).copy()


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
