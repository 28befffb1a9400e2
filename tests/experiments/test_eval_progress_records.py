"""eval.py's progress log under bad records: a record with a missing key, a wrong type, deep nesting or a
NaN cost is never taken for a measured plan and never crashes the run; the log is set aside with one line
(good records kept), and a rerun is never blocked."""
import math
import pickle

import numpy as np
import pytest

from neuroshard.core.artifacts import RecordLog, frame, read_record_log
from neuroshard.core.errors import UserError
from neuroshard.experiments.evaluate import EVAL_PROGRESS_KIND, _open_progress

SETTINGS = {"batch_size": 8, "ndevices": 2}


def _good(task):
    return {"alg": "dim_greedy", "task": task, "plan": {"splits": [0, 1]}, "compute_ms": np.array([1.0, 2.0]),
            "fw_ms": np.array([0.5, 0.5]), "bw_ms": np.array([0.25, 0.25]), "round_costs": [3.1, 3.0, 3.2]}


def _deep_record(depth=50_000):
    """A checksum-true frame whose plan nests `depth` lists deep (pickle protocol 2, built by hand)."""
    rec = {**_good(9), "plan": "PLACEHOLDER", "compute_ms": [1.0, 2.0], "fw_ms": [0.5, 0.5], "bw_ms": [0.2, 0.2]}
    data = pickle.dumps(rec, protocol=2)
    stub = b"X\x0b\x00\x00\x00PLACEHOLDER"
    assert data.count(stub) == 1
    return frame(data.replace(stub, b"]" * depth + b"a" * (depth - 1)))


BAD = {
    "missing key": lambda: {k: v for k, v in _good(5).items() if k != "fw_ms"},
    "wrong type": lambda: {**_good(5), "task": "five"},
    "bool task": lambda: {**_good(5), "task": True},
    "costs of a string": lambda: {**_good(5), "compute_ms": ["a", "b"]},
    "wrong device count": lambda: {**_good(5), "fw_ms": [0.5, 0.5, 0.5]},
    "NaN cost": lambda: {**_good(5), "compute_ms": np.array([math.nan, 1.0])},
    "inf round": lambda: {**_good(5), "round_costs": [math.inf]},
    "negative cost": lambda: {**_good(5), "bw_ms": [-1.0, 0.0]},
    "unknown split": lambda: {**_good(5), "split": "test"},
    "split of a list": lambda: {**_good(5), "split": ["ratio"]},
}


def _log(path, bad=None):
    with RecordLog(path, EVAL_PROGRESS_KIND, SETTINGS, tuple(SETTINGS), "eval progress log") as log:
        log.append(_good(0))
        if bad is not None:
            log.append(bad)
        log.append(_good(1))


@pytest.mark.parametrize("which", list(BAD))
def test_a_bad_record_sets_the_log_aside_and_keeps_the_good_ones(tmp_path, capsys, which):
    path = tmp_path / "e.csv.progress.pkl"
    _log(path, BAD[which]())
    log = _open_progress(path, SETTINGS, 2, salvage=False)
    assert [r["task"] for r in log.records] == [0, 1]
    log.close()
    err = capsys.readouterr().err
    assert f"note: {path} record #2 is not a measured plan" in err and f"as {path}.bad" in err
    assert err.count("\n") == 1
    assert len(read_record_log(path.with_name(path.name + ".bad"), EVAL_PROGRESS_KIND, "x")[1]) == 3  # evidence kept
    log = _open_progress(path, SETTINGS, 2, salvage=False)  # the rerun: clean now, nothing more set aside
    assert len(log.records) == 2
    log.close()
    assert capsys.readouterr().err == ""


def test_a_deeply_nested_record_is_refused_with_the_way_out_then_salvaged(tmp_path, capsys):
    path = tmp_path / "e.csv.progress.pkl"
    _log(path)
    with open(path, "ab") as f:
        f.write(_deep_record())
    with pytest.raises(UserError, match=r"record #3 \(byte \d+\) nests too deeply .* --salvage to keep the 2 good"):
        _open_progress(path, SETTINGS, 2, salvage=False)
    log = _open_progress(path, SETTINGS, 2, salvage=True)
    assert [r["task"] for r in log.records] == [0, 1]
    log.close()
    assert "dropped 1 damaged record(s)" in capsys.readouterr().err
    assert len(read_record_log(path, EVAL_PROGRESS_KIND, "x")[1]) == 2


def test_a_flipped_byte_in_the_progress_log_is_refused_then_salvaged(tmp_path):
    path = tmp_path / "e.csv.progress.pkl"
    _log(path, _good(2))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(UserError, match="is damaged .*--salvage"):
        _open_progress(path, SETTINGS, 2, salvage=False)
    log = _open_progress(path, SETTINGS, 2, salvage=True)
    assert 1 <= len(log.records) <= 2
    log.close()
