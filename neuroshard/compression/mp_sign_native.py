"""DCT-MP's sign codec (`mp_sign.sign_encode` / `sign_decode`) in C for float32 CPU tensors: the passes over every
entry of a run of equal-width shards done in one pass each, and the per-sample scale codes in one more. Only the
per-sample scale m itself (a mean or a max |x| for the 1-bit scopes) is left to PyTorch.

- `two_bit_scales`: scope `sign2`'s forward scale of each sample shard (`mp_sign._two_bit_scale`: the row's max
  |x|, its mean square, the outer level's count and the level sums, the sums in float64 as that function takes
  them), one read of the shard.
- `scale_codes`: from the per-sample scales m, each block's base (its largest finite m), each sample's scale code
  (`mp_sign._scale_codes`: exact comparisons with the base times the fixed code table or its midpoints), decoded
  scale and non-finite flag.
- `pack`: a run's body, the bit planes of every sample shard packed least significant bit first and its scale
  code after them (`mp_sign.sign_encode`'s layout): the sign bit (x >= 0), the magnitude bit (|x| >= 2 x scale),
  or the random rounding's bit (draw < x / scale + 1, against PyTorch's draws on [0, 2)), and the first sign
  bit of a sample shard sent as zeros (set) or as non-finite (clear).
- `unpack`: a run's body to floats, each entry +-1 (times 1 or OUTER_LEVEL on a 2-bit shard) times its decoded
  scale (the base times the code table's entry; 0 or NaN for the zero code), written into the decoded rows'
  columns.
- `uniform_0_2`: the random rounding's draws, PyTorch's own CPU generator advanced as `uniform_(0, 2)` advances it.

Each does PyTorch's arithmetic in PyTorch's order on the same floats (one division, one addition, one product,
each rounded once; comparisons as PyTorch makes them, NaN never set), so the bytes, floats and generator states
are those of the PyTorch path bit for bit (tested against it). `core.native` compiles the source the first time a
process needs it; `mp_sign` asks `usable` / `loaded` first and takes its PyTorch path where they say no. A call
whose tensors do not match the sizes it is given is refused (ValueError), never run: the kernels index raw memory.
"""
from __future__ import annotations

import ctypes

import torch

from ..core import native

SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <emmintrin.h>

static __m128 abs4(__m128 v) { return _mm_and_ps(v, _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff))); }
static double hsum2(__m128d a) { return _mm_cvtsd_f64(_mm_add_sd(a, _mm_unpackhi_pd(a, a))); }
static void add4(__m128d *acc, __m128 v) {  /* four floats into two float64 accumulators */
    acc[0] = _mm_add_pd(acc[0], _mm_cvtps_pd(v));
    acc[1] = _mm_add_pd(acc[1], _mm_cvtps_pd(_mm_movehl_ps(v, v)));
}

/* The forward scale of each of n shards of w columns of `rows` rows (row stride `stride` floats): out [rows, n].
   NaN for a shard holding NaN or inf (the PyTorch path's scale is then NaN too). */
