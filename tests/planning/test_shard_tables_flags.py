"""tools/shard_tables.py with a working value of each flag no other test passes (issue 61), run in-process: the
value reaches what it sets and the run writes its plan. Measuring is planted where its numbers are beside the
point (calibration's shards, layouts and TorchRec steps), real where the flag is about measuring."""
import json

import numpy as np
import pytest

import neuroshard.planning.calibrate as cal_mod
import neuroshard.planning.shard_tables as pt
import neuroshard.planning.user_data as user_data
from neuroshard.planning.measure import drift_reference_of
from neuroshard.data.raw import save_raw
from neuroshard.data.synthetic import synthesize_tables

from analytic_models import hand_comm_model
from test_shard_tables_hostile import TABLES, fake_measuring, run, setup  # noqa: F401 (fixtures)

pytestmark = pytest.mark.filterwarnings("ignore::scipy.stats.ConstantInputWarning")  # hand models' flat predictions

ROWS, POOLING, DIMS = [18000, 25000, 900, 2500, 400, 7000], [6, 1, 1, 18, 1, 3], [64, 64, 16, 32, 8, 32]


@pytest.fixture
def ids_args(setup):
    """`setup`'s arguments with the tables given as real ids (--ids, --dims) instead of a table list."""
    tmp, args = setup
    raw = synthesize_tables(ROWS, POOLING, [[0.0]] * len(ROWS), 256, seed=1, progress=False)
    save_raw(tmp / "ids.pt", *raw)
    i = args.index("--tables")
    return tmp, args[:i] + ["--ids", str(tmp / "ids.pt"), "--dims", ",".join(map(str, DIMS))] + args[i + 2:]


def test_ids_and_dims_plan_the_tables_the_ids_describe(ids_args, capsys):
    tmp, args = ids_args
    inp = tmp / "elsewhere" / "input.pt"
    inp.parent.mkdir()
    hand_comm_model(2, "input", meta={"batch_size": 256, "device": "cpu"}).save(inp)
    code, out, err = run(capsys, *args, "--input_comm_model", inp, "--out", tmp / "plan.json")
    assert code == 0, err
    rec = json.loads((tmp / "plan.json").read_text())
    assert [t["name"] for t in rec["tables"]] == [f"table_{i}" for i in range(6)]
    assert [t["rows"] for t in rec["tables"]] == ROWS and [t["dim"] for t in rec["tables"]] == DIMS
    # the pooling factors are the ids' own: Poisson around the given ones, exactly 1 for one-hot features
    got = np.array([t["pooling_factor"] for t in rec["tables"]])
    assert np.allclose(got, POOLING, rtol=0.15) and (got[np.array(POOLING) == 1] == 1).all()
    assert str(inp) in rec["provenance"]["models"] and str(inp) in out  # the given input model priced the step
    # one dim for every table
    i = args.index("--dims")
    code, _, err = run(capsys, *args[:i + 1], "16", *args[i + 2:], "--out", tmp / "one.json")
    assert code == 0, err
    assert [t["dim"] for t in json.loads((tmp / "one.json").read_text())["tables"]] == [16] * 6


def test_ids_with_calibrate_measure_the_ids_given(ids_args, capsys, fake_measuring, monkeypatch):
    tmp, args = ids_args
    seen, real = [], user_data.user_tables_dataset

    def spy(tl, batch_size, seed, out_dir, ids_path=None):
        seen.append(ids_path)
        return real(tl, batch_size, seed, out_dir, ids_path)

    monkeypatch.setattr(cal_mod, "user_tables_dataset", spy)  # calibration builds the tables it measures
    code, out, err = run(capsys, *args, "--calibrate", 15, "--calibrate_comm", 15, "--out", tmp / "plan.json")
    assert code == 0, err
    assert seen == [str(tmp / "ids.pt")] and fake_measuring == [15]
    rec = json.loads((tmp / "plan.json").read_text())
    assert rec["calibration"]["measured"]["compute_ms"] and (tmp / "plan.calibration.pt").is_file()


def test_search_and_measure_flags_reach_the_search_and_the_rounds(ids_args, capsys, monkeypatch):
    """A real --measure of the ids' tables on 2 gloo ranks with every search flag, --measure_top, --no_race,
    --seed and --backend given."""
    tmp, args = ids_args
    got = {}
    real_cands, real_hw = pt.candidate_plans, pt.resolve_hardware

    def cands(task, cluster, sim, search, batch, top_k, seed, extra):
        got.update(search=search, top_k=top_k, seed=seed)
        return real_cands(task, cluster, sim, search, batch, top_k, seed, extra)

    def hw(device, backend, gpu_ids=None):
        got["backend"] = backend
        return real_hw(device, backend, gpu_ids)

    monkeypatch.setattr(pt, "candidate_plans", cands)
    monkeypatch.setattr(pt, "resolve_hardware", hw)
    code, out, err = run(capsys, *args, "--measure", "--measure_budget_s", 4, "--measure_top", 3, "--no_race",
                         "--warmup_iter", 1, "--num_iter", 2, "--seed", 5, "--backend", "torch",
                         "--num_candidates", 2, "--max_splits", 1, "--grid_steps", 2, "--threshold_range", "1.0,1.2",
                         "--beam_width", 2, "--out", tmp / "plan.json")
    assert code == 0, err
    s = got["search"]
    assert (s.num_candidates, s.max_splits, s.grid_steps, s.beam_width) == (2, 1, 2, 2)
    assert tuple(s.threshold_range) == (1.0, 1.2) and got["top_k"] == 3 and got["seed"] == 5
    assert got["backend"] == "torch"
    rec = json.loads((tmp / "plan.json").read_text())
    assert rec["provenance"]["search"]["threshold_range"] == [1.0, 1.2] and rec["provenance"]["seed"] == 5
    m = rec["measured"]
    names = [n for c in m["candidates"] for n in c["names"] if n.startswith("neuroshard#")]
    assert 1 <= len(names) <= 3 and len(rec["splits"]) <= 1
    # --no_race: every candidate measured in every round
    assert m["race"] is False and all(c["rounds"] == m["rounds"] for c in m["candidates"])
    # no negative simulated cost is written (a part a model extrapolates below 0 is left out)
    assert all(c["simulated_parts_ms"] is None or np.min(c["simulated_parts_ms"]) >= 0 for c in m["candidates"])
    assert all(c["simulated_ms"] > 0 for c in m["candidates"])


def test_calibrate_dmp_fit_is_saved_reused_replaced_and_is_the_drift_reference(setup, capsys, fake_measuring,
                                                                              monkeypatch):
    """--calibrate K --calibrate_dmp P end to end, with TorchRec's steps planted (0.1 ms per table column on the
    critical device, so the step cost can be fitted): the fit is saved in the calibration, reused by the same
    command, replaced on another P, and handed to --measure's TorchRec engine as its drift reference."""
    import neuroshard.planning.step_fit as sf

    tmp, args = setup
    steps = []

    def planted(tl, plans, ds, hw, batch, N, rounds, warmup, iters, log=print):
        steps.append(len(plans))
        return np.array([1.0 + 0.1 * max(p.device_dim_sums()) for p in plans])

    monkeypatch.setattr(cal_mod, "measure_plans_dmp", planted)
    monkeypatch.setattr(sf, "measure_plans_dmp", planted)
    if not cal_mod.torchrec_available():
        pytest.skip("TorchRec not installed")
    cmd = [*args, "--calibrate", 15, "--calibrate_comm", 15, "--out", tmp / "plan.json"]
    code, out, err = run(capsys, *cmd, "--calibrate_dmp", 12)
    assert code == 0, err
    saved = json.loads((tmp / "plan.json").read_text())["calibration"]
    assert steps == [12] and saved["config"]["dmp_plans"] == 12 and len(saved["measured"]["dmp"]["step_ms"]) == 12
    assert saved["step"]["samples"]["fit"] + saved["step"]["samples"]["held_out"] == 12
    code, out, err = run(capsys, *cmd, "--calibrate_dmp", 12)
    assert code == 0 and "reusing the calibrated cost models" in out and steps == [12], err
    code, out, err = run(capsys, *cmd, "--calibrate_dmp", 13)
    assert code == 0 and "note: replacing" in out and steps == [12, 13], err
    assert json.loads((tmp / "plan.json").read_text())["calibration"]["config"]["dmp_plans"] == 13

    class Stop(Exception):
        pass

    def measure(tl, cluster, cands, hw, batch, mcfg, ids, calibration=None):
        got.update(engine=mcfg.engine, dmp_reference=drift_reference_of(mcfg.step, calibration))
        raise Stop

    got = {}
    monkeypatch.setattr(pt, "measure_candidates", measure)
    with pytest.raises(Stop):
        run(capsys, *cmd, "--calibrate_dmp", 13, "--measure", "--measure_engine", "torchrec")
    assert got["engine"] == "torchrec" and len(got["dmp_reference"]["step_ms"]) == 13


def test_mp_keep_plans_and_measures_with_dct_mps_compressed_all_to_all(setup, capsys, monkeypatch):
    """--mp_keep 0.25 with comm models trained on DCT-MP's compressed all-to-all at that keep: the plan is priced by
    them, a real --measure on 2 gloo ranks runs the compressed exchange, and plan.json records the keep."""
    tmp, args = setup
    meta = {"batch_size": 256, "device": "cpu", "mp_keep": 0.25}
    paths = {d: tmp / "models" / f"comm_2_mp0.25_{d}.pt" for d in ("fw", "bw")}
    for d, path in paths.items():
        hand_comm_model(2, d, dim_scale=0.25, meta=meta).save(path)
    args = args[:args.index("--fw_comm_model")]  # setup's uncompressed comm models are not for this keep
    seen, real = [], pt.measure_candidates

    def spy(tl, cluster, cands, hw, batch, mcfg, ids=None, **kw):
        seen.append(mcfg.mp_keep)
        return real(tl, cluster, cands, hw, batch, mcfg, ids, **kw)

    monkeypatch.setattr(pt, "measure_candidates", spy)
    code, out, err = run(capsys, *args, "--fw_comm_model", paths["fw"], "--bw_comm_model", paths["bw"],
                         "--mp_keep", 0.25, "--measure", "--measure_budget_s", 4, "--warmup_iter", 1, "--num_iter", 2,
                         "--out", tmp / "plan.json")
    assert code == 0, err
    assert seen == [0.25]
    rec = json.loads((tmp / "plan.json").read_text())
    assert rec["provenance"]["mp_keep"] == 0.25 and rec["measured"]["rounds"] >= 1
    # the uncompressed models refused for this keep: a model trained for another all-to-all never prices it
    code, out, err = run(capsys, *args, "--fw_comm_model", tmp / "models/comm_2_fw.pt", "--bw_comm_model",
                         tmp / "models/comm_2_bw.pt", "--mp_keep", 0.25, "--out", tmp / "other.json")
    assert code == 2 and "mp_keep" in err and not (tmp / "other.json").exists()
