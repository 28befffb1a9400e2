"""Compute cost of a shard (DESIGN.md §3.1): one fused operator over a set of tables, forward +
backward, median over timed iterations after warm-ups, last-level cache flushed before each.

`ComputeBenchmark` holds one device's dataset handle (a dataset, or a `families.TablePool` of the
dataset and the family tables), flusher and settings; `measure` times any set of (table, dim) pairs
on the tables' real ids, each table whole or in a `ShardView` (a row block: the ids in its rows; a data-parallel
replica: its rank's local batch), as the emulated engine measures row-wise and data-parallel plans. `sample_shard` draws the random shards of the compute-cost dataset and
`MixSampler` those of the family mix (DESIGN.md §8).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..core.errors import UserError
from ..data.dataset import DLRMDataset
from ..data.families import (DEFAULT_SHARE, FamilyMix, TablePool, build_family_tables, family_of_tables,
                             sample_family_of, sample_family_shard)
from ..data.features import dim_choices, table_size_gb
from .backends import Hardware, make_fused
from .timing import CacheFlusher, median_ms


@dataclass
class ComputeBenchmark:
    dataset: DLRMDataset  # or a TablePool
    hw: Hardware
    batch_size: int
    warmup_iter: int = 5
    num_iter: int = 10
    flush: bool = True

    def __post_init__(self):
        self.flusher = CacheFlusher(self.hw.device) if self.flush else None

    def inputs(self, table_ids, views=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Table-major indices and offsets (T*B + 1; replicas: T*B/world + 1) of the given dataset tables (each in
        its `view`, if given)."""
        ids, offs, base = [], [torch.zeros(1, dtype=torch.int64)], 0
        for k, t in enumerate(table_ids):
            i, o = self.dataset.table_bags(int(t), self.batch_size)
            if views is not None and views[k] is not None:
                i, o = view_bags(i, o, int(self.dataset.rows[int(t)]), views[k])
            ids.append(i)
            offs.append(o[1:] + base)
            base += i.numel()
        return torch.cat(ids), torch.cat(offs)

    def measure(self, table_ids, dims, views=None) -> float:
        """Median ms of forward + backward of one fused operator holding these tables (a table may
        appear several times: its column shards, each at its own dim, read the table's ids). `views`: per table
        None (the whole table at the global batch) or a `ShardView` (a row block, or a replica at its rank's local
        batch: an operator of replicas alone, as TorchRec runs a data-parallel group's lookups)."""
        local = [v is not None and v.replica >= 0 for v in (views or [None] * len(table_ids))]
        if any(local) and not all(local):
            raise ValueError("one operator runs at one batch: measure replicas (their local batch) apart")
        rows = [view_rows(int(r), None if views is None else views[k])
                for k, r in enumerate(self.dataset.rows[np.asarray(table_ids, dtype=np.int64)])]
        op = make_fused([(r, int(d)) for r, d in zip(rows, dims)], self.hw)
        ids, offsets = self.inputs(table_ids, views)
        prepared = op.prepare(ids, offsets)
        grad = torch.ones((offsets.numel() - 1) // len(table_ids), int(np.sum(dims)), device=self.hw.device)
        return median_ms(lambda: op.train_step(prepared, grad), self.hw.device, self.warmup_iter, self.num_iter,
                         self.flusher)


@dataclass(frozen=True)
class ShardView:
    """The part of a table a row-wise or data-parallel shard computes: rows `row_lo` to `row_lo + rows` (its row
    block: the ids in it, renumbered from 0; `rows` 0: every row), and with `replica` >= 0 only the samples of that
    rank's local batch (the global batch's `replica`-th of `world` equal slices: B / world bags)."""

    row_lo: int = 0
    rows: int = 0
    replica: int = -1
    world: int = 1


def view_rows(rows: int, view: ShardView | None) -> int:
    """The rows of a table's operator in `view` (at least 1: TorchRec's last row blocks may hold none)."""
    if view is None or view.rows <= 0:
        return rows
    return max(1, min(rows, view.row_lo + view.rows) - min(rows, view.row_lo))


def view_bags(ids: torch.Tensor, offsets: torch.Tensor, rows: int, view: ShardView) -> tuple[torch.Tensor,
                                                                                             torch.Tensor]:
    """A table's bags (ids, offsets of B + 1; a replica's: of B / world + 1) as `view` sees them (`ShardView`)."""
    lengths = torch.diff(offsets)
    B = lengths.numel()
    sample = torch.repeat_interleave(torch.arange(B), lengths)
    keep = torch.ones(ids.numel(), dtype=torch.bool)
    if view.rows > 0:
        lo = min(rows, view.row_lo)
        keep &= (ids >= lo) & (ids < lo + view.rows)
        ids = ids - lo
    first, B_out = 0, B
    if view.replica >= 0:
        B_out = B // view.world
        first = view.replica * B_out
        keep &= (sample >= first) & (sample < first + B_out)
    counts = torch.bincount(sample[keep] - first, minlength=B_out)
    return ids[keep].contiguous(), torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(counts, 0)])


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
    raise UserError(f"no shard of the dataset's tables fits --max_mem {max_mem_gb} GB after {max_tries} draws; "
                    "raise --max_mem")


