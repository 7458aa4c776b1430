#!/usr/bin/python3
"""The scale harness under SimGrid SMPI (bench/scale, docs/scale.md), at 4 and 8 simulated nodes
on a star of 10 Gbit/s links with the network model's factors off:
  - spex's dense all-reduce (MpiCollective::AllReduceScaled) takes 2 (P-1)/P x 4n / B, its half
    all-reduce 2 (P-1)/P x 2n / B, the sparse all-gather (ExchangeSparseGather) (P-1) x 8k / B,
    each within 1% (link latency 0.1 us: the analytic costs are the bandwidth terms);
  - the stand-ins (same MPI calls, same byte counts, shared buffers) report the real code's
    byte counts and take its simulated time (Ok-Topk's, whose parts and kept entries follow
    equal regions and k/P per owner, within 1% of both);
  - the cost model (daemon/engine/exchange_cost.h) is within 5% of the simulated dense,
    all-gather and Ok-Topk exchanges with their control round and commit vote at 2 us per link,
    and picks the simulation's fastest;
  - selections read from an index file (--indices, record_selections.py's format) with a planted
    skewed, overlapping set at 4 nodes: pattern A's union and bytes, the all-gather's bytes (also
    with the delta index form, --index_encoding=delta: the stand-ins' bytes the real code's), and
    Ok-Topk's rebalanced regions and kept entries per owner in its stand-in, as computed by hand.
Builds the harness with smpicxx from the test's own copy of the sources (about 20 s on 2 cores).
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.getcwd(), "bench", "scale"))
import record_selections  # noqa: E402
import spex_scale  # noqa: E402

GBPS = 10
B = GBPS * 1e9 / 8
failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        failures.append(what)


def near(got, want, tol):
    return abs(got - want) <= tol * abs(want)


def planted(out, tmp):
    """4 nodes, n = 1000, density 0.1 (k = 100): node r selects [50r, 50r + 100), a skewed and
    overlapping selection (union 250, all in the first quarter)."""
    path = os.path.join(tmp, "planted.idx")
    record_selections.write_index_file(path, 1000, [list(range(50 * r, 50 * r + 100)) for r in range(4)])
    kw = dict(nodes=4, elements=1000, density=0.1, gbps=GBPS, link_latency_us=2, out=out, indices=path)
    chunk_idx, chunk_pairs = 48 + 4 * 100, 48 + 8 * 100  # wire chunks: header 48 bytes
    for op in ("union", "union_standin"):
        r = spex_scale.simulate(op=op, **kw)
        check(r["union"] == 250, f"planted {op}: union {r['union']} == 250")
        # The index chunks all-gathered, then the union's 250 float32 values all-reduced.
        check(r["bytes_sent"] == chunk_idx + 1000 and r["bytes_received"] == 3 * chunk_idx + 1000,
              f"planted {op}: bytes sent/received {r['bytes_sent']}/{r['bytes_received']} == "
              f"{chunk_idx + 1000}/{3 * chunk_idx + 1000}")
    g = spex_scale.simulate(op="gather", **kw)
    check(g["selected"] == 100 and g["bytes_received"] == 3 * chunk_pairs,
          f"planted gather: {g['selected']} selected, {g['bytes_received']} bytes received == {3 * chunk_pairs}")
    # The delta index form (--index_encoding=delta, spexd's default --wire_index_encoding): the
    # stand-ins count the real code's bytes, fewer than with uint32 indices.
    kd = dict(kw, harness_args=["--index_encoding=delta"])
    for real, standin, u32_sent in (("union", "union_standin", chunk_idx + 1000),
                                    ("gather", "gather_standin", chunk_pairs)):
        r, s = spex_scale.simulate(op=real, **kd), spex_scale.simulate(op=standin, **kd)
        for key in ("bytes_sent", "bytes_received", "max_bytes_sent", "max_bytes_received"):
            check(r[key] == s[key], f"planted delta {standin} {key} {s[key]} == real code's {r[key]}")
        check(r["bytes_sent"] < u32_sent, f"planted delta {real}: {r['bytes_sent']} bytes sent < {u32_sent}")
    u = spex_scale.simulate(op="union", **dict(kw, indices=None))
    # One position per stratum of 10 on each node: about 10 (1 - 0.9^4) = 3.4 distinct a stratum.
    check(u["indices"] == "uniform" and 300 < u["union"] <= 400,
          f"without --indices: uniform strata (union {u['union']}, about 344 expected)")
    # Ok-Topk's regions: the nodes offer the quartiles of their sets (50r + 25j), the bounds are
    # their means 100, 125, 150: the owners receive 150, 50, 50 and 150 entries and hold 100, 25,
    # 25 and 100 distinct positions, so they keep 40, 10, 10 and 40 of the global top 100.
    s = spex_scale.simulate(op="oktopk_standin", steps=2, **kw)
    check(s["region_entries"] == [150, 50, 50, 150], f"planted Ok-Topk regions {s['region_entries']}")
    check(s["kept"] == [40, 10, 10, 40], f"planted Ok-Topk kept per owner {s['kept']}")
    ok = spex_scale.simulate(op="oktopk", steps=2, **kw)
    check(near(s["max_bytes_received"], ok["max_bytes_received"], 0.03),
          f"planted Ok-Topk stand-in max bytes received {s['max_bytes_received']} within 3% of the "
          f"real code's {ok['max_bytes_received']} (its kept entries follow the random values)")


def main():
    tmp = os.environ.get("TEST_TMPDIR", tempfile.mkdtemp())
    out = os.path.join(tmp, "scale_out")
    os.environ.setdefault("SCALE_OPT", "-O0")  # compiles faster; simulated times do not depend on it
    spex_scale.build(out)
    planted(out, tmp)
    n, d = 1 << 20, 0.05
    k = int(n * d)
    for p in (4, 8):
        kw = dict(nodes=p, elements=n, density=d, gbps=GBPS, link_latency_us=0.1, out=out,
                  control=False)
        dense = spex_scale.simulate(op="dense", **kw)
        t = dense["steps"][0]["exchange_s"]
        want = 2 * (p - 1) / p * 4 * n / B
        check(near(t, want, 0.01), f"P={p} dense all-reduce {t:.6g} s vs 2(P-1)/P*4n/B {want:.6g} s")
        gather = spex_scale.simulate(op="gather", **kw)
        t = gather["steps"][0]["exchange_s"]
        want = (p - 1) * 8 * k / B
        check(near(t, want, 0.01), f"P={p} sparse all-gather {t:.6g} s vs (P-1)*8k/B {want:.6g} s")
        check(gather["selected"] == k, f"P={p} every node selected k={k} ({gather['selected']})")
        standin = spex_scale.simulate(op="gather_standin", **kw)
        for key in ("bytes_sent", "bytes_received", "max_bytes_sent", "max_bytes_received"):
            check(standin[key] == gather[key],
                  f"P={p} all-gather stand-in {key} {standin[key]} == real code's {gather[key]}")
        ts = standin["steps"][0]["exchange_s"]
        check(near(ts, gather["steps"][0]["exchange_s"], 1e-6),
              f"P={p} all-gather stand-in's time {ts:.9g} s == real code's")
        half = spex_scale.simulate(op="dense_half", wire="bfloat16", **kw)
        th = half["steps"][0]["exchange_s"]
        want = 2 * (p - 1) / p * 2 * n / B
        check(near(th, want, 0.01), f"P={p} bfloat16 all-reduce {th:.6g} s vs 2(P-1)/P*2n/B {want:.6g} s")
        hs = spex_scale.simulate(op="dense_half_standin", wire="bfloat16", **kw)
        for key in ("bytes_sent", "bytes_received"):
            check(hs[key] == half[key], f"P={p} half stand-in {key} {hs[key]} == real code's {half[key]}")
        check(near(hs["steps"][0]["exchange_s"], th, 1e-6), f"P={p} half stand-in's time == real code's")
        # Ok-Topk's stand-in: its parts by equal regions and k/P kept entries per owner, against
        # the real code's (rebalanced regions, the kept set found by the histograms).
        ok = spex_scale.simulate(op="oktopk", steps=2, **kw)
        oks = spex_scale.simulate(op="oktopk_standin", steps=2, **kw)
        for key in ("bytes_sent", "bytes_received", "max_bytes_received"):
            check(near(oks[key], ok[key], 0.01),
                  f"P={p} Ok-Topk stand-in {key} {oks[key]} within 1% of the real code's {ok[key]}")
        for step in (0, 1):
            a_, b_ = ok["steps"][step]["exchange_s"], oks["steps"][step]["exchange_s"]
            check(near(b_, a_, 0.01), f"P={p} Ok-Topk stand-in step {step} {b_:.6g} s within 1% of {a_:.6g} s")
        # The cost model against the simulation, control round and commit vote included.
        sim = {}
        kw.update(link_latency_us=2, control=True)
        sim["dense"] = spex_scale.step_time(spex_scale.simulate(op="dense", **kw))
        sim["allgather"] = spex_scale.step_time(spex_scale.simulate(op="gather", **kw))
        sim["oktopk"] = spex_scale.oktopk_time(spex_scale.simulate(op="oktopk", steps=2, **kw))
        m = spex_scale.model(p, GBPS, 4, n, k, 4, 1.0, True, out)  # 2 links of 2 us a route
        for name, t in sim.items():
            check(near(m[name + "_s"], t, 0.05),
                  f"P={p} cost model {name} {m[name + '_s']:.6g} s vs simulated {t:.6g} s")
        best = min(sim, key=sim.get)
        check(m["best"] == best, f"P={p} the model picks {m['best']}, the simulation's fastest is {best}")
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
