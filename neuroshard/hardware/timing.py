"""Timing on hardware: median wall time of a callable (CUDA events on GPU, perf_counter on CPU), with
the last-level cache flushed before every timed iteration (DESIGN.md §3.1).

The flush touches a buffer of twice the last-level cache, capped at `MAX_FLUSH_BYTES`: a cloud VM
may report its whole host's L3, far more than its own share of it, and touching twice that before
every iteration would slow collection several-fold and flush nothing more (docs/findings.md). The
flush runs outside the timed region either way.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def _cache_bytes(device: str) -> int:
    if device == "cuda":
        return int(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 50 << 20))
    try:
        text = open("/sys/devices/system/cpu/cpu0/cache/index3/size").read().strip()
        return int(text.rstrip("K")) * 1024 if text.endswith("K") else int(text)
    except (OSError, ValueError):
        return 32 << 20


MAX_FLUSH_BYTES = 128 << 20


def flush_bytes(device: str) -> int:
    return min(2 * _cache_bytes(device), MAX_FLUSH_BYTES)


class CacheFlusher:
    """Touches a buffer twice the last-level cache (at most 128 MiB) so every timed iteration starts cold."""

    def __init__(self, device: str):
        self.buf = torch.zeros(flush_bytes(device) // 4, device=device)

    def __call__(self) -> None:
        self.buf.add_(1.0)


def median_ms(fn: Callable[[], None], device: str, warmup: int, iters: int,
              flush: Callable[[], None] | None = None) -> float:
    """Median wall time of `fn` in ms (CUDA events on GPU, perf_counter on CPU)."""
    for _ in range(warmup):
        fn()
    times = []
    cuda = device == "cuda"
    for _ in range(iters):
        if flush is not None:
            flush()
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)

