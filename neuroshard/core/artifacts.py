"""Artifacts on disk: atomic writes, pickles that cannot run code, append-only logs, provenance.

- Every file is written through `atomic_write_*` (temporary file in the same folder, then
  `os.replace`), so an interrupted step never leaves a half-written artifact.
- Pickles hold plain data only. Before pickling, numpy arrays and tensors are turned into tagged
  dicts of (dtype, shape, bytes) (`encode`), so a neuroshard pickle references no global at all;
  `SafeUnpickler` refuses every global, which is what lets a pickle call code. `decode` rebuilds
  the arrays (numeric dtypes only).
- `RecordLog` is an append-only log of checksummed pickle frames (a header record, then one record
  per finished sample), used by the cost-data collectors and eval.py: a record is on disk as soon
  as it is finished, a crash can only cut the last record (dropped on load), any other damaged
  frame is refused with one line (or dropped with `salvage`), it never writes through a symlink,
  and an exclusive lock keeps two writers from sharing one file.
- Model weights are `torch.save`d and read with `torch.load(weights_only=True)` (`load_torch`).
"""
from __future__ import annotations

import errno
import fcntl
import functools
import io
import json
import os
import pickle
import platform
import stat
import struct
import sys
import tempfile
import time
import zlib
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .errors import UserError, write_error

FORMAT_VERSION = 3  # 3: record-log frames carry a length and a crc32
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


WRITTEN_BY = {  # the command that writes each kind of artifact again, for "write it again with ..." messages
    "processed dataset": "python tools/gen_dlrm_data.py --synthetic (or --data FILE)",
    "task file": "python tools/gen_tasks.py",
    "cost data file": "collect_compute_cost_data.py or collect_comm_cost_data.py after moving the damaged file away",
    "eval progress log": "eval.py after moving the log away",
    "cost model (compute": "python train_compute_cost_model.py",
    "cost model (comm": "python train_comm_cost_model.py --ndevices N",
    "cost model": "python train_compute_cost_model.py / train_comm_cost_model.py",
}


def written_by(what: str) -> str:
    """The command that writes a `what` artifact again."""
    return next((cmd for k, cmd in WRITTEN_BY.items() if what.startswith(k)), "the neuroshard step that wrote it")


def _unpickle_error(path: Path, what: str, e: Exception) -> UserError:
    if isinstance(e, pickle.UnpicklingError) and "refusing" in str(e):
        return UserError(f"{path} is not a safe neuroshard {what}: {e}; write it again with {written_by(what)}")
    return UserError(f"{path} is not a readable {what} ({type(e).__name__}: {str(e)[:120]}); write it again with "
                     f"{written_by(what)}")


_NOT_REGULAR = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
READ_FIX = "run the step that writes it, or pass the right path"


def check_input_file(path: str | os.PathLike, what: str, fix: str = READ_FIX) -> Path:
    """`path` as a regular file to read, else one `UserError` that says what is there instead: nothing, a folder,
    a FIFO, a device (reading /dev/zero or a FIFO never ends), or a file this user cannot read. `fix` ends it."""
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise UserError(f"{what} not found: {path}; {fix}") from None
    except OSError as e:  # e.g. a path through a file, a loop of links, a folder without search permission
        raise UserError(f"{what} {path} cannot be opened ({e.strerror or type(e).__name__}); {fix}") from None
    if stat.S_ISDIR(st.st_mode):
        raise UserError(f"{what} {path} is a folder, not a file; {fix}")
    kind = next((name for test, name in _NOT_REGULAR if test(st.st_mode)), None)
    if kind is not None or not stat.S_ISREG(st.st_mode):
        raise UserError(f"{what} {path} is {kind or 'not a regular file'}, not a file to read; {fix}")
    if not os.access(path, os.R_OK):
        raise UserError(f"{what} {path} is not readable (permission denied); {fix}")
    return path


