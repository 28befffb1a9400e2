"""All-to-all costs (DESIGN.md §3.2): forward all-to-all of pooled embeddings and backward
all-to-all of their gradients, per rank, with straggler delays.

Rank r holds pooled embeddings [B, dim_sum_r] for the global batch and sends each peer its slice
[B/N, dim_sum_r]; it receives [B/N, dim_sum_q] from every peer q. The backward all-to-all sends the
gradients back the other way. Forward costs are measured from the moment the rank starts (after its
delay), so a rank that arrives early pays for waiting and the straggler does not pay its own delay.

With `mp_keep` (DCT-MP, `CompressedAllToAll`) both all-to-alls are DCT-MP's own (`mp_topk`): the
forward encodes every sample's top-k entries, exchanges the bytes and scatters them back to dense
blocks; the backward gathers the received entries' gradients, exchanges them and scatters them back.
The encode/scatter work is timed with the exchange: it is part of what compression costs a step.

With `input_dist` the collector measures TorchRec's input distribution instead (DESIGN.md §3.4b): TorchRec's own
`KJTAllToAll`, which sends each rank the ids and lengths of the features its shards read (one all-to-all of the
split sizes, then one per tensor). Rank r holds the global batch's [B/N] samples of every feature and receives
all B samples of its own features; its input words are 2 x pooling + 2 per feature and sample (an int64 id or
length being two 4-byte words), and the sample records them with each rank's cost.

With `collectives` it measures the three collectives TorchRec's row-wise and data-parallel groups run
(`Collectives`), for one width w drawn per sample (`sample_collective_width`; w is in the comm models' unit, floats
per sample of the global batch B, the same on every rank): the reduce-scatter of a row-wise group's pooled partial
sums (each rank's [B, w] summed and cut into [B/N, w] blocks), the all-gather of their gradients ([B/N, w] to
[B, w]), and the all-reduce of a data-parallel group's gradient, sized so a ring sends w x B floats a rank
(w x B x N / (2 (N - 1)) floats).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from ..core.errors import UserError
from ..data.features import dim_choices, input_words
from ..compression import mp_topk
from .launch import quiet_torchrec_logs

COMM_DATA_KIND = "neuroshard.comm_cost_data"


class AllToAll:
    """Buffers and split sizes of one rank's forward and backward all-to-all."""

    def __init__(self, dim_sums, batch_size: int, rank: int, device: str):
        N = len(dim_sums)
        bn = batch_size // N
        d = [int(x) for x in dim_sums]
        self.device = device
        self.fw_in = torch.randn(bn * N * d[rank], device=device)
        self.fw_out = torch.empty(bn * sum(d), device=device)
        self.fw_in_splits, self.fw_out_splits = [bn * d[rank]] * N, [bn * x for x in d]
        self.bw_in = torch.randn(bn * sum(d), device=device)
        self.bw_out = torch.empty(bn * N * d[rank], device=device)
        self.bw_in_splits, self.bw_out_splits = self.fw_out_splits, self.fw_in_splits

    def forward(self):
        dist.all_to_all_single(self.fw_out, self.fw_in, self.fw_out_splits, self.fw_in_splits)

    def backward(self):
        dist.all_to_all_single(self.bw_out, self.bw_in, self.bw_out_splits, self.bw_in_splits)


class CompressedAllToAll:
    """One rank's forward and backward all-to-all as DCT-MP sends them (`mp_keep` < 1)."""

    def __init__(self, dim_sums, batch_size: int, rank: int, device: str, mp_keep: float):
        self.layout = mp_topk.TopKLayout([int(x) for x in dim_sums], mp_keep, batch_size)
        self.device = device
        self.pooled = torch.randn(batch_size, self.layout.widths[rank], device=device)
        self.grad = torch.randn(self.layout.bn * sum(self.layout.widths), device=device)
        _, self.state, _, _ = mp_topk.forward_exchange(self.pooled, self.layout)  # the entries backward returns

    def forward(self):
        mp_topk.forward_exchange(self.pooled, self.layout)

    def backward(self):
        mp_topk.backward_exchange(self.grad, self.state, self.layout)


