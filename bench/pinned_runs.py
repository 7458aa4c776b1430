"""Runs a benchmark program that prints one JSON object per line, pinned to cores with taskset,
several times: the shared loop of bench/histogram_select_bench.py and bench/sum_histogram_bench.py."""
import json
import subprocess
import sys


def json_line_runs(cmds, cpu, name):
    """Runs each command of `cmds` in turn (under `taskset -c CPU` unless cpu is empty) and returns
    every line it printed, parsed, with "run" set to the command's position. Exits naming `name`
    and the end of its stderr when one fails."""
    rows = []
    for run, cmd in enumerate(cmds):
        if cpu:
            cmd = ["taskset", "-c", cpu] + list(cmd)
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"{name} failed: {p.stderr[-2000:]}")
        for line in p.stdout.splitlines():
            r = json.loads(line)
            r["run"] = run
            rows.append(r)
    return rows


def quantile(sorted_values, f):
    """The value at fraction f of a sorted list (the lower one: no interpolation)."""
    return sorted_values[min(len(sorted_values) - 1, int(f * len(sorted_values)))]
