"""The step cost fitted to TorchRec's own training step (`--calibrate_dmp`, planning/step_fit.py): the fit, the
random plans it measures, the simulator that applies it, and a real calibration on 2 gloo ranks that measures
DistributedModelParallel steps, saves the fit and loads it back (a hand-edited fit refused)."""
import numpy as np
import pytest
import torch

from neuroshard.core.errors import UserError
from neuroshard.core.costs import Cluster, Cost, StepFit
from neuroshard.data.table_list import load_table_list
from neuroshard.hardware.backends import resolve_hardware
from neuroshard.hardware.dmp_step import dmp_reference_plans
from neuroshard.planning.calibrate import CalibrationConfig, calibrate
from neuroshard.planning.calibration_file import (_content_digest, calibration_inputs, find_calibration,
                                                  save_calibration)
from neuroshard.planning.step_fit import fit_step, sample_user_plans
from neuroshard.sharding.plan import fits_memory
from neuroshard.sharding.search import neuroshard_search
from neuroshard.sharding.simulator import Simulator

from analytic_models import save_hand_models
from test_calibrate import TABLES as CALIBRATION_TABLES

TABLES = CALIBRATION_TABLES + "g,4000,64,2\n"  # a seventh table: more distinct random plans


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("step_fit")
    (tmp / "t.csv").write_text(TABLES)
    models = save_hand_models(tmp / "models", 2, {"batch_size": 256, "device": "cpu"})
    paths = [models / "compute.pt", models / "comm_2_fw.pt", models / "comm_2_bw.pt"]
    return tmp, load_table_list(tmp / "t.csv"), Simulator.load(*paths, num_devices=2), paths


def test_the_fit_recovers_an_affine_step_and_refuses_steps_that_do_not_grow():
    sim = np.array([10.0, 20.0, 35.0, 50.0, 80.0])
    fit = fit_step(sim, 1.7 * sim + 12.5)
    assert fit.scale == pytest.approx(1.7) and fit.overhead_ms == pytest.approx(12.5)
    fit = fit_step(sim, 3.0 * sim)  # no overhead: its least-squares value stays at the bound 0
    assert fit.scale == pytest.approx(3.0) and fit.overhead_ms == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(UserError, match="do not grow with the simulated step cost"):
        fit_step(sim, 100.0 - sim)  # measured steps fall as the simulated cost rises


@pytest.mark.parametrize("bad", [(float("nan"), 1.0), (0.0, 1.0), (1.0, -0.5), (True, 1.0), ("2", 1.0),
                                 (1.0, float("inf")), (1e9, 1.0)])
def test_a_step_fit_out_of_range_is_refused(bad):
    with pytest.raises(UserError, match="a step fit's"):
        StepFit(*bad)


def test_random_plans_fit_memory_split_some_tables_and_follow_the_seed(tables):
    _, tl, _, _ = tables
    cluster = Cluster(2, 0.02)
    plans = sample_user_plans(tl.task, cluster, 30, seed=3)
    assert len(plans) == 30 and all(fits_memory(tl.task, p, cluster) for p in plans)
    assert any(p.splits for p in plans) and any(not p.splits for p in plans)
    assert len({tuple(p.device_of) for p in plans}) > 20  # skewed and even device weights: varied placements
    again = sample_user_plans(tl.task, cluster, 30, seed=3)
    assert [p.to_dict() for p in again] == [p.to_dict() for p in plans]
    with pytest.raises(UserError, match="raise --max_mem"):
        sample_user_plans(tl.task, Cluster(2, 0.001), 3, seed=0)


