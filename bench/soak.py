#!/usr/bin/python3
"""Soak program (issue 16 item 7): many steps on 2 nodes x 2 trainers with trainers killed and restarted.

Starts --nodes spexd daemons under ONE mpirun (--local_trainers=2, --threads=1,
--dense_fallback=off so every sparse step is sparse and the trainers' oracle can replay it) and
then runs jobs back to back until --steps steps have completed: each job is --nodes x 2
client/spex_trainer processes with --verify on buckets of mixed sizes and compressors (default
dense 1,000 and 4,097 elements, micro 65,536, topk 20,000, dgc 30,000, all at density 0.01;
dense results must be exact, sparse ones must match the trainer's replay of the whole cluster
in the kernels/reference_cluster.h oracle, residual norms included), alternating the doorbell
and the RPC path. Every --kill_every-th job one trainer (chosen at random) is killed with
SIGKILL after a random part of the job: every other trainer of every node must then exit
non-zero within --abort_within seconds with the daemon's error naming the dead trainer
("local trainer R (pid P) of node N died"), and the next job (all trainers restarted, same
daemons) must run normally.

Between jobs (every trainer gone) and every --sample_s seconds during them it samples each
daemon's resident memory (VmRSS of /proc/PID/status), its open descriptors (/proc/PID/fd) and
its /dev/shm entries (spex-PID-*). The verdict uses the between-job samples (the same state
every time: the last job's buckets still held): resident growth = the mean of the last
--window samples / the mean of the first --window samples after warm-up (--warmup_steps) - 1,
per daemon; descriptors and shm entries after warm-up must never exceed their first
post-warm-up value. Writes <out>.json (every sample, every job, the verdict) and <out>.png
(RSS, descriptors and shm entries against completed steps). Exit status 0 only when resident
growth < 1% on every daemon, descriptors and shm entries do not grow, every completed job
verified every result, and every kill ended the job on every survivor with the right error
within --abort_within seconds.

Run from the repository root with /usr/bin/python3; it builds spexd and spex_trainer with bazel
(or takes them from --bin_dir) and copies them aside so concurrent rebuilds do not change what runs.
A program, not a test: 10,000 steps took 26 minutes on a loaded 2-core machine (job start-ups included).
"""
import argparse, json, os, random, re, shutil, signal, statistics, subprocess, sys, tempfile, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_btl_tcp_if_include="lo",
           OMPI_MCA_oob_tcp_if_include="lo")
TARGETS = {"spexd": "//daemon:spexd", "spex_trainer": "//client:spex_trainer"}
LOCAL = 2  # trainers per node


def build(bin_dir):
    """Copies spexd and spex_trainer aside (built now, or from --bin_dir)."""
    if not bin_dir:
        subprocess.run(["bazel", "build", "--jobs=2", *TARGETS.values()], cwd=ROOT, check=True)
        bin_dir = subprocess.run(["bazel", "info", "bazel-bin"], cwd=ROOT, check=True, capture_output=True,
                                 text=True).stdout.strip()
        paths = {name: os.path.join(bin_dir, label[2:].replace(":", "/")) for name, label in TARGETS.items()}
    else:
        paths = {name: os.path.join(bin_dir, name) for name in TARGETS}
    tmp = tempfile.mkdtemp(prefix="spex-soak-bin.")
    return {name: shutil.copy2(path, os.path.join(tmp, name)) for name, path in paths.items()}, tmp


def daemon_pids(sock_dir, want):
    """The spexd processes whose command line names our socket directory (mpirun's children)."""
    pids = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"spexd") and any(a.startswith(f"--socket={sock_dir}/".encode()) for a in argv):
            pids.append(int(p))
    return sorted(pids) if len(pids) == want else None


def sample_daemon(pid):
    with open(f"/proc/{pid}/status") as f:
        status = f.read()
    kb = {k: int(re.search(rf"^{k}:\s+(\d+) kB", status, re.M).group(1))
          for k in ("VmRSS", "RssAnon", "RssFile", "RssShmem")}
    with open(f"/proc/{pid}/maps") as f:
        maps = sum(1 for _ in f)
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    shm = sum(1 for n in os.listdir("/dev/shm") if n.startswith(f"spex-{pid}-"))
    return {"rss_kb": kb["VmRSS"], "anon_kb": kb["RssAnon"], "file_kb": kb["RssFile"], "shmem_kb": kb["RssShmem"],
            "maps": maps, "fds": fds, "shm": shm}


