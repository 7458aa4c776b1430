"""What spexrun (client/python/spex/run.py) must not leak or leave behind, on this host alone (fast;
spexrun_test covers emulated hosts and real ssh; the hostile-tenant suite tries the same with real
users):

- a value given with -x, and the forwarded SPEX_*/NCCL_*/OMPI_MCA_*/PATH values, appear on no
  process's command line (which every user of a host can read), neither for an agent on this host
  nor for one on another host, whose ssh command line carries names only: the values reach the
  agent through its stdin and the trainers get them;
- a SIGKILLed spexrun leaves no mpirun, spexd, trainer, socket directory or segment behind;
- a host name starting with '-' is refused (it would reach ssh as an option) and the host comes
  after "--" on the agent's command line;
- the socket directory (/tmp/spex-<uid>/spexrun-*) is created 0700, and spexrun refuses one that
  another user owns or reaches through another user's symlink before creating anything there.
Runs as root (a directory and a symlink are given to another uid)."""

import argparse
import glob
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import unittest

from spex_test_util import SPEXD

from spex import run as spexrun
from spex.cluster import LocalCluster

STRANGER = 54321
SECRET = f"spexsecret{os.getpid()}x{time.time_ns() % 10**9}"

# A trainer that reports whether it got the variables and whether any process's command line
# holds one of the secret values (root reads every /proc/PID/cmdline, as any user can). It gets
# the values reversed (its own command line must not hold them either); argv[3], when given,
# only marks its process.
TRAINER = r'''
import os, sys, time
secrets = [s[::-1] for s in sys.argv[1].split(",")]
names = sys.argv[2].split(",")
print("got", " ".join(f"{n}={os.environ.get(n) == s}" for n, s in zip(names, secrets)), flush=True)
leaks = []
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        continue
    if any(s in cmd for s in secrets):
        leaks.append(f"{pid}: {cmd[:300]}")
print("leaks", len(leaks), leaks, flush=True)
if os.environ.get("HOLD"):
    print("holding", flush=True)
    time.sleep(600)
'''


def rev(csv: str) -> str:
    return ",".join(s[::-1] for s in csv.split(","))


def processes(marker: str) -> list:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read()
                with open(f"/proc/{entry}/stat") as f:
                    zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
            except (OSError, IndexError):
                continue
            if marker.encode() in cmd and not zombie:
                out.append(int(entry))
    return out


class SpexrunSecurityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="spexrun-sec-", dir="/tmp")
        os.chmod(cls.tmp, 0o755)
        cls.trainer = os.path.join(cls.tmp, "trainer.py")
        with open(cls.trainer, "w") as f:
            f.write(TRAINER)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def spexrun(self, args, env=None):
        full = dict(os.environ, SPEXD=SPEXD, **(env or {}))
        return subprocess.Popen([sys.executable, "-m", "spex.run", *args], env=full, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)

    def test_x_values_stay_off_command_lines_on_this_host(self):
        env = {"SPEXSEC_TOKEN": SECRET + "a", "SPEX_SEC_FORWARDED": SECRET + "b"}
        p = self.spexrun(["-H", "localhost:1", "-x", "SPEXSEC_TOKEN", "--spexd-arg=--log_level=error", "--",
                          sys.executable, self.trainer, rev(f"{SECRET}a,{SECRET}b"),
                          "SPEXSEC_TOKEN,SPEX_SEC_FORWARDED"], env=env)
        out, err = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 0, out + err)
        self.assertIn("got SPEXSEC_TOKEN=True SPEX_SEC_FORWARDED=True", out, out + err)
        self.assertIn("leaks 0 []", out, out + err)

    def test_an_agent_on_another_host_gets_values_through_its_stdin(self):
        """The agent of a host that is not this one, started through an rsh agent that logs its
        arguments and runs the command here: the log holds no value, the host follows "--", and
        the trainer gets every value (from the agent's stdin) while no command line holds one."""
        log = os.path.join(self.tmp, "rsh.log")
        rsh = os.path.join(self.tmp, "fake-ssh")
        with open(rsh, "w") as f:
            f.write(f'#!/bin/sh\nprintf "%s\\n" "$@" > {log}\n[ "$1" = -- ] || exit 9\nshift 2\nexec sh -c "$1"\n')
        os.chmod(rsh, 0o755)
        cluster = LocalCluster(SPEXD, nodes=1, trainers=1, args=["--log_level=error"]).start()
        self.addCleanup(cluster.cleanup)
        a = spexrun.build_parser().parse_args(
            ["-H", "otherhost:1", "--rsh-agent", rsh, "-x", "SPEXSEC_TOKEN", "-x", f"SPEXSEC_GIVEN={SECRET}e",
             "--start-timeout", "20", "--", sys.executable, self.trainer,
             rev(f"{SECRET}c,{SECRET}d,{SECRET}e"), "SPEXSEC_TOKEN,SPEX_SEC_FORWARDED,SPEXSEC_GIVEN"])
        a.command = a.command[1:]
        launcher = spexrun.Launcher(spexrun.config_from_args(a), spexrun.parse_hosts(a.hosts))
        launcher.socket = lambda n: cluster.socket(0)
        saved = dict(os.environ)
        os.environ.update(SPEXSEC_TOKEN=SECRET + "c", SPEX_SEC_FORWARDED=SECRET + "d")
        try:
            agent = launcher.start_agent(0, 0, 29999)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        self.addCleanup(lambda: agent.poll() is None and agent.kill())
        lines = []
        deadline = time.monotonic() + 60
        for raw in iter(agent.stdout.readline, b""):
            line = raw.decode().rstrip("\n")
            lines.append(line)
            if line == spexrun.CONTROL + "ready":
                agent.stdin.write(b"go\n")
                agent.stdin.flush()
            if line.startswith(spexrun.CONTROL + "exit"):
                break
            self.assertLess(time.monotonic(), deadline, lines)
        agent.stdin.write(b"stop\n")
        agent.stdin.close()
        agent.wait(timeout=30)
        text = "\n".join(lines)
        self.assertIn(spexrun.CONTROL + "exit 0 0", text)
        self.assertIn("got SPEXSEC_TOKEN=True SPEX_SEC_FORWARDED=True SPEXSEC_GIVEN=True", text)
        self.assertIn("leaks 0 []", text)
        with open(log) as f:
            argv = f.read().splitlines()
        self.assertEqual(argv[:2], ["--", "otherhost"], argv)
        self.assertNotIn(SECRET, "\n".join(argv))

    def test_bad_x_names_are_refused(self):
        p = self.spexrun(["-H", "localhost:1", "-x", "A B=1", "--", "true"])
        _, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 2, err)
        self.assertIn("'A B' is not a variable name", err)

    def test_sigkill_leaves_no_daemon_world(self):
        marker = f"spexsec-hold-{os.getpid()}"
        before = set(glob.glob("/dev/shm/spex-*"))
        p = self.spexrun(["-H", "localhost:1", "--spexd-arg=--log_level=error", "--", sys.executable, self.trainer,
                          "x", "X", marker], env={"HOLD": "1"})
        deadline = time.monotonic() + 90
        job = f"spexrun-{p.pid}-"
        # The trainer's own process (spexrun's and the agent's command lines hold the marker too).
        while not [pid for pid in processes(marker) if b"spex.run" not in open(f"/proc/{pid}/cmdline", "rb").read()]:
            if p.poll() is not None:
                self.fail(f"spexrun ended: {p.communicate()}")
            self.assertLess(time.monotonic(), deadline, "the trainer did not start")
            time.sleep(0.1)
        daemons = processes(job)
        self.assertTrue(daemons, "no mpirun/spexd found")
        dirs = glob.glob(f"/tmp/spex-{os.getuid()}/{job}*")
        self.assertEqual(len(dirs), 1, dirs)
        p.kill()
        p.wait()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30 and (processes(job) or processes(marker) or os.path.exists(dirs[0])):
            time.sleep(0.2)
        left = processes(job) + processes(marker)
        for pid in left:  # not left for the next test
            os.kill(pid, signal.SIGKILL)
        self.assertEqual(left, [], "mpirun, spexd or the trainer outlived a SIGKILLed spexrun")
        self.assertFalse(os.path.exists(dirs[0]), "socket directory left")
        # Only this world's daemons' segments (spex-<pid>-*): other daemons may run beside the test.
        pids = {str(d) for d in daemons}
        mine = {g for g in set(glob.glob("/dev/shm/spex-*")) - before if g.split("-")[1] in pids}
        self.assertEqual(mine, set(), "segments left")
        print(f"the daemon world ended {time.monotonic() - t0:.1f} s after spexrun's SIGKILL")

    def test_host_names_starting_with_a_dash_are_refused(self):
        # -I: ssh loads that file as a PKCS#11 library (runs its code); -x: an ssh option too.
        for spec in ("-Ilibevil.so:1", "-x:2", "a:1,-b:1", "-oProxyCommand=touch /tmp/pwned:1"):
            with self.assertRaisesRegex(spexrun.LaunchError, "starts with '-'"):
                spexrun.parse_hosts(spec)
        hostfile = os.path.join(self.tmp, "hosts")
        with open(hostfile, "w") as f:
            f.write("node1 slots=2\n-Ilibevil.so slots=1\n")
        with self.assertRaisesRegex(spexrun.LaunchError, f"{hostfile}:2: .* starts with '-'"):
            spexrun.read_hostfile(hostfile)
        with self.assertRaisesRegex(spexrun.LaunchError, "starts with '-'"):
            spexrun.slurm_hosts({"SLURM_JOB_NODELIST": "n1,-Ilib.so", "SLURM_TASKS_PER_NODE": "1(x2)"})
        p = self.spexrun(["--hosts=-Ilibevil.so:1", "--", "true"])
        _, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 2, err)
        self.assertIn("ssh and mpirun would read as an option", err)

    def launcher_in(self, base: str) -> "spexrun.Launcher":
        a = spexrun.build_parser().parse_args(["-H", "localhost:1", "--", "true"])
        launcher = spexrun.Launcher(spexrun.config_from_args(a), spexrun.parse_hosts(a.hosts))
        launcher.socket_dir = os.path.join(base, launcher.job)
        self.addCleanup(launcher.stop_daemons)
        return launcher

    def test_socket_directory_is_private_and_a_foreign_one_refused(self):
        root = tempfile.mkdtemp(prefix="spexrun-base-", dir=self.tmp)
        os.chmod(root, 0o1777)  # as /tmp
        # Missing: made 0700, the job's directory too.
        base = os.path.join(root, "spex-me")
        launcher = self.launcher_in(base)
        spexrun.make_private_dirs(launcher.socket_dir)
        for d in (base, launcher.socket_dir):
            self.assertEqual(stat.S_IMODE(os.lstat(d).st_mode), 0o700, d)
        # Another user's symlink where the base goes: refused, nothing made where it leads.
        target = os.path.join(root, "stranger-target")
        os.mkdir(target, 0o777)
        os.chown(target, STRANGER, STRANGER)
        base = os.path.join(root, "spex-link")
        os.symlink(target, base)
        os.lchown(base, STRANGER, STRANGER)
        launcher = self.launcher_in(base)
        with self.assertRaisesRegex(spexrun.LaunchError, f"symlink owned by uid {STRANGER}"):
            launcher.start_daemons()
        self.assertEqual(os.listdir(target), [], "spexrun created its directory through the symlink")
        self.assertIsNone(launcher.daemons, "daemons started in a foreign directory")
        # Another user's directory: refused.
        base = os.path.join(root, "spex-theirs")
        os.mkdir(base, 0o700)
        os.chown(base, STRANGER, STRANGER)
        launcher = self.launcher_in(base)
        with self.assertRaisesRegex(spexrun.LaunchError, f"owned by uid {STRANGER}"):
            launcher.start_daemons()
        self.assertEqual(os.listdir(base), [])
        # Ours but open to others' writes: refused.
        base = os.path.join(root, "spex-open")
        os.mkdir(base)
        os.chmod(base, 0o777)
        launcher = self.launcher_in(base)
        with self.assertRaisesRegex(spexrun.LaunchError, "may be written by other users"):
            launcher.start_daemons()
        self.assertEqual(os.listdir(base), [])


if __name__ == "__main__":
    unittest.main()
