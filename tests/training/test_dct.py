"""DCT on real gloo ranks: keep=1.0 is bit-identical to no compression, the DP threshold is refreshed
exactly every --dp_refresh steps, bytes match the formula, dropped MP entries get zero gradient, and
training learns a planted problem."""
import json
import math

import numpy as np
import pytest
import torch

from neuroshard.core.errors import UserError
from neuroshard.hardware.launch import run_processes
from neuroshard.training.dlrm import DenseArch
from neuroshard.training.train import TrainConfig, train_dlrm

import dct_workers

pytest.importorskip("recbole", reason="MovieLens-100K ships in the recbole wheel")

SMALL = dict(dataset="movielens", ndevices=2, steps=12, batch_size=128, log_every=4)


def _run(**kw):
    return train_dlrm(TrainConfig(**{**SMALL, **kw}), progress=False)


@pytest.fixture(scope="module")
def baseline():
    return _run(dct="none")


def test_keep_one_is_bit_identical_to_no_compression(baseline):
    dp = _run(dct="dp", dp_keep=1.0, dp_refresh=1)
    mp = _run(dct="mp", mp_keep=1.0)
    for r in (dp, mp):
        assert r["_losses"] == baseline["_losses"]
        assert r["_preds"] == baseline["_preds"]


def test_threshold_is_recomputed_exactly_every_refresh():
    r = _run(dct="dp", steps=25, dp_refresh=10)
    steps = sorted({s for _, s in r["_refreshed_at"]})
    assert steps == [0, 10, 20]
    buckets = {b for b, _ in r["_refreshed_at"]}
    assert len(r["_refreshed_at"]) == 3 * len(buckets)


def test_bytes_match_the_formula(baseline):
    B, N, T, D = 128, 2, 8, 16
    n = sum(p.numel() for p in DenseArch(4, T, D).parameters())
    assert baseline["mp_bytes_per_step"] == 2 * 4 * B * T * D   # every pooled entry, forward and backward
    assert baseline["dp_bytes_per_step"] == N * 4 * n           # every rank all_reduces every gradient
    r = _run(dct="both", dp_keep=0.01, dp_refresh=1, error_feedback=False)
    k = int(0.01 * n)                                           # one bucket: fresh tau keeps exactly k
    assert r["dp_bytes_per_step"] == N * (8 + k * (4 + 4))      # count (int64) + k int32 indices + k values
    widths = [T * D // N] * N                                   # size_lookup_greedy splits evenly here
    ks = [max(1, int(0.05 * w)) for w in widths]
    assert r["mp_bytes_per_step"] == sum(B * kr * (4 + 1) + B * kr * 4 for kr in ks)  # uint8 indices
    assert baseline["mp_bytes_per_step"] / r["mp_bytes_per_step"] > 14
    assert baseline["dp_bytes_per_step"] / r["dp_bytes_per_step"] > 40


@pytest.mark.parametrize("keep", [0.25, 1.0])
def test_dropped_mp_entries_get_zero_gradient(keep):
    got = {}
    run_processes(dct_workers.topk_gradients, 2, (keep,), lambda m: got.__setitem__(m[0], m[1:]), group_device="cpu")
    for rank, (pooled, grad, recv, nbytes) in got.items():
        k = max(1, int(keep * pooled.shape[1]))
        top = pooled.abs().topk(k, dim=1).indices
        mask = torch.zeros_like(pooled, dtype=torch.bool).scatter(1, top, True)
        assert (grad[~mask] == 0).all()
        assert (grad[mask] != 0).all()
        assert (recv != 0).sum() == 3 * (max(1, int(keep * 8)) + max(1, int(keep * 12)))


def test_four_ranks_train_with_both_compressions():
    r = _run(dct="both", ndevices=4, steps=8, batch_size=128)
    assert r["num_test"] > 19_000 and math.isfinite(r["test_logloss"])
    assert r["mp_bytes_per_step"] > 0 and r["dp_bytes_per_step"] > 0


def test_planted_problem_is_learned():
    """Label = [dense_0 + (+1 if table 0's id is even else -1) > 0]: the dense MLP must learn one weight
    and table 0's embeddings (sharded and all-to-all'd) must learn each id's parity."""
    from neuroshard.training.data import make_synthetic

    data = make_synthetic(20_000, num_tables=4, max_rows=50, seed=0)
    first_id = data.ids[0][data.offsets[0][:-1]]
    data.labels = ((data.dense[:, 0] + torch.where(first_id % 2 == 0, 1.0, -1.0)) > 0).float()
    data.offsets[0] = torch.arange(data.num_samples + 1)  # one id per sample in table 0
    data.ids[0] = first_id
    for dct in ("none", "dp"):  # DCT-DP (1% of the gradient entries, error feedback) learns it as well
        r = train_dlrm(TrainConfig(dataset="synthetic", ndevices=2, steps=200, batch_size=256, log_every=50, dct=dct),
                       progress=False, data=data)
        assert r["test_auc"] > 0.95, (dct, r["test_auc"])
        curve = [v for _, v in sorted((int(k), v) for k, v in json.loads(r["loss_curve"]).items())]
        assert curve[-1] < 0.5 * curve[0]


def test_bad_settings_are_refused():
    with pytest.raises(UserError, match="--batch_size 130 is not divisible"):
        TrainConfig(batch_size=130, ndevices=4).check()
    with pytest.raises(UserError, match="--dp_keep"):
        TrainConfig(dp_keep=0).check()
    with pytest.raises(UserError, match="--dct"):
        TrainConfig(dct="all").check()


def test_ctrl_c_stops_every_rank(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import ROOT

    proc = subprocess.Popen([sys.executable, str(ROOT / "tools/train_dlrm.py"), "--ndevices", "2", "--steps", "100000",
                             "--batch_size", "128", "--results_csv", str(tmp_path / "r.csv")],
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(12)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        raise AssertionError("ranks left behind")
    assert not (tmp_path / "r.csv").exists()  # an interrupted run leaves no half result
