"""torchrun's environment is checked before anything waits on it (issue 39): every bad RANK,
WORLD_SIZE, LOCAL_RANK or MASTER_PORT is one line naming the variable and the fix; a process alone
in a group of two stops within --rendezvous_timeout_s, and SIGTERM during that wait ends it at once
(exit 143); neither leaves a temporary folder. Under torchrun --ndevices defaults to the world size."""
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import ROOT, refused
from neuroshard.core.errors import UserError
from neuroshard.hardware.launch import torchrun_env

SCRIPT = str(ROOT / "tools/train_dlrm.py")
GOOD = dict(RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", LOCAL_RANK="1",
            LOCAL_WORLD_SIZE="2")
FIX = "launch with torchrun"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("change,fragment", [
    (dict(RANK="2"), "RANK must be 0..1"),
    (dict(RANK="-1"), "RANK must be 0..1"),
    (dict(RANK="one"), "RANK must be a whole number"),
    (dict(RANK=""), "RANK must be a whole number"),
    (dict(WORLD_SIZE="two"), "WORLD_SIZE must be a whole number"),
    (dict(WORLD_SIZE="0"), "WORLD_SIZE must be 1..1048576"),
    (dict(WORLD_SIZE="2.0"), "WORLD_SIZE must be a whole number"),
    (dict(LOCAL_RANK="2"), "LOCAL_RANK must be 0..1"),
    (dict(LOCAL_RANK="-1"), "LOCAL_RANK must be 0..1"),
    (dict(LOCAL_RANK="x"), "LOCAL_RANK must be a whole number"),
    (dict(RANK="0", LOCAL_RANK="1"), "LOCAL_RANK must be 0..0"),   # a local rank above the global one
    (dict(LOCAL_WORLD_SIZE="3"), "LOCAL_WORLD_SIZE must be 1..2"),
    (dict(MASTER_PORT="abc"), "MASTER_PORT must be a whole number"),
    (dict(MASTER_PORT="0"), "MASTER_PORT must be 1..65535"),
    (dict(MASTER_PORT="65536"), "MASTER_PORT must be 1..65535"),
    (dict(MASTER_PORT=None), "MASTER_PORT is not set"),
    (dict(MASTER_ADDR=" "), "MASTER_ADDR is empty"),
])
def test_bad_torchrun_environment_is_one_line(monkeypatch, change, fragment):
    for k, v in {**GOOD, **change}.items():
        if v is None:
            monkeypatch.delenv(k, raising=False)
        else:
            monkeypatch.setenv(k, v)
    with pytest.raises(UserError) as e:
        torchrun_env()
    assert fragment in str(e.value) and FIX in str(e.value) and "\n" not in str(e.value)


def test_good_torchrun_environment(monkeypatch):
    for k, v in GOOD.items():
        monkeypatch.setenv(k, v)
    assert torchrun_env() == (1, 2, 1)


def _env(tmp_path, **extra):
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHELASTIC_RUN_ID", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env.update(TMPDIR=str(tmp), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **extra)
    return env, tmp


ARGS = ["--dataset", "synthetic", "--num_samples", "2000", "--max_rows", "50", "--steps", "2", "--batch_size", "64"]


