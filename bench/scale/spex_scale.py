#!/usr/bin/python3
"""How spex's exchange scales (docs/scale.md): its own exchange code on simulated clusters
(SimGrid SMPI), the peers' collectives in the same simulation, and the cost model behind the
choice of exchange.

    python3 bench/scale/spex_scale.py whatif --nodes 256 --gbps 10 --latency-us 5 --model resnet50 --density 0.01
    python3 bench/scale/spex_scale.py whatif ... --simulate        # also simulate (minutes at 256+)
    python3 bench/scale/spex_scale.py sweep --out bench/results/scale_sweep.json [--max-nodes 1024]
    python3 bench/scale/spex_scale.py plot bench/results/scale_sweep.json --out docs/scale_star.png

The harness (bench/scale/scale_harness.cc) is built by bench/scale/build.sh with smpicxx; every
simulated rank runs spex's real collective, control round, commit vote and exchange code, or a
stand-in with the same MPI calls and byte counts where the real code's memory grows as P^2.
Simulated times are deterministic: one step per configuration is enough.
"""
import argparse
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_OUT = os.path.join(HERE, "out")

TOPOLOGIES = ("star", "fattree", "fattree2", "fattree4")  # fattreeN: N:1 oversubscribed leaves
LEAF = 8  # hosts per leaf switch of the fat-trees


def build(out=DEFAULT_OUT):
    """Builds (or brings up to date) the harness and the cost model's front; returns out."""
    subprocess.run(["bash", os.path.join(HERE, "build.sh"), out], check=True, cwd=REPO)
    return out


def platform_xml(topology, nodes, gbps, link_latency_us):
    """A SimGrid platform of `nodes` hosts node-0.. with links of gbps Gbit/s and
    link_latency_us us each way (a star's route crosses 2 links, a fat-tree's up to 4)."""
    if topology not in TOPOLOGIES:
        raise ValueError(f"topology must be one of {', '.join(TOPOLOGIES)}, not {topology!r}")
    common = (f'prefix="node-" suffix="" radical="0-{nodes - 1}" speed="1Gf" bw="{gbps}Gbps" '
              f'lat="{link_latency_us}us" sharing_policy="SPLITDUPLEX"')
    if topology == "star" or nodes <= LEAF:
        # Every node's own full-duplex link to one non-blocking switch (no backbone).
        cluster = f'<cluster id="c" {common}/>'
    else:
        if nodes % LEAF:
            raise ValueError(f"a fat-tree needs a multiple of {LEAF} nodes, not {nodes}")
        over = {"fattree": 1, "fattree2": 2, "fattree4": 4}[topology]
        up = LEAF // over  # uplinks per leaf switch (= top switches)
        leaves = nodes // LEAF
        cluster = (f'<cluster id="c" {common} topology="FAT_TREE" '
                   f'topo_parameters="2;{LEAF},{leaves};1,{up};1,1"/>')
    return ("<?xml version='1.0'?>\n"
            '<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">\n'
            f'<platform version="4.1">\n  {cluster}\n</platform>\n')


def simulate(nodes, op, elements, density=0.01, gbps=10, link_latency_us=2, topology="star",
             wire="float32", steps=1, factors="off", control=True, psgd=None, out=DEFAULT_OUT,
             timeout=None, indices=None, extra_cfg=(), harness_args=()):
    """Runs the harness under smpirun; returns its JSON (times are simulated seconds) with the
    run's wall time (wall_s) and its conditions added. indices: an index file
    (record_selections.py resample) instead of uniform selections; extra_cfg: more --cfg
    options; harness_args: more harness arguments (--a2a_flows=)."""
    with tempfile.TemporaryDirectory(prefix="spex_scale_") as tmp:
        plat = os.path.join(tmp, "platform.xml")
        hosts = os.path.join(tmp, "hosts")
        with open(plat, "w") as f:
            f.write(platform_xml(topology, nodes, gbps, link_latency_us))
        with open(hosts, "w") as f:
            f.write("".join(f"node-{i}\n" for i in range(nodes)))
        cmd = ["smpirun", "-np", str(nodes), "-platform", plat, "-hostfile", hosts,
               "--cfg=smpi/coll-selector:ompi", "--cfg=smpi/simulate-computation:no",
               "--cfg=smpi/shared-malloc:local", "--log=root.thres:critical",
               "--log=smpi_colls.thres:error"]
        if nodes >= 1024:
            # The neighbour-exchange all-gather packs indexed datatypes into gigabytes of private
            # memory at 1,024 ranks; the ring has the same bandwidth term.
            cmd.append("--cfg=smpi/allgatherv:mpich_ring")
        if factors == "off":
            cmd += ["--cfg=smpi/bw-factor:0:1", "--cfg=smpi/lat-factor:0:1",
                    "--cfg=network/crosstraffic:0"]
        elif factors != "default":
            cmd += list(factors)  # calibrated: the caller's --cfg options
        cmd += [os.path.join(out, "scale_harness"), f"--op={op}", f"--n={elements}",
                f"--density={density}", f"--wire={wire}", f"--steps={steps}",
                f"--control={1 if control else 0}"]
        if psgd:
            cmd.append("--psgd=" + ",".join(str(int(x)) for x in psgd))
        if indices:
            cmd.append("--indices=" + os.path.abspath(indices))
        cmd += list(harness_args)
        cmd[cmd.index(os.path.join(out, "scale_harness")):0] = list(extra_cfg)
        t0 = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp)
        wall = time.time() - t0
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    if r.returncode != 0 or not lines:
        raise RuntimeError(f"smpirun failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-3000:]}")
    res = json.loads(lines[-1])
    res.update(wall_s=round(wall, 2), topology=topology, gbps=gbps, link_latency_us=link_latency_us,
               density=density, factors=factors if isinstance(factors, str) else "calibrated")
    return res


