"""The proposer: NeuroShard's beam search over column splits (DESIGN.md §3.5)."""
from __future__ import annotations

from ...core.config import SearchParams
from ...core.types import Cluster
from ...data.tasks import ShardingTask
from ..plan import Placement
from ..search import neuroshard_search
from ..simulator import Simulator
from .types import Partitioner, Proposer


class BeamSplitProposer(Proposer):
    """Width `beam_width`; each state is expanded by halving one of the largest or most expensive splittable
    shards, every expansion placed by the partitioner; the best plan seen at any depth wins."""

    def __init__(self, simulator: Simulator):
        self.simulator = simulator

    def propose(self, task: ShardingTask, cluster: Cluster, no_split: frozenset[int], params: SearchParams,
                partitioner: Partitioner) -> Placement | None:
        return neuroshard_search(self.simulator, task, cluster, params, no_split, partition=partitioner.partition)
