"""The measured-best plan (DESIGN.md §8): the selection picks the cheapest plan, says "cannot be told
apart" when the top plans are the same, never writes a plan that measured worse, and honours the budget."""
import math

import numpy as np
import pytest

from neuroshard.core.errors import UserError
from neuroshard.core.costs import Cluster
from neuroshard.data.table_list import load_table_list
from neuroshard.hardware.engine import machine_drift
from neuroshard.planning.measure import (Candidate, MeasureConfig, candidate_plans, drift_corrected_ms,
                                         measure_candidates, step_breakdown, summarize)
from neuroshard.planning.stop_rule import StopRule, look_alpha, look_rounds, separation, still_measured
from neuroshard.hardware.backends import resolve_hardware
from neuroshard.sharding.plan import Placement, apply_splits
from neuroshard.sharding.search import SearchParams, plan_key

from analytic_models import analytic_simulator

# planted deadlines (time.time() values), so the stop rule's answers do not depend on this machine's clock or speed
NO_DEADLINE = math.inf  # a budget never spent
SPENT = 0.0             # a budget spent long ago: one more round always passes it

TABLES = """name,rows,dim,pooling_factor
a,20000,64,8
b,30000,64,8
c,1000,16,1
d,3000,32,20
e,500,8,1
f,8000,32,4
"""


def _cands(costs, same_plan=False):
    plan = Placement(2, apply_splits([8], []), [0])
    return [Candidate([f"p{i}"], plan, 1.0, list(costs[:, i])) for i in range(costs.shape[1])]


def test_selection_picks_the_cheapest_and_separates_it():
    rng = np.random.default_rng(0)
    R = 12
    base = rng.uniform(9, 11, R)[:, None]  # a slow period hits every plan of a round alike
    costs = base * np.array([1.0, 0.9, 1.2]) * rng.uniform(0.98, 1.02, (R, 3))
    res = summarize(_cands(costs), 1.0, MeasureConfig(), log=lambda *_: None)
    assert res["best"] == ["p1"] and res["separated"]
    assert res["ci_hi"] < 1.0 and 0.85 < res["ratio_to_runner_up"] < 0.95
    rows = {r["names"][0]: r for r in res["candidates"]}
    assert min(rows, key=lambda n: rows[n]["measured_ms"]) == "p1"
    assert rows["p2"]["ci_lo"] > 1.0  # the slow plan's interval against the best excludes 1


def test_identical_plans_cannot_be_told_apart():
    rng = np.random.default_rng(1)
    one = rng.uniform(9, 11, (10, 1))
    res = summarize(_cands(np.hstack([one, one])), 1.0, MeasureConfig(), log=lambda *_: None)
    assert not res["separated"] and "cannot be told apart" in res["verdict"]
    assert res["ci_lo"] <= 1.0 <= res["ci_hi"]
    # noisy but equal in distribution: not separated either
    noisy = rng.uniform(9, 11, (10, 2))
    assert not separation(noisy)["separated"]


def test_stop_rule_budget_and_rounds():
    sep = np.array([[1.0, 2.0]] * 6)
    assert StopRule(NO_DEADLINE, 5, 50)(sep[:5], 1.0)           # separated at the first look (min rounds)
    assert not StopRule(NO_DEADLINE, 5, 50)(sep, 1.0)           # round 6 is not a look
    assert StopRule(NO_DEADLINE, 5, 50)(np.vstack([sep, sep[:2]]), 1.0)  # round 8 is
    assert not StopRule(NO_DEADLINE, 8, 50)(sep, 1.0)           # not yet min rounds
    assert StopRule(SPENT, 8, 50)(sep[:1], 1.0)               # one more round would pass the budget
    assert StopRule(NO_DEADLINE, 2, 6)(np.ones((6, 2)), 0.1)    # max rounds
    assert not StopRule(NO_DEADLINE, 2, 50)(np.ones((6, 2)), 0.1)
    with pytest.raises(UserError, match="measure_budget_s"):
        MeasureConfig(budget_s=0).check()
    with pytest.raises(UserError, match="measure_top"):
        MeasureConfig(top_k=2).check()


