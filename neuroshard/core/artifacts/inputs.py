"""Input files: a path checked to be a regular, readable file before it is read, with one line otherwise."""
from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

from ..errors import UserError


_NOT_REGULAR = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


READ_FIX = "run the step that writes it, or pass the right path"


def check_input_file(path: str | os.PathLike, what: str, fix: str = READ_FIX) -> Path:
    """`path` as a regular file to read, else one `UserError` that says what is there instead: nothing, a folder,
    a FIFO, a device (reading /dev/zero or a FIFO never ends), or a file this user cannot read; a `path` that is no
    path at all (None, a number) too. `fix` ends it."""
    if not isinstance(path, (str, os.PathLike)):
        raise UserError(f"{what}: expected a path, got {type(path).__name__}; {fix}")
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


MAX_TEXT_BYTES = 64 << 20  # the one size limit of a table list, a plan file or any JSON input


def read_text(path: str | os.PathLike, label: str, what: str, fix: str = READ_FIX,
              max_bytes: int = MAX_TEXT_BYTES) -> str:
    """The UTF-8 text in `path` (a UTF-8 BOM is dropped), else one line: what is there instead of a file
    (`check_input_file`, `label` names it), a file larger than `max_bytes`, or bytes that are not UTF-8 (the byte
    and its line). `fix` ends the line."""
    path = check_input_file(path, label, fix)
    size = path.stat().st_size
    if size > max_bytes:
        raise UserError(f"{path}: {size:,} bytes is more than a {what} can be ({max_bytes:,}); {fix}")
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise UserError(f"{path} line {line}: not UTF-8 text (byte 0x{data[e.start]:02x}); {fix}") from None


def read_json(path: str | os.PathLike, label: str, what: str, fix: str = READ_FIX,
              max_bytes: int = MAX_TEXT_BYTES):
    """The JSON in `path` (`read_text`'s checks first), else one line: not valid JSON (the parser's message and
    line), a key given twice in one object, or not a usable `what` (nested too deeply, or an integer of thousands
    of digits). Reading JSON runs no code. `fix` ends the line."""
    text = read_text(path, label, what, fix, max_bytes)
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as e:
        raise UserError(f"{path}: key {str(e.args[0])[:60]!r} appears twice in one object (which one counts is up to "
                        f"the reader); {fix}") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}); {fix}") from None
    except (RecursionError, ValueError) as e:  # nesting too deep, or an integer of thousands of digits
        why = "nested too deeply" if isinstance(e, RecursionError) else str(e).split(";")[0]
        raise UserError(f"{path}: not a usable {what} ({why}); {fix}") from None


class _DuplicateKey(ValueError):
    """A key given twice in one JSON object (`read_json` refuses it rather than keep the last silently)."""


def _unique_keys(pairs: list) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def json_real(v) -> bool:
    """A finite number as JSON gives it: an int or a float, not a bool, not an int beyond a float's range (a JSON
    integer of hundreds of digits reads as an int that `float()` cannot hold)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False
