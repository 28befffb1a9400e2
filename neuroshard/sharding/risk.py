"""Predicted spread of a plan's cost, and a search that does not chase its models' errors (issue 63).

The paper's search keeps, out of thousands of placements, the one its cost models rate lowest; where the models err
low that error wins the selection, so its plans measure dearer than predicted (docs/findings.md). The ensemble
members (`models/ensemble.py`: the same models trained on resamples of the same cost data) disagree most where the
cost data are thin, which is where such errors live.

- `member_costs`: each member's cost of a batch of complete placements, [K, P]: its own compute model on each
  device's shards (embeddings summed per device, then its head), its own comm models, the simulator's cost
  (`cost="paper"` or `"step"`) otherwise unchanged.
- `PlanSpread`: one plan's members' mean and standard deviation.
- `predicted_interval`: the stated 90% interval of a plan's cost, the models' cost x (1 +- z x `INTERVAL_WIDTH` x the
  members' relative spread): centred on the cost the run reports (a calibrated one where the models are), as wide as
  the members disagree, scaled by a width chosen on training tasks' measured plans (docs/findings.md).
- `RiskAwareSharder` (`--alg neuroshard_risk`): NeuroShard's beam and grid search, unchanged, with complete
  placements ranked by mean + `risk_lambda` x sd over the members instead of the pre-trained models' cost. The
  devices a shard goes to are still chosen by the pre-trained compute model, as in the paper.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy.stats import norm

from ..core.config import SearchParams
from ..core.costs import Cluster, round_ms
from ..core.errors import UserError
from ..data.tasks import ShardingTask
from .plan import Placement
from .search import Placements, ShardTable, fitting_thresholds, grid_search_batch, search_plan, simulated_costs
from .simulator import Simulator


def check_members(sim: Simulator, what: str = "--alg neuroshard_risk") -> tuple[Simulator, ...]:
    """The simulator's ensemble members, or one line saying how to train them."""
    if len(sim.members) < 2:
        raise UserError(f"{what} needs the cost models' ensemble members (models/ensemble/b<k>/); train them with "
                        f"python train_ensemble.py --ndevices {sim.num_devices} (tools/run_pipeline.py does it)")
    return sim.members


def member_costs(sim: Simulator, st: ShardTable, p: Placements) -> np.ndarray:
    """Each member's cost of each complete placement, [K, P] (module docstring): its own set cost of each device's
    shards, then `simulated_costs` with its own comm models."""
    members = check_members(sim)
    P, L = p.items.shape
    at = (np.repeat(np.arange(P), L), p.devices.ravel())
    count = np.zeros(p.compute.shape, np.int64)
    in_set = st.in_set[p.items.ravel()]  # replicas compute apart (`Simulator.replica_compute_ms`)
    np.add.at(count, at, in_set)
    out = np.empty((len(members), P))
    for k, m in enumerate(members):
        set_emb, replica_ms = st.member_set(k, m)
        sums = np.zeros((*count.shape, set_emb.shape[1]))
        np.add.at(sums, at, set_emb[p.items.ravel()])
        out[k] = simulated_costs(m, st, replace(p, compute=m.set_cost(sums, count) + replica_ms))
    return out


@dataclass(frozen=True)
class PlanSpread:
    """A plan's cost over the ensemble members: mean and standard deviation (ms), members K."""
    mean_ms: float
    sd_ms: float
    members: int

    @property
    def relative_sd(self) -> float:
        return self.sd_ms / self.mean_ms if self.mean_ms > 0 else float("nan")


INTERVAL_LEVEL = 0.9
STATED_BY_SPREAD = "members' spread"  # the results' `stated_by` of a plan whose interval is `predicted_interval`'s
INTERVAL_WIDTH = 8.0  # the multiple of the members' spread that held 90% of training tasks' measured plans (docs/findings.md)


def predicted_interval(sim: Simulator, task: ShardingTask, plan: Placement, cost_ms: float,
                       level: float = INTERVAL_LEVEL, width: float = INTERVAL_WIDTH) -> tuple[float, float] | None:
    """The stated `level` interval of a plan whose models' cost is `cost_ms` (module docstring); None without
    ensemble members."""
    if len(sim.members) < 2:
        return None
    h = float(norm.ppf(0.5 + level / 2)) * width * plan_spread(sim, task, plan).relative_sd
    return cost_ms * max(0.0, 1.0 - h), cost_ms * (1.0 + h)


def plan_spread(sim: Simulator, task: ShardingTask, plan: Placement) -> PlanSpread:
    """One plan's `PlanSpread` (its devices' shards as the plan places them)."""
    members = check_members(sim, "a predicted interval")
    costs = np.array([m.plan_cost(task, plan).cost_ms for m in members])
    return PlanSpread(float(costs.mean()), float(costs.std(ddof=1)), len(costs))


def risk_rate(sim: Simulator, risk_lambda: float):
    """A `Rate` for the search: members' mean + `risk_lambda` x their sd."""
    def rate(st: ShardTable, p: Placements) -> np.ndarray:
        c = member_costs(sim, st, p)
        return round_ms(c.mean(axis=0) + risk_lambda * c.std(axis=0, ddof=1))
    return rate


class RiskAwareSharder:
    """`--alg neuroshard_risk` (module docstring)."""
    name = "neuroshard_risk"

    def __init__(self, sim: Simulator, params: SearchParams = SearchParams()):
        check_members(sim)
        self.sim, self.params = sim, params
        self.note: str | None = None

    def __call__(self, task: ShardingTask, cluster: Cluster) -> Placement | None:
        params, self.note = fitting_thresholds(task, cluster.num_devices, self.params)
        rate = risk_rate(self.sim, self.params.risk_lambda)

        def partition(st, states, cluster, params):
            return grid_search_batch(self.sim, st, states, cluster, params, rate=rate)
        return search_plan(self.sim, task, cluster, params, partition=partition)