void two_bit_scales(const float *x, int64_t stride, int64_t rows, int64_t n, int64_t w, float outer_level,
                    float tiny, float *out) {
    float *u = malloc(sizeof(float) * (w + 4));
    if (!u) { for (int64_t k = 0; k < rows * n; k++) out[k] = __builtin_nanf(""); return; }
    const __m128 fmax = _mm_set1_ps(3.4028234663852886e38f);
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t j = 0; j < n; j++) {
            const float *p = x + i * stride + j * w;
            __m128 top4 = _mm_setzero_ps(), ok4 = _mm_castsi128_ps(_mm_set1_epi32(-1));
            __m128 top4b = _mm_setzero_ps(), ok4b = ok4;  /* two chains: no max waits on the one before it */
            int64_t c = 0;
            for (; c + 8 <= w; c += 8) {
                __m128 a = abs4(_mm_loadu_ps(p + c)), b = abs4(_mm_loadu_ps(p + c + 4));
                ok4 = _mm_and_ps(ok4, _mm_cmple_ps(a, fmax));   /* false for NaN and inf */
                ok4b = _mm_and_ps(ok4b, _mm_cmple_ps(b, fmax));
                top4 = _mm_max_ps(top4, a);
                top4b = _mm_max_ps(top4b, b);
            }
            for (; c + 4 <= w; c += 4) {
                __m128 a = abs4(_mm_loadu_ps(p + c));
                ok4 = _mm_and_ps(ok4, _mm_cmple_ps(a, fmax));
                top4 = _mm_max_ps(top4, a);
            }
            top4 = _mm_max_ps(top4, top4b);  /* |x| >= 0 and finite where it counts: the order of maxima is free */
            ok4 = _mm_and_ps(ok4, ok4b);
            float t[4], top;
            _mm_storeu_ps(t, top4);
            top = t[0] > t[1] ? t[0] : t[1];
            top = top > t[2] ? top : t[2];
            top = top > t[3] ? top : t[3];
            int finite = _mm_movemask_ps(ok4) == 15;
            for (; c < w; c++) {
                float a = __builtin_fabsf(p[c]);
                finite &= a <= 3.4028234663852886e38f;
                top = a > top ? a : top;
            }
            if (!finite) { out[i * n + j] = __builtin_nanf(""); continue; }
            const float d = top > 0.0f ? top : 1.0f;
            const __m128 d4 = _mm_set1_ps(d);
            /* u = |x| / d stored, its squares and u summed; four float64 accumulators each (eight entries a step),
               so that no add waits on the one before it */
            __m128d s2[4] = {_mm_setzero_pd(), _mm_setzero_pd(), _mm_setzero_pd(), _mm_setzero_pd()};
            __m128d su[4] = {_mm_setzero_pd(), _mm_setzero_pd(), _mm_setzero_pd(), _mm_setzero_pd()};
            for (c = 0; c + 8 <= w; c += 8) {
                __m128 v0 = _mm_div_ps(abs4(_mm_loadu_ps(p + c)), d4);
                __m128 v1 = _mm_div_ps(abs4(_mm_loadu_ps(p + c + 4)), d4);
                _mm_storeu_ps(u + c, v0);
                _mm_storeu_ps(u + c + 4, v1);
                add4(s2, _mm_mul_ps(v0, v0));
                add4(s2 + 2, _mm_mul_ps(v1, v1));
                add4(su, v0);
                add4(su + 2, v1);
            }
            for (; c + 4 <= w; c += 4) {
                __m128 v = _mm_div_ps(abs4(_mm_loadu_ps(p + c)), d4);
                _mm_storeu_ps(u + c, v);
                add4(s2, _mm_mul_ps(v, v));
                add4(su, v);
            }
            double sum2 = (hsum2(s2[0]) + hsum2(s2[1])) + (hsum2(s2[2]) + hsum2(s2[3]));
            double sum_u = (hsum2(su[0]) + hsum2(su[1])) + (hsum2(su[2]) + hsum2(su[3]));
            for (; c < w; c++) {
                u[c] = __builtin_fabsf(p[c]) / d;
                sum2 += (double)(u[c] * u[c]);
                sum_u += (double)u[c];
            }
            const float mean = (float)(sum2 / (double)w);
            const __m128 mean4 = _mm_set1_ps(mean);
            __m128d so[4] = {_mm_setzero_pd(), _mm_setzero_pd(), _mm_setzero_pd(), _mm_setzero_pd()};
            __m128i count4 = _mm_setzero_si128();  /* outer entries per lane: a comparison's true is -1 */
            for (c = 0; c + 8 <= w; c += 8) {
                __m128 v0 = _mm_loadu_ps(u + c), v1 = _mm_loadu_ps(u + c + 4);
                __m128 o0 = _mm_cmpge_ps(_mm_mul_ps(v0, v0), mean4), o1 = _mm_cmpge_ps(_mm_mul_ps(v1, v1), mean4);
                add4(so, _mm_and_ps(o0, v0));
                add4(so + 2, _mm_and_ps(o1, v1));
                count4 = _mm_sub_epi32(_mm_sub_epi32(count4, _mm_castps_si128(o0)), _mm_castps_si128(o1));
            }
            for (; c + 4 <= w; c += 4) {
                __m128 v = _mm_loadu_ps(u + c), outer = _mm_cmpge_ps(_mm_mul_ps(v, v), mean4);
                add4(so, _mm_and_ps(outer, v));
                count4 = _mm_sub_epi32(count4, _mm_castps_si128(outer));
            }
            int32_t lanes[4];
            _mm_storeu_si128((__m128i *)lanes, count4);
            int64_t n_outer = (int64_t)lanes[0] + lanes[1] + lanes[2] + lanes[3];
            double sum_o = (hsum2(so[0]) + hsum2(so[1])) + (hsum2(so[2]) + hsum2(so[3]));
            for (; c < w; c++) {
                int outer = u[c] * u[c] >= mean;
                sum_o += outer ? (double)u[c] : 0.0;
                n_outer += outer;
            }
            double level = sum_u + (double)(outer_level - 1.0f) * sum_o;
            float den = (float)w + (outer_level * outer_level - 1.0f) * (float)n_outer;
            float s = top * (float)(level / (double)den);
            out[i * n + j] = (top > 0.0f && s == 0.0f) ? tiny : s;
        }
    }
    free(u);
}

