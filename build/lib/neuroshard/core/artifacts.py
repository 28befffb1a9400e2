"""Artifacts on disk: atomic writes, pickles that cannot run code, append-only logs, provenance.

- Every file is written through `atomic_write_*` (temporary file in the same folder, then
  `os.replace`), so an interrupted step never leaves a half-written artifact.
- Pickles hold plain data only. Before pickling, numpy arrays and tensors are turned into tagged
  dicts of (dtype, shape, bytes) (`encode`), so a neuroshard pickle references no global at all;
  `SafeUnpickler` refuses every global, which is what lets a pickle call code. `decode` rebuilds
  the arrays (numeric dtypes only).
- `RecordLog` is an append-only pickle log (a header record, then one record per finished sample),
  used by the cost-data collectors and eval.py: a record is on disk as soon as it is finished, a
  crash can only cut the last record (dropped on load), and an exclusive lock keeps two writers
  from sharing one file.
- Model weights are `torch.save`d and read with `torch.load(weights_only=True)` (`load_torch`).
"""
from __future__ import annotations

import fcntl
import io
import os
import pickle
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .errors import UserError

FORMAT_VERSION = 2
_NUMERIC_KINDS = "biufc"


# ----------------------------------------------------------------------------- plain-data encoding

def encode(obj: Any) -> Any:
    """Plain-data form of `obj`: arrays and tensors become {"__ndarray__": (dtype, shape, bytes)}."""
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in _NUMERIC_KINDS:
            raise TypeError(f"only numeric arrays can be stored, got dtype {obj.dtype}")
        a = np.ascontiguousarray(obj)
        return {"__ndarray__": (a.dtype.str, tuple(a.shape), a.tobytes())}
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return {"__tensor__": encode(obj.detach().cpu().numpy())["__ndarray__"]}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: encode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [encode(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(encode(v) for v in obj)
    if obj is None or isinstance(obj, (bool, int, float, str, bytes, set, frozenset)):
        return obj
    raise TypeError(f"cannot store {type(obj).__name__} in a neuroshard artifact")


def _array(spec) -> np.ndarray:
    dtype, shape, data = spec
    dt = np.dtype(dtype)
    if dt.kind not in _NUMERIC_KINDS:
        raise pickle.UnpicklingError(f"refusing array of dtype {dtype}")
    return np.frombuffer(data, dtype=dt).reshape(shape).copy()


def decode(obj: Any) -> Any:
    """Inverse of `encode`."""
    if isinstance(obj, dict):
        if len(obj) == 1 and "__ndarray__" in obj:
            return _array(obj["__ndarray__"])
        if len(obj) == 1 and "__tensor__" in obj:
            import torch

            return torch.from_numpy(_array(obj["__tensor__"]))
        return {k: decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(decode(v) for v in obj)
    return obj


class SafeUnpickler(pickle.Unpickler):
    """Rebuilds plain data only: every global (the only way a pickle reaches code) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: neuroshard pickles hold plain data only")


def _dumps(obj: Any) -> bytes:
    return pickle.dumps(encode(obj), protocol=pickle.HIGHEST_PROTOCOL)


def _unpickle_error(path: Path, what: str, e: Exception) -> UserError:
    if isinstance(e, pickle.UnpicklingError) and "refusing" in str(e):
        return UserError(f"{path} is not a safe neuroshard {what}: {e}; regenerate it with neuroshard")
    return UserError(f"{path} is not a readable {what} ({type(e).__name__}: {str(e)[:120]}); regenerate it")


def load_pickle(path: str | os.PathLike, what: str = "artifact") -> Any:
    """Load a neuroshard pickle with `SafeUnpickler`; every failure becomes one clear `UserError`."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} not found: {path} (run the step that writes it, or pass the right path)")
    try:
        with open(path, "rb") as f:
            return decode(SafeUnpickler(f).load())
    except Exception as e:
        raise _unpickle_error(path, what, e) from None


def load_torch(path: str | os.PathLike, what: str) -> Any:
    """`torch.load(weights_only=True)`: tensors and plain containers only, never arbitrary code."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} not found: {path} (run the step that writes it, or pass the right path)")
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:
        first = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
        raise UserError(f"{path} is not a loadable {what} ({type(e).__name__}: {first}); regenerate it") from None


# ----------------------------------------------------------------------------- atomic writes

def _atomic(path: str | os.PathLike, write: Callable[[io.BufferedWriter], None]) -> Path:
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path} is a folder; name a file to write (e.g. {path / 'out'})")
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
        try:
            os.replace(tmp, path)
        except OSError as e:
            raise UserError(f"cannot write {path}: {e.strerror}; choose another output path") from None
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def check_output_file(path, flag: str) -> None:
    """Refuse, before any work, an output path that names a folder."""
    if path is not None and str(path) and Path(path).is_dir():
        raise UserError(f"{flag} {path} is a folder; name a file to write")


def atomic_write_pickle(path: str | os.PathLike, obj: Any) -> Path:
    data = _dumps(obj)  # encode first: an unstorable object fails before the file is touched
    return _atomic(path, lambda f: f.write(data))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    return _atomic(path, lambda f: f.write(data))


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def atomic_torch_save(path: str | os.PathLike, obj: Any) -> Path:
    import torch

    return _atomic(path, lambda f: torch.save(obj, f))


# ----------------------------------------------------------------------------- append-only record logs

class deferred_interrupts:
    """Hold SIGINT/SIGTERM back while a critical write runs (main thread only); delivered on exit."""

    def __enter__(self):
        import signal
        import threading

        self._mask = None
        if threading.current_thread() is threading.main_thread():
            self._mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        return self

    def __exit__(self, *exc):
        import signal

        if self._mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)


class RecordLog:
    """An append-only pickle log: a header `{"kind", "meta"}`, then one record per finished item.

    Opening takes an exclusive lock (a second writer gets a clear error instead of silently losing
    samples). Each `append` is one `os.write` of a whole pickle frame followed by fsync, so a
    record is on disk the moment it is appended, Ctrl-C cannot split it, and a kill can at worst cut
    the last frame, which the next open drops. A file whose header `must_match` keys differ from
    this run's is refused (or, with `restart_on_mismatch`, started anew); a file that holds no
    records is simply started anew (a run that failed before its first record never blocks the
    corrected run).
    """

    def __init__(self, path: str | os.PathLike, kind: str, meta: dict[str, Any], must_match: tuple[str, ...] = (),
                 what: str = "record log", restart_on_mismatch: bool = False):
        self.path, self.kind, self.what = Path(path), kind, what
        self.records: list[dict] = []
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise UserError(f"cannot write {self.path}: {e.strerror}; choose a writable output folder") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._fd)
            raise UserError(f"{self.path} is being written by another process; wait for it to finish or "
                            "choose another output folder") from None
        try:
            header, self.records, good_end = self._read()
            if header is not None and self.records and restart_on_mismatch and (
                    header.get("kind") != kind or any(header["meta"].get(k) != meta.get(k) for k in must_match)):
                print(f"note: {self.path} holds records of a run with other settings; starting it anew",
                      file=sys.stderr)
                header = None
            if header is not None and self.records:
                if header.get("kind") != kind:
                    raise UserError(f"{self.path} is not a {what} ({header.get('kind')}); choose another output path")
                for key in must_match:
                    if header["meta"].get(key) != meta.get(key):
                        raise UserError(f"{self.path} holds records made with {key}={header['meta'].get(key)!r}, "
                                        f"this run has {key}={meta.get(key)!r}; use another output path to keep "
                                        "them apart, or delete the file to start over")
                self.meta = header["meta"]
                os.ftruncate(self._fd, good_end)  # drop a frame cut by a crash
            else:  # new, empty or header-only file: start it with this run's header
                self.meta = meta
                self.records = []
                os.ftruncate(self._fd, 0)
                self._write({"kind": kind, "format_version": FORMAT_VERSION, "meta": meta})
        except BaseException:
            self.close()
            raise

    def _read(self):
        os.lseek(self._fd, 0, os.SEEK_SET)
        with os.fdopen(os.dup(self._fd), "rb") as f:
            data = f.read()
        return parse_record_log(data, self.path, self.what)

    def _write(self, obj: Any) -> None:
        frame = _dumps(obj)
        os.lseek(self._fd, 0, os.SEEK_END)
        view = memoryview(frame)
        while view:
            view = view[os.write(self._fd, view):]
        os.fsync(self._fd)

    def append(self, record: dict) -> None:
        with deferred_interrupts():  # a Ctrl-C now is handled right after the record is on disk
            self._write(record)
            self.records.append(record)

    def close(self) -> None:
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def parse_record_log(data: bytes, path: Path, what: str) -> tuple[dict | None, list[dict], int]:
    """(header, records, end of the last whole frame) of a record log's bytes."""
    f = io.BytesIO(data)
    header, records, good_end = None, [], 0
    while f.tell() < len(data):
        try:
            obj = decode(SafeUnpickler(f).load())
        except pickle.UnpicklingError as e:
            if "refusing" in str(e):
                raise _unpickle_error(path, what, e) from None
            break  # a frame cut by a crash: everything before it is good
        except (EOFError, ValueError, IndexError, TypeError, KeyError, AttributeError, OverflowError):
            break
        if not isinstance(obj, dict):
            raise UserError(f"{path} is not a {what}; choose another output path")
        if header is None:
            header = obj
        else:
            records.append(obj)
        good_end = f.tell()
    if header is not None and not ("kind" in header and isinstance(header.get("meta"), dict)):
        raise UserError(f"{path} is not a {what}; choose another output path")
    return header, records, good_end


def read_record_log(path: str | os.PathLike, kind: str, what: str) -> tuple[dict, list[dict]]:
    """(meta, records) of a record log, for readers (no lock needed: records are only appended)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} not found: {path} (run the step that writes it, or pass the right path)")
    header, records, _ = parse_record_log(path.read_bytes(), path, what)
    if header is None or header.get("kind") != kind:
        raise UserError(f"{path} is not a {what}; write it with the matching neuroshard step")
    return header["meta"], records


# ----------------------------------------------------------------------------- provenance

def versions() -> dict[str, str]:
    """Versions of the software that shaped an artifact."""
    out = {"python": platform.python_version()}
    for mod in ("numpy", "torch", "fbgemm_gpu", "torchrec"):
        m = sys.modules.get(mod)
        if m is not None:
            out[mod] = str(getattr(m, "__version__", "unknown"))
    from .. import __version__

    out["neuroshard"] = __version__
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
