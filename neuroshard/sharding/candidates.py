"""The candidate plans of a set of tables (DESIGN.md §8): NeuroShard's best distinct plans, every greedy
heuristic's and TorchRec's, deduplicated (identical plans are one candidate under all their names) and each
with its simulated cost. `--measure` measures them. `best_simulated` is the one `--alg neuroshard` and
`NeuroShardPlanner` hand out: the plan the simulator rates fastest, unless it is rated less than `min_gain`
cheaper than TorchRec's plan, which is then kept. So neither hands out a plan its own simulator predicts slower
than TorchRec's, nor trades TorchRec's plan for a gain smaller than the models can tell apart; the price is that
TorchRec's plan is kept where another is rated less than `min_gain` cheaper (`min_gain` 0: always the fastest
rated; docs/planning.md).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..core.costs import Cluster, Cost
from ..core.errors import PlanError
from ..data.tasks import ShardingTask
from .plan import Placement, fits_memory
from . import registry
from .risk import predicted_interval
from .search import neuroshard_top_plans, plan_key

logger = logging.getLogger(__name__)


@dataclass
class Candidate:
    names: list[str]
    plan: Placement
    simulated_ms: float | None = None
    round_ms: list[float] = field(default_factory=list)
    simulated_parts_ms: list[list[float]] | None = None  # per device [compute, fw, bw] as simulated
    round_parts_ms: list[np.ndarray] = field(default_factory=list)  # per round, per rank [compute, fw, bw]
    predicted_interval_ms: tuple[float, float] | None = None  # the stated 90% interval (`risk.predicted_interval`)


# the predicted cost of one plan of a task (None: not rated, e.g. out of memory)
RatePlan = Callable[[ShardingTask, Placement], "Cost | None"]


def candidate_plans(task, cluster: Cluster, sim, search, batch_size: int, top_k: int, seed: int = 0,
                    extra: dict | None = None, rate: RatePlan | None = None, torchrec: bool = True,
                    baselines: list[tuple[str, Placement]] | None = None) -> list[Candidate]:
    """NeuroShard's top distinct plans (`top_k`; 0: none), the greedy heuristics' and TorchRec's (`baselines`, made
    here where not given: `--alg torchrec`'s unless `torchrec` is False: then one in `extra` may stand for it) and
    `extra`'s, deduplicated, each rated by
    `rate` (default: the simulator's cost within the cluster's memory; no rating without a simulator); a cost that
    cannot be true is `ImplausibleCost` (`Cost.check`)."""
    named: list[tuple[str, Placement]] = []
    if sim is not None and top_k > 0:
        top = neuroshard_top_plans(sim, task, cluster, top_k, search)
        named += [(f"neuroshard#{i + 1}", p) for i, (_, p) in enumerate(top)]
    named += baseline_plans(task, cluster, sim, search, batch_size, seed, torchrec) if baselines is None else baselines
    named += list((extra or {}).items())
    if rate is None and sim is not None:
        def rate(task, plan):
            return sim.plan_cost(task, plan, cluster)
    out = rated_candidates(task, named, rate)
    if sim is not None:  # with ensemble members: each rated plan's stated interval
        for c in out:
            if c.simulated_ms is not None:
                c.predicted_interval_ms = predicted_interval(sim, task, c.plan, c.simulated_ms)
    return out


def baseline_plans(task, cluster: Cluster, sim, search, batch_size: int, seed: int = 0,
                   torchrec: bool = True) -> list[tuple[str, Placement]]:
    """(name, plan) of every greedy heuristic and, where TorchRec is installed (and `torchrec`), TorchRec's planner
    that finds a plan within memory; a TorchRec that finds none is a warning (without it, no plan is kept for a gain
    under min_gain)."""
    algs = [a for a in registry.BASELINES if a != "random"] + ([INCUMBENT] if torchrec and _torchrec_installed() else [])
    named = []
    for alg in algs:  # the registry's sharders, as the registry holds them when called
        r = registry.shard_task(registry.make_sharder(alg, seed, sim, search, batch_size), task, cluster)
        if r.plan is not None and not r.oom:
            named.append((alg, r.plan))
        elif alg == INCUMBENT:
            logger.warning("TorchRec's planner found no plan of these tables within %d x %g GB: the plans are "
                           "compared without it", cluster.num_devices, cluster.max_mem_gb)
    return named


def _torchrec_installed() -> bool:
    try:
        import torchrec  # noqa: F401
    except ImportError:
        return False
    return True


def rated_candidates(task, named: list[tuple[str, Placement]], rate: RatePlan | None) -> list[Candidate]:
    """The named plans deduplicated (identical plans are one candidate under all their names), each with its
    rated cost (none without `rate`); a cost that cannot be true is never printed, compared or handed out."""
    out: dict[tuple, Candidate] = {}
    for name, plan in named:
        key = plan_key(plan)
        if key in out:
            out[key].names.append(name)
            continue
        cost = rate(task, plan) if rate is not None else None
        if cost is not None:
            cost.check(f"{name}'s plan", negative_parts=True)
        out[key] = Candidate([name], plan, None if cost is None else cost.cost_ms,
                             simulated_parts_ms=None if cost is None else simulated_parts(cost))
    return list(out.values())


def simulated_parts(cost) -> list[list[float]]:
    """Per device [compute, fw, bw] ms of a simulated `Cost`, the layout the measured parts have."""
    return np.stack([cost.compute_ms, cost.fw_ms, cost.bw_ms], axis=1).astype(float).tolist()


INCUMBENT = "torchrec"  # the plan a candidate must beat by `min_gain` to be handed out instead


def best_simulated(candidates: list[Candidate], min_gain: float = 0.0) -> Candidate:
    """The candidate with the lowest simulated cost (ties: NeuroShard's plan, then the earlier one), unless
    TorchRec's plan is among the candidates and that one is rated less than `min_gain` (a share, 0.05 = 5%)
    cheaper than it: then TorchRec's."""
    rated = [(c.simulated_ms, not any(n.startswith("neuroshard") for n in c.names), i)
             for i, c in enumerate(candidates) if c.simulated_ms is not None]
    if not rated:
        return candidates[0]
    best = candidates[min(rated)[2]]
    incumbent = next((c for c in candidates if INCUMBENT in c.names and c.simulated_ms is not None), None)
    if incumbent is not None and best.simulated_ms > (1.0 - min_gain) * incumbent.simulated_ms:
        return incumbent
    return best


def admissible(task, plan: Placement, cluster: Cluster, no_split: frozenset[int] = frozenset(),
               fits: Callable[[Placement], bool] | None = None) -> bool:
    """Whether `plan` may be a candidate (`against_baselines`): it splits no table in `no_split`, is within each
    rank's memory, and passes `fits` (checked last, being the dearest)."""
    return (not any(plan.shards[i].table in no_split for i in plan.splits) and fits_memory(task, plan, cluster)
            and (fits is None or fits(plan)))


def against_baselines(task, cluster: Cluster, sim, search, batch_size: int, plan: Placement | None, seed: int = 0,
                      no_split: frozenset[int] = frozenset(), min_gain: float = 0.0,
                      rate: RatePlan | None = None, torchrec_plan: Placement | None | bool = True,
                      fits: Callable[[Placement], bool] | None = None,
                      baselines: list[tuple[str, Placement]] | None = None) -> tuple[Candidate, list[Candidate]]:
    """NeuroShard's `plan` rated beside TorchRec's and each greedy heuristic's plan of the same tables (`rate`, as
    `candidate_plans`; a plan that splits a table in `no_split`, is over a rank's memory or fails `fits` is not a
    candidate): the
    one handed out (`best_simulated` with `min_gain`) and all of them, fastest first; none at all is a `PlanError`.
    TorchRec's plan: `--alg torchrec`'s (True), the one given, or none (None). NeuroShard's `plan` may be None (its
    search found none within memory). `baselines`: the heuristics' plans made already (`baseline_plans`)."""
    extra = ({"neuroshard": plan} if plan is not None else {}) | (
        {INCUMBENT: torchrec_plan} if isinstance(torchrec_plan, Placement) else {})
    cands = [c for c in candidate_plans(task, cluster, sim, search, batch_size, 0, seed, extra=extra, rate=rate,
                                        torchrec=torchrec_plan is True, baselines=baselines)
             if admissible(task, c.plan, cluster, no_split, fits)]
    if not cands:
        raise PlanError("no candidate plan within memory")
    return best_simulated(cands, min_gain), sorted(cands, key=lambda c: (c.simulated_ms is None, c.simulated_ms or 0.0))


def handout_verdict(best: Candidate, ranked: list[Candidate], min_gain: float, setting: str = "--min_gain") -> str:
    """One line: which plan is handed out and why (`best_simulated`'s rule), for the printed and logged comparison;
    `setting` names min_gain as the caller's user sets it (a flag, or the planner's argument)."""
    fastest = next((c for c in ranked if c.simulated_ms is not None), best)
    names = "/".join(best.names)
    if best is not fastest and INCUMBENT in best.names:
        gain = 1.0 - fastest.simulated_ms / best.simulated_ms
        return (f"plan handed out: {names}'s; the fastest rated ({'/'.join(fastest.names)}) is only {gain:.1%} cheaper, "
                f"less than {setting} {min_gain:g}")
    if "neuroshard" in best.names:
        return f"plan handed out: NeuroShard's ({names})"
    return f"plan handed out: {names}'s, which the cost models rate faster than NeuroShard's search plan"
