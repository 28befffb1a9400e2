"""Sharding tasks (DESIGN.md §2.4): drawing, task files, and every bad task file or setting."""
import re

import numpy as np
import pytest

from neuroshard.core.artifacts import atomic_write_pickle
from neuroshard.core.errors import UserError
from neuroshard.data.features import table_size_gb
from neuroshard.data.tasks import TASKS_KIND, generate_tasks, load_tasks, save_tasks

from conftest import refused


def test_generated_tasks_honour_range_dims_and_budget(small_dataset):
    budget = 0.002
    tasks = generate_tasks(small_dataset, 30, (3, 7), budget, 64, seed=0)
    assert len(tasks) == 30
    sizes = set()
    for t in tasks:
        assert 3 <= len(t["table_ids"]) < 7
        assert set(t["dims"]) <= {64, 32, 16, 8, 4}
        assert table_size_gb(small_dataset.rows[t["table_ids"]], t["dims"]).sum() <= budget
        sizes.add(len(t["table_ids"]))
    assert len(sizes) > 1


def test_task_file_round_trip_and_dataset_check(small_dataset, tmp_path):
    tasks = generate_tasks(small_dataset, 4, (2, 5), 1.0, 128, seed=1)
    save_tasks(tmp_path / "t.pkl", tasks, small_dataset)
    loaded = load_tasks(tmp_path / "t.pkl", small_dataset)
    assert [l.table_ids.tolist() for l in loaded] == [t["table_ids"].tolist() for t in tasks]
    other = type(small_dataset)(small_dataset.path, {**small_dataset.meta, "fingerprint": "other"})
    with pytest.raises(UserError, match="another dataset"):
        load_tasks(tmp_path / "t.pkl", other)


@pytest.mark.parametrize("T_range,line", [
    ("5", "--T_range must be two int values 'lo,hi' (e.g. 10,60), got '5'"),
    ("60,10", "--T_range must satisfy 1 <= lo < hi, got 60,10"),
    ("a,b", "--T_range must be two int values 'lo,hi' (e.g. 10,60), got 'a,b'"),
    ("0,3", "--T_range must satisfy 1 <= lo < hi, got 0,3")])
def test_bad_T_range(small_dataset, tmp_path, capsys, T_range, line):
    refused(capsys, "tools/gen_tasks.py", "--data_dir", small_dataset.path, "--out_dir", tmp_path, "--T_range", T_range,
            match=re.escape(f"error: {line}"), untouched=[tmp_path])


@pytest.mark.parametrize("args,line", [
    (["--data_size", "0"], "--data_size must be >= 1 and <= 1e+06, got 0"),
    (["--max_mem", "-1"], "--max_mem must be a finite number > 0 and <= 1e+06, got -1"),
    (["--max_mem", "inf"], "--max_mem must be a finite number > 0 and <= 1e+06, got inf"),
    (["--max_dim", "12"], "--max_dim must be one of 4, 8, 16, 32, 64, 128, got 12"),
    (["--max_dim", "256"], "--max_dim must be >= 4 and <= 128, got 256"),
    (["--split", "../x"], "--split must be a plain file name such as train or test, got '../x'"),
    (["--seed", "-3"], "--seed must be >= 0, got -3")])
def test_bad_task_settings_touch_nothing(small_dataset, tmp_path, capsys, args, line):
    refused(capsys, "tools/gen_tasks.py", "--data_dir", small_dataset.path, "--out_dir", tmp_path / "t", *args,
            match=re.escape(f"error: {line}"), untouched=[tmp_path])


@pytest.mark.parametrize("entry,fragment", [
    ({"table_ids": np.array([0, 99]), "dims": np.array([8, 8])}, "unknown table id 99"),
    ({"table_ids": np.array([0, -1]), "dims": np.array([8, 8])}, "unknown table id -1"),
    ({"table_ids": np.array([0, 1]), "dims": np.array([8, 12])}, "illegal dim 12"),
    ({"table_ids": np.array([0, 1]), "dims": np.array([8])}, "equal-length"),
    ({"table_ids": np.array([0.5, 1]), "dims": np.array([8, 8])}, "whole numbers"),
    ({"dims": np.array([8])}, "needs table_ids and dims")])
def test_bad_task_file_is_refused(small_dataset, tmp_path, entry, fragment):
    atomic_write_pickle(tmp_path / "t.pkl", {"kind": TASKS_KIND, "tasks": [entry],
                                             "dataset_fingerprint": small_dataset.fingerprint})
    with pytest.raises(UserError, match=f"^{tmp_path}/t.pkl task 0: .*{fragment}"):  # what a step prints (below)
        load_tasks(tmp_path / "t.pkl", small_dataset)


def test_a_step_refuses_a_bad_task_file_in_one_line(small_dataset, tmp_path, capsys):
    """What a step does with any of the bad task files above (load_tasks' error, one line): shown once."""
    atomic_write_pickle(tmp_path / "t.pkl", {"kind": TASKS_KIND, "dataset_fingerprint": small_dataset.fingerprint,
                                             "tasks": [{"table_ids": np.array([0, 99]), "dims": np.array([8, 8])}]})
    refused(capsys, "eval_simulator.py", "--data_dir", small_dataset.path, "--task_path", tmp_path / "t.pkl",
            "--alg", "dim_greedy", "--results_csv", tmp_path / "out.csv", untouched=[tmp_path],
            match=re.escape(f"error: {tmp_path}/t.pkl task 0: unknown table id 99 (the dataset has tables 0..23); "
                            "regenerate the tasks for this dataset"))
