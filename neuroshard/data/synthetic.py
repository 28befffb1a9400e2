"""Synthetic DLRM-like data in the real raw format (DESIGN.md §2.3), documented in the README.

Rows log-uniform over ~5.6 orders of magnitude, pooling factors heavy-tailed around the published
mean with a share of tables at 0-1 lookups, and per-id access counts drawn from the published
reuse distribution, so the global reuse histogram is close to the published one. Seeded.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from ..core.errors import check_float, check_int
from .features import NUM_BINS

# Published statistics of fbgemm_t856_bs65536.pt (../shared/data/dlrm_2021_locality_stats.txt).
PUBLISHED_MEAN_POOLING = 887_017_990 / (856 * 65536)  # 15.81
PUBLISHED_REUSE_UNIQUE_SHARE = np.array(
    [0.473, 0.152, 0.139, 0.112, 0.072, 0.032, 0.011, 0.005, 0.002, 0.001, 0, 0, 0, 0, 0, 0, 0])
PUBLISHED_REUSE_LOOKUP_SHARE = np.array(
    [0.069, 0.044, 0.068, 0.101, 0.121, 0.104, 0.073, 0.058, 0.052, 0.050, 0.049, 0.048, 0.048,
     0.043, 0.031, 0.023, 0.019])


@dataclass(frozen=True)
class SyntheticConfig:
    """Generative model of a DLRM-like dataset (documented in the README)."""

    num_tables: int = 856
    batch_size: int = 4096
    seed: int = 0
    row_scale: float = 1.0          # multiplies every table's row count (small machines)
    min_rows: float = 1e2
    max_rows: float = 4e7           # rows log-uniform in [min_rows, max_rows]
    mean_pooling: float = PUBLISHED_MEAN_POOLING
    low_pooling_share: float = 0.15  # share of tables with pooling factor in [0, 1]
    pooling_sigma: float = 1.0      # lognormal spread of the other tables' pooling factors
    max_pooling: float = 200.0
    length_shape: float = 1.5       # gamma shape of the per-sample lookup rate (over-dispersion)

    def check(self) -> "SyntheticConfig":
        """Range-check the user-facing settings (before anything is generated or written)."""
        check_int("--num_tables", self.num_tables, 1, 100_000)
        check_int("--batch_size", self.batch_size, 1, 1 << 20)
        check_int("--seed", self.seed, 0)
        check_float("--row_scale", self.row_scale, 0.0, 1e3, lo_open=True)
        return self


def _count_sampler(rng: np.random.Generator, unique_share: np.ndarray | None = None):
    """Per-id access counts whose reuse histogram is `unique_share` (share of unique ids per bin).

    By default the published histogram: a bin j is chosen with probability proportional to (share
    of lookups in j) / (mean count in j), i.e. the published share of unique ids, including the
    tail bins that round to 0 in the unique histogram but carry ~25% of lookups. A count within
    the bin is then drawn log-uniform.
    """
    lo = np.array([1.0, 2.0] + [2.0 ** (j - 1) for j in range(2, NUM_BINS)])  # exclusive lower bound (bins>=2)
    span = np.ones(NUM_BINS)
    span[-1] = 3.0  # bin 16: (2^15, 2^18]
    mean = np.where(np.arange(NUM_BINS) < 2, lo, lo * (2.0 ** span - 1) / (span * math.log(2)) + 0.5)
    p = PUBLISHED_REUSE_LOOKUP_SHARE / mean if unique_share is None else np.asarray(unique_share, np.float64)
    p = p / p.sum()

    def sample(n: int) -> np.ndarray:
        j = rng.choice(NUM_BINS, size=n, p=p)
        u = rng.random(n) * span[j]
        c = np.ceil(lo[j] * 2.0 ** u)
        c = np.where(j < 2, lo[j], np.maximum(c, lo[j] + 1))
        return c.astype(np.int64)

    return sample, float((p * mean).sum())


def _table_ids(rng: np.random.Generator, L: int, R: int, sample_counts, mean_count: float) -> np.ndarray:
    """L lookups into R rows whose per-id access counts come from `sample_counts`, shuffled."""
    counts = np.empty(0, dtype=np.int64)
    while counts.sum() < L:
        counts = np.concatenate([counts, sample_counts(int(L / mean_count * 1.2) + 16)])
    cum = np.cumsum(counts)
    n = int(np.searchsorted(cum, L)) + 1 if L else 0
    counts = counts[:n]
    if n:
        counts[-1] -= cum[n - 1] - L
    # Distinct rows while the table has room; beyond that, extra ids collide (merge) like hashing does.
    if n <= R:
        id_rows = rng.choice(R, n, replace=False)
    else:
        id_rows = np.concatenate([rng.permutation(R), rng.integers(0, R, n - R)])
    table_ids = np.repeat(id_rows, counts)
    rng.shuffle(table_ids)
    return table_ids


def _raw(ids: list[np.ndarray], lengths: np.ndarray):
    T, B = lengths.shape
    indices = torch.from_numpy(np.concatenate(ids) if ids else np.empty(0, np.int64))
    lengths_t = torch.from_numpy(lengths)
    offsets = torch.zeros(T * B + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths_t.reshape(-1), 0)
    return indices, offsets, lengths_t


def popular_rows_first(indices: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor, rows) -> torch.Tensor:
    """Raw ids renumbered as a frequency-ordered vocabulary numbers them: in each table the most-read id becomes row
    0, the next row 1, and so on (ties by id), and the least-read one its last row (`rows[t] - 1`, so the table's
    `row` stays); bags and access counts are unchanged. Hashed ids spread a table's hot rows over its row range;
    these put them in its first rows, where TorchRec's first row-wise block holds them."""
    T, B = lengths.shape
    out = indices.clone()
    for t in range(T):
        lo, hi = int(offsets[t * B]), int(offsets[(t + 1) * B])
        if hi == lo:
            continue
        ids = indices[lo:hi].numpy()
        uniq, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
        rank = np.empty(uniq.size, np.int64)
        rank[np.lexsort((uniq, -counts))] = np.arange(uniq.size)
        if uniq.size > 1 and int(rows[t]) > uniq.size:
            rank[rank == uniq.size - 1] = int(rows[t]) - 1
        out[lo:hi] = torch.from_numpy(rank[inverse])
    return out


