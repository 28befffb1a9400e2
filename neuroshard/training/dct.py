"""DCT-DP (DESIGN.md §5): a DDP communication hook that sends only gradient entries with |g| >= tau.

Per bucket and DDP iteration:
1. g = bucket / world_size (as PyTorch's default all-reduce hook divides before summing), plus, with
   error feedback, the residual each of the bucket's parameters carried from the last iteration;
2. tau is re-estimated on iterations 0, refresh, 2*refresh, ... (and the first time a bucket with a
   new set of parameters is seen) as the magnitude that keeps `keep` of the entries (the k-th largest
   |g|, k = max(1, floor(keep * n))); in between the stale tau is reused, so the count sent varies.
   Drift bound: when the stale tau would send more than `drift * k` entries, tau is re-estimated on
   the spot (the k-th largest |g| among the entries over the stale tau, which holds the k largest);
   if ties still leave more than floor(drift * k), only the k largest go out. So no rank ever sends
   more than max(k, floor(drift * k)) entries of a bucket;
3. the entries with |g| >= tau (zeros never) go out encoded: sorted indices as 16-bit deltas (a gap
   over 65,535 is bridged by filler entries of delta 65,535 and value 0) and fp16 values, 4 bytes an
   entry. Every rank all_gathers the entry counts (one int32), then its payload padded to the largest
   count, and sums what all ranks sent into a dense tensor of the bucket's shape (the hook must
   return one). Should the padded payload be no smaller than the bucket itself, the bucket goes out
   dense (all_reduce) instead; `keep >= 1` always does, exactly as `dense_hook`;
4. with error feedback, what was not delivered (g minus the fp16 value that went out) is kept per
   parameter as its residual.
State survives DDP's bucket rebuild (after the first iteration DDP regroups parameters into new
buckets, as PyTorch's PowerSGD hook guards against): residuals are keyed by parameter, thresholds
by the bucket's set of parameters, and iterations are counted by the hook itself (on each
iteration's last bucket), never by bucket index.
Choices the source leaves open, each a flag: the statistic (top-k magnitude), the refresh interval
(`--dp_refresh`), the drift bound (`--dp_drift`), error feedback (`--error_feedback on|off`); the
encoding (delta-16 indices, fp16 values) is this project's. Bytes are counted from the tensors
handed to the collectives; the dense baseline (`dense_hook`) does what DDP's default hook does and
counts its all_reduce the same way.
"""

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .dlrm import CommStats, nbytes

MAX_DELTA = 65535  # largest index gap one uint16 delta carries
FP16_MAX = 65504.0
MIN_POSITIVE = float(torch.finfo(torch.float32).tiny) * 2 ** -23  # smallest positive float32


def _done(t: torch.Tensor) -> torch.futures.Future:
    fut = torch.futures.Future()
    fut.set_result(t)
    return fut


def _all_reduce_dense(t: torch.Tensor, stats: CommStats, extra_bytes: int = 0) -> None:
    t0 = time.perf_counter()
    dist.all_reduce(t)
    stats.add("dp", extra_bytes + nbytes(t), time.perf_counter() - t0)


def dense_hook(stats: CommStats, bucket) -> torch.futures.Future[torch.Tensor]:
    """The uncompressed baseline: divide by the world size, all_reduce (as DDP's default hook)."""
    t = bucket.buffer()
    t.div_(dist.get_world_size())
    _all_reduce_dense(t, stats)
    return _done(t)


@dataclass
class DCTState:
    """DCT-DP's hyperparameters and the state it carries between iterations.

    keep: target share of a bucket's entries sent (k = max(1, floor(keep * n))).
    refresh: iterations between threshold re-estimates.
    error_feedback: carry what was not sent to the next iteration (per parameter).
    drift: re-estimate tau early once the stale tau would send more than drift * k entries.
    """

    keep: float = 0.005
    refresh: int = 100
    error_feedback: bool = True
    stats: CommStats = field(default_factory=CommStats)
    drift: float = 1.5
    iteration: int = 0                                # DDP iterations completed
    tau: dict = field(default_factory=dict)           # frozenset of parameter ids -> threshold
    residual: dict = field(default_factory=dict)      # parameter id -> carried residual (its shape, flat)
    refreshed_at: list = field(default_factory=list)  # (iteration, bucket index, reason)
    sent: list = field(default_factory=list)          # (iteration, bucket index, n, k, entries sent)


def threshold(g: torch.Tensor, keep: float) -> float:
    """The magnitude that keeps `keep` of the entries: the k-th largest |g|."""
    return float(g.abs().topk(keep_count(g.numel(), keep), sorted=False).values.min())


def keep_count(n: int, keep: float) -> int:
    return max(1, int(keep * n))


def drift_cap(k: int, drift: float) -> int:
    """The most entries one rank sends of a bucket whose target is k."""
    return max(k, int(drift * k))


