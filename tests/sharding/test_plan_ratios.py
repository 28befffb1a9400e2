"""Plan cost ratios (sharding/plan_ratios.py): the split-conformal ends, the fit over measured rows, and the JSON file
read back with every field checked."""
import json

import numpy as np
import pytest

from neuroshard.core.errors import UserError
from neuroshard.sharding.plan_ratios import PlanRatio, PlanRatios, conformal_ends, fit_ratios, nominal_level


def test_conformal_ends_are_the_kth_smallest_and_largest():
    r = np.arange(1, 41) / 10.0  # 0.1 .. 4.0, shuffled below
    rng = np.random.default_rng(0)
    assert conformal_ends(rng.permutation(r[:20])) == (0.1, 2.0)  # n = 20: k = 1
    assert conformal_ends(rng.permutation(r)) == (0.2, 3.9)  # n = 40: k = floor(41 x 0.05) = 2
    assert conformal_ends(r[:19]) == (0.1, 1.9)
    assert conformal_ends(r[:10], level=0.8) == (0.1, 1.0)  # floor(11 x 0.1) = 1
    # 13-18 plans: still the smallest and largest, at their own nominal level; 12 or fewer: none
    assert conformal_ends(r[:18]) == (0.1, 1.8) and nominal_level(18) == pytest.approx(17 / 19)
    assert conformal_ends(r[:13]) == (0.1, 1.3) and nominal_level(13) == pytest.approx(12 / 14)
    assert conformal_ends(r[:12]) is None and conformal_ends(r[:1]) is None
    assert nominal_level(20) == pytest.approx(19 / 21) and nominal_level(40) == pytest.approx(37 / 41)


def test_conformal_interval_holds_its_level_on_new_plans():
    """Exchangeable ratios: fitted on 20, a new plan falls inside 19/21 of the time (90.5%), averaged over fits."""
    rng = np.random.default_rng(1)
    inside = []
    for _ in range(2000):
        r = rng.lognormal(0.1, 0.15, size=21)
        lo, hi = conformal_ends(r[:20])
        inside.append(lo <= r[20] <= hi)
    assert 0.89 < np.mean(inside) < 0.92


def test_fit_ratios_groups_by_algorithm_and_skips_plans_without_both_costs():
    rows = [{"alg": "a", "sim_cost_ms": 10.0, "cost_ms": 10.0 * k} for k in np.linspace(1.0, 1.4, 20)]
    rows += [{"alg": "a", "sim_cost_ms": float("nan"), "cost_ms": 3.0},  # out of memory: no simulated cost
             {"alg": "a", "sim_cost_ms": 5.0, "cost_ms": float("nan")},  # not measured
             {"alg": "b", "sim_cost_ms": 4.0, "cost_ms": 5.0}, {"alg": "b", "sim_cost_ms": 2.0, "cost_ms": 3.0}]
    got = fit_ratios(rows)
    assert got["a"].plans == 20 and got["a"].median == pytest.approx(1.2)
    assert (got["a"].lo, got["a"].hi) == pytest.approx((1.0, 1.4))
    assert got["b"] == PlanRatio(2, pytest.approx(1.375), None, None)
    assert got["a"].stated_ms(10.0) == pytest.approx(12.0) and got["a"].interval_ms(10.0) == pytest.approx((10, 14))
    assert got["b"].interval_ms(10.0) is None


@pytest.fixture()
def models(tmp_path):
    paths = [tmp_path / f"m{k}.pt" for k in range(3)]
    for k, p in enumerate(paths):
        p.write_bytes(bytes([k]) * 100)
    return paths


def _saved(tmp_path, models) -> tuple:
    rows = [{"alg": "neuroshard", "sim_cost_ms": 10.0, "cost_ms": 10.0 + k} for k in range(20)]
    path = tmp_path / "plan_ratios_4.json"
    PlanRatios.fit(rows, 4, models).save(path)
    return path, json.loads(path.read_text())


