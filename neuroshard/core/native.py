"""The one loader of the project's small C kernels (DCT's codecs on CPU): compile a source with the machine's C
compiler the first time a process needs it, load it, and say None where that cannot be done here.

A kernel's source lives beside the Python code that calls it; `load(name, source, signatures)` compiles it once
per process (`$CC`, else `cc`; a command line such as "ccache gcc" is split, never run by a shell) into a private
temporary folder that is removed as soon as the library is mapped: nothing compiled is kept on disk or read back
from it later. Where there is no compiler, the machine is not x86-64, or a symbol is missing (a C++ compiler
mangles names), the reason is logged at debug level and `load` returns None: callers then take their PyTorch
path, which gives the same results.
"""
from __future__ import annotations

import ctypes
import logging
import os
import platform
import shlex
import subprocess
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace

log = logging.getLogger(__name__)

_lock = threading.Lock()
_loaded: dict = {}  # name -> its functions (a namespace), or None once loading failed in this process


def _x86_64() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def _compiler(cc: str | None) -> str:
    """The compiler command line to use: `cc`, else $CC, else "cc"."""
    return cc or os.environ.get("CC") or "cc"


def compile_c(name: str, source: str, signatures: dict, cc: str | None = None) -> SimpleNamespace | None:
    """Compile `source` and return its functions named in `signatures` ({symbol: (restype, [argtypes])}) as a
    namespace; None (the reason logged) where that cannot be done here."""
    if not _x86_64():
        log.debug("%s: not x86-64 (%s); the PyTorch path is used", name, platform.machine())
        return None
    cc = _compiler(cc)
    try:
        with tempfile.TemporaryDirectory(prefix="neuroshard-native-") as tmp:
            src, lib = Path(tmp) / f"{name}.c", Path(tmp) / f"{name}.so"
            src.write_text(source)
            subprocess.run([*shlex.split(cc), "-O2", "-shared", "-fPIC", "-ffp-contract=off", "-o", str(lib), str(src)],
                           check=True, capture_output=True, timeout=120)
            so = ctypes.CDLL(str(lib))  # mapped now: the folder can go
            functions = {}
            for symbol, (restype, argtypes) in signatures.items():
                fn = getattr(so, symbol)
                fn.restype, fn.argtypes = restype, argtypes
                functions[symbol] = fn
    except (OSError, ValueError, AttributeError, subprocess.SubprocessError) as e:  # a CC shlex cannot split; no symbol
        log.debug("%s: could not compile with %s (%s); the PyTorch path is used", name, cc, e)
        return None
    return SimpleNamespace(**functions)


def load(name: str, source: str, signatures: dict) -> SimpleNamespace | None:
    """`compile_c`, once per process and name (later calls return the same functions, or None)."""
    with _lock:
        if name not in _loaded:
            _loaded[name] = compile_c(name, source, signatures)
        return _loaded[name]

