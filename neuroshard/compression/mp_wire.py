"""DCT-MP's wire format (DESIGN.md §5): the one implementation of the compressed pooled-embedding all-to-all.

Used by training (`training/dlrm.py`'s `_CompressedAllToAll`) and by the comm-cost measurements
(`comm_bench`, the measurement engine), so cost data is measured exactly as DCT-MP sends.

Two families: the top-k scopes here, and scopes `sign` and `sign2` (`--mp_scope`, `sign2` the default; their
own section below: one bit per entry and a scale per column shard, or two bits forward on wide shards).

Top-k forward: rank r holds pooled embeddings [B, W_r] for the global batch, its column shards side by side.
Per sample it keeps the largest-magnitude entries of each segment: scope `table` (`--mp_scope table`):
every column shard s of width w_s is a segment and keeps k_s = max(1, ceil(keep * w_s))
entries, so every table reaches every dot product; scope `rank`: the rank's whole width is one
segment, k_r = max(1, floor(keep * W_r)), and its tables compete for those entries. It sends them as
fp16 values (clamped to fp16's range) followed by their indices within their segment, in the
smallest integer type that holds the widest segment of any rank (`index_dtype`: uint8 up to 256
columns, int16 up to 32768, else int32), all packed into ONE uint8 all-to-all with a fixed count
per sample. So rank r sends `B * K_r * (2 + index bytes)` bytes in all, K_r = the sum of its
segments' counts (`fw_send_bytes`). The receiver adds each segment's start column back and scatters
each peer's entries into a dense [B/N, W_q] block of zeros.
Backward: each rank sends back the fp32 gradients of exactly the entries it received,
`B/N * sum_q K_q * 4` bytes (`bw_send_bytes`); the sender scatters them to its kept entries
(every other entry gets zero gradient).
A rank's own block travels through these collectives coded like the others (the top-k scopes are kept as
they were measured); the sign scopes keep it home and exact. In both, the bytes reported as sent are those
that leave the rank, (N-1)/N of `fw_send_bytes` / `bw_send_bytes` when the ranks' widths are equal.

gloo's all_to_all does not carry int16, hence the raw-byte packing.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from . import sign_native

FP16_MAX = 65504.0
VALUE_BYTES = 2   # fp16 values forward
GRAD_BYTES = 4    # fp32 gradients backward


def keep_count(width: int, keep: float, scope: str = "rank") -> int:
    """Entries of a sample a segment of `width` columns sends, 0 for no columns: scope `rank` (a rank's
    whole width) max(1, floor(keep * width)); scope `table` (one table shard) max(1, ceil(keep * width))."""
    if width == 0:
        return 0
    k = int(keep * width) if scope == "rank" else math.ceil(round(keep * width, 9))
    return min(width, max(1, k))


def index_dtype(width: int) -> torch.dtype:
    """Smallest index type for column indices below `width`."""
    return torch.uint8 if width <= 256 else torch.int16 if width <= 32768 else torch.int32


def entry_bytes(widths) -> int:
    """Bytes of one kept entry forward (fp16 value + index) when the segments' widths are `widths`
    (scope `rank`: the ranks' widths; scope `table`: every rank's shard widths)."""
    return VALUE_BYTES + torch.empty(0, dtype=index_dtype(max(widths, default=1) or 1)).element_size()


def fw_send_bytes(widths, rank: int, batch_size: int, keep: float, segments=None) -> int:
    """Bytes of rank `rank`'s forward all-to-all buffer (all peers, itself included):
    B * K_r * entry_bytes, K_r = the sum of its segments' keep counts (see `WireLayout`)."""
    layout = WireLayout(widths, keep, batch_size, segments)
    return batch_size * layout.ks[rank] * layout.entry


