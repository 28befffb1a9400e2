"""Sharding plans: column splits plus a device for every shard, and their validation.

A task's tables start as one shard each, `Shard(table, col_start=0, dim)`. A column split of shard
i halves it in place and appends its twin (same table, rows and ids; the other half of the
columns), so `splits` — the shard positions split, in order — reproduce the shard list.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .tables import table_size_gb
from .tasks import ShardingTask


@dataclass(frozen=True)
class Shard:
    table: int      # position of the table in its task
    col_start: int  # first column of the slice
    dim: int        # number of columns


def can_split(dim: int) -> bool:
    """A shard may be split when half its dim is still divisible by 4."""
    return dim % 8 == 0


def apply_splits(dims, splits) -> list[Shard]:
    """Shard list after applying `splits` (shard positions) to one-shard-per-table."""
    shards = [Shard(t, 0, int(d)) for t, d in enumerate(dims)]
    for i in splits:
        s = shards[i]
        if not can_split(s.dim):
            raise ValueError(f"shard {i} (table {s.table}, dim {s.dim}) cannot be split: dim/2 not divisible by 4")
        half = s.dim // 2
        shards[i] = Shard(s.table, s.col_start, half)
        shards.append(Shard(s.table, s.col_start + half, half))
    return shards


@dataclass
class ShardingPlan:
    """Which device owns each shard of a task."""

    num_devices: int
    shards: list[Shard]
    device_of: list[int]
    splits: list[int] = field(default_factory=list)

    def per_device(self) -> list[list[Shard]]:
        out: list[list[Shard]] = [[] for _ in range(self.num_devices)]
        for s, d in zip(self.shards, self.device_of):
            out[d].append(s)
        return out

    def device_mem_gb(self, task: ShardingTask) -> np.ndarray:
        mem = np.zeros(self.num_devices)
        for s, d in zip(self.shards, self.device_of):
            mem[d] += table_size_gb(task.rows[s.table], s.dim)
        return mem

    def device_dim_sums(self) -> np.ndarray:
        dims = np.zeros(self.num_devices, dtype=np.int64)
        for s, d in zip(self.shards, self.device_of):
            dims[d] += s.dim
        return dims

    def to_dict(self) -> dict:
        return {"num_devices": self.num_devices, "splits": list(self.splits),
                "devices": [[(s.table, s.col_start, s.dim) for s in dev] for dev in self.per_device()]}


def check_complete(task: ShardingTask, plan: ShardingPlan) -> None:
    """Raise AssertionError unless every column of every table is placed exactly once on a real device."""
    assert len(plan.shards) == len(plan.device_of), "every shard needs a device"
    assert all(0 <= d < plan.num_devices for d in plan.device_of), "device out of range"
    cover = [np.zeros(int(d), dtype=np.int64) for d in task.dims]
    for s in plan.shards:
        assert 0 <= s.table < task.num_tables, f"shard of unknown table {s.table}"
        assert s.dim > 0 and s.col_start >= 0 and s.col_start + s.dim <= task.dims[s.table], f"bad slice {s}"
        cover[s.table][s.col_start: s.col_start + s.dim] += 1
    for t, c in enumerate(cover):
        assert np.all(c == 1), f"table {t}: columns not placed exactly once"


def fits_memory(task: ShardingTask, plan: ShardingPlan, max_mem_gb: float) -> bool:
    return bool(np.all(plan.device_mem_gb(task) <= max_mem_gb + 1e-9))
