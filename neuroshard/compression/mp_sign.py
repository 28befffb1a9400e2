"""DCT-MP's sign codec (DESIGN.md §5): scopes `sign` and `sign2` (`--mp_scope`, `sign2` the default) of the
compressed pooled-embedding all-to-all, used by training (`training/dlrm.py`'s `_CompressedAllToAll`).

Scope `sign`, one bit an entry: every entry of every column shard goes on the wire as one bit, with one 8-bit
scale code per sample and shard; the receiver gets scale * (+1 | -1) for every column, so every table keeps all
its columns and every table.table dot product survives (as the dot product of the two sign vectors, times both
scales). Forward: the bit is the entry's sign and the scale the shard's mean |x|, the scale that minimises the
squared error of `scale * sign(x)`. Backward: the received entries' gradients, each rounded at random to +M or -M
with M >= the shard's max |g| and P(+M) = (1 + g / M) / 2, so the decoded gradient is unbiased (E = g); the sender
takes it as its pooled embeddings' gradient (straight through). docs/findings.md compares this backward with a
deterministic sign. A rank's own piece (its own samples' pooled embeddings, and their gradients) never leaves it:
it is not coded and stays exact both ways, and the bytes counted are those that leave the rank (so on N ranks
(N-1)/N of them).

The scales: what one rank sends one peer is a block of samples; per block and shard one fp32 base (the block's
largest scale), and per sample and shard a code q in 0..254 for base x 2^(-q/16) (steps of 4.4%, down to 2^-15.9
of the base; 255 is zero). The forward rounds q to the nearest code, the backward towards a larger scale (so
M >= max |g| still holds). A fp32 base reaches a per-sample gradient's small sizes, which fp16 does not. No
indices. Bytes per sample and shard of width w, each way: ceil(w / 8) + 1 (`sign_bytes`), plus 4 per shard and
block (`sign_block_bytes`); at w = 128, 17 against 512; at w = 16, 3 against 64.

Scope `sign2`: the same backward; forward, a shard of at least 88 columns (`shard_bits`: where the round trip
stays over MIN_REDUCTION = 20x under dense) sends two bits an entry, its sign and a magnitude bit, decoded as +-s
or +-3s (a uniform 4-level grid, whose best step for a Gaussian puts the magnitude threshold at 0.996 of the
RMS): the magnitude bit is set where |x| >= the sample's RMS over the shard, s is the least-squares scale for
those levels, coded as the sign scope's scales are, and the bit is then re-chosen as the nearer level of the
decoded s. Narrower shards send the sign scope's one bit. At w = 128, 2 * 16 + 1 = 33 bytes forward and 17 back:
20.5x fewer than 2 x 512.

On CPU, for float32 inputs, the passes over every entry run in C (`mp_sign_native`: the same bytes, floats and
generator states); elsewhere the PyTorch passes here run.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from . import mp_sign_native
from .wire import MIN_POSITIVE, from_bytes, on_device, starts, timed

SCALE_BYTES = 1       # one scale code per sample and column shard
BASE_BYTES = 4        # one fp32 base per block and column shard
CODES_PER_OCTAVE = 16
ZERO_CODE = 255  # a sample shard of zeros (its first sign bit set) or, with that bit clear, one holding NaN or inf:
# decoded as zeros or as NaN, so a receiver sees a sender's divergence as a dense exchange would show it


def sign_bytes(width: int, bits: int = 1) -> int:
    """Bytes one sample's column shard of `width` columns takes on the wire with `bits` bits an entry (1: scope
    `sign` either way and `sign2`'s backward; 2: `sign2`'s forward), bases aside."""
    return bits * ((width + 7) // 8) + SCALE_BYTES if width else 0


MIN_REDUCTION = 20  # scope sign2 spends a second forward bit on a shard only where its round trip stays this far
# under the dense one


def shard_bits(width: int, bits: int) -> int:
    """Forward bits an entry a shard of `width` columns gets when up to `bits` are allowed: 2 only where its
    round trip (2 bits forward, 1 back, a scale code each way) stays more than MIN_REDUCTION times under the
    dense fp32 one (8 * width bytes), i.e. from width 88 up; else 1. The per-block bases are not counted."""
    if bits == 2 and 8 * width > MIN_REDUCTION * (sign_bytes(width, 2) + sign_bytes(width, 1)):
        return 2
    return 1


def sign_block_bytes(segments: list[int], rows: int, bits: int = 1) -> int:
    """Bytes of one block: `rows` samples of shards `segments` at up to `bits` bits an entry (`shard_bits`), with
    one base per nonempty shard."""
    return rows * sum(sign_bytes(w, shard_bits(w, bits)) for w in segments) + BASE_BYTES * sum(1 for w in segments if w)


# Code q's scale is the block's base times CODE_SCALES[q] = 2^(-q / CODES_PER_OCTAVE): a fixed float32 table (made in
# float64 and rounded once, so every machine and device holds the same floats), not an exp2 and a log2 computed by
# whichever library runs them. CODE_MIDPOINTS[q] = 2^(-(q + 1/2) / CODES_PER_OCTAVE) lies between codes q and q + 1.
CODE_SCALES = torch.tensor([2.0 ** (-q / CODES_PER_OCTAVE) for q in range(ZERO_CODE)], dtype=torch.float32)
CODE_MIDPOINTS = torch.tensor([2.0 ** (-(q + 0.5) / CODES_PER_OCTAVE) for q in range(ZERO_CODE - 1)],
                              dtype=torch.float32)


def _decoded_scales(q: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """Scale codes [blocks, rows, n] (uint8) and bases [blocks, 1, n] -> the scales base * CODE_SCALES[q] (0 for
    ZERO_CODE), as encoder and decoder both compute them (one product, the same floats)."""
    table = on_device(CODE_SCALES, q.device)
    s = base * table[q.long().clamp_(max=ZERO_CODE - 1)]
    return s.masked_fill_(q == ZERO_CODE, 0.0)


def _scale_codes(m: torch.Tensor, base: torch.Tensor, round_up: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample scales m [blocks, rows, n] >= 0 and their block's largest finite one [blocks, 1, n] -> (codes,
    decoded scales), by comparing m with the block's products base * table (exact float comparisons, no
    logarithm): to the nearest code in octaves (m against the midpoints between codes), or with `round_up` to the
    code whose scale is the smallest one >= m. A zero, NaN or inf m gets ZERO_CODE and scale 0."""
    points = on_device(CODE_SCALES if round_up else CODE_MIDPOINTS, m.device)
    falling = (base.transpose(1, 2) * points).neg_()  # [blocks, n, points]: -base * point, ascending in the point
    # round up: how many codes' scales are >= m, less one; nearest: how many midpoints lie above m
    count = torch.searchsorted(falling, m.transpose(1, 2).neg().contiguous(), right=round_up).transpose(1, 2)
    q = (count - 1 if round_up else count).clamp_(0, ZERO_CODE - 1).to(torch.uint8)
    q = q.masked_fill_(~((m > 0) & m.isfinite()), ZERO_CODE)
    return q, _decoded_scales(q, base)


