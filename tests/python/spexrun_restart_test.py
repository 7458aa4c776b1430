"""Tests of `spexrun --max-restarts N` and `--min-hosts M` on emulated hosts (network namespaces,
this machine), as a user runs the console script: a trainer that fails on the first attempt only,
a daemon killed mid-run, a lost host left out with --min-hosts, and the limit reached (non-zero
exit naming the last failure, nothing left behind). The trainer is a small script without torch,
so that each case takes a few seconds: what is checked is the launcher's part (restart, its cause,
the restart count in the trainers' environment, the new world's size), not training.
"""

import glob
import os
import re
import sys
import tempfile
import time
import unittest

from spexrun_test import SCRIPT, Launch, netns, processes, segments
from spex_test_util import REPO, SPEXD

from spex import run as spexrun
from spex.emulated import EmulatedCluster

QUIET = ["--spexd-arg=--log_level=error", "--spexd-arg=--threads=1"]

# Prints its variables; rank FAIL_RANK exits 3 while the restart count is below FAIL_TIMES; every
# trainer sleeps (until stopped) while the restart count is below WAIT_UNTIL, then prints "done".
TRAINER = r'''
import os, sys, time
keys = ("RANK", "WORLD_SIZE", "GROUP_RANK", "SPEX_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT")
print("env", " ".join(f"{k}={os.environ.get(k, '-')}" for k in keys), flush=True)
restart = int(os.environ["SPEX_RESTART_COUNT"])
if os.environ["RANK"] == os.environ.get("FAIL_RANK") and restart < int(os.environ.get("FAIL_TIMES", "1")):
    print("failing now", flush=True)
    sys.exit(3)
if restart < int(os.environ.get("WAIT_UNTIL", "0")):
    print("waiting", flush=True)
    time.sleep(300)
print("done", flush=True)
'''


# Appended to the docs' script: the SHA-1 of the final parameters.
DIGEST = r'''
import hashlib
h = hashlib.sha1()
for p in model.parameters():
    h.update(p.detach().numpy().tobytes())
print("digest", h.hexdigest(), flush=True)
'''

# A sitecustomize for the trainers: on the first start, rank 0 exits when it is about to move
# its second checkpoint into place.
FAIL_BEFORE_SECOND_SAVE = r'''
import os
if os.environ.get("SPEX_RESTART_COUNT") == "0" and os.environ.get("RANK") == "0":
    _replace, _calls = os.replace, [0]

    def _failing_replace(src, dst):
        _calls[0] += 1
        if _calls[0] == 2:
            print("failing before the second checkpoint", flush=True)
            os._exit(1)
        return _replace(src, dst)

    os.replace = _failing_replace
'''


def environ_of(pid: int) -> dict:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return dict(kv.split("=", 1) for kv in f.read().decode(errors="replace").split("\0") if "=" in kv)
    except OSError:
        return {}


