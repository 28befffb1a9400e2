"""The whole pipeline on a tiny preset: runs end to end, skips finished steps, resumes, --force redoes."""
import pandas as pd
import pytest

from neuroshard.core.config import PipelineConfig, Preset
from neuroshard.experiments.pipeline import PRESETS, run_pipeline
from neuroshard.models.cost_models import ComputeCostModel

TINY = Preset(num_tables=24, batch_size=256, row_scale=1e-3, task_max_mem=0.02, max_mem=0.01, T_range=(4, 8),
              num_train_tasks=2, num_test_tasks=3, ndevices=(2,), compute_samples=20, compute_workers=2,
              comm_samples=10, epochs=5, eval_warmup=1, eval_iters=2, eval_rounds=1, families=True)


@pytest.fixture()
def tiny(monkeypatch):
    monkeypatch.setitem(PRESETS, "tiny", TINY)


def test_pipeline_runs_resumes_and_reports(tiny, tmp_path, capsys):
    out = run_pipeline(PipelineConfig("tiny", str(tmp_path)))
    first = capsys.readouterr().out
    assert "skipped" not in first
    summary = pd.read_csv(tmp_path / "results/summary.csv")
    assert set(summary.algorithm) == {"random", "dim_greedy", "size_greedy", "lookup_greedy", "size_lookup_greedy",
                                      "neuroshard", "torchrec"}
    assert (summary.measured_ms > 0).all()
    text = out.read_text()
    assert "Simulator fidelity" in text and "neuroshard" in text and (tmp_path / "results/summary.png").stat().st_size
    # with the family mix the compute model takes log inputs, and the logged command says so
    assert ComputeCostModel.load(tmp_path / "models/compute.pt").input_transform == "log"
    assert "--input_transform log" in first
    # a second run skips every finished step; the collectors find their files complete
    run_pipeline(PipelineConfig("tiny", str(tmp_path)))
    second = capsys.readouterr().out
    assert second.count("skipped") == 7  # every step with outputs; the two collectors always run
    assert "measured 0 samples" in second
    # an interrupted run (the measured results missing) resumes at that step only
    (tmp_path / "results/eval_2.csv").unlink()
    run_pipeline(PipelineConfig("tiny", str(tmp_path)))
    third = capsys.readouterr().out
    assert "eval.py" in third and "eval_simulator.py" not in third and third.count("skipped") == 6
    # --force redoes everything, collections included
    mtime = (tmp_path / "data/cost_data/compute_cost_data.pkl").stat().st_mtime
    run_pipeline(PipelineConfig("tiny", str(tmp_path), force=True))
    forced = capsys.readouterr().out
    assert "skipped" not in forced and "measured 30 samples" in forced  # the mix: 1.5 x the preset's 20
    assert (tmp_path / "data/cost_data/compute_cost_data.pkl").stat().st_mtime > mtime