def test_bad_rank_through_the_script(tmp_path, capsys, monkeypatch):
    env, tmp = _env(tmp_path, RANK="5", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    for k in ("TORCHELASTIC_RUN_ID", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(k, env[k])
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    refused(capsys, "tools/train_dlrm.py", *ARGS, "--results_csv", tmp_path / "r.csv", untouched=[tmp_path],
            match=re.escape("error: torchrun's environment: RANK must be 0..1 (this process's rank among WORLD_SIZE "
                            "2), got 5; launch with torchrun (e.g. torchrun --nproc_per_node N ...), which sets it, or "
                            "unset RANK, WORLD_SIZE and MASTER_ADDR to let the script spawn its own ranks"))


@pytest.mark.parametrize("rank", ["0", "1"])  # rank 0 waits for a client, rank 1 for a server
def test_a_process_alone_stops_within_the_rendezvous_timeout(tmp_path, rank):
    port = _free_port()
    env, tmp = _env(tmp_path, RANK=rank, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    r = subprocess.run([sys.executable, SCRIPT, *ARGS, "--rendezvous_timeout_s", "2",
                        "--results_csv", str(tmp_path / "r.csv")], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"error: torchrun rank {rank} of 2: the ranks did not all meet at 127.0.0.1:{port} within 2 s")
    assert line.endswith("start all 2 ranks (torchrun --nnodes/--nproc_per_node), check MASTER_ADDR and MASTER_PORT, "
                         "or raise --rendezvous_timeout_s")
    assert os.listdir(tmp) == [] and not (tmp_path / "r.csv").exists()


def test_a_rank_whose_master_port_never_answers_stops_at_the_same_deadline(tmp_path):
    """MASTER_PORT held by a program that accepts and never answers (another program's port, or a rank 0 that
    hangs): torch's store client would wait for ever; the rank gives up at its deadline in one line."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # the kernel accepts the connection; nobody answers
        env, tmp = _env(tmp_path, RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(listener.getsockname()[1]))
        r = subprocess.run([sys.executable, SCRIPT, *ARGS, "--rendezvous_timeout_s", "2",
                            "--results_csv", str(tmp_path / "r.csv")], env=env, capture_output=True, text=True,
                           timeout=120)
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: torchrun rank 1 of 2: the ranks did not all meet at 127.0.0.1:") and \
        "within 2 s (a program there accepted the connection but never answered" in line, line
    assert os.listdir(tmp) == [] and not (tmp_path / "r.csv").exists()


def test_sigterm_during_the_rendezvous_ends_it_at_once(tmp_path):
    port = _free_port()
    env, tmp = _env(tmp_path, RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    proc = subprocess.Popen([sys.executable, SCRIPT, *ARGS, "--rendezvous_timeout_s", "900", "--results_csv",
                             str(tmp_path / "r.csv")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120  # rank 0 listens on MASTER_PORT once it waits for the others
    while time.time() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)  # the rendezvous waits 900 s: only the signal ends it this soon
    assert proc.returncode == 143, err
    assert err.strip().splitlines() == ["interrupted: every rank stopped; nothing was written (training does not resume)"]
    assert os.listdir(tmp) == [] and not (tmp_path / "r.csv").exists()


def test_ndevices_defaults_to_the_world_size_and_another_value_is_refused(monkeypatch, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_dlrm_tool", SCRIPT)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    seen = {}
    monkeypatch.setattr(tool, "train_dlrm", lambda cfg, *a, **k: seen.setdefault("cfg", cfg) and None)
    for k, v in dict(RANK="0", WORLD_SIZE="3", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500").items():
        monkeypatch.setenv(k, v)
    assert tool.main(["--results_csv", ""]) == 0
    assert seen["cfg"].ndevices == 3
    monkeypatch.undo()
    from neuroshard.training.train import TrainConfig, train_dlrm

    for k, v in dict(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500").items():
        monkeypatch.setenv(k, v)
    with pytest.raises(UserError, match=r"^--ndevices 3 but torchrun started 2 ranks; pass --ndevices 2 or leave it out$"):
        train_dlrm(TrainConfig(ndevices=3, steps=2), None, progress=False)


@pytest.mark.parametrize("argv,line", [
    (["--rendezvous_timeout_s", "0"], "--rendezvous_timeout_s must be a finite number >= 1 and <= 86400, got 0"),
    (["--rendezvous_timeout_s", "nan"], "--rendezvous_timeout_s must be a finite number >= 1 and <= 86400, got nan"),
    (["--rendezvous_timeout_s", "1e9"], "--rendezvous_timeout_s must be a finite number >= 1 and <= 86400, got 1e+09"),
    (["--rendezvous_timeout_s", "soon"], "argument --rendezvous_timeout_s: invalid float value: 'soon' (see "
                                         "train_dlrm.py --help)"),
    (["--dp_sync", "yes"], "argument --dp_sync: must be on or off, got 'yes' (see train_dlrm.py --help)"),
])
def test_bad_new_flags_are_one_line(argv, line, capsys, tmp_path):
    refused(capsys, "tools/train_dlrm.py", *argv, "--results_csv", tmp_path / "r.csv", untouched=[tmp_path],
            match=re.escape(f"error: {line}"))


def test_the_comm_collector_takes_the_world_size_and_refuses_another(tmp_path, monkeypatch):
    """collect_comm_cost_data.py under torchrun: --ndevices left out is the world size, another is one line
    (before any rank waits on a rendezvous or a file is written)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("collect_comm_tool", ROOT / "collect_comm_cost_data.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    seen = {}
    monkeypatch.setattr(tool, "collect_comm", lambda cfg: seen.setdefault("cfg", cfg))
    for k, v in dict(RANK="0", WORLD_SIZE="3", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500").items():
        monkeypatch.setenv(k, v)
    assert tool.main(["--out_dir", str(tmp_path)]) == 0
    assert seen["cfg"].ndevices == 3
    env, tmp = _env(tmp_path, RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    r = subprocess.run([sys.executable, str(ROOT / "collect_comm_cost_data.py"), "--ndevices", "3", "--data_size", "2",
                        "--out_dir", str(tmp_path / "c")], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["error: --ndevices 3 but torchrun started 2 ranks; pass --ndevices 2 or "
                                             "leave it out"]
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())
