"""Paired statistics worked out by hand."""
import math

import numpy as np
import pytest

from neuroshard.experiments.paired import paired, paired_table, strongest


def test_geometric_mean_ratio_wins_ties_losses_by_hand():
    ours = {0: 1.0, 1: 2.0, 2: 4.0, 3: 5.0, 4: 9.0}
    theirs = {0: 2.0, 1: 2.0, 2: 2.0, 3: 5.04, 5: 1.0}   # task 4 and 5: only one algorithm solved them
    p = paired(ours, theirs)
    ratios = [0.5, 1.0, 2.0, 5.0 / 5.04]
    assert p["n"] == 4
    assert p["ratio"] == pytest.approx(math.exp(np.mean(np.log(ratios))))
    assert (p["wins"], p["ties"], p["losses"]) == (1, 2, 1)    # 0.5 wins; 1.0 and 0.992 tie; 2.0 loses
    assert p["ci_lo"] <= p["ratio"] <= p["ci_hi"]


def test_bootstrap_interval_narrows_with_more_tasks_and_is_exact_for_constant_ratios():
    const = paired({i: 0.8 for i in range(10)}, {i: 1.0 for i in range(10)})
    assert const["ratio"] == pytest.approx(0.8) and const["ci_lo"] == pytest.approx(0.8)
    assert const["ci_hi"] == pytest.approx(0.8)
    rng = np.random.default_rng(0)
    few = {i: float(np.exp(rng.normal(-0.1, 0.2))) for i in range(8)}
    many = {i: float(np.exp(rng.normal(-0.1, 0.2))) for i in range(200)}
    w = lambda p: p["ci_hi"] / p["ci_lo"]  # noqa: E731
    assert w(paired(many, {i: 1.0 for i in many})) < w(paired(few, {i: 1.0 for i in few}))
    # one pair shows no spread, so it gets no interval (every pair the same, above, gets that value)
    one = paired({0: 0.8}, {0: 1.0})
    assert one["n"] == 1 and one["ratio"] == pytest.approx(0.8)
    assert math.isnan(one["ci_lo"]) and math.isnan(one["ci_hi"])


def test_paired_table_and_strongest():
    rows = [{"alg": a, "task": t, "oom": oom, "cost_ms": c} for a, t, oom, c in [
        ("neuroshard", 0, False, 1.0), ("neuroshard", 1, False, 1.0), ("neuroshard", 2, False, 1.0),
        ("a", 0, False, 2.0), ("a", 1, False, 2.0), ("a", 2, True, float("nan")),
        ("b", 0, False, 1.1), ("b", 1, False, 1.0), ("b", 2, False, 0.9)]]
    table = {t["vs"]: t for t in paired_table(rows, "cost_ms")}
    assert table["a"]["n"] == 2 and table["a"]["ratio"] == pytest.approx(0.5) and table["a"]["valid_theirs"] == 2
    assert table["b"]["n"] == 3 and table["b"]["valid_ours"] == 3
    assert strongest(list(table.values()), min_tasks=2)["vs"] == "b"
    assert strongest(list(table.values()), min_tasks=3)["vs"] == "b"
