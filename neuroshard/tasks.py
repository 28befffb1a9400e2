"""Sharding tasks (DESIGN.md §2.4): lists of dataset tables, each with a dim.

A task file (`tasks.pkl`) holds `{"kind", "tasks": [{"table_ids", "dims"}], "dataset_fingerprint", ...}`;
`load_tasks` refuses a file made from another dataset.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .artifacts import atomic_write_pickle, load_pickle, provenance
from .dataset import DLRMDataset
from .errors import UserError
from .tables import dim_choices, table_size_gb, with_dim

TASKS_KIND = "neuroshard.tasks"


@dataclass(frozen=True)
class ShardingTask:
    """Tables to shard: dataset ids, dims, and their 19 data features."""

    table_ids: np.ndarray     # [T] int, ids into the dataset
    dims: np.ndarray          # [T] int
    data_features: np.ndarray  # [T, 19]

    @classmethod
    def from_dataset(cls, ds: DLRMDataset, table_ids, dims) -> "ShardingTask":
        table_ids = np.asarray(table_ids, dtype=np.int64)
        return cls(table_ids, np.asarray(dims, dtype=np.int64), ds.features[table_ids])

    @property
    def num_tables(self) -> int:
        return len(self.table_ids)

    @property
    def rows(self) -> np.ndarray:
        return self.data_features[:, 0]

    @property
    def pooling_factors(self) -> np.ndarray:
        return self.data_features[:, 1]

    def sizes_gb(self) -> np.ndarray:
        return table_size_gb(self.rows, self.dims)

    def features(self) -> np.ndarray:
        """[T, 20] feature vectors (dim first)."""
        return with_dim(self.data_features, self.dims)


def generate_tasks(ds: DLRMDataset, num_tasks: int, T_range: tuple[int, int], max_mem_gb: float,
                   max_dim: int, seed: int, max_tries: int = 100_000) -> list[dict]:
    """Draw tasks: T in [lo, hi), tables with replacement, dims from the dim set; redraw if over budget."""
    lo, hi = T_range
    dims_set = np.array(dim_choices(max_dim))
    rows = ds.rows
    smallest = np.sort(table_size_gb(rows, dims_set.min()))[:lo].sum()
    if smallest > max_mem_gb:
        raise UserError(f"--max_mem {max_mem_gb} GB cannot hold even the {lo} smallest tables "
                        f"({smallest:.2f} GB); raise --max_mem or lower --T_range")
    rng = np.random.default_rng(seed)
    tasks, tries = [], 0
    for _ in tqdm(range(num_tasks), desc="tasks", leave=False):
        while True:
            tries += 1
            if tries > max_tries:
                raise UserError(f"could not draw tasks within {max_mem_gb} GB after {max_tries} tries; "
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


def load_tasks(path: str | Path, ds: DLRMDataset) -> list[ShardingTask]:
    obj = load_pickle(path, "task file")
    if not isinstance(obj, dict) or obj.get("kind") != TASKS_KIND:
        raise UserError(f"{path} is not a neuroshard task file; write one with tools/gen_tasks.py")
    if obj["dataset_fingerprint"] != ds.fingerprint:
        raise UserError(f"{path} was made from another dataset than {ds.path}; "
                        "regenerate it with tools/gen_tasks.py --data_dir " + str(ds.path))
    return [ShardingTask.from_dataset(ds, t["table_ids"], t["dims"]) for t in obj["tasks"]]