def synthesize_tables(rows, pooling_factors, unique_shares, batch_size: int, seed: int = 0,
                      progress: bool = True):
    """Raw `(indices, offsets, lengths)` for given tables: per-sample lookups Poisson(pooling factor),
    except exactly one per sample for a pooling factor of exactly 1 (a one-hot feature, the common
    case of real table lists); ids following each table's reuse histogram, and the last row read
    once so `row` is the real one."""
    rng = np.random.default_rng(seed)
    rows = np.asarray(rows, dtype=np.int64)
    pf = np.asarray(pooling_factors, dtype=np.float64)
    lengths = rng.poisson(np.repeat(pf[:, None], batch_size, axis=1)).astype(np.int64)
    lengths[pf == 1.0] = 1
    ids = []
    for t in tqdm(range(len(rows)), desc="synthesize ids", disable=not progress, leave=False):
        L = int(lengths[t].sum())
        if L == 0:
            ids.append(np.empty(0, dtype=np.int64))
            continue
        share = np.asarray(unique_shares[t], np.float64)
        sample_counts, mean_count = _count_sampler(rng, share if share.sum() > 0 else None)
        table_ids = _table_ids(rng, L, int(rows[t]), sample_counts, mean_count)
        table_ids[rng.integers(L)] = rows[t] - 1
        ids.append(table_ids)
    return _raw(ids, lengths)


def _rows_and_pooling(cfg: SyntheticConfig, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    T = cfg.num_tables
    log_rows = rng.uniform(math.log(cfg.min_rows), math.log(cfg.max_rows), T)
    rows = np.maximum(1, np.round(np.exp(log_rows) * cfg.row_scale)).astype(np.int64)
    low = rng.random(T) < cfg.low_pooling_share
    pf = np.where(low, rng.uniform(0.0, 1.0, T), rng.lognormal(0.0, cfg.pooling_sigma, T))
    for _ in range(20):  # rescale the heavy tables so the mean matches, respecting the cap
        high_mean_needed = (cfg.mean_pooling * T - pf[low].sum()) / max(1, (~low).sum())
        pf[~low] *= high_mean_needed / pf[~low].mean()
        pf = np.minimum(pf, cfg.max_pooling)
    return rows, pf


def synthetic_table_stats(cfg: SyntheticConfig) -> tuple[np.ndarray, np.ndarray]:
    """The rows and pooling factors of `cfg`'s tables, as `generate_synthetic_raw` draws them (no ids)."""
    cfg.check()
    return _rows_and_pooling(cfg, np.random.default_rng(cfg.seed))


def generate_synthetic_raw(cfg: SyntheticConfig, progress: bool = True):
    """Generate `(indices, offsets, lengths)` following `cfg` (deterministic for a seed)."""
    cfg.check()
    rng = np.random.default_rng(cfg.seed)
    T, B = cfg.num_tables, cfg.batch_size
    rows, pf = _rows_and_pooling(cfg, rng)
    rate = pf[:, None] * rng.gamma(cfg.length_shape, 1.0 / cfg.length_shape, (T, B))
    lengths = rng.poisson(rate).astype(np.int64)

    sample_counts, mean_count = _count_sampler(rng)
    ids = [_table_ids(rng, int(lengths[t].sum()), int(rows[t]), sample_counts, mean_count)
           for t in tqdm(range(T), desc="generate tables", disable=not progress, leave=False)]
    return _raw(ids, lengths)
