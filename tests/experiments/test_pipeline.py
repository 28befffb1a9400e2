"""The whole pipeline on a tiny preset: runs end to end, skips finished steps, resumes, --force redoes. One full run
per test session (conftest's tiny_pipeline); the reruns here redo only what they must."""
import shutil

import numpy as np
import pandas as pd
import pytest

from neuroshard.core.config import PipelineConfig
from neuroshard.experiments.pipeline import PRESETS, run_pipeline
from neuroshard.models.collective_models import CollectiveModels
from neuroshard.models.cost_models import ComputeCostModel
from neuroshard.sharding.plan_ratios import PlanRatios

from conftest import TINY


@pytest.fixture()
def tiny(monkeypatch):
    monkeypatch.setitem(PRESETS, "tiny", TINY)


def test_pipeline_runs_resumes_and_reports(tiny, tiny_pipeline, tmp_path, capsys, monkeypatch):
    """The first run is the session's tiny pipeline (conftest); the reruns work on a copy of its folder."""
    from neuroshard.experiments import pipeline

    first, done = tiny_pipeline.stdout, tiny_pipeline.work
    assert "skipped" not in first and "measured 15 samples" in first  # the mix: 1.5 x the preset's 10
    summary = pd.read_csv(done / "results/summary.csv")
    assert set(summary.algorithm) == {"random", "dim_greedy", "size_greedy", "lookup_greedy", "size_lookup_greedy",
                                      "neuroshard", "neuroshard_risk", "torchrec"}
    assert (summary.measured_ms > 0).all()
    text = tiny_pipeline.report.read_text()
    assert "Simulator fidelity" in text and "neuroshard" in text and (done / "results/summary.png").stat().st_size
    assert "**neuroshard: measured cost" in text and "**neuroshard_risk: measured cost" in text
    assert sorted(p.name for p in (done / "models/ensemble").iterdir()) == ["b1", "b2", "b3", "b4", "b5"]
    # the searches' plans for the training tasks, measured among the test plans: each test plan of theirs is stated at
    # the models' cost x their median measured / modelled ratio (2 training plans give no 90% interval); the others
    # keep the spread
    models = [done / "models" / f for f in ("compute.pt", "comm_2_fw.pt", "comm_2_bw.pt")]
    ratios = PlanRatios.load(done / "models/plan_ratios_2.json", 2, models, "").ratios
    train = pd.read_csv(done / "results/eval_2_ratio_tasks.csv")
    assert set(ratios) == set(train.alg) == {"neuroshard", "neuroshard_risk"}
    for alg, r in ratios.items():
        got = train[train.alg == alg]
        assert r.plans == len(got) == TINY.num_train_tasks and r.lo is None
        # the CSV holds 6 significant digits of each cost (results_writer: each off by up to 5e-6 of itself), the
        # ratio file the full ratio
        assert r.median == pytest.approx(float(np.median(got.cost_ms / got.sim_cost_ms)), rel=3e-5)
    test = pd.read_csv(done / "results/eval_2.csv")
    ours = test[test.alg.isin(list(ratios))]
    assert (ours.stated_by == "training plans' ratio").all() and len(ours) == 2 * TINY.num_test_tasks
    assert np.allclose(ours.pred_ms, ours.sim_cost_ms * ours.alg.map(lambda a: ratios[a].median), rtol=3e-5)
    assert (test[~test.alg.isin(list(ratios)) & test.sim_cost_ms.notna()].stated_by == "members' spread").all()
    assert "Median stated / measured cost" in text
    # with the family mix the compute model takes log inputs, and the logged command says so
    assert ComputeCostModel.load(done / "models/compute.pt").input_transform == "log"
    assert "--input_transform log" in first
    # a second run skips every finished step; the collectors find their files complete
    shutil.copytree(done, tmp_path, dirs_exist_ok=True)
    run_pipeline(PipelineConfig("tiny", str(tmp_path)))
    second = capsys.readouterr().out
    assert second.count("skipped") == 10  # every step with outputs; the four collectors always run
    assert (done / "models/comm_2_input.pt").is_file()  # the step cost's input-distribution model
    coll = CollectiveModels.load(done / "models/comm_2_collectives.json")  # and the collectives' costs
    assert coll.num_devices == 2 and coll.batch_size == 256
    assert "measured 0 samples" in second
    # an interrupted run (the measured results missing) resumes at that step only
    (tmp_path / "results/eval_2.csv").unlink()
    run_pipeline(PipelineConfig("tiny", str(tmp_path)))
    third = capsys.readouterr().out
    assert "eval.py" in third and "eval_simulator.py" not in third and third.count("skipped") == 9
    # --force redoes every step, collections included: each step starts with its outputs and the data it would
    # continue removed, as the first run started (what a step then does from nothing is the first run's). Here each
    # step checks that, then puts back the first run's files for the report.
    ran, build_steps = [], pipeline.build_steps

    def checked_steps(cfg):
        steps = build_steps(cfg)
        for step in steps:
            def run(step=step):
                files = step.outputs + step.redo_removes
                assert files and not any(p.exists() for p in files), step.name
                ran.append(step.name)
                for p in files:
                    shutil.copy2(done / p.relative_to(tmp_path), p)
            step.run = run
        return steps

    monkeypatch.setattr(pipeline, "build_steps", checked_steps)
    run_pipeline(PipelineConfig("tiny", str(tmp_path), force=True))
    forced = capsys.readouterr().out
    assert "skipped" not in forced and ran == [s.name for s in build_steps(PipelineConfig("tiny", str(tmp_path)))]
    assert "Simulator fidelity" in forced  # the report, from the files the steps put back


