"""Tests of the launcher, `spexrun` (client/python/spex/run.py), as a user runs it: the console
script pip installed, on emulated hosts (network namespaces with 1 Gbit/s links, this machine),
through real ssh into those hosts (sshd started inside each one), and on this host alone.

- a DDP script through the spex hook with no socket, rank or size arguments ends with identical
  parameters on every rank, each trainer saw torchrun's variables, and output lines are tagged;
- a trainer that exits 1 mid-training makes spexrun exit non-zero within 30 s naming its rank,
  and no process, namespace, socket or shared-memory segment is left; SIGTERM to spexrun does
  the same, and so does SIGKILL (its watchdog tears the emulated cluster down); a -x value
  reaches every trainer through real ssh;
- the hook works under torchrun beside a daemon started by hand (the default socket path), and
  without a daemon says how to start one;
- bad input (unknown host, 0 slots, a host twice, no command, bad hostfile lines) is refused
  with a message naming the fix; SLURM's host list and task counts are read;
- the README's quick start runs as it stands in the file.
"""

import glob
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

from spex_test_util import REPO, SPEXD

from spex import run as spexrun
from spex.emulated import EmulatedCluster

BIN = os.path.dirname(sys.executable)
SPEXRUN = os.path.join(BIN, "spexrun")
SCRIPT = os.path.join(REPO, "deploy", "emulated_cluster.sh")
QUIET = ["--spexd-arg=--log_level=error", "--spexd-arg=--threads=1"]

# A DDP job: prints its torchrun variables, trains 30 steps through the hook (no arguments but
# the compressor) and prints the SHA-1 of its parameters. FAIL_RANK exits 1 at step FAIL_STEP;
# LONG makes it run until stopped.
TRAIN = r'''
import hashlib, os, sys, time
import torch, torch.distributed as dist
import spex.torch

env = {k: os.environ.get(k, "-") for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                  "MASTER_ADDR", "MASTER_PORT", "SPEX_SOCKET", "SPEXRUN_X")}
print("env", " ".join(f"{k}={v}" for k, v in sorted(env.items())), flush=True)
dist.init_process_group("gloo", init_method="env://")
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)))
state = spex.torch.register(model, compressor="topk", density=0.05)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(100 + dist.get_rank())
steps = 10**9 if os.environ.get("LONG") else 30
for step in range(steps):
    if step == int(os.environ.get("FAIL_STEP", "-1")) and dist.get_rank() == int(os.environ.get("FAIL_RANK", "-1")):
        print("failing now", flush=True)
        sys.exit(1)
    x, y = torch.randn(16, 64, generator=g), torch.randint(0, 10, (16,), generator=g)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    if step == 2:
        print("training", flush=True)
h = hashlib.sha1()
for p in model.parameters():
    h.update(p.detach().numpy().tobytes())
print("digest", h.hexdigest(), flush=True)
state.close()
'''


# Prints the trainer's cores and its host's spexd's (the spexd serving SPEX_SOCKET).
AFFINITY = r'''
import os
mine = ",".join(map(str, sorted(os.sched_getaffinity(0))))
sock = os.environ["SPEX_SOCKET"].encode()
daemon = "?"
for p in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
    except OSError:
        continue
    if b"--socket=" + sock in argv and argv[0].endswith(b"spexd"):
        daemon = ",".join(map(str, sorted(os.sched_getaffinity(int(p)))))
print(f"trainer {mine} daemon {daemon}", flush=True)
'''


def netns() -> set:
    return set(subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True).stdout.split())


def own_netns(launch: "Launch", before: set) -> set:
    """Namespaces of the emulated clusters `launch` brought up (sx<tag>*, the tag spexrun prints)
    that were not there before: other emulated jobs beside the test may bring theirs up."""
    tags = re.findall(r"emulated cluster (\w+) up in", launch.streams()[1])
    return {n for n in netns() - before if any(n.startswith(f"sx{t}") for t in tags)}