def make_all_to_all(dim_sums, batch_size: int, rank: int, device: str, mp_keep: float | None = None):
    """The dense all-to-all, or DCT-MP's compressed one when `mp_keep` < 1; call on all ranks together."""
    if mp_keep is not None and mp_keep < 1:
        return CompressedAllToAll(dim_sums, batch_size, rank, device, mp_keep)
    return AllToAll(dim_sums, batch_size, rank, device)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed_collective(fn, device: str, delay_ms: float, warmup: int, iters: int) -> float:
    """Median ms of `fn` on this rank, started `delay_ms` after a barrier, delay not counted."""
    times = []
    for i in range(warmup + iters):
        _sync(device)
        dist.barrier()
        if delay_ms > 0:
            time.sleep(delay_ms / 1e3)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def gather_floats(values, device: str) -> list[list[float]]:
    """All ranks' float lists, [world][len]."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [o.cpu().tolist() for o in out]


def sample_comm(index: int, seed: int, N: int, T_range, max_dim: int, sleep_range) -> tuple[np.ndarray, np.ndarray]:
    """Dim sums from a randomised greedy split of a random task, and per-rank delays (ms)."""
    rng = np.random.default_rng([seed, index])
    T = int(rng.integers(*T_range))
    dims = rng.choice(dim_choices(max_dim), T)
    p = rng.random()
    dim_sums = np.zeros(N, dtype=np.int64)
    for d in dims:
        r = int(rng.integers(N)) if rng.random() < p else int(np.argmin(dim_sums))
        dim_sums[r] += d
    spread = rng.uniform(*sleep_range)
    delays = rng.uniform(0, spread, N)
    return dim_sums, delays - delays.min()


def measure_layout(rank: int, dim_sums, delays_ms, batch_size: int, device: str, warmup: int, iters: int,
                   mp_keep: float | None = None):
    """Every rank's (forward ms, backward ms) for one layout; call on all ranks together."""
    a2a = make_all_to_all(dim_sums, batch_size, rank, device, mp_keep)
    bw = timed_collective(a2a.backward, device, 0.0, warmup, iters)
    fw = timed_collective(a2a.forward, device, float(delays_ms[rank]), warmup, iters)
    costs = gather_floats([fw, bw], device)
    return np.array([c[0] for c in costs]), np.array([c[1] for c in costs])


INPUT_POOLING_ONE = 0.4  # share of input-distribution features with one id per sample (the one-hot sets')
INPUT_MAX_POOLING = 120  # the others draw their ids per sample uniformly from 2..this


def sample_input(index: int, seed: int, N: int, T_range, max_pooling: int = INPUT_MAX_POOLING
                 ) -> list[list[int]]:
    """Per rank the pooling factors of the features it receives: T features (from `T_range`), each one-hot or
    multi-hot, placed by a randomised greedy split of their input words (as `sample_comm` splits dims)."""
    rng = np.random.default_rng([seed, index, 1])
    T = max(int(rng.integers(*T_range)), N)
    pooling = np.where(rng.random(T) < INPUT_POOLING_ONE, 1, rng.integers(2, max_pooling + 1, T))
    p = rng.random()
    ranks: list[list[int]] = [[] for _ in range(N)]
    words = np.zeros(N)
    for i, f in enumerate(pooling):
        r = i if i < N else (int(rng.integers(N)) if rng.random() < p else int(np.argmin(words)))
        ranks[r].append(int(f))
        words[r] += float(input_words(f))
    return ranks


def torchrec_available() -> bool:
    """Whether TorchRec's KJTAllToAll can be imported (the input distribution is measured with it)."""
    try:
        import torchrec.distributed.dist_data  # noqa: F401
    except ImportError:
        return False
    return True


class InputDist:
    """One rank's part of TorchRec's input distribution for per-rank pooling factors (`sample_input`, or the
    user's tables' for calibration: a fractional pooling factor is met on average over the samples)."""

    @staticmethod
    def check_torchrec() -> None:
        if not torchrec_available():
            raise UserError("measuring the input distribution runs TorchRec's KJTAllToAll, and torchrec is not "
                            "installed; run `make setup` (it installs torchrec 1.9.2)")

    def __init__(self, pooling: list[list[int]], batch_size: int, rank: int, device: str):
        self.check_torchrec()
        quiet_torchrec_logs()
        from torchrec.distributed.dist_data import KJTAllToAll
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        bn = batch_size // len(pooling)
        flat = [float(p) for r in pooling for p in r]
        # sample i of a feature reads floor(p (i + 1)) - floor(p i) ids: p each for a whole p, p on average else
        i = torch.arange(bn + 1, dtype=torch.float64)
        lengths = torch.cat([torch.diff(torch.floor(p * i)).to(torch.int64) for p in flat])
        gen = torch.Generator().manual_seed(rank)
        self.kjt = KeyedJaggedTensor(keys=[f"f{i}" for i in range(len(flat))], lengths=lengths,
                                     values=torch.randint(0, 1 << 20, (int(lengths.sum()),), generator=gen,
                                                          dtype=torch.int64)).to(torch.device(device))
        self.a2a = KJTAllToAll(dist.group.WORLD, [len(r) for r in pooling])

    def run(self):
        self.a2a(self.kjt).wait().wait()


def measure_input(rank: int, pooling: list[list[int]], batch_size: int, device: str, warmup: int, iters: int
                  ) -> np.ndarray:
    """Every rank's input-distribution ms for one layout; call on all ranks together."""
    return np.array([c[0] for c in gather_floats([timed_collective(
        InputDist(pooling, batch_size, rank, device).run, device, 0.0, warmup, iters)], device)])