def bw_send_bytes(widths, batch_size: int, keep: float, segments=None) -> int:
    """Bytes every rank sends in the backward all-to-all (gradients of the entries it received):
    B/N * sum_q K_q * 4."""
    layout = WireLayout(widths, keep, batch_size, segments)
    return layout.bn * sum(layout.ks) * GRAD_BYTES


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """[rows, c] of any dtype -> its raw bytes [rows, c * itemsize] (uint8)."""
    if t.numel() == 0:
        return torch.empty(t.shape[0], 0, dtype=torch.uint8, device=t.device)
    return t.contiguous().view(torch.uint8).reshape(t.shape[0], -1)


def _from_bytes(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Raw bytes [rows, c * itemsize] (uint8) -> [rows, c] of `dtype`. A column slice of one row counts as
    contiguous whatever its row stride, and a slice may start at an offset `view` cannot align; `view` refuses
    both, so such a slice is copied to dense strides first."""
    if b.numel() == 0:
        return torch.empty(b.shape[0], 0, dtype=dtype, device=b.device)
    b = b.contiguous()
    if b.stride(0) != b.shape[1] or b.storage_offset() % dtype.itemsize:
        b = b.clone(memory_format=torch.contiguous_format)
    return b.view(dtype)


@dataclass
class WireLayout:
    """What every rank agrees on: the ranks' widths, the keep fraction, the per-sample counts, and the
    segments each rank's top-k runs over. `segments` None (scope `rank`): one segment per rank, its
    whole width, k_r = max(1, floor(keep * W_r)). Otherwise (scope `table`) per rank the widths of its
    column shards in its column order (summing to its width): each shard keeps its own
    k_s = max(1, ceil(keep * w_s)), so every table reaches every receiver. Indices on the wire are
    within a segment, in the smallest type for the widest segment of any rank."""
    widths: list[int]
    keep: float
    batch_size: int
    segments: list[list[int]] | None = None

    def __post_init__(self):
        self.widths = [int(w) for w in self.widths]
        self.scope = "rank" if self.segments is None else "table"
        if self.segments is None:
            self.segments = [[w] if w else [] for w in self.widths]
        self.segments = [[int(w) for w in seg] for seg in self.segments]
        if len(self.segments) != len(self.widths) or any(sum(s) != w for s, w in zip(self.segments, self.widths)):
            raise ValueError(f"segments {self.segments} do not add up to the ranks' widths {self.widths}")
        self.seg_ks = [[keep_count(w, self.keep, self.scope) for w in seg] for seg in self.segments]
        self.ks = [sum(k) for k in self.seg_ks]
        seg_widths = [w for seg in self.segments for w in seg]
        self.itype = index_dtype(max(seg_widths, default=1))
        self.entry = entry_bytes(seg_widths)
        self.bn = self.batch_size // len(self.widths)
        # per rank: each kept entry's segment start column, [K_q] (local index + offset = rank column)
        self.offsets = [torch.tensor([o for o, k in zip(_starts(seg), ks) for _ in range(k)], dtype=torch.int64)
                        for seg, ks in zip(self.segments, self.seg_ks)]
        self._offsets_on: dict = {}  # (rank, device) -> that rank's offsets there (`_on`)

    def offsets_on(self, rank: int, device: torch.device) -> torch.Tensor:
        """Rank `rank`'s offsets on `device`: copied there once per layout, not on every all-to-all."""
        return _on(self.offsets[rank], device, self._offsets_on, rank)

    def forward_exchange(self, pooled: torch.Tensor):
        return forward_exchange(pooled, self)

    def backward_exchange(self, grad: torch.Tensor, state):
        return backward_exchange(grad, state, self)


def _starts(widths) -> list[int]:
    out, pos = [], 0
    for w in widths:
        out.append(pos)
        pos += w
    return out


def encode(pooled: torch.Tensor, layout: WireLayout, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, W_r] -> (bytes to send [B, K_r * entry], kept column indices [B, K_r] int64): per segment,
    the indices within it go on the wire, the rank's column indices come back."""
    mag, local = pooled.detach().abs(), []
    for start, w, k in zip(_starts(layout.segments[rank]), layout.segments[rank], layout.seg_ks[rank]):
        local.append(mag[:, start:start + w].topk(k, dim=1, sorted=False).indices)
    if local:
        local = torch.cat(local, dim=1)
    else:
        local = torch.zeros(pooled.shape[0], 0, dtype=torch.int64, device=pooled.device)
    idx = local + layout.offsets_on(rank, pooled.device)
    vals = pooled.detach().gather(1, idx).clamp(-FP16_MAX, FP16_MAX).to(torch.float16)
    return torch.cat([_as_bytes(vals), _as_bytes(local.to(layout.itype))], dim=1), idx


def decode(recv: torch.Tensor, layout: WireLayout, dtype=torch.float32) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Received bytes -> (flat dense pieces, [B/N, W_q] from each rank q in rank order; each peer's
    column indices [B/N, k_q] int64, which the backward needs)."""
    bn, e = layout.bn, layout.entry
    dense, recv_idx, pos = [], [], 0
    for q, (w, kq) in enumerate(zip(layout.widths, layout.ks)):
        block = recv[pos: pos + bn * kq * e].reshape(bn, kq * e)
        v = _from_bytes(block[:, : VALUE_BYTES * kq], torch.float16).to(dtype)
        i = _from_bytes(block[:, VALUE_BYTES * kq:], layout.itype).long() + layout.offsets_on(q, recv.device)
        dense.append(torch.zeros(bn, w, dtype=dtype, device=recv.device).scatter(1, i, v).reshape(-1))
        recv_idx.append(i)
        pos += bn * kq * e
    return torch.cat(dense), recv_idx


def gather_grads(grad: torch.Tensor, layout: WireLayout, recv_idx: list[torch.Tensor]) -> torch.Tensor:
    """Flat gradients of the dense pieces -> the gradients of the received entries only (to send back)."""
    pieces, pos = [], 0
    for w, i in zip(layout.widths, recv_idx):
        pieces.append(grad[pos: pos + layout.bn * w].reshape(layout.bn, w).gather(1, i).reshape(-1))
        pos += layout.bn * w
    return torch.cat(pieces).contiguous()


def scatter_grads(received: torch.Tensor, idx: torch.Tensor, width: int) -> torch.Tensor:
    """Gradients of this rank's kept entries [B * k_r] -> dense [B, W_r] (zero where nothing was sent)."""
    B, k = idx.shape
    return torch.zeros(B, width, dtype=received.dtype, device=received.device).scatter(1, idx, received.reshape(B, k))


def bytes_leaving(send_splits: list[int], rank: int, itemsize: int = 1) -> int:
    """Bytes an all-to-all sends to other ranks, given its send split sizes (elements per destination rank):
    a rank's own piece never leaves it."""
    return (sum(send_splits) - send_splits[rank]) * itemsize


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def forward_exchange(pooled: torch.Tensor, layout: WireLayout):
    """DCT-MP's forward all-to-all on every rank together: [B, W_r] -> (flat dense received pieces,
    state for `backward_exchange`, bytes sent, seconds in the collective)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    send, idx = encode(pooled, layout, rank)
    k, e, bn = layout.ks[rank], layout.entry, layout.bn
    recv = torch.empty(bn * sum(layout.ks) * e, dtype=torch.uint8, device=pooled.device)
    send_splits = [bn * k * e] * world
    seconds = _timed(lambda: dist.all_to_all_single(recv, send.reshape(-1), [bn * x * e for x in layout.ks],
                                                    send_splits))
    dense, recv_idx = decode(recv, layout, pooled.dtype)
    return dense, (idx, recv_idx), bytes_leaving(send_splits, rank), seconds


def backward_exchange(grad: torch.Tensor, state, layout: WireLayout):
    """DCT-MP's backward all-to-all: flat gradients of the received pieces -> (gradient [B, W_r] of this
    rank's pooled embeddings, bytes sent, seconds in the collective)."""
    idx, recv_idx = state
    rank, world = dist.get_rank(), dist.get_world_size()
    send = gather_grads(grad, layout, recv_idx)
    k, bn = layout.ks[rank], layout.bn
    out = torch.empty(world * bn * k, dtype=grad.dtype, device=grad.device)
    send_splits = [bn * x for x in layout.ks]
    seconds = _timed(lambda: dist.all_to_all_single(out, send, [bn * k] * world, send_splits))
    return scatter_grads(out, idx, layout.widths[rank]), bytes_leaving(send_splits, rank, send.element_size()), seconds


# ----------------------------------------------------------------------------- scope `sign`: 1 bit an entry
# Every entry of every column shard goes on the wire as one bit, with one 8-bit scale code per sample and shard;
# the receiver gets scale * (+1 | -1) for every column, so every table keeps all its columns and every
# table.table dot product survives (as the dot product of the two sign vectors, times both scales).
# Forward: the bit is the entry's sign and the scale the shard's mean |x|, the scale that minimises the
# squared error of `scale * sign(x)`. Backward: the received entries' gradients, each rounded at random to
# +M or -M with M >= the shard's max |g| and P(+M) = (1 + g / M) / 2, so the decoded gradient is unbiased
# (E = g); the sender takes it as its pooled embeddings' gradient (straight through). Measured paired over
# 5 seeds, the random rounding backward kept more AUC than a deterministic sign (docs/findings.md).
# A rank's own piece (its own samples' pooled embeddings, and their gradients) never leaves it: it is not coded
# and stays exact both ways, and the bytes counted are those that leave the rank (so on N ranks (N-1)/N of them).
# The scales: what one rank sends one peer is a block of samples; per block and shard one fp32 base (the
# block's largest scale), and per sample and shard a code q in 0..254 for base x 2^(-q/16) (steps of 4.4%,
# down to 2^-15.9 of the base; 255 is zero). The forward rounds q to the nearest code, the backward towards a
# larger scale (so M >= max |g| still holds). A fp32 base reaches a per-sample gradient's small sizes, which
# fp16 does not. No indices. Bytes per sample and shard of width w, each way: ceil(w / 8) + 1 (`sign_bytes`),
# plus 4 per shard and block (`sign_block_bytes`); at w = 128, 17 against 512; at w = 16, 3 against 64.
#
# Scope `sign2`: the same backward; forward, a shard of at least 88 columns (`shard_bits`: where the round trip
# stays over MIN_REDUCTION = 20x under dense) sends two bits an entry, its sign and a magnitude bit, decoded
# as +-s or +-3s (a uniform 4-level grid, whose best step for a Gaussian puts the magnitude threshold at 0.996
# of the RMS): the magnitude bit is set where |x| >= the sample's RMS over the shard, s is the least-squares
# scale for those levels, coded as the sign scope's scales are, and the bit is then re-chosen as the nearer
# level of the decoded s. Squared error 0.12 of the variance on Gaussian rows (the best 4-level quantizer's
# 0.1175) against the sign's 0.36. Narrower shards send the sign scope's one bit. At w = 128, 2 * 16 + 1 = 33
# bytes forward and 17 back: 20.5x fewer than 2 x 512.

SCALE_BYTES = 1       # one scale code per sample and column shard
BASE_BYTES = 4        # one fp32 base per block and column shard
CODES_PER_OCTAVE = 16
ZERO_CODE = 255  # a sample shard of zeros (its first sign bit set) or, with that bit clear, one holding NaN or inf:
# decoded as zeros or as NaN, so a receiver sees a sender's divergence as a dense exchange would show it
_TINY = float(torch.finfo(torch.float32).tiny) * 2 ** -23  # the smallest positive float32


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
    table = _on(CODE_SCALES, q.device)
    s = base * table[q.long().clamp_(max=ZERO_CODE - 1)]
    return s.masked_fill_(q == ZERO_CODE, 0.0)


def _scale_codes(m: torch.Tensor, base: torch.Tensor, round_up: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample scales m [blocks, rows, n] >= 0 and their block's largest finite one [blocks, 1, n] -> (codes,
    decoded scales), by comparing m with the block's products base * table (exact float comparisons, no
    logarithm): to the nearest code in octaves (m against the midpoints between codes), or with `round_up` to the
    code whose scale is the smallest one >= m. A zero, NaN or inf m gets ZERO_CODE and scale 0."""
    points = _on(CODE_SCALES if round_up else CODE_MIDPOINTS, m.device)
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
_ON_DEVICE: dict = {}  # (id of one of the tables above, device) -> its copy there, made once


def _on(table: torch.Tensor, device: torch.device, cache: dict = _ON_DEVICE, key=None) -> torch.Tensor:
    """`table` on `device`: copied there once into `cache` under (`key`, device), not on every call (a copy to a
    GPU each step would also wait for it). By default one of this module's constant tables, keyed by its id (they
    live as long as the module); a layout passes its own cache and key."""
    if table.device == device:
        return table
    key = (id(table) if key is None else key, device)
    if key not in cache:
        cache[key] = table.to(device)
    return cache[key]


def _flag(a: torch.Tensor, b, compare) -> torch.Tensor:
    """`compare(a, b)` as float 0 / 1 ([..., w], a's shape, contiguous whatever a's strides, so that `_pack` reads
    it without a copy): on CPU a comparison writes floats several times faster than bools."""
    return compare(a, b, out=torch.empty(a.shape, dtype=a.dtype, device=a.device))


def _pack(bits: torch.Tensor) -> torch.Tensor:
    """[..., w] float 0 / 1 -> [..., ceil(w / 8)] uint8, least significant bit first, padded with zeros: each
    group of 8 times the bits' values, summed (whole numbers up to 255, exact in float32)."""
    w, nb = bits.shape[-1], (bits.shape[-1] + 7) // 8
    if w != 8 * nb:
        bits = torch.cat([bits, bits.new_zeros(*bits.shape[:-1], 8 * nb - w)], dim=-1)
    packed = torch.mv(bits.reshape(-1, 8), _on(_BIT_VALUES, bits.device)) if bits.numel() else bits.new_zeros(0)
    return packed.to(torch.uint8).reshape(*bits.shape[:-1], nb)