/* PyTorch's CPU generator (mt19937; `Generator.get_state()`: the initial seed, words left, a seeded flag, the
   next word's index, then the 624 state words each in 8 bytes) advanced by n draws of `uniform_(0, 2)` on
   float32, written to out: each draw one tempered word w, (w mod 2^24) * 2^-23, as PyTorch computes it. */
#define MT_N 624
#define MT_M 397
static __m128i mt_mix(__m128i a, __m128i b, __m128i c) {  /* c ^ twist(a, b), four words */
    __m128i y = _mm_or_si128(_mm_and_si128(a, _mm_set1_epi32((int)0x80000000u)),
                             _mm_and_si128(b, _mm_set1_epi32(0x7fffffff)));
    __m128i odd = _mm_sub_epi32(_mm_setzero_si128(), _mm_and_si128(y, _mm_set1_epi32(1)));
    return _mm_xor_si128(_mm_xor_si128(c, _mm_srli_epi32(y, 1)), _mm_and_si128(odd, _mm_set1_epi32((int)0x9908b0dfu)));
}
static uint32_t mt_mix1(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t y = (a & 0x80000000u) | (b & 0x7fffffffu);
    return c ^ (y >> 1) ^ ((0u - (y & 1u)) & 0x9908b0dfu);
}
static void mt_twist(uint32_t *s) {  /* in place and in order, as mt19937's next_state: a later word reads an
                                        earlier one's new value, 227 or more words back */
    int i = 0;
    for (; i + 4 <= MT_N - MT_M; i += 4)
        _mm_storeu_si128((__m128i *)(s + i), mt_mix(_mm_loadu_si128((__m128i *)(s + i)),
                         _mm_loadu_si128((__m128i *)(s + i + 1)), _mm_loadu_si128((__m128i *)(s + i + MT_M))));
    for (; i < MT_N - MT_M; i++) s[i] = mt_mix1(s[i], s[i + 1], s[i + MT_M]);
    for (; i + 4 <= MT_N - 1; i += 4)
        _mm_storeu_si128((__m128i *)(s + i), mt_mix(_mm_loadu_si128((__m128i *)(s + i)),
                         _mm_loadu_si128((__m128i *)(s + i + 1)), _mm_loadu_si128((__m128i *)(s + i + MT_M - MT_N))));
    for (; i < MT_N - 1; i++) s[i] = mt_mix1(s[i], s[i + 1], s[i + MT_M - MT_N]);
    s[MT_N - 1] = mt_mix1(s[MT_N - 1], s[0], s[MT_M - 1]);
}
static float mt_draw(uint32_t y) {
    y ^= y >> 11; y ^= (y << 7) & 0x9d2c5680u; y ^= (y << 15) & 0xefc60000u; y ^= y >> 18;
    return (float)(y & 0xffffffu) * (1.0f / 8388608.0f);
}
void uniform_0_2(uint8_t *state, float *out, int64_t n) {
    uint32_t s[MT_N];
    int32_t left;
    uint64_t next64, word;
    memcpy(&left, state + 8, 4);
    memcpy(&next64, state + 16, 8);
    for (int i = 0; i < MT_N; i++) { memcpy(&word, state + 24 + 8 * i, 8); s[i] = (uint32_t)word; }
    int64_t next = (int64_t)next64, k = 0;
    const __m128 unit = _mm_set1_ps(1.0f / 8388608.0f);
    while (k < n) {
        if (left == 1) {  /* this draw takes left to 0: a fresh block of words */
            mt_twist(s);
            left = MT_N + 1;
            next = 0;
        }
        int64_t m = left - 1 < n - k ? left - 1 : n - k, t = 0;
        for (; t + 4 <= m; t += 4) {
            __m128i y = _mm_loadu_si128((const __m128i *)(s + next + t));
            y = _mm_xor_si128(y, _mm_srli_epi32(y, 11));
            y = _mm_xor_si128(y, _mm_and_si128(_mm_slli_epi32(y, 7), _mm_set1_epi32((int)0x9d2c5680u)));
            y = _mm_xor_si128(y, _mm_and_si128(_mm_slli_epi32(y, 15), _mm_set1_epi32((int)0xefc60000u)));
            y = _mm_xor_si128(y, _mm_srli_epi32(y, 18));
            y = _mm_and_si128(y, _mm_set1_epi32(0xffffff));
            _mm_storeu_ps(out + k + t, _mm_mul_ps(_mm_cvtepi32_ps(y), unit));
        }
        for (; t < m; t++) out[k + t] = mt_draw(s[next + t]);
        next += m; left -= (int32_t)m; k += m;
    }
    memcpy(state + 8, &left, 4);
    next64 = (uint64_t)next;
    memcpy(state + 16, &next64, 8);
    for (int i = 0; i < MT_N; i++) { word = s[i]; memcpy(state + 24 + 8 * i, &word, 8); }
}