def step_time(res, step=None):
    """Control round + exchange + commit vote of one step (the mean over steps when None)."""
    steps = res["steps"] if step is None else [res["steps"][step]]
    # total_s: the slowest rank's step (older harness output: the phases' maxima added).
    return sum(s.get("total_s", s["control_s"] + s["exchange_s"] + s["vote_s"])
               for s in steps) / len(steps)


def oktopk_time(res, recompute_every=32):
    """Ok-Topk's time per exchange averaged over its cycle: step 0 is exact (histograms), the
    others use the threshold."""
    exact = step_time(res, 0)
    rest = step_time(res, 1) if len(res["steps"]) > 1 else exact
    return (exact + (recompute_every - 1) * rest) / recompute_every


def model(nodes, gbps, latency_us, elements, k, value_bytes=4, skew=1.0, control=True,
          out=DEFAULT_OUT):
    """The cost model (daemon/engine/exchange_cost.h); latency_us is node to node."""
    r = subprocess.run([os.path.join(out, "exchange_cost"), str(nodes), str(gbps), str(latency_us),
                        str(elements), str(k), str(value_bytes), str(skew), "1" if control else "0"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise ValueError(r.stderr.strip())
    return json.loads(r.stdout)


# Layer shapes, for PowerSGD's matrices and the buckets' sizes.
def resnet50_shapes():
    """torchvision's ResNet-50 (as bench/resnet50_profile.py builds it): 25,557,032 parameters."""
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for b in range(blocks):
            cout = 4 * width
            shapes += [(width, cin, 1, 1), (width,), (width,), (width, width, 3, 3), (width,), (width,),
                       (cout, width, 1, 1), (cout,), (cout,)]
            if b == 0:
                shapes += [(cout, cin, 1, 1), (cout,), (cout,)]
            cin = cout
    return shapes + [(1000, 2048), (1000,)]


def mlp_shapes(hidden=3200):
    """The main job's MLP (deploy/train_digits.py): 64-3200-3200-10, 10,479,210 parameters."""
    return [(hidden, 64), (hidden,), (hidden, hidden), (hidden,), (10, hidden), (10,)]


MODELS = {"resnet50": resnet50_shapes, "mlp": mlp_shapes}


def numel(shape):
    return math.prod(shape)


def powersgd_sizes(shapes, rank):
    """PyTorch's powerSGD_hook per bucket: tensors of one dimension, and matrices whose
    compression would not halve them (min_compression_rate 2), are all-reduced uncompressed;
    every other tensor, viewed as (shape[0], rest), sends P (rows x rank) and Q (cols x rank).
    Returns the floats of the three all-reduces (uncompressed, all P, all Q)."""
    u = p = q = 0
    for s in shapes:
        if len(s) < 2:
            u += numel(s)
            continue
        m, n = s[0], numel(s[1:])
        r = min(rank, m, n)
        if (m + n) * r * 2 > m * n:
            u += m * n
        else:
            p += m * r
            q += n * r
    return u, p, q


def peer_model(nodes, gbps, latency_us, elements, shapes, out=DEFAULT_OUT):
    """The cost model's all-reduce times of the peers: DDP (float32, fp16 bytes) and PowerSGD
    (its three all-reduces at ranks 1 and 4), one bucket."""
    sizes = {"ddp": [4 * elements], "ddp_fp16": [2 * elements]}
    for r in (1, 4):
        sizes[f"powersgd{r}"] = [4 * x for x in powersgd_sizes(shapes, r) if x]
    res = {}
    for name, bs in sizes.items():
        cmd = [os.path.join(out, "exchange_cost"), "allreduce", str(nodes), str(gbps), str(latency_us)]
        r = subprocess.run(cmd + [str(b) for b in bs], capture_output=True, text=True, check=True)
        res[name] = sum(json.loads(r.stdout))
    return res


PEER_OPS = ("ddp", "ddp_fp16", "powersgd1", "powersgd4")


def simulate_point(nodes, elements, density, gbps, link_latency_us, topology="star", shapes=None,
                   ops=("dense", "gather", "oktopk") + PEER_OPS, real_gather_max=16,
                   real_oktopk_max=256, out=DEFAULT_OUT,
                   factors="off", timeout=None, log=None):
    """Every exchange and peer at one point; returns {op: seconds per exchange}, with the
    harness's records under 'runs'."""
    times, runs = {}, []
    for op in ops:
        kw = dict(nodes=nodes, elements=elements, density=density, gbps=gbps,
                  link_latency_us=link_latency_us, topology=topology, factors=factors, out=out,
                  timeout=timeout)
        if op == "gather":
            # The real code keeps every node's chunk on every node (P^2 memory): the stand-in
            # beyond real_gather_max nodes (the suite checks the two agree).
            r = simulate(op="gather" if nodes <= real_gather_max else "gather_standin", **kw)
            t = step_time(r)
        elif op == "oktopk":
            # The real code up to real_oktopk_max nodes (about 20 MB a node at ResNet-50's 1%),
            # the stand-in beyond (the suite checks it within 1% of the real code).
            # From 1,024 nodes SimGrid's ompi selector runs the all-to-all(v) linear: P^2
            # concurrent messages stall the simulation; the stand-in sends the same bytes as 4
            # messages a node (--a2a_flows, docs/scale.md).
            standin_args = ["--a2a_flows=4"] if nodes >= 1024 else []
            r = simulate(op="oktopk" if nodes <= real_oktopk_max else "oktopk_standin", steps=2,
                         harness_args=[] if nodes <= real_oktopk_max else standin_args, **kw)
            t = oktopk_time(r)
        elif op in ("ddp", "ddp_fp16", "dense"):
            r = simulate(op=op, **kw)
            t = step_time(r)
        elif op.startswith("powersgd"):
            rank = int(op[len("powersgd"):])
            sizes = powersgd_sizes(shapes or [(elements,)], rank)
            r = simulate(op="powersgd", psgd=sizes, **kw)
            t = step_time(r)
        else:
            raise ValueError(op)
        r["what"] = op
        runs.append(r)
        times[op] = t
        if log:
            log(f"  P={nodes} {topology} {gbps} Gbit/s {link_latency_us} us {op}: {t * 1e3:.3f} ms "
                f"(simulated in {r['wall_s']} s)")
    return {"times": times, "runs": runs}


def region_skew(path, nodes):
    """Ok-Topk's regions over the first `nodes` sets of an index file: the busiest region's
    entries over the mean with equal regions, and with the regions its first exchange agrees
    (every node offers the P-1 quantiles of its set; the bounds are their means)."""
    import numpy as np
    import record_selections as rs
    n, sets = rs.read_index_file(path, nodes)
    if nodes < 2:
        return 1.0, 1.0
    offers = np.array([[s[j * len(s) // nodes] if len(s) >= nodes else n * j // nodes
                        for j in range(1, nodes)] for s in sets], dtype=np.uint64)
    reb = np.concatenate([[0], offers.sum(0) // nodes, [n]]).astype(np.int64)
    eq = np.array([0] + [n * j // nodes for j in range(1, nodes)] + [n], dtype=np.int64)
    out = []
    for bounds in (eq, reb):
        per = np.zeros(nodes)
        for s in sets:
            per += np.diff(np.searchsorted(s, bounds))
        out.append(float(per.max() / per.mean()))
    return tuple(out)


def cmd_skew(a):
    """Selections from real gradients (record_selections.py) against uniform ones: pattern A's
    union, the all-gather and Ok-Topk at each point, and the dense all-reduce for auto's check.
    The runs that do not depend on the positions (dense, uniform inputs) are shared between the
    recordings of one invocation."""
    import record_selections as rs
    out = build(a.build_dir)
    recs = {}
    for spec in a.recording:
        label, path = spec.split("=", 1)
        recs[label] = rs.read_recording(path) + (os.path.basename(path),)
    tmp = a.index_dir or tempfile.mkdtemp(prefix="spex_skew_")
    os.makedirs(tmp, exist_ok=True)
    nodes_list = [int(x) for x in a.nodes.split(",")]
    rows = []
    if a.resume and os.path.exists(a.out):
        with open(a.out) as f:
            rows = json.load(f)["points"]
    done = {(r["label"], r["density"], r["elements"], r["gbps"], r["nodes"]) for r in rows}
    vb = 2 if a.wire in ("bfloat16", "float16") else 4
    half = vb == 2

    def save():
        with open(a.out, "w") as f:
            json.dump({"wire": a.wire, "recordings": {x: recs[x][3] for x in recs},
                       "record_step": a.record_step, "points": rows}, f, indent=1)

    for d in [float(x) for x in a.densities.split(",")]:
        for n in [int(x) for x in a.elements.split(",")]:
            k = max(1, int(math.floor(d * n)))
            paths = {}
            for label, (n0, workers, records, _) in recs.items():
                step, _, sets = rs.pick(records, a.record_step, d)
                path = os.path.join(tmp, f"{label}_s{step}_d{d}_n{n}_p{max(nodes_list)}.idx")
                if not os.path.exists(path):
                    rs.write_index_file(path, n, rs.node_sets(sets, n0, n, k, max(nodes_list)))
                paths[label] = (path, step)
            for gbps in [float(x) for x in a.rates.split(",")]:
                for p in nodes_list:
                    todo = [x for x in recs if (x, d, n, gbps, p) not in done]
                    if not todo:
                        continue
                    kw = dict(nodes=p, elements=n, density=d, gbps=gbps, link_latency_us=a.latency,
                              out=out, wire=a.wire)

                    def run(runs, what, op, **more):
                        r = simulate(op=op, **kw, **more)
                        r["what"] = what
                        runs.append(r)
                        print(f"  d={d} n={n} {gbps:g} Gbit/s P={p} {what} ({op}): "
                              f"{step_time(r) * 1e3:.3f} ms (simulated in {r['wall_s']} s)", flush=True)
                        return r
                    shared_runs, uni = [], {}
                    dense = step_time(run(shared_runs, "dense", "dense_half_standin" if half else "dense"))
                    ok_op = "oktopk" if p <= a.real_oktopk_max else "oktopk_standin"
                    un_op = "union" if p <= a.real_union_max else "union_standin"
                    # The all-gather's bytes do not depend on the positions (k pairs a node).
                    ga_op = "gather" if p <= a.real_gather_max else "gather_standin"
                    uni["gather"] = step_time(run(shared_runs, "gather_uniform", ga_op))
                    uni["oktopk"] = oktopk_time(run(shared_runs, "oktopk_uniform", ok_op, steps=2))
                    rn = run(shared_runs, "union_uniform", un_op)
                    uni["union"] = step_time(rn)
                    for label in todo:
                        path, step = paths[label]
                        runs = list(shared_runs)
                        times = {"dense": dense}
                        times["gather"] = (step_time(run(runs, "gather", ga_op, indices=path))
                                           if p <= a.real_gather_max else uni["gather"])
                        times["oktopk"] = oktopk_time(run(runs, "oktopk", ok_op, steps=2, indices=path))
                        ru = run(runs, "union", un_op, indices=path)
                        times["union"] = step_time(ru)
                        eq, reb = region_skew(path, p)
                        row = {"topology": "star", "gbps": gbps, "link_latency_us": a.latency,
                               "nodes": p, "elements": n, "k": k, "density": d, "wire": a.wire,
                               "label": label, "recorded_step": step, "times_s": times,
                               "uniform_s": uni,
                               "skewed_over_uniform": {x: times[x] / uni[x] for x in uni},
                               "union": {"skewed": ru["union"], "uniform": rn["union"]},
                               "region_skew": {"equal": eq, "rebalanced": reb}, "runs": runs}
                        m = model(p, gbps, 2 * a.latency, n, k, vb, 1.0, True, out)
                        key = {"dense": "dense", "allgather": "gather", "oktopk": "oktopk"}
                        best = min(key, key=lambda x: times[key[x]])
                        row.update(model_s=m, best=best, auto=m["best"],
                                   auto_over_best=times[key[m["best"]]] / times[key[best]])
                        rows.append(row)
                        save()
                        print(f"skew: {label} d={d} n={n} {gbps:g} Gbit/s P={p}: skewed/uniform " +
                              ", ".join(f"{x} {row['skewed_over_uniform'][x]:.3f}" for x in uni) +
                              f"; union {ru['union']} vs {rn['union']}; regions {eq:.2f}x equal, "
                              f"{reb:.2f}x rebalanced; fastest {best}, auto {m['best']}", flush=True)
            if not a.keep_index_files:
                for path, _ in paths.values():
                    os.remove(path)
    print(f"skew: {a.out}")


def cmd_skewtable(a):
    """A markdown table of skew sweeps: per point, skewed over uniform for every exchange."""
    rows = []
    for path in a.sweeps:
        with open(path) as f:
            rows += json.load(f)["points"]
    rows.sort(key=lambda r: (r["label"], r["wire"], -r["density"], r["elements"], r["gbps"], r["nodes"]))
    print("| selections | values | density | n | Gbit/s | P | union: skewed / uniform entries | "
          "pattern A (union) | Ok-Topk | all-gather | busiest region / mean: equal, rebalanced | "
          "ms, skewed: dense, all-gather, Ok-Topk, union | fastest | auto picks | auto / fastest |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        q = r["skewed_over_uniform"]
        u = r["union"]
        print(f"| {r['label']} (step {r['recorded_step']}) | {r['wire']} | {r['density']:g} | "
              f"{r['elements'] / 1e6:.1f}M | {r['gbps']:g} | {r['nodes']} | "
              f"{u['skewed']:,} / {u['uniform']:,} ({u['skewed'] / u['uniform']:.2f}) | "
              f"{q['union']:.3f} | {q['oktopk']:.3f} | {q['gather']:.3f} | "
              f"{r['region_skew']['equal']:.1f}, {r['region_skew']['rebalanced']:.2f} | "
              + ", ".join(f"{r['times_s'][x] * 1e3:.2f}" for x in ("dense", "gather", "oktopk", "union"))
              + f" | {r['best']} | {r['auto']} | {r['auto_over_best']:.3f} |")


def cmd_skewplot(a):
    """Log-log: time per exchange against P, recorded (solid) and uniform (dashed) selections."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    with open(a.sweep) as f:
        rows = [r for r in json.load(f)["points"] if r["gbps"] == a.gbps]
    keys = sorted({(r["label"], r["density"]) for r in rows}, key=lambda x: (x[0], -x[1]))
    fig, axes = plt.subplots(1, len(keys), figsize=(4.6 * len(keys), 4.2), squeeze=False)
    for ax, (label, d) in zip(axes[0], keys):
        sel = sorted((r for r in rows if (r["label"], r["density"]) == (label, d)), key=lambda r: r["nodes"])
        ps = [r["nodes"] for r in sel]
        for op, name, color in (("gather", "all-gather", "r"), ("oktopk", "Ok-Topk", "b"),
                                ("union", "pattern A (union)", "g")):
            ax.plot(ps, [r["times_s"][op] for r in sel], color + "-o", markersize=3, label=f"{name}, recorded")
            ax.plot(ps, [r["uniform_s"][op] for r in sel], color + "--", linewidth=0.8, label=f"{name}, uniform")
        ax.plot(ps, [r["times_s"]["dense"] for r in sel], "k-", linewidth=0.8, label="dense")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("nodes P")
        ax.set_ylabel("simulated seconds per exchange")
        ax.set_title(f"{label.upper()} selections, d={d:g}, {sel[0]['elements']:,} el.", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=6)
    fig.suptitle(f"star, {a.gbps:g} Gbit/s, 2 us per link: recorded top-k sets against uniform ones",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(a.out, dpi=90)
    print(f"plot: {a.out}")


def cmd_whatif(a):
    out = build(a.build_dir)
    if a.model:
        shapes = MODELS[a.model]()
        elements = sum(numel(s) for s in shapes)
    else:
        if not a.elements:
            sys.exit("whatif: give --model (resnet50, mlp) or --elements")
        shapes, elements = [(a.elements,)], a.elements
    k = max(1, int(a.density * elements))
    buckets = max(1, a.buckets)
    per = -(-elements // buckets)
    kb = max(1, int(a.density * per))
    vb = 2 if a.values in ("bfloat16", "float16") else 4
    try:
        m = model(a.nodes, a.gbps, a.latency_us, per, kb, vb, a.skew, True, out)
    except ValueError as e:
        sys.exit(f"whatif: {e}")
    print(f"spex on {a.nodes} nodes, {a.gbps} Gbit/s, {a.latency_us} us node to node; "
          f"{elements:,} elements in {buckets} bucket(s), density {a.density} (k = {k:,}), "
          f"{a.values} values")
    print("cost model (per step, all buckets; control round and commit vote included):")
    for name in ("dense", "allgather", "oktopk"):
        print(f"  {name:10s} {m[name + '_s'] * buckets * 1e3:10.3f} ms")
    print(f"  auto picks {m['best']} (control round + vote: {m['control_s'] * buckets * 1e3:.3f} ms)")
    peers = peer_model(a.nodes, a.gbps, a.latency_us, elements, shapes, out)
    print("peers, cost model (their all-reduces only; their compute is not counted):")
    for name, t in peers.items():
        print(f"  {name:10s} {t * 1e3:10.3f} ms")
    result = {"inputs": {x: y for x, y in vars(a).items() if x != "fn"}, "elements": elements,
              "k": k, "model": m, "peers_model": peers}
    if a.simulate:
        if a.nodes > 1024:
            sys.exit("whatif --simulate: at most 1,024 nodes")
        print("simulating (SimGrid SMPI, star, factors off; minutes from 256 nodes on)...")
        # A star's route crosses two links: each gets half the node-to-node latency.
        # spex: one bucket's exchange, times the buckets; the peers: the whole gradient once.
        sim = simulate_point(a.nodes, per, a.density, a.gbps, a.latency_us / 2, "star", shapes,
                             ops=("dense", "gather", "oktopk"), out=out, log=print)
        peers_sim = simulate_point(a.nodes, elements, a.density, a.gbps, a.latency_us / 2, "star",
                                   shapes, ops=PEER_OPS, out=out, log=print)
        for name, t in sim["times"].items():
            print(f"  {name:10s} {t * buckets * 1e3:10.3f} ms (simulated)")
        for name, t in peers_sim["times"].items():
            print(f"  {name:10s} {t * 1e3:10.3f} ms (simulated)")
        result["simulated"] = {"spex_per_bucket": sim, "peers": peers_sim}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


def sweep_points(a):
    pts = []
    nodes = ([int(x) for x in a.nodes.split(",")] if a.nodes else
             [p for p in (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) if p <= a.max_nodes])
    for topo in a.topologies.split(","):
        for gbps in [float(x) for x in a.rates.split(",")]:
            for lat in [float(x) for x in a.latencies.split(",")]:
                for p in nodes:
                    if topo != "star" and p <= LEAF:
                        continue  # one leaf: the star
                    pts.append((topo, gbps, lat, p))
    return pts


def write_csv(json_path, rows):
    """The sweep's points as CSV beside its JSON (simulated and modelled seconds, picks)."""
    csv_path = os.path.splitext(json_path)[0] + ".csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["topology", "gbps", "link_latency_us", "nodes", "dense_s", "gather_s", "oktopk_s",
                    "ddp_s", "ddp_fp16_s", "powersgd1_s", "powersgd4_s", "model_dense_s",
                    "model_allgather_s", "model_oktopk_s", "best", "auto", "auto_over_best"])
        for r in rows:
            t, m = r["times_s"], r["model_s"]
            w.writerow([r["topology"], r["gbps"], r["link_latency_us"], r["nodes"]] +
                       [f"{t[x]:.6g}" if x in t else "" for x in
                        ("dense", "gather", "oktopk", "ddp", "ddp_fp16", "powersgd1", "powersgd4")] +
                       [f"{m[x]:.6g}" for x in ("dense_s", "allgather_s", "oktopk_s")] +
                       [r["best"], r["auto"], f"{r['auto_over_best']:.4f}"])
    return csv_path


def cmd_sweep(a):
    out = build(a.build_dir)
    shapes = MODELS[a.model]()
    elements = sum(numel(s) for s in shapes) if not a.elements else a.elements
    k = max(1, int(a.density * elements))
    rows, done = [], set()
    if a.resume and os.path.exists(a.out):
        with open(a.out) as f:
            rows = json.load(f)["points"]
        done = {(r["topology"], r["gbps"], r["link_latency_us"], r["nodes"]) for r in rows}
    t_start = time.time()
    for topo, gbps, lat, p in sweep_points(a):
        if (topo, gbps, lat, p) in done:
            row = next(r for r in rows if (r["topology"], r["gbps"], r["link_latency_us"],
                                           r["nodes"]) == (topo, gbps, lat, p))
            missing = [o for o in a.ops.split(",") if o not in row["times_s"]]
            if not (a.add_ops and missing):
                continue
            # --add-ops: simulate the ops this point lacks and merge them in.
            sim = simulate_point(p, elements, a.density, gbps, lat, topo, shapes, out=out,
                                 ops=tuple(missing), real_gather_max=a.real_gather_max, log=print)
            row["times_s"].update(sim["times"])
            row["runs"] += sim["runs"]
            auto_check(row, out)
            with open(a.out, "w") as f:
                json.dump({"model": a.model, "elements": elements, "density": a.density,
                           "points": rows}, f, indent=1)
            continue
        if a.budget_s and time.time() - t_start > a.budget_s:
            print(f"sweep: budget of {a.budget_s} s spent; the rest is not simulated")
            break
        sim = simulate_point(p, elements, a.density, gbps, lat, topo, shapes, out=out,
                             ops=tuple(a.ops.split(",")), real_gather_max=a.real_gather_max,
                             log=print)
        row = {"topology": topo, "gbps": gbps, "link_latency_us": lat, "nodes": p,
               "elements": elements, "k": k, "density": a.density, "times_s": sim["times"],
               "runs": sim["runs"]}
        auto_check(row, out)
        rows.append(row)
        with open(a.out, "w") as f:
            json.dump({"model": a.model, "elements": elements, "density": a.density,
                       "points": rows}, f, indent=1)
    csv_path = write_csv(a.out, rows)
    worst = max(rows, key=lambda r: r["auto_over_best"]) if rows else None
    if worst:
        print(f"sweep: {len(rows)} points; auto's choice over the best: worst "
              f"{worst['auto_over_best']:.3f} at P={worst['nodes']} {worst['topology']} "
              f"{worst['gbps']} Gbit/s {worst['link_latency_us']} us")
    print(f"sweep: {a.out}, {csv_path}")


def cmd_plot(a):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    with open(a.sweep) as f:
        data = json.load(f)
    pts = [p for p in data["points"] if p["topology"] == a.topology]
    keys = sorted({(p["gbps"], p["link_latency_us"]) for p in pts})
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4.2), squeeze=False)
    for ax, (gbps, lat) in zip(axes[0], keys):
        sel = sorted((p for p in pts if p["gbps"] == gbps and p["link_latency_us"] == lat),
                     key=lambda p: p["nodes"])
        for op, label, style in (("dense", "spex dense", "k-"), ("gather", "spex all-gather", "r-o"),
                                 ("oktopk", "spex Ok-Topk", "b-s"), ("ddp", "DDP ring fp32", "k:"),
                                 ("ddp_fp16", "DDP fp16", "g:"), ("powersgd1", "PowerSGD r=1", "m--"),
                                 ("powersgd4", "PowerSGD r=4", "c--")):
            have = [p for p in sel if op in p["times_s"]]
            ax.plot([p["nodes"] for p in have], [p["times_s"][op] for p in have], style,
                    label=label, markersize=3)
        # The cost model's spex exchanges out to 1,024 nodes (thin): where nothing was simulated.
        if a.model_lines:
            allp = [2 ** i for i in range(1, 11)]
            hops = 2 if a.topology == "star" else 4
            k = max(1, int(data["density"] * data["elements"]))
            ms = [model(p, gbps, hops * lat, data["elements"], k, 4, 1.0, True, a.build_dir)
                  for p in allp]
            for key, style in (("dense_s", "k-"), ("allgather_s", "r-"), ("oktopk_s", "b-")):
                ax.plot(allp, [m[key] for m in ms], style, linewidth=0.6, alpha=0.5)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("nodes P")
        ax.set_ylabel("simulated seconds per exchange")
        ax.set_title(f"{a.topology}, {gbps:g} Gbit/s, {lat:g} us/link")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{data['model']}: {data['elements']:,} elements, density {data['density']}" +
                 ("\nsimulated (thick), cost model (thin)" if a.model_lines else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(a.out, dpi=90)
    print(f"plot: {a.out}")


def auto_check(row, out):
    """The cost model at a sweep's point and its pick against the simulation (in place)."""
    p, topo = row["nodes"], row["topology"]
    hops = 2 if topo == "star" or p <= LEAF else 4  # links a route crosses
    m = model(p, row["gbps"], hops * row["link_latency_us"], row["elements"], row["k"], 4, 1.0,
              True, out)
    t = row["times_s"]
    mine = [x for x in ("dense", "allgather", "oktopk") if ("gather" if x == "allgather" else x) in t]
    best = min(mine, key=lambda x: t["gather" if x == "allgather" else x])
    chosen = t.get("gather" if m["best"] == "allgather" else m["best"], float("nan"))
    row.update(model_s=m, best=best, auto=m["best"],
               auto_over_best=chosen / t["gather" if best == "allgather" else best])


def cmd_remodel(a):
    """Recomputes the cost model's times and pick at every point of sweeps already run."""
    for path in a.sweeps:
        with open(path) as f:
            data = json.load(f)
        for row in data["points"]:
            auto_check(row, a.build_dir)
        with open(path, "w") as f:
            json.dump(data, f, indent=1)
        write_csv(path, data["points"])
        print(f"remodel: {path}")


def cmd_table(a):
    """Markdown tables of one or more sweeps: per (topology, rate, latency), the simulated time of
    every exchange and peer against P, the fastest of spex's three and auto's (the model's) pick."""
    rows = []
    for path in a.sweeps:
        with open(path) as f:
            rows += json.load(f)["points"]
    keys = sorted({(r["topology"], r["gbps"], r["link_latency_us"]) for r in rows},
                  key=lambda x: (TOPOLOGIES.index(x[0]), x[2], x[1]))
    # The cost model against the simulation: spex's exchanges at every point, and its picks.
    for topo in sorted({r["topology"] for r in rows}):
        errs, picks = [], []
        for r in rows:
            if r["topology"] != topo:
                continue
            for op, key in (("dense", "dense_s"), ("gather", "allgather_s"), ("oktopk", "oktopk_s")):
                if op in r["times_s"]:
                    errs.append(r["model_s"][key] / r["times_s"][op] - 1)
            if r["auto_over_best"] == r["auto_over_best"]:  # not NaN: every exchange simulated
                picks.append(r["auto_over_best"])
        worst = max(errs, key=abs)
        print(f"{topo}: the model within 10% of {sum(abs(e) <= 0.1 for e in errs)} of {len(errs)} "
              f"simulated exchange times (worst {worst * 100:+.0f}%); its pick at {len(picks)} "
              f"points: at most {max(picks):.3f}x the fastest, the fastest at "
              f"{sum(p <= 1.0 for p in picks)}")
    for topo, gbps, lat in keys:
        sel = sorted((r for r in rows if (r["topology"], r["gbps"], r["link_latency_us"]) ==
                      (topo, gbps, lat)), key=lambda r: r["nodes"])
        print(f"\n{topo}, {gbps:g} Gbit/s, {lat:g} us per link (ms per exchange):\n")
        print("| P | spex dense | spex all-gather | spex Ok-Topk | DDP fp32 | DDP fp16 | PowerSGD r=1 "
              "| PowerSGD r=4 | control + vote | fastest of spex's | auto picks | auto / fastest |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in sel:
            t = r["times_s"]
            cells = " | ".join(f"{t[x] * 1e3:.2f}" if x in t else "-" for x in
                               ("dense", "gather", "oktopk", "ddp", "ddp_fp16", "powersgd1",
                                "powersgd4"))
            # The control round and vote of a balanced exchange (the dense all-reduce's, or the
            # all-gather's): nobody waits in the vote for a slower node there.
            bal = next(x for x in r["runs"] if x["what"] in ("dense", "gather"))["steps"][-1]
            ctl = (bal["control_s"] + bal["vote_s"]) * 1e3
            print(f"| {r['nodes']} | {cells} | {ctl:.3f} | {r['best']} | {r['auto']} | "
                  f"{r['auto_over_best']:.3f} |")
        # Crossovers: the first P where the all-gather is slower than the dense all-reduce, and
        # where Ok-Topk is faster than the all-gather.
        def first(cond):
            return next((r["nodes"] for r in sel if all(x in r["times_s"] for x in (
                "dense", "gather", "oktopk", "powersgd1")) and cond(r["times_s"])), None)
        print(f"\ncrossovers: all-gather slower than dense from P = "
              f"{first(lambda t: t['gather'] > t['dense'])}; Ok-Topk faster than the all-gather from "
              f"P = {first(lambda t: t['oktopk'] < t['gather'])}; PowerSGD r=1 faster than spex's "
              f"fastest from P = {first(lambda t: t['powersgd1'] < min(t['dense'], t['gather'], t['oktopk']))}")


def cmd_grid(a):
    """The cost model over every point of the issue's grid (rates x latencies x P): where each
    exchange wins, and by how much over the next best."""
    out = a.build_dir
    shapes = MODELS[a.model]()
    n = sum(numel(s) for s in shapes)
    result = []
    for d in [float(x) for x in a.densities.split(",")]:
        k = max(1, int(d * n))
        for gbps in [float(x) for x in a.rates.split(",")]:
            for lat in [float(x) for x in a.latencies.split(",")]:
                line = []
                for p in (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
                    m = model(p, gbps, 2 * lat, n, k, 4, 1.0, True, out)
                    line.append(m["best"])
                    result.append({"density": d, "gbps": gbps, "link_latency_us": lat, "nodes": p,
                                   **m})
                print(f"d={d} {gbps:g} Gbit/s {lat:g} us/link: " +
                      " ".join(f"{p}:{b[0].upper()}" for p, b in
                               zip((2, 4, 8, 16, 32, 64, 128, 256, 512, 1024), line)))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"model": a.model, "elements": n, "points": result}, f, indent=1)


def measured_emulated():
    """The emulated cluster's own measurements (2 and 4 hosts at 1 Gbit/s, 25,557,032 elements):
    the collective phase (wire) of the dense exchange (bench/network_bench.py, the median over its
    compressors' dense rows) and of the all-gather and Ok-Topk exchanges of topk at density 0.01
    and 0.001 (bench/oktopk_network_bench.py, ABBA in one run), in seconds."""
    res = os.path.join(REPO, "bench", "results")
    out = []
    with open(os.path.join(res, "network.json")) as f:
        net = json.load(f)
    for c in net["configs"]:
        if c["rate"] != "1gbit":
            continue
        dense = sorted(r["dense_wire_ms"] for r in c["runs"])
        out.append({"hosts": c["hosts"], "op": "dense", "density": None,
                    "measured_s": dense[len(dense) // 2] / 1e3, "source": "network.json"})
    with open(os.path.join(res, "oktopk_network.json")) as f:
        ok = json.load(f)
    for c in ok["configs"]:
        for r in c["runs"]:
            if r["compressor"] != "topk":
                continue
            for op, key in (("gather", "allgather"), ("oktopk", "oktopk")):
                out.append({"hosts": c["hosts"], "op": op, "density": r["density"],
                            "measured_s": r[key]["wire_ms"] / 1e3, "source": "oktopk_network.json"})
    return out


def cmd_calibrate(a):
    """Fits SMPI's bandwidth factors and the link latency to the emulated cluster's measurements:
    each point is simulated with the factors off at link latency 0 and at 50 us (the simulated
    time is then bw_part / factor + latency_part x L / 50 us exactly), the parameters are
    fitted on the log ratios, and every point is simulated again with the fitted values."""
    out = build(a.build_dir)
    n = 25557032
    pts = measured_emulated()

    def run(pt, lat, cfg):
        kw = dict(nodes=pt["hosts"], elements=n, density=pt["density"] or 0.01, gbps=1,
                  link_latency_us=lat, out=out, factors=cfg)
        if pt["op"] == "oktopk":
            return oktopk_time(simulate(op="oktopk", steps=2, **kw))
        return step_time(simulate(op=pt["op"], **kw))

    for pt in pts:
        pt["bw_part_s"] = run(pt, 0, "off")
        pt["lat_part_s_per_50us"] = run(pt, 50, "off") - pt["bw_part_s"]
        print(f"  {pt['hosts']} hosts {pt['op']} d={pt['density']}: measured {pt['measured_s'] * 1e3:.1f} ms, "
              f"simulated bandwidth part {pt['bw_part_s'] * 1e3:.1f} ms, latency part "
              f"{pt['lat_part_s_per_50us'] * 1e3:.3f} ms per 50 us")
    # Three parameters: a bandwidth factor for large messages (>= 4 MiB: the dense all-reduce's
    # blocks), one for smaller ones (the sparse exchanges' chunks), and the link latency. SMPI
    # applies a factor by message size (smpi/bw-factor: "0:small;4194304:large").
    for pt in pts:
        pt["large"] = pt["op"] == "dense"
    best = None
    lats = [x * 25 for x in range(0, 121)]
    for fl in [x / 100 for x in range(30, 151)]:
        for fs in [x / 100 for x in range(10, 151)]:
            for lat in lats:
                err = 0.0
                for pt in pts:
                    t = pt["bw_part_s"] / (fl if pt["large"] else fs) + pt["lat_part_s_per_50us"] * lat / 50
                    err += math.log(t / pt["measured_s"]) ** 2
                if best is None or err < best[0]:
                    best = (err, fl, fs, lat)
    _, fl, fs, lat = best
    print(f"calibrate: bandwidth factor {fl} (messages >= 4 MiB), {fs} (smaller), link latency {lat} us")
    cfg = [f"--cfg=smpi/bw-factor:0:{fs};4194304:{fl}", "--cfg=smpi/lat-factor:0:1",
           "--cfg=network/crosstraffic:0"]
    for pt in pts:
        pt["simulated_s"] = run(pt, lat, cfg)
        pt["error"] = pt["simulated_s"] / pt["measured_s"] - 1
        print(f"  {pt['hosts']} hosts {pt['op']:6s} d={pt['density']}: measured {pt['measured_s'] * 1e3:8.1f} ms, "
              f"simulated {pt['simulated_s'] * 1e3:8.1f} ms ({pt['error'] * 100:+.0f}%)")
    within = sum(abs(p["error"]) <= 0.15 for p in pts)
    print(f"calibrate: {within} of {len(pts)} points within 15%")
    with open(a.out, "w") as fh:
        json.dump({"bw_factor_large": fl, "bw_factor_small": fs, "link_latency_us": lat,
                   "smpi_cfg": cfg, "elements": n, "gbps": 1,
                   "points": pts, "within_15pct": within}, fh, indent=1)
    print(f"calibrate: {a.out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=DEFAULT_OUT)
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("whatif", help="what would spex do on my cluster")
    w.add_argument("--nodes", type=int, required=True)
    w.add_argument("--gbps", type=float, required=True, help="each node's link, Gbit/s")
    w.add_argument("--latency-us", type=float, default=5.0, help="one-way node-to-node latency")
    w.add_argument("--model", choices=sorted(MODELS), help="layer shapes (n and PowerSGD's sizes)")
    w.add_argument("--elements", type=int, help="the gradient's elements (instead of --model)")
    w.add_argument("--buckets", type=int, default=1, help="equal buckets the gradient is cut into")
    w.add_argument("--density", type=float, default=0.01)
    w.add_argument("--values", choices=("float32", "bfloat16", "float16"), default="float32")
    w.add_argument("--skew", type=float, default=1.0,
                   help="Ok-Topk's busiest region over the mean (1: uniform selections)")
    w.add_argument("--simulate", action="store_true", help="also simulate (star, factors off)")
    w.add_argument("--json", help="write the answer as JSON here")
    w.set_defaults(fn=cmd_whatif)
    s = sub.add_parser("sweep", help="the benchmark: simulate a grid of clusters")
    s.add_argument("--out", required=True)
    s.add_argument("--model", choices=sorted(MODELS), default="resnet50")
    s.add_argument("--elements", type=int, help="bucket elements (default: the model's)")
    s.add_argument("--density", type=float, default=0.01)
    s.add_argument("--topologies", default="star")
    s.add_argument("--rates", default="10,100", help="Gbit/s, comma-separated")
    s.add_argument("--latencies", default="2", help="us per link, comma-separated")
    s.add_argument("--max-nodes", type=int, default=64)
    s.add_argument("--real-gather-max", type=int, default=16)
    s.add_argument("--nodes", help="node counts, comma-separated (instead of --max-nodes)")
    s.add_argument("--ops", default="dense,gather,oktopk," + ",".join(PEER_OPS))
    s.add_argument("--budget-s", type=float, default=0, help="stop starting points after this")
    s.add_argument("--resume", action="store_true", help="keep the points already in --out")
    s.add_argument("--add-ops", action="store_true",
                   help="with --resume: simulate the --ops a kept point lacks")
    s.set_defaults(fn=cmd_sweep)
    p = sub.add_parser("plot", help="log-log plot of a sweep")
    p.add_argument("sweep")
    p.add_argument("--topology", default="star")
    p.add_argument("--model-lines", action="store_true",
                   help="add the cost model's spex exchanges to 1,024 nodes as thin lines")
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_plot)
    r = sub.add_parser("remodel", help="recompute the cost model's pick at every swept point")
    r.add_argument("sweeps", nargs="+")
    r.set_defaults(fn=cmd_remodel)
    t = sub.add_parser("table", help="markdown tables of sweeps")
    t.add_argument("sweeps", nargs="+")
    t.set_defaults(fn=cmd_table)
    g = sub.add_parser("grid", help="the cost model's pick over rates x latencies x P")
    g.add_argument("--model", choices=sorted(MODELS), default="resnet50")
    g.add_argument("--densities", default="0.01,0.001")
    g.add_argument("--rates", default="1,10,25,100")
    g.add_argument("--latencies", default="1,5,25", help="us per link (a route crosses two)")
    g.add_argument("--out")
    g.set_defaults(fn=cmd_grid)
    k = sub.add_parser("skew", help="selections of real gradients against uniform ones")
    k.add_argument("--recording", action="append", required=True,
                   help="LABEL=FILE, record_selections.py record's file (repeatable)")
    k.add_argument("--record-step", type=int, default=-1, help="index into the recorded steps")
    k.add_argument("--densities", default="0.01,0.001")
    k.add_argument("--elements", default="25557032", help="bucket sizes, comma-separated")
    k.add_argument("--nodes", default="4,8,16,32,64")
    k.add_argument("--rates", default="10")
    k.add_argument("--latency", type=float, default=2, help="us per link")
    k.add_argument("--wire", choices=("float32", "bfloat16"), default="float32")
    k.add_argument("--real-gather-max", type=int, default=16)
    k.add_argument("--real-union-max", type=int, default=16)
    k.add_argument("--real-oktopk-max", type=int, default=256)
    k.add_argument("--index-dir", help="where the index files go (default: a temporary folder)")
    k.add_argument("--keep-index-files", action="store_true")
    k.add_argument("--resume", action="store_true")
    k.add_argument("--out", required=True)
    k.set_defaults(fn=cmd_skew)
    kt = sub.add_parser("skewtable", help="markdown table of skew sweeps")
    kt.add_argument("sweeps", nargs="+")
    kt.set_defaults(fn=cmd_skewtable)
    kp = sub.add_parser("skewplot", help="log-log plot of a skew sweep")
    kp.add_argument("sweep")
    kp.add_argument("--gbps", type=float, default=10)
    kp.add_argument("--out", required=True)
    kp.set_defaults(fn=cmd_skewplot)
    c = sub.add_parser("calibrate", help="fit the network factors to the emulated cluster")
    c.add_argument("--out", required=True)
    c.set_defaults(fn=cmd_calibrate)
    a = ap.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
