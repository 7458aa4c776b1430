"""Plays systemd's side of sd_notify(3) for tests/integration/systemd_notify_test.sh: binds a
SOCK_DGRAM unix socket (SO_PASSCRED, as systemd does, so every message carries its sender's
pid) and appends one line per datagram to LOG, flushed at once:

    <CLOCK_MONOTONIC seconds> <sender pid> <message, newlines as '|'> [probe=<ok|fail>]

With --probe PATH, every message holding READY=1 is followed by an attempt to connect to the
unix stream socket PATH at that moment (ok: a daemon is listening there). Runs until SIGTERM.
Usage: notify_listener.py SOCKET LOG [--probe PATH]"""
import os
import signal
import socket
import struct
import sys
import time


def main():
    path, log = sys.argv[1], sys.argv[2]
    probe = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--probe" else None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if os.path.exists(path):
        os.unlink(path)
    s.bind(path)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with open(log, "a", buffering=1) as out:
        out.write(f"{time.monotonic():.6f} {os.getpid()} LISTENING\n")
        while True:
            data, anc, _, _ = s.recvmsg(4096, socket.CMSG_SPACE(12))
            now = time.monotonic()
            pid = 0
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = struct.unpack("iII", payload[:12])[0]
            text = data.decode(errors="replace").replace("\n", "|")
            extra = ""
            if probe and "READY=1" in text.split("|"):
                c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    c.connect(probe)
                    extra = " probe=ok"
                except OSError:
                    extra = " probe=fail"
                finally:
                    c.close()
            out.write(f"{now:.6f} {pid} {text}{extra}\n")


if __name__ == "__main__":
    main()
