"""Comm cost data of DCT-MP's compressed all-to-all (collect_comm_cost_data.py --mp_keep) lives in its
own file, records mp_keep, and is never mixed with uncompressed data or trained as such."""
import shutil

import numpy as np
import pytest

from neuroshard.core.config import CommCollectConfig, TrainCommConfig
from neuroshard.core.errors import UserError
from neuroshard.hardware.collect import collect_comm, load_cost_data
from neuroshard.hardware.comm_bench import COMM_DATA_KIND
from neuroshard.models.fitting import train_comm_models

SETTINGS = dict(ndevices=2, batch_size=256, T_range=(3, 6), sleep_range=(1.0, 2.0), warmup_iter=1, num_iter=2)


def test_compressed_samples_have_their_own_file_and_are_never_mixed(tmp_path):
    out = tmp_path / "cost"
    rep = collect_comm(CommCollectConfig(out_dir=str(out), data_size=10, mp_keep=0.05, **SETTINGS))
    path = out / "comm_cost_data_2_mp0.05.pkl"
    assert rep["path"] == path and rep["total"] == 10
    meta, samples = load_cost_data(path, COMM_DATA_KIND)
    assert meta["mp_keep"] == 0.05 and [s["index"] for s in samples] == list(range(10))
    assert all(np.all(s["fw_ms"] > 0) and np.all(s["bw_ms"] > 0) for s in samples)
    # the uncompressed collector in the same folder never touches it (its own file) ...
    assert not (out / "comm_cost_data_2.pkl").exists()
    # ... and a compressed file under the uncompressed name (or another mp_keep) is refused, not continued
    shutil.copy(path, out / "comm_cost_data_2.pkl")
    with pytest.raises(UserError, match=r"made with mp_keep=0.05, this run has mp_keep=None"):
        collect_comm(CommCollectConfig(out_dir=str(out), data_size=12, **SETTINGS))
    shutil.copy(path, out / "comm_cost_data_2_mp0.1.pkl")
    with pytest.raises(UserError, match=r"made with mp_keep=0.05, this run has mp_keep=0.1"):
        collect_comm(CommCollectConfig(out_dir=str(out), data_size=12, mp_keep=0.1, **SETTINGS))
    assert len(load_cost_data(path, COMM_DATA_KIND)[1]) == 10
    # training: the models say mp_keep; a file of another all-to-all is refused
    models = tmp_path / "models"
    fw, bw = train_comm_models(TrainCommConfig(data_dir=str(out), ndevices=2, mp_keep=0.05,
                                               fw_out_path=str(models / "fw.pt"), bw_out_path=str(models / "bw.pt"),
                                               fit=_fit()))
    assert fw.meta["mp_keep"] == 0.05 and bw.meta["mp_keep"] == 0.05
    with pytest.raises(UserError, match="holds DCT-MP compressed \\(mp_keep 0.05\\) all-to-all samples, this run asks "
                                        "for uncompressed"):
        train_comm_models(TrainCommConfig(data_dir=str(out), ndevices=2, fw_out_path=str(models / "f2.pt"),
                                          bw_out_path=str(models / "b2.pt"), fit=_fit()))
    assert not (models / "f2.pt").exists()


def _fit():
    from neuroshard.core.config import FitConfig

    return FitConfig(epochs=2, batch_size=4)