def test_the_simulator_applies_the_fit_to_the_step_cost_only_and_keeps_the_order(tables):
    _, tl, sim, _ = tables
    cluster = Cluster(2, 0.02)
    plans = sample_user_plans(tl.task, cluster, 12, seed=0)
    fit = StepFit(1.75, 40.0)
    step, fitted = sim.with_cost("step"), sim.with_cost("step").with_step_fit(fit)
    raw = np.array([step.plan_cost(tl.task, p).cost_ms for p in plans])
    got = [fitted.plan_cost(tl.task, p) for p in plans]
    assert np.allclose([c.cost_ms for c in got], raw * 1.75 + 40.0, atol=1e-6)
    assert all(isinstance(c, Cost) and np.array_equal(c.compute_ms, step.plan_cost(tl.task, p).compute_ms)
               for c, p in zip(got, plans))  # the parts stay the models' own
    assert np.array_equal(np.argsort(raw, kind="stable"), np.argsort([c.cost_ms for c in got], kind="stable"))
    assert fitted.with_cost("paper").plan_cost(tl.task, plans[0]).cost_ms == \
        sim.with_cost("paper").plan_cost(tl.task, plans[0]).cost_ms  # the paper's cost ignores the fit
    plan = neuroshard_search(fitted, tl.task, cluster)  # the search's batched step costs carry the fit: same plan
    assert plan.to_dict() == neuroshard_search(step, tl.task, cluster).to_dict()


