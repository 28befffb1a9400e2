"""DCT-DP's threshold codec (`dp_threshold`) in C, for CPU buckets: the share and threshold scan fused into one
pass, the encoding of the entries that go out, and the decoding of every rank's payload.

- `share_select`: a bucket's g = residual + bucket / world_size (`dp_threshold.add_mean_share`) and then the
  positions of |g| >= tau (`dp_threshold.over_threshold`) take three or more passes over the whole bucket in
  PyTorch. This does both in one pass (SSE2: four entries a step, divide, add, store, compare, and the rare
  positions picked from the comparison's mask) and gives the same floats and the same positions bit for bit (the
  division, then the sum, each rounded as PyTorch rounds them; NaN never qualifies; tested against the PyTorch
  path).
- `encode`: `dp_threshold.encode`'s wire (16-bit index gaps with filler entries, fp16 values clamped to fp16's
  largest) of the positions it found, with the values read from g: one pass over the positions instead of a dozen
  small PyTorch operations. fp16 is rounded to nearest even, as PyTorch's conversion rounds (tested against it).
- `decode`: every rank's payload added into the dense bucket, as `dp_threshold.decode_into` adds them.

The C source below is compiled by `core.native` the first time a process needs it (nothing compiled is kept on
disk). Where that cannot be done here, or the tensors are not contiguous float32 CPU tensors, these functions
return None (or False) and the caller takes the PyTorch path (the same results).
"""
from __future__ import annotations

import ctypes

import torch

from ..core import native

SOURCE = r"""
#include <stdint.h>
#include <string.h>
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

/* float -> fp16 bits, rounded to nearest even, for |f| <= 65504 (the caller clamps; no NaN reaches here). */
static uint16_t fp16_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t a = x & 0x7fffffffu;
    if (a >= 0x38800000u) {                      /* 2^-14 and up: a normal fp16 */
        uint32_t r = a - 0x38000000u;              /* the exponent rebiased from 127 to 15 */
        r += 0x0fffu + ((r >> 13) & 1u);           /* to nearest even on the 13 bits dropped */
        return (uint16_t)(sign | (r >> 13));
    }
    /* subnormal fp16 or zero: |f| in units of 2^-24 (exact: a power-of-two scaling), rounded to nearest even by
       adding and taking away 2^23; 1024 units is the smallest normal, whose bits it also is */
    volatile float t = __builtin_fabsf(f) * 16777216.0f + 8388608.0f;
    return (uint16_t)(sign | (uint16_t)(t - 8388608.0f));
}

/* The k ascending positions idx into g -> m entries (returned; at most cap written): uint16 gaps (a gap over 65,535
   bridged by filler entries of gap 65,535 and value 0), fp16 bits of the values clamped to +-65504, and where each
   position's entry lies among the m. Returns -1 where cap is too small, -2 where the positions are not ascending
   positions of g's n entries (nothing is read outside g). */
int64_t encode(const int64_t *idx, int64_t k, const float *g, int64_t n, uint16_t *deltas, uint16_t *vals,
               int64_t *real, int64_t cap) {
    int64_t m = 0, prev = 0;
    for (int64_t i = 0; i < k; i++) {
        if (idx[i] < prev + (i > 0) || idx[i] >= n) return -2;
        int64_t gap = idx[i] - prev;
        prev = idx[i];
        while (gap > 65535) {
            if (m >= cap) return -1;
            deltas[m] = 65535; vals[m] = 0; m++;
            gap -= 65535;
        }
        if (m >= cap) return -1;
        float v = g[idx[i]];
        v = v > 65504.0f ? 65504.0f : v < -65504.0f ? -65504.0f : v;
        deltas[m] = (uint16_t)gap; vals[m] = fp16_bits(v); real[i] = m; m++;
    }
    return m;
}

/* fp16 bits -> float, exactly (every fp16 value is a float). */
static float fp16_value(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t bits;
    if (e == 0) {  /* zero or subnormal: m units of 2^-24, exact in float */
        float f = (float)m * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    bits = sign | (e == 31 ? 0x7f800000u | (m << 13) : ((e + 112u) << 23) | (m << 13));
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* out[0:n] = 0, then each of the parts payloads (m entries each: m uint16 gaps, then m fp16 values) added in:
   entry j of a part at the running sum of its gaps, in order, as index_add_ adds them. Returns 0, or -1 (out
   left zeroed) where a position would pass n: nothing is written outside out. */
int64_t decode(float *out, int64_t n, const uint8_t *const *parts, int64_t nparts, int64_t m) {
    memset(out, 0, sizeof(float) * (size_t)n);
    for (int64_t r = 0; r < nparts; r++) {
        const uint8_t *p = parts[r];
        int64_t pos = 0;
        for (int64_t j = 0; j < m; j++) {  /* every position checked before any is written */
            uint16_t gap;
            memcpy(&gap, p + 2 * j, 2);
            pos += gap;
            if (pos >= n) { memset(out, 0, sizeof(float) * (size_t)n); return -1; }
        }
        pos = 0;
        for (int64_t j = 0; j < m; j++) {
            uint16_t gap, h;
            memcpy(&gap, p + 2 * j, 2);
            memcpy(&h, p + 2 * m + 2 * j, 2);
            pos += gap;
            out[pos] += fp16_value(h);
        }
    }
    return 0;
}
"""

