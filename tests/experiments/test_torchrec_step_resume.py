"""benchmarks/torchrec_step.py resumes: a rerun with the same settings and code skips the sets its results
files already hold (and reports them); other settings, or a plans file that lacks a finished set, get one
line. In-process, with results files written by the script's own writer (no plan is measured here)."""
import re

import pytest

from neuroshard.core.artifacts import source_digest

from conftest import load_script, refused, run_in_process

torchrec_step = load_script("benchmarks/torchrec_step.py")


@pytest.fixture(autouse=True)
def no_work(monkeypatch):
    def measured(*a, **k):
        raise AssertionError("a finished set was measured again")

    monkeypatch.setattr(torchrec_step, "user_plans", measured)


def _finished(tmp_path, name="criteo_kaggle"):
    """The results files of one finished set, as the script writes them."""
    a = torchrec_step.TorchRecStepConfig(sets=(name,), out_dir=str(tmp_path)).check()
    made = {**a.settings(), "code": source_digest()}
    rows = [{"set": name, "plan": p, "column_split": False, "dmp_ms": ms, "emulated_ms": 1.0, "sim_step_ms": 1.0,
             "sim_paper_ms": 1.0, "sim_meas_step": 1.0, "vs_torchrec": ms / 2.0, "vs_torchrec_lo": ms / 2.1,
             "vs_torchrec_hi": ms / 1.9, **made} for p, ms in (("torchrec", 2.0), ("shard_tables", 1.7))]
    sets = [{"set": name, "measured_best": "shard_tables", "best_vs_torchrec": 0.85, "best_vs_torchrec_lo": 0.8,
             "best_vs_torchrec_hi": 0.9, "held_out_rounds": 10, "spearman_step": 1.0, "spearman_paper": 1.0,
             "spearman_emulated": 1.0, "distinct_plans": 2, "resolved_pairs": 1, "step_agrees_resolved": 1,
             "paper_agrees_resolved": 0, "seconds": 60.0, **made}]
    times = [{"set": name, "plan": p, "round": i, "dmp_ms": ms + 0.01 * i}
             for p, ms in (("torchrec", 2.0), ("shard_tables", 1.7), ("random0", 2.4)) for i in range(4)]
    torchrec_step.write(rows, sets, times, a)


def test_a_rerun_keeps_every_rounds_step_time(tmp_path, capsys):
    """The per-round times of a finished set survive a rerun that rewrites the results files."""
    import pandas as pd

    _finished(tmp_path)
    code, out, err = run_in_process(capsys, torchrec_step, "--sets", "criteo_kaggle", "--out_dir", tmp_path)
    assert code in (0, None), err
    df = pd.read_csv(tmp_path / "torchrec_step_rounds.csv")
    assert len(df) == 12 and set(df.plan) == {"torchrec", "shard_tables", "random0"}
    assert df[df.plan == "shard_tables"].sort_values("round").dmp_ms.round(2).tolist() == [1.7, 1.71, 1.72, 1.73]


def test_results_without_a_rounds_file_still_resume(tmp_path, capsys):
    """Runs written before the rounds file existed resume; their report is rebuilt without it."""
    _finished(tmp_path)
    (tmp_path / "torchrec_step_rounds.csv").unlink()
    (tmp_path / "torchrec_step.md").unlink()
    code, out, err = run_in_process(capsys, torchrec_step, "--sets", "criteo_kaggle", "--out_dir", tmp_path)
    assert code in (0, None), err
    assert "## criteo_kaggle" in (tmp_path / "torchrec_step.md").read_text()
    assert not (tmp_path / "torchrec_step_rounds.csv").exists()


def test_a_rerun_skips_the_finished_sets_and_reports_them(tmp_path, capsys):
    _finished(tmp_path)
    (tmp_path / "torchrec_step.md").unlink()
    code, out, err = run_in_process(capsys, torchrec_step, "--sets", "criteo_kaggle", "--out_dir", tmp_path)
    assert code in (0, None), err
    assert "criteo_kaggle: measured already" in out
    md = (tmp_path / "torchrec_step.md").read_text()
    assert "## criteo_kaggle" in md and "shard_tables, 0.850 [0.800, 0.900] of TorchRec's" in md
    assert "excluding 1): 1 of 1; the simulated step cost orders 1 of them as measured, the paper cost 0." in md


