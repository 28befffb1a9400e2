"""The perf model: NeuroShard's simulator (the three pre-trained cost models) rates a plan."""
from __future__ import annotations

from ...core.types import Cost
from ...data.tasks import ShardingTask
from ..plan import Placement
from ..simulator import Simulator
from .types import PerfModel


class NeuralPerfModel(PerfModel):
    """Compute, forward and backward all-to-all per rank as the simulator predicts them (DESIGN.md §3.4)."""

    def __init__(self, simulator: Simulator):
        self.simulator = simulator

    def rate(self, task: ShardingTask, plan: Placement) -> Cost:
        return self.simulator.plan_cost(task, plan)