class Soak:
    def __init__(self, args, bins):
        self.args, self.bins = args, bins
        self.dir = tempfile.mkdtemp(prefix="spex-soak.")
        self.samples, self.jobs, self.failures = [], [], []
        self.steps_done = 0  # steps of completed jobs
        self.progress_file = None  # a running job's trainer whose per-step lines count progress
        self.lock = threading.Lock()
        self.t0 = time.time()

    def fail(self, msg):
        print("FAIL: " + msg, flush=True)
        self.failures.append(msg)

    def start_daemons(self):
        a = self.args
        self.mpilog = open(os.path.join(self.dir, "mpirun.log"), "w")
        self.mpi = subprocess.Popen(
            ["mpirun", "-np", str(a.nodes), self.bins["spexd"], f"--socket={self.dir}/node{{rank}}.sock",
             f"--local_trainers={LOCAL}", "--threads=1", "--dense_fallback=off", "--register_timeout=60s",
             "--log_level=warning"], env=ENV, stdout=self.mpilog, stderr=subprocess.STDOUT)
        for _ in range(600):
            if all(os.path.exists(f"{self.dir}/node{n}.sock") for n in range(a.nodes)):
                self.pids = daemon_pids(self.dir, a.nodes)
                if self.pids:
                    return
            if self.mpi.poll() is not None:
                raise RuntimeError("mpirun exited: " + open(self.mpilog.name).read())
            time.sleep(0.1)
        raise RuntimeError("daemons did not start within 60 s")

    def stop_daemons(self):
        if self.mpi.poll() is None:
            self.mpi.send_signal(signal.SIGTERM)
            try:
                self.mpi.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.mpi.kill()
                self.mpi.wait()
        left = [n for n in os.listdir("/dev/shm") if any(n.startswith(f"spex-{p}-") for p in self.pids)]
        if left:
            self.fail(f"segments left in /dev/shm after the daemons stopped: {left}")

    def current_step(self):
        with self.lock:
            done, f = self.steps_done, self.progress_file
        extra = 0
        if f:
            try:
                with open(f) as fh:
                    extra = sum(1 for line in fh if " step " in line and "buckets exchanged" in line)
            except OSError:
                pass
        return done + extra

    def sample(self, kind):
        s = {"t": round(time.time() - self.t0, 3), "step": self.current_step(), "kind": kind, "daemons": []}
        for pid in self.pids:
            try:
                s["daemons"].append(sample_daemon(pid))
            except (OSError, AttributeError):
                self.fail(f"daemon {pid} is gone")
                return None
        self.samples.append(s)
        return s

    def sampler(self, stop):
        while not stop.wait(self.args.sample_s):
            self.sample("during")

    def trainer_cmd(self, node, rank, steps):
        a = self.args
        return [self.bins["spex_trainer"], f"--socket={self.dir}/node{node}.sock", f"--local_rank={rank}",
                f"--local_size={LOCAL}", "--verify", "--threads=1", f"--buckets={a.buckets}",
                f"--compressors={a.compressors}", f"--density={a.density}", f"--steps={steps}",
                f"--mode={a.mode}"]

    def run_job(self, index, steps, kill):
        a = self.args
        procs, logs = {}, {}
        for node in range(a.nodes):
            for rank in range(LOCAL):
                path = os.path.join(self.dir, f"job{index}.n{node}.t{rank}.log")
                logs[(node, rank)] = path
                procs[(node, rank)] = subprocess.Popen(self.trainer_cmd(node, rank, steps), env=ENV,
                                                       stdout=open(path, "w"), stderr=subprocess.STDOUT)
        with self.lock:
            self.progress_file = logs[(0, 0)]
        job = {"job": index, "steps": steps, "killed": None}
        t_start = time.time()
        if kill:
            victim = random.choice(sorted(procs))
            delay = random.uniform(0.2, 0.8) * steps * a.step_s
            time.sleep(delay)
            victim_pid = procs[victim].pid
            t_kill = time.time()
            procs[victim].kill()
            procs[victim].wait()
            job["killed"] = {"node": victim[0], "local_rank": victim[1], "pid": victim_pid,
                             "after_s": round(t_kill - t_start, 3)}
            want = f"local trainer {victim[1]} (pid {victim_pid}) of node {victim[0]} died"
            ended, slowest, done_steps = 0, 0.0, []
            for key, p in procs.items():
                if key == victim:
                    continue
                try:
                    p.wait(timeout=max(0.1, a.abort_within - (time.time() - t_kill)))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                    self.fail(f"job {index}: trainer {key} still running {a.abort_within} s after the kill of {victim}")
                    continue
                slowest = max(slowest, time.time() - t_kill)
                out = open(logs[key]).read()
                done_steps.append(sum(1 for line in out.splitlines() if "buckets exchanged" in line))
                if p.returncode == 0:
                    # It may have finished its last step before the death was noticed.
                    if done_steps[-1] != steps:
                        self.fail(f"job {index}: trainer {key} exited 0 after {done_steps[-1]} of {steps} steps")
                    continue
                ended += 1
                if want not in out:
                    self.fail(f"job {index}: trainer {key} failed without naming the dead trainer "
                              f"('{want}'): {out.strip().splitlines()[-1:]}")
            job["killed"].update({"survivors_ended": ended, "last_survivor_exit_s": round(slowest, 3),
                                  "survivor_steps": done_steps})
            print(f"job {index}: killed node {victim[0]} trainer {victim[1]} after {job['killed']['after_s']:.1f} s; "
                  f"{ended} survivors ended with the error, the last {slowest:.2f} s after the kill", flush=True)
        else:
            verified = 0
            for key, p in procs.items():
                try:
                    p.wait(timeout=a.job_timeout)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                out = open(logs[key]).read()
                if p.returncode != 0:
                    self.fail(f"job {index}: trainer {key} exited {p.returncode}: {out.strip().splitlines()[-3:]}")
                elif " verified" in out and "verification failures" not in out:
                    verified += 1
                else:
                    self.fail(f"job {index}: trainer {key} did not report a verified run")
            job["verified_trainers"] = verified
            with self.lock:
                self.steps_done += steps
        job["seconds"] = round(time.time() - t_start, 3)
        with self.lock:
            self.progress_file = None
        for path in logs.values():
            os.unlink(path)
        self.jobs.append(job)

    def run(self):
        a = self.args
        self.start_daemons()
        stop = threading.Event()
        th = threading.Thread(target=self.sampler, args=(stop,), daemon=True)
        self.sample("start")
        th.start()
        index = 0
        try:
            while self.steps_done < a.steps and len(self.failures) < 20:
                kill = a.kill_every > 0 and index % a.kill_every == a.kill_every - 1
                steps = min(a.steps_per_job, a.steps - self.steps_done) if not kill else a.steps_per_job
                self.run_job(index, steps, kill)
                # Let the daemons notice that the job's trainers have gone (a death is reaped within
                # 100 ms, the engine wakes every 50 ms) and return to idle, where they trim their heap.
                time.sleep(0.3)
                s = self.sample("between")
                if s and index % 5 == 0:
                    d = s["daemons"]
                    print(f"[{s['t']:7.0f} s] {self.steps_done} steps, job {index}: RSS "
                          f"{', '.join(str(x['rss_kb']) for x in d)} kB, fds {', '.join(str(x['fds']) for x in d)}, "
                          f"shm {', '.join(str(x['shm']) for x in d)}", flush=True)
                index += 1
        finally:
            stop.set()
            th.join()
            self.stop_daemons()


