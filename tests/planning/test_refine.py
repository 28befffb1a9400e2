"""Calibration where the search goes (planning/refine.py): each round measures the device shards of the search's
plan that were never measured, refits the compute model on them and searches again."""
import numpy as np
import pytest

from neuroshard.core.config import SearchParams
from neuroshard.core.costs import Cluster
from neuroshard.core.errors import UserError
from neuroshard.data.table_list import load_table_list
from neuroshard.hardware.backends import resolve_hardware
from neuroshard.models.cost_models import ComputeCostModel
from neuroshard.planning import refine as refine_mod
from neuroshard.planning.calibrate import CalibrationConfig, calibrate
from neuroshard.planning.calibration_sampling import comm_layouts, sample_user_shards
from neuroshard.planning.fine_tune import compute_arrays, fine_tune_compute
from neuroshard.planning.refine import device_shards, refine, shard_key
from neuroshard.sharding.registry import make_sharder, shard_task
from neuroshard.sharding.simulator import Simulator

from analytic_models import save_hand_models
from test_calibrate import TABLES, _mismatched_compute_model


def _setup(tmp_path, max_mem):
    (tmp_path / "t.csv").write_text(TABLES)
    tl = load_table_list(tmp_path / "t.csv")
    models = save_hand_models(tmp_path / "models", 2, {"batch_size": 256, "device": "cpu"})
    _mismatched_compute_model(models / "compute.pt")
    sim = Simulator.load(models / "compute.pt", models / "comm_2_fw.pt", models / "comm_2_bw.pt", num_devices=2)
    cluster = Cluster(2, max_mem)

    def search(s):
        return shard_task(make_sharder("neuroshard", 0, s, SearchParams(), 256), tl.task, cluster).plan
    return tl, sim, cluster, search


def test_refining_measures_only_the_search_plans_new_shards_on_this_machine(tmp_path):
    """A real calibration and real refine rounds (one worker, this machine's FBGEMM timings)."""
    tl, sim, cluster, search = _setup(tmp_path, 0.02)
    hw = resolve_hardware("cpu", "auto")
    cfg = CalibrationConfig(num_shards=15, comm_layouts=15, warmup_iter=1, num_iter=2, steps=50)
    cal, report = calibrate(sim, tl, cluster, hw, 256, cfg, log=lambda *_: None)
    first = search(cal)
    lines = []
    refined, plan, rep = refine(sim, cal, report, tl, cluster, hw, 256, cfg, search, 3, log=lines.append)
    calibrated = {shard_key(([t for t, _ in s], [d for _, d in s])) for s in report["measured"]["shards"]}
    new_first = [s for s in device_shards(first) if shard_key(s) not in calibrated]
    assert rep["rounds"], "the calibrated search's plan has device shards calibration never measured"
    r0 = rep["rounds"][0]
    assert [shard_key(s) for s in new_first] == [shard_key(([t for t, _ in s], [d for _, d in s]))
                                                 for s in r0["shards"]]
    assert len(r0["measured_ms"]) == len(r0["predicted_ms"]) == len(new_first) >= 1
    assert min(r0["measured_ms"]) > 0 and np.isfinite(r0["measured_ms"] + r0["predicted_ms"]).all()
    assert r0["predicted_over_measured"] == pytest.approx(np.median(np.divide(r0["predicted_ms"], r0["measured_ms"])))
    # the plan's all-to-all layout on the 2 ranks, unless calibration measured those dim sums: measured and priced
    dims = {tuple(lay["dims"]) for lay in report["measured"]["layouts"]}
    if tuple(int(v) for v in first.device_dim_sums()) in dims:
        assert r0["dim_sums"] is None and set(r0["kept"]) == {"compute"}
    else:
        assert r0["dim_sums"] == [int(v) for v in first.device_dim_sums()] and set(r0["kept"]) == {"compute", "fw", "bw"}
        assert len(r0["comm_measured_ms"]) == len(r0["comm_predicted_ms"]) == 2 and min(r0["comm_measured_ms"]) > 0
    assert rep["shards_measured"] == sum(len(r["measured_ms"]) for r in rep["rounds"]) <= 3 * 2
    assert rep["layouts_measured"] == sum(r["dim_sums"] is not None for r in rep["rounds"])
    learned = {shard_key(([t for t, _ in s], [d for _, d in s])) for r in rep["rounds"] for s in r["shards"]}
    assert not learned & calibrated  # nothing measured twice
    new_dims = [tuple(r["dim_sums"]) for r in rep["rounds"] if r["dim_sums"] is not None]
    assert len(set(new_dims)) == len(new_dims) and not set(new_dims) & dims
    # the loop ends where everything of the plan it returns was measured, or at the round limit
    assert rep["fixed_point"] == (all(shard_key(s) in calibrated | learned for s in device_shards(plan))
                                  and tuple(int(v) for v in plan.device_dim_sums()) in dims | set(new_dims))
    assert rep["fixed_point"] or len(rep["rounds"]) == 3
    assert plan is not None and sum(l.count("refine round") for l in lines) == len(rep["rounds"])
    # a refit kept means another model; everything else of the calibrated simulator stays
    for name in ("compute", "fw", "bw"):
        assert (getattr(refined, name) is not getattr(cal, name)) == any(r["kept"].get(name) for r in rep["rounds"])
    assert (refined.cost, refined.step_fit, refined.inp) == (cal.cost, cal.step_fit, cal.inp)

    # no rounds: the calibrated search's plan, nothing measured
    same, plan0, rep0 = refine(sim, cal, report, tl, cluster, hw, 256, cfg, search, 0, log=lambda *_: None)
    assert same is cal and rep0["rounds"] == [] and plan0.device_of == first.device_of
    for bad in (-1, 21, 1.5, True):
        with pytest.raises(UserError, match="--refine"):
            refine(sim, cal, report, tl, cluster, hw, 256, cfg, search, bad)