def load_pickle(path: str | os.PathLike, what: str = "artifact") -> Any:
    """Load a neuroshard pickle with `SafeUnpickler`; every failure becomes one clear `UserError`."""
    path = check_input_file(path, what)
    try:
        with open(path, "rb") as f:
            return decode(SafeUnpickler(f).load())
    except Exception as e:
        raise _unpickle_error(path, what, e) from None


def load_torch(path: str | os.PathLike, what: str) -> Any:
    """`torch.load(weights_only=True)`: tensors and plain containers only, never arbitrary code. A file in
    torch's zip format is first checked against the CRC-32 of every entry, which `torch.load` does not
    check: a flipped byte in the weights is refused instead of loading as other weights."""
    import torch

    path = check_input_file(path, what)
    bad = None
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as z:
                bad = z.testzip()
        except (zipfile.BadZipFile, OSError, EOFError, RuntimeError, ValueError) as e:
            bad = f"the archive ({type(e).__name__})"
    if bad is not None:
        raise UserError(f"{path} is damaged (a checksum fails in {bad}); write it again with {written_by(what)}")
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:
        first = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
        raise UserError(f"{path} is not a loadable {what} ({type(e).__name__}: {first}); write it again with "
                        f"{written_by(what)}") from None


# ----------------------------------------------------------------------------- atomic writes

class _FdFile:
    """The least file object over a raw descriptor: every byte goes through `os.write` (short writes retried)."""

    def __init__(self, fd: int):
        self.fd = fd

    def write(self, data) -> int:
        _write_all(self.fd, data)
        return len(data)

    def flush(self) -> None:
        pass


def _write_all(fd: int, data) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view):]


def _umask() -> int:
    """The process's umask, read without changing it (Linux), else by setting and restoring it."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _atomic(path: str | os.PathLike, write: Callable[[Any], None]) -> Path:
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path} is a folder; name a file to write (e.g. {path / 'out'})")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise write_error(e, path.parent) from None
    try:
        try:
            os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; an artifact gets the mode open() would give
            write(_FdFile(fd))
            os.fsync(fd)
        except OSError as e:
            raise write_error(e, path, "; the previous file (if any) is unchanged") from None
        finally:
            os.close(fd)
        try:
            os.replace(tmp, path)  # a symlink at `path` is replaced itself, never written through
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


def check_output_dir(path, flag: str) -> None:
    """Before any work: make the results folder, or say in one line why it cannot be, so that a long run never
    fails at its end."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-", delete=True)
        probe.close()
    except OSError as e:
        raise UserError(f"{flag} {path}: cannot write results there ({e.strerror or type(e).__name__}); "
                        "choose a folder you can write") from None