_P, _I = ctypes.c_void_p, ctypes.c_int64
SIGNATURES = {"share_select": (_I, [_P, _P, ctypes.c_float, ctypes.c_float, _P, _I, _P, _I]),
              "encode": (_I, [_P, _I, _P, _I, _P, _P, _P, _I]),
              "decode": (_I, [_P, _I, _P, _I, _I])}


def _kernels():
    return native.load("dp_codec", SOURCE, SIGNATURES)


def loaded() -> bool:
    """Whether the kernels load here (compiled on the first call)."""
    return _kernels() is not None


def _fits(t: torch.Tensor | None, n: int) -> bool:
    return t is None or (t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()
                         and t.numel() == n)


def share_select(buf: torch.Tensor, res: torch.Tensor | None, world: int, tau: float, out: torch.Tensor,
                 cap: int) -> torch.Tensor | None:
    """Write res + buf / world (buf / world without res) into `out` and return the ascending int64 positions of
    its entries with |value| >= tau, exactly as `dp_threshold.add_mean_share` (or torch.div) and
    `dp_threshold.over_threshold` give them; None where the fused pass cannot run here (nothing written then).
    `out` may be `res` itself (each entry is read before it is written). Where more than `cap` entries qualify
    (the room it keeps for positions: a rare, large drift of tau), `out` is written and the positions come from a
    second, plain pass over it."""
    n = buf.numel()
    if n == 0 or not all(_fits(t, n) for t in (buf, res, out)):
        return None
    if not loaded():
        return None
    idx = torch.empty(max(1, cap), dtype=torch.int64)
    count = _kernels().share_select(buf.data_ptr(), None if res is None else res.data_ptr(), float(world), float(tau),
                                    out.data_ptr(), n, idx.data_ptr(), idx.numel())
    if count > idx.numel():
        return (out.abs() >= tau).nonzero().squeeze(1)  # NaN never qualifies, as in the fused pass
    return idx[:count]


MAX_GAP = 65535  # the largest index gap one uint16 carries (`dp_threshold.MAX_DELTA`, and `encode` in SOURCE)


def encode(idx: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """`dp_threshold.encode(idx, g[idx])` (uint16 gaps, fp16 values, where the real entries lie among them) bit
    for bit from the ascending positions `idx` into the flat float32 `g`; None where the kernels cannot run here,
    the tensors are not contiguous int64 / float32 CPU tensors, or `idx` is not ascending positions of g (nothing is
    read then)."""
    k = idx.numel()
    if not (loaded() and idx.device.type == "cpu" and idx.dtype == torch.int64 and idx.dim() == 1
            and idx.is_contiguous() and g.dim() == 1 and _fits(g, g.numel())):
        return None
    cap = k + g.numel() // MAX_GAP + 1  # no more fillers than 65,535-wide gaps fit in g
    deltas = torch.empty(cap, dtype=torch.uint16)
    vals = torch.empty(cap, dtype=torch.float16)
    real = torch.empty(k, dtype=torch.int64)
    m = _kernels().encode(idx.data_ptr(), k, g.data_ptr(), g.numel(), deltas.data_ptr(), vals.data_ptr(),
                          real.data_ptr(), cap)
    if m < 0:
        return None
    return deltas[:m], vals[:m], real


def decode(out: torch.Tensor, parts: list[torch.Tensor], m: int) -> bool:
    """`out.zero_()` then `dp_threshold.decode_into(out, part, m)` for each part in order, the same floats, in one
    call that lets go of Python's lock while it runs; False (nothing written) where it cannot run here or the
    tensors are not what it takes. A payload whose positions pass the end of `out` raises ValueError, as
    index_add_ raises IndexError (out is left zeroed)."""
    n = out.numel()
    if not (loaded() and out.dim() == 1 and _fits(out, n) and m >= 0 and all(
            p.device.type == "cpu" and p.dtype == torch.uint8 and p.dim() == 1 and p.is_contiguous()
            and p.numel() == 4 * m for p in parts)):
        return False
    ptrs = (ctypes.c_void_p * max(1, len(parts)))(*[p.data_ptr() for p in parts])
    if _kernels().decode(out.data_ptr(), n, ptrs, len(parts), m) < 0:
        raise ValueError(f"DCT-DP payload: an entry's position passes the bucket's {n} entries")
    return True
