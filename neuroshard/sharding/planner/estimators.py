"""The perf model: NeuroShard's simulator (the three pre-trained cost models) rates every complete placement the
search makes and the plan handed out, so it decides which placement, which column split and which plan win."""
from __future__ import annotations

import numpy as np

from ...core.costs import Cost
from ...data.tasks import ShardingTask
from ..plan import Placement
from ..search import Placements, ShardTable, simulated_costs
from ..simulator import Simulator
from .types import PerfModel


class NeuralPerfModel(PerfModel):
    """Compute, forward and backward all-to-all per rank as the simulator predicts them (DESIGN.md §3.4), in the
    simulator's cost (the step cost or the paper's)."""

    def __init__(self, simulator: Simulator):
        self.simulator = simulator

    def rate(self, task: ShardingTask, plan: Placement) -> Cost:
        return self.simulator.plan_cost(task, plan)

    def rate_placements(self, shards: ShardTable, placements: Placements) -> np.ndarray:
        return simulated_costs(self.simulator, shards, placements)
