"""A bandwidth-limited network on one machine: a private network namespace whose loopback is shaped.

`run_in_namespace()` re-runs the calling script inside a new network namespace (`unshare -n`, root
only); there `setup_loopback()` brings the namespace's own loopback up, and `shape(gbit)` puts a token
bucket on it (`tc qdisc replace dev lo root tbf rate R burst 256kb latency 50ms`; 0 = unshaped).
Ranks that talk over 127.0.0.1 inside the namespace then share one link of R Gbit/s (aggregate, not
per rank). Nothing outside the namespace is touched: the shaping dies with it. `setup_loopback`
refuses to run anywhere but a fresh namespace (only `lo` present), so the host's loopback is never
shaped. tbf works on these machines; netem (delay, loss) does not.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

from ..core.errors import UserError

INSIDE = "NEUROSHARD_NETNS"  # set in the re-run process: we are inside the namespace we made


def _sh(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True)


def inside() -> bool:
    return os.environ.get(INSIDE) == "1"


def run_in_namespace(script: str) -> int:
    """Re-run this process's command line inside a new network namespace; returns its exit code.
    `script` names the caller in the one-line refusal."""
    if os.geteuid() != 0:
        raise UserError(f"{script} needs root (it creates a private network namespace with unshare -n and "
                        "shapes its loopback with tc); run it as root, e.g. with sudo")
    for tool in ("unshare", "ip", "tc"):
        if shutil.which(tool) is None:
            raise UserError(f"{tool} not found; install iproute2 and util-linux")
    env = {**os.environ, INSIDE: "1", "GLOO_SOCKET_IFNAME": "lo"}
    try:
        return subprocess.call(["unshare", "-n", sys.executable, *sys.argv], env=env)
    except KeyboardInterrupt:
        return 130


def setup_loopback() -> None:
    """Bring up the loopback of the namespace we are in; refuse if it is not a fresh one."""
    links = _sh("ip", "-o", "link", "show").stdout.splitlines()
    names = [ln.split(":")[1].strip() for ln in links if ln.strip()]
    if not inside() or names != ["lo"]:  # never shape anything but the loopback of a namespace we created
        raise UserError(f"expected a fresh network namespace made by run_in_namespace with only lo, found {names}")
    r = _sh("ip", "link", "set", "lo", "up")
    if r.returncode:
        raise UserError(f"ip link set lo up failed: {r.stderr.strip()}")


def shape(gbit: float) -> None:
    """Shape the namespace's loopback to `gbit` Gbit/s (0: remove the shaping)."""
    if not inside():
        raise UserError("shape() only runs inside the namespace run_in_namespace made")
    _sh("tc", "qdisc", "del", "dev", "lo", "root")  # none there yet is fine
    if gbit > 0:
        r = _sh("tc", "qdisc", "replace", "dev", "lo", "root", "tbf", "rate", f"{gbit:g}gbit", "burst", "256kb",
                "latency", "50ms")
        if r.returncode:
            raise UserError(f"tc tbf on lo failed: {r.stderr.strip()}")
