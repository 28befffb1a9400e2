"""Atomic writes and output checks.

Every file is written through `atomic_write_*` (temporary file in the same folder, then `os.replace`), so an
interrupted step never leaves a half-written artifact. Before any work, the outputs a run will write are checked
(`check_outputs`) and locked (`OutputLock`), so that a long run never fails at its end.
"""
from __future__ import annotations

import fcntl
import io
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Callable

from ..errors import DISK_FULL, UserError, write_error
from .inputs import _NOT_REGULAR
from .pickles import _dumps


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
    try:  # a device, FIFO or socket is never replaced by a file (a symlink is replaced itself, below)
        mode = os.lstat(path).st_mode
    except OSError:
        mode = None
    kind = next((name for test, name in _NOT_REGULAR if test(mode)), None) if mode is not None else None
    if kind:
        raise UserError(f"{path} is {kind}, not a file to write; choose another output path")
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


def check_printable_path(path, flag: str, fix: str = "choose a name of printable characters") -> None:
    """Refuse a path that holds a control character (a newline or a tab would break the lines of every listing,
    log and record that names it)."""
    if path is not None and any(not c.isprintable() for c in str(path)):
        raise UserError(f"{flag} {str(path)[:80]!r}: the path holds a control character (a newline, a tab, ...); "
                        f"{fix}")


def check_output_file(path, flag: str) -> None:
    """Refuse, before any work, an output path that names a folder (one there, or one ending in '/') or holds a
    control character (`check_printable_path`)."""
    check_printable_path(path, flag)
    if path is not None and str(path) and Path(path).is_dir():
        raise UserError(f"{flag} {path} is a folder; name a file to write")
    _refuse_folder_name(path, flag)


def _refuse_folder_name(path, label: str) -> None:
    """A path ending in '/' names a folder not made yet, which would become a file: refused (before `Path()` drops
    the '/')."""
    if path is not None and str(path).endswith(("/", os.sep)):
        raise UserError(f"{label} {path} ends in '/', which names a folder; name a file to write")


def check_output_dir(path, flag: str) -> None:
    """Before any work: the results folder can be made and written, or one line says why not, so that a long run
    never fails at its end. Folders made for the check go again (the writers make them), so a run that stops early
    leaves no empty results folder."""
    try:
        _probe_folder(Path(path), ".write-check-")
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


def _missing_dirs(folder: Path) -> list[Path]:
    """The folders `folder` and its parents that do not exist yet, deepest first (what a mkdir(parents=True) makes)."""
    missing = []
    while not os.path.lexists(folder) and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def _probe_folder(folder: Path, prefix: str) -> None:
    """Make `folder` (parents too) and write and delete a probe file in it; raises OSError where that fails. The
    folders made for the probe go again (the writers make them), so a run that stops early leaves none empty."""
    made = _missing_dirs(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.NamedTemporaryFile(dir=folder, prefix=prefix, delete=True).close()
    finally:
        _remove_empty(made)


def _remove_empty(folders: list[Path]) -> None:
    """Remove those of `folders` (deepest first) that are still empty: what a run made and did not fill."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            pass


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
        _probe_folder(path.parent, f".{path.name}.write-check-")
    except OSError as e:
        raise UserError(f"{label} {path}: cannot write there ({e.strerror or type(e).__name__}); {fix}") from None
    return path


def check_outputs(outputs: dict[str, Any], inputs: dict[str, Any] | None = None,
                  fixes: dict[str, str] | None = None) -> list[tuple[str, Path]]:
    """Before any work, every file a run will write (label -> path; None: not written): each can be written
    (`check_writable_file`), no two name one file (the second would replace the first) and none names a file
    the run reads (`inputs`, label -> path), which it would replace. Returns the (label, path) pairs checked."""
    fixes = fixes or {}
    for label, p in outputs.items():
        _refuse_folder_name(p, label)
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
    release; a lock file left by a killed run is simply taken over (the kernel released its lock). Folders made
    for a lock are removed on release where they are still empty (the run wrote nothing there)."""

    def __init__(self, outputs: list[tuple[str, Any]]):
        self._held: list[tuple[Path, int]] = []
        self._made: list[Path] = []
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
            made = _missing_dirs(lock.parent)
            try:
                lock.parent.mkdir(parents=True, exist_ok=True)
                self._made += made
                fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except FileNotFoundError:  # another run removed the empty folder as we made it: make it again
                continue
            except OSError as e:
                raise UserError(f"{label} {path}: cannot take its lock {lock} ({e.strerror or type(e).__name__}); "
                                f"{_fix_for(label)}") from None
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device put there: no pid can be written to it
                os.close(fd)
                raise UserError(f"{label} {path}: its lock {lock} is not a plain file; remove it, or "
                                f"{_fix_for(label)}")
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
            try:
                os.ftruncate(fd, 0)
                _write_all(fd, str(os.getpid()).encode())
            except OSError as e:  # a full disk: the lock file goes (we hold it), nothing is left behind
                _drop_lock(lock, fd)
                why = "disk full" if e.errno in DISK_FULL else e.strerror or type(e).__name__
                raise UserError(f"{label} {path}: cannot write its lock {lock} ({why}); free some space or "
                                f"{_fix_for(label)}, and rerun") from None
            self._held.append((lock, fd))
            return
        raise UserError(f"{label} {path}: its lock {lock} keeps changing hands; {_fix_for(label)}")

    def release(self) -> None:
        while self._held:
            _drop_lock(*self._held.pop())
        made, self._made = self._made, []
        _remove_empty(sorted(made, key=lambda p: len(p.parts), reverse=True))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def _drop_lock(lock: Path, fd: int) -> None:
    """Remove a lock file this run holds (no other run holds it) and close it."""
    try:
        os.unlink(lock)
    except OSError:
        pass
    os.close(fd)


def atomic_write_pickle(path: str | os.PathLike, obj: Any) -> Path:
    data = _dumps(obj)  # encode first: an unstorable object fails before the file is touched
    return _atomic(path, lambda f: f.write(data))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    return _atomic(path, lambda f: f.write(data))


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def atomic_torch_save(path: str | os.PathLike, obj: Any) -> Path:
    """`torch.save` atomically. The archive is made in memory first and then written like any bytes: torch's
    archive writer turns a failed write (a full disk) into a RuntimeError traceback that names no file, and the
    bytes already made are what a caller can still save elsewhere."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return atomic_write_bytes(path, buf.getvalue())