def _unpack(table: torch.Tensor, b: torch.Tensor, w: int) -> torch.Tensor:
    """Packed bytes [..., nb] -> [..., w]: each byte's 8 bits as `table` gives them (`_SIGNS`, `_LEVELS`). On CPU
    by index_select, several times faster there than indexing with a tensor; elsewhere by `_unpack_shifted`."""
    if b.device.type != "cpu":
        return _unpack_shifted(table, b, w)
    out = _on(table, b.device).index_select(0, b.reshape(-1).long())
    return out.reshape(*b.shape[:-1], b.shape[-1] * 8)[..., :w]


def _unpack_shifted(table: torch.Tensor, b: torch.Tensor, w: int) -> torch.Tensor:
    """`_unpack` by shifting and masking: one elementwise pass, where a GPU's gather of 8-float rows took two
    thirds of the codec's time (findings.md). The same floats: `table` maps bit 0 / 1 to lo / lo + (hi - lo),
    exact for its whole numbers."""
    lo, hi = float(table[0, 0]), float(table[255, 0])
    bits = (b.unsqueeze(-1) >> _on(_SHIFTS, b.device)) & 1
    out = bits.reshape(*b.shape[:-1], b.shape[-1] * 8)[..., :w].float()
    return out.mul_(hi - lo).add_(lo)


