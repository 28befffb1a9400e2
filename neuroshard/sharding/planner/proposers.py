"""The proposer: NeuroShard's beam search over column splits (DESIGN.md §3.5)."""
from __future__ import annotations

from ...core.config import SearchParams
from ...core.costs import Cluster
from ...data.tasks import ShardingTask
from ..plan import Placement
from ..search import search_plan
from ..simulator import Simulator
from .types import Partitioner, PerfModel, Proposer


class BeamSplitProposer(Proposer):
    """Width `beam_width`; each state is expanded by halving one of the largest or most expensive splittable
    shards (by the simulator's single-shard compute), every expansion placed by the partitioner and rated by the
    perf model; the best-rated states go on, and the best plan seen at any depth wins. The thresholds in `params`
    are taken as given (the planner widens them)."""

    def __init__(self, simulator: Simulator):
        self.simulator = simulator

    def propose(self, task: ShardingTask, cluster: Cluster, no_split: frozenset[int], params: SearchParams,
                partitioner: Partitioner, perf_model: PerfModel) -> Placement | None:
        def partition(shards, states, cluster, params):
            return partitioner.partition(shards, states, cluster, params, perf_model)

        return search_plan(self.simulator, task, cluster, params, no_split, partition)
