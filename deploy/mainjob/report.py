"""The main job's report: each run's per-rank step rows and rank 0's epochs summarised (time per
step, time and steps to the target, exchange percentiles, CPU per step, densities, whether the
parameters stayed identical on every rank), written as steps.csv, epochs.csv, summary.json and a
PNG plot, and printed as the comparison, speed-up and per-module tables."""

import argparse
import csv
import json
import os
from typing import Any, Dict, List, Optional

from mainjob.runs import is_peer


def read_steps(out: str, world: int) -> List[List[Dict[str, str]]]:
    per_rank = []
    for r in range(world):
        with open(os.path.join(out, f"steps.rank{r}.csv")) as f:
            per_rank.append(list(csv.DictReader(f)))
    return per_rank


def numbers(rows: List[Dict[str, str]], key: str) -> List[float]:
    """The column's finite values (blank and nan left out)."""
    vals = [float(r[key]) for r in rows if r.get(key) not in (None, "nan", "")]
    return [v for v in vals if v == v]


def target_reached(epochs: List[Dict[str, Any]], target_acc: float, target_ppl: Optional[float]):
    """(first epoch that reached the target or None, target label, final label, language model?)."""
    lm = epochs[0].get("test_ppl") is not None and target_ppl is not None
    if lm:  # a language model: the target is a test perplexity (lower is better)
        reached = next((e for e in epochs if e["test_ppl"] <= target_ppl), None)
        return reached, f"ppl {target_ppl:g}", f"ppl {epochs[-1]['test_ppl']:.1f}", True
    reached = next((e for e in epochs if e["test_acc"] >= target_acc), None)
    return reached, f"{target_acc:g}%", f"{epochs[-1]['test_acc']:.2f}%", False


def summarize(run: Dict[str, Any], world: int, target_acc: float = 95.0,
              target_ppl: Optional[float] = None) -> Dict[str, Any]:
    out = run["out"]
    with open(os.path.join(out, "epochs.json")) as f:
        ep = json.load(f)
    if "unsupported" in ep:
        return {"label": run["label"], "compressor": run["compressor"], "unsupported": ep["unsupported"]}
    per_rank = read_steps(out, world)
    steps = len(per_rank[0])
    mismatched = [i for i in range(steps) if len({rows[i]["params_sha1"] for rows in per_rank}) != 1]
    checked = sum(1 for r in per_rank[0] if r["params_sha1"])
    if any(len(rows) != steps for rows in per_rank):
        mismatched.append(-1)
    rows0 = per_rank[0]
    exch = [float(r["exchange_s"]) for r in rows0]
    step_s = [float(r["step_s"]) for r in rows0]
    dens, gath = numbers(rows0, "density"), numbers(rows0, "gathered_density")
    epochs = ep["epochs"]
    reached, target_label, final_label, lm = target_reached(epochs, target_acc, target_ppl)
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
        # The harness's own checks (digests, per-module counts, GetStats reads: train.py Run.harness_s)
        # are left out of the time to target; wall_to_target_s keeps them.
        "target_acc": target_acc,
        "time_to_target_s": reached["wall_s"] - reached.get("harness_s", 0.0) if reached else None,
        "wall_to_target_s": reached["wall_s"] if reached else None,
        "harness_s": epochs[-1].get("harness_s"), "test_count": epochs[-1].get("test_count"),
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
        "layer_nonzero": ep.get("layer_nonzero", {}), "layer_nonzero_steps": ep.get("layer_nonzero_steps"),
        "adaptive": ep.get("adaptive", []),
        "params_identical": not mismatched, "mismatched_steps": mismatched[:10], "checked_steps": checked,
        "train_s": ep["run_s"], "buckets": ep["buckets"], "epoch_rows": epochs,
        "step_rows": [{k: r[k] for k in ("step", "epoch", "loss", "step_s", "exchange_s", "density", "gathered_density")}
                      for r in rows0],
    }


def write_outputs(results: List[Dict[str, Any]], out: str, title: str = "") -> None:
    """steps.csv, epochs.csv, summary.json and the plot (train_digits.png)."""
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
                    "epoch_s", "step_ms", "wall_s", "harness_s"])
        for r in results:
            for e in r["epoch_rows"]:
                w.writerow([r["label"], e["epoch"], f"{e['loss']:.6f}", f"{e['test_acc']:.3f}",
                            f"{e['exchange_ms']:.4f}", e["density"], e.get("gathered_density", ""),
                            f"{e['epoch_s']:.4f}", f"{e['step_ms']:.3f}", f"{e['wall_s']:.3f}",
                            f"{e.get('harness_s', 0.0):.3f}"])
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump([{k: v for k, v in r.items() if k not in ("step_rows", "epoch_rows")} for r in results], f, indent=1)
    write_plot(results, out, title)


def write_plot(results: List[Dict[str, Any]], out: str, title: str) -> None:
    """Loss by step, accuracy (or perplexity) against wall-clock time, exchange time and density by step."""
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
        # The time to target's clock: wall-clock less the harness's own checks.
        clock = [e["wall_s"] - e.get("harness_s", 0.0) for e in r["epoch_rows"]]
        if r.get("final_ppl") is not None:
            ax[0][1].plot(clock, [e["test_ppl"] for e in r["epoch_rows"]], label=label, marker=".")
        else:
            ax[0][1].plot([0.0] + clock,
                          [10.0] + [e["test_acc"] for e in r["epoch_rows"]], label=label, marker=".")
        ax[1][0].plot(st, [1e3 * float(s["exchange_s"]) for s in r["step_rows"]], label=label, lw=0.6)
        d = [(int(s["step"]), float(s["density"])) for s in r["step_rows"] if s["density"] not in ("nan", "")]
        d = [(a, b) for a, b in d if b == b]
        if d:
            ax[1][1].plot([a for a, _ in d], [b for _, b in d], label=label, lw=0.8)
    ax[0][0].set(title="training loss (rank 0)", xlabel="step", yscale="log")
    if results and results[0].get("final_ppl") is not None:
        ax[0][1].set(title="test perplexity against wall-clock time", xlabel="seconds since the run's start (harness checks left out)", yscale="log")
    else:
        ax[0][1].set(title="test accuracy (%) against wall-clock time",
                     xlabel="seconds since the run's start (harness checks left out)",
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
          "accuracy reached X% (or whose test perplexity fell to the target; evaluation included, each rank "
          "evaluating its share of the test set; rank 0's own checks left out: parameter digests (not the "
          "barrier after them), per-module density counts and GetStats reads, in summary.json's harness_s; "
          "wall_to_target_s keeps them); steps: the "
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
    counted = rows[0].get("layer_nonzero_steps") or rows[0]["steps"]
    sizes = {m: rows[0]["layer_nonzero"][m][1] // max(1, counted) for m in mods}
    w = max(12, *(len(r["label"]) for r in rows)) + 2
    print("\nupdate density by module (non-zero fraction of the averaged update over the steps counted, every "
          "--modules-every'th, rank 0; "
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


