"""Restricted unpickling and atomic writes."""
import pickle

import numpy as np
import pytest
import torch

from neuroshard.artifacts import atomic_write_pickle, load_pickle
from neuroshard.errors import UserError


class Evil:
    def __reduce__(self):
        return (print, ("pwned",))


class Plain:
    pass


def test_plain_data_arrays_and_tensors_load(tmp_path):
    obj = {"a": [1, 2.5, "x", (3, None)], "arr": np.arange(6, dtype=np.float32).reshape(2, 3),
           "t": torch.arange(4), "s": {1, 2}}
    atomic_write_pickle(tmp_path / "ok.pkl", obj)
    back = load_pickle(tmp_path / "ok.pkl")
    assert back["a"] == obj["a"] and back["s"] == {1, 2}
    assert np.array_equal(back["arr"], obj["arr"]) and back["arr"].dtype == np.float32
    assert torch.equal(back["t"], obj["t"])


@pytest.mark.parametrize("obj", [Evil(), Plain(), {"nested": [Plain()]}])
def test_other_classes_are_refused(tmp_path, obj, capsys):
    with open(tmp_path / "bad.pkl", "wb") as f:
        pickle.dump(obj, f)
    with pytest.raises(UserError, match="refusing to load"):
        load_pickle(tmp_path / "bad.pkl")
    assert "pwned" not in capsys.readouterr().out


def test_atomic_write_leaves_no_partial_file(tmp_path):
    class Boom:
        def __reduce__(self):
            raise RuntimeError("boom")

    atomic_write_pickle(tmp_path / "x.pkl", {"old": 1})
    with pytest.raises(RuntimeError):
        atomic_write_pickle(tmp_path / "x.pkl", {"new": Boom()})
    assert load_pickle(tmp_path / "x.pkl") == {"old": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.pkl"]
