"""The DLRM of hybrid-parallel training (DESIGN.md §5): embeddings model-parallel, MLPs data-parallel.

- `DenseArch`: bottom MLP on dense features -> dot interaction of it with every table's pooled
  embedding (all of one dim D) -> top MLP on [bottom output, upper-triangle dot products] -> logit.
  Trained data-parallel under DDP.
- `ShardedEmbeddings`: the column shards a sharding plan gives this rank, one `EmbeddingBag` each,
  initialised from the full table's deterministic init (so every placement starts from the same
  model). Its forward pools them for the *global* batch: [B, W_r], W_r = sum of its shard widths.
- `pooled_all_to_all`: the forward all-to-all of pooled embeddings (each rank gets its slice of the
  batch from every rank) and, in backward, the all-to-all of their gradients. With `mp_keep` < 1
  it is DCT-MP, as `--mp_scope` says (`compression.mp_topk`, `compression.mp_sign`): `table` sends per sample the
  `max(1, ceil(mp_keep * w))` largest-magnitude entries of each table shard of width w, `rank` the
  `max(1, floor(mp_keep * W_r))` largest of the rank's whole width (fp16 values plus column indices,
  one byte all-to-all with a fixed count per sample; backward returns only those entries' fp32
  gradients, every other entry is zero on the receiver and gets zero gradient); `sign` sends one bit per
  entry plus one 8-bit scale code per sample and table shard, both ways (the sign forward, an unbiased random
  rounding of the gradient backward); `sign2` (the default) sends two bits an entry forward (sign and
  magnitude) on shards of 88 columns or more, and is `sign` otherwise. `mp_keep >= 1` sends everything: the
  dense all-to-all.
- `assemble`: the received pieces -> [B/N, T, D] in table order (column shards put back in place).
Every collective records the bytes that leave the rank (`CommStats`; DP: the tensors it is given).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from ..compression import mp_sign, mp_topk
from ..compression.wire import bytes_leaving


@dataclass
class CommStats:
    """Bytes sent to other ranks and seconds spent in collectives, per kind ("mp", "dp"); and `mp_codec_s`,
    the seconds DCT-MP's coding took around its collectives (encoding, decoding, gathering the gradients to
    return; DCT-DP's coding is `dct.HookState.codec_s`)."""

    bytes: dict = field(default_factory=lambda: {"mp": 0, "dp": 0})
    seconds: dict = field(default_factory=lambda: {"mp": 0.0, "dp": 0.0})
    mp_codec_s: float = 0.0

    def add(self, kind: str, nbytes: int, seconds: float) -> None:
        self.bytes[kind] += int(nbytes)
        self.seconds[kind] += seconds

    def reset(self) -> None:
        self.bytes = {"mp": 0, "dp": 0}
        self.seconds = {"mp": 0.0, "dp": 0.0}
        self.mp_codec_s = 0.0


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _mlp(sizes, final_relu=True) -> nn.Sequential:
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or final_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DenseArch(nn.Module):
    def __init__(self, dense_dim: int, num_tables: int, emb_dim: int, bottom=(64, 32), top=(64, 32)):
        super().__init__()
        self.bottom = _mlp([dense_dim, *bottom, emb_dim])
        F = num_tables + 1
        self.register_buffer("triu", torch.triu_indices(F, F, offset=1), persistent=False)
        self.top = _mlp([emb_dim + F * (F - 1) // 2, *top, 1], final_relu=False)

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """dense [b, d], emb [b, T, D] -> logits [b]."""
        z = self.bottom(dense)
        feats = torch.cat([z.unsqueeze(1), emb], dim=1)
        dots = torch.bmm(feats, feats.transpose(1, 2))[:, self.triu[0], self.triu[1]]
        return self.top(torch.cat([z, dots], dim=1)).squeeze(-1)


def table_init(rows: int, dim: int, table: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 100_003 + table)
    return (torch.rand(rows, dim, generator=g) * 2 - 1) / dim ** 0.5


class ShardedEmbeddings(nn.Module):
    """This rank's column shards: [(table, col_start, width)], in plan order."""

    def __init__(self, shards: list[tuple[int, int, int]], num_rows: list[int], emb_dim: int, seed: int):
        super().__init__()
        self.shards = shards
        self.bags = nn.ModuleList()
        for t, c, w in shards:
            bag = nn.EmbeddingBag(num_rows[t], w, mode="sum")
            with torch.no_grad():
                bag.weight.copy_(table_init(num_rows[t], emb_dim, t, seed)[:, c:c + w])
            self.bags.append(bag)

    @property
    def width(self) -> int:
        return sum(w for _, _, w in self.shards)

    def forward(self, sparse, batch: int) -> torch.Tensor:
        """sparse: per table (ids, bag offsets) of the global batch -> [B, W_r]."""
        if not self.shards:
            return torch.zeros(batch, 0, requires_grad=True)
        return torch.cat([bag(*sparse[t]) for bag, (t, _, _) in zip(self.bags, self.shards)], dim=1)


class _AllToAll(torch.autograd.Function):
    """Dense forward all-to-all of pooled embeddings; its gradients go back in backward. Bytes counted: what
    leaves the rank (its own piece stays home), as for the compressed exchanges."""

    @staticmethod
    def forward(ctx, pooled, widths, stats):
        world, rank = dist.get_world_size(), dist.get_rank()
        bn = pooled.shape[0] // world
        send = pooled.reshape(world, bn, -1).contiguous()  # rows of rank j's samples
        recv = torch.empty(sum(widths) * bn, dtype=pooled.dtype)
        t0 = time.perf_counter()
        send_splits = [bn * widths[rank]] * world
        dist.all_to_all_single(recv, send.reshape(-1), [bn * w for w in widths], send_splits)
        stats.add("mp", bytes_leaving(send_splits, rank, send.element_size()), time.perf_counter() - t0)
        ctx.widths, ctx.stats, ctx.bn = widths, stats, bn
        return recv

    @staticmethod
    def backward(ctx, grad):
        world, rank = dist.get_world_size(), dist.get_rank()
        widths, bn = ctx.widths, ctx.bn
        out = torch.empty(world * bn * widths[rank], dtype=grad.dtype)
        grad = grad.contiguous()
        t0 = time.perf_counter()
        send_splits = [bn * w for w in widths]
        dist.all_to_all_single(out, grad, [bn * widths[rank]] * world, send_splits)
        ctx.stats.add("mp", bytes_leaving(send_splits, rank, grad.element_size()), time.perf_counter() - t0)
        return out.reshape(world * bn, widths[rank]), None, None


class _CompressedAllToAll(torch.autograd.Function):
    """DCT-MP: the forward all-to-all of pooled embeddings and the backward of their gradients, compressed
    as `layout` says (`compression`'s DCT-MP codecs, the ones the comm-cost measurements use). A
    `TopKLayout`: per sample the k largest-magnitude entries go forward as fp16 values plus column
    indices, and backward returns only those entries' gradients (fp32). A `SignLayout`:
    one bit per entry plus one scale per sample and column shard, both ways (`mp_sign`'s scope `sign`)."""

    @staticmethod
    def forward(ctx, pooled, layout, stats):
        t0 = time.perf_counter()
        dense, ctx.state, sent, seconds = layout.forward_exchange(pooled)
        stats.add("mp", sent, seconds)
        stats.mp_codec_s += time.perf_counter() - t0 - seconds  # all but the collective
        ctx.layout, ctx.stats = layout, stats
        return dense

    @staticmethod
    def backward(ctx, grad):
        t0 = time.perf_counter()
        g_pooled, sent, seconds = ctx.layout.backward_exchange(grad.contiguous(), ctx.state)
        ctx.stats.add("mp", sent, seconds)
        ctx.stats.mp_codec_s += time.perf_counter() - t0 - seconds
        return g_pooled, None, None


def pooled_all_to_all(pooled: torch.Tensor, widths: list[int], stats: CommStats, mp_keep: float | None = None,
                      segments: list[list[int]] | None = None, scope: str = "rank",
                      generator: torch.Generator | None = None):
    """[B, W_r] on every rank -> flat received pieces ([B/N, W_q] from each rank q, in rank order).

    `mp_keep` None or >= 1 (everything is sent): the dense all-to-all. Below 1, DCT-MP as `scope` says:
    `rank`: one top-k over each rank's whole width (`segments` not used); `table`: a top-k per column
    shard (`segments`: per rank its shard widths); `sign`: one bit per entry and a scale per column
    shard (`mp_keep` sets nothing more; `generator` draws the backward's random rounding); `sign2`: as `sign`
    with two bits an entry forward (sign and magnitude) on shards `mp_sign.shard_bits` gives two."""
    if mp_keep is not None and mp_keep < 1:
        if scope in ("sign", "sign2"):
            layout = mp_sign.SignLayout(widths, pooled.shape[0], segments, generator,
                                        fw_bits=2 if scope == "sign2" else 1)
        else:
            layout = mp_topk.TopKLayout(widths, mp_keep, pooled.shape[0], segments if scope == "table" else None)
        return _CompressedAllToAll.apply(pooled, layout, stats)
    return _AllToAll.apply(pooled, widths, stats)


def assemble(received: torch.Tensor, rank_shards: list[list[tuple[int, int, int]]], bn: int, num_tables: int,
             emb_dim: int) -> torch.Tensor:
    """Flat received pieces -> [B/N, T, D]: every column shard put back at its table and columns."""
    pos = 0
    cols = []
    for shards in rank_shards:
        w_q = sum(w for _, _, w in shards)
        block = received[pos: pos + bn * w_q].reshape(bn, w_q)
        c0 = 0
        for t, c, w in shards:
            cols.append((t, c, w, block[:, c0:c0 + w]))
            c0 += w
        pos += bn * w_q
    pieces = sorted(cols, key=lambda x: (x[0], x[1]))
    return torch.stack([torch.cat([p for tt, _, _, p in pieces if tt == t], dim=1) for t in range(num_tables)], dim=1)
