"""The shaped private network (hardware/netns.py): real namespace, real tc, real bytes over loopback."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from neuroshard.core.errors import UserError
from neuroshard.hardware import netns

ROOT = Path(__file__).resolve().parents[2]

PROBE = r'''
import socket, sys, threading, time
from neuroshard.hardware import netns

if not netns.inside():
    sys.exit(netns.run_in_namespace("probe"))
netns.setup_loopback()
N = 2_000_000

def send_time():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    got = []

    def serve():
        c, _ = srv.accept()
        n = 0
        while n < N:
            b = c.recv(1 << 16)
            if not b:
                break
            n += len(b)
        got.append(n)
        c.close()

    t = threading.Thread(target=serve)
    t.start()
    s = socket.create_connection(srv.getsockname())
    t0 = time.perf_counter()
    s.sendall(b"x" * N)
    t.join()
    dt = time.perf_counter() - t0
    s.close()
    srv.close()
    assert got == [N]
    return dt

import subprocess

def qdisc():
    return subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True).stdout

free = send_time()
netns.shape(0.05)      # 50 Mbit/s: 2 MB take >= 0.32 s
shaped = qdisc()
slow = send_time()
netns.shape(0)
lifted = qdisc()
again = send_time()
print(f"{free} {slow} {again}")
print(int("tbf" in shaped and "50Mbit" in shaped), int("tbf" in lifted))
'''


def _can_unshare() -> bool:
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("unshare", "ip", "tc")):
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs root, unshare, ip and tc")
def test_shaping_slows_the_namespace_loopback_and_leaves_the_host_alone(tmp_path):
    host_before = subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True).stdout
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(netns.INSIDE, None)
    r = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    times, flags = r.stdout.splitlines()
    free, slow, again = map(float, times.split())
    # the token bucket held 2 MB to 50 Mbit/s at most (a floor: no machine sends faster through it) ...
    assert slow >= 0.8 * 2_000_000 * 8 / 50e6
    # ... and shape(0) removed it (which speed the unshaped sends reach is the machine's, not asserted)
    assert flags.split() == ["1", "0"], r.stdout
    assert free > 0 and again > 0
    host_after = subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True).stdout
    assert host_after == host_before and "tbf" not in host_after


def test_refuses_outside_a_namespace_it_made(monkeypatch):
    monkeypatch.delenv(netns.INSIDE, raising=False)
    with pytest.raises(UserError, match="fresh network namespace"):
        netns.setup_loopback()
    with pytest.raises(UserError, match="only runs inside"):
        netns.shape(1.0)


def test_refuses_without_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(UserError, match="needs root"):
        netns.run_in_namespace("benchmarks/x.py")