def test_plan_ratios_with_no_plan_to_fit_and_for_other_algorithms(tiny, tiny_pipeline, tmp_path, capsys):
    """--plan_ratios_out where every task is out of memory: one line, and neither the ratios nor the CSV written;
    --plan_ratios for an algorithm it has no ratio for: a note, and that algorithm keeps the members' spread."""
    from neuroshard.core.config import CostModelFiles, EvalConfig
    from neuroshard.core.errors import UserError
    from neuroshard.experiments.evaluate import eval_hardware

    w = tiny_pipeline.work
    models = CostModelFiles(str(w / "models/compute.pt"), str(w / "models/comm_2_fw.pt"), str(w / "models/comm_2_bw.pt"))
    kw = dict(data_dir=str(w / "data/dlrm_datasets"), task_path=str(w / "data/tasks/train.pkl"), ndevices=2,
              models=models, warmup_iter=0, num_iter=1, rounds=1)
    with pytest.raises(UserError, match=r"^--plan_ratios_out: none of the plans has both a models' cost and a measured "
                                        r"cost .*--max_mem 1e-06"):
        eval_hardware(EvalConfig(**kw, alg=("neuroshard",), max_mem=1e-6, results_csv=str(tmp_path / "e.csv"),
                                 plan_ratios_out=str(tmp_path / "r.json")))
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "e.csv").exists()
    rows = eval_hardware(EvalConfig(**kw, alg=("dim_greedy",), max_mem=TINY.max_mem,
                                    results_csv=str(tmp_path / "d.csv"),
                                    plan_ratios=str(w / "models/plan_ratios_2.json")))
    assert "has no ratio for dim_greedy: their plans are stated at the models' cost" in capsys.readouterr().out
    assert {r["stated_by"] for r in rows if not r["oom"]} == {"members' spread"}


def test_ratio_tasks_resume_from_the_progress_log(tiny, tiny_pipeline, tmp_path, capsys, monkeypatch):
    """--ratio_tasks' plans are kept in the progress log beside the plans under test: a run stopped before its CSVs
    are written measures nothing again, and states the searches' plans from the ratio tasks' rows it kept."""
    from neuroshard.core.config import CostModelFiles, EvalConfig
    from neuroshard.experiments import evaluate

    w = tiny_pipeline.work
    models = CostModelFiles(str(w / "models/compute.pt"), str(w / "models/comm_2_fw.pt"), str(w / "models/comm_2_bw.pt"))
    cfg = EvalConfig(data_dir=str(w / "data/dlrm_datasets"), task_path=str(w / "data/tasks/test.pkl"), ndevices=2,
                     models=models, warmup_iter=0, num_iter=1, rounds=1, max_mem=TINY.max_mem,
                     alg=("neuroshard", "dim_greedy"), ratio_tasks=str(w / "data/tasks/train.pkl"),
                     results_csv=str(tmp_path / "e.csv"))
    write = evaluate.write_results

    def stopped(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate, "write_results", stopped)
    with pytest.raises(KeyboardInterrupt):
        evaluate.eval_hardware(cfg)
    first = capsys.readouterr().out
    n_test, n_ratio = 2 * TINY.num_test_tasks, TINY.num_train_tasks
    assert f"measuring {n_test} plans (+ {n_ratio} neuroshard plans of the {n_ratio} --ratio_tasks, spread" in first
    assert (tmp_path / "e.csv.progress.pkl").exists() and not (tmp_path / "e.csv").exists()
    monkeypatch.setattr(evaluate, "write_results", write)
    rows = evaluate.eval_hardware(cfg)
    again = capsys.readouterr().out
    assert "measuring 0 plans (+ 0 neuroshard plans" in again and f"{n_test + n_ratio} already measured" in again
    kept = pd.read_csv(tmp_path / "e_ratio_tasks.csv")
    assert list(kept.alg) == ["neuroshard"] * n_ratio and (kept.cost_ms > 0).all()
    median = float(np.median(kept.cost_ms / kept.sim_cost_ms))
    ours = [r for r in rows if r["alg"] == "neuroshard"]
    assert {r["stated_by"] for r in ours} == {"training plans' ratio"}
    assert np.allclose([r["pred_ms"] / r["sim_cost_ms"] for r in ours], median, rtol=3e-5)
    assert not (tmp_path / "e.csv.progress.pkl").exists()


def test_ratio_tasks_are_spread_over_the_measurement():
    from neuroshard.experiments.evaluate import _interleaved

    groups = {"": {t: {("", "a", t): t} for t in range(6)}, "ratio": {t: {("ratio", "a", t): t} for t in range(3)}}
    order = [k[::2] for k in _interleaved(groups)]
    assert order == [("", 0), ("ratio", 0), ("", 1), ("", 2), ("ratio", 1), ("", 3), ("", 4), ("ratio", 2), ("", 5)]
