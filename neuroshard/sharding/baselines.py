"""Baseline sharders of DESIGN.md §3.6: random and four greedy heuristics (table-wise only; a row block of a
row-wise table and a replica of a data-parallel one go to their own ranks)."""
from __future__ import annotations

import numpy as np

from ..core.costs import Cluster
from ..data.tasks import ShardingTask
from .greedy import greedy_place, largest_first
from .plan import Placement, apply_splits

# Sort key of each greedy heuristic, per table of a task.
GREEDY_KEYS = {
    "dim_greedy": lambda task: task.dims.astype(np.float64),
    "size_greedy": lambda task: task.sizes_gb(),
    "lookup_greedy": lambda task: task.dims * task.pooling_factors,
    "size_lookup_greedy": lambda task: task.dims * task.pooling_factors * np.log10(task.rows),
}


class GreedySharder:
    """Largest key first onto the device with the smallest accumulated key that has memory room."""

    def __init__(self, name: str):
        self.name = name
        self.key = GREEDY_KEYS[name]

    def __call__(self, task: ShardingTask, cluster: Cluster) -> Placement | None:
        keys = self.key(task)
        device_of = greedy_place(largest_first(keys), task.sizes_gb(), cluster.num_devices, cluster.max_mem_gb,
                                 device_cost=lambda items: float(keys[items].sum()),
                                 pinned=task.pinned_ranks(np.arange(task.num_tables)))
        if device_of is None:
            return None
        return Placement(cluster.num_devices, apply_splits(task.dims, []), device_of)


class RandomSharder:
    """Uniformly random device per table; ignores memory, so its plans may run out of memory."""

    name = "random"

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def __call__(self, task: ShardingTask, cluster: Cluster) -> Placement:
        device_of = self.rng.integers(0, cluster.num_devices, task.num_tables).tolist()
        return Placement(cluster.num_devices, apply_splits(task.dims, []), device_of)
