"""Every command-line helper of neuroshard (the only module of the package that imports argparse).

- `run_main`: a `UserError` becomes one `error:` line and exit 2; Ctrl-C exits 130, SIGTERM (handled
  like Ctrl-C) 143.
- `ArgumentParser`: bad arguments give one line, not a usage dump.
- Parsers of the text users type: `lo,hi` ranges, comma-separated lists, on|off.
- `step_parser` / `config_from_args`: a step's flags are the fields of its config (core/config.py).
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading
import typing
from dataclasses import MISSING, fields, is_dataclass
from typing import Callable, Sequence

from .errors import UserError, check_range


RESUMABLE = "interrupted: finished work is saved; rerun the same command to resume"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, so it unwinds like Ctrl-C."""


def run_main(main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None = None,
             interrupted: str = RESUMABLE) -> None:
    """Run a script's main; `UserError` becomes one line on stderr and exit 2, Ctrl-C exit 130, and SIGTERM
    (a timeout, a scheduler) is handled like Ctrl-C (temporary folders removed, workers stopped), exit 143."""
    def terminated(signum, frame):
        raise Terminated()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, terminated)
    try:
        code = main(argv)
    except UserError as e:
        print(f"error: {one_line(str(e))}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as e:  # one raised with a message (`plan_file.write_plan_outputs`) says what it knows
        print(e.args[0] if e.args and isinstance(e.args[0], str) else interrupted, file=sys.stderr)
        sys.exit(143 if isinstance(e, Terminated) else 130)
    sys.exit(code or 0)


def one_line(text: str) -> str:
    """An error message as one terminal line: control characters in it (newlines, carriage returns, escape
    sequences, as a file or folder name may hold) are written as Python escapes, so that nothing a user's path
    holds can start a line of its own or move the cursor."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports bad arguments as one line (exit 2) without the usage dump."""

    def error(self, message: str):  # noqa: D401
        if "expected one argument" in message:  # e.g. --sleep_range -5,2: argparse takes -5,2 for a flag
            message += "; write a value that starts with '-' as --flag=VALUE (e.g. --sleep_range=-5,2)"
        print(f"error: {one_line(message)} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


# ----------------------------------------------------------------------------- value parsers

def _short(text) -> str:
    """A user's text for an error line: at most 60 characters."""
    t = str(text)
    return repr(t) if len(t) <= 60 else f"{t[:57]!r}... ({len(t):,} characters)"


def _pair(text, name: str, kind: type, lowest: float, strict: bool):
    if isinstance(text, (tuple, list)):
        text = ",".join(map(str, text))
    try:
        lo, hi = (kind(p) for p in str(text).split(","))
    except ValueError:
        raise UserError(f"{name} must be two {kind.__name__} values 'lo,hi' (e.g. 10,60), got {_short(text)}") from None
    return check_range(name, (lo, hi), lowest, strict)


def int_range(text, name: str) -> tuple[int, int]:
    """Parse 'lo,hi' (or a pair) with 1 <= lo < hi (--T_range and friends)."""
    return _pair(text, name, int, 1, strict=True)


def float_range(text, name: str) -> tuple[float, float]:
    """Parse 'lo,hi' (or a pair) with 0 <= lo <= hi (--sleep_range, --threshold_range)."""
    return _pair(text, name, float, 0.0, strict=False)


def int_list(text, name: str) -> tuple[int, ...]:
    """Parse '0,1,3' or '64' (or a sequence) into a tuple of ints (--gpu_devices, --dims)."""
    if isinstance(text, (tuple, list)):
        text = ",".join(map(str, text))
    try:
        return tuple(int(p) for p in str(text).split(","))
    except ValueError:
        raise UserError(f"{name} must be comma-separated integers such as 0,1,2,3, got {_short(text)}") from None


def float_list(text, name: str) -> tuple[float, ...]:
    """Parse '0,1.5' into (0.0, 1.5) (a benchmark's --lambdas); non-numbers are refused in one line."""
    if isinstance(text, (tuple, list)):
        return tuple(float(v) for v in text)
    try:
        return tuple(float(p) for p in str(text).split(","))
    except ValueError:
        raise UserError(f"{name} must be comma-separated numbers such as 0,1,2, got {_short(text)}") from None


def str_list(text, name: str) -> tuple[str, ...]:
    """Parse 'a,b' into ('a', 'b') (--alg); empty entries are refused."""
    if isinstance(text, (tuple, list)):
        return tuple(map(str, text))
    parts = tuple(p.strip() for p in str(text).split(","))
    if not all(parts):
        raise UserError(f"{name} has an empty entry: {text!r}")
    return parts


def shares(text, name: str) -> tuple[tuple[str, float], ...]:
    """Parse 'a=0.5,b=1' into (('a', 0.5), ('b', 1.0)) (--family_share); names are checked by their user."""
    if isinstance(text, (tuple, list)):
        return tuple((str(k), float(v)) for k, v in text)
    out = []
    for part in str(text).split(","):
        key, _, value = part.partition("=")
        try:
            out.append((key.strip(), float(value)))
        except ValueError:
            raise UserError(f"{name} must be name=share pairs such as dataset=0.4,one_hot=0.1, got {text!r}") from None
    return tuple(out)


def on_off(text, name: str) -> bool:
    """Parse 'on' or 'off' (or a bool) into a bool (--dp_sync, --error_feedback)."""
    if isinstance(text, bool):
        return text
    if text not in ("on", "off"):
        raise UserError(f"{name} must be on or off, got {_short(text)}")
    return text == "on"


def _on_off_arg(text: str) -> bool:
    """argparse's type of an on|off flag: a bad value is argparse's one line 'argument --x: must be on or off, ...'."""
    try:
        return on_off(text, "")
    except UserError as e:
        raise argparse.ArgumentTypeError(str(e).strip()) from None


PARSERS = {"int_range": int_range, "float_range": float_range, "int_list": int_list, "float_list": float_list,
           "str_list": str_list,
           "shares": shares, "on_off": on_off}


# ----------------------------------------------------------------------------- configs as flags

def _field_types(cls) -> dict:
    return typing.get_type_hints(cls)


def _scalar(tp):
    """int / float / str for `int`, `int | None`, ...; None for anything else."""
    if tp in (int, float, str, bool):
        return tp
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if len(args) == 1 and args[0] in (int, float, str, bool) else None


def add_config_args(p, cls, skip: Sequence[str] = ()) -> None:
    """One flag per field of the config class `cls` (nested configs add theirs), defaults from `cls`."""
    types = _field_types(cls)
    for f in fields(cls):
        if f.name in skip:
            continue
        tp = types[f.name]
        if is_dataclass(tp):
            add_config_args(p, tp, skip)
            continue
        md = f.metadata
        default = f.default if f.default is not MISSING else f.default_factory()
        flags = [f"--{f.name}", *md.get("aliases", ())]
        help_ = md.get("help", "")
        if md.get("none_if_absent"):  # the script tells a flag left out (None) from one given
            default = None
        if md.get("parse") == "on_off":
            p.add_argument(*flags, dest=f.name, type=_on_off_arg, default=default, metavar="{on,off}", help=help_)
        elif md.get("parse"):
            shown = ",".join(map(str, default)) if isinstance(default, (tuple, list)) else default
            p.add_argument(*flags, dest=f.name, default=None, help=f"{help_} (default {shown})".strip())
        elif _scalar(tp) is bool:
            p.add_argument(*flags, dest=f.name, action="store_true", help=help_)
        elif md.get("bare") is not None:
            p.add_argument(*flags, dest=f.name, type=_scalar(tp) or str, default=default, nargs="?",
                           const=md["bare"], choices=md.get("choices"), help=help_)
        else:
            p.add_argument(*flags, dest=f.name, type=_scalar(tp) or str, default=default,
                           choices=md.get("choices"), help=help_)


def config_from_args(cls, args, **overrides):
    """The config `cls` from parsed arguments: text fields parsed, absent ones at their defaults."""
    types = _field_types(cls)
    kw = {}
    for f in fields(cls):
        tp = types[f.name]
        if f.name in overrides:
            kw[f.name] = overrides[f.name]
        elif is_dataclass(tp):
            kw[f.name] = config_from_args(tp, args)
        elif hasattr(args, f.name):
            value = getattr(args, f.name)
            parse = f.metadata.get("parse")
            if parse and value is not None:
                value = PARSERS[parse](value, f"--{f.name}")
            if value is not None or not (parse or f.metadata.get("none_if_absent")):
                kw[f.name] = value
    return cls(**kw)


def step_parser(cls, doc: str | None = None, skip: Sequence[str] = (), raw_doc: bool = False) -> "ArgumentParser":
    """The argument parser of a step whose flags are the fields of the config class `cls`; `raw_doc`: --help shows
    `doc` with its own line breaks (a script's docstring with a usage block)."""
    p = ArgumentParser(description=doc or cls.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter if raw_doc else argparse.HelpFormatter)
    add_config_args(p, cls, skip)
    return p
