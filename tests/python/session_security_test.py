"""Who serves and who asks, from the trainer's side (docs/security.md): the daemon binds each
session to the process that opened it (the kernel's SO_PEERCRED, not the request), so another
process holding the id gets PERMISSION_DENIED for every session request while the owner carries
on exactly; Hello's pid is the kernel's; the client refuses a socket served by another user or
kept in a directory others can write (also one reached through another user's symlink and
".."); an Exchange's wait is bounded by --max_exchange_wait.
Runs as root (a child process takes another uid to serve an impostor socket)."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

import grpc
import numpy as np

import spex
from spex.proto import spex_pb2 as pb
from spex.proto import spex_pb2_grpc as pb_grpc
from spex_test_util import ClusterTestCase

STRANGER = 54321

# Run in another process: every request with a session id given on the command line.
THIEF = textwrap.dedent('''
    import sys, grpc
    from spex.proto import spex_pb2 as pb, spex_pb2_grpc as pb_grpc
    sock, sid = sys.argv[1], int(sys.argv[2])
    stub = pb_grpc.SpexStub(grpc.insecure_channel("unix:" + sock))
    calls = {
        "RegisterBucket": lambda: stub.RegisterBucket(pb.RegisterBucketRequest(session_id=sid, bucket_id=9, elements=8), timeout=10),
        "Exchange": lambda: stub.Exchange(pb.ExchangeRequest(session_id=sid, bucket_id=0, step=0), timeout=10),
        "UnregisterBucket": lambda: stub.UnregisterBucket(pb.UnregisterBucketRequest(session_id=sid, bucket_id=0), timeout=10),
        "Goodbye": lambda: stub.Goodbye(pb.GoodbyeRequest(session_id=sid), timeout=10),
    }
    for name, call in calls.items():
        try:
            call()
            print(name, "OK")
        except grpc.RpcError as e:
            print(name, e.code().name)
''')


class SessionBindingTest(ClusterTestCase):
    def test_a_stolen_session_id_is_useless_to_another_process(self):
        c = self.start_cluster(1, 1)
        with spex.Client(c.socket(0), local_rank=0, local_size=1) as client:
            b = client.register_bucket(0, 1000, compressor="dense")
            out = subprocess.run([sys.executable, "-c", THIEF, c.socket(0), str(client.session_id)],
                                 capture_output=True, text=True, timeout=60)
            self.assertEqual(out.returncode, 0, out.stderr)
            lines = dict(line.split() for line in out.stdout.split("\n") if line)
            self.assertEqual(lines, {k: "PERMISSION_DENIED" for k in
                                     ("RegisterBucket", "Exchange", "UnregisterBucket", "Goodbye")})
            # A guessed id is just unknown.
            out = subprocess.run([sys.executable, "-c", THIEF, c.socket(0), "12345"], capture_output=True,
                                 text=True, timeout=60)
            self.assertIn("Goodbye NOT_FOUND", out.stdout)
            # The owner's session is untouched.
            for step in range(3):
                data = np.arange(1000, dtype=np.float32) + step
                np.testing.assert_array_equal(client.exchange(b, data, mode="rpc"), data)

    def test_hello_pid_is_the_kernels_and_ids_go_to_their_user(self):
        c = self.start_cluster(1, 1)
        stub = pb_grpc.SpexStub(grpc.insecure_channel("unix:" + c.socket(0)))
        hello = stub.Hello(pb.HelloRequest(local_rank=0, local_size=1, pid=1, client="forged",
                                           protocol_version=1), timeout=10)
        listed = stub.ListSessions(pb.ListSessionsRequest(), timeout=10).sessions
        self.assertEqual([(s.session_id, s.pid) for s in listed], [(hello.session_id, os.getpid())])
        stub.Goodbye(pb.GoodbyeRequest(session_id=hello.session_id), timeout=10)

    def test_exchange_wait_is_bounded_by_the_daemon(self):
        # Two local trainers expected, one comes: its Exchange waits --max_exchange_wait, not the
        # client's 300 s.
        c = self.start_cluster(1, 2, "--max_exchange_wait=1s", "--register_timeout=60s")
        with spex.Client(c.socket(0), local_rank=0, local_size=2, exchange_timeout=300) as client:
            b = client.register_bucket(0, 100, compressor="dense")
            t0 = time.monotonic()
            with self.assertRaises(spex.ExchangeTimeoutError):
                client.exchange(b, np.ones(100, np.float32), mode="rpc")
            self.assertLess(time.monotonic() - t0, 10)


class ServerCheckTest(unittest.TestCase):
    """The client's checks before any gradient leaves the process."""

    def serve_as(self, uid: int, directory: str) -> str:
        """A socket at `directory`/x.sock listened on by a child process running as `uid`."""
        path = os.path.join(directory, "x.sock")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.setuid(uid)
                s = socket.socket(socket.AF_UNIX)
                s.bind(path)
                s.listen(4)
                os.write(w, b"1")
                time.sleep(30)
            finally:
                os._exit(0)
        self.addCleanup(lambda: (os.kill(pid, 9), os.waitpid(pid, 0)))
        os.read(r, 1)
        return path

    def test_socket_served_by_another_user_is_refused(self):
        if os.geteuid() != 0:
            self.fail("this test runs as root (it serves a socket as another uid)")
        d = tempfile.mkdtemp(prefix="spex-impostor-")
        os.chmod(d, 0o1777)  # a directory the impostor could write (as /tmp)
        path = self.serve_as(STRANGER, d)
        with self.assertRaises(spex.SpexSecurityError) as e:
            spex.Client(path, connect_timeout=5)
        self.assertIn(f"runs as uid {STRANGER}", str(e.exception))
        self.assertIn("SPEX_TRUST_SERVER_UIDS", str(e.exception))

    def test_socket_in_a_directory_others_can_write_is_refused(self):
        d = tempfile.mkdtemp(prefix="spex-open-")
        os.chmod(d, 0o777)
        path = self.serve_as(os.getuid(), d)
        with self.assertRaises(spex.SpexSecurityError) as e:
            spex.Client(path, connect_timeout=5)
        self.assertIn("may be written by other users", str(e.exception))

    def test_socket_directory_is_checked_through_symlinks(self):
        """D/link/../x.sock with `link` another user's symlink: the kernel goes through the link
        (the socket is in the link's target's parent, which that user controls); the check must
        look at that path as the C++ client does, not at D/x.sock (".." taken as text)."""
        if os.geteuid() != 0:
            self.fail("this test runs as root (it gives a directory and a symlink to another uid)")
        base = tempfile.mkdtemp(prefix="spex-dotdot-")
        self.addCleanup(shutil.rmtree, base, True)
        os.chmod(base, 0o755)
        theirs = os.path.join(base, "theirs")  # the other user's directory, and the socket's
        os.makedirs(os.path.join(theirs, "sub"))
        for d in (theirs, os.path.join(theirs, "sub")):
            os.chown(d, STRANGER, STRANGER)
        mine = os.path.join(base, "mine")
        os.mkdir(mine, 0o700)
        link = os.path.join(mine, "link")
        os.symlink(os.path.join(theirs, "sub"), link)
        os.lchown(link, STRANGER, STRANGER)
        self.serve_as(os.getuid(), theirs)  # our own daemon, in a directory another user owns
        with self.assertRaises(spex.SpexSecurityError) as e:
            spex.Client(os.path.join(link, "..", "x.sock"), connect_timeout=5)
        self.assertIn(f"symlink owned by uid {STRANGER}", str(e.exception))
        # Relative, from the private directory: the same.
        cwd = os.getcwd()
        os.chdir(mine)
        try:
            with self.assertRaises(spex.SpexSecurityError) as e:
                spex.Client("link/../x.sock", connect_timeout=5)
            self.assertIn(f"symlink owned by uid {STRANGER}", str(e.exception))
        finally:
            os.chdir(cwd)

    def test_default_path_prefers_a_private_runtime_directory(self):
        d = tempfile.mkdtemp(prefix="spex-xdg-")
        old = os.environ.get("XDG_RUNTIME_DIR")
        os.environ["XDG_RUNTIME_DIR"] = d
        try:
            self.assertTrue(spex.default_socket_path("j").startswith(d + "/spex/j/"))
            os.chmod(d, 0o777)
            self.assertTrue(spex.default_socket_path("j").startswith(f"/tmp/spex-{os.getuid()}/j/"))
        finally:
            if old is None:
                del os.environ["XDG_RUNTIME_DIR"]
            else:
                os.environ["XDG_RUNTIME_DIR"] = old


if __name__ == "__main__":
    unittest.main()
