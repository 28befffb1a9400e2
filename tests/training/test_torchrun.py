"""tools/train_dlrm.py launched by torchrun (one node with 2 processes; two 'nodes' of 1 process
each with a c10d rendezvous on loopback; --ndevices left to torchrun's world size) gives the same
results as the self-spawned run."""
import os
import subprocess
import sys

import pandas as pd

from conftest import ROOT, run_python


ARGS = ["--dataset", "synthetic", "--num_samples", "2000", "--max_rows", "50", "--ndevices", "2", "--steps", "6",
        "--batch_size", "128", "--log_every", "2", "--dct", "both", "--seed", "3"]
COLS = ["test_auc", "test_logloss", "num_test", "loss_curve", "dp_bytes_per_step", "mp_bytes_per_step"]
TR_ARGS = [a for i, a in enumerate(ARGS) if "--ndevices" not in ARGS[max(0, i - 1):i + 1]]  # torchrun's world size
ENV = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--local-addr", "127.0.0.1"]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _row(csv):
    df = pd.read_csv(csv)
    assert len(df) == 1  # only rank 0 writes
    return df.iloc[0][COLS].to_dict()


def test_torchrun_single_and_two_nodes_match_the_spawned_run(tmp_path, monkeypatch):
    """The three launches run at once (each mostly waits on process start-up and rendezvous); the
    self-spawned reference runs through the tests' script server with the same environment."""
    script = str(ROOT / "tools/train_dlrm.py")
    one = subprocess.Popen([*TORCHRUN, "--standalone", "--nproc_per_node", "2", script, *TR_ARGS,
                            "--results_csv", tmp_path / "one.csv"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=ENV)
    port = _free_port()
    nodes = [subprocess.Popen([*TORCHRUN, "--nnodes", "2", "--node_rank", str(r), "--nproc_per_node", "1",
                               "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "t",
                               script, *TR_ARGS, "--results_csv", tmp_path / "two.csv"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV) for r in (0, 1)]
    for k in ("GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS"):
        monkeypatch.setenv(k, ENV[k])
    spawned = run_python(script, *ARGS, "--results_csv", tmp_path / "spawned.csv", timeout=300)
    assert spawned.returncode == 0, spawned.stderr
    one_out, one_err = one.communicate(timeout=300)
    assert one.returncode == 0, one_err
    assert one_out.count("test AUC") == 1  # rank 0 reports, rank 1 is silent
    outs = [p.communicate(timeout=300) for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], [e for _, e in outs]
    expected = _row(tmp_path / "spawned.csv")
    import json

    from neuroshard.core.artifacts import cpu_name
    meta = json.loads((tmp_path / "spawned.csv.meta.json").read_text())
    assert meta["device_name"] == meta["cpu"] == cpu_name() and meta["backend"] == "gloo"  # the machine that trained it
    assert _row(tmp_path / "one.csv") == expected
    assert _row(tmp_path / "two.csv") == expected


def test_torchrun_world_size_must_match_ndevices(tmp_path, monkeypatch):
    import pytest

    from neuroshard.core.errors import UserError
    from neuroshard.training.train import TrainConfig, train_dlrm

    for k, v in dict(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500",
                     TORCHELASTIC_RUN_ID="t").items():
        monkeypatch.setenv(k, v)
    with pytest.raises(UserError, match="--ndevices 4 but torchrun started 2 ranks; pass --ndevices 2 or leave it out"):
        train_dlrm(TrainConfig(ndevices=4, steps=2), tmp_path / "r.csv", progress=False)
    assert not (tmp_path / "r.csv").exists()