def test_candidates_are_distinct_and_measured_best_is_not_the_bad_plan(tmp_path):
    (tmp_path / "t.csv").write_text(TABLES)
    tl = load_table_list(tmp_path / "t.csv")
    cluster = Cluster(2, 0.02)
    sim = analytic_simulator(2)
    # a deliberately bad plan: every table on device 0
    bad = Placement(2, apply_splits(tl.task.dims, []), [0] * tl.task.num_tables)
    cands = candidate_plans(tl.task, cluster, sim, SearchParams(max_splits=3), 256, 3, extra={"all_on_0": bad})
    keys = [plan_key(c.plan) for c in cands]
    assert len(set(keys)) == len(keys)
    names = [n for c in cands for n in c.names]
    assert {"neuroshard#1", "neuroshard#2", "neuroshard#3", "dim_greedy", "all_on_0"} <= set(names)
    budget = 12.0
    res = measure_candidates(tl, cluster, cands, resolve_hardware("cpu", "auto"), 256,
                             MeasureConfig(budget_s=budget, warmup_iter=1, num_iter=2, min_rounds=3), log=lambda *_: None)
    # the budget: the first round always runs; every later round starts before the budget is spent
    assert res["rounds"] == len(res["round_end_s"]) >= 1
    assert all(t <= budget for t in res["round_end_s"][:-1]), res["round_end_s"]
    rows = {"/".join(r["names"]): r for r in res["candidates"]}
    best = "/".join(res["best"])
    # never worse than a candidate measured in every round (one racing dropped was slower than the best of an
    # earlier look, which need not be the final best); a ratio needs two rounds (on a loaded machine the first
    # round alone may spend the budget)
    ratios = {k: r["ratio_to_best"] for k, r in rows.items() if r["rounds"] == res["rounds"]}
    assert all(x >= 1.0 for x in ratios.values()) if res["rounds"] >= 2 else all(np.isnan(x) for x in ratios.values()), \
        (res["rounds"], ratios)
    assert all(rows[best]["measured_ms"] <= r["measured_ms"] for r in rows.values() if r["rounds"] == res["rounds"])
    assert all(len(r["round_ms"]) == res["rounds"] for r in rows.values())
    # per rank [compute, fw, bw], measured (median over rounds) and simulated: device 1 of all_on_0 has no table
    bad_row = rows[next(k for k in rows if "all_on_0" in k)]
    m, s = np.asarray(bad_row["measured_parts_ms"]), np.asarray(bad_row["simulated_parts_ms"])
    assert m.shape == s.shape == (2, 3) and m[1, 0] == 0.0 < m[0, 0] and s[1, 0] == 0.0 < s[0, 0]
    assert np.isclose(s.sum(axis=1).max(), bad_row["simulated_ms"], rtol=1e-5)
    # which plan is fastest on tiny tables is the hardware's call (all on one device can win: no comm);
    # the rule is not: given round costs where the bad plan is slowest every round, it is never written
    from dataclasses import replace

    rng = np.random.default_rng(0)
    timed = [replace(c, round_ms=list(1.0 + 0.05 * rng.random(6) + (2.0 if "all_on_0" in c.names else 0.1 * i)))
             for i, c in enumerate(cands)]
    out = summarize(timed, 1.0, MeasureConfig(), log=lambda *_: None)
    assert out["best"] == cands[0].names and "all_on_0" not in out["best"]


def test_machine_drift_and_the_drift_corrected_cost_by_hand():
    reference = [{"compute_ms": [2.0, 4.0], "bw_ms": [1.0, 1.0]}, {"compute_ms": [1.0, 1.0], "bw_ms": [2.0, 2.0]}]
    # round 0 measures group 0 at 1.5x its compute and 2x its bw; round 1 group 1 at 1.5x and 2x; round 2 group 0 again
    rounds = [np.array([[3.0, 9.0, 2.0], [6.0, 9.0, 2.0]]), np.array([[1.5, 9.0, 4.0], [1.5, 9.0, 4.0]]),
              np.array([[3.0, 9.0, 2.0], [6.0, 9.0, 2.0]])]
    d = machine_drift(reference, rounds)
    assert d["rounds"] == 3 and d["groups"] == 2
    assert np.isclose(d["compute"]["ratio"], 1.5) and np.isclose(d["comm"]["ratio"], 2.0)
    assert np.isclose(d["compute"]["ci_lo"], 1.5) and np.isclose(d["comm"]["ci_hi"], 2.0)
    # [compute, fw, bw] per device: device 1 = 4 * 1.5 + (1 + 1) * 2 = 10 > device 0 = 2 * 1.5 + 3 * 2 = 9
    assert np.isclose(drift_corrected_ms([[2.0, 2.0, 1.0], [4.0, 1.0, 1.0]], d), 10.0)
    # a drift that moves between rounds gets an interval around its geometric mean
    rounds[1] = rounds[1] * np.array([1.0, 1.0, 2.0])
    wide = machine_drift(reference, rounds)["comm"]
    assert wide["ci_lo"] < wide["ratio"] < wide["ci_hi"] and np.isclose(wide["ratio"], 2.0 * 2 ** (1 / 3))


