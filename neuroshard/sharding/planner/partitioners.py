"""The partitioner: NeuroShard's greedy grid search over dim-sum thresholds (DESIGN.md §3.5)."""
from __future__ import annotations

import numpy as np

from ...core.config import SearchParams
from ...core.costs import Cluster
from ..search import ShardTable, grid_search_batch
from ..simulator import Simulator
from .types import Partitioner, PerfModel


class GridSearchPartitioner(Partitioner):
    """For each threshold, shards (most expensive first) go to the rank with room whose predicted compute (the
    simulator's compute model) is lowest and whose dim sum stays under the threshold; the perf model rates each
    complete placement and the best threshold wins."""

    def __init__(self, simulator: Simulator):
        self.simulator = simulator

    def partition(self, shards: ShardTable, states: list[list[tuple[int, int]]], cluster: Cluster,
                  params: SearchParams, perf_model: PerfModel) -> tuple[np.ndarray, np.ndarray]:
        return grid_search_batch(self.simulator, shards, states, cluster, params, rate=perf_model.rate_placements)