def _same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file: the same path once resolved, or hard links of one file."""
    try:
        if a.resolve() == b.resolve():
            return True
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except (OSError, RuntimeError):
        return False


def _fix_for(label: str) -> str:
    return f"choose another {label}" if label.startswith("--") else "choose another path"


def check_writable_file(path: str | os.PathLike, label: str, fix: str | None = None) -> Path:
    """Before any work: `path` can be written as a file (not a folder, FIFO or device; its folder can be made and
    written), so that a long run never fails at its end. `label` names it in the line (a flag, or what it is)."""
    path, fix = Path(path), fix or _fix_for(label)
    if path.is_dir():
        raise UserError(f"{label} {path} is a folder; {fix}")
    if path.exists() and not path.is_file():
        kind = next((name for test, name in _NOT_REGULAR if test(path.stat().st_mode)), "not a regular file")
        raise UserError(f"{label} {path} is {kind}, not a file to write; {fix}")
    above = path.parent
    while not os.path.lexists(above) and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise UserError(f"{label} {path}: {above} is a file, not a folder; {fix}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.write-check-", delete=True).close()
    except OSError as e:
        raise UserError(f"{label} {path}: cannot write there ({e.strerror or type(e).__name__}); {fix}") from None
    return path


def check_outputs(outputs: dict[str, Any], inputs: dict[str, Any] | None = None,
                  fixes: dict[str, str] | None = None) -> list[tuple[str, Path]]:
    """Before any work, every file a run will write (label -> path; None: not written): each can be written
    (`check_writable_file`), no two name one file (the second would replace the first) and none names a file
    the run reads (`inputs`, label -> path), which it would replace. Returns the (label, path) pairs checked."""
    fixes = fixes or {}
    outs = [(label, Path(p)) for label, p in outputs.items() if p is not None and str(p)]
    ins = [(label, Path(p)) for label, p in (inputs or {}).items() if p is not None and str(p)]
    for i, (label, path) in enumerate(outs):
        for other, other_path in outs[:i]:
            if _same_file(path, other_path):
                raise UserError(f"{other} and {label} both name {path}; one would replace the other: give each its "
                                "own file")
        for other, other_path in ins:
            if _same_file(path, other_path):
                raise UserError(f"{label} {path} is also the input {other}; writing it would replace what this run "
                                f"reads: {fixes.get(label, _fix_for(label))}")
        check_writable_file(path, label, fixes.get(label))
    return outs


class OutputLock:
    """Exclusive locks on the files a run writes, held from before its work until its outputs are written: a
    second run on the same outputs stops at once with one line, instead of both running and both reporting
    success with one's files replacing the other's.

    The lock of `DIR/NAME` is an `flock` on `DIR/.NAME.lock`, which holds the owner's pid and is removed on
    release; a lock file left by a killed run is simply taken over (the kernel released its lock)."""

    def __init__(self, outputs: list[tuple[str, Any]]):
        self._held: list[tuple[Path, int]] = []
        try:
            for label, path in outputs:
                self._take(label, Path(path))
        except BaseException:
            self.release()
            raise

    @staticmethod
    def lock_path(path: Path) -> Path:
        return path.with_name(f".{path.name}.lock")

    def _take(self, label: str, path: Path) -> None:
        lock = self.lock_path(path)
        for _ in range(10):  # retried only when the owner removed the file between our open and our lock
            try:
                lock.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except OSError as e:
                raise UserError(f"{label} {path}: cannot take its lock {lock} ({e.strerror or type(e).__name__}); "
                                f"{_fix_for(label)}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                try:
                    owner = os.read(fd, 32).decode(errors="replace").strip()
                finally:
                    os.close(fd)
                who = f" (pid {owner})" if owner.isdigit() else ""
                raise UserError(f"{label} {path} is being written by another run{who}; wait for it to finish or "
                                f"{_fix_for(label)}") from None
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(lock))
            except OSError:
                same = False
            if not same:  # the previous owner removed this lock file as we opened it: lock the new one
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
            self._held.append((lock, fd))
            return
        raise UserError(f"{label} {path}: its lock {lock} keeps changing hands; {_fix_for(label)}")

    def release(self) -> None:
        while self._held:
            lock, fd = self._held.pop()
            try:
                os.unlink(lock)  # still held: no other run holds this file
            except OSError:
                pass
            os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def check_results_csv(path: str | os.PathLike | None, flag: str, columns: tuple[str, ...], what: str) -> None:
    """Before any work: an existing results CSV that a run would add to must be readable and of this kind
    (its header names `columns`); otherwise one line says so, so a finished run never fails at its end."""
    if path is None or not str(path) or not Path(path).exists():
        return
    import pandas as pd

    path = Path(path)
    try:
        head = list(pd.read_csv(path, nrows=0).columns)
        pd.read_csv(path)  # the whole file, as the run reads it to add its row
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0][:120]
        raise UserError(f"{flag} {path} is not a readable CSV ({type(e).__name__}: {first}); move it away or "
                        "choose another file") from None
    missing = [c for c in columns if c not in head]
    if missing:
        raise UserError(f"{flag} {path} is not a {what} results file (no column {missing[0]!r}); a run adds its row "
                        "to a file of its own kind: choose another file")


def atomic_write_pickle(path: str | os.PathLike, obj: Any) -> Path:
    data = _dumps(obj)  # encode first: an unstorable object fails before the file is touched
    return _atomic(path, lambda f: f.write(data))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    return _atomic(path, lambda f: f.write(data))


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def write_results(out_dir: str | os.PathLike, stem: str, markdown: str, record: dict[str, Any]) -> None:
    """A benchmark's results, each file written atomically: OUT_DIR/STEM.md (its table) and OUT_DIR/STEM.json
    (`record` with the run's provenance)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / f"{stem}.md", markdown)
    atomic_write_text(out / f"{stem}.json", json.dumps({"provenance": provenance(), **record}, indent=1))


def atomic_torch_save(path: str | os.PathLike, obj: Any) -> Path:
    """`torch.save` atomically. The archive is made in memory first and then written like any bytes: torch's
    archive writer turns a failed write (a full disk) into a RuntimeError traceback that names no file, and the
    bytes already made are what a caller can still save elsewhere."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return atomic_write_bytes(path, buf.getvalue())


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


FRAME_MAGIC = b"\xabNSR"           # never the first byte of a pickle (0x80), so old logs are told apart
_FRAME_HEAD = struct.Struct("<4sQI")  # magic, payload length, crc32 of (length + payload)
MAX_FRAME_BYTES = 1 << 32


def frame(payload: bytes) -> bytes:
    """One record on disk: magic, length, checksum, then the pickle."""
    n = struct.pack("<Q", len(payload))
    return _FRAME_HEAD.pack(FRAME_MAGIC, len(payload), zlib.crc32(payload, zlib.crc32(n))) + payload


def _frame_at(data: bytes, pos: int) -> int | None:
    """End of the whole, checksum-true frame starting at `pos`, else None."""
    if len(data) - pos < _FRAME_HEAD.size:
        return None
    magic, n, crc = _FRAME_HEAD.unpack_from(data, pos)
    end = pos + _FRAME_HEAD.size + n
    if magic != FRAME_MAGIC or n > MAX_FRAME_BYTES or end > len(data):
        return None
    if zlib.crc32(data[pos + _FRAME_HEAD.size:end], zlib.crc32(struct.pack("<Q", n))) != crc:
        return None
    return end


def _is_torn_tail(tail: bytes) -> bool:
    """A frame cut by a crash: a prefix of a frame head, a head whose payload runs past the end, or zeros."""
    if not tail.strip(b"\0"):
        return True
    if len(tail) < _FRAME_HEAD.size:
        return FRAME_MAGIC.startswith(tail[:4])
    magic, n, crc = _FRAME_HEAD.unpack_from(tail)
    if magic != FRAME_MAGIC or _FRAME_HEAD.size + n <= len(tail):
        return False
    whole = len(tail) - _FRAME_HEAD.size  # a flipped length field on a whole last frame is damage, not a cut
    return zlib.crc32(tail[_FRAME_HEAD.size:], zlib.crc32(struct.pack("<Q", whole))) != crc


def _next_frame(data: bytes, pos: int) -> int | None:
    """Start of the next checksum-true frame after `pos` (where reading can resume after damage)."""
    while True:
        pos = data.find(FRAME_MAGIC, pos + 1)
        if pos < 0:
            return None
        if _frame_at(data, pos) is not None:
            return pos


@dataclass
class ParsedLog:
    """What a record log's bytes hold: header, good records, where whole frames end, what was dropped."""

    header: dict | None
    records: list[dict]
    good_end: int                 # end of the last good frame (a torn tail starts here)
    torn: bool = False            # a last frame cut by a crash (always dropped)
    dropped: int = 0              # damaged records dropped by salvage
    legacy: bool = False          # written before frames carried checksums (format 2)


def fresh_path(path: str | os.PathLike, suffix: str) -> Path:
    """`path` + `suffix`, or + `suffix.1`, `.2`, ... : the first that names nothing yet (a file set aside never
    replaces one set aside before)."""
    path = Path(path)
    out, n = path.with_name(path.name + suffix), 0
    while os.path.lexists(out):
        n += 1
        out = path.with_name(f"{path.name}{suffix}.{n}")
    return out


def _salvage_hint(path: Path, n_good: int) -> str:
    return (f"rerun with --salvage to keep the {n_good} good record(s) and drop the damaged one(s) (a collector or "
            f"eval.py then measures them again), or move the file away (mv {path} {fresh_path(path, '.damaged')}) "
            "to start over")


def parse_record_log(data: bytes, path: Path, what: str, salvage: bool = False) -> ParsedLog:
    """Header and records of a record log's bytes; every damaged frame but a torn tail is refused (or salvaged)."""
    if data[:1] == b"\x80":
        return _parse_legacy(data, path, what, salvage)
    objs, pos, dropped, torn = [], 0, 0, False
    while pos < len(data):
        end = _frame_at(data, pos)
        if end is not None:
            try:
                obj = decode(SafeUnpickler(io.BytesIO(data[pos + _FRAME_HEAD.size:end])).load())
            except RecursionError:  # a whole frame whose record nests too deeply to be one
                if not objs or not salvage:
                    raise UserError(f"{path}: record #{len(objs)} (byte {pos}) nests too deeply to be a {what} "
                                    "record; " + _salvage_hint(path, len(objs) - 1 + _count_good_after(data, end))
                                    ) from None
                dropped, pos = dropped + 1, end
                continue
            except Exception as e:
                raise _unpickle_error(path, what, e) from None
            if not isinstance(obj, dict):
                raise UserError(f"{path}: record #{len(objs)} is not a {what} record; write it again with "
                                f"{written_by(what)}")
            objs.append(obj)
            pos = end
            continue
        nxt = _next_frame(data, pos)
        if nxt is None and _is_torn_tail(data[pos:]):
            torn = True  # the last append was cut by a crash: everything before it is good
            break
        if not objs and pos == 0 and nxt is None:
            raise UserError(f"{path} is not a {what} (no neuroshard record frames); choose another path")
        if not objs:
            raise UserError(f"{path}: the header (record 0, byte 0) is damaged, so its records cannot be matched to "
                            f"the settings that made them; move the file away (mv {path} "
                            f"{fresh_path(path, '.damaged')}) and rerun to start over")
        if not salvage:
            raise UserError(f"{path}: record #{len(objs)} (byte {pos}) is damaged (checksum mismatch); "
                            + _salvage_hint(path, len(objs) - 1 + _count_good_after(data, nxt)))
        stop = len(data) if nxt is None else nxt
        dropped += max(1, data.count(FRAME_MAGIC, pos, stop))
        if nxt is None:
            break
        pos = nxt
    header = objs[0] if objs else None
    if header is not None and not ("kind" in header and isinstance(header.get("meta"), dict)):
        raise UserError(f"{path} is not a {what}; choose another output path")
    return ParsedLog(header, objs[1:], pos if torn else len(data), torn, dropped)


def _count_good_after(data: bytes, pos: int | None) -> int:
    n = 0
    while pos is not None:
        end = _frame_at(data, pos)
        if end is None:
            pos = _next_frame(data, pos)
            continue
        n, pos = n + 1, end
    return n


_LEGACY_STARTS = tuple(b"\x80" + bytes([proto]) for proto in range(2, 6))  # a pickle's PROTO opcode


def _legacy_at(data: bytes, pos: int) -> tuple[Any, int] | Exception:
    """The object of the unchecksummed pickle at `pos` and where it ends, or why it does not load."""
    f = io.BytesIO(data)
    f.seek(pos)
    try:
        return decode(SafeUnpickler(f).load()), f.tell()
    except Exception as e:  # noqa: BLE001 - damaged bytes raise anything; the caller decides
        return e


def _cut_short(e: Exception) -> bool:
    """Whether a pickle failed because its bytes ran out (a write cut by a crash), not because they are damaged."""
    return isinstance(e, EOFError) or "truncated" in str(e) or "ran out of input" in str(e).lower()


def _next_legacy(data: bytes, pos: int) -> int | None:
    """Start of the next unchecksummed record after `pos` that loads as a dict (where reading resumes)."""
    for start in range(pos + 1, len(data) - 1):
        if data[start] == 0x80 and data[start:start + 2] in _LEGACY_STARTS:
            got = _legacy_at(data, start)
            if isinstance(got, tuple) and isinstance(got[0], dict):
                return start
    return None


def _count_legacy_after(data: bytes, pos: int | None) -> int:
    n = 0
    while pos is not None and pos < len(data):
        got = _legacy_at(data, pos)
        if isinstance(got, tuple) and isinstance(got[0], dict):
            n, pos = n + 1, got[1]
        else:
            pos = _next_legacy(data, pos)
    return n


def _parse_legacy(data: bytes, path: Path, what: str, salvage: bool = False) -> ParsedLog:
    """A format-2 log (pickles one after another, no checksums), read record by record like the checksummed
    one: a last record cut short is dropped as a torn tail; a record that does not load with good records after
    it is refused with one line naming --salvage (with `salvage`: dropped, and reading resumes at the next one).
    A pickle that asks for code is refused as unsafe wherever it is."""
    objs, pos, dropped, torn = [], 0, 0, False
    while pos < len(data):
        got = _legacy_at(data, pos)
        if isinstance(got, tuple) and isinstance(got[0], dict):
            objs.append(got[0])
            pos = got[1]
            continue
        if isinstance(got, pickle.UnpicklingError) and "refusing" in str(got):
            raise _unpickle_error(path, what, got) from None
        nxt = _next_legacy(data, pos)
        if nxt is None and ((isinstance(got, Exception) and _cut_short(got)) or not data[pos:].strip(b"\0")):
            torn = True  # the last append was cut by a crash: everything before it is good
            break
        if not objs:
            if nxt is None:
                raise UserError(f"{path} is not a {what}; choose another path")
            raise UserError(f"{path}: the header (record 0, byte 0) of this older, unchecksummed log is damaged, so "
                            f"its records cannot be matched to the settings that made them; move the file away "
                            f"(mv {path} {fresh_path(path, '.damaged')}) and rerun to start over")
        if not salvage:
            good = len(objs) - 1 + _count_legacy_after(data, nxt)
            raise UserError(f"{path}: record #{len(objs)} (byte {pos}) of this older, unchecksummed log is damaged; "
                            + _salvage_hint(path, good))
        dropped += 1
        if nxt is None:
            break
        pos = nxt
    header = objs[0] if objs else None
    if header is None or not ("kind" in header and isinstance(header.get("meta"), dict)):
        raise UserError(f"{path} is not a {what}; choose another output path")
    return ParsedLog(header, objs[1:], pos if torn else len(data), torn, dropped, legacy=True)


def _open_log_file(path: Path) -> int:
    """Open (or create) a log for appending, never through a symlink and never a file with other names."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UserError(f"{path} is a symbolic link (to {os.readlink(path)}); neuroshard never writes through a "
                            "link, since that would overwrite the file it points to: remove the link or choose "
                            "another output path") from None
        raise write_error(e, path) from None
    st = os.fstat(fd)
    problem = ("is not a regular file" if not stat.S_ISREG(st.st_mode) else
               f"has {st.st_nlink - 1} other hard link(s), which appending would change too" if st.st_nlink > 1
               else None)
    if problem:
        os.close(fd)
        raise UserError(f"{path} {problem}; choose another output path")
    return fd


class RecordLog:
    """An append-only log: a header `{"kind", "meta"}`, then one record per finished item.

    Each record is one frame (magic, length, crc32, pickle). Opening takes an exclusive lock (a
    second writer gets a clear error instead of silently losing samples) and never follows a
    symlink. Each `append` writes a whole frame and fsyncs, so a record is on disk the moment it is
    appended, Ctrl-C cannot split it, and a kill can at worst cut the last frame, which the next
    open drops. A damaged frame anywhere else (or a damaged header) is refused with one line; with
    `salvage=True` the good records are kept, the file is rewritten without the damaged ones and
    the count is printed. A file whose header `must_match` keys differ from this run's is refused
    (or, with `restart_on_mismatch`, started anew); a file that holds no records is simply started
    anew (a run that failed before its first record never blocks the corrected run). A disk that
    fills up while appending keeps every earlier record (the run resumes).
    """

    def __init__(self, path: str | os.PathLike, kind: str, meta: dict[str, Any], must_match: tuple[str, ...] = (),
                 what: str = "record log", restart_on_mismatch: bool = False, salvage: bool = False):
        self.path, self.kind, self.what = Path(path), kind, what
        self.records: list[dict] = []
        self._fd = _open_log_file(self.path)
        self._lock()
        try:
            parsed = self._read(salvage)
            header, self.records = parsed.header, parsed.records
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
                if parsed.torn:
                    print(f"note: {self.path}: dropped a last record cut by an interrupted write", file=sys.stderr)
                if parsed.dropped or parsed.legacy:
                    self._rewrite([header, *self.records])  # salvaged or upgraded: checksummed frames only
                    if parsed.dropped:
                        print(f"note: {self.path}: --salvage dropped {parsed.dropped} damaged record(s) and kept "
                              f"{len(self.records)}", file=sys.stderr)
                else:
                    os.ftruncate(self._fd, parsed.good_end)  # drop a frame cut by a crash
            else:  # new, empty or header-only file: start it with this run's header
                self.meta = meta
                self.records = []
                os.ftruncate(self._fd, 0)
                self._write({"kind": kind, "format_version": FORMAT_VERSION, "meta": meta})
        except BaseException:
            self.close()
            raise

    def _lock(self) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.close()
            raise UserError(f"{self.path} is being written by another process; wait for it to finish or "
                            "choose another output folder") from None

    def _read(self, salvage: bool) -> ParsedLog:
        os.lseek(self._fd, 0, os.SEEK_SET)
        with os.fdopen(os.dup(self._fd), "rb") as f:
            data = f.read()
        return parse_record_log(data, self.path, self.what, salvage)

    def _rewrite(self, objs: list[dict]) -> None:
        """Replace the file atomically with `objs` as checksummed frames, then hold the lock on the new file."""
        _atomic(self.path, lambda f: [f.write(frame(_dumps(o))) for o in objs])
        old, self._fd = self._fd, _open_log_file(self.path)
        os.close(old)
        self._lock()

    def _write(self, obj: Any) -> None:
        data = frame(_dumps(obj))
        end = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            _write_all(self._fd, data)
            os.fsync(self._fd)
        except OSError as e:
            try:
                os.ftruncate(self._fd, end)  # no half frame left behind
            except OSError:
                pass
            raise write_error(e, self.path, f" (the {len(self.records)} records before it are kept)") from None

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


def read_record_log(path: str | os.PathLike, kind: str, what: str, salvage: bool = False) -> tuple[dict, list[dict]]:
    """(meta, records) of a record log, for readers (no lock needed: records are only appended)."""
    path = check_input_file(path, what)
    parsed = parse_record_log(path.read_bytes(), path, what, salvage)
    if parsed.header is None or parsed.header.get("kind") != kind:
        raise UserError(f"{path} is not a {what}; write it with the matching neuroshard step")
    if parsed.torn:
        print(f"note: {path}: a last record cut by an interrupted write is left out; using the "
              f"{len(parsed.records)} whole ones", file=sys.stderr)
    if parsed.dropped:
        print(f"note: {path}: --salvage dropped {parsed.dropped} damaged record(s), using the {len(parsed.records)} "
              "good ones", file=sys.stderr)
    return parsed.header["meta"], parsed.records


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


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """12 hex digits of SHA-256 over the neuroshard package's Python sources (relative paths and bytes,
    in path order): the same code gives the same digest, installed or in a checkout, git or not."""
    import hashlib

    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


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