OUTER_LEVEL = 3.0  # 2 bits forward: |decoded| is scale * 1 or scale * OUTER_LEVEL (a uniform 4-level grid)
_BITS = ((torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1).float()  # byte -> its 8 bits as 0 / 1
_SIGNS = _BITS * 2 - 1                                                       # byte -> its 8 bits as +-1
_LEVELS = 1 + (OUTER_LEVEL - 1) * _BITS                                     # byte -> its 8 bits as 1 or OUTER_LEVEL
_BIT_VALUES = 2.0 ** torch.arange(8)                                        # bit i of a byte is worth 2^i
_SHIFTS = torch.arange(8, dtype=torch.uint8)                                # bit i of a byte is (byte >> i) & 1


def _flag(a: torch.Tensor, b, compare) -> torch.Tensor:
    """`compare(a, b)` as float 0 / 1 ([..., w], a's shape, contiguous whatever a's strides, so that `_pack` reads
    it without a copy): on CPU a comparison writes floats faster than bools."""
    return compare(a, b, out=torch.empty(a.shape, dtype=a.dtype, device=a.device))


def _pack(bits: torch.Tensor) -> torch.Tensor:
    """[..., w] float 0 / 1 -> [..., ceil(w / 8)] uint8, least significant bit first, padded with zeros: each
    group of 8 times the bits' values, summed (whole numbers up to 255, exact in float32)."""
    w, nb = bits.shape[-1], (bits.shape[-1] + 7) // 8
    if w != 8 * nb:
        bits = torch.cat([bits, bits.new_zeros(*bits.shape[:-1], 8 * nb - w)], dim=-1)
    packed = (torch.mv(bits.reshape(-1, 8), on_device(_BIT_VALUES, bits.device)) if bits.numel()
              else bits.new_zeros(0))
    return packed.to(torch.uint8).reshape(*bits.shape[:-1], nb)


def _unpack(table: torch.Tensor, b: torch.Tensor, w: int) -> torch.Tensor:
    """Packed bytes [..., nb] -> [..., w]: each byte's 8 bits as `table` gives them (`_SIGNS`, `_LEVELS`). On CPU
    by index_select, faster there than indexing with a tensor; elsewhere by `_unpack_shifted`."""
    if b.device.type != "cpu":
        return _unpack_shifted(table, b, w)
    out = on_device(table, b.device).index_select(0, b.reshape(-1).long())
    return out.reshape(*b.shape[:-1], b.shape[-1] * 8)[..., :w]


def _unpack_shifted(table: torch.Tensor, b: torch.Tensor, w: int) -> torch.Tensor:
    """`_unpack` by shifting and masking: one elementwise pass, where a GPU's gather of 8-float rows is slow
    (docs/findings.md). The same floats: `table` maps bit 0 / 1 to lo / lo + (hi - lo), exact for its whole
    numbers."""
    lo, hi = float(table[0, 0]), float(table[255, 0])
    bits = (b.unsqueeze(-1) >> on_device(_SHIFTS, b.device)) & 1
    out = bits.reshape(*b.shape[:-1], b.shape[-1] * 8)[..., :w].float()
    return out.mul_(hi - lo).add_(lo)


def _two_bit_scale(a: torch.Tensor) -> torch.Tensor:
    """|x| [..., w] -> per row the least-squares scale s of the levels s * {1, OUTER_LEVEL} once each entry is
    given the outer level where |x| >= the row's RMS (the Gaussian's best uniform 4-level grid puts that
    threshold at 0.996 RMS): s = sum(|x| l) / sum(l^2). Computed on |x| / the row's max |x|, so nothing
    overflows near float32's largest; a row of subnormals keeps a positive scale. The sums are taken in float64,
    so that the C codec (`mp_sign_native`), which adds in its own order, gets the same floats: a float32 sum's
    rounding depends on the order of its additions, a float64 sum of these floats practically never shows it
    once rounded to float32."""
    top = a.amax(dim=-1, keepdim=True)
    u = a / torch.where(top > 0, top, 1.0)
    sq = u * u
    w = a.shape[-1]
    mean = (sq.sum(dim=-1, keepdim=True, dtype=torch.float64) / w).float()
    outer = torch.ge(sq, mean, out=sq)  # 1.0 / 0.0, written over u^2 (no bool copies)
    n_outer = outer.sum(dim=-1)         # whole numbers, exact in float32
    level_sum = u.sum(dim=-1, dtype=torch.float64) + \
        (OUTER_LEVEL - 1) * outer.mul_(u).sum(dim=-1, dtype=torch.float64)  # sum(u l)
    s = top.squeeze(-1) * (level_sum / (w + (OUTER_LEVEL ** 2 - 1) * n_outer)).float()
    return s.where(~((top.squeeze(-1) > 0) & (s == 0)), MIN_POSITIVE)


def _equal_width_runs(segments: list[int]) -> list[tuple[int, int, int]]:
    """(first column, width, count) of each run of consecutive segments of one nonzero width (empty ones skipped):
    the codec handles a run as one [blocks, rows, count, width] block, with the bytes of each segment alone."""
    runs, start = [], 0
    for w in map(int, segments):
        if w and runs and runs[-1][1] == w:
            runs[-1][2] += 1
        elif w:
            runs.append([start, w, 1])
        start += w
    return [tuple(r) for r in runs]


def sign_encode(x: torch.Tensor, segments: list[int], generator: torch.Generator | None = None,
                blocks: int = 1, bits: int = 1) -> torch.Tensor:
    """[rows, sum(segments)] float, as `blocks` blocks of rows / blocks samples -> flat uint8 of `blocks` x
    `sign_block_bytes(segments, rows / blocks, bits)`: per block the fp32 bases of its shards, then per sample
    and shard its packed sign bits (least significant bit first, padded to a whole byte), on a shard given 2
    bits (`shard_bits(w, bits)`) its packed magnitude bits, and its scale code. Without `generator`, 1 bit: bit
    set where x >= 0, scale mean |x|; 2 bits: also the magnitude bit where |x| is nearer scale * OUTER_LEVEL
    than scale, the scale `_two_bit_scale`'s. With `generator` (random rounding, 1 bit only): bit set with probability
    (1 + x / M) / 2, M the decoded scale (>= max |x|, so the decoded values average to x). The draws are
    [rows / blocks, w] blocks, per block one per shard in order, so `blocks` blocks coded together send the bytes
    of each coded alone, in order. A sample shard of zeros gets ZERO_CODE and its first sign bit set;
    one holding NaN or inf gets ZERO_CODE and that bit clear."""
    _check_encode(x, segments, generator, blocks, bits)
    r = x.shape[0] // blocks
    x = x.detach()
    runs = _equal_width_runs(segments)
    draws = _draws(runs, blocks, r, generator, x.device) if generator is not None else [None] * len(runs)
    fast = mp_sign_native.usable(x)  # the passes over every entry in C (the same bytes)
    heads, bodies = [], []
    for (start, w, n), draw in zip(runs, draws):
        seg = x[:, start:start + n * w].float().reshape(blocks, r, n, w)
        wide = shard_bits(w, bits) == 2
        m, mag = _sample_scales(x, seg, start, wide, fast, generator is not None)
        if fast:
            head, body = _code_run_native(x, start, w, m, wide, draw)
        else:
            head, body = _code_run(seg, mag, m, wide, draw)
        heads.append(head)
        bodies.append(body)
    if not bodies:
        return torch.empty(0, dtype=torch.uint8, device=x.device)
    return torch.cat([torch.cat(heads, dim=1), torch.cat(bodies, dim=2).reshape(blocks, -1)], dim=1).reshape(-1)


def _check_encode(x: torch.Tensor, segments: list[int], generator: torch.Generator | None, blocks: int,
                  bits: int) -> None:
    """`sign_encode`'s arguments, refused in one line each where the codec cannot take them."""
    if x.dim() != 2 or not x.is_floating_point() or sum(segments) != x.shape[1] or min(segments, default=0) < 0:
        raise ValueError(f"sign_encode takes [rows, sum(segments)] floats; got {tuple(x.shape)} {x.dtype} for "
                         f"segments summing to {sum(segments)}")
    if bits not in (1, 2) or (bits == 2 and generator is not None):
        raise ValueError(f"sign_encode codes 1 bit an entry, or 2 without random rounding; got bits={bits!r}")
    rows = x.shape[0]
    if blocks < 1 or rows % blocks:
        raise ValueError(f"{rows} rows do not split into {blocks} blocks")


def _draws(runs: list[tuple[int, int, int]], blocks: int, r: int, generator: torch.Generator,
           device: torch.device) -> list[torch.Tensor]:
    """The random rounding's draws, per run [blocks, n, r, w], drawn block by block: a block's shards lie in order
    in d[b], so one call draws them as one per shard would. Drawn on [0, 2): exactly twice the draws on [0, 1); in
    C where it can be (`mp_sign_native.uniform_0_2`, the same floats and generator state)."""
    draws = [torch.empty(blocks, n, r, w, device=device) for _, w, n in runs]
    order = [d[b] for b in range(blocks) for d in draws]
    if not mp_sign_native.uniform_0_2(order, generator):
        for d in order:
            d.uniform_(0, 2, generator=generator)
    return draws


def _sample_scales(x: torch.Tensor, seg: torch.Tensor, start: int, wide: bool, fast: bool,
                   rounding: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per sample shard of a run `seg` [blocks, r, n, w] (columns `start` on of `x`), the scale m [blocks, r, n]
    the codes round: on a 2-bit shard `_two_bit_scale`'s, else mean |x| (forward) or max |x| (random rounding);
    and |seg| where the PyTorch path of a 2-bit shard computed it (its magnitude bits read it again), else None."""
    blocks, r, n, w = seg.shape
    if wide and fast:
        return mp_sign_native.two_bit_scales(x, start, n, w, OUTER_LEVEL, MIN_POSITIVE).reshape(blocks, r, n), None
    if wide:
        mag = seg.abs()
        return _two_bit_scale(mag), mag
    if not rounding:  # summed in float64: no overflow near float32's largest, no underflow to 0 of a shard holding
        m64 = seg.abs().mean(dim=3, dtype=torch.float64)  # only subnormals
        return m64.float().where(~((m64 > 0) & (m64.float() == 0)), MIN_POSITIVE), None
    # max |x| from two read-only passes (NaN propagates through both, as through |x|)
    return torch.maximum(seg.amax(dim=3), seg.amin(dim=3).neg_()), None


def _code_run_native(x: torch.Tensor, start: int, w: int, m: torch.Tensor, wide: bool,
                     draw: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """A run's bases (uint8 [blocks, 4 n]) and body ([blocks, r, n * e]) in C: the base, codes, scales and flags
    in one pass, the bit planes and their packing in another (the same bytes as `_code_run`)."""
    blocks, _, n = m.shape
    base, q, scale, bad = mp_sign_native.scale_codes(m, draw is not None, CODE_SCALES, CODE_MIDPOINTS, ZERO_CODE)
    mode = 2 if draw is not None else 1 if wide else 0
    body = mp_sign_native.pack(x, start, blocks, n, w, mode, scale, q, bad, draw, OUTER_LEVEL, ZERO_CODE)
    return base.view(torch.uint8), body


def _code_run(seg: torch.Tensor, mag: torch.Tensor | None, m: torch.Tensor, wide: bool,
              draw: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """A run's bases (uint8 [blocks, 4 n]) and body ([blocks, r, n * e]: per sample shard its packed bit planes
    and its scale code) in PyTorch, from the run `seg` [blocks, r, n, w] and its scales m [blocks, r, n]."""
    blocks, r, n = m.shape
    # the block's largest finite scale (+0.0 where none is positive): a sample gone NaN or inf does not take
    # its block's scales with it
    finite = m.isfinite()
    base = m.where(finite, 0.0).amax(dim=1, keepdim=True).add_(0.0) if r else m.new_zeros(blocks, 1, n)
    q, scale = _scale_codes(m, base, round_up=draw is not None)
    bad = ~finite  # a sample shard holding NaN or inf (see ZERO_CODE): code ZERO_CODE (from _scale_codes), scale 0
    planes = _bit_planes(seg, mag, scale, wide, draw)
    first = planes[0][..., 0]  # tells a zero sample shard (bit set) from a non-finite one (bit clear)
    first.masked_fill_(q == ZERO_CODE, 1.0).masked_fill_(bad, 0.0)
    body = torch.cat([_pack(b) for b in planes] + [q.unsqueeze(3)], dim=3)
    return base.reshape(blocks, n).contiguous().view(torch.uint8), body.reshape(blocks, r, n * body.shape[3])


def _bit_planes(seg: torch.Tensor, mag: torch.Tensor | None, scale: torch.Tensor, wide: bool,
                draw: torch.Tensor | None) -> list[torch.Tensor]:
    """A run's bit planes as float 0 / 1 (`_flag`) [blocks, r, n, w]: the sign bit (x >= 0) and, on a 2-bit shard,
    the magnitude bit (the nearer of the two decoded levels); with the draws `draw`, the random rounding's bit."""
    if draw is None:
        planes = [_flag(seg, 0, torch.ge)]
        if wide:  # the nearer of the two decoded levels
            planes.append(_flag(mag, scale.unsqueeze(3) * (1 + OUTER_LEVEL) / 2, torch.ge))
        return planes
    sc = scale.unsqueeze(3)  # twice P(bit set), 1 + x / M, against draws on [0, 2): no halving pass
    p2 = (seg / torch.where(sc > 0, sc, 1.0)).add_(1)
    unscaled = ~(sc > 0)  # P = 1/2 where the scale is zero; a check of a small tensor saves a pass on CPU
    if seg.device.type != "cpu" or bool(unscaled.any()):  # (asking would make a GPU wait)
        p2.masked_fill_(unscaled, 1.0)
    return [_flag(draw.transpose(1, 2), p2, torch.lt)]


def sign_decode(b: torch.Tensor, segments: list[int], rows: int, blocks: int = 1, dtype=torch.float32,
                bits: int = 1, out: list[torch.Tensor] | None = None) -> torch.Tensor | None:
    """`sign_encode`'s bytes of `blocks` blocks holding `rows` samples in all -> [rows, sum(segments)]: each entry
    its scale times +1 or -1 (on a shard given 2 bits: times 1 or OUTER_LEVEL, as its magnitude bit says); a
    sample shard sent as non-finite (ZERO_CODE, first sign bit clear) decodes as NaN throughout. With `out` (one
    [rows / blocks, sum(segments)] tensor of `dtype` per block, e.g. views into a larger buffer), each block is
    written into its tensor instead, with no [rows, ...] tensor made and no copy after, and None is returned."""
    if b.dtype != torch.uint8 or blocks < 1 or rows % blocks or bits not in (1, 2) or \
            b.numel() != blocks * sign_block_bytes(segments, rows // blocks, bits):
        raise ValueError(f"sign_decode: {b.numel()} {b.dtype} bytes are not {blocks} block(s) of {rows} samples "
                         f"of shards {list(segments)} at {bits} bit(s) an entry")
    r, width = rows // blocks, sum(segments)
    if out is not None and (len(out) != blocks or any(
            o.shape != (r, width) or o.dtype != dtype or o.device != b.device for o in out)):
        raise ValueError(f"sign_decode: out must be {blocks} tensor(s) of [{r}, {width}] {dtype} on {b.device}")
    if out is None:
        dense = torch.empty(rows, width, dtype=dtype, device=b.device)
        sign_decode(b, segments, rows, blocks, dtype, bits, out=[dense[i * r:(i + 1) * r] for i in range(blocks)])
        return dense
    runs = _equal_width_runs(segments)
    if not runs or rows == 0:  # no columns (empty segments only) or no samples: nothing to write
        return None
    S = sum(n for _, _, n in runs)
    b = b.reshape(blocks, -1)
    bases = from_bytes(b[:, :BASE_BYTES * S], torch.float32).reshape(blocks, 1, S)
    body = b[:, BASE_BYTES * S:].reshape(blocks, r, -1)
    fast = dtype == torch.float32 and b.device.type == "cpu" and mp_sign_native.loaded() and all(
        width <= 1 or o.stride(1) == 1 for o in out)  # every entry decoded in C (the same floats)
    pos, k = 0, 0  # every column lies in one run (empty segments have none)
    for start, w, n in runs:
        nb, wb = (w + 7) // 8, shard_bits(w, bits)
        e = wb * nb + SCALE_BYTES
        at, pos = pos, pos + n * e
        if fast:  # the scales from the codes too (the same floats)
            for i in range(blocks):
                mp_sign_native.unpack(body[i, :, at:pos], n, w, wb, bases[i, 0, k:k + n], CODE_SCALES, ZERO_CODE,
                                   _SIGNS, _LEVELS, out[i], start)
            k += n
            continue
        run = body[:, :, at:pos].reshape(blocks, r, n, e)
        codes = run[..., wb * nb]
        scale = _decoded_scales(codes, bases[..., k:k + n])
        scale.masked_fill_((codes == ZERO_CODE) & (run[..., 0] & 1 == 0), float("nan"))  # sent non-finite
        k += n
        value = _unpack(_SIGNS, run[..., :nb], w)
        if wb == 2:  # +-1 times 1 or OUTER_LEVEL: exact
            value = value.mul_(_unpack(_LEVELS, run[..., nb:2 * nb], w))
        value = value.mul_(scale.unsqueeze(3)).to(dtype).reshape(blocks, r, n * w)
        for i in range(blocks):
            out[i][:, start:start + n * w].copy_(value[i])
    return None


@dataclass
class SignLayout:
    """Scopes `sign` and `sign2`: per rank the widths of its column shards in its column order (summing to its
    width), the forward's bits an entry (1: `sign`; 2: `sign2`, on the shards `shard_bits` gives 2; the backward
    always sends 1) and the bytes one peer's block takes on the wire each way."""
    widths: list[int]
    batch_size: int
    segments: list[list[int]]
    generator: torch.Generator | None = None  # the backward's random rounding; None: a fresh one seeded 0
    fw_bits: int = 1

    def __post_init__(self):
        self.widths = [int(w) for w in self.widths]
        self.segments = [[int(w) for w in seg] for seg in self.segments]
        if self.generator is None:
            self.generator = torch.Generator().manual_seed(0)
        if len(self.segments) != len(self.widths) or any(sum(s) != w for s, w in zip(self.segments, self.widths)):
            raise ValueError(f"segments {self.segments} do not add up to the ranks' widths {self.widths}")
        self.bn = self.batch_size // len(self.widths)
        if self.fw_bits not in (1, 2):
            raise ValueError(f"fw_bits must be 1 or 2, got {self.fw_bits!r}")
        # one peer's piece, per rank: forward and backward
        self.fw_block_bytes = [sign_block_bytes(seg, self.bn, self.fw_bits) for seg in self.segments]
        self.block_bytes = [sign_block_bytes(seg, self.bn) for seg in self.segments]

    def forward_exchange(self, pooled: torch.Tensor):
        return sign_forward_exchange(pooled, self)

    def backward_exchange(self, grad: torch.Tensor, state):
        return sign_backward_exchange(grad, state, self)


def sign_forward_exchange(pooled: torch.Tensor, layout: SignLayout):
    """Scope `sign`'s forward all-to-all: [B, W_r] -> (flat dense received pieces [B/N, W_q] from each rank q,
    None, bytes sent, seconds in the collective). A rank's own piece never leaves it: it stays exact."""
    rank, bits = dist.get_rank(), layout.fw_bits
    world, bn, mine = len(layout.widths), layout.bn, layout.fw_block_bytes[rank]
    rows = pooled.reshape(world, bn, -1)
    send = _peer_blocks(rows, rank, lambda x: sign_encode(x, layout.segments[rank], blocks=world - 1, bits=bits))
    recv = torch.empty(sum(layout.fw_block_bytes) - mine, dtype=torch.uint8, device=pooled.device)
    seconds = timed(lambda: dist.all_to_all_single(recv, send, _without(layout.fw_block_bytes, rank),
                                                    _without([mine] * world, rank)))
    dense = torch.empty(bn * sum(layout.widths), dtype=pooled.dtype, device=pooled.device)
    piece = _pieces(dense, bn, layout.widths)
    piece[rank].copy_(rows[rank])
    pos = 0
    for group in _peer_groups(layout.segments, rank):  # peers of one layout decode together, as blocks, in place
        seg, e = layout.segments[group[0]], layout.fw_block_bytes[group[0]] * len(group)
        sign_decode(recv[pos:pos + e], seg, bn * len(group), blocks=len(group), dtype=pooled.dtype, bits=bits,
                    out=[piece[q] for q in group])
        pos += e
    return dense, None, send.numel(), seconds


def _pieces(flat: torch.Tensor, bn: int, widths: list[int]) -> list[torch.Tensor]:
    """Views [bn, W_q] of each rank q's piece of a flat buffer holding them in rank order (no copies)."""
    return [flat[a:a + bn * w].view(bn, w) for a, w in zip(starts([bn * w for w in widths]), widths)]


def _peer_groups(segments: list[list[int]], rank: int) -> list[list[int]]:
    """The other ranks in rank order, in runs of consecutive ones whose column shards are alike: the codec codes
    such a run as one call of several blocks, whose bytes are those of coding each alone, in order."""
    groups: list[list[int]] = []
    for q, seg in enumerate(segments):
        if q == rank:
            continue
        if groups and segments[groups[-1][0]] == seg:
            groups[-1].append(q)
        else:
            groups.append([q])
    return groups


def _without(sizes: list[int], rank: int) -> list[int]:
    """Split sizes of an all-to-all in which a rank's own piece stays home (0)."""
    return [0 if q == rank else int(s) for q, s in enumerate(sizes)]


def _peer_blocks(rows: torch.Tensor, rank: int, encode) -> torch.Tensor:
    """`encode` of the blocks [world, bn, w] bound for the other ranks, in rank order (none: no bytes)."""
    if rows.shape[0] == 1:
        return torch.empty(0, dtype=torch.uint8, device=rows.device)
    world, bn, width = rows.shape  # explicit sizes: a rank without tables has width 0
    return encode(torch.cat([rows[:rank], rows[rank + 1:]]).reshape((world - 1) * bn, width))


def sign_backward_exchange(grad: torch.Tensor, state, layout: SignLayout):
    """Scope `sign`'s backward all-to-all: flat gradients of the received pieces -> (gradient [B, W_r] of this
    rank's pooled embeddings, bytes sent, seconds in the collective). The gradient of a rank's own piece stays
    exact; the peers' pieces are drawn in rank order."""
    rank = dist.get_rank()
    world, bn, mine = len(layout.widths), layout.bn, layout.block_bytes[rank]
    first = starts([bn * w for w in layout.widths])
    piece = _pieces(grad, bn, layout.widths)
    pieces = []
    for group in _peer_groups(layout.segments, rank):
        w = layout.widths[group[0]]
        if group[-1] - group[0] == len(group) - 1:  # consecutive ranks: their pieces lie side by side, a view
            x = grad[first[group[0]]:first[group[0]] + len(group) * bn * w].view(len(group) * bn, w)
        else:  # the group runs around this rank's own piece
            x = torch.cat([piece[q] for q in group])
        pieces.append(sign_encode(x, layout.segments[group[0]], layout.generator, blocks=len(group)))
    send = torch.cat(pieces).contiguous() if pieces else torch.empty(0, dtype=torch.uint8, device=grad.device)
    out = torch.empty((world - 1) * mine, dtype=torch.uint8, device=grad.device)
    seconds = timed(lambda: dist.all_to_all_single(out, send, _without([mine] * world, rank),
                                                    _without(layout.block_bytes, rank)))
    g = torch.empty(world * bn, layout.widths[rank], dtype=grad.dtype, device=grad.device)
    blocks = [g[q * bn:(q + 1) * bn] for q in range(world)]
    blocks[rank].copy_(piece[rank])
    if world > 1:  # the peers' pieces decode in place, around this rank's own
        sign_decode(out, layout.segments[rank], (world - 1) * bn, blocks=world - 1, dtype=grad.dtype,
                    out=blocks[:rank] + blocks[rank + 1:])
    return g, send.numel(), seconds
