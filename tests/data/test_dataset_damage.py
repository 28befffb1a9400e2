"""Leftovers of the data steps: a damaged indices.pt (negative bag length, ids past the rows) is refused
with one line, and the task draw budget is per task (any number of tasks can be drawn)."""
import shutil

import numpy as np
import pytest
import torch

from neuroshard.core.errors import UserError
from neuroshard.data.dataset import DLRMDataset
from neuroshard.data.features import table_size_gb
from neuroshard.data.tasks import generate_tasks


def _copy(small_dataset, tmp_path):
    d = tmp_path / "ds"
    shutil.copytree(small_dataset.path, d)
    return d, torch.load(d / "indices.pt", weights_only=True)


def test_negative_bag_length_is_refused(small_dataset, tmp_path):
    d, bags = _copy(small_dataset, tmp_path)
    B = small_dataset.batch_size
    off = bags["offsets"].clone()
    i = 2 * B + 5  # a bag of table 2 ends before it starts
    off[i] = off[i + 1] + 3 if off[i + 1] + 3 <= off[-1] else off[i + 1] + 1
    torch.save({"indices": bags["indices"], "offsets": off}, d / "indices.pt")
    with pytest.raises(UserError, match=r"indices.pt is damaged: the bags of table 2 do not add up"):
        DLRMDataset.load(d).table_bags(0)


def test_offsets_that_do_not_end_at_the_ids_are_refused(small_dataset, tmp_path):
    d, bags = _copy(small_dataset, tmp_path)
    torch.save({"indices": bags["indices"][:-1], "offsets": bags["offsets"]}, d / "indices.pt")
    with pytest.raises(UserError, match="do not add up"):
        DLRMDataset.load(d).table_bags(0)
    torch.save({"indices": bags["indices"], "offsets": bags["offsets"].float()}, d / "indices.pt")
    with pytest.raises(UserError, match="does not match tables.pkl"):
        DLRMDataset.load(d).table_bags(0)


def test_an_id_past_the_tables_rows_is_refused(small_dataset, tmp_path):
    d, bags = _copy(small_dataset, tmp_path)
    B = small_dataset.batch_size
    t = int(np.argmax(small_dataset.meta["num_lookups"]))
    ind = bags["indices"].clone()
    ind[int(bags["offsets"][t * B])] = 10**12
    torch.save({"indices": ind, "offsets": bags["offsets"]}, d / "indices.pt")
    ds = DLRMDataset.load(d)
    with pytest.raises(UserError, match=f"table {t} holds id 1000000000000"):
        ds.table_bags(t)


def test_the_draw_budget_is_per_task(small_dataset):
    tasks = generate_tasks(small_dataset, 300, (2, 4), 1e6, 8, seed=0, max_tries_per_task=1)
    assert len(tasks) == 300  # 300 draws in all, one per task: the old total budget would have stopped at 1
    smallest3 = float(np.sort(table_size_gb(small_dataset.rows, 4))[:3].sum())
    with pytest.raises(UserError, match=r"could not draw task 0 within .* in 1 tries"):
        generate_tasks(small_dataset, 2, (3, 4), smallest3 * 1.0001, 8, seed=0, max_tries_per_task=1)


def test_write_it_again_messages_name_the_command_that_does(small_dataset, tmp_path):
    from neuroshard.data.tasks import load_tasks
    from neuroshard.models.cost_models import ComputeCostModel

    (tmp_path / "t.pkl").write_bytes(b"\x80\x04garbage")
    with pytest.raises(UserError, match=r"not a readable task file .*write it again with python tools/gen_tasks.py"):
        load_tasks(tmp_path / "t.pkl", small_dataset)
    d, _ = _copy(small_dataset, tmp_path)
    (d / "tables.pkl").write_bytes(b"\x80\x04garbage")
    with pytest.raises(UserError, match="write it again with python tools/gen_dlrm_data.py"):
        DLRMDataset.load(d)
    (tmp_path / "m.pt").write_bytes(b"PK\x03\x04 cut zip")
    with pytest.raises(UserError, match="write it again with python train_compute_cost_model.py"):
        ComputeCostModel.load(tmp_path / "m.pt")