/* Bits of p[c] for c < m (m <= 8) as one byte, least significant first. */
static uint8_t bits8(const float *p, const float *dr, int64_t m, int mode, float lim, float s, float div,
                     uint8_t *mag) {
    uint8_t sign = 0, mg = 0;
    if (m == 8) {
        __m128 v0 = _mm_loadu_ps(p), v1 = _mm_loadu_ps(p + 4);
        if (mode == 2) {
            __m128 one = _mm_set1_ps(1.0f), d4 = _mm_set1_ps(div);
            __m128 p0 = s > 0.0f ? _mm_add_ps(_mm_div_ps(v0, d4), one) : one;
            __m128 p1 = s > 0.0f ? _mm_add_ps(_mm_div_ps(v1, d4), one) : one;
            sign = (uint8_t)(_mm_movemask_ps(_mm_cmplt_ps(_mm_loadu_ps(dr), p0)) |
                             _mm_movemask_ps(_mm_cmplt_ps(_mm_loadu_ps(dr + 4), p1)) << 4);
        } else {
            __m128 z = _mm_setzero_ps();
            sign = (uint8_t)(_mm_movemask_ps(_mm_cmpge_ps(v0, z)) | _mm_movemask_ps(_mm_cmpge_ps(v1, z)) << 4);
            if (mode == 1) {
                __m128 l4 = _mm_set1_ps(lim);
                mg = (uint8_t)(_mm_movemask_ps(_mm_cmpge_ps(abs4(v0), l4)) |
                               _mm_movemask_ps(_mm_cmpge_ps(abs4(v1), l4)) << 4);
            }
        }
    } else {
        for (int64_t c = 0; c < m; c++) {
            int set;
            if (mode == 2) set = dr[c] < (s > 0.0f ? p[c] / div + 1.0f : 1.0f);
            else set = p[c] >= 0.0f;
            sign |= (uint8_t)(set << c);
            if (mode == 1) mg |= (uint8_t)((__builtin_fabsf(p[c]) >= lim) << c);
        }
    }
    *mag = mg;
    return sign;
}