def test_the_drift_reference_is_measured_every_round_and_never_a_candidate(tmp_path):
    (tmp_path / "t.csv").write_text(TABLES)
    tl = load_table_list(tmp_path / "t.csv")
    cluster = Cluster(2, 0.02)
    cands = candidate_plans(tl.task, cluster, analytic_simulator(2), SearchParams(max_splits=3), 256, 3)
    # planted: calibration saw everything 10x slower than it is now
    reference = [{"devices": [[[0, 8]], [[1, 8], [2, 8]]], "compute_ms": [1e3, 1e3], "bw_ms": [1e3, 1e3]},
                 {"devices": [[[3, 16]], [[4, 8]]], "compute_ms": [1e3, 1e3], "bw_ms": [1e3, 1e3]}]
    lines = []
    res = measure_candidates(tl, cluster, cands, resolve_hardware("cpu", "auto"), 256,
                             MeasureConfig(budget_s=8.0, warmup_iter=1, num_iter=2, min_rounds=3), log=lines.append,
                             calibration={"reference": reference})
    d = res["drift"]
    assert d["rounds"] == res["rounds"] >= 1 and d["groups"] == 2
    assert 0 < d["compute"]["ratio"] < 0.05 and 0 < d["comm"]["ratio"] < 0.05, d  # ms now against 1,000 ms then
    assert len(res["candidates"]) == len(cands)
    assert all(len(r["round_ms"]) == res["rounds"] for r in res["candidates"])
    for r in res["candidates"]:
        assert np.isclose(r["simulated_drift_ms"], drift_corrected_ms(r["simulated_parts_ms"], d))
    assert any("machine drift since calibrating" in line for line in lines)
    assert any("drift-corrected" in line for line in lines)


def test_the_stop_rule_ignores_the_drift_reference_column():
    sep = np.array([[1.0, 2.0, 50.0]] * 6)  # candidates told apart; the reference column is not a candidate
    tie = np.array([[1.0, 1.0, 0.1]] * 6)   # candidates identical; the reference would look "separated"
    assert StopRule(NO_DEADLINE, 6, 50, num_candidates=2)(sep, 1.0)
    assert not StopRule(NO_DEADLINE, 6, 50, num_candidates=2)(tie, 1.0)
    assert StopRule(NO_DEADLINE, 6, 50)(tie, 1.0)  # without the cut, the reference column would stop the rounds


def test_the_looks_spend_five_percent_in_all_and_the_interval_is_students_t_by_hand():
    assert look_rounds(5, 50) == [5, 8, 12, 18, 27, 41, 50]
    assert look_alpha(5, 5, 50) == 0.025 and np.isclose(look_alpha(8, 5, 50), 0.05 / 6)
    assert look_alpha(6, 5, 50) is None                               # between looks the rule does not ask
    assert np.isclose(look_alpha(6, 5, 50, final=True), 0.05 / 6)     # the verdict after round 6: look 2
    assert np.isclose(look_alpha(13, 5, 50, final=True), 0.05 / 20)   # after looks at 5, 8, 12: look 4
    assert np.isclose(sum(look_alpha(r, 5, 10_000) for r in look_rounds(5, 10_000)), 0.05, atol=0.003)
    # log(runner-up / best) per round 0.1, 0.2, 0.0, 0.1, 0.1: mean 0.1, sd 0.0707, t(0.975, 4) = 2.776 ->
    # best / runner-up within [0.8288, 0.9879], told apart at 95%; at look 1's 97.5% (t 3.495): [0.8102, 1.0106], not
    best = np.array([10.0, 12.0, 9.0, 11.0, 10.0])
    costs = np.stack([best, best * np.exp([0.1, 0.2, 0.0, 0.1, 0.1])], axis=1)
    at95 = separation(costs, 0.05)
    assert at95["separated"] and np.isclose(at95["ci_lo"], 0.82878, atol=1e-4) and np.isclose(at95["ci_hi"], 0.98787, atol=1e-4)
    first_look = separation(costs, look_alpha(5, 5, 50))
    assert not first_look["separated"] and np.isclose(first_look["ci_hi"], 1.01059, atol=1e-4)
    assert not StopRule(NO_DEADLINE, 5, 50)(costs, 1.0)


