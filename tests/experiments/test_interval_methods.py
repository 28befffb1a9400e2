"""benchmarks/interval_methods.py: split-conformal intervals fitted on training plans, checked leave-one-task-out
and on held-out plans, on small CSVs in the formats of risk_search.py and eval.py."""
import csv
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import interval_methods as im  # noqa: E402

from conftest import refused  # noqa: E402


def _write(path, header, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def _train(tmp_path):
    # 19 plans of 4 tasks measuring 1.00, 1.01, ..., 1.18 x their simulated cost; the members agree within 1%
    rows = [["train", t % 4, "neuroshard", 10.0, 10.0, 0.1, 10.0 * (1 + k / 100)] for k, t in enumerate(range(19))]
    return _write(tmp_path / "train.csv", ["split", "task", "alg", "simulated_ms", "members_mean_ms", "members_sd_ms",
                                           "measured_ms"], rows)


def test_the_ratio_interval_is_the_conformal_percentiles_and_its_coverage_is_counted(tmp_path):
    test = _write(tmp_path / "test.csv", ["task", "alg", "oom", "sim_cost_ms", "cost_ms"],
                  [[0, "a", "False", 10.0, 10.5], [1, "a", "False", 10.0, 12.0], [2, "a", "True", 10.0, ""],
                   [3, "b", "False", 20.0, 19.0]])
    a = im.IntervalMethodsConfig(train=str(_train(tmp_path)), test=str(test), out=str(tmp_path / "r.md")).check()
    row, text = im.run(a)
    # n = 19: the ceil(20 x 0.05) = 1st and ceil(20 x 0.95) = 19th smallest ratios
    assert math.isclose(row["ratio_lo"], 1.00) and math.isclose(row["ratio_hi"], 1.18)
    assert row["test_plans"] == 3 and math.isclose(row["test_ratio_coverage"], 1 / 3)  # 1.05 in; 1.2 and 0.95 out
    assert row["train_plans"] == 19 and row["train_tasks"] == 4
    assert 0 < row["cv_ratio_coverage"] <= 1 and row["cv_ratio_width"] > 0 and "held 33.3%" in text


@pytest.mark.parametrize("content, line", [
    (None, "--train {p}: no such file; run the step that writes it first"),
    ("a,b\n1,2\n", "--train {p}: no rows with column 'task'; pass the CSV the module docstring names"),
    ("split,task,alg,simulated_ms,members_mean_ms,members_sd_ms,measured_ms\ntrain,0,x,ten,1,0.1,1\n",
     "--train {p}: row 2 holds a value that is not a number"),
    ("split,task,alg,simulated_ms,members_mean_ms,members_sd_ms,measured_ms\ntrain,0,x,-1,1,0.1,1\n",
     "--train {p}: row 2 holds a cost that is not a finite number > 0"),
])
def test_bad_csvs_are_one_line(capsys, tmp_path, content, line):
    p = tmp_path / "bad.csv"
    if content is not None:
        p.write_text(content)
    test = _write(tmp_path / "test.csv", ["task", "alg", "oom", "sim_cost_ms", "cost_ms"], [[0, "a", "False", 1, 1]])
    refused(capsys, "benchmarks/interval_methods.py", "--train", p, "--test", test, "--out", tmp_path / "o" / "r.md",
            match="error: " + line.format(p=p).replace("(", r"\(").replace(")", r"\)").replace(".", r"\."),
            quiet=False, untouched=[tmp_path])


@pytest.mark.parametrize("rows, line", [
    ([["train", 0, "x", 1, 1, -0.1, 1]], "row 2 holds a members' sd that is not a finite number >= 0"),
    ([["train", 0, "x", 1, 1, 0.1, 1], ["train", 0, "x", 2, 2, 0.1, 2]], "needs the plans of 2 or more tasks"),
    ([["train", 0, "x", 1, 1, 0, 1], ["train", 1, "x", 2, 2, 0, 2]], "needs the plans of 2 or more tasks"),
])
def test_training_plans_that_cannot_be_held_out_are_one_line(capsys, tmp_path, rows, line):
    train = _write(tmp_path / "train.csv", ["split", "task", "alg", "simulated_ms", "members_mean_ms", "members_sd_ms",
                                            "measured_ms"], rows)
    test = _write(tmp_path / "test.csv", ["task", "alg", "oom", "sim_cost_ms", "cost_ms"], [[0, "a", "False", 1, 1]])
    refused(capsys, "benchmarks/interval_methods.py", "--train", train, "--test", test, "--out", tmp_path / "r.md",
            match=f"error: --train {train}: " + line.replace("(", r"\(").replace(")", r"\)") + ".*",
            quiet=False, untouched=[tmp_path])


def test_an_output_name_with_a_newline_is_refused_before_any_work(capsys, tmp_path):
    refused(capsys, "benchmarks/interval_methods.py", "--out", f"{tmp_path}/a\nb.md",
            match=r"error: --out '.*a\\nb\.md': the path holds a control character \(a newline, a tab, \.\.\.\); "
                  r"choose a name of printable characters", untouched=[tmp_path])
