#!/usr/bin/env python3
"""Checks a spexd timeline (Chrome trace JSON, daemon/observe/timeline.h) of a known run.

    check_timeline.py FILE --pid 0 --buckets 0,1 --steps 5 [--sparse 1]

Parses the file with the json module (it must be a complete JSON array) and checks: the process
and every bucket's track are named; every bucket has one "exchange" event per step 0..steps-1;
each exchange's phase events lie inside it, in order without overlapping, start with wait_local
and end with publish, and add up to the exchange's duration (the engine's phases are contiguous:
only a preemption between two of them leaves a gap, so at most 1% of the exchanges, and at
least one, may fall short); a sparse bucket has compress.
Prints one line per failure and exits 1 if any.
"""
import argparse
import collections
import json
import sys

PHASES = {"wait_local", "reduce_local", "compress", "collective", "decode", "publish"}
TOL_US = 2.0  # rounding and the few instructions between two phases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--pid", type=int, default=0)
    ap.add_argument("--buckets", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--sparse", default="", help="buckets that must show a compress phase")
    ap.add_argument("--min_steps", action="store_true",
                    help="at least --steps exchanges per bucket (a recording started mid-run)")
    a = ap.parse_args()
    failures = []
    fail = failures.append
    short = []  # exchanges whose phases do not cover them
    with open(a.file) as f:
        try:
            events = json.load(f)
        except json.JSONDecodeError as e:
            print(f"FAIL: {a.file} is not valid JSON: {e}")
            return 1
    if not isinstance(events, list):
        print("FAIL: not a JSON array of trace events")
        return 1
    buckets = [int(b) for b in a.buckets.split(",")]
    sparse = {int(b) for b in a.sparse.split(",") if b}
    meta = [e for e in events if e.get("ph") == "M"]
    if not any(e["name"] == "process_name" and e["pid"] == a.pid for e in meta):
        fail("no process_name metadata")
    named = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    exchanges = collections.defaultdict(dict)
    phases = collections.defaultdict(list)
    for e in events:
        if e.get("ph") != "X":
            continue
        for key in ("name", "ts", "dur", "pid", "tid"):
            if key not in e:
                fail(f"event without {key}: {e}")
        if e["pid"] != a.pid:
            fail(f"event of pid {e['pid']}, expected {a.pid}")
        if e["dur"] < 0:
            fail(f"negative duration: {e}")
        step = e["args"]["step"]
        if e["name"] == "exchange":
            if step in exchanges[e["tid"]]:
                fail(f"bucket {e['tid']} step {step}: two exchange events")
            exchanges[e["tid"]][step] = e
        elif e["name"] in PHASES:
            phases[(e["tid"], step)].append(e)
        else:
            fail(f"unknown event name {e['name']}")
    for b in buckets:
        if named.get(b) != f"bucket {b}":
            fail(f"bucket {b}: track not named (thread_name {named.get(b)!r})")
        steps = sorted(exchanges[b])
        if a.min_steps:
            if len(steps) < a.steps or steps != list(range(steps[0], steps[0] + len(steps))):
                fail(f"bucket {b}: exchanges of steps {steps}, expected {a.steps}+ consecutive")
        elif steps != list(range(a.steps)):
            fail(f"bucket {b}: exchanges of steps {steps}, expected 0..{a.steps - 1}")
        for s in steps:
            x = exchanges[b][s]
            if x["args"]["status"] != "OK":
                fail(f"bucket {b} step {s}: status {x['args']['status']}")
            ps = sorted(phases[(b, s)], key=lambda e: e["ts"])
            names = [p["name"] for p in ps]
            if not ps or names[0] != "wait_local" or names[-1] != "publish":
                fail(f"bucket {b} step {s}: phases {names} (expected wait_local first, publish last)")
                continue
            if b in sparse and "compress" not in names:
                fail(f"bucket {b} step {s}: sparse but no compress phase: {names}")
            for p, q in zip(ps, ps[1:]):
                if p["ts"] + p["dur"] > q["ts"] + 1e-3:
                    fail(f"bucket {b} step {s}: {p['name']} overlaps {q['name']}")
            begin, end = x["ts"], x["ts"] + x["dur"]
            if ps[0]["ts"] < begin - 1e-3 or ps[-1]["ts"] + ps[-1]["dur"] > end + 1e-3:
                fail(f"bucket {b} step {s}: phases outside the exchange")
            total = sum(p["dur"] for p in ps)
            if total > x["dur"] + TOL_US:
                fail(f"bucket {b} step {s}: phases add up to {total:.3f} us, more than the "
                     f"exchange's {x['dur']:.3f} us")
            elif x["dur"] - total > max(TOL_US, 0.02 * x["dur"]):
                short.append(f"bucket {b} step {s}: phases add up to {total:.3f} us, exchange "
                             f"{x['dur']:.3f} us")
    n = sum(len(v) for v in exchanges.values())
    if len(short) > max(1, n // 100):
        failures.extend(short)
    for f_ in failures[:50]:
        print("FAIL:", f_)
    print(f"timeline {a.file}: {len(events)} events, {n} exchanges, {len(short)} with a gap "
          f"between phases, {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