def test_racing_drops_a_clearly_slower_candidate_and_never_the_best():
    rng = np.random.default_rng(2)
    R = 8
    base = rng.uniform(9, 11, R)[:, None]  # a slow period hits every plan of a round alike
    costs = base * np.array([1.0, 1.0, 1.5]) * rng.uniform(0.98, 1.02, (R, 3))
    # before min rounds nothing is dropped; after it, only the 1.5x slower plan (its 8 rounds all above the best)
    assert still_measured(costs[:4], min_rounds=5).tolist() == [True, True, True]
    assert still_measured(costs, min_rounds=5).tolist() == [True, True, False]
    # by hand: ratio 1.5 in every round but one at 0.2 -> the paired interval at 97.5% (two others) reaches below 1
    close = np.ones((6, 3))
    close[:, 2] = [1.5, 1.5, 1.5, 1.5, 1.5, 0.2]
    assert still_measured(close, min_rounds=5).tolist() == [True, True, True]
    # four rounds all a little above the best are not enough (a bootstrap interval would exclude 1 here): by hand,
    # d = log ratios, mean 0.0412, sd 0.0316, t(0.9875, 3 dof) = 4.18 -> lower bound 0.0412 - 4.18 * 0.0158 < 0
    few = np.ones((4, 3))
    few[:, 2] = [1.01, 1.08, 1.02, 1.06]
    assert still_measured(few, min_rounds=4).tolist() == [True, True, True]
    few[:, 2] = [1.51, 1.58, 1.52, 1.56]  # the same spread 50% higher: lower bound 0.433 - 0.045 > 0
    assert still_measured(few, min_rounds=4).tolist() == [True, True, False]
    # a dropped candidate stays dropped (NaN from then on) and is never the best, even if its early rounds were cheap
    later = np.vstack([costs, base[:2] * np.array([1.0, 1.0, np.nan])])
    assert still_measured(later, min_rounds=5).tolist() == [True, True, False]
    slow_machine = later.copy()
    slow_machine[R:, :2] *= 3.0  # the machine got slower after the third candidate was dropped
    sep = separation(slow_machine)
    assert sep["best"] == 0 and sep["runner_up"] == 1 and np.isnan(slow_machine[-1, 2])
    # StopRule.active: racing only when asked, the drift reference column is never a candidate
    with_ref = np.hstack([costs, np.full((R, 1), 0.5)])
    assert StopRule(NO_DEADLINE, 5, 50, num_candidates=3).active(with_ref).tolist() == [True] * 3
    assert StopRule(NO_DEADLINE, 5, 50, num_candidates=3, race=True).active(with_ref).tolist() == [True, True, False]
    # racing asks only at the stop rule's looks (5, 8, ...), so its drops spend the same 5%: not after round 6
    assert StopRule(NO_DEADLINE, 5, 50, num_candidates=3, race=True).active(with_ref[:6]).tolist() == [True] * 3


