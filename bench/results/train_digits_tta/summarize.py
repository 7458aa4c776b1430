#!/usr/bin/env python3
"""Collects the mirrored pairs of main-job invocations in this directory (WORKLOAD_fwd, WORKLOAD_rev,
and a second pair WORKLOAD_fwd2, WORKLOAD_rev2 where there is one;
each a --results directory of deploy/main_job.sh) into summary.txt and summary.json: per run the
step ms and time to target of each invocation, the steps to target, and the speed-ups to the
target against DDP (gloo) and against the fastest of DDP / fp16 / PowerSGD, each the geometric mean
of the invocations' ratios (a run missing the target in an invocation has no ratio there)."""
import json
import math
import os

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = ("gloo", "fp16", "powersgd-r1", "powersgd-r4")


def load(name):
    p = os.path.join(HERE, name, "summary.json")
    if not os.path.exists(p):
        return None
    return {r["label"]: r for r in json.load(open(p))}


def gmean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def main():
    out, md = {}, []
    # WORKLOAD_quiet_*: the pairs rerun later on the otherwise idle machine. WORKLOAD_wire_*: with
    # the delta index form and --fp16_values, the test set shared out among the ranks and the
    # harness's own checks left out of the time to target (wall_to_target_s keeps them).
    # WORKLOAD_fused_*: after the pattern-A passes were fused and two-node half exchanges became one
    # all-gather (2026-11-29, later still), two mirrored pairs each for the MLP and the CNN (fwd,
    # rev, fwd2, rev2), one for the LSTM. WORKLOAD_sleep_*: with --mpi_sleep_beside_compute=auto in the
    # main job's daemon flags (2026-11-29, afternoon): two pairs for the CNN, one each for the MLP and LSTM.
    # WORKLOAD_eve_*: the same pairs again with spexd of 08642b8 (2026-11-29, evening); cnn_late_*: two more
    # CNN pairs an hour later, the same build. WORKLOAD_zc_*: spexd of 97cd4e3, the hook handing DDP's bucket
    # over (zero-copy input, its default), 18:48-19:10 UTC: two pairs for the CNN, one each for the MLP and LSTM.
    # WORKLOAD_cut_*: spexd of d264f48, the daemon's CPU cut (trim at the edge bin, streamed sums past 2 MiB,
    # scratch without clearing), 21:57-22:20 UTC: two pairs for the CNN, one each for the MLP and LSTM.
    # WORKLOAD_fin_*: spexd of 9052a74 (micro's edge hint per partition, the union decoded without a copy),
    # 2026-11-30 04:16-04:38 UTC; the CNN pairs with all six runs (fp16 and PowerSGD rank 1 too).
    # cnn_fin2_*: the same CNN pairs again, 05:26-05:37 UTC, the machine running the trainers faster.
    # WORKLOAD_hist_*: spexd of f7e44af (micro's partition histogram counted in the local sum),
    # 2026-11-30 07:28 UTC on: two pairs for the CNN (all six runs), one each for the MLP and LSTM.
    for wl in ("mlp", "cnn", "lstm", "mlp_quiet", "cnn_quiet", "lstm_quiet", "mlp_wire", "cnn_wire", "lstm_wire",
               "mlp_fused", "cnn_fused", "lstm_fused", "mlp_sleep", "cnn_sleep", "lstm_sleep", "mlp_eve", "cnn_eve",
               "lstm_eve", "cnn_late", "mlp_zc", "cnn_zc", "lstm_zc", "mlp_cut", "cnn_cut", "lstm_cut",
               "mlp_fin", "cnn_fin", "lstm_fin", "cnn_fin2", "mlp_hist", "cnn_hist", "lstm_hist"):
        invs = [(n, load(f"{wl}_{n}")) for n in ("fwd", "rev", "fwd2", "rev2")]
        invs = [(n, d) for n, d in invs if d]
        if not invs:
            continue
        labels = list(invs[0][1])
        rows = {}
        for lab in labels:
            per = []
            for n, d in invs:
                r = d.get(lab)
                if r is None:
                    continue
                tt = r["time_to_target_s"]
                gl = d["gloo"]["time_to_target_s"]
                peers = [d[p]["time_to_target_s"] for p in PEERS if p in d and d[p]["time_to_target_s"]]
                fastest = min(peers) if peers else None
                # All-in (evaluation and the harness's checks): where the run recorded it.
                wall = r.get("wall_to_target_s")
                wpeers = [d[p]["wall_to_target_s"] for p in PEERS if p in d and d[p].get("wall_to_target_s")]
                spe = r["steps"] // r["epochs"]
                per.append({"inv": n, "step_ms": r["step_ms"], "gloo_step_ms": d["gloo"]["step_ms"],
                            "time_to_target_s": tt,
                            "steps_to_target": r["epochs_to_target"] * spe if r["epochs_to_target"] else None,
                            "vs_ddp": gl / tt if tt and gl else None,
                            "vs_fastest_peer": fastest / tt if tt and fastest else None,
                            "wall_to_target_s": wall,
                            "vs_fastest_peer_wall": min(wpeers) / wall if wall and wpeers else None,
                            "final": r["final"], "trainer_cpu_ms": r["trainer_cpu_ms"],
                            "daemon_cpu_ms": r["daemon_cpu_ms"], "achieved_density": r.get("achieved_density")})
            rows[lab] = {"invocations": per,
                         "step_vs_ddp": gmean([p["gloo_step_ms"] / p["step_ms"] for p in per]),
                         "vs_ddp": gmean([p["vs_ddp"] for p in per]) if all(p["vs_ddp"] for p in per) else None,
                         "vs_fastest_peer": gmean([p["vs_fastest_peer"] for p in per])
                         if all(p["vs_fastest_peer"] for p in per) else None,
                         "vs_fastest_peer_wall": gmean([p["vs_fastest_peer_wall"] for p in per])
                         if all(p["vs_fastest_peer_wall"] for p in per) else None}
        out[wl] = rows
        names = " / ".join(n for n, _ in invs)
        md.append(f"## {wl} (invocations {names})\n")
        md.append("| run | step ms | step vs DDP | steps to target | time to target s | speed-up vs DDP "
                  "| vs fastest PyTorch | same, all-in | final | trainer CPU ms | daemon CPU ms |")
        md.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for lab, row in rows.items():
            per = row["invocations"]
            md.append("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
                lab, " / ".join(fmt(p["step_ms"], ".1f") for p in per), fmt(row["step_vs_ddp"], ".2f") + "x",
                " / ".join(fmt(p["steps_to_target"], "d") for p in per),
                " / ".join(fmt(p["time_to_target_s"], ".1f") for p in per),
                fmt(row["vs_ddp"], ".2f") + "x", fmt(row["vs_fastest_peer"], ".2f") + "x",
                fmt(row["vs_fastest_peer_wall"], ".2f") + "x" if row["vs_fastest_peer_wall"] else "-",
                " / ".join(p["final"] for p in per),
                " / ".join(fmt(p["trainer_cpu_ms"], ".0f") for p in per),
                " / ".join(fmt(p["daemon_cpu_ms"], ".0f") for p in per)))
        md.append("")
    json.dump(out, open(os.path.join(HERE, "summary.json"), "w"), indent=1)
    open(os.path.join(HERE, "summary.txt"), "w").write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