/* A run's body [blocks * r, n, planes * nb + 1]: per sample shard its packed planes, then its scale code.
   mode 0: one plane, x >= 0; mode 1: that and |x| >= (scale * (1 + outer_level)) / 2;
   mode 2: one plane, draw < x / scale + 1 (scale > 0) or draw < 1, the draws [blocks, n, r, w]. */
void pack(const float *x, int64_t stride, int64_t blocks, int64_t r, int64_t n, int64_t w, int mode,
          const float *scale, const uint8_t *q, const uint8_t *bad, const float *draws, float outer_level,
          uint8_t zero_code, uint8_t *body) {
    const int64_t nb = (w + 7) / 8, planes = mode == 1 ? 2 : 1, e = planes * nb + 1;
    for (int64_t b = 0; b < blocks; b++) {
        for (int64_t i = 0; i < r; i++) {
            const int64_t row = b * r + i;
            for (int64_t j = 0; j < n; j++) {
                const float *p = x + row * stride + j * w;
                const int64_t k = row * n + j;
                uint8_t *o = body + k * e;
                const float s = scale[k], lim = (s * (1.0f + outer_level)) / 2.0f, div = s > 0.0f ? s : 1.0f;
                const float *dr = mode == 2 ? draws + ((b * n + j) * r + i) * w : 0;
                for (int64_t byte = 0; byte < nb; byte++) {
                    const int64_t c = byte * 8, m = w - c < 8 ? w - c : 8;
                    uint8_t mag;
                    o[byte] = bits8(p + c, dr ? dr + c : 0, m, mode, lim, s, div, &mag);
                    if (mode == 1) o[nb + byte] = mag;
                }
                if (bad[k]) o[0] &= (uint8_t)0xfe;
                else if (q[k] == zero_code) o[0] |= 1;
                o[e - 1] = q[k];
            }
        }
    }
}

/* Per block and shard of m [blocks, r, n] (>= 0, or NaN / inf): the base, the largest finite m of the block's rows
   (+0.0 where none is positive), into base [blocks, n]; per sample its code q, scale s = base * table[q] and flag bad
   (m NaN or inf). round_up: q is the largest code with base * table[q] >= m (the smallest scale >= m); else the count
   of midpoints with base * mids[q] > m (the nearest code in octaves). A zero, NaN or inf m gets zero_code and s 0.
   k codes (table [k], mids [k - 1]); the products are compared exactly, as PyTorch's searchsorted compares them. */
void scale_codes(const float *m, int64_t blocks, int64_t r, int64_t n, int round_up, const float *table,
                 const float *mids, int64_t k, uint8_t zero_code, float *base, uint8_t *q, float *s, uint8_t *bad) {
    float *p = malloc(sizeof(float) * (size_t)(k > 0 ? k : 1));
    if (!p) { memset(q, zero_code, (size_t)(blocks * r * n)); memset(s, 0, sizeof(float) * (size_t)(blocks * r * n));
              memset(bad, 1, (size_t)(blocks * r * n)); memset(base, 0, sizeof(float) * (size_t)(blocks * n)); return; }
    const float *points = round_up ? table : mids;
    const int64_t np = round_up ? k : k - 1;
    for (int64_t b = 0; b < blocks; b++) {
        for (int64_t j = 0; j < n; j++) {
            float top = 0.0f;
            for (int64_t i = 0; i < r; i++) {
                const float v = m[(b * r + i) * n + j];
                if (v - v == 0.0f && v > top) top = v;  /* finite and larger */
            }
            base[b * n + j] = top;
            for (int64_t t = 0; t < np; t++) p[t] = top * points[t];
            for (int64_t i = 0; i < r; i++) {
                const int64_t at = (b * r + i) * n + j;
                const float v = m[at];
                const int finite = v - v == 0.0f;
                bad[at] = (uint8_t)!finite;
                if (!finite || !(v > 0.0f)) { q[at] = zero_code; s[at] = 0.0f; continue; }
                int64_t lo = 0, hi = np;  /* the products fall with t: count those >= v (round up) or > v */
                while (lo < hi) {
                    const int64_t mid = (lo + hi) / 2;
                    if (round_up ? p[mid] >= v : p[mid] > v) lo = mid + 1; else hi = mid;
                }
                int64_t code = round_up ? lo - 1 : lo;
                code = code < 0 ? 0 : code > k - 1 ? k - 1 : code;
                q[at] = (uint8_t)code;
                s[at] = top * table[code];
            }
        }
    }
    free(p);
}