def test_summary_of_a_race_pairs_each_candidate_on_the_rounds_it_ran():
    rng = np.random.default_rng(3)
    R = 10
    base = rng.uniform(9, 11, R)[:, None]
    costs = base * np.array([1.0, 0.98, 1.6]) * rng.uniform(0.99, 1.01, (R, 3))
    costs[6:, 2] = np.nan  # dropped after round 6
    lines = []
    res = summarize(_cands(costs), 1.0, MeasureConfig(), log=lines.append)
    rows = {r["names"][0]: r for r in res["candidates"]}
    assert res["best"] == ["p1"] and res["rounds"] == R
    assert rows["p2"]["rounds"] == 6 and rows["p2"]["round_ms"][6:] == [None] * 4
    assert np.isclose(rows["p2"]["measured_ms"], np.exp(np.log(costs[:6, 2]).mean()))
    ratio = np.exp(np.mean(np.log(costs[:6, 2] / costs[:6, 1])))
    assert np.isclose(rows["p2"]["ratio_to_best"], ratio) and rows["p2"]["ci_lo"] > 1.0
    assert any("dropped after 6 rounds" in line for line in lines)
    # only one candidate left measured: the best, told apart from the one dropped last
    costs[4:, 0] = np.nan
    res = summarize(_cands(costs), 1.0, MeasureConfig(), log=lambda *_: None)
    assert res["best"] == ["p1"] and res["separated"] and res["ci_hi"] < 1.0



def test_where_the_step_goes_by_hand():
    # device 0: 2 ms compute + 3 fw (it waits) + 5 bw = 10; device 1: 6 + 1 + 3 = 10; device 2: 1 + 2 + 4 = 7
    step = step_breakdown([[2.0, 3.0, 5.0], [6.0, 1.0, 3.0], [1.0, 2.0, 4.0]])
    assert np.isclose(step["step_ms"], 10.0) and np.isclose(step["compute_max_ms"], 6.0)
    assert np.isclose(step["compute_mean_ms"], 3.0)
    assert np.isclose(step["comm_share"], 0.4) and np.isclose(step["balance_headroom"], 0.3)
    # a perfectly balanced plan has nothing to gain from balance
    assert step_breakdown([[4.0, 1.0, 5.0], [4.0, 2.0, 4.0]])["balance_headroom"] == 0.0
    # no parts (a plan never measured), wrong layout or NaN: no breakdown rather than a wrong one
    assert step_breakdown(None) is None and step_breakdown([[1.0, 2.0]]) is None
    assert step_breakdown([[1.0, np.nan, 2.0], [1.0, 1.0, 1.0]]) is None


def test_the_summary_says_where_the_best_plans_step_goes():
    rng = np.random.default_rng(4)
    R = 6
    costs = rng.uniform(9, 11, R)[:, None] * np.array([1.0, 1.5])
    cands = _cands(costs)
    for c, parts in zip(cands, ([[2.0, 3.0, 5.0], [6.0, 1.0, 3.0]], [[9.0, 3.0, 3.0], [1.0, 11.0, 3.0]])):
        c.round_parts_ms = [np.asarray(parts)] * R
    lines = []
    res = summarize(cands, 1.0, MeasureConfig(), log=lines.append)
    assert res["best"] == ["p0"]
    # the best plan's parts, not the other's: devices compute 2 and 6 ms in a 10 ms step
    assert np.isclose(res["step"]["comm_share"], 0.4) and np.isclose(res["step"]["balance_headroom"], 0.2)
    line = next(x for x in lines if x.startswith("where p0's step goes"))
    assert "40% of it is all-to-all" in line and "at most 20.0%" in line
    # candidates without measured parts: no line and no breakdown
    lines = []
    assert summarize(_cands(costs), 1.0, MeasureConfig(), log=lines.append)["step"] is None
    assert not any(x.startswith("where") for x in lines)

HEAVY = """name,rows,dim,pooling_factor
a,20000,128,100
b,20000,128,100
c,20000,128,100
d,20000,128,100
"""


