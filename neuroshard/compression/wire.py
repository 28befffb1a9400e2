"""What DCT's codecs share on the wire: fp16's range, the smallest positive float32, raw-byte views of the
all-to-all buffers, segment starts, the bytes that leave a rank, the seconds of a collective, and small constant
tables copied to a device once.

gloo's all_to_all does not carry int16, so DCT-MP's codecs pack everything into one uint8 buffer and read it
back through `from_bytes`.
"""
from __future__ import annotations

import time

import torch

FP16_MAX = 65504.0  # fp16's largest finite value: values sent as fp16 are clamped to +-FP16_MAX
MIN_POSITIVE = float(torch.finfo(torch.float32).tiny) * 2 ** -23  # the smallest positive float32 (a subnormal)


def from_bytes(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Raw bytes [rows, c * itemsize] (uint8) -> [rows, c] of `dtype`. A column slice of one row counts as
    contiguous whatever its row stride, and a slice may start at an offset `view` cannot align; `view` refuses
    both, so such a slice is copied to dense strides first."""
    if b.numel() == 0:
        return torch.empty(b.shape[0], 0, dtype=dtype, device=b.device)
    b = b.contiguous()
    if b.stride(0) != b.shape[1] or b.storage_offset() % dtype.itemsize:
        b = b.clone(memory_format=torch.contiguous_format)
    return b.view(dtype)


def starts(widths) -> list[int]:
    """The first column of each of `widths` laid side by side."""
    out, pos = [], 0
    for w in widths:
        out.append(pos)
        pos += w
    return out


def bytes_leaving(send_splits: list[int], rank: int, itemsize: int = 1) -> int:
    """Bytes an all-to-all sends to other ranks, given its send split sizes (elements per destination rank):
    a rank's own piece never leaves it."""
    return (sum(send_splits) - send_splits[rank]) * itemsize


def timed(fn) -> float:
    """Seconds `fn()` takes."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


_ON_DEVICE: dict = {}  # (id of a module-level constant table, device) -> its copy there, made once


def on_device(table: torch.Tensor, device: torch.device, cache: dict = _ON_DEVICE, key=None) -> torch.Tensor:
    """`table` on `device`: copied there once into `cache` under (`key`, device), not on every call (a copy to a
    GPU each step would also wait for it). By default `table` is a module-level constant of a codec, keyed by its
    id (it lives as long as its module); a layout passes its own cache and key."""
    if table.device == device:
        return table
    key = (id(table) if key is None else key, device)
    if key not in cache:
        cache[key] = table.to(device)
    return cache[key]
