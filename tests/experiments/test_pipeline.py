"""The whole pipeline on a tiny preset: runs end to end, skips finished steps, resumes, --force redoes."""
import shutil

import pandas as pd
import pytest

from neuroshard.core.config import PipelineConfig
from neuroshard.experiments.pipeline import PRESETS, run_pipeline
from neuroshard.models.cost_models import ComputeCostModel

from conftest import TINY


@pytest.fixture()
def tiny(monkeypatch):
    monkeypatch.setitem(PRESETS, "tiny", TINY)


def test_pipeline_runs_resumes_and_reports(tiny, tiny_pipeline, tmp_path, capsys):
    """The first run is the session's tiny pipeline (conftest); the reruns work on a copy of its folder."""
    first, done = tiny_pipeline.stdout, tiny_pipeline.work
    assert "skipped" not in first
    summary = pd.read_csv(done / "results/summary.csv")
    assert set(summary.algorithm) == {"random", "dim_greedy", "size_greedy", "lookup_greedy", "size_lookup_greedy",
                                      "neuroshard", "torchrec"}
    assert (summary.measured_ms > 0).all()
    text = tiny_pipeline.report.read_text()
    assert "Simulator fidelity" in text and "neuroshard" in text and (done / "results/summary.png").stat().st_size
    # with the family mix the compute model takes log inputs, and the logged command says so
    assert ComputeCostModel.load(done / "models/compute.pt").input_transform == "log"
    assert "--input_transform log" in first
    # a second run skips every finished step; the collectors find their files complete
    shutil.copytree(done, tmp_path, dirs_exist_ok=True)
    run_pipeline(PipelineConfig("tiny", str(tmp_path)))
    second = capsys.readouterr().out
    assert second.count("skipped") == 8  # every step with outputs; the three collectors always run
    assert (done / "models/comm_2_input.pt").is_file()  # the step cost's input-distribution model
    assert "measured 0 samples" in second
    # an interrupted run (the measured results missing) resumes at that step only
    (tmp_path / "results/eval_2.csv").unlink()
    run_pipeline(PipelineConfig("tiny", str(tmp_path)))
    third = capsys.readouterr().out
    assert "eval.py" in third and "eval_simulator.py" not in third and third.count("skipped") == 7
    # --force redoes everything, collections included
    mtime = (tmp_path / "data/cost_data/compute_cost_data.pkl").stat().st_mtime
    run_pipeline(PipelineConfig("tiny", str(tmp_path), force=True))
    forced = capsys.readouterr().out
    assert "skipped" not in forced and "measured 15 samples" in forced  # the mix: 1.5 x the preset's 10
    assert (tmp_path / "data/cost_data/compute_cost_data.pkl").stat().st_mtime > mtime