/* A run's body (row stride `bstride` bytes; per sample shard `planes` planes and a code) -> out's columns
   (row stride `ostride` floats): the sign table's +-1 of each bit, times the level table's 1 or outer level
   where there is a magnitude plane, times the shard's scale: base[j] * table[code], 0 for zero_code with the
   first sign bit set and NaN with it clear (sent as zeros / as non-finite). Tables: [256, 8] floats, a byte's
   8 bits. */
void unpack(const uint8_t *body, int64_t bstride, int64_t rows, int64_t n, int64_t w, int planes,
            const float *base, const float *table, uint8_t zero_code, const float *signs, const float *levels,
            float *out, int64_t ostride) {
    const int64_t nb = (w + 7) / 8, e = planes * nb + 1;
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t j = 0; j < n; j++) {
            const uint8_t *o = body + i * bstride + j * e;
            float *dst = out + i * ostride + j * w;
            const uint8_t code = o[e - 1];
            const float s = code != zero_code ? base[j] * table[code] : (o[0] & 1) ? 0.0f : __builtin_nanf("");
            const __m128 s4 = _mm_set1_ps(s);
            for (int64_t byte = 0; byte < nb; byte++) {
                const float *sg = signs + 8 * o[byte], *lv = planes == 2 ? levels + 8 * o[nb + byte] : 0;
                const int64_t c = byte * 8;
                if (w - c >= 8) {
                    __m128 v0 = _mm_loadu_ps(sg), v1 = _mm_loadu_ps(sg + 4);
                    if (lv) { v0 = _mm_mul_ps(v0, _mm_loadu_ps(lv)); v1 = _mm_mul_ps(v1, _mm_loadu_ps(lv + 4)); }
                    _mm_storeu_ps(dst + c, _mm_mul_ps(v0, s4));
                    _mm_storeu_ps(dst + c + 4, _mm_mul_ps(v1, s4));
                } else {
                    for (int64_t t = 0; c + t < w; t++) dst[c + t] = (lv ? sg[t] * lv[t] : sg[t]) * s;
                }
            }
        }
    }
}
"""

_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
SIGNATURES = {
    "two_bit_scales": (None, [_P, _I, _I, _I, _I, _F, _F, _P]),
    "pack": (None, [_P, _I, _I, _I, _I, _I, ctypes.c_int, _P, _P, _P, _P, _F, ctypes.c_uint8, _P]),
    "unpack": (None, [_P, _I, _I, _I, _I, ctypes.c_int, _P, _P, ctypes.c_uint8, _P, _P, _P, _I]),
    "scale_codes": (None, [_P, _I, _I, _I, ctypes.c_int, _P, _P, _I, ctypes.c_uint8, _P, _P, _P, _P]),
    "uniform_0_2": (None, [_P, _P, _I]),
}


def _kernels():
    return native.load("sign_codec", SOURCE, SIGNATURES)


def loaded() -> bool:
    """Whether the kernels load here (compiled on the first call)."""
    return _kernels() is not None


def usable(x: torch.Tensor) -> bool:
    """Whether the C encoder takes `x`: [rows, columns] float32 on CPU with contiguous rows, and the kernels load."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2
            and (x.shape[1] <= 1 or x.stride(1) == 1) and loaded())


def _require(ok: bool, what: str) -> None:
    """The kernels index raw memory: a call whose tensors do not match its sizes is refused, never run."""
    if not ok:
        raise ValueError(f"mp_sign_native: {what}")


