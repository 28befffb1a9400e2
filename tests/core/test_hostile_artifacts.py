"""Every artifact kind, replaced by a pickle whose payload would create a marker file: each loader
refuses it with one clear error, and the marker never appears (no code ran)."""
import pickle
import shutil

import pytest
import torch

from neuroshard.core.artifacts import RecordLog
from neuroshard.core.errors import UserError
from neuroshard.data.dataset import DLRMDataset
from neuroshard.data.raw import load_raw
from neuroshard.data.tasks import load_tasks
from neuroshard.experiments.evaluate import EVAL_PROGRESS_KIND
from neuroshard.hardware.collect import load_cost_data
from neuroshard.hardware.compute_bench import COMPUTE_DATA_KIND
from neuroshard.models.cost_models import CommCostModel, ComputeCostModel

from conftest import hostile_objects


def _write_pickle(path, obj):
    with open(path, "wb") as f:
        pickle.dump(obj, f)


def _dataset_tables(small_dataset, tmp_path, obj):
    d = tmp_path / "ds"
    shutil.copytree(small_dataset.path, d)
    _write_pickle(d / "tables.pkl", obj)
    return lambda: DLRMDataset.load(d)


def _dataset_indices(small_dataset, tmp_path, obj):
    d = tmp_path / "ds"
    shutil.copytree(small_dataset.path, d)
    torch.save(obj, d / "indices.pt")
    return lambda: DLRMDataset.load(d).table_bags(0)


def _tasks(small_dataset, tmp_path, obj):
    _write_pickle(tmp_path / "t.pkl", obj)
    return lambda: load_tasks(tmp_path / "t.pkl", small_dataset)


def _cost_data(small_dataset, tmp_path, obj):
    _write_pickle(tmp_path / "c.pkl", obj)
    return lambda: load_cost_data(tmp_path / "c.pkl", COMPUTE_DATA_KIND)


def _cost_data_append(small_dataset, tmp_path, obj):  # a collector resuming a poisoned file
    _write_pickle(tmp_path / "c.pkl", obj)
    return lambda: RecordLog(tmp_path / "c.pkl", COMPUTE_DATA_KIND, {}, ())


def _eval_progress(small_dataset, tmp_path, obj):
    _write_pickle(tmp_path / "e.csv.progress.pkl", obj)
    return lambda: RecordLog(tmp_path / "e.csv.progress.pkl", EVAL_PROGRESS_KIND, {}, (), restart_on_mismatch=True)


def _compute_model(small_dataset, tmp_path, obj):
    torch.save({"kind": "compute_cost_model", "meta": {}, "state_dict": obj}, tmp_path / "m.pt")
    return lambda: ComputeCostModel.load(tmp_path / "m.pt")


def _comm_model(small_dataset, tmp_path, obj):
    torch.save(obj, tmp_path / "m.pt")
    return lambda: CommCostModel.load(tmp_path / "m.pt")


def _raw_data(small_dataset, tmp_path, obj):
    torch.save((obj, obj, obj), tmp_path / "raw.pt")
    return lambda: load_raw(tmp_path / "raw.pt")


KINDS = [_dataset_tables, _dataset_indices, _tasks, _cost_data, _cost_data_append, _eval_progress, _compute_model,
         _comm_model, _raw_data]


@pytest.mark.parametrize("which", range(3))
@pytest.mark.parametrize("kind", KINDS, ids=lambda f: f.__name__.strip("_"))
def test_hostile_artifact_is_refused_without_running_code(small_dataset, tmp_path, kind, which):
    marker = tmp_path / "marker"
    load = kind(small_dataset, tmp_path, hostile_objects(marker)[which])
    with pytest.raises(UserError) as e:
        load()
    assert not marker.exists(), f"{kind.__name__}: the payload ran"
    msg = str(e.value)
    assert msg.startswith(str(tmp_path)) and "\n" not in msg, msg  # one line, naming the file it refused
    assert "weights_only" not in msg and "trust the source" not in msg, msg  # never advice to load it unsafely