def test_real_ranks_stop_measuring_a_dropped_plan(tmp_path):
    """Two ranks, real measurements: after rank 0's stop rule drops a plan (here scripted, after round 4), no rank
    measures it again, the others are measured every round, and the rounds' costs say so (NaN when dropped)."""
    from neuroshard.planning.user_data import user_tables_dataset
    from neuroshard.hardware.engine import EngineSettings, Job, run
    from race_stop import ScriptedRace

    (tmp_path / "t.csv").write_text(HEAVY)
    tl = load_table_list(tmp_path / "t.csv")
    ds = user_tables_dataset(tl, 256, 0, tmp_path)
    plans = [[[(0, 128), (1, 128)], [(2, 128), (3, 128)]],   # balanced
             [[(0, 128), (1, 128), (2, 128), (3, 128)], []],  # all on rank 0
             [[(0, 128), (3, 128)], [(1, 128), (2, 128)]]]   # balanced, other pairs
    got = []
    stop = ScriptedRace(NO_DEADLINE, 4, 7, num_candidates=3, race=True, drop=1, drop_after=4)
    run(Job(EngineSettings(str(ds.path), resolve_hardware("cpu", "auto"), 256, 1, 2), [plans], stop), 2,
        lambda g, r, costs: got.append(costs))
    measured = np.array([[np.isfinite(c).all() for c in costs] for costs in got])  # [round, plan]
    assert len(got) == 7
    assert measured[:, 0].all() and measured[:, 2].all()
    assert measured[:4, 1].all() and not measured[4:, 1].any()
    assert all((c[1, 0, 0] > 0 and c[1, 1, 0] == 0) for c in got[:4])  # all on rank 0: rank 1 computes nothing


def test_a_comparison_without_torchrecs_plan_says_so(tmp_path, monkeypatch, caplog):
    """Where TorchRec's planner finds no plan, the candidates go on without it and a warning says so (min_gain
    then has no plan to keep); with its plan there is no warning."""
    import logging

    from neuroshard.sharding import registry

    pytest.importorskip("torchrec")
    (tmp_path / "t.csv").write_text(TABLES)
    tl = load_table_list(tmp_path / "t.csv")
    cluster, sim = Cluster(2, 0.02), analytic_simulator(2)
    with caplog.at_level(logging.WARNING, logger="neuroshard.sharding.candidates"):
        names = {n for c in candidate_plans(tl.task, cluster, sim, SearchParams(max_splits=3), 256, 1) for n in c.names}
    assert "torchrec" in names and not caplog.records
    real = registry.make_sharder
    monkeypatch.setattr(registry, "make_sharder", lambda alg, *a: (lambda task, cl: None) if alg == "torchrec"
                        else real(alg, *a))
    with caplog.at_level(logging.WARNING, logger="neuroshard.sharding.candidates"):
        cands = candidate_plans(tl.task, cluster, sim, SearchParams(max_splits=3), 256, 1)
    assert not any("torchrec" in c.names for c in cands) and cands
    assert [r.getMessage() for r in caplog.records] == [
        "TorchRec's planner found no plan of these tables within 2 x 0.02 GB: the plans are compared without it"]


def test_measuring_the_step_cost_without_torchrec_is_one_line(tmp_path, monkeypatch):
    """The emulated engine times the step cost's input distribution with TorchRec's KJTAllToAll: without TorchRec,
    one line before anything is measured, naming --cost paper."""
    from neuroshard.hardware import engine as comm_bench  # where the emulated step cost asks

    (tmp_path / "t.csv").write_text(TABLES)
    tl = load_table_list(tmp_path / "t.csv")
    cluster = Cluster(2, 0.02)
    cands = candidate_plans(tl.task, cluster, analytic_simulator(2), SearchParams(max_splits=3), 256, 1)
    monkeypatch.setattr(comm_bench, "torchrec_available", lambda: False)
    with pytest.raises(UserError, match="torchrec is not installed; install it .* or pass --cost paper"):
        measure_candidates(tl, cluster, cands, resolve_hardware("cpu", "auto"), 256, MeasureConfig(cost="step"))
    with pytest.raises(UserError, match="--cost must be one of paper, step"):
        MeasureConfig(cost="steps").check()


def test_a_negative_simulated_part_is_not_written():
    """A model extrapolating a part below 0 (the device's total above 0 still ranks the plan): the record leaves
    that candidate's parts out rather than write a negative cost."""
    from neuroshard.planning.measure import reported_parts

    assert reported_parts([[1.0, 0.0, 0.3], [2.0, 0.5, 0.1]]) == [[1.0, 0.0, 0.3], [2.0, 0.5, 0.1]]
    assert reported_parts([[1.0, -0.04, 0.3], [2.0, 0.5, 0.1]]) is None
    assert reported_parts(None) is None