def encode(idx: torch.Tensor, vals: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sorted int64 indices and their values -> (uint16 deltas, fp16 values) with fillers, and where
    the real entries are among them."""
    gaps = torch.diff(idx, prepend=idx.new_zeros(1))
    fill = torch.clamp((gaps - 1) // MAX_DELTA, min=0)
    m = idx.numel() + int(fill.sum())
    real = torch.cumsum(fill + 1, 0) - 1  # where each real entry lands among the m
    deltas = torch.full((m,), MAX_DELTA, dtype=torch.int32)
    deltas[real] = (gaps - MAX_DELTA * fill).to(torch.int32)
    out = torch.zeros(m, dtype=torch.float16)
    out[real] = vals.clamp(-FP16_MAX, FP16_MAX).to(torch.float16)
    return deltas.to(torch.uint16), out, real


def payload_bytes(deltas: torch.Tensor, vals: torch.Tensor, m: int) -> torch.Tensor:
    """One uint8 payload of m entries (padding: delta 0, value 0): deltas, then values."""
    d = torch.zeros(m, dtype=torch.uint16)
    v = torch.zeros(m, dtype=torch.float16)
    d[: deltas.numel()] = deltas
    v[: vals.numel()] = vals
    return torch.cat([d.view(torch.uint8), v.view(torch.uint8)])


def decode_into(out: torch.Tensor, payload: torch.Tensor, m: int) -> None:
    """Add a rank's payload of m (padded) entries into the dense `out`."""
    pos = torch.cumsum(payload[: 2 * m].view(torch.uint16).to(torch.int64), 0)
    out.index_add_(0, pos, payload[2 * m:].view(torch.float16).float())


def dct_hook(state: DCTState, bucket) -> torch.futures.Future[torch.Tensor]:
    world = dist.get_world_size()
    buf = bucket.buffer()
    if state.keep >= 1:  # everything goes out: the dense all_reduce, bit for bit
        fut = dense_hook(state.stats, bucket)
        if bucket.is_last():
            state.iteration += 1
        return fut
    params = bucket.parameters()
    sizes = [p.numel() for p in params]
    g = buf.div(world)
    if state.error_feedback:
        for p, piece in zip(params, torch.split(g, sizes)):
            r = state.residual.get(id(p))
            if r is not None:
                piece += r
    n, b = g.numel(), bucket.index()
    key = frozenset(id(p) for p in params)
    k, it = keep_count(n, state.keep), state.iteration
    cap = drift_cap(k, state.drift)
    if it % state.refresh == 0 or key not in state.tau:
        state.tau[key] = threshold(g, state.keep)
        state.refreshed_at.append((it, b, "scheduled" if it % state.refresh == 0 else "new bucket"))
    mag = g.abs()
    idx = torch.nonzero(mag >= max(state.tau[key], MIN_POSITIVE)).squeeze(1)  # zeros never go out
    if idx.numel() > cap:  # the stale tau drifted: re-estimate now, exactly and cheaply, since the
        cand = mag[idx]    # k largest entries are all among these candidates
        top = cand.topk(k, sorted=False)
        state.tau[key] = float(top.values.min())
        state.refreshed_at.append((it, b, "drift"))
        keep_idx = torch.nonzero(cand >= state.tau[key]).squeeze(1)
        if keep_idx.numel() > cap:  # ties at tau: only the k largest
            keep_idx = torch.sort(top.indices).values
        idx = idx[keep_idx]
    deltas, vals, real = encode(idx, g[idx])
    state.sent.append((it, b, n, k, idx.numel()))
    t0 = time.perf_counter()
    count = torch.tensor([deltas.numel()], dtype=torch.int32)
    counts = [torch.empty_like(count) for _ in range(world)]
    dist.all_gather(counts, count)
    m = int(max(c.item() for c in counts))
    count_s = time.perf_counter() - t0
    if 4 * m >= 4 * n:  # compressed is no smaller than dense: send the bucket as it is
        state.stats.add("dp", nbytes(count), count_s)
        _all_reduce_dense(g, state.stats)
        if state.error_feedback:
            for p in params:
                state.residual.pop(id(p), None)
        buf.copy_(g)
    elif m == 0:  # nothing to send anywhere: every entry is under tau (or zero) on every rank
        state.stats.add("dp", nbytes(count), count_s)
        if state.error_feedback:  # nothing was delivered, so all of g waits for a later iteration
            for p, piece in zip(params, torch.split(g, sizes)):
                state.residual[id(p)] = piece
        buf.zero_()
    else:
        payload = payload_bytes(deltas, vals, m)
        gathered = [torch.empty_like(payload) for _ in range(world)]
        t0 = time.perf_counter()
        dist.all_gather(gathered, payload)
        state.stats.add("dp", nbytes(count, payload), count_s + time.perf_counter() - t0)
        if state.error_feedback:
            g[idx] -= vals[real].float()  # what arrives is the fp16 value: the rest stays
            for p, piece in zip(params, torch.split(g, sizes)):
                state.residual[id(p)] = piece
        buf.zero_()
        for part in gathered:
            decode_into(buf, part, m)
    if bucket.is_last():
        state.iteration += 1
    return _done(buf)