def _is(t: torch.Tensor | None, shape: tuple, dtype: torch.dtype) -> bool:
    return t is not None and t.device.type == "cpu" and t.dtype == dtype and tuple(t.shape) == tuple(shape)


def _columns(x: torch.Tensor, start: int, n: int, w: int) -> None:
    _require(usable(x) and start >= 0 and n >= 0 and w >= 1 and start + n * w <= x.shape[1],
             f"columns {start} + {n} x {w} of a {tuple(x.shape)} {x.dtype} {x.device.type} tensor")


def two_bit_scales(x: torch.Tensor, start: int, n: int, w: int, outer_level: float, tiny: float) -> torch.Tensor:
    """`mp_sign._two_bit_scale` of the n shards of w columns from column `start` of `x` [rows, *] ([rows, n])."""
    _columns(x, start, n, w)
    rows = x.shape[0]
    out = torch.empty(rows, n)
    if rows and n:
        _kernels().two_bit_scales(x.data_ptr() + 4 * start, x.stride(0), rows, n, w, outer_level, tiny, out.data_ptr())
    return out


def pack(x: torch.Tensor, start: int, blocks: int, n: int, w: int, mode: int, scale: torch.Tensor, q: torch.Tensor,
         bad: torch.Tensor, draws: torch.Tensor | None, outer_level: float, zero_code: int) -> torch.Tensor:
    """A run's body [blocks, rows / blocks, n * e] uint8 (e = planes * ceil(w / 8) + 1): see `pack` in SOURCE.
    scale, q, bad: [blocks, rows / blocks, n] (float32, uint8, bool); draws [blocks, n, rows / blocks, w] (mode 2)."""
    _columns(x, start, n, w)
    rows = x.shape[0]
    _require(mode in (0, 1, 2) and blocks >= 1 and rows % blocks == 0, f"mode {mode}, {rows} rows in {blocks} blocks")
    r, e = rows // blocks, (2 if mode == 1 else 1) * ((w + 7) // 8) + 1
    _require(_is(scale, (blocks, r, n), torch.float32) and _is(q, (blocks, r, n), torch.uint8)
             and _is(bad, (blocks, r, n), torch.bool), "scale, codes and flags must be [blocks, rows / blocks, n]")
    _require(mode != 2 or _is(draws, (blocks, n, r, w), torch.float32), "draws must be [blocks, n, rows / blocks, w]")
    body = torch.empty(blocks, r, n * e, dtype=torch.uint8)
    scale, q, bad = scale.contiguous(), q.contiguous(), bad.contiguous().view(torch.uint8)
    if mode == 2:
        draws = draws.contiguous()
    if rows and n:
        _kernels().pack(x.data_ptr() + 4 * start, x.stride(0), blocks, r, n, w, mode, scale.data_ptr(), q.data_ptr(),
                        bad.data_ptr(), draws.data_ptr() if mode == 2 else None, outer_level, zero_code,
                        body.data_ptr())
    return body


