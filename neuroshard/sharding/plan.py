"""Sharding plans: column splits plus a device for every shard, and their validation.

A task's tables start as one shard each, `Shard(table, col_start=0, dim)`. A column split of shard
i halves it in place and appends its twin (same table, rows and ids; the other half of the
columns), so `splits` — the shard positions split, in order — reproduce the shard list.

A plan's plain-data form is `Placement.to_dict`, read back by `Placement.from_dict` (evaluation rows and a
calibration's step-fit plans store it). Per-rank shard lists without column offsets (a calibration's drift
reference) are checked by `check_rank_shards`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..core.errors import PlanError
from ..core.costs import Cluster
from ..data.features import can_split, table_size_gb
from ..data.tasks import ShardingTask


@dataclass(frozen=True)
class Shard:
    table: int      # position of the table in its task
    col_start: int  # first column of the slice
    dim: int        # number of columns


def apply_splits(dims, splits) -> list[Shard]:
    """Shard list after applying `splits` (shard positions) to one-shard-per-table."""
    shards = [Shard(t, 0, int(d)) for t, d in enumerate(dims)]
    for i in splits:
        s = shards[i]
        if not can_split(s.dim):
            raise PlanError(f"shard {i} (table {s.table}, dim {s.dim}) cannot be split: dim/2 not divisible by 4")
        half = s.dim // 2
        shards[i] = Shard(s.table, s.col_start, half)
        shards.append(Shard(s.table, s.col_start + half, half))
    return shards


@dataclass
class Placement:
    """Which device owns each shard of a task: a plan (not named ShardingPlan, which is TorchRec's type)."""

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
        sizes = task.shard_sizes_gb([s.table for s in self.shards], [s.dim for s in self.shards])
        np.add.at(mem, np.asarray(self.device_of, np.int64), sizes)
        return mem

    def device_dim_sums(self) -> np.ndarray:
        dims = np.zeros(self.num_devices, dtype=np.int64)
        for s, d in zip(self.shards, self.device_of):
            dims[d] += s.dim
        return dims

    def to_dict(self) -> dict:
        return {"num_devices": int(self.num_devices), "splits": [int(i) for i in self.splits],
                "devices": [[(int(s.table), int(s.col_start), int(s.dim)) for s in dev] for dev in self.per_device()]}

    @classmethod
    def from_dict(cls, d: dict, dims, num_devices: int) -> "Placement":
        """The inverse of `to_dict` for a task of these table `dims` on `num_devices` devices, checked (every
        column of every table once, on a real device); anything else is a `PlanError`."""
        try:
            if int(d["num_devices"]) != num_devices or len(d["devices"]) != num_devices:
                raise PlanError(f"a plan for {d['num_devices']} devices, not {num_devices}")
            slices: dict[int, list[tuple[int, int, int]]] = {}
            for dev, shards in enumerate(d["devices"]):
                for t, c, w in shards:
                    if not 0 <= int(t) < len(dims):
                        raise PlanError(f"table {t} outside 0..{len(dims) - 1}")
                    slices.setdefault(int(t), []).append((int(c), int(w), dev))
        except (TypeError, KeyError, ValueError) as e:
            raise PlanError(f"not a plan ({type(e).__name__}: {e})") from None
        plan = plan_from_slices(dims, num_devices, slices)  # raises unless halvings reach exactly the slices given
        if len(plan.shards) != sum(len(pieces) for pieces in slices.values()):  # a slice given twice is merged
            raise PlanError("columns not placed exactly once")
        return plan


def plan_from_slices(dims, num_devices: int, slices: dict[int, list[tuple[int, int, int]]]) -> Placement:
    """The plan whose shards are exactly the column slices `slices[t]` = [(col_offset, width, device)]
    of each table t (a table without an entry stays whole, on the device of its one slice), reached
    by halving splits in rounds: every shard of a table that is not one of its slices is halved, until
    all are. A slice that halving cannot reach (e.g. 48 columns of 128) is a `PlanError`."""
    splits: list[int] = []
    shards = apply_splits(dims, [])
    for t in sorted(slices):
        want = {(int(off), int(w)) for off, w, _ in slices[t]}
        while todo := [i for i, s in enumerate(shards) if s.table == t and (s.col_start, s.dim) not in want]:
            for i in todo:
                if not can_split(shards[i].dim):
                    raise PlanError(f"table {t}: the column slices {sorted(want)} are not halvings of dim {dims[t]}")
                splits.append(i)
                shards = apply_splits(dims, splits)
    rank = {(t, int(off)): int(r) for t, pieces in slices.items() for off, _, r in pieces}
    missing = [s.table for s in shards if (s.table, s.col_start) not in rank]
    if missing:
        raise PlanError(f"table {missing[0]} has no device")
    return Placement(num_devices, shards, [rank[(s.table, s.col_start)] for s in shards], splits)


def check_complete(task: ShardingTask, plan: Placement) -> None:
    """Raise `PlanError` unless every column of every table is placed exactly once on a real device, and every row
    block of a row-wise table and replica of a data-parallel one on its own rank."""
    if len(plan.shards) != len(plan.device_of):
        raise PlanError(f"{len(plan.shards)} shards but {len(plan.device_of)} devices: every shard needs one device")
    bad = [d for d in plan.device_of if not 0 <= d < plan.num_devices]
    if bad:
        raise PlanError(f"device {bad[0]} out of range 0..{plan.num_devices - 1}")
    cover = [np.zeros(int(d), dtype=np.int64) for d in task.dims]
    for s in plan.shards:
        if not 0 <= s.table < task.num_tables:
            raise PlanError(f"shard of unknown table {s.table}")
        if not (s.dim > 0 and s.col_start >= 0 and s.col_start + s.dim <= task.dims[s.table]):
            raise PlanError(f"bad column slice {s} of table {s.table} (dim {task.dims[s.table]})")
        cover[s.table][s.col_start: s.col_start + s.dim] += 1
    for t, c in enumerate(cover):
        if not np.all(c == 1):
            raise PlanError(f"table {t}: columns not placed exactly once")
    pinned = task.pinned_ranks([s.table for s in plan.shards])
    for s, d, r in zip(plan.shards, plan.device_of, pinned):
        if r >= 0 and d != r:
            raise PlanError(f"table {s.table}, a row block or replica pinned to rank {r}, is on rank {d}")


def fits_memory(task: ShardingTask, plan: Placement, cluster: Cluster) -> bool:
    return bool(np.all(cluster.fits(plan.device_mem_gb(task))))


MAX_SHARD_DIM = 1 << 16  # the widest shard a stored shard list may name


def check_rank_shards(devices, rows, cluster: Cluster, dims=None) -> None:
    """Per-rank shard lists read from a file (e.g. a calibration's drift reference group): one list per rank of
    `cluster`, each of one or more [table, dim] pairs of whole numbers with table < len(rows) and dim a multiple
    of 4 up to `MAX_SHARD_DIM` (with the tables' `dims`, a halving of its table's dim), within a rank's memory.
    Anything else is a `PlanError`."""
    rows = np.asarray(rows, np.int64)
    try:
        if len(devices) != cluster.num_devices:
            raise PlanError(f"{len(devices)} ranks, not {cluster.num_devices}")
        for dev in devices:
            if len(dev) < 1 or not all(_is_shard(x, rows, dims) for x in dev):
                raise PlanError(f"not a list of [table, dim] shards of these tables: {str(dev)[:80]}")
            if table_size_gb(rows[[t for t, _ in dev]], np.array([d for _, d in dev])).sum() > \
                    cluster.max_mem_gb * (1 + 1e-9):
                raise PlanError("shards over a rank's memory")
    except (TypeError, KeyError, ValueError, IndexError) as e:
        raise PlanError(f"not shard lists ({type(e).__name__}: {e})") from None


def _is_shard(x, rows: np.ndarray, dims) -> bool:
    """[table, dim]: whole numbers, a table of the task, a dim `check_rank_shards` takes."""
    if len(x) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in x) or not 0 <= x[0] < len(rows):
        return False
    d, table_dim = x[1], None if dims is None else int(dims[x[0]])
    if not (4 <= d <= MAX_SHARD_DIM and d % 4 == 0):
        return False
    while table_dim is not None and table_dim > d and can_split(table_dim):
        table_dim //= 2
    return table_dim is None or table_dim == d