def verdict(soak, args):
    between = [s for s in soak.samples if s["kind"] == "between" and s["step"] >= args.warmup_steps]
    out = {"between_samples_after_warmup": len(between), "daemons": []}
    ok = True
    if len(between) < 2 * args.window:
        soak.fail(f"only {len(between)} between-job samples after warm-up; need {2 * args.window} "
                  "(run more steps or lower --warmup_steps/--window)")
        return out, False
    for i, pid in enumerate(soak.pids):
        rss = [s["daemons"][i]["rss_kb"] for s in between]
        fds = [s["daemons"][i]["fds"] for s in between]
        shm = [s["daemons"][i]["shm"] for s in between]
        first, last = statistics.mean(rss[:args.window]), statistics.mean(rss[-args.window:])
        growth = last / first - 1
        d = {"pid": pid, "rss_first_kb": round(first, 1), "rss_last_kb": round(last, 1), "rss_growth": growth,
             "rss_max_kb": max(rss), "rss_min_kb": min(rss), "fds_first": fds[0], "fds_max": max(fds),
             "fds_last": fds[-1], "shm_first": shm[0], "shm_max": max(shm), "shm_last": shm[-1]}
        out["daemons"].append(d)
        print(f"daemon {i} (pid {pid}): RSS {first:.0f} kB -> {last:.0f} kB after warm-up ({100 * growth:+.2f}%; "
              f"min {min(rss)} max {max(rss)}), fds {fds[0]} -> {fds[-1]} (max {max(fds)}), shm {shm[0]} -> "
              f"{shm[-1]} (max {max(shm)})")
        if growth >= 0.01:
            soak.fail(f"daemon {i}: resident memory grew {100 * growth:.2f}% after warm-up (limit 1%)")
            ok = False
        if max(fds) > fds[0]:
            soak.fail(f"daemon {i}: open descriptors grew from {fds[0]} to {max(fds)}")
            ok = False
        if max(shm) > shm[0]:
            soak.fail(f"daemon {i}: /dev/shm entries grew from {shm[0]} to {max(shm)}")
            ok = False
    return out, ok