def test_a_calibration_fits_the_step_to_dmp_steps_saves_it_and_refuses_an_edited_fit(tables, monkeypatch):
    """A real calibration with --calibrate_dmp 12 on 2 gloo ranks: 12 random plans measured as TorchRec training
    steps, fitted on 7, judged on 5; the fit goes into the calibration file and comes back with it. The steps
    handed to the fit are planted (2 x the calibrated step cost + 5 ms): whether 2 measured rounds of real steps
    grow with the hand models' cost depends on how busy this machine is, which is not what is tested here."""
    import neuroshard.planning.calibrate as cal_mod

    real, measured = cal_mod.fit_to_steps, []

    def planted(calibrated, task, plans, step_ms, split, seed, log=print):
        measured.append(np.asarray(step_ms))  # the real TorchRec steps
        step = calibrated.with_cost("step").with_step_fit(None)
        ms = np.array([2.0 * step.plan_cost(task, p).cost_ms + 5.0 for p in plans])  # what the fit should find
        return real(calibrated, task, plans, ms, split, seed, log)

    monkeypatch.setattr(cal_mod, "fit_to_steps", planted)
    tmp, tl, sim, paths = tables
    cluster, hw = Cluster(2, 0.02), resolve_hardware("cpu", "auto")
    cfg = CalibrationConfig(num_shards=15, comm_layouts=15, warmup_iter=1, num_iter=2, steps=50, dmp_plans=12,
                            dmp_rounds=2)
    lines = []
    cal, report = calibrate(sim, tl, cluster, hw, 256, cfg, log=lines.append)
    st = report["step"]
    assert st["samples"] == {"fit": 7, "held_out": 5}
    assert len(report["measured"]["dmp"]["plans"]) == len(report["measured"]["dmp"]["step_ms"]) == 12
    assert min(report["measured"]["dmp"]["step_ms"]) > 0
    assert len(measured) == 1 and len(measured[0]) == 12 and (measured[0] > 0).all()  # the real TorchRec steps
    assert st["kept"] == (st["after"]["mape"] < st["before"]["mape"])
    assert (cal.step_fit is not None) == st["kept"]
    assert any("TorchRec training steps" in l for l in lines) and any(l.lstrip().startswith("step") for l in lines)
    # --measure in TorchRec's engine measures one step-fit plan a round beside the candidates: the drift reference
    from neuroshard.planning.measure import MeasureConfig, candidate_plans, measure_candidates
    from neuroshard.sharding.search import SearchParams

    cands = candidate_plans(tl.task, cluster, cal, SearchParams(max_splits=3), 256, 1)
    mlines = []
    res = measure_candidates(tl, cluster, cands, hw, 256, MeasureConfig(budget_s=6.0, warmup_iter=1, num_iter=2,
                                                                        min_rounds=2, engine="torchrec"),
                             log=mlines.append, calibration=report)
    d = res["drift"]
    assert d["rounds"] == res["rounds"] >= 1 and d["groups"] == 12 and d["compute"] == d["comm"] == d["step"]
    if d["rounds"] >= 2:
        assert 0 < d["step"]["ci_lo"] <= d["step"]["ratio"] <= d["step"]["ci_hi"]
    else:  # one round (a busy machine within the 6 s budget): the drift's estimate, with no interval
        assert d["step"]["ratio"] > 0 and np.isnan([d["step"]["ci_lo"], d["step"]["ci_hi"]]).all()
    assert all(r["simulated_drift_ms"] == pytest.approx(r["simulated_ms"] * d["step"]["ratio"])
               for r in res["candidates"])
    assert any("TorchRec's step x" in l for l in mlines)
    good = report["measured"]["dmp"]
    assert len(dmp_reference_plans(good, tl.task, 2)) == 12
    for bad in ({"plans": [{"num_devices": 2, "devices": [[[0, 0, 3]], []]}], "step_ms": [1.0]},  # not its tables
                {**good, "num_devices": 4, "plans": [{**good["plans"][0], "num_devices": 4}]},  # other ranks
                {**good, "step_ms": ["fast"] * 12}, {**good, "step_ms": [0.0] * 12},  # steps that cannot be true
                {**good, "step_ms": good["step_ms"][:3]}, {"plans": "x"}, {}):
        with pytest.raises(UserError, match="TorchRec-step plans are damaged .*calibrate again"):
            dmp_reference_plans(bad, tl.task, 2)
    fit = cal.step_fit or StepFit(2.0, 10.0)  # the file round trip, whether or not this machine's fit was kept
    cal = cal.with_step_fit(fit)
    report = {**report, "step_fit": fit.to_dict()}
    fp = calibration_inputs(tl.task, hw.describe(), 256, 2, 0.02, paths)
    path = tmp / "plan.calibration.pt"
    save_calibration(path, cal, {**report, "made_for": fp})
    (back, _), differ = find_calibration(path, fp, tl.task, cluster)
    assert differ == [] and back.step_fit == fit
    obj = torch.load(path, weights_only=True)
    obj["report"]["step_fit"] = {"scale": 0.5, "overhead_ms": 0.0}  # an edited fit: the digest no longer matches
    torch.save(obj, path)
    with pytest.raises(UserError, match="changed after it was saved"):
        find_calibration(path, fp, tl.task, cluster)
    obj["report"]["step_fit"] = {"scale": -1.0, "overhead_ms": 0.0}  # a digest made again by hand: still checked
    obj["report"]["digest"] = _content_digest(obj["report"])
    torch.save(obj, path)
    with pytest.raises(UserError, match="damaged step fit"):
        find_calibration(path, fp, tl.task, cluster)
    obj["report"]["step_fit"] = {"scale": 1e-3, "overhead_ms": 0.0}
    obj["report"].pop("digest")  # no digest: refused, not taken as unchecked
    torch.save(obj, path)
    with pytest.raises(UserError, match="has none"):
        find_calibration(path, fp, tl.task, cluster)
    obj["report"]["step_fit"] = {"scale": torch.tensor(1.0), "overhead_ms": 0.0}  # not plain data: one line
    obj["report"]["digest"] = "0" * 64
    torch.save(obj, path)
    with pytest.raises(UserError, match="is damaged or was changed"):
        find_calibration(path, fp, tl.task, cluster)


@pytest.mark.parametrize("kw,fragment", [({"calibrate_dmp": 16}, "pass --calibrate too"),
                                         ({"calibrate": 15, "calibrate_dmp": 5}, "--calibrate_dmp must be >= 12"),
                                         ({"calibrate": 15, "calibrate_dmp": 0}, "--calibrate_dmp must be >= 12"),
                                         ({"calibrate": 15, "calibrate_dmp": 16, "cost": "paper"}, "drop --cost paper"),
                                         ({"calibrate": 15, "calibrate_dmp": 16, "mp_keep": 0.1}, "no DCT-MP all-to-all")])
def test_calibrate_dmp_refuses_what_it_cannot_fit(kw, fragment):
    from neuroshard.core.config import ShardTablesConfig

    with pytest.raises(UserError, match=fragment):
        ShardTablesConfig(tables="t.csv", **kw).check()
    with pytest.raises(UserError, match="--calibrate_dmp must be >= 12"):
        CalibrationConfig(num_shards=15, comm_layouts=15, dmp_plans=3).check()
