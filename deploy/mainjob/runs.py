"""The main job's run specs, NAME[:DENSITY][/MOD...]: a spexd compressor with its modifiers, or a
PyTorch peer a DDP user would run instead. One run is one configuration trained to the target."""

import sys
from typing import Any, Dict, List

# What a DDP user would run instead of spex, registered exactly as PyTorch documents them: `gloo`
# (DDP's own all-reduce), `fp16` / `bf16` (torch.distributed.algorithms.ddp_comm_hooks'
# fp16_compress_hook / bf16_compress_hook) and `powersgd[:RANK]` (powerSGD_hook with PowerSGDState).
PEERS = ("gloo", "fp16", "bf16", "powersgd")
MODIFIERS = ("mc", "lm", "layer", "global")


def is_peer(run: Dict[str, Any]) -> bool:
    return run["compressor"] in PEERS


def accordion_epoch(norms: List[float], density: float, factor: float) -> Dict[str, Any]:
    """Accordion's rule (Agarwal et al., 2021) for the next epoch of an /aF run, from the norms of
    the accumulated update of the epochs so far: the epoch is critical when the last norm changed
    by eta = 0.5 or more (relative) from the one before, or when there are not two yet; a critical
    epoch runs at F times the density (at most 1), the others at the density. Returns
    {"critical", "norm_change", "density"}."""
    change = abs(norms[-1] - norms[-2]) / norms[-2] if len(norms) >= 2 and norms[-2] > 0 else None
    critical = change is None or change >= 0.5
    return {"critical": critical, "norm_change": change,
            "density": min(1.0, density * factor) if critical else density}


def parse_modifiers(item: str, name: str, mods: List[str]):
    """(warm-up epochs as text, adaptive factor as text, flags) of a run's /MOD list; exits naming
    a bad one."""
    warm, adapt, flags = "", "", []
    for m in mods:
        if m.startswith("w") and m[1:].isdigit():
            warm = m[1:]
        elif m.startswith("a") and m[1:].isdigit() and int(m[1:]) >= 2:
            adapt = m[1:]
        elif m in MODIFIERS and m not in flags:
            flags.append(m)
        else:
            sys.exit(f"train_digits: run {item!r}: unknown modifier /{m} (known: /wN density warm-up over N "
                     f"epochs, /aF adaptive density (F >= 2 times the density in critical epochs), /mc momentum "
                     f"correction, /lm local momentum (/mc without masking), /layer one DDP bucket per tensor, /global one DDP bucket for the model)")
    if (warm or adapt or "mc" in flags or "lm" in flags) and name in ("dense", *PEERS):
        sys.exit(f"train_digits: run {item!r}: /wN, /mc and /lm need a sparse spex compressor, as does /aF")
    if "mc" in flags and "lm" in flags:
        sys.exit(f"train_digits: run {item!r}: /mc and /lm exclude each other (/lm is /mc without masking)")
    if warm and adapt:
        sys.exit(f"train_digits: run {item!r}: /wN and /aF both set the density per epoch; choose one")
    if flags and name in PEERS:
        sys.exit(f"train_digits: run {item!r}: /layer, /global, /mc and /lm apply to spex runs only")
    if "layer" in flags and "global" in flags:
        sys.exit(f"train_digits: run {item!r}: /layer and /global exclude each other")
    return warm, adapt, flags


def powersgd_run(item: str, dens: str) -> Dict[str, Any]:
    # PowerSGD's parameter is its matrix approximation rank (PyTorch's default 1).
    if dens and not (dens.isdigit() and int(dens) >= 1):
        sys.exit(f"train_digits: run {item!r}: powersgd:RANK needs a whole rank >= 1")
    rank = int(dens or 1)
    return {"name": "powersgd", "compressor": "powersgd", "density": 1.0, "powersgd_rank": rank,
            "label": f"powersgd-r{rank}"}


def parse_runs(spec: str) -> List[Dict[str, Any]]:
    """Run specs NAME[:DENSITY][/MOD...]: /wN density warm-up, /aF adaptive density, /mc momentum
    correction, /layer
    and /global bucketing (see train_digits.py's documentation)."""
    runs = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        head, *mods = item.split("/")
        name, _, dens = head.partition(":")
        warm, adapt, flags = parse_modifiers(item, name, mods)
        if name == "powersgd":
            runs.append(powersgd_run(item, dens))
            continue
        if name in PEERS and dens:
            sys.exit(f"train_digits: run {item!r}: {name} takes no density")
        density = float(dens) if dens else (1.0 if name in ("dense", *PEERS) else 0.01)
        if not 0 < density <= 1:
            sys.exit(f"train_digits: density of run {item!r} must be in (0, 1]")
        label = (name if name in ("dense", *PEERS) else f"{name}@{density:g}") + (f"/w{warm}" if warm else "")
        label += f"/a{adapt}" if adapt else ""
        label += "".join(f"/{f}" for f in flags)
        runs.append({"name": name, "compressor": name, "density": density, "warmup_epochs": int(warm or 0),
                     "adaptive_factor": int(adapt or 0),
                     "momentum_correction": "mc" in flags or "lm" in flags,
                     "momentum_masking": "lm" not in flags,
                     "bucketing": "layer" if "layer" in flags else "global" if "global" in flags else "ddp",
                     "label": label})
    if not runs:
        sys.exit("train_digits: --runs names no run")
    return runs
