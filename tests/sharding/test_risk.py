"""The risk-aware search (`sharding/risk.py`): the members' batched costs against each member's own plan cost, and the
search itself against the paper's where the members cannot disagree."""
from dataclasses import replace

import numpy as np
import pytest

from neuroshard.core.config import SearchParams
from neuroshard.core.costs import Cluster
from neuroshard.core.errors import UserError
from neuroshard.sharding.registry import make_sharder, shard_task
from neuroshard.planning.measure import format_candidates
from neuroshard.sharding.candidates import candidate_plans
from neuroshard.sharding.risk import INTERVAL_WIDTH, member_costs, plan_spread
from neuroshard.sharding.search import Placements, ShardTable, neuroshard_search, plan_key
from neuroshard.sharding.simulator import Simulator

from analytic_models import hand_comm_model, hand_compute_model
from test_search import random_neural_simulator, random_task


def ensemble(N, cost, seeds=(1, 2, 3)):
    """The pre-trained models (seed 0) with members of other random weights, scoring by `cost`."""
    base = random_neural_simulator(N, 0)
    members = tuple(random_neural_simulator(N, s) for s in seeds)
    return Simulator(base.compute, base.fw, base.bw, cost, members=members)


def placements(st: ShardTable, plan, sim) -> Placements:
    """One plan as the search's batch of complete placements."""
    items = np.array([[st.index[(s.table, s.dim)] for s in plan.shards]])
    devices = np.array([plan.device_of])
    return Placements(items, devices, np.zeros((1, plan.num_devices)), plan.device_dim_sums()[None])


@pytest.mark.parametrize("cost", ["paper", "step"])
def test_members_batched_costs_equal_each_members_own_plan_cost(cost):
    rng = np.random.default_rng(3)
    checked = 0
    for trial in range(8):
        N = int(rng.integers(2, 5))
        task = random_task(rng, int(rng.integers(4, 9)))
        sim = ensemble(N, cost)
        plan = neuroshard_search(sim, task, Cluster(N, 100.0))
        moved = replace(plan, device_of=[int(d) for d in rng.integers(0, N, len(plan.device_of))])
        for p in (plan, moved):
            st = ShardTable(sim, task)
            got = member_costs(sim, st, placements(st, p, sim))[:, 0]
            want = [m.plan_cost(task, p).cost_ms for m in sim.members]
            assert np.allclose(got, want, rtol=1e-9, atol=1e-6), (got, want)
            sp = plan_spread(sim, task, p)
            assert sp.mean_ms == pytest.approx(np.mean(want)) and sp.sd_ms == pytest.approx(np.std(want, ddof=1))
            checked += 1
    assert checked == 16


@pytest.mark.parametrize("cost", ["paper", "step"])
def test_members_that_cannot_disagree_give_the_papers_plan(cost):
    """Members that are the pre-trained models themselves: no spread, the mean is the models' cost, so every
    lambda ranks as the paper's search does and the plans are the same."""
    rng = np.random.default_rng(11)
    for trial in range(6):
        N = int(rng.integers(2, 4))
        task = random_task(rng, int(rng.integers(5, 10)))
        base = random_neural_simulator(N, trial)
        sim = Simulator(base.compute, base.fw, base.bw, cost, members=(base, base))
        paper = shard_task(make_sharder("neuroshard", 0, sim), task, Cluster(N, 100.0)).plan
        for lam in (0.0, 2.0):
            risk = shard_task(make_sharder("neuroshard_risk", 0, sim, replace(SearchParams(), risk_lambda=lam)),
                              task, Cluster(N, 100.0)).plan
            assert plan_key(risk) == plan_key(paper)


def test_members_that_disagree_change_the_plan_and_lower_its_risk_score():
    """With members of other weights the risk search ranks by their mean + lambda x sd: its plan's score is no
    higher than the paper plan's score by the same members (both plans are ones the search can reach)."""
    rng = np.random.default_rng(5)
    changed = 0
    for trial in range(8):
        task = random_task(rng, 8)
        sim = ensemble(3, "paper")
        paper = shard_task(make_sharder("neuroshard", 0, sim), task, Cluster(3, 100.0)).plan
        risk = shard_task(make_sharder("neuroshard_risk", 0, sim, replace(SearchParams(), risk_lambda=1.0)), task,
                          Cluster(3, 100.0)).plan
        score = {k: (lambda s: s.mean_ms + s.sd_ms)(plan_spread(sim, task, p)) for k, p in (("paper", paper),
                                                                                          ("risk", risk))}
        if not paper.splits and not risk.splits:  # table-wise both: the grid searched the same placements
            assert score["risk"] <= score["paper"] + 1e-6, score
        changed += plan_key(risk) != plan_key(paper)
    assert changed >= 2


def test_the_risk_search_needs_members():
    base = random_neural_simulator(2, 0)
    with pytest.raises(UserError, match=r"needs the cost models' ensemble members .*train_ensemble\.py --ndevices 2"):
        make_sharder("neuroshard_risk", 0, base)
    with pytest.raises(UserError, match="needs the pre-trained cost models and their ensemble members"):
        make_sharder("neuroshard_risk")


def test_a_candidates_stated_interval_is_its_cost_widened_by_the_members_spread():
    rng = np.random.default_rng(2)
    task = random_task(rng, 8)
    hand = [Simulator(hand_compute_model(), hand_comm_model(3, "fw", scale), hand_comm_model(3, "bw", scale))
            for scale in (1.0, 0.7, 1.4)]  # members whose all-to-alls disagree
    sim = hand[0].with_members(tuple(hand[1:]))
    cands = candidate_plans(task, Cluster(3, 100.0), sim, SearchParams(), 4096, 2)
    assert len(cands) >= 3
    for c in cands:
        sp = plan_spread(sim, task, c.plan)
        h = 1.6448536269514722 * INTERVAL_WIDTH * sp.sd_ms / sp.mean_ms
        assert sp.sd_ms > 0 and np.allclose(c.predicted_interval_ms, (c.simulated_ms * max(0, 1 - h),
                                                                      c.simulated_ms * (1 + h)), rtol=1e-6)
    rows = [{"names": c.names, "measured_ms": 1.0, "simulated_ms": c.simulated_ms, "rounds": 1, "ratio_to_best": 1.0,
             "ci_lo": 1.0, "ci_hi": 1.0, "predicted_90_ms": list(c.predicted_interval_ms)} for c in cands]
    table = "\n".join(format_candidates(rows))
    lo, hi = cands[0].predicted_interval_ms
    assert "predicted 90%" in table and f"[{lo:.3f}, {hi:.3f}]" in table
    # without members: no interval, and no column
    plain = candidate_plans(task, Cluster(3, 100.0), hand[0], SearchParams(), 4096, 2)
    assert all(c.predicted_interval_ms is None for c in plain)