def test_saved_ratios_read_back(tmp_path, models):
    path, _ = _saved(tmp_path, models)
    got = PlanRatios.load(path, 4, models, "FIX")
    assert got.num_devices == 4 and got.level == 0.9
    assert got.ratios["neuroshard"] == PlanRatio(20, pytest.approx(1.95), pytest.approx(1.0), pytest.approx(2.9))


@pytest.mark.parametrize("change, message", [
    (lambda o: o.update(kind="x"), "not a plan ratios file"),
    (lambda o: o.update(num_devices=8), "made for 8 devices, not 4"),
    (lambda o: o.update(num_devices=True), "made for True devices"),
    (lambda o: o.update(level=1.5), "level must be 0.9 (the results state 90% intervals), got 1.5"),
    (lambda o: o.update(level=0.8), "level must be 0.9"),
    (lambda o: o.update(model_digests="abc"), "model_digests must be a list"),
    (lambda o: o["model_digests"].reverse(), "measured against other cost models"),
    (lambda o: o.update(ratios={}), "at least one algorithm"),
    (lambda o: o["ratios"].update(neuroshard=[1]), "algorithm 'neuroshard': its ratio must be an object"),
    (lambda o: o["ratios"]["neuroshard"].update(plans="18"), "plans must be a whole number from 1, got '18'"),
    (lambda o: o["ratios"]["neuroshard"].update(median=10 ** 400), "median must be a number above 0"),
    (lambda o: o.update(level=10 ** 400), "level must be 0.9"),
    (lambda o: o["ratios"]["neuroshard"].update(plans=5), "5 plans give no interval, but lo and hi are set (at least 13 give one"),
    (lambda o: o["ratios"]["neuroshard"].update(lo=None, hi=None), "20 plans give an interval, but lo and hi are null"),
    (lambda o: o["ratios"]["neuroshard"].update(plans=0), "plans must be a whole number from 1"),
    (lambda o: o["ratios"]["neuroshard"].update(median=None), "median must be a number above 0"),
    (lambda o: o["ratios"]["neuroshard"].update(median=-1), "median must be a number above 0"),
    (lambda o: o["ratios"]["neuroshard"].update(hi="2"), "hi must be a number above 0"),
    (lambda o: o["ratios"]["neuroshard"].update(lo=1e9), "lo must be a number above 0 and at most 1000"),
    (lambda o: o["ratios"]["neuroshard"].update(lo=2.5), "lo <= median <= hi does not hold"),
    (lambda o: o["ratios"]["neuroshard"].update(lo=None), "only one end is null"),
    # well-formed, but not what was saved: the digest
    (lambda o: o["ratios"]["neuroshard"].update(median=1.5), "changed after it was saved, or written before ratio "
                                                             "files had a digest"),
    (lambda o: o.pop("digest"), "changed after it was saved"),
    (lambda o: o.update(digest=[1]), "changed after it was saved"),
])
def test_bad_ratio_files_are_refused_in_one_line(tmp_path, models, change, message):
    path, obj = _saved(tmp_path, models)
    change(obj)
    path.write_text(json.dumps(obj))
    with pytest.raises(UserError, match="FIX") as e:
        PlanRatios.load(path, 4, models, "FIX")
    assert message in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_ratios_of_retrained_models_are_refused(tmp_path, models):
    path, _ = _saved(tmp_path, models)
    models[1].write_bytes(b"retrained")
    with pytest.raises(UserError, match="measured against other cost models"):
        PlanRatios.load(path, 4, models, "FIX")


def test_not_json_and_nan_are_refused(tmp_path, models):
    path, obj = _saved(tmp_path, models)
    path.write_text(json.dumps(obj).replace('"median": 1.95', '"median": NaN'))
    with pytest.raises(UserError, match="median must be a number"):
        PlanRatios.load(path, 4, models, "FIX")
    path.write_text("{")
    with pytest.raises(UserError, match="not valid JSON.*FIX"):
        PlanRatios.load(path, 4, models, "FIX")
