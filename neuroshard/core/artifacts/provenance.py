"""Provenance: how an artifact was made (the arguments, versions, host and its CPU, time, the git commit of the
checkout, and a digest of the code)."""
from __future__ import annotations

import functools
import hashlib
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ... import __version__

FORMAT_VERSION = 3  # 3: record-log frames carry a length and a crc32


def versions() -> dict[str, str]:
    """Versions of the software that shaped an artifact."""
    out = {"python": platform.python_version()}
    for mod in ("numpy", "torch", "fbgemm_gpu", "torchrec"):
        m = sys.modules.get(mod)
        if m is not None:
            out[mod] = str(getattr(m, "__version__", "unknown"))
    out["neuroshard"] = __version__
    return out


@functools.lru_cache(maxsize=1)
def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo; else what the platform says): timings depend on it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def content_digest(obj) -> str:
    """SHA-256 (hex) of plain data (lists, dicts, numbers, strings) in one canonical JSON form: what a file says,
    whatever its layout, so a file changed after it was saved no longer matches the digest saved in it."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True).encode()).hexdigest()


def file_digest(path) -> str:
    """SHA-256 (hex) of a file's bytes: which file of several an artifact was made from."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """12 hex digits of SHA-256 over the neuroshard package's Python sources (relative paths and bytes,
    in path order): the same code gives the same digest, installed or in a checkout, git or not."""
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The commit of the checkout the package runs from, with "+dirty" where tracked files differ from it; None
    for an installed package or where git cannot tell (the code digest still names the code)."""
    root = Path(__file__).resolve().parents[3]
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode:
            return None
        changed = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                 capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if changed.returncode or changed.stdout.strip() else "")


def provenance(**made_with: Any) -> dict[str, Any]:
    """Record of how an artifact was made: the given arguments plus versions, host, its CPU, time, the commit
    (`git_commit`) and the code's digest (`source_digest`)."""
    return {
        "format_version": FORMAT_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "cpu": cpu_name(),
        "argv": list(sys.argv),
        "versions": versions(),
        "commit": git_commit(),
        "code": source_digest(),
        **made_with,
    }
