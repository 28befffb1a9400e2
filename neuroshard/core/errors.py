"""The exceptions of neuroshard and the range checks every step runs before it touches a file.

`UserError` is bad input or environment: the scripts turn it into one `error:` line on stderr and
exit 2. `PlanError` is an invalid sharding plan (an internal inconsistency, never silently ignored).
"""
from __future__ import annotations

import errno
import math
import numbers
import os


class UserError(Exception):
    """Bad input or environment: the message names the problem and the fix."""


class PlanError(ValueError):
    """A sharding plan that does not place every column of every table exactly once on a real device."""


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def write_error(e: OSError, path: str | os.PathLike, kept: str = "") -> UserError:
    """One line for a failed write: a full disk says so (the step resumes), anything else names the error."""
    if e.errno in DISK_FULL:
        return UserError(f"disk full while writing {path}{kept}; free some space (or choose another output folder) "
                         "and rerun the same command: it resumes where it stopped")
    return UserError(f"cannot write {path}: {e.strerror or e}{kept}; choose a writable output path")


def check_int(name: str, value, lo: int | None = None, hi: int | None = None) -> int:
    """`value` as an int within [lo, hi], else a `UserError` naming the argument and the allowed range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise UserError(f"{name} must be a whole number, got {value!r}")
    value = int(value)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise UserError(f"{name} must be {_range_text(lo, hi)}, got {value}")
    return value


def check_range(name: str, pair, lowest: float, strict: bool) -> tuple:
    """A finite (lo, hi) with lowest <= lo <= hi (lo < hi when `strict`), else a `UserError`."""
    try:
        lo, hi = pair
        ok = math.isfinite(lo) and math.isfinite(hi)
    except (TypeError, ValueError):
        raise UserError(f"{name} must be a pair lo,hi, got {pair!r}") from None
    rel = "<" if strict else "<="
    if not ok:
        raise UserError(f"{name} must be finite numbers with {lowest:g} <= lo {rel} hi, got {lo},{hi} (not finite)")
    if lo < lowest or hi < lo or (strict and hi == lo):
        raise UserError(f"{name} must satisfy {lowest:g} <= lo {rel} hi, got {lo},{hi}")
    return lo, hi


def check_float(name: str, value, lo: float | None = None, hi: float | None = None, lo_open: bool = False,
                hi_open: bool = False) -> float:
    """`value` as a finite float within the range (open ends where asked), else a `UserError`."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{name} must be a number, got {value!r}") from None
    bad = not math.isfinite(value)
    bad |= lo is not None and (value <= lo if lo_open else value < lo)
    bad |= hi is not None and (value >= hi if hi_open else value > hi)
    if bad:
        raise UserError(f"{name} must be a finite number {_range_text(lo, hi, lo_open, hi_open)}, got {value:g}")
    return value


def _range_text(lo, hi, lo_open=False, hi_open=False) -> str:
    parts = []
    if lo is not None:
        parts.append(f"{'>' if lo_open else '>='} {lo:g}")
    if hi is not None:
        parts.append(f"{'<' if hi_open else '<='} {hi:g}")
    return " and ".join(parts) if parts else "valid"