def _two_bit_scale(a: torch.Tensor) -> torch.Tensor:
    """|x| [..., w] -> per row the least-squares scale s of the levels s * {1, OUTER_LEVEL} once each entry is
    given the outer level where |x| >= the row's RMS (the Gaussian's best uniform 4-level grid puts that
    threshold at 0.996 RMS): s = sum(|x| l) / sum(l^2). Computed on |x| / the row's max |x|, so nothing
    overflows near float32's largest; a row of subnormals keeps a positive scale. The sums are taken in float64,
    so that the C codec (`sign_native`), which adds in its own order, gets the same floats: a float32 sum's
    rounding depends on the order of its additions, a float64 sum of these floats practically never shows it
    once rounded to float32 (docs/findings.md: the bytes against the float32 sums')."""
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
    return s.where(~((top.squeeze(-1) > 0) & (s == 0)), _TINY)


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
    if x.dim() != 2 or not x.is_floating_point() or sum(segments) != x.shape[1] or min(segments, default=0) < 0:
        raise ValueError(f"sign_encode takes [rows, sum(segments)] floats; got {tuple(x.shape)} {x.dtype} for "
                         f"segments summing to {sum(segments)}")
    if bits not in (1, 2) or (bits == 2 and generator is not None):
        raise ValueError(f"sign_encode codes 1 bit an entry, or 2 without random rounding; got bits={bits!r}")
    rows, heads, bodies = x.shape[0], [], []
    if blocks < 1 or rows % blocks:
        raise ValueError(f"{rows} rows do not split into {blocks} blocks")
    r = rows // blocks
    x = x.detach()
    runs = _equal_width_runs(segments)
    if generator is not None:  # per run [blocks, n, r, w], drawn block by block: a block's shards lie in order in
        draws = [torch.empty(blocks, n, r, w, device=x.device) for _, w, n in runs]  # d[b], so one call draws them
        order = [d[b] for b in range(blocks) for d in draws]  # as one per shard would. Drawn on [0, 2): exactly
        if not sign_native.uniform_0_2(order, generator):     # twice the draws on [0, 1); in C where it can be
            for d in order:
                d.uniform_(0, 2, generator=generator)
    fast = sign_native.usable(x)  # the passes over every entry in C (the same bytes)
    for i, (start, w, n) in enumerate(runs):
        seg = x[:, start:start + n * w].float().reshape(blocks, r, n, w)
        wide = shard_bits(w, bits) == 2
        if wide and fast:
            m = sign_native.two_bit_scales(x, start, n, w, OUTER_LEVEL, _TINY).reshape(blocks, r, n)
        elif wide:
            mag = seg.abs()
            m = _two_bit_scale(mag)
        elif generator is None:  # summed in float64: no overflow near float32's largest, no underflow to 0 of a
            m64 = seg.abs().mean(dim=3, dtype=torch.float64)  # shard holding only subnormals
            m = m64.float().where(~((m64 > 0) & (m64.float() == 0)), _TINY)
        else:  # max |x| from two read-only passes (NaN propagates through both, as through |x|)
            m = torch.maximum(seg.amax(dim=3), seg.amin(dim=3).neg_())
        if fast:  # the base, codes, scales and flags below, in one C pass (the same floats)
            base, q, scale, bad = sign_native.scale_codes(m, generator is not None, CODE_SCALES, CODE_MIDPOINTS,
                                                          ZERO_CODE)
            mode = 2 if generator is not None else 1 if wide else 0
            bodies.append(sign_native.pack(x, start, blocks, n, w, mode, scale, q, bad,
                                           draws[i] if generator is not None else None, OUTER_LEVEL, ZERO_CODE))
            heads.append(base.view(torch.uint8))
            continue
        # the block's largest finite scale (+0.0 where none is positive): a sample gone NaN or inf does not take
        # its block's scales with it
        finite = m.isfinite()
        base = m.where(finite, 0.0).amax(dim=1, keepdim=True).add_(0.0) if r else m.new_zeros(blocks, 1, n)
        q, scale = _scale_codes(m, base, round_up=generator is not None)
        bad = ~finite  # a sample shard holding NaN or inf (see ZERO_CODE): code ZERO_CODE (from _scale_codes), scale 0
        planes = []  # float 0 / 1 (`_flag`)
        if generator is None:
            planes.append(_flag(seg, 0, torch.ge))
            if wide:  # the nearer of the two decoded levels
                planes.append(_flag(mag, scale.unsqueeze(3) * (1 + OUTER_LEVEL) / 2, torch.ge))
        else:
            sc = scale.unsqueeze(3)  # twice P(bit set), 1 + x / M, against draws on [0, 2): no halving pass
            p2 = (seg / torch.where(sc > 0, sc, 1.0)).add_(1)
            unscaled = ~(sc > 0)  # P = 1/2 where the scale is zero; a check of a small tensor saves a pass on CPU
            if x.device.type != "cpu" or bool(unscaled.any()):  # (asking would make a GPU wait)
                p2.masked_fill_(unscaled, 1.0)
            planes.append(_flag(draws[i].transpose(1, 2), p2, torch.lt))
        first = planes[0][..., 0]  # tells a zero sample shard (bit set) from a non-finite one (bit clear)
        first.masked_fill_(q == ZERO_CODE, 1.0).masked_fill_(bad, 0.0)
        body = torch.cat([_pack(b) for b in planes] + [q.unsqueeze(3)], dim=3)
        bodies.append(body.reshape(blocks, r, n * body.shape[3]))
        heads.append(base.reshape(blocks, n).contiguous().view(torch.uint8))
    if not bodies:
        return torch.empty(0, dtype=torch.uint8, device=x.device)
    return torch.cat([torch.cat(heads, dim=1), torch.cat(bodies, dim=2).reshape(blocks, -1)], dim=1).reshape(-1)


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
    bases = _from_bytes(b[:, :BASE_BYTES * S], torch.float32).reshape(blocks, 1, S)
    body = b[:, BASE_BYTES * S:].reshape(blocks, r, -1)
    fast = dtype == torch.float32 and b.device.type == "cpu" and sign_native.loaded() and all(
        width <= 1 or o.stride(1) == 1 for o in out)  # every entry decoded in C (the same floats)
    pos, k = 0, 0  # every column lies in one run (empty segments have none)
    for start, w, n in runs:
        nb, wb = (w + 7) // 8, shard_bits(w, bits)
        e = wb * nb + SCALE_BYTES
        at, pos = pos, pos + n * e
        if fast:  # the scales from the codes too (the same floats)
            for i in range(blocks):
                sign_native.unpack(body[i, :, at:pos], n, w, wb, bases[i, 0, k:k + n], CODE_SCALES, ZERO_CODE,
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
    seconds = _timed(lambda: dist.all_to_all_single(recv, send, _without(layout.fw_block_bytes, rank),
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
    starts = _starts([bn * w for w in widths])
    return [flat[a:a + bn * w].view(bn, w) for a, w in zip(starts, widths)]


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
    starts = _starts([bn * w for w in layout.widths])
    piece = _pieces(grad, bn, layout.widths)
    pieces = []
    for group in _peer_groups(layout.segments, rank):
        w = layout.widths[group[0]]
        if group[-1] - group[0] == len(group) - 1:  # consecutive ranks: their pieces lie side by side, a view
            x = grad[starts[group[0]]:starts[group[0]] + len(group) * bn * w].view(len(group) * bn, w)
        else:  # the group runs around this rank's own piece
            x = torch.cat([piece[q] for q in group])
        pieces.append(sign_encode(x, layout.segments[group[0]], layout.generator, blocks=len(group)))
    send = torch.cat(pieces).contiguous() if pieces else torch.empty(0, dtype=torch.uint8, device=grad.device)
    out = torch.empty((world - 1) * mine, dtype=torch.uint8, device=grad.device)
    seconds = _timed(lambda: dist.all_to_all_single(out, send, _without([mine] * world, rank),
                                                    _without(layout.block_bytes, rank)))
    g = torch.empty(world * bn, layout.widths[rank], dtype=grad.dtype, device=grad.device)
    blocks = [g[q * bn:(q + 1) * bn] for q in range(world)]
    blocks[rank].copy_(piece[rank])
    if world > 1:  # the peers' pieces decode in place, around this rank's own
        sign_decode(out, layout.segments[rank], (world - 1) * bn, blocks=world - 1, dtype=grad.dtype,
                    out=blocks[:rank] + blocks[rank + 1:])
    return g, send.numel(), seconds
