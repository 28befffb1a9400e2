"""The public DLRM dataset's raw format (DESIGN.md §2.1): read, validate, write.

A raw file (e.g. `fbgemm_t856_bs65536.pt`) is a `torch.save`d tuple `(indices, offsets, lengths)`,
optionally gzip-compressed (`.pt.gz`), with `lengths` of shape [T, B], `offsets` of length
T*B + 1 (prefix sums, table by table) and `indices` the row ids, local to each table. It is read
with `torch.load(weights_only=True)` (`torch_load_plain`), so a crafted file cannot run code, and a line that refuses it
never repeats torch's advice to load it unsafely.
"""
from __future__ import annotations

import gzip
import io
from pathlib import Path
from typing import Any

import torch

from ..core.artifacts import (atomic_torch_save, atomic_write_bytes, check_input_file, torch_load_failure,
                              torch_load_plain)
from ..core.errors import UserError

LARGEST_DEVICE_GB = 192.0  # the most memory one accelerator has today (B200); no table larger than this is sharded


def max_rows_any_device(min_dim: int = 4, bytes_per_param: int = 4) -> int:
    """Most rows a table can have and still fit one device as its narrowest (4-column) shard."""
    return int(LARGEST_DEVICE_GB * 2**30 // (min_dim * bytes_per_param))


def load_raw(path: str | Path, flag: str = "--data") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Load and validate a raw `(indices, offsets, lengths)` file (`.pt` or `.pt.gz`) given as `flag`."""
    path = check_input_file(path, f"{flag} file", "download fbgemm_t856_bs65536.pt or use --synthetic"
                            if flag == "--data" else "pass a raw DLRM ids file (.pt or .pt.gz)")
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            obj = torch_load_plain(io.BytesIO(f.read()))
    except Exception as e:
        raise UserError(f"{path} is not a torch.save'd DLRM dataset ({torch_load_failure(e)})") from None
    return validate_raw(obj, path)


def validate_raw(obj: Any, path: str | Path = "<data>") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Check the raw tuple's types, shapes and consistency; name the first bad table."""
    if not (isinstance(obj, (tuple, list)) and len(obj) == 3 and all(isinstance(x, torch.Tensor) for x in obj)):
        raise UserError(f"{path}: expected a tuple (indices, offsets, lengths) of three tensors, "
                        f"got {type(obj).__name__}; pass a DLRM dataset file such as fbgemm_t856_bs65536.pt")
    for name, x in zip(("indices", "offsets", "lengths"), obj):
        if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            raise UserError(f"{path}: {name} must be an integer tensor, got {x.dtype}; ids, offsets and lengths "
                            "are whole numbers")
    indices, offsets, lengths = (x.to(torch.int64) for x in obj)
    if lengths.dim() != 2:
        raise UserError(f"{path}: lengths must have shape [T, B], got {tuple(lengths.shape)}")
    T, B = lengths.shape
    if T == 0 or B == 0:
        raise UserError(f"{path}: the dataset has no tables or no samples (lengths {tuple(lengths.shape)}); "
                        "pass a dataset with at least one table and one sample")
    if lengths.numel() and int(lengths.min()) < 0:
        t = int(torch.nonzero(lengths < 0)[0, 0])
        raise UserError(f"{path}: negative lengths in table {t}; lengths count lookups and must be >= 0")
    if indices.dim() != 1 or offsets.dim() != 1 or offsets.numel() != T * B + 1:
        raise UserError(f"{path}: offsets must be 1-D of length T*B+1 = {T * B + 1} and indices 1-D, "
                        f"got offsets {tuple(offsets.shape)}, indices {tuple(indices.shape)}")
    bad = (offsets[1:] - offsets[:-1]) != lengths.reshape(-1)
    if int(offsets[0]) != 0 or bool(bad.any()):
        t = 0 if int(offsets[0]) != 0 else int(torch.nonzero(bad)[0]) // B
        raise UserError(f"{path}: offsets are inconsistent with lengths in table {t}; "
                        "offsets must be the prefix sums of lengths, table by table")
    if int(offsets[-1]) != indices.numel():
        raise UserError(f"{path}: offsets end at {int(offsets[-1])} but there are {indices.numel()} indices")
    if indices.numel() and int(indices.min()) < 0:
        first = int(torch.nonzero(indices < 0)[0])
        t = int(torch.searchsorted(offsets, torch.tensor([first]), right=True)[0] - 1) // B
        raise UserError(f"{path}: negative ids in table {t}; ids must be row numbers >= 0")
    limit = max_rows_any_device()
    if indices.numel() and int(indices.max()) >= limit:
        first = int(torch.nonzero(indices >= limit)[0])
        t = int(torch.searchsorted(offsets, torch.tensor([first]), right=True)[0] - 1) // B
        rows = int(indices[first]) + 1
        raise UserError(f"{path}: table {t} has id {rows - 1}, so {rows:,} rows: {rows * 16 / 2**30:,.0f} GB even as "
                        f"a 4-column shard, more than any device holds ({LARGEST_DEVICE_GB:g} GB, at most {limit:,} "
                        "rows); remap its ids to 0..rows-1 (e.g. hash them into fewer rows)")
    return indices, offsets, lengths


def save_raw(path: str | Path, indices: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor) -> Path:
    """Write a raw dataset in the public format (gzip-compressed if the name ends in .gz)."""
    path = Path(path)
    obj = (indices, offsets, lengths)
    if path.suffix == ".gz":
        buf = io.BytesIO()
        torch.save(obj, buf)
        return atomic_write_bytes(path, gzip.compress(buf.getvalue(), compresslevel=1))
    return atomic_torch_save(path, obj)
