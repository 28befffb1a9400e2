"""What calibration measures (planning/calibrate.py): shards, all-to-all layouts and input-distribution layouts
of the user's tables, and the drift reference kept from them. Every draw is seeded.

- `sample_user_shards`: the few tables with the most lookups x dim each alone, then random shards of
  1..2T/N tables, each at its dim or a column shard of it, within a device's memory.
- `comm_layouts`: random table-wise placements of the user's dims on N ranks with straggler delays up to
  `MIN_SPREAD_MS` in half of them and up to the slowest shard measured in the other half. The delays are where a
  plan's forward all-to-all waits for its slowest device, so the range must reach the compute differences the
  user's plans have (tens of ms for multi-hot tables, beyond the pre-training's range).
- `input_layouts`: random table-wise placements of the user's tables' pooling factors, at least one a rank.
- `drift_reference`: the held-out shards in groups of one per rank, which `--measure` measures one a round.
- `collective_widths`: widths of the row-wise and data-parallel collectives, log-uniform from the smallest dim to the
  sum of the dims (at least to the top of the pre-training's range, at most `MAX_CALIBRATE_WIDTH`).
"""
from __future__ import annotations

import numpy as np

from ..core.errors import UserError
from ..core.costs import Cluster
from ..data.features import can_split, table_size_gb
from ..hardware.comm_bench import COLLECTIVE_WIDTHS

MAX_CALIBRATE_WIDTH = 8192  # floats per sample: wider collectives are priced by the fit's slope (the buffers of
#                              one sample at batch 4,096 on 4 ranks: about 0.43 GB a rank)
HEAVY_ALONE = 5  # calibration shards that are one heavy table alone (see sample_user_shards)
MIN_SPREAD_MS = 10.0  # comm layouts' straggler spread reaches at least this (see comm_layouts)


def heaviest_tables(task, k: int) -> np.ndarray:
    """Positions of the task's k tables with the most lookups x dim (ties: the earlier table first)."""
    return np.argsort(-(task.pooling_factors * task.dims), kind="stable")[:k]



def sample_user_shards(task, cluster: Cluster, num_shards: int, seed: int,
                       max_tries: int = 100_000) -> list[tuple[np.ndarray, np.ndarray]]:
    """Shards (table positions, dims) of the task's tables that fit one device.

    First the `HEAVY_ALONE` tables with the most lookups x dim, each alone at its dim (halved until it fits),
    at most num_shards // 8 of them: without them every shard that holds such a table has company, and the
    fine-tuned model puts the company's cost on the table. Then random shards: 1..ceil(2T/N) tables (at most
    64), each at its dim or halved once or twice (a column shard)."""
    rng = np.random.default_rng([seed, 31])
    T, N = task.num_tables, cluster.num_devices
    hi = max(1, min(64, int(np.ceil(2 * T / N))))
    rows = task.rows
    out = []
    heavy = heaviest_tables(task, min(HEAVY_ALONE, num_shards // 8))
    for t in heavy:
        dim = int(task.dims[t])
        while table_size_gb(rows[t], dim) > cluster.max_mem_gb and can_split(dim):
            dim //= 2
        if table_size_gb(rows[t], dim) <= cluster.max_mem_gb:
            out.append((np.array([t], dtype=np.int64), np.array([dim], dtype=np.int64)))
    for _ in range(max_tries):
        if len(out) == num_shards:
            return out
        n = int(rng.integers(1, hi + 1))
        tabs = rng.choice(T, n, replace=n > T)
        dims = task.dims[tabs].astype(np.int64).copy()
        for i in range(n):
            for _ in range(int(rng.integers(0, 3))):
                if can_split(dims[i]):
                    dims[i] //= 2
        if table_size_gb(rows[tabs], dims).sum() <= cluster.max_mem_gb:
            out.append((tabs.astype(np.int64), dims))
    raise UserError(f"could not draw {num_shards} shards of these tables within {cluster.max_mem_gb:g} GB; "
                    "raise --max_mem")



def comm_layouts(task, N: int, count: int, seed: int, max_spread_ms: float = MIN_SPREAD_MS
                 ) -> list[tuple[np.ndarray, np.ndarray]]:
    """(dim sums, delays ms) of random table-wise placements of the user's tables on N ranks. A layout's
    delays are uniform up to a spread drawn uniformly up to `MIN_SPREAD_MS` (even layouts: the small
    delays of balanced plans stay covered) or up to `max_spread_ms` (odd layouts: the long waits of
    unbalanced ones)."""
    rng = np.random.default_rng([seed, 33])
    out = []
    for i in range(count):
        dev = rng.integers(0, N, task.num_tables)
        dims = np.bincount(dev, weights=task.dims, minlength=N).astype(np.int64)
        bound = max_spread_ms if i % 2 else MIN_SPREAD_MS
        delays = rng.uniform(0, rng.uniform(0, bound), N)
        out.append((dims, delays - delays.min()))
    return out



def input_layouts(task, N: int, count: int, seed: int) -> list[list[list[float]]]:
    """Per layout and rank the pooling factors of the user's tables placed there: random table-wise placements
    with at least one table per rank (the input distribution's layouts; needs N tables or more)."""
    rng = np.random.default_rng([seed, 35])
    T = task.num_tables
    out = []
    for _ in range(count):
        dev = np.empty(T, np.int64)
        perm = rng.permutation(T)
        dev[perm[:N]] = np.arange(N)
        dev[perm[N:]] = rng.integers(0, N, T - N)
        out.append([[float(task.pooling_factors[t]) for t in np.flatnonzero(dev == r)] for r in range(N)])
    return out



def drift_reference(shards, costs_ms, held: np.ndarray, N: int, seed: int) -> list[dict]:
    """The held-out shards in groups of N, one shard per rank (the last group filled up from the first shards):
    per group {"devices": per rank [[table, dim], ...], "compute_ms": [N]}. `--measure` measures one group a
    round, in turn, so the reference spans the held-out shards as calibration measured them."""
    order = np.random.default_rng([seed, 34]).permutation(np.asarray(held))
    G = -(-len(order) // N)
    groups = []
    for g in range(G):
        pick = [int(order[(g * N + r) % len(order)]) for r in range(N)]
        groups.append({"devices": [[[int(t), int(d)] for t, d in zip(*shards[i])] for i in pick],
                       "compute_ms": [float(costs_ms[i]) for i in pick]})
    return groups



def reference_layouts(groups: list[dict]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each reference group's all-to-all: its ranks' dim sums, no delays."""
    return [(np.array([sum(d for _, d in dev) for dev in g["devices"]], np.int64), np.zeros(len(g["devices"])))
            for g in groups]



def collective_widths(task, count: int, seed: int) -> list[int]:
    """Widths (floats per sample of the batch) of `count` collectives samples: log-uniform from the task's smallest
    dim to the sum of its dims (a row-wise group of every table), at least to the top of the pre-training's range
    and at most `MAX_CALIBRATE_WIDTH`; the narrowest and widest always among them."""
    lo = float(max(1, task.dims.min()))
    hi = float(min(MAX_CALIBRATE_WIDTH, max(COLLECTIVE_WIDTHS[1], task.dims.sum())))
    rng = np.random.default_rng([seed, 36])
    inner = np.exp(rng.uniform(np.log(lo), np.log(hi), max(0, count - 2)))
    return [int(round(w)) for w in (lo, *inner, hi)][:count]
