"""DCT-DP's share and threshold scan fused into one pass over the bucket, in C, for CPU buckets.

`training/dct.py` computes a bucket's g = residual + bucket / world_size (`add_mean_share`) and then the positions
of |g| >= tau (`over_threshold`): three or more passes over the whole bucket in PyTorch. `share_select` does both
in one pass (SSE2: four entries a step, divide, add, store, compare, and the rare positions picked from the
comparison's mask), and gives the same floats and the same positions bit for bit (the division, then the sum, each
rounded as PyTorch rounds them; NaN never qualifies; tested against the PyTorch path). On one thread at the `mlperf`
shape (2.04M entries) it takes about 0.4 of their time.

The C source below is compiled by `core.native` the first time a process needs it (nothing compiled is kept on
disk). Where that cannot be done here, or the tensors are not contiguous float32 CPU tensors, `share_select`
returns None and the caller takes the PyTorch path (the same results).
"""
from __future__ import annotations

import ctypes

import torch

from ..core import native

SOURCE = r"""
#include <stdint.h>
#include <emmintrin.h>
/* g = res + buf / world (res NULL: g = buf / world) and the ascending positions of |g| >= tau, in one pass.
   Returns how many qualify; writes at most cap of their positions. */
int64_t share_select(const float *buf, const float *res, float world, float tau, float *g, int64_t n,
                     int64_t *idx, int64_t cap) {
    int64_t i = 0, c = 0;
    const __m128 w = _mm_set1_ps(world), t = _mm_set1_ps(tau);
    const __m128 absmask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
    for (; i + 4 <= n; i += 4) {
        __m128 v = _mm_div_ps(_mm_loadu_ps(buf + i), w);
        if (res) v = _mm_add_ps(_mm_loadu_ps(res + i), v);
        _mm_storeu_ps(g + i, v);
        int m = _mm_movemask_ps(_mm_cmpge_ps(_mm_and_ps(v, absmask), t));  /* NaN compares false */
        while (m) {
            if (c < cap) idx[c] = i + __builtin_ctz(m);
            c++;
            m &= m - 1;
        }
    }
    for (; i < n; i++) {
        float v = buf[i] / world;
        if (res) v = res[i] + v;
        g[i] = v;
        if ((v < 0 ? -v : v) >= tau) {
            if (c < cap) idx[c] = i;
            c++;
        }
    }
    return c;
}
"""

SIGNATURES = {"share_select": (ctypes.c_int64, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float, ctypes.c_float,
                                                  ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64])}


def _function():
    kernels = native.load("share_select", SOURCE, SIGNATURES)
    return None if kernels is None else kernels.share_select


def _fits(t: torch.Tensor | None, n: int) -> bool:
    return t is None or (t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()
                         and t.numel() == n)


def share_select(buf: torch.Tensor, res: torch.Tensor | None, world: int, tau: float, out: torch.Tensor,
                 cap: int) -> torch.Tensor | None:
    """Write res + buf / world (buf / world without res) into `out` and return the ascending int64 positions of
    its entries with |value| >= tau, exactly as `add_mean_share` (or torch.div) and `over_threshold` give them;
    None where the fused pass cannot run here (nothing written then) or more than `cap` entries qualify (the
    room it keeps for positions; `out` is written then, and the caller's PyTorch path writes it again: a rare,
    large drift of tau, which that path handles)."""
    n = buf.numel()
    if n == 0 or not all(_fits(t, n) for t in (buf, res, out)):
        return None
    fn = _function()
    if fn is None:
        return None
    idx = torch.empty(max(1, cap), dtype=torch.int64)
    count = fn(buf.data_ptr(), None if res is None else res.data_ptr(), float(world), float(tau), out.data_ptr(),
               n, idx.data_ptr(), idx.numel())
    return idx[:count] if count <= idx.numel() else None