def cmdline_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class SpexrunRestartTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="spexrun-restart-", dir="/tmp")
        cls.trainer = os.path.join(cls.tmp, "restart_trainer.py")
        with open(cls.trainer, "w") as f:
            f.write(TRAINER)
        cls.emulation = EmulatedCluster.unavailable(SCRIPT)

    @classmethod
    def tearDownClass(cls):
        import shutil
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        if self.emulation:
            self.fail(f"this test needs emulated hosts: {self.emulation}")
        self.before = (netns(), segments())

    def start(self, args, env):
        launch = Launch(["--emulated", *args, *QUIET, "--", sys.executable, self.trainer], env=env)
        self.addCleanup(lambda: launch.proc.poll() is None and (launch.proc.terminate(), launch.wait(timeout=60)))
        return launch

    def cluster_dirs(self, launch):
        """The emulated clusters' state directories this launch brought up (one per start)."""
        return re.findall(r"emulated cluster \w+ up in (\S+):", launch.streams()[1])

    def wait_for(self, launch, what, timeout=60):
        deadline = time.monotonic() + timeout
        while not what(launch):
            self.assertIsNone(launch.proc.poll(), launch.text())
            self.assertLess(time.monotonic(), deadline, launch.text())
            time.sleep(0.1)

    def env_lines(self, out, restart):
        """{rank: variables} of the trainers started at restart `restart`."""
        got = {}
        for m in re.finditer(r"^\[(\d+),\d+\]<stdout>:env (.*)$", out, re.M):
            env = dict(kv.split("=", 1) for kv in m.group(2).split())
            if env["SPEX_RESTART_COUNT"] == str(restart):
                got[int(m.group(1))] = env
        return got

    def check_nothing_left(self, launch):
        before_ns, before_seg = self.before
        self.assertEqual(processes(self.trainer), [], "trainers left running")
        # This launch's clusters' namespaces (sx<cluster id>...): other emulated jobs beside the
        # test may bring theirs up meanwhile.
        ids = re.findall(r"emulated cluster (\w+) up in", launch.streams()[1])
        self.assertTrue(ids, launch.text())
        self.assertEqual({n for n in netns() - before_ns if any(n.startswith(f"sx{i}") for i in ids)}, set(),
                         "namespaces left")
        # Segments of a daemon that is gone, or of a spexd of this build still running: other
        # jobs' daemons beside the test (another binary) may come and go meanwhile.
        left = {s for s in segments() - before_seg
                if not os.path.exists(f"/proc/{s.split('-')[1]}") or cmdline_of(int(s.split('-')[1])).startswith(SPEXD)}
        self.assertEqual(left, set(), "segments left")
        dirs = self.cluster_dirs(launch)
        self.assertTrue(dirs, launch.text())
        for d in dirs:
            self.assertFalse(os.path.exists(d), f"{d} (sockets, logs) left")
            self.assertEqual(processes(d), [], f"processes of {d} left")

    def test_trainer_failing_on_the_first_attempt_only(self):
        launch = self.start(["2", "--slots", "1", "--max-restarts", "2"], {"FAIL_RANK": "1"})
        rc = launch.wait(timeout=120)
        out, err = launch.streams()
        self.assertEqual(rc, 0, launch.text())
        self.assertIn("restart 1 of 2 after: rank 1 (host2, local rank 0) exited with status 3", err)
        self.assertNotIn("restart 2", err)
        again = self.env_lines(out, 1)
        self.assertEqual(sorted(again), [0, 1], launch.text())
        for env in again.values():
            self.assertEqual((env["TORCHELASTIC_RESTART_COUNT"], env["WORLD_SIZE"]), ("1", "2"), env)
        self.assertEqual(len(re.findall(r"<stdout>:done$", out, re.M)), 3, launch.text())  # rank 0, then both
        self.assertEqual(len(self.cluster_dirs(launch)), 2, launch.text())
        self.check_nothing_left(launch)

    def kill_daemon(self, launch, node):
        """SIGKILLs node `node`'s spexd of this launch's current world (its MPI rank)."""
        d = self.cluster_dirs(launch)[-1]
        pids = [p for p in processes(d) if cmdline_of(p).startswith(SPEXD + " ")
                and environ_of(p).get("OMPI_COMM_WORLD_RANK") == str(node)]
        self.assertEqual(len(pids), 1, f"spexd of node {node} in {d}: {pids}")
        os.kill(pids[0], 9)

    def test_killed_daemon_restarts_the_same_world(self):
        launch = self.start(["2", "--slots", "1", "--max-restarts", "1"], {"WAIT_UNTIL": "1"})
        self.wait_for(launch, lambda l: l.streams()[0].count("<stdout>:waiting") == 2)
        self.kill_daemon(launch, 1)
        rc = launch.wait(timeout=120)
        out, err = launch.streams()
        self.assertEqual(rc, 0, launch.text())
        self.assertRegex(err, r"restart 1 of 1 after: the daemon on host2 died \(mpirun exited with status \d+\); "
                              r"2 host\(s\), 2 trainers")
        again = self.env_lines(out, 1)
        self.assertEqual(sorted(again), [0, 1], launch.text())
        self.assertTrue(all(e["WORLD_SIZE"] == "2" for e in again.values()), again)
        self.check_nothing_left(launch)

    def test_lost_host_is_left_out_with_min_hosts(self):
        """host2's agent SIGKILLed (as when the host or its connection goes): the restart runs on
        the one host left, with a world of 1; the lost host's orphaned trainer goes with the
        emulated host."""
        launch = self.start(["2", "--slots", "1", "--max-restarts", "1", "--min-hosts", "1"], {"WAIT_UNTIL": "1"})
        self.wait_for(launch, lambda l: l.streams()[0].count("<stdout>:waiting") == 2)
        d = self.cluster_dirs(launch)[-1]
        agents = [p for p in processes(f"{d}/sock/node1.sock") if "--agent" in cmdline_of(p)]
        self.assertEqual(len(agents), 1, agents)
        os.kill(agents[0], 9)
        rc = launch.wait(timeout=120)
        out, err = launch.streams()
        self.assertEqual(rc, 0, launch.text())
        self.assertIn("restart 1 of 1 after: the agent on host2 exited with status", err)
        self.assertIn("leaving host2 out; 1 host(s), 1 trainers", err)
        again = self.env_lines(out, 1)
        self.assertEqual(list(again), [0], launch.text())
        self.assertEqual(again[0]["WORLD_SIZE"], "1")
        self.check_nothing_left(launch)

    def test_limit_reached_exits_naming_the_last_failure(self):
        launch = self.start(["1", "--slots", "1", "--max-restarts", "1"], {"FAIL_RANK": "0", "FAIL_TIMES": "99"})
        rc = launch.wait(timeout=120)
        out, err = launch.streams()
        self.assertEqual(rc, 3, launch.text())
        self.assertEqual(err.count("restart 1 of 1 after: rank 0 (host1, local rank 0) exited with status 3"), 1, err)
        self.assertIn("restart limit reached (--max-restarts 1); the last failure: rank 0 (host1, local rank 0) "
                      "exited with status 3", err)
        self.assertEqual(out.count("failing now"), 2, launch.text())
        self.assertEqual(len(self.cluster_dirs(launch)), 2, launch.text())
        self.check_nothing_left(launch)
        self.assertEqual(glob.glob(f"/tmp/spex-{os.getuid()}/spexrun-{launch.proc.pid}-*"), [], "socket dir left")

    def test_the_docs_recipe_resumes_after_a_failure(self):
        """docs/checkpoint.md's script as it stands, on 2 emulated hosts: rank 0 exits just
        before its second checkpoint is renamed into place (a sitecustomize wraps os.replace);
        the restart resumes both ranks from step 20 and ends with equal parameters."""
        with open(os.path.join(REPO, "docs", "checkpoint.md")) as f:
            doc = f.read()
        m = re.search(r"^## Jobs that survive failures\n(.*?)(?=^## )", doc, re.S | re.M)
        self.assertIsNotNone(m, "docs/checkpoint.md has no '## Jobs that survive failures' section")
        code = re.search(r"```python\n(.*?)```", m.group(1), re.S)
        self.assertIsNotNone(code, "no ```python block in the section")
        work = tempfile.mkdtemp(prefix="recipe-", dir=self.tmp)
        script = os.path.join(work, "train_resilient.py")
        with open(script, "w") as f:
            f.write(code.group(1) + DIGEST)
        inject = os.path.join(work, "inject")
        os.makedirs(inject)
        with open(os.path.join(inject, "sitecustomize.py"), "w") as f:
            f.write(FAIL_BEFORE_SECOND_SAVE)
        launch = Launch(["--emulated", "2", "--slots", "1", "--max-restarts", "1", *QUIET, "--", sys.executable,
                         script], env={"PYTHONPATH": inject}, cwd=work)
        self.addCleanup(lambda: launch.proc.poll() is None and (launch.proc.terminate(), launch.wait(timeout=60)))
        rc = launch.wait(timeout=180)
        out, err = launch.streams()
        self.assertEqual(rc, 0, launch.text())
        self.assertIn("[0,0]<stdout>:failing before the second checkpoint", out)
        self.assertIn("restart 1 of 1 after: rank 0 (host1, local rank 0) exited with status 1", err)
        for rank in (0, 1):
            self.assertIn(f"[{rank},0]<stdout>:rank {rank}: start 1 from step 20", out, launch.text())
            self.assertIn(f"[{rank},0]<stdout>:rank {rank}: done", out)
        digests = re.findall(r"^\[\d,0\]<stdout>:digest (\w+)$", out, re.M)
        self.assertEqual(len(digests), 2, launch.text())
        self.assertEqual(len(set(digests)), 1, f"parameters differ between ranks: {digests}")
        self.check_nothing_left(launch)

    def test_bad_restart_options_are_refused(self):
        for args, words in ((["--max-restarts", "-1"], "--max-restarts -1: give 0 (no restart) or more"),
                            (["--min-hosts", "1"], "give --max-restarts N too"),
                            (["--max-restarts", "1", "--min-hosts", "3"], "--min-hosts 3: the job has only 2 host(s)"),
                            (["--max-restarts", "1", "--min-hosts", "0"], "--min-hosts 0: give at least 1")):
            launch = Launch(["-H", "a:1,b:1", *args, "--", "true"])
            self.assertEqual(launch.wait(timeout=60), 2, launch.text())
            self.assertIn(words, launch.streams()[1])
        # A spexd that is not there is no failure a restart can mend: said once, no restart.
        launch = Launch(["-H", "localhost:1", "--max-restarts", "2", "--", "true"], env={"SPEXD": "/nonexistent"})
        self.assertEqual(launch.wait(timeout=60), 1, launch.text())
        self.assertIn("spexd not found at /nonexistent", launch.streams()[1])
        self.assertNotIn("restart 1", launch.streams()[1])
        # The library's configuration refuses the same before anything starts.
        with self.assertRaisesRegex(spexrun.LaunchError, "give --max-restarts N too"):
            spexrun.launch(spexrun.LaunchConfig(["true"], min_hosts=1), spexrun.parse_hosts("a:1"))


if __name__ == "__main__":
    unittest.main()