def test_a_shard_the_models_underrate_is_learned_and_the_search_moves_off_it(tmp_path, monkeypatch):
    """Planted timings: a shard costs 0.2 + 0.01 ms per lookup x column, and tables d (position 3, 20 lookups a
    sample) and c (position 2) share a device badly: a shard holding both costs 40 ms more. The pre-trained model
    learned the machine at 2/3 of its speed and without that penalty, and calibration's shards hold none
    either, so the calibrated search puts them together; the rounds measure such shards, learn them, and the
    search ends with d and c apart."""
    tl, sim, cluster, search = _setup(tmp_path, 0.05)
    task = tl.task

    def crowded_d(tabs):
        return {2, 3} <= set(int(t) for t in tabs)

    def truth(shards, scale=1.0, pair_ms=40.0):
        return np.array([scale * (0.2 + 0.01 * float((task.pooling_factors[tabs] * dims).sum()))
                         + (pair_ms if crowded_d(tabs) else 0.0) for tabs, dims in shards])

    some = sample_user_shards(task, cluster, 400, seed=1)
    pre = ComputeCostModel({"device": "cpu", "batch_size": 256})
    pre.fit(compute_arrays(task.data_features, some), truth(some, 2 / 3, 0.0).astype(np.float32), epochs=80,
            progress=False)
    sim = sim.with_models(compute=pre)
    shards = [s for s in sample_user_shards(task, cluster, 60, seed=0) if not crowded_d(s[0])][:20]
    # the all-to-alls are what the hand-set comm models say: nothing to learn there
    layouts = comm_layouts(task, 2, 15, 0)

    def comm_truth(lays, *_):
        x = np.array([np.concatenate([d, w]) for d, w in lays])
        return sim.fw.predict_np(x), sim.bw.predict_np(x[:, :2])
    fw_ms, bw_ms = comm_truth(layouts)
    report = {"measured": {"shards": [[[int(t), int(d)] for t, d in zip(*s)] for s in shards],
                           "compute_ms": [float(v) for v in truth(shards)],
                           "layouts": [{"dims": d.tolist(), "delays_ms": w.tolist()} for d, w in layouts],
                           "fw_ms": fw_ms.tolist(), "bw_ms": bw_ms.tolist()}}
    monkeypatch.setattr(refine_mod, "measure_shards", lambda ds, hw, b, new, w, i: truth(new))
    monkeypatch.setattr(refine_mod, "measure_layouts", comm_truth)
    monkeypatch.setattr(refine_mod, "user_tables_dataset", lambda *a, **k: None)
    cfg = CalibrationConfig(steps=500)
    compute, rep_cal = fine_tune_compute(sim.compute, task, shards, report["measured"]["compute_ms"], cfg)
    assert rep_cal["kept"]
    cal = sim.with_models(compute=compute)

    def worst(plan):
        return truth(device_shards(plan)).max()
    before = search(cal)
    assert any(crowded_d(t) for t, _ in device_shards(before)), "the planted case needs d and c together at first"
    refined, plan, rep = refine(sim, cal, report, tl, cluster, None, 256, cfg, search, 10, log=lambda *_: None)
    r0 = rep["rounds"][0]  # the search's optimism, measured before learning: d and c's shard rated far too cheap
    assert min(np.divide(r0["predicted_ms"], r0["measured_ms"])) < 0.3
    assert rep["rounds"][0]["kept"]["compute"]
    assert not any(crowded_d(t) for t, _ in device_shards(plan))  # d and c apart
    assert worst(plan) < worst(before) - 30
