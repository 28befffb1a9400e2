"""DCT-DP (DESIGN.md §5): a DDP communication hook that sends only gradient entries with |g| >= tau.

Per bucket and step:
1. g = bucket / world_size (as PyTorch's default all-reduce hook divides before summing), plus the
   residual carried from the last step when error feedback is on;
2. tau is re-estimated only on the bucket's steps 0, refresh, 2*refresh, ... as the magnitude that
   keeps `keep` of the entries (the k-th largest |g|, k = max(1, floor(keep * n))); in between the
   stale tau is reused, so the number of entries sent varies;
3. the entries with |g| >= tau go out as (index, value) pairs: every rank all_gathers the counts,
   then its indices and values padded to the largest count, and sums what all ranks sent into a
   dense tensor of the bucket's shape (the hook must return one);
4. with error feedback, what was not sent (g - sent) is kept as the bucket's residual.
Choices the source leaves open, each a flag: the statistic (top-k magnitude), the refresh interval
(`--dp_refresh`), error feedback (`--error_feedback on|off`). Bytes are counted from the tensors
handed to the collectives; the dense baseline (`dense_hook`) does what DDP's default hook does and
counts its all_reduce the same way.
"""
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .dlrm import CommStats, nbytes


def _done(t: torch.Tensor) -> torch.futures.Future:
    fut = torch.futures.Future()
    fut.set_result(t)
    return fut


def dense_hook(stats: CommStats, bucket) -> torch.futures.Future[torch.Tensor]:
    """The uncompressed baseline: divide by the world size, all_reduce (as DDP's default hook)."""
    t = bucket.buffer()
    t.div_(dist.get_world_size())
    t0 = time.perf_counter()
    dist.all_reduce(t)
    stats.add("dp", nbytes(t), time.perf_counter() - t0)
    return _done(t)


@dataclass
class DCTState:
    keep: float = 0.01
    refresh: int = 1000
    error_feedback: bool = True
    stats: CommStats = field(default_factory=CommStats)
    tau: dict = field(default_factory=dict)          # bucket index -> threshold
    steps: dict = field(default_factory=dict)        # bucket index -> steps seen
    residual: dict = field(default_factory=dict)     # bucket index -> carried residual
    refreshed_at: list = field(default_factory=list)  # (bucket, step) where tau was re-estimated


def threshold(g: torch.Tensor, keep: float) -> float:
    """The magnitude that keeps `keep` of the entries: the k-th largest |g|."""
    k = max(1, int(keep * g.numel()))
    return float(g.abs().topk(k, sorted=False).values.min())


def dct_hook(state: DCTState, bucket) -> torch.futures.Future[torch.Tensor]:
    world = dist.get_world_size()
    b = bucket.index()
    g = bucket.buffer().div(world)
    if state.error_feedback and b in state.residual:
        g += state.residual[b]
    step = state.steps.get(b, 0)
    if step % state.refresh == 0 or b not in state.tau:
        state.tau[b] = threshold(g, state.keep)
        state.refreshed_at.append((b, step))
    state.steps[b] = step + 1
    idx = torch.nonzero(g.abs() >= state.tau[b]).squeeze(1).to(torch.int32)
    vals = g[idx.long()]
    t0 = time.perf_counter()
    count = torch.tensor([idx.numel()], dtype=torch.int64)
    counts = [torch.empty_like(count) for _ in range(world)]
    dist.all_gather(counts, count)
    m = int(max(c.item() for c in counts))
    pad_idx = torch.zeros(m, dtype=torch.int32)
    pad_val = torch.zeros(m, dtype=g.dtype)
    pad_idx[: idx.numel()] = idx
    pad_val[: vals.numel()] = vals
    all_idx = [torch.empty_like(pad_idx) for _ in range(world)]
    all_val = [torch.empty_like(pad_val) for _ in range(world)]
    dist.all_gather(all_idx, pad_idx)
    dist.all_gather(all_val, pad_val)
    state.stats.add("dp", nbytes(count, pad_idx, pad_val), time.perf_counter() - t0)
    out = torch.zeros_like(g)
    for c, i, v in zip(counts, all_idx, all_val):
        n = int(c.item())
        out.index_add_(0, i[:n].long(), v[:n])
    if state.error_feedback:
        g[idx.long()] = 0  # g is this hook's own copy: what stays is what was not sent
        state.residual[b] = g
    buf = bucket.buffer()
    buf.copy_(out)
    return _done(buf)
