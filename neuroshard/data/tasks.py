"""Sharding tasks (DESIGN.md §2.4): lists of dataset tables, each with a dim.

A task file (`tasks.pkl`) holds `{"kind", "tasks": [{"table_ids", "dims"}], "dataset_fingerprint", ...}`;
`load_tasks` refuses a file made from another dataset.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..core.artifacts import atomic_write_pickle, load_pickle, provenance
from ..core.config import TasksConfig
from ..core.errors import PlanError, UserError
from ..core.file_names import tasks_path
from .dataset import DLRMDataset
from .features import DIM_CHOICES, check_max_dim, dim_choices, table_size_gb, with_dim

TASKS_KIND = "neuroshard.tasks"


@dataclass(frozen=True)
class ShardStorage:
    """What each shard the search can cut occupies on its rank, as a planner outside this project counts it
    (`sharding/planner/storage.py`: TorchRec's storage estimator, optimizer state and I/O buffers included):
    `gb[t, k]` is the storage (GB, 2**30 bytes) of a shard of table t that is `dims[t] >> k` columns wide: inf
    where the table may not be cut that wide (it fits no rank), NaN past the narrowest halving."""

    dims: np.ndarray  # [T] int, the tables' dims
    gb: np.ndarray    # [T, K] float

    def shard_gb(self, tables, dims) -> np.ndarray:
        """Storage (GB) of each shard (its table index and dim)."""
        tables, dims = np.asarray(tables, np.int64), np.asarray(dims, np.int64)
        ratio = self.dims[tables] // np.maximum(dims, 1)
        k = np.log2(np.maximum(ratio, 1)).round().astype(np.int64)
        held = (dims > 0) & (self.dims[tables] == dims << k) & (k < self.gb.shape[1])
        out = self.gb[tables, np.minimum(k, self.gb.shape[1] - 1)] if len(tables) else np.zeros(0)
        if not np.all(held & ~np.isnan(out)):
            bad = int(np.flatnonzero(~(held & ~np.isnan(out)))[0])
            raise PlanError(f"no storage for a shard of {dims[bad]} columns of table {tables[bad]} "
                             f"(dim {self.dims[tables[bad]]}): not a column halving")
        return out


@dataclass(frozen=True)
class ShardingTask:
    """Tables to shard: dataset ids, dims, and their 19 data features."""

    table_ids: np.ndarray     # [T] int, ids into the dataset
    dims: np.ndarray          # [T] int
    data_features: np.ndarray  # [T, 19]
    num_rows: np.ndarray | None = None  # real row counts, where they differ from the feature max(100, rows)
    column_wise: np.ndarray | None = None  # [T] bool: TorchRec shards the table column-wise even when whole
                                           # (`NeuroShardPlanner`'s column_wise-only tables); None: none
    storage: ShardStorage | None = None  # what a shard occupies; None: its fp32 weights (rows x dim x 4 bytes)
    row_block: np.ndarray | None = None  # [T] int: the rank holding this table, a row block of a table TorchRec shards
                                         # row-wise (block r on rank r; `NeuroShardPlanner`), -1 for a table the
                                         # search places; None: none
    replica: np.ndarray | None = None    # [T] int: the rank holding this table, its replica of a table TorchRec runs
                                         # data-parallel (`NeuroShardPlanner`), -1 for others; None: none
    type_group: np.ndarray | None = None  # [T] int: the group of a table whose sharding type TorchRec runs apart from
                                          # the one it cuts like (`NeuroShardPlanner`, one host; `simulator.own_group`):
                                          # 4 table_column_wise (its column shards), 5 grid_shard or 6 table_row_wise
                                          # (its row blocks); -1 for the others; None: none

    @classmethod
    def from_dataset(cls, ds: DLRMDataset, table_ids, dims) -> "ShardingTask":
        table_ids = np.asarray(table_ids, dtype=np.int64)
        return cls(table_ids, np.asarray(dims, dtype=np.int64), ds.features[table_ids])

    @property
    def num_tables(self) -> int:
        return len(self.table_ids)

    @property
    def rows(self) -> np.ndarray:
        """Row counts of the tables (memory, operators); the `row` feature unless real counts are given."""
        return self.data_features[:, 0] if self.num_rows is None else self.num_rows

    @property
    def pooling_factors(self) -> np.ndarray:
        return self.data_features[:, 1]

    def column_wise_shards(self, tables, dims) -> np.ndarray:
        """The one rule of which shards TorchRec runs in its column-wise sharding group: per shard (its table index
        and dim), 1 where the table is split (the shard narrower than its table) or must be column-wise even
        whole (`column_wise`), else 0 (table-wise)."""
        tables = np.asarray(tables, np.int64)
        out = np.asarray(dims) < self.dims[tables]
        if self.column_wise is not None:
            out = out | np.asarray(self.column_wise, bool)[tables]
        return out.astype(np.int64)

    def shard_groups(self, tables, dims) -> np.ndarray:
        """Per shard (its table index and dim), the sharding group TorchRec runs it in (the step cost's groups,
        `simulator.GROUPS`): 3 for a replica of a data-parallel table, 2 for a row block of a row-wise table, else
        `column_wise_shards`'s 1 or 0; a column shard or row block of a table with a `type_group` is in that group."""
        tables = np.asarray(tables, np.int64)
        group = self.column_wise_shards(tables, dims)
        if self.row_block is not None:
            group = np.where(np.asarray(self.row_block)[tables] >= 0, 2, group)
        if self.type_group is not None:
            own = np.asarray(self.type_group, np.int64)[tables]
            group = np.where((own >= 0) & (group > 0), own, group)
        if self.replica is not None:
            group = np.where(np.asarray(self.replica)[tables] >= 0, 3, group)
        return group

    def shard_replicas(self, tables) -> np.ndarray:
        """Per shard (its table index), the rank of its replica (a data-parallel table's), or -1 for any other."""
        tables = np.asarray(tables, np.int64)
        if self.replica is None:
            return np.full(len(tables), -1, np.int64)
        return np.asarray(self.replica, np.int64)[tables]

    def pinned_ranks(self, tables) -> np.ndarray:
        """Per shard (its table index), the rank it must go to (a row block's or a replica's), or -1 where the search
        chooses."""
        tables = np.asarray(tables, np.int64)
        out = np.full(len(tables), -1, np.int64)
        for ranks in (self.row_block, self.replica):
            if ranks is not None:
                out = np.maximum(out, np.asarray(ranks)[tables])
        return out

    def shard_sizes_gb(self, tables, dims) -> np.ndarray:
        """The memory (GB) each shard (its table index and dim) occupies on its rank: its fp32 weights, or what
        `storage` counts."""
        if self.storage is None:
            return table_size_gb(self.rows[np.asarray(tables, np.int64)], dims)
        return self.storage.shard_gb(tables, dims)

    def sizes_gb(self) -> np.ndarray:
        return self.shard_sizes_gb(np.arange(self.num_tables), self.dims)

    def features(self) -> np.ndarray:
        """[T, 20] feature vectors (dim first)."""
        return with_dim(self.data_features, self.dims)

    def total_size_gb(self) -> float:
        return float(self.sizes_gb().sum())


def generate_tasks(ds: DLRMDataset, num_tasks: int, T_range: tuple[int, int], max_mem_gb: float,
                   max_dim: int, seed: int, max_tries_per_task: int = 100_000) -> list[dict]:
    """Draw tasks: T in [lo, hi), tables with replacement, dims from the dim set; redraw if over budget.

    Each task gets its own budget of draws, so any number of tasks can be drawn where one can."""
    lo, hi = T_range
    dims_set = np.array(dim_choices(max_dim))
    rows = ds.rows
    smallest = np.sort(table_size_gb(rows, dims_set.min()))[:lo].sum()
    if smallest > max_mem_gb:
        raise UserError(f"--max_mem {max_mem_gb} GB cannot hold even the {lo} smallest tables "
                        f"({smallest:.2f} GB); raise --max_mem or lower --T_range")
    rng = np.random.default_rng(seed)
    tasks = []
    for i in tqdm(range(num_tasks), desc="tasks", leave=False):
        for tries in range(max_tries_per_task + 1):
            if tries == max_tries_per_task:
                raise UserError(f"could not draw task {i} within {max_mem_gb} GB in {max_tries_per_task:,} tries; "
                                "raise --max_mem or lower --T_range / --max_dim")
            T = int(rng.integers(lo, hi))
            ids = rng.integers(0, ds.num_tables, T)
            dims = rng.choice(dims_set, T)
            if table_size_gb(rows[ids], dims).sum() <= max_mem_gb:
                tasks.append({"table_ids": ids.astype(np.int64), "dims": dims.astype(np.int64)})
                break
    return tasks


def save_tasks(path: str | Path, tasks: list[dict], ds: DLRMDataset, **made_with) -> Path:
    return atomic_write_pickle(path, {
        "kind": TASKS_KIND,
        "tasks": tasks,
        "dataset_fingerprint": ds.fingerprint,
        "dataset_num_tables": ds.num_tables,
        "provenance": provenance(dataset=str(ds.path), **made_with),
    })


def check_task_entry(entry, num_tables: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    """Table ids and dims of one task entry, or a `UserError` naming what is wrong with it."""
    if not isinstance(entry, dict) or not {"table_ids", "dims"} <= set(entry):
        raise UserError(f"{where}: a task needs table_ids and dims; regenerate the file with tools/gen_tasks.py")
    ids, dims = np.asarray(entry["table_ids"]), np.asarray(entry["dims"])
    if ids.ndim != 1 or dims.shape != ids.shape or ids.size == 0 or ids.dtype.kind not in "iu" \
            or dims.dtype.kind not in "iu":
        raise UserError(f"{where}: table_ids and dims must be equal-length, non-empty lists of whole numbers")
    bad = (ids < 0) | (ids >= num_tables)
    if bad.any():
        raise UserError(f"{where}: unknown table id {int(ids[bad][0])} (the dataset has tables 0..{num_tables - 1}); "
                        "regenerate the tasks for this dataset")
    legal = np.isin(dims, DIM_CHOICES)
    if not legal.all():
        raise UserError(f"{where}: illegal dim {int(dims[~legal][0])}; dims must be one of "
                        f"{', '.join(map(str, sorted(DIM_CHOICES)))}")
    return ids.astype(np.int64), dims.astype(np.int64)


def load_tasks(path: str | Path, ds: DLRMDataset) -> list[ShardingTask]:
    obj = load_pickle(path, "task file")
    if not isinstance(obj, dict) or obj.get("kind") != TASKS_KIND or not isinstance(obj.get("tasks"), list):
        raise UserError(f"{path} is not a neuroshard task file; write one with tools/gen_tasks.py")
    if obj.get("dataset_fingerprint") != ds.fingerprint:
        raise UserError(f"{path} was made from another dataset than {ds.path}; "
                        "regenerate it with tools/gen_tasks.py --data_dir " + str(ds.path))
    if not obj["tasks"]:
        raise UserError(f"{path} holds no tasks; regenerate it with tools/gen_tasks.py --data_size N")
    tasks = []
    for i, entry in enumerate(obj["tasks"]):
        ids, dims = check_task_entry(entry, ds.num_tables, f"{path} task {i}")
        tasks.append(ShardingTask.from_dataset(ds, ids, dims))
    return tasks


def make_task_file(cfg: TasksConfig) -> Path:
    """Step 2: draw `cfg.data_size` tasks from a processed dataset into OUT_DIR/SPLIT.pkl."""
    cfg.check()
    check_max_dim(cfg.max_dim)
    T_range, max_mem, max_dim, seed = tuple(cfg.T_range), cfg.max_mem, cfg.max_dim, cfg.seed
    ds = DLRMDataset.load(cfg.data_dir)
    tasks = generate_tasks(ds, cfg.data_size, T_range, max_mem, max_dim, seed)
    path = save_tasks(tasks_path(cfg.out_dir, cfg.split), tasks, ds, seed=seed, T_range=T_range,
                      max_mem_gb=max_mem, max_dim=max_dim)
    print(f"wrote {len(tasks)} tasks ({T_range[0]}-{T_range[1] - 1} tables, <= {max_mem} GB each) to {path}")
    return path
