"""DCT-MP's wire format (DESIGN.md §5): the one implementation of the compressed pooled-embedding all-to-all.

Used by training (`training/dlrm.py`'s `_TopKAllToAll`) and by the comm-cost measurements
(`comm_bench`, the measurement engine), so cost data is measured exactly as DCT-MP sends.

Forward: rank r holds pooled embeddings [B, W_r] for the global batch. Per sample it keeps the
`k_r = keep_count(W_r, keep) = max(1, floor(keep * W_r))` (at most W_r; 0 when W_r = 0)
largest-magnitude entries and sends them as fp16 values (clamped to fp16's range) followed by their
column indices, in the smallest integer type that holds every rank's columns (`index_dtype(max_q
W_q)`: uint8 up to 256 columns, int16 up to 32768, else int32), all packed into ONE uint8
all-to-all with a fixed count per sample. So rank r sends `B * k_r * (2 + index bytes)` bytes in
all (`fw_send_bytes`). The receiver scatters each peer's entries into a dense [B/N, W_q] block of
zeros.
Backward: each rank sends back the fp32 gradients of exactly the entries it received,
`B/N * sum_q k_q * 4` bytes (`bw_send_bytes`); the sender scatters them to its kept entries
(every other entry gets zero gradient).

gloo's all_to_all does not carry int16, hence the raw-byte packing.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

FP16_MAX = 65504.0
VALUE_BYTES = 2   # fp16 values forward
GRAD_BYTES = 4    # fp32 gradients backward


def keep_count(width: int, keep: float) -> int:
    """Entries of a sample a rank with `width` columns sends: max(1, floor(keep * width)), 0 for no columns."""
    return 0 if width == 0 else min(width, max(1, int(keep * width)))


def index_dtype(width: int) -> torch.dtype:
    """Smallest index type for column indices below `width`."""
    return torch.uint8 if width <= 256 else torch.int16 if width <= 32768 else torch.int32


def entry_bytes(widths) -> int:
    """Bytes of one kept entry forward (fp16 value + index) when the ranks' widths are `widths`."""
    return VALUE_BYTES + torch.empty(0, dtype=index_dtype(max(widths))).element_size()


def fw_send_bytes(widths, rank: int, batch_size: int, keep: float) -> int:
    """Bytes rank `rank` sends in the forward all-to-all (all peers, itself included)."""
    return batch_size * keep_count(int(widths[rank]), keep) * entry_bytes(widths)


def bw_send_bytes(widths, batch_size: int, keep: float) -> int:
    """Bytes every rank sends in the backward all-to-all (gradients of the entries it received)."""
    bn = batch_size // len(widths)
    return bn * sum(keep_count(int(w), keep) for w in widths) * GRAD_BYTES


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """[rows, c] of any dtype -> its raw bytes [rows, c * itemsize] (uint8)."""
    if t.numel() == 0:
        return torch.empty(t.shape[0], 0, dtype=torch.uint8, device=t.device)
    return t.contiguous().view(torch.uint8).reshape(t.shape[0], -1)


def _from_bytes(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Raw bytes [rows, c * itemsize] (uint8) -> [rows, c] of `dtype`."""
    if b.numel() == 0:
        return torch.empty(b.shape[0], 0, dtype=dtype, device=b.device)
    return b.contiguous().view(dtype)


@dataclass
class WireLayout:
    """What every rank agrees on: the ranks' widths, the keep fraction and the per-sample counts."""
    widths: list[int]
    keep: float
    batch_size: int

    def __post_init__(self):
        self.widths = [int(w) for w in self.widths]
        self.ks = [keep_count(w, self.keep) for w in self.widths]
        self.itype = index_dtype(max(self.widths))
        self.entry = entry_bytes(self.widths)
        self.bn = self.batch_size // len(self.widths)


def encode(pooled: torch.Tensor, layout: WireLayout, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, W_r] -> (bytes to send [B, k_r * entry], kept column indices [B, k_r] int64)."""
    k = layout.ks[rank]
    if k:
        idx = pooled.detach().abs().topk(k, dim=1, sorted=False).indices
    else:
        idx = torch.zeros(pooled.shape[0], 0, dtype=torch.int64, device=pooled.device)
    vals = pooled.detach().gather(1, idx).clamp(-FP16_MAX, FP16_MAX).to(torch.float16)
    return torch.cat([_as_bytes(vals), _as_bytes(idx.to(layout.itype))], dim=1), idx


def decode(recv: torch.Tensor, layout: WireLayout, dtype=torch.float32) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Received bytes -> (flat dense pieces, [B/N, W_q] from each rank q in rank order; each peer's
    column indices [B/N, k_q] int64, which the backward needs)."""
    bn, e = layout.bn, layout.entry
    dense, recv_idx, pos = [], [], 0
    for w, kq in zip(layout.widths, layout.ks):
        block = recv[pos: pos + bn * kq * e].reshape(bn, kq * e)
        v = _from_bytes(block[:, : VALUE_BYTES * kq], torch.float16).to(dtype)
        i = _from_bytes(block[:, VALUE_BYTES * kq:], layout.itype).long()
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
    seconds = _timed(lambda: dist.all_to_all_single(recv, send.reshape(-1), [bn * x * e for x in layout.ks],
                                                    [bn * k * e] * world))
    dense, recv_idx = decode(recv, layout, pooled.dtype)
    return dense, (idx, recv_idx), send.numel(), seconds


def backward_exchange(grad: torch.Tensor, state, layout: WireLayout):
    """DCT-MP's backward all-to-all: flat gradients of the received pieces -> (gradient [B, W_r] of this
    rank's pooled embeddings, bytes sent, seconds in the collective)."""
    idx, recv_idx = state
    rank, world = dist.get_rank(), dist.get_world_size()
    send = gather_grads(grad, layout, recv_idx)
    k, bn = layout.ks[rank], layout.bn
    out = torch.empty(world * bn * k, dtype=grad.dtype, device=grad.device)
    seconds = _timed(lambda: dist.all_to_all_single(out, send, [bn * k] * world, [bn * x for x in layout.ks]))
    return scatter_grads(out, idx, layout.widths[rank]), send.numel() * send.element_size(), seconds