def scale_codes(m: torch.Tensor, round_up: bool, table: torch.Tensor, mids: torch.Tensor, zero_code: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`mp_sign`'s bases, codes, scales and non-finite flags of per-sample scales m [blocks, r, n]: (base [blocks, n],
    q [blocks, r, n] uint8, s [blocks, r, n], bad [blocks, r, n] bool), as `mp_sign._code_run` gives them (its base,
    then `_scale_codes`; see `scale_codes` in SOURCE)."""
    k = table.numel()
    _require(m.device.type == "cpu" and m.dtype == torch.float32 and m.dim() == 3 and _is(table, (k,), torch.float32)
             and _is(mids, (k - 1,), torch.float32) and 1 <= k <= 255 and 0 <= zero_code <= 255 and k <= zero_code,
             "m must be [blocks, rows, n] float32 and the tables [k] and [k - 1] float32")
    blocks, r, n = m.shape
    m, table, mids = m.contiguous(), table.contiguous(), mids.contiguous()
    base, s = torch.empty(blocks, n), torch.empty(blocks, r, n)
    q, bad = torch.empty(blocks, r, n, dtype=torch.uint8), torch.empty(blocks, r, n, dtype=torch.bool)
    if m.numel() or base.numel():
        _kernels().scale_codes(m.data_ptr(), blocks, r, n, int(round_up), table.data_ptr(), mids.data_ptr(), k,
                               zero_code, base.data_ptr(), q.data_ptr(), s.data_ptr(), bad.data_ptr())
    return base, q, s, bad


def unpack(run: torch.Tensor, n: int, w: int, planes: int, base: torch.Tensor, table: torch.Tensor, zero_code: int,
           signs: torch.Tensor, levels: torch.Tensor, out: torch.Tensor, start: int) -> None:
    """Decode a run's bytes `run` [rows, >= n * e] (a row slice of the body; its rows may be strided) into `out`'s
    columns start .. start + n * w (out: [rows, *] float32, contiguous rows); base [n] float32, the run's shards'
    bases; table: the code scales (`mp_sign.CODE_SCALES`, float32, zero_code entries); signs and levels: what each
    byte's 8 bits decode to ([256, 8] float32, `mp_sign._SIGNS` and `_LEVELS`)."""
    rows, e = run.shape[0], planes * ((w + 7) // 8) + 1
    _require(run.device.type == "cpu" and run.dtype == torch.uint8 and run.dim() == 2 and planes in (1, 2)
             and n >= 0 and w >= 1 and (run.shape[1] == 0 or run.stride(1) == 1) and run.shape[1] >= n * e,
             f"a run of {n} x {planes}-plane shards of width {w} in {tuple(run.shape)} {run.dtype} bytes")
    _require(base.device.type == "cpu" and base.dtype == torch.float32 and tuple(base.shape) == (n,)
             and 0 <= zero_code <= 255 and _is(table, (zero_code,), torch.float32) and table.is_contiguous()
             and _is(signs, (256, 8), torch.float32) and _is(levels, (256, 8), torch.float32)
             and signs.is_contiguous() and levels.is_contiguous(),
             "base must be [n] float32, the code table [zero_code] and the bit tables [256, 8] float32")
    _require(out.shape[0] == rows, f"{rows} rows of bytes against {out.shape[0]} to decode into")
    _columns(out, start, n, w)
    base = base.contiguous()
    if rows and n:
        _kernels().unpack(run.data_ptr(), run.stride(0), rows, n, w, planes, base.data_ptr(), table.data_ptr(),
                          zero_code, signs.data_ptr(), levels.data_ptr(), out.data_ptr() + 4 * start, out.stride(0))


MT_STATE_BYTES = 5056  # PyTorch's CPU generator state (`Generator.get_state()`): its layout is read in SOURCE


def uniform_0_2(outs: list[torch.Tensor], generator: torch.Generator) -> bool:
    """Fill each tensor of `outs` in turn as `out.uniform_(0, 2, generator=generator)` does, the same floats and the
    generator left in the same state (tested), in one pass of tempering instead of PyTorch's element-by-element
    loop; False (nothing drawn) where it cannot: not contiguous float32 CPU tensors, a generator that is not
    PyTorch's CPU mt19937, a state whose counters it does not recognize, or no compiled kernels. Reading, advancing
    and writing back the state is not one step under the generator's lock, as `uniform_` is: the generator must not
    be drawn from by another thread meanwhile (DCT-MP's is its layout's own, used by the rank's backward only)."""
    if generator.device.type != "cpu" or not loaded() or not all(
            t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() for t in outs):
        return False
    state = generator.get_state()
    if state.numel() != MT_STATE_BYTES:
        return False
    left, seeded, nxt = (int(state[8:12].view(torch.int32)), int(state[12:16].view(torch.int32)),
                         int(state[16:24].view(torch.int64)))
    if seeded != 1 or not 1 <= left <= 624 or not 0 <= nxt <= 625 - left:  # each draw then reads words 0..623
        return False
    for t in outs:
        if t.numel():
            _kernels().uniform_0_2(state.data_ptr(), t.data_ptr(), t.numel())
    generator.set_state(state)
    return True

