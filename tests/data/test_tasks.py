"""Sharding tasks (DESIGN.md §2.4): drawing, task files, and every bad task file or setting."""

import numpy as np
import pytest

from neuroshard.core.artifacts import atomic_write_pickle
from neuroshard.core.errors import UserError
from neuroshard.data.features import table_size_gb
from neuroshard.data.tasks import TASKS_KIND, generate_tasks, load_tasks, save_tasks

from conftest import assert_clean_error, files_under, run_script


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


@pytest.mark.parametrize("T_range", ["5", "60,10", "a,b", "0,3"])
def test_bad_T_range(small_dataset, tmp_path, T_range):
    proc = run_script("tools/gen_tasks.py", "--data_dir", small_dataset.path, "--out_dir", tmp_path,
                      "--T_range", T_range)
    assert_clean_error(proc, "--T_range")
    assert files_under(tmp_path) == []


@pytest.mark.parametrize("args,fragment", [
    (["--data_size", "0"], "--data_size"), (["--max_mem", "-1"], "--max_mem"), (["--max_mem", "inf"], "--max_mem"),
    (["--max_dim", "12"], "--max_dim"), (["--max_dim", "256"], "--max_dim"), (["--split", "../x"], "--split"),
    (["--seed", "-3"], "--seed")])
def test_bad_task_settings_touch_nothing(small_dataset, tmp_path, args, fragment):
    proc = run_script("tools/gen_tasks.py", "--data_dir", small_dataset.path, "--out_dir", tmp_path / "t", *args)
    assert_clean_error(proc, fragment)
    assert files_under(tmp_path) == []


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
    with pytest.raises(UserError, match=fragment):
        load_tasks(tmp_path / "t.pkl", small_dataset)
    proc = run_script("eval_simulator.py", "--data_dir", small_dataset.path, "--task_path", tmp_path / "t.pkl",
                      "--alg", "dim_greedy", "--results_csv", tmp_path / "out.csv")
    assert_clean_error(proc, "task 0")
    assert not (tmp_path / "out.csv").exists()