def plot(soak, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    for i, pid in enumerate(soak.pids):
        for ax, key, scale in ((axes[0], "rss_kb", 1 / 1024), (axes[1], "fds", 1), (axes[2], "shm", 1)):
            pts = [(s["step"], s["daemons"][i][key] * scale) for s in soak.samples if len(s["daemons"]) > i]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ".", ms=2, label=f"node {i} (pid {pid})")
    axes[0].set_ylabel("resident (MiB)")
    axes[1].set_ylabel("open descriptors")
    axes[2].set_ylabel("/dev/shm entries")
    axes[2].set_xlabel("completed steps")
    axes[0].set_ylim(bottom=0)
    axes[0].legend()
    kills = sum(1 for j in soak.jobs if j["killed"])
    axes[0].set_title(f"spexd soak: {soak.steps_done} steps, {len(soak.jobs)} jobs, {kills} trainers killed")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10000, help="completed steps to run (killed jobs not counted)")
    ap.add_argument("--steps_per_job", type=int, default=200)
    ap.add_argument("--kill_every", type=int, default=4, help="every Nth job gets a trainer killed (0: none)")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--buckets", default="1000,4097,65536,20000,30000")
    ap.add_argument("--compressors", default="dense,dense,micro,topk,dgc")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--mode", default="alternate", help="spex_trainer --mode: doorbell|rpc|alternate")
    ap.add_argument("--step_s", type=float, default=0.03, help="expected seconds per step (when to kill)")
    ap.add_argument("--abort_within", type=float, default=10.0,
                    help="seconds the survivors of a kill may take to end with the error")
    ap.add_argument("--job_timeout", type=float, default=900.0)
    ap.add_argument("--warmup_steps", type=int, default=1000)
    ap.add_argument("--window", type=int, default=5, help="between-job samples averaged at each end")
    ap.add_argument("--sample_s", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bin_dir", default="", help="take spexd and spex_trainer from this directory instead of "
                    "building them")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "soak"))
    args = ap.parse_args()
    if len(args.buckets.split(",")) != len(args.compressors.split(",")):
        sys.exit("soak: --buckets and --compressors need the same number of entries")
    random.seed(args.seed)
    bins, bin_dir = build(args.bin_dir)
    soak = Soak(args, bins)
    try:
        soak.run()
    finally:
        shutil.rmtree(bin_dir, ignore_errors=True)
    v, ok = verdict(soak, args)
    kills = [j["killed"] for j in soak.jobs if j["killed"]]
    summary = {
        "steps": soak.steps_done, "jobs": len(soak.jobs), "kills": len(kills),
        "seconds": round(time.time() - soak.t0, 1), "load_average_end": os.getloadavg(),
        "survivor_exit_after_kill_s": {"max": max((k["last_survivor_exit_s"] for k in kills), default=None),
                                      "median": statistics.median([k["last_survivor_exit_s"] for k in kills])
                                      if kills else None},
        "verdict": v, "ok": ok and not soak.failures, "failures": soak.failures,
        "config": {k: getattr(args, k) for k in ("steps", "steps_per_job", "kill_every", "nodes", "buckets",
                                                 "compressors", "density", "mode", "warmup_steps", "window", "seed")},
        "log_tail": open(soak.mpilog.name).read()[-4000:],
        "jobs_detail": soak.jobs, "samples": soak.samples,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(summary, f, indent=1)
    plot(soak, args.out + ".png")
    print(f"{soak.steps_done} steps in {len(soak.jobs)} jobs ({len(kills)} with a trainer killed) in "
          f"{summary['seconds']:.0f} s; survivors ended at most {summary['survivor_exit_after_kill_s']['max']} s "
          f"after a kill; wrote {args.out}.json and .png")
    print("soak: " + ("OK" if summary["ok"] else f"FAILED ({len(soak.failures)} failures)"))
    shutil.rmtree(soak.dir, ignore_errors=True)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
