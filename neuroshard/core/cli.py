"""Every command-line helper of neuroshard (the only module of the package that imports argparse).

- `run_main`: a `UserError` becomes one `error:` line and exit 2; Ctrl-C exits 130.
- `ArgumentParser`: bad arguments give one line, not a usage dump.
- Parsers of `lo,hi` ranges and of `--gpu_devices`; default model file names.
- Argument groups shared by several scripts (hardware, training, sharding algorithms).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Sequence

from .errors import UserError


RESUMABLE = "interrupted: finished work is saved; rerun the same command to resume"


def run_main(main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None = None,
             interrupted: str = RESUMABLE) -> None:
    """Run a script's main; `UserError` becomes one line on stderr and exit 2, Ctrl-C exit 130."""
    try:
        code = main(argv)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(interrupted, file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports bad arguments as one line (exit 2) without the usage dump."""

    def error(self, message: str):  # noqa: D401
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


# ----------------------------------------------------------------------------- value parsers

def _pair(text: str, name: str, kind: type, lowest: float, strict: bool):
    import math

    try:
        lo, hi = (kind(p) for p in str(text).split(","))
    except ValueError:
        raise UserError(f"{name} must be two {kind.__name__} values 'lo,hi' (e.g. 10,60), got {text!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo < lowest or hi < lo or (strict and hi == lo):
        rel = "<" if strict else "<="
        raise UserError(f"{name} must satisfy {lowest:g} <= lo {rel} hi, got {text!r}")
    return lo, hi


def int_range(text, name: str) -> tuple[int, int]:
    """Parse 'lo,hi' (or a pair) with 1 <= lo < hi (--T_range and friends)."""
    if isinstance(text, (tuple, list)):
        text = ",".join(map(str, text))
    return _pair(text, name, int, 1, strict=True)


def float_range(text, name: str) -> tuple[float, float]:
    """Parse 'lo,hi' (or a pair) with 0 <= lo <= hi (--sleep_range, --threshold_range)."""
    if isinstance(text, (tuple, list)):
        text = ",".join(map(str, text))
    return _pair(text, name, float, 0.0, strict=False)


def parse_gpu_devices(text: str | None) -> list[int] | None:
    """`--gpu_devices 0,1,3` -> [0, 1, 3] (distinct ids >= 0); None when not given."""
    if text is None or str(text).strip() == "":
        return None
    try:
        ids = [int(g) for g in str(text).split(",")]
    except ValueError:
        raise UserError(f"--gpu_devices must be comma-separated GPU ids such as 0,1,2,3, got {text!r}") from None
    if min(ids) < 0 or len(set(ids)) != len(ids):
        raise UserError(f"--gpu_devices must list distinct GPU ids >= 0, got {text!r}")
    return ids


# ----------------------------------------------------------------------------- file naming

def comm_model_paths(models_dir: str | Path, num_devices: int) -> tuple[Path, Path]:
    """Default forward and backward comm model files for `num_devices` devices."""
    d = Path(models_dir)
    return d / f"comm_{num_devices}_fw.pt", d / f"comm_{num_devices}_bw.pt"


def model_paths(compute_model, fw_comm_model, bw_comm_model, models_dir: str | Path,
                num_devices: int) -> tuple[Path, Path, Path]:
    """Compute, forward-comm and backward-comm model paths; defaults under `models_dir`."""
    fw, bw = comm_model_paths(models_dir, num_devices)
    return (Path(compute_model or Path(models_dir) / "compute.pt"), Path(fw_comm_model or fw),
            Path(bw_comm_model or bw))


# ----------------------------------------------------------------------------- shared argument groups

def add_hardware_args(p) -> None:
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--backend", default="auto", help="auto, fbgemm or torch")
    p.add_argument("--gpu_devices", default=None, help="comma-separated GPU ids, one rank/worker each (CUDA)")


def add_training_args(p, epochs: int) -> None:
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--train_ratio", type=float, default=0.8)
    p.add_argument("--valid_ratio", type=float, default=0.1)
    p.add_argument("--batch_size", type=int, default=512)
    p.add_argument("--num_samples", type=int, default=None, help="use the first N samples (default all)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)


def training_kwargs(args) -> dict:
    return {"epochs": args.epochs, "num_samples": args.num_samples, "batch_size": args.batch_size, "lr": args.lr,
            "train_ratio": args.train_ratio, "valid_ratio": args.valid_ratio, "seed": args.seed}


def add_sharder_args(p) -> None:
    """Arguments of the neuroshard sharder: cost models and search parameters (DESIGN.md §3.5)."""
    p.add_argument("--compute_model", default="models/compute.pt")
    p.add_argument("--fw_comm_model", default=None, help="default models/comm_<N>_fw.pt")
    p.add_argument("--bw_comm_model", default=None, help="default models/comm_<N>_bw.pt")
    p.add_argument("--beam_width", type=int, default=3)
    p.add_argument("--num_candidates", type=int, default=10)
    p.add_argument("--max_splits", type=int, default=10)
    p.add_argument("--grid_steps", type=int, default=11)
    p.add_argument("--threshold_range", default="1.0,1.5")


def search_params(args):
    from ..sharding.search import SearchParams

    return SearchParams.checked(args.beam_width, args.num_candidates, args.max_splits, args.grid_steps,
                                float_range(args.threshold_range, "--threshold_range"))
