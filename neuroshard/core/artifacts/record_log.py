"""The record log: an append-only log of checksummed pickle frames (a header record, then one record per
finished sample), used by the cost-data collectors and eval.py. A record is on disk as soon as it is finished,
a crash can only cut the last record (dropped on load), any other damaged frame is refused with one line (or
dropped with `salvage`), it never writes through a symlink, and an exclusive lock keeps two writers from
sharing one file.
"""
from __future__ import annotations

import errno
import fcntl
import io
import os
import pickle
import signal
import stat
import struct
import sys
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UserError, write_error
from .atomic import _atomic, _write_all
from .inputs import check_input_file
from .pickles import SafeUnpickler, _dumps, _unpickle_error, decode, written_by
from .provenance import FORMAT_VERSION


class deferred_interrupts:
    """Hold SIGINT/SIGTERM back while a critical step runs (main thread only); delivered on exit. The main thread
    blocks them, and their handlers only note them meanwhile: a signal sent to the process may be taken by
    another thread (torch's, a queue's), whose Python handler would still run in the main thread at once."""

    def __enter__(self):
        self._mask, self._handlers, self._pending = None, {}, []
        if threading.current_thread() is threading.main_thread():
            self._mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._handlers[sig] = signal.signal(sig, lambda signum, frame: self._pending.append(signum))
        return self

    def __exit__(self, *exc):
        for sig, handler in self._handlers.items():
            signal.signal(sig, handler)
        if self._mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)
        for sig in dict.fromkeys(self._pending):  # each signal once, as the kernel would have kept it pending
            signal.raise_signal(sig)  # to this thread: its restored handler runs now


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
