"""DCT-DP's threshold codec (DESIGN.md §5): which entries of a gradient bucket go out, and their wire format.

- The share: g = residual + bucket / world_size (`add_mean_share`), as PyTorch's default all-reduce hook divides
  before summing.
- The threshold: tau is the magnitude that keeps `keep` of the entries, the k-th largest |g| with
  k = max(1, floor(keep * n)) (`keep_count`, `kth_largest`); the entries sent are those with |g| >= tau
  (`over_threshold`; tau is floored at the smallest positive float32, so zeros never go out). No rank sends more
  than `drift_cap(k, drift)` entries of a bucket.
- The wire: sorted indices as 16-bit deltas (a gap over 65,535 is bridged by filler entries of delta 65,535 and
  value 0) and fp16 values clamped to fp16's range, 4 bytes an entry (`encode`); one uint8 payload of m entries,
  padded, per rank (`payload_bytes`); every rank's payload summed into the dense bucket (`decode_into`).

`training/dct.py`'s DDP hook decides when tau is re-estimated and carries the residuals. On CPU the share and the
scan, the encoding and the decoding also run in C (`dp_threshold_native`: the same floats, positions and bytes).
"""
from __future__ import annotations

import math

import torch

from . import dp_threshold_native
from .wire import FP16_MAX

MAX_DELTA = dp_threshold_native.MAX_GAP  # largest index gap one uint16 delta carries (65,535; the C encoder's too)
GROUP_ROWS = 16  # over_threshold's grouping: entries i, i + n/16, i + 2n/16, ... share one maximum and minimum
SAMPLE_STRIDE = 64  # kth_largest's sample: every 64th entry


def add_mean_share(res: torch.Tensor, buf: torch.Tensor, world: int, out: torch.Tensor) -> torch.Tensor:
    """out = res + buf / world in one pass over the bucket (addcdiv), rounded as the division then the sum."""
    return torch.addcdiv(res, buf, torch.tensor(float(world), dtype=buf.dtype), out=out)


def keep_count(n: int, keep: float) -> int:
    """The target k of a bucket of n entries: max(1, floor(keep * n))."""
    return max(1, int(keep * n))


def drift_cap(k: int, drift: float) -> int:
    """The most entries one rank sends of a bucket whose target is k."""
    return max(k, int(drift * k))


def kth_largest(g: torch.Tensor, k: int) -> float:
    """The k-th largest |g|, exactly as `g.abs().kthvalue(n - k + 1)` gives it (a value of |g|, so exactly
    topk's), without selecting among all n: a bound from every SAMPLE_STRIDE-th entry (one that about
    twice k entries pass), the entries over it (`over_threshold`), and the k-th largest among those.
    Where fewer than k pass, or NaNs are present (kthvalue ranks them largest), it selects among all n."""
    n = g.numel()
    sample = g[::SAMPLE_STRIDE].abs()
    want = 2 * k // SAMPLE_STRIDE + 64  # sample entries over the bound: about twice k over it in all of g
    if n >= 16 * GROUP_ROWS * 1024 and want < sample.numel() and not math.isnan(float(g.max())):
        bound = float(sample.kthvalue(sample.numel() - want + 1).values)
        cand = g[over_threshold(g, bound)].abs()
        if cand.numel() >= k:
            return float(cand.kthvalue(cand.numel() - k + 1).values)
    mag = g.abs()
    return float(mag.kthvalue(n - k + 1).values)


def over_threshold(g: torch.Tensor, tau: float) -> torch.Tensor:
    """The sorted positions of `g`'s entries with |g| >= tau, exactly as `(g.abs() >= tau).nonzero()` gives
    them, without writing |g| when few entries qualify: viewed as GROUP_ROWS rows, the column maxima and minima
    (two vectorised passes) name the columns that may hold an entry (a column whose maximum is not under tau or
    whose minimum is not over -tau, so a column holding a NaN is searched), and only those columns are compared
    and searched. Row-major order over [rows, chosen columns] is already ascending position order, so nothing
    is sorted. Small tensors take the plain path."""
    n = g.numel()
    cols = n // GROUP_ROWS
    if cols < 1024:
        return (g.abs() >= tau).nonzero().squeeze(1)
    body = g[: GROUP_ROWS * cols].view(GROUP_ROWS, cols)
    hot = ((body.amax(dim=0) < tau) & (body.amin(dim=0) > -tau)).logical_not_().nonzero().squeeze(1)
    row, col = (body.index_select(1, hot).abs_() >= tau).nonzero(as_tuple=True)
    tail = (g[GROUP_ROWS * cols:].abs() >= tau).nonzero().squeeze(1) + GROUP_ROWS * cols
    return torch.cat([row * cols + hot[col], tail])


def encode(idx: torch.Tensor, vals: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sorted int64 indices and their values -> (uint16 deltas, fp16 values) with fillers, and where
    the real entries are among them."""
    gaps = torch.diff(idx, prepend=idx.new_zeros(1))
    fill = torch.clamp((gaps - 1) // MAX_DELTA, min=0)
    m = idx.numel() + int(fill.sum())
    real = torch.cumsum(fill + 1, 0) - 1  # where each real entry lands among the m
    deltas = torch.full((m,), MAX_DELTA, dtype=torch.int32, device=idx.device)
    deltas[real] = (gaps - MAX_DELTA * fill).to(torch.int32)
    out = torch.zeros(m, dtype=torch.float16, device=vals.device)
    out[real] = vals.clamp(-FP16_MAX, FP16_MAX).to(torch.float16)
    return deltas.to(torch.uint16), out, real


def payload_bytes(deltas: torch.Tensor, vals: torch.Tensor, m: int) -> torch.Tensor:
    """One uint8 payload of m entries (padding: delta 0, value 0): deltas, then values."""
    out = torch.zeros(4 * m, dtype=torch.uint8, device=vals.device)
    out[: 2 * deltas.numel()] = deltas.view(torch.uint8)
    out[2 * m: 2 * m + 2 * vals.numel()] = vals.view(torch.uint8)
    return out


def decode_into(out: torch.Tensor, payload: torch.Tensor, m: int) -> None:
    """Add a rank's payload of m (padded) entries into the dense `out`."""
    pos = torch.cumsum(payload[: 2 * m].view(torch.uint16).to(torch.int64), 0)
    out.index_add_(0, pos, payload[2 * m:].view(torch.float16).float())