class MixSampler:
    """Samples of the compute-cost data drawn from the dataset and the table families (DESIGN.md §8).

    Sample `index` first picks its sample family (`families.sample_family_of`), then draws a shard
    of it: `dataset` samples are exactly `sample_shard`'s, the others `families.sample_family_shard`'s
    over the pool (dataset tables first, then the family tables). Deterministic in (seed, index).
    """

    def __init__(self, dataset: DLRMDataset, family_tables: DLRMDataset, seed: int, max_tables: int,
                 max_mem_gb: float, max_dim: int, shares: dict, max_shards: int, caps: dict):
        self.pool = TablePool([dataset, family_tables])
        self.dataset_rows = dataset.rows
        names = np.array(family_of_tables(family_tables))
        self.family_ids = {"dataset": np.arange(dataset.num_tables)}
        for name in dict.fromkeys(names):
            self.family_ids[str(name)] = dataset.num_tables + np.flatnonzero(names == name)
        self.seed, self.max_tables, self.max_mem_gb, self.max_dim = seed, max_tables, max_mem_gb, max_dim
        self.shares, self.max_shards, self.caps = shares, max_shards, caps

    def __call__(self, index: int) -> tuple[str, np.ndarray, np.ndarray]:
        family = sample_family_of(index, self.seed, self.shares)
        if family == "dataset":
            ids, dims = sample_shard(self.dataset_rows, index, self.seed, self.max_tables, self.max_mem_gb,
                                     self.max_dim)
        else:
            ids, dims = sample_family_shard(family, index, self.seed, self.pool.rows, self.family_ids,
                                            self.max_mem_gb, self.max_tables, self.max_shards, self.caps)
        return family, ids, dims


def family_collection(dataset: DLRMDataset, families_dir, max_mem_gb: float, seed: int, shares=None,
                      max_shards: int = 64) -> tuple[dict, dict]:
    """Build (or reuse) the family tables for a collection: (`families` of `compute_worker`, meta entries).

    `shares`: (family, share) pairs (the families not named get 0), or None for the documented mix.

    The mix takes the dataset's batch and row scale (a synthetic dataset's `row_scale`, else 1) and
    the collection's device size, so family tables are scaled like the dataset's."""
    synth = dataset.meta.get("provenance", {}).get("synthetic_config") or {}
    mix = FamilyMix(seed=seed, batch_size=dataset.batch_size, row_scale=float(synth.get("row_scale", 1.0)),
                    max_mem_gb=max_mem_gb, sample_share=dict(shares) if shares else dict(DEFAULT_SHARE), max_shards=max_shards).check()
    fam = build_family_tables(mix, families_dir)
    families = {"dir": str(fam.path), "shares": mix.sample_share, "max_shards": mix.max_shards,
                "caps": {f.name: f.max_tables for f in mix.families}}
    return families, {"family_tables": str(fam.path), "family_tables_fingerprint": fam.fingerprint,
                      "family_mix": mix.fingerprint()}


def cost_data_tables(meta: dict, dataset: DLRMDataset, families_dir=None):
    """The tables a compute-cost file's `table_ids` index: the dataset, or dataset + family tables."""
    if not meta.get("family_tables"):
        return dataset
    path = families_dir or meta["family_tables"]
    fam = DLRMDataset.load(path)
    if fam.fingerprint != meta.get("family_tables_fingerprint"):
        raise UserError(f"{path} holds other family tables than the cost data was measured on; pass the "
                        "--families_dir the collector used")
    return TablePool([dataset, fam])


# ----------------------------------------------------------------------------- collection worker

COMPUTE_DATA_KIND = "neuroshard.compute_cost_data"


@dataclass(frozen=True)
class ComputeWorkerSettings:
    """How the compute collector's workers measure: the one settings object `compute_worker` takes."""

    dataset_dir: str
    hw: Hardware
    batch_size: int
    warmup: int                  # warm-up iterations of each sample
    iters: int                   # timed iterations of each sample (their median)
    indices: list[int]           # the samples still missing; worker r of w measures indices[r::w]
    sample_args: dict            # `sample_shard`'s seed, max_tables, max_mem_gb and max_dim
    families: dict | None = None  # {"dir", "shares", "max_shards", "caps"}: samples from the table families


def compute_worker(rank: int, world: int, emit, settings: ComputeWorkerSettings) -> None:
    """Worker `rank` of `world` measures every world-th missing sample and emits each when finished.

    With `settings.families` samples come from `MixSampler` and each record names its sample family."""
    s, families = settings, settings.families
    dataset = DLRMDataset.load(s.dataset_dir)
    if families:
        sampler = MixSampler(dataset, DLRMDataset.load(families["dir"]), shares=families["shares"],
                             max_shards=families["max_shards"], caps=families["caps"], **s.sample_args)
        bench = ComputeBenchmark(sampler.pool, s.hw, s.batch_size, s.warmup, s.iters)
    else:
        bench = ComputeBenchmark(dataset, s.hw, s.batch_size, s.warmup, s.iters)
    for index in s.indices[rank::world]:
        if families:
            family, ids, dims = sampler(index)
        else:
            family, (ids, dims) = "dataset", sample_shard(bench.dataset.rows, index, **s.sample_args)
        emit({"index": index, "family": family, "table_ids": ids, "dims": dims, "cost_ms": bench.measure(ids, dims)})