def test_a_damaged_pair_count_is_refused_in_one_line(tmp_path, capsys):
    _finished(tmp_path)
    sets = tmp_path / "torchrec_step_sets.csv"
    text = sets.read_text()
    head, row = text.splitlines()[:2]
    i = head.split(",").index("resolved_pairs")
    cells = row.split(",")
    cells[i] = "many"
    sets.write_text(head + "\n" + ",".join(cells) + "\n")
    refused(capsys, torchrec_step, "--sets", "criteo_kaggle", "--out_dir", tmp_path, untouched=[tmp_path], quiet=False,
            match=re.escape(f"error: --out_dir: {sets} row 1: resolved_pairs is not a finite number ('many'); the file "
                            "is damaged: move it away or pass --fresh"))


def test_an_emptied_pair_count_drops_the_pairs_sentence(tmp_path, capsys):
    """An empty count (a cell a row predates, kept by the reader) leaves the sentence out, not a traceback."""
    _finished(tmp_path)
    sets = tmp_path / "torchrec_step_sets.csv"
    head, row = sets.read_text().splitlines()[:2]
    cells = row.split(",")
    cells[head.split(",").index("step_agrees_resolved")] = ""
    sets.write_text(head + "\n" + ",".join(cells) + "\n")
    (tmp_path / "torchrec_step.md").unlink()
    code, out, err = run_in_process(capsys, torchrec_step, "--sets", "criteo_kaggle", "--out_dir", tmp_path)
    assert code in (0, None) and "Traceback" not in err, err
    md = (tmp_path / "torchrec_step.md").read_text()
    assert "## criteo_kaggle" in md and "Pairs of plans the DMP rounds tell apart" not in md


@pytest.mark.parametrize("argv, settings", [
    (["--rounds", "8"], "rounds"),
    (["--ndevices", "2", "--max_mem", "0.08"], "ndevices, max_mem"),
    (["--calibrate", "120"], "calibrate"),
])
def test_other_settings_are_refused_in_one_line(tmp_path, capsys, argv, settings):
    _finished(tmp_path)
    refused(capsys, torchrec_step, "--sets", "criteo_kaggle", "--out_dir", tmp_path, *argv, untouched=[tmp_path],
            quiet=False, match=re.escape(f"error: {tmp_path}/torchrec_step_sets.csv holds runs made with other "
                                         f"settings ({settings}); pass --fresh to start over, or --out_dir for a "
                                         "separate folder"))


def test_a_plans_file_without_a_finished_set_is_refused(tmp_path, capsys):
    _finished(tmp_path)
    (tmp_path / "torchrec_step.csv").unlink()
    refused(capsys, torchrec_step, "--sets", "criteo_kaggle", "--out_dir", tmp_path, untouched=[tmp_path], quiet=False,
            match=re.escape(f"error: {tmp_path}/torchrec_step.csv lacks the plans of set 'criteo_kaggle' that "
                            f"{tmp_path}/torchrec_step_sets.csv holds; pass --fresh to measure every set again"))


@pytest.mark.parametrize("name", ["torchrec_step_sets.csv", "torchrec_step.csv", "torchrec_step_rounds.csv"])
def test_a_folder_where_a_results_file_goes_is_refused_before_any_work(tmp_path, capsys, name):
    (tmp_path / name).mkdir()
    refused(capsys, torchrec_step, "--sets", "criteo_kaggle", "--out_dir", tmp_path, untouched=[tmp_path],
            match=re.escape(f"error: --out_dir: {tmp_path}/{name} is a folder; name a file to write"))


@pytest.mark.parametrize("value,line", [
    ("5", "--calibrate must be >= 15 and <= 100000, got 5"), ("-3", "--calibrate must be >= 15 and <= 100000, got -3"),
    ("many", "argument --calibrate: invalid int value: 'many' (see torchrec_step.py --help)")])
def test_a_bad_calibrate_is_refused_in_one_line_before_any_work(tmp_path, capsys, value, line):
    refused(capsys, torchrec_step, "--sets", "criteo_kaggle", "--out_dir", tmp_path, "--calibrate", value,
            match=re.escape(f"error: {line}"), untouched=[tmp_path])
