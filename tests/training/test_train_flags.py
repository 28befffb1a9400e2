"""tools/train_dlrm.py flags that would have no effect in the run asked for are refused in one line, before any
data is loaded or rank spawned (issue 65), and a result row records DCT settings only where the run used them."""
import re

import numpy as np
import pytest

from neuroshard.core.config import TrainConfig
from neuroshard.training.train import STEP_RECORD, summarize

from conftest import refused


@pytest.mark.parametrize("argv,words", [
    (["--num_samples", 5000], "--num_samples has no effect without --dataset synthetic"),
    (["--dataset", "movielens", "--max_rows", 100], "--max_rows has no effect without --dataset synthetic"),
    (["--dct", "mp", "--dp_keep", 0.1], "--dp_keep sets DCT-DP, which --dct mp does not run; pass --dct dp (or both)"),
    (["--dp_keep", 0.1], "--dp_keep sets DCT-DP, which --dct none does not run"),
    (["--dct", "dp", "--mp_keep", 0.3], "--mp_keep sets DCT-MP, which --dct dp does not run")])
def test_a_flag_the_run_would_ignore_is_refused(tmp_path, capsys, monkeypatch, argv, words):
    import neuroshard.training.train as data_mod  # where training loads its data

    monkeypatch.setattr(data_mod, "load_data", lambda *a, **k: pytest.fail("data loaded before the flags were checked"))
    refused(capsys, "tools/train_dlrm.py", "--results_csv", tmp_path / "r.csv", *argv, untouched=[tmp_path],
            match=f"error: {re.escape(words)}.*")


def test_a_result_row_records_only_the_dct_settings_the_run_used():
    from neuroshard.training.data import make_synthetic

    data = make_synthetic(2000, max_rows=50)
    steps, ranks = 4, 2
    done = ([0.4, 0.6], [0, 1], np.full((ranks, steps, len(STEP_RECORD)), 1e-3), [], [[0.7] * steps] * ranks, [])
    rows = {dct: summarize(TrainConfig(dataset="synthetic", dct=dct, ndevices=ranks, steps=steps, dp_keep=0.1,
                                       mp_keep=0.3, log_every=2).resolved(), data, done, 1.0)
            for dct in ("none", "dp", "mp", "both")}
    kept = {dct: (r["dp_keep"], r["dp_refresh"] is not None, r["mp_keep"]) for dct, r in rows.items()}
    assert kept == {"none": (None, False, None), "dp": (0.1, True, None), "mp": (None, False, 0.3),
                    "both": (0.1, True, 0.3)}