COLLECTIVES = ("reduce_scatter", "all_gather", "all_reduce")  # what a collectives sample measures, in this order
COLLECTIVE_WIDTHS = (1, 2048)  # the range a sample's width is drawn from, log-uniformly (floats per sample)


def sample_collective_width(index: int, seed: int) -> int:
    """Sample `index`'s width, log-uniform over `COLLECTIVE_WIDTHS`."""
    lo, hi = np.log(COLLECTIVE_WIDTHS[0]), np.log(COLLECTIVE_WIDTHS[1])
    return int(round(float(np.exp(np.random.default_rng([seed, index, 2]).uniform(lo, hi)))))


def all_reduce_floats(width: float, batch_size: int, N: int) -> int:
    """Floats of the all-reduce whose ring sends `width` x `batch_size` floats a rank: w x B x N / (2 (N - 1))."""
    return max(1, int(round(width * batch_size * N / (2 * (N - 1)))))


class Collectives:
    """One rank's buffers for the three collectives of a collectives sample (module docstring); `gradient_floats`:
    the all-reduce's size instead of the width's (the emulated engine's data-parallel gradients)."""

    def __init__(self, width: int, batch_size: int, N: int, device: str, gradient_floats: int | None = None):
        bn = batch_size // N
        self.rs_in = torch.randn(bn * N, width, device=device)
        self.rs_out = torch.empty(bn, width, device=device)
        self.ag_in = torch.randn(bn, width, device=device)
        self.ag_out = torch.empty(bn * N, width, device=device)
        self.ar = torch.randn(gradient_floats or all_reduce_floats(width, batch_size, N), device=device)

    def reduce_scatter(self):
        dist.reduce_scatter_single(self.rs_out, self.rs_in)

    def all_gather(self):
        dist.all_gather_single(self.ag_out, self.ag_in)

    def all_reduce(self):
        dist.all_reduce(self.ar)


def measure_collectives(width: int, batch_size: int, device: str, warmup: int, iters: int) -> dict:
    """Every rank's ms of each of `COLLECTIVES` at `width` ({name: [N]}); call on all ranks together."""
    c = Collectives(width, batch_size, dist.get_world_size(), device)
    ms = [timed_collective(getattr(c, name), device, 0.0, warmup, iters) for name in COLLECTIVES]
    got = gather_floats(ms, device)
    return {f"{name}_ms": np.array([g[i] for g in got]) for i, name in enumerate(COLLECTIVES)}


@dataclass(frozen=True)
class CommRankSettings:
    """How the comm collector's ranks measure: the one settings object `comm_rank` takes."""

    indices: list[int]           # the samples still missing; every rank measures each
    sample_args: dict            # `sample_comm`'s seed, T_range, max_dim and sleep_range
    batch_size: int              # global batch
    device: str
    warmup: int                  # warm-up iterations of each layout
    iters: int                   # timed iterations of each layout (their median)
    mp_keep: float | None = None  # DCT-MP's compressed all-to-alls (None: uncompressed)
    input_dist: bool = False      # TorchRec's input distribution instead of the pooled all-to-alls
    input_layouts: tuple | None = None  # with input_dist: per index the ranks' pooling factors (else sampled)
    collectives: bool = False     # the row-wise and data-parallel collectives instead (`measure_collectives`)
    collective_widths: tuple | None = None  # with collectives: per index the width (else sampled)


def comm_rank(rank: int, world: int, emit, settings: CommRankSettings) -> None:
    """Rank function of the comm collector: measure each sample, rank 0 emits the per-rank costs."""
    s = settings
    indices, sample_args, batch_size, device = s.indices, s.sample_args, s.batch_size, s.device
    warmup, iters, mp_keep = s.warmup, s.iters, s.mp_keep
    for index in indices:
        if s.collectives:
            width = s.collective_widths[index] if s.collective_widths is not None else \
                sample_collective_width(index, sample_args["seed"])
            ms = measure_collectives(width, batch_size, device, warmup, iters)
            if rank == 0:
                emit({"index": index, "width": width, **ms})
            continue
        if s.input_dist:
            pooling = s.input_layouts[index] if s.input_layouts is not None else \
                sample_input(index, sample_args["seed"], world, sample_args["T_range"])
            ms = measure_input(rank, pooling, batch_size, device, warmup, iters)
            if rank == 0:
                emit({"index": index, "pooling": pooling, "input_words": [float(input_words(np.array(r)).sum())
                                                                          for r in pooling], "input_ms": ms})
            continue
        dim_sums, delays = sample_comm(index, N=world, **sample_args)
        fw, bw = measure_layout(rank, dim_sums, delays, batch_size, device, warmup, iters, mp_keep)
        if rank == 0:
            emit({"index": index, "dim_sums": dim_sums, "delays_ms": delays, "fw_ms": fw, "bw_ms": bw})
