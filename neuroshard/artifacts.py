"""Artifacts on disk: atomic writes, a restricted unpickler, and provenance records.

Every file the pipeline writes goes through `atomic_write_*` (temporary file in the same folder,
then `os.replace`), so an interrupted step never leaves a half-written artifact. Pickles are read
with `SafeUnpickler`, which accepts plain data, numpy arrays and tensors and refuses every other
class, so loading a file from disk cannot run arbitrary code.
"""
from __future__ import annotations

import io
import os
import pickle
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from .errors import UserError

FORMAT_VERSION = 1

# (module, name) pairs a pickle may reference: builtins containers, numpy arrays and dtypes,
# torch tensor rebuild helpers. Anything else is refused.
_ALLOWED_GLOBALS = {
    ("builtins", "dict"), ("builtins", "list"), ("builtins", "tuple"), ("builtins", "set"),
    ("builtins", "frozenset"), ("builtins", "int"), ("builtins", "float"), ("builtins", "str"),
    ("builtins", "bytes"), ("builtins", "bool"), ("builtins", "complex"), ("builtins", "slice"),
    ("builtins", "bytearray"), ("collections", "OrderedDict"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_tensor"),
    ("torch", "FloatStorage"), ("torch", "LongStorage"), ("torch", "IntStorage"),
    ("torch.storage", "_load_from_bytes"),
}
_ALLOWED_NUMPY_DTYPE_MODULES = ("numpy.dtypes",)


class SafeUnpickler(pickle.Unpickler):
    """Unpickler that only rebuilds plain data, numpy arrays and tensors."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS or module in _ALLOWED_NUMPY_DTYPE_MODULES:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def load_pickle(path: str | os.PathLike, what: str = "artifact") -> Any:
    """Load a pickle with `SafeUnpickler`; every failure becomes one clear `UserError`."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} not found: {path} (run the step that writes it, or pass the right path)")
    try:
        with open(path, "rb") as f:
            return SafeUnpickler(f).load()
    except pickle.UnpicklingError as e:
        raise UserError(f"{path} is not a safe neuroshard {what}: {e}; regenerate it with neuroshard") from None
    except Exception as e:  # truncated file, wrong format, ...
        raise UserError(f"{path} is not a readable {what} ({type(e).__name__}: {e}); regenerate it") from None


def _atomic(path: str | os.PathLike, write: Callable[[io.BufferedWriter], None]) -> Path:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise UserError(f"cannot write to {path.parent}: {e.strerror}; choose a writable output folder") from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def atomic_write_pickle(path: str | os.PathLike, obj: Any) -> Path:
    return _atomic(path, lambda f: pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    return _atomic(path, lambda f: f.write(data))


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def atomic_torch_save(path: str | os.PathLike, obj: Any) -> Path:
    import torch

    return _atomic(path, lambda f: torch.save(obj, f))


def versions() -> dict[str, str]:
    """Versions of the software that shaped an artifact."""
    out = {"python": platform.python_version()}
    for mod in ("numpy", "torch", "fbgemm_gpu", "torchrec"):
        m = sys.modules.get(mod)
        if m is not None:
            out[mod] = str(getattr(m, "__version__", "unknown"))
    try:
        from . import __version__

        out["neuroshard"] = __version__
    except ImportError:
        pass
    return out


def provenance(**made_with: Any) -> dict[str, Any]:
    """Record of how an artifact was made: the given arguments plus versions, host and time."""
    return {
        "format_version": FORMAT_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "argv": list(sys.argv),
        "versions": versions(),
        **made_with,
    }
