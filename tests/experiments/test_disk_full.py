"""A full disk while writing a task file or a results CSV: one line (disk full, rerun resumes), the old
file unchanged, no temporary file left behind."""
import os

import pytest

from neuroshard.core.errors import UserError
from neuroshard.data.tasks import generate_tasks, load_tasks, save_tasks
from neuroshard.core.artifacts import write_results

from conftest import disk_full


def test_disk_full_while_writing_a_task_file(small_dataset, tmp_path, monkeypatch):
    path = tmp_path / "test.pkl"
    save_tasks(path, generate_tasks(small_dataset, 2, (3, 5), 1.0, 32, seed=0), small_dataset)
    before = path.read_bytes()
    disk_full(monkeypatch)
    with pytest.raises(UserError, match=r"^disk full while writing .*test.pkl; the previous file \(if any\) is "
                                        "unchanged; free some space .* rerun the same command"):
        save_tasks(path, generate_tasks(small_dataset, 3, (3, 5), 1.0, 32, seed=1), small_dataset)
    monkeypatch.undo()
    assert path.read_bytes() == before and len(load_tasks(path, small_dataset)) == 2
    assert sorted(os.listdir(tmp_path)) == ["test.pkl"]


def test_disk_full_while_writing_results(tmp_path, monkeypatch):
    disk_full(monkeypatch)
    with pytest.raises(UserError, match="^disk full while writing .*r.csv"):
        write_results(tmp_path / "r.csv", [{"alg": "a", "task": 0, "cost_ms": 1.0}])
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []
