"""DCT-MP's top-k codec (DESIGN.md §5): scopes `table` and `rank` (`--mp_scope`) of the compressed pooled-embedding
all-to-all, in one implementation used by training (`training/dlrm.py`'s `_CompressedAllToAll`) and by the
comm-cost measurements (`hardware/comm_bench`), so cost data is measured exactly as DCT-MP sends.

Forward: rank r holds pooled embeddings [B, W_r] for the global batch, its column shards side by side.
Per sample it keeps the largest-magnitude entries of each segment: scope `table`: every column shard s of width
w_s is a segment and keeps k_s = max(1, ceil(keep * w_s)) entries, so every table reaches every dot product;
scope `rank`: the rank's whole width is one segment, k_r = max(1, floor(keep * W_r)), and its tables compete for
those entries. It sends them as fp16 values (clamped to fp16's range) followed by their indices within their
segment, in the smallest integer type that holds the widest segment of any rank (`index_dtype`: uint8 up to 256
columns, int16 up to 32768, else int32), all packed into ONE uint8 all-to-all with a fixed count per sample
(`wire`: gloo's all_to_all does not carry int16). So rank r sends `B * K_r * (2 + index bytes)` bytes in all,
K_r = the sum of its segments' counts (`fw_send_bytes`). The receiver adds each segment's start column back and
scatters each peer's entries into a dense [B/N, W_q] block of zeros.
Backward: each rank sends back the fp32 gradients of exactly the entries it received, `B/N * sum_q K_q * 4` bytes
(`bw_send_bytes`); the sender scatters them to its kept entries (every other entry gets zero gradient).
A rank's own block travels through these collectives coded like the others; the bytes reported as sent are those
that leave the rank, (N-1)/N of `fw_send_bytes` / `bw_send_bytes` when the ranks' widths are equal.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .wire import FP16_MAX, bytes_leaving, from_bytes, on_device, starts, timed

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
    B * K_r * entry_bytes, K_r = the sum of its segments' keep counts (see `TopKLayout`)."""
    layout = TopKLayout(widths, keep, batch_size, segments)
    return batch_size * layout.ks[rank] * layout.entry


def bw_send_bytes(widths, batch_size: int, keep: float, segments=None) -> int:
    """Bytes every rank sends in the backward all-to-all (gradients of the entries it received):
    B/N * sum_q K_q * 4."""
    layout = TopKLayout(widths, keep, batch_size, segments)
    return layout.bn * sum(layout.ks) * GRAD_BYTES


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """[rows, c] of any dtype -> its raw bytes [rows, c * itemsize] (uint8)."""
    if t.numel() == 0:
        return torch.empty(t.shape[0], 0, dtype=torch.uint8, device=t.device)
    return t.contiguous().view(torch.uint8).reshape(t.shape[0], -1)


@dataclass
class TopKLayout:
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
        self.offsets = [torch.tensor([o for o, k in zip(starts(seg), ks) for _ in range(k)], dtype=torch.int64)
                        for seg, ks in zip(self.segments, self.seg_ks)]
        self._offsets_on: dict = {}  # (rank, device) -> that rank's offsets there (`on_device`)

    def offsets_on(self, rank: int, device: torch.device) -> torch.Tensor:
        """Rank `rank`'s offsets on `device`: copied there once per layout, not on every all-to-all."""
        return on_device(self.offsets[rank], device, self._offsets_on, rank)

    def forward_exchange(self, pooled: torch.Tensor):
        return forward_exchange(pooled, self)

    def backward_exchange(self, grad: torch.Tensor, state):
        return backward_exchange(grad, state, self)


def encode(pooled: torch.Tensor, layout: TopKLayout, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, W_r] -> (bytes to send [B, K_r * entry], kept column indices [B, K_r] int64): per segment,
    the indices within it go on the wire, the rank's column indices come back."""
    mag, local = pooled.detach().abs(), []
    for start, w, k in zip(starts(layout.segments[rank]), layout.segments[rank], layout.seg_ks[rank]):
        local.append(mag[:, start:start + w].topk(k, dim=1, sorted=False).indices)
    if local:
        local = torch.cat(local, dim=1)
    else:
        local = torch.zeros(pooled.shape[0], 0, dtype=torch.int64, device=pooled.device)
    idx = local + layout.offsets_on(rank, pooled.device)
    vals = pooled.detach().gather(1, idx).clamp(-FP16_MAX, FP16_MAX).to(torch.float16)
    return torch.cat([_as_bytes(vals), _as_bytes(local.to(layout.itype))], dim=1), idx


def decode(recv: torch.Tensor, layout: TopKLayout, dtype=torch.float32) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Received bytes -> (flat dense pieces, [B/N, W_q] from each rank q in rank order; each peer's
    column indices [B/N, k_q] int64, which the backward needs)."""
    bn, e = layout.bn, layout.entry
    dense, recv_idx, pos = [], [], 0
    for q, (w, kq) in enumerate(zip(layout.widths, layout.ks)):
        block = recv[pos: pos + bn * kq * e].reshape(bn, kq * e)
        v = from_bytes(block[:, : VALUE_BYTES * kq], torch.float16).to(dtype)
        i = from_bytes(block[:, VALUE_BYTES * kq:], layout.itype).long() + layout.offsets_on(q, recv.device)
        dense.append(torch.zeros(bn, w, dtype=dtype, device=recv.device).scatter(1, i, v).reshape(-1))
        recv_idx.append(i)
        pos += bn * kq * e
    return torch.cat(dense), recv_idx


def gather_grads(grad: torch.Tensor, layout: TopKLayout, recv_idx: list[torch.Tensor]) -> torch.Tensor:
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


def forward_exchange(pooled: torch.Tensor, layout: TopKLayout):
    """DCT-MP's forward all-to-all on every rank together: [B, W_r] -> (flat dense received pieces,
    state for `backward_exchange`, bytes sent, seconds in the collective)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    send, idx = encode(pooled, layout, rank)
    k, e, bn = layout.ks[rank], layout.entry, layout.bn
    recv = torch.empty(bn * sum(layout.ks) * e, dtype=torch.uint8, device=pooled.device)
    send_splits = [bn * k * e] * world
    seconds = timed(lambda: dist.all_to_all_single(recv, send.reshape(-1), [bn * x * e for x in layout.ks],
                                                   send_splits))
    dense, recv_idx = decode(recv, layout, pooled.dtype)
    return dense, (idx, recv_idx), bytes_leaving(send_splits, rank), seconds


def backward_exchange(grad: torch.Tensor, state, layout: TopKLayout):
    """DCT-MP's backward all-to-all: flat gradients of the received pieces -> (gradient [B, W_r] of this
    rank's pooled embeddings, bytes sent, seconds in the collective)."""
    idx, recv_idx = state
    rank, world = dist.get_rank(), dist.get_world_size()
    send = gather_grads(grad, layout, recv_idx)
    k, bn = layout.ks[rank], layout.bn
    out = torch.empty(world * bn * k, dtype=grad.dtype, device=grad.device)
    send_splits = [bn * x for x in layout.ks]
    seconds = timed(lambda: dist.all_to_all_single(out, send, [bn * k] * world, send_splits))
    return scatter_grads(out, idx, layout.widths[rank]), bytes_leaving(send_splits, rank, send.element_size()), seconds
