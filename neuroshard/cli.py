"""Shared command-line plumbing: one clear line for bad input, clean Ctrl-C, common arguments."""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

from .errors import UserError


def run_main(main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None = None) -> None:
    """Run a script's main; `UserError` becomes one line on stderr and exit 2, Ctrl-C exit 130."""
    try:
        code = main(argv)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted: finished work is saved; rerun the same command to resume", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports bad arguments as one line (exit 2) without the usage dump."""

    def error(self, message: str):  # noqa: D401
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def _pair(text: str, name: str, kind: type, lowest: float, strict: bool):
    try:
        lo, hi = (kind(p) for p in text.split(","))
    except ValueError:
        raise UserError(f"{name} must be two {kind.__name__} values 'lo,hi' (e.g. 10,60), got {text!r}") from None
    if lo < lowest or hi < lo or (strict and hi == lo):
        rel = "<" if strict else "<="
        raise UserError(f"{name} must satisfy {lowest:g} <= lo {rel} hi, got {text!r}")
    return lo, hi


def int_range(text: str, name: str) -> tuple[int, int]:
    """Parse 'lo,hi' with 1 <= lo < hi (--T_range and friends)."""
    return _pair(text, name, int, 1, strict=True)


def float_range(text: str, name: str) -> tuple[float, float]:
    """Parse 'lo,hi' with 0 <= lo <= hi (--sleep_range, --threshold_range)."""
    return _pair(text, name, float, 0.0, strict=False)