def new_segments(before: set) -> set:
    """Segments made since `before` by a daemon that is gone (it did not remove them) or by a
    spexd of this build still running: other jobs' daemons beside the test (another binary) may
    come and go meanwhile."""
    out = set()
    for s in segments() - before:
        pid = s.split("-")[1]
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                counts = f.read().split(b"\0")[0] == SPEXD.encode()
        except OSError:
            counts = True  # gone: its segments are left behind
        if counts:
            out.add(s)
    return out


def segments() -> set:
    return set(glob.glob("/dev/shm/spex-*"))


def processes(marker: str) -> list:
    """PIDs whose command line holds `marker` (this test's own files only)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        out.append(int(entry))
            except OSError:
                pass
    return out


def daemon_pids() -> list:
    """PIDs of the processes running SPEXD."""
    out = []
    for pid in processes(SPEXD):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().split(b"\0")[0] == SPEXD.encode():
                    out.append(pid)
        except OSError:
            pass
    return out


class Launch:
    """A spexrun process with its output collected (stdout and stderr apart)."""

    def __init__(self, args, env=None, cwd=None, prefix=()):
        self.env = dict(os.environ, SPEXD=SPEXD, SPEX_EMULATED_CLUSTER=SCRIPT, PATH=f"{BIN}:{os.environ['PATH']}")
        self.env.update(env or {})
        self.out = tempfile.TemporaryFile()
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([*prefix, SPEXRUN, *args], stdout=self.out, stderr=self.err, env=self.env,
                                     cwd=cwd, stdin=subprocess.DEVNULL)

    def wait(self, timeout=240):
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"spexrun still running after {timeout} s:\n{self.text()}")
        return self.proc.returncode

    def streams(self):
        if self.out.closed:
            return self.final
        res = []
        for f in (self.out, self.err):
            f.seek(0)
            res.append(f.read().decode(errors="replace"))
        if self.proc.poll() is not None:  # ended: keep the text, close the files
            self.final = res
            self.out.close()
            self.err.close()
        return res

    def text(self):
        out, err = self.streams()
        return f"--- stdout\n{out}\n--- stderr\n{err}"


class SpexrunTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="spexrun-", dir="/tmp")
        cls.train = os.path.join(cls.tmp, "train_job.py")
        with open(cls.train, "w") as f:
            f.write(TRAIN)
        cls.emulation = EmulatedCluster.unavailable(SCRIPT)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def need_emulation(self):
        if self.emulation:
            self.fail(f"this test needs emulated hosts: {self.emulation}")

    def check_job(self, launch, world, local):
        """Exit 0, every rank's torchrun variables, tagged lines, one digest on every rank."""
        rc = launch.wait()
        out, err = launch.streams()
        self.assertEqual(rc, 0, launch.text())
        digests = {}
        for rank in range(world):
            lr = rank % local
            m = re.search(rf"^\[{rank},{lr}\]<stdout>:env (.*)$", out, re.M)
            self.assertIsNotNone(m, f"no env line of rank {rank}:\n{launch.text()}")
            env = dict(kv.split("=", 1) for kv in m.group(1).split())
            self.assertEqual((env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"],
                              env["GROUP_RANK"]), (str(rank), str(lr), str(world), str(local), str(rank // local)))
            self.assertTrue(env["SPEX_SOCKET"].endswith(f"node{rank // local}.sock"), env)
            d = re.search(rf"^\[{rank},{lr}\]<stdout>:digest ([0-9a-f]+)$", out, re.M)
            self.assertIsNotNone(d, f"no digest of rank {rank}:\n{launch.text()}")
            digests[rank] = d.group(1)
        self.assertEqual(len(set(digests.values())), 1, f"parameters differ between ranks: {digests}")
        self.assertIn(f"all {world} trainers exited 0", err)
        return digests

    def test_emulated_hosts_train_in_step(self):
        self.need_emulation()
        before_ns, before_seg = netns(), segments()
        launch = Launch(["--emulated", "2", *QUIET, "--", sys.executable, self.train])
        self.check_job(launch, world=4, local=2)
        self.assertEqual(own_netns(launch, before_ns), set())
        self.assertEqual(new_segments(before_seg), set())

    def test_failing_trainer_stops_the_job(self):
        self.need_emulation()
        before_ns, before_seg = netns(), segments()
        launch = Launch(["--emulated", "2", *QUIET, "--", sys.executable, self.train],
                        env={"FAIL_RANK": "3", "FAIL_STEP": "15", "LONG": "1"})
        failed_at = None
        deadline = time.monotonic() + 180
        while launch.proc.poll() is None and time.monotonic() < deadline:
            if failed_at is None and "failing now" in launch.streams()[0]:
                failed_at = time.monotonic()
            time.sleep(0.1)
        rc = launch.wait(timeout=5)
        ended = time.monotonic()
        out, err = launch.streams()
        self.assertIsNotNone(failed_at, launch.text())
        self.assertNotEqual(rc, 0, launch.text())
        self.assertLess(ended - failed_at, 30, f"spexrun took {ended - failed_at:.1f} s to stop")
        self.assertIn("rank 3 (host2, local rank 1) exited with status 1", err)
        self.assertEqual(processes(self.train), [], "trainers left running")
        self.assertEqual(own_netns(launch, before_ns), set(), "namespaces left")
        self.assertEqual(new_segments(before_seg), set(), "segments left")
        print(f"spexrun stopped {ended - failed_at:.1f} s after rank 3 failed")

    def test_sigterm_stops_everything(self):
        self.need_emulation()
        before_ns, before_seg = netns(), segments()
        launch = Launch(["--emulated", "2", "--slots", "1", *QUIET, "--", sys.executable, self.train],
                        env={"LONG": "1"})
        deadline = time.monotonic() + 120
        while "training" not in launch.streams()[0]:
            self.assertIsNone(launch.proc.poll(), launch.text())
            self.assertLess(time.monotonic(), deadline, launch.text())
            time.sleep(0.1)
        launch.proc.send_signal(signal.SIGTERM)
        rc = launch.wait(timeout=30)
        self.assertEqual(rc, 128 + signal.SIGTERM, launch.text())
        self.assertIn("SIGTERM received; stopping the job", launch.streams()[1])
        self.assertEqual(processes(self.train), [])
        self.assertEqual(own_netns(launch, before_ns), set())
        self.assertEqual(new_segments(before_seg), set())

    def test_sigkill_tears_the_emulated_cluster_down(self):
        """A SIGKILLed spexrun cannot clean up: its watchdog does (namespaces, daemons, trainers)."""
        self.need_emulation()
        before_ns, before_seg, before_daemons = netns(), segments(), set(daemon_pids())
        launch = Launch(["--emulated", "2", "--slots", "1", *QUIET, "--", sys.executable, self.train],
                        env={"LONG": "1"})
        deadline = time.monotonic() + 120
        while "training" not in launch.streams()[0]:
            self.assertIsNone(launch.proc.poll(), launch.text())
            self.assertLess(time.monotonic(), deadline, launch.text())
            time.sleep(0.1)
        self.assertNotEqual(own_netns(launch, before_ns), set())
        # This job's daemons (other tests' daemons and segments may come and go meanwhile).
        daemons = {str(pid) for pid in daemon_pids() if pid not in before_daemons}
        self.assertTrue(daemons, "no spexd found")
        launch.proc.kill()
        launch.wait(timeout=10)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 40 and (processes(self.train) or own_netns(launch, before_ns)):
            time.sleep(0.2)
        self.assertEqual(processes(self.train), [], "trainers outlived a SIGKILLed spexrun")
        self.assertEqual(own_netns(launch, before_ns), set(), "namespaces outlived a SIGKILLed spexrun")
        self.assertEqual({s for s in segments() - before_seg if s.split("-")[1] in daemons}, set())
        print(f"emulated cluster gone {time.monotonic() - t0:.1f} s after spexrun's SIGKILL")

    def test_real_ssh_between_hosts(self):
        """-H with ssh as the agent, for real: sshd inside every emulated host, spexrun on the
        cluster's login host, the daemons' mpirun and the agents both through ssh."""
        self.need_emulation()
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        self.assertTrue(os.path.exists(sshd), "sshd missing: deploy/setup.sh installs openssh-server")
        before_seg = segments()
        keys = tempfile.mkdtemp(prefix="keys-", dir=self.tmp)
        for name in ("host_key", "client_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(keys, name)], check=True)
        config = os.path.join(keys, "sshd_config")
        with open(config, "w") as f:
            f.write(f"HostKey {keys}/host_key\nAuthorizedKeysFile {keys}/client_key.pub\n"
                    "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUsePAM no\nPidFile none\n"
                    "StrictModes no\nAcceptEnv none\n")
        os.makedirs("/run/sshd", exist_ok=True)
        cluster = EmulatedCluster(SPEXD, hosts=2, trainers=2, script=SCRIPT)
        self.addCleanup(cluster.cleanup)
        cluster.up()
        for n in range(2):
            cluster.popen(n, [sshd, "-D", "-f", config], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ssh = (f"ssh -i {keys}/client_key -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
               f"-o BatchMode=yes -o LogLevel=ERROR")
        deadline = time.monotonic() + 30
        while subprocess.run(["bash", SCRIPT, "exec", cluster.dir, "login", *shlex.split(ssh), "host2", "true"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
            self.assertLess(time.monotonic(), deadline, "sshd in the emulated hosts does not answer")
            time.sleep(0.2)
        net = {"OMPI_MCA_btl": "tcp,self", "OMPI_MCA_btl_tcp_if_include": "10.77.0.0/24",
               "OMPI_MCA_oob_tcp_if_include": "10.77.0.0/24", "OMPI_MCA_mpi_yield_when_idle": "1"}
        # -x: the value reaches every trainer through the agents' ssh connections (no command line).
        launch = Launch(["-H", "host1:2,host2:2", "--rsh-agent", ssh, "-x", "SPEXRUN_X", *QUIET, "--", sys.executable,
                         self.train], env={**net, "SPEXRUN_X": "xvalue"}, prefix=["bash", SCRIPT, "exec", cluster.dir,
                                                                                   "login"])
        self.check_job(launch, world=4, local=2)
        self.assertEqual(len(re.findall(r"^\[\d,\d\]<stdout>:env .*SPEXRUN_X=xvalue", launch.streams()[0], re.M)), 4,
                         launch.text())
        self.assertEqual(processes(self.train), [])
        self.assertEqual(glob.glob(f"/tmp/spex-{os.getuid()}/spexrun-{launch.proc.pid}-*"), [], "socket dir left")
        self.assertEqual(new_segments(before_seg), set())

    def test_this_host_alone(self):
        launch = Launch(["-H", "localhost:2", *QUIET, "--", sys.executable, self.train])
        self.check_job(launch, world=2, local=2)

    def test_daemon_cpus_keep_the_daemon_off_the_trainers_cores(self):
        """--daemon-cpus: the daemon runs on the listed core, the trainers on the others; a list
        that leaves no core, names a core the host lacks or cannot be read is refused."""
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            self.skipTest("needs 2 cores")
        script = os.path.join(self.tmp, "affinity.py")
        with open(script, "w") as f:
            f.write(AFFINITY)
        launch = Launch(["-H", "localhost:2", "--daemon-cpus", str(cpus[0]), *QUIET, "--", sys.executable, script])
        rc = launch.wait(timeout=120)
        out = launch.streams()[0]
        self.assertEqual(rc, 0, launch.text())
        rest = ",".join(map(str, cpus[1:]))
        for rank in (0, 1):
            self.assertIn(f"[{rank},{rank}]<stdout>:trainer {rest} daemon {cpus[0]}", out, launch.text())
        all_cpus = ",".join(map(str, cpus))
        self.refused(["-H", "localhost:1", "--daemon-cpus", all_cpus, "--", "true"], "leaves the trainers no core")
        self.refused(["-H", "localhost:1", "--daemon-cpus", "4096", "--", "true"], "core(s) 4096 are not among")
        self.refused(["-H", "localhost:1", "--daemon-cpus", "1-x", "--", "true"], "cannot read '1-x'")
        self.refused(["--emulated", "1", "--daemon-cpus", "0", "--", "true"], "emulated hosts have CPU sets")

    def test_torchrun_beside_a_daemon_started_by_hand(self):
        """No spexrun: spexd on its default socket (job named by SPEX_JOB), torchrun's two
        trainers find it with no arguments."""
        job = f"torchrun-{os.getpid()}"
        env = dict(os.environ, SPEX_JOB=job, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_btl_tcp_if_include="lo", OMPI_MCA_oob_tcp_if_include="lo")
        sock = spexrun_default_socket(job)
        self.addCleanup(lambda: os.path.isdir(os.path.dirname(sock)) and os.rmdir(os.path.dirname(sock)))
        daemon = subprocess.Popen(["mpirun", "-np", "1", SPEXD, "--local_trainers=2", "--log_level=error"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
        self.addCleanup(stop_mpirun, daemon)
        deadline = time.monotonic() + 30
        while not spexrun.daemon_healthy(sock):
            self.assertIsNone(daemon.poll(), "spexd exited")
            self.assertLess(time.monotonic(), deadline, f"no spexd at {sock}")
            time.sleep(0.1)
        env.pop("SPEX_SOCKET", None)  # what spexrun would set is absent: the default path is used
        # torchrun of Debian's torch 1.13 on Python 3.11 fails on its default --redirects 0 (its
        # Std.from_str finds no IntFlag member for 0 or 3 there): 1 (stdout) works.
        r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                            "--redirects", "1", "--tee", "1", "--log_dir", os.path.join(self.tmp, "torchrun-logs"),
                            self.train], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=180)
        self.assertEqual(r.returncode, 0, r.stdout)
        digests = set(re.findall(r"digest ([0-9a-f]+)", r.stdout))
        self.assertEqual(len(re.findall(r"digest ([0-9a-f]+)", r.stdout)), 2, r.stdout)
        self.assertEqual(len(digests), 1, r.stdout)

    def test_missing_daemon_says_how_to_start_one(self):
        code = ("import spex, spex.torch\n"
                "try:\n    spex.Client()\nexcept spex.DaemonUnavailableError as e:\n    print('ERR', e)\n")
        env = dict(os.environ, SPEX_JOB=f"absent-{os.getpid()}")
        env.pop("SPEX_SOCKET", None)
        r = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=60)
        self.assertIn("ERR no spexd socket at", r.stdout)
        self.assertIn("spexrun", r.stdout)
        self.assertIn("--local_trainers", r.stdout)

    def refused(self, args, *words, env=None):
        launch = Launch(args, env=env)
        rc = launch.wait(timeout=120)
        err = launch.streams()[1]
        self.assertNotEqual(rc, 0, launch.text())
        for w in words:
            self.assertIn(w, err, launch.text())
        return err

    def test_bad_input_is_refused_with_the_fix(self):
        self.refused(["-H", "host1:0", "--", "true"], "'host1' has 0 slots", "host:N, N >= 1")
        self.refused(["-H", "host1:x", "--", "true"], "slots of 'host1' must be a whole number")
        self.refused(["-H", "a:2,a:2", "--", "true"], "host 'a' is listed twice")
        self.refused(["-H", "a:2"], "no command to run", "-- python3 train.py")
        self.refused(["-H", "a:2", "--emulated", "2", "--", "true"], "give one of -H, --hostfile and --emulated")
        self.refused(["-H", "localhost:1,other:1", "--", "true"], "a local name (localhost) beside other hosts")
        hostfile = os.path.join(self.tmp, "hosts")
        with open(hostfile, "w") as f:
            f.write("# two hosts\nnode1 slots=2\nnode2 colour=blue\n")
        self.refused(["--hostfile", hostfile, "--", "true"], f"{hostfile}:3: unknown field 'colour=blue'")
        self.refused(["--hostfile", "/nonexistent/hosts", "--", "true"], "--hostfile /nonexistent/hosts")
        # An unknown host: ssh cannot resolve it, and spexrun names the host.
        t0 = time.monotonic()
        err = self.refused(["-H", "nosuchhost.invalid:2", "--start-timeout", "20", "--", "true"], "nosuchhost.invalid")
        self.assertLess(time.monotonic() - t0, 60, err)

    def test_host_lists(self):
        self.assertEqual([(h.name, h.slots) for h in spexrun.parse_hosts("a:4,b,c:2")], [("a", 4), ("b", 1), ("c", 2)])
        self.assertEqual(spexrun.expand_hostlist("node[01-03,7],gpu1,r[1-2]n[1-2]"),
                         ["node01", "node02", "node03", "node7", "gpu1", "r1n1", "r1n2", "r2n1", "r2n2"])
        self.assertEqual(spexrun.expand_tasks_per_node("2(x3),1"), [2, 2, 2, 1])
        hosts = spexrun.slurm_hosts({"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "4(x2),2"})
        self.assertEqual([(h.name, h.slots) for h in hosts], [("n1", 4), ("n2", 4), ("n3", 2)])
        self.assertIsNone(spexrun.slurm_hosts({}))
        with self.assertRaisesRegex(spexrun.LaunchError, "3 hosts .* but 2 task counts"):
            spexrun.slurm_hosts({"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "4(x2)"})
        # Inside an allocation with no -H: its hosts (argument parsing only; nothing started).
        a = spexrun.build_parser().parse_args(["--", "true"])
        got = spexrun.resolve_hosts(a, {"SLURM_JOB_NODELIST": "c[7-8]", "SLURM_TASKS_PER_NODE": "2(x2)"})
        self.assertEqual([(h.name, h.slots) for h in got], [("c7", 2), ("c8", 2)])

    def test_readme_quick_start_runs_as_written(self):
        self.need_emulation()
        with open(os.path.join(REPO, "README.md")) as f:
            readme = f.read()
        m = re.search(r"^## Quick start\n(.*?)(?=^## )", readme, re.S | re.M)
        self.assertIsNotNone(m, "README.md has no '## Quick start' section")
        section = m.group(1)
        code = re.search(r"```python\n(.*?)```", section, re.S)
        launch = re.search(r"```sh\n(.*?)```", section, re.S)
        self.assertIsNotNone(code, "no ```python block in the quick start")
        self.assertIsNotNone(launch, "no ```sh block in the quick start")
        line = launch.group(1).splitlines()[0].split("#", 1)[0]
        argv = shlex.split(line)
        self.assertEqual(argv[0], "spexrun", line)
        work = tempfile.mkdtemp(prefix="quickstart-", dir=self.tmp)
        script = argv[-1]
        with open(os.path.join(work, script), "w") as f:
            f.write(code.group(1))
        before_ns = netns()
        run = Launch(argv[1:], cwd=work)  # `python3` is the venv's: BIN leads PATH
        rc = run.wait()
        out, _ = run.streams()
        self.assertEqual(rc, 0, run.text())
        world = int(argv[argv.index("--emulated") + 1]) * 2 if "--emulated" in argv else 1
        for rank in range(world):
            self.assertRegex(out, rf"\[{rank},\d+\]<stdout>:rank {rank}: done")
        self.assertEqual(own_netns(run, before_ns), set())


def spexrun_default_socket(job: str) -> str:
    from spex.paths import default_socket_path
    return default_socket_path(job)


def stop_mpirun(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


if __name__ == "__main__":
    unittest.main()
