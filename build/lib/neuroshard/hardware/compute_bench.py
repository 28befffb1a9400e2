"""Compute cost of a shard (DESIGN.md §3.1): one fused operator over a set of tables, forward +
backward, median over timed iterations after warm-ups, last-level cache flushed before each.

`ComputeBenchmark` holds one device's dataset handle, flusher and settings; `measure` times any set
of (dataset table, dim) pairs on the dataset's real ids. `sample_shard` draws the random shards
of the compute-cost dataset.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..data.dataset import DLRMDataset
from ..data.features import dim_choices, table_size_gb
from .backends import Hardware, make_fused
from .timing import CacheFlusher, median_ms


@dataclass
class ComputeBenchmark:
    dataset: DLRMDataset
    hw: Hardware
    batch_size: int
    warmup_iter: int = 5
    num_iter: int = 10
    flush: bool = True

    def __post_init__(self):
        self.flusher = CacheFlusher(self.hw.device) if self.flush else None

    def inputs(self, table_ids) -> tuple[torch.Tensor, torch.Tensor]:
        """Table-major indices and offsets (T*B + 1) of the given dataset tables."""
        ids, offs, base = [], [torch.zeros(1, dtype=torch.int64)], 0
        for t in table_ids:
            i, o = self.dataset.table_bags(int(t), self.batch_size)
            ids.append(i)
            offs.append(o[1:] + base)
            base += i.numel()
        return torch.cat(ids), torch.cat(offs)

    def measure(self, table_ids, dims) -> float:
        """Median ms of forward + backward of one fused operator holding these tables."""
        rows = self.dataset.rows[np.asarray(table_ids, dtype=np.int64)]
        op = make_fused([(int(r), int(d)) for r, d in zip(rows, dims)], self.hw)
        prepared = op.prepare(*self.inputs(table_ids))
        grad = torch.ones(self.batch_size, int(np.sum(dims)), device=self.hw.device)
        return median_ms(lambda: op.train_step(prepared, grad), self.hw.device, self.warmup_iter, self.num_iter,
                         self.flusher)


def sample_shard(rows: np.ndarray, index: int, seed: int, max_tables: int, max_mem_gb: float,
                 max_dim: int, max_tries: int = 10_000) -> tuple[np.ndarray, np.ndarray]:
    """Random multiset of 1..max_tables augmented tables (table, dim) whose total size <= max_mem.

    Deterministic in (seed, index), so parallel workers and resumed runs draw the same samples.
    """
    rng = np.random.default_rng([seed, index])
    dims_set = np.array(dim_choices(max_dim))
    for _ in range(max_tries):
        n = int(rng.integers(1, max_tables + 1))
        ids = rng.integers(0, len(rows), n)
        dims = rng.choice(dims_set, n)
        if table_size_gb(rows[ids], dims).sum() <= max_mem_gb:
            return ids.astype(np.int64), dims.astype(np.int64)
    from ..core.errors import UserError

    raise UserError(f"no shard of the dataset's tables fits --max_mem {max_mem_gb} GB after {max_tries} draws; "
                    "raise --max_mem")


# ----------------------------------------------------------------------------- collection worker

COMPUTE_DATA_KIND = "neuroshard.compute_cost_data"


def compute_worker(rank: int, world: int, emit, dataset_dir: str, hw: Hardware, batch_size: int, warmup: int,
                   iters: int, indices: list[int], sample_args: dict) -> None:
    """Worker `rank` of `world` measures every world-th missing sample and emits each when finished."""
    bench = ComputeBenchmark(DLRMDataset.load(dataset_dir), hw, batch_size, warmup, iters)
    for index in indices[rank::world]:
        ids, dims = sample_shard(bench.dataset.rows, index, **sample_args)
        emit({"index": index, "table_ids": ids, "dims": dims, "cost_ms": bench.measure(ids, dims)})
