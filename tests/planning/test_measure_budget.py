"""--measure does bounded work: the ids it would synthesise are estimated before anything is made and
refused with the numbers over the documented budget; SIGTERM (a timeout) cleans up like Ctrl-C;
--out and --torchrec_plan naming one file is refused before any work."""
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from neuroshard.core.config import ShardTablesConfig
from neuroshard.core.errors import UserError
from neuroshard.planning.shard_tables import shard_tables
from neuroshard.planning.user_data import MEASURE_MAX_LOOKUPS

from conftest import ROOT


def _cfg(tmp_path, text, **kw):
    (tmp_path / "t.csv").write_text("name,rows,dim,pooling_factor\n" + text)
    return ShardTablesConfig(tables=str(tmp_path / "t.csv"), alg="dim_greedy", ndevices=2, max_mem=1.0,
                             out=str(tmp_path / "out" / "plan.json"), **kw)


def test_the_issue_table_is_refused_before_any_id_is_made(tmp_path, monkeypatch):
    import neuroshard.planning.user_data as synthetic  # where the user's tables are synthesised

    monkeypatch.setattr(synthetic, "synthesize_tables", lambda *a, **k: pytest.fail("ids were synthesised"))
    cfg = _cfg(tmp_path, "small,1000,64,100000\nother,10,8,1\n", measure=True)
    with pytest.raises(UserError) as e:
        shard_tables(cfg)
    msg = str(e.value)
    assert "--measure would synthesise 409.6 M ids for a batch of 4096" in msg
    assert "'small' alone 409.6 M at pooling factor 100000" in msg and f"budget of {MEASURE_MAX_LOOKUPS / 1e6:g} M" in msg
    assert not (tmp_path / "out").exists()  # no file, and no empty folder either


def test_the_budget_is_on_the_sum_over_tables(tmp_path):
    per = MEASURE_MAX_LOOKUPS / 4096 / 10  # ten tables each a tenth of the budget: just within; eleven: over
    cfg = _cfg(tmp_path, "".join(f"t{i},1000,8,{per * 1.001}\n" for i in range(10)), measure=True)
    with pytest.raises(UserError, match="--measure would synthesise 64.1 M ids"):
        shard_tables(cfg)
    from neuroshard.data.table_list import load_table_list
    from neuroshard.planning.user_data import check_measure_budget

    (tmp_path / "ok.csv").write_text("name,rows,dim,pooling_factor\n" + "".join(f"t{i},1000,8,{per * 0.999}\n"
                                                                                 for i in range(10)))
    check_measure_budget(load_table_list(tmp_path / "ok.csv"), 4096)  # within: no error


def test_a_batch_the_ranks_do_not_divide_is_refused_before_any_plan(tmp_path, monkeypatch):
    import neuroshard.planning.shard_tables as shard_tables_mod

    monkeypatch.setattr(shard_tables_mod, "shard_task", lambda *a, **k: pytest.fail("a plan was searched"))
    cfg = _cfg(tmp_path, "a,10,8,1\nb,10,8,1\n", measure=True)
    cfg.ndevices = 3
    with pytest.raises(UserError, match="batch of 4096 over the ranks, and 3 do not divide it; use a --ndevices"):
        shard_tables(cfg)
    assert not (tmp_path / "out").exists()  # no file, and no empty folder either


def test_out_and_torchrec_plan_naming_one_file_is_refused(tmp_path):
    cfg = _cfg(tmp_path, "a,10,8,1\n")
    cfg.torchrec_plan = str(tmp_path / "out" / ".." / "out" / "plan.json")
    with pytest.raises(UserError, match="--out and --torchrec_plan both name"):
        shard_tables(cfg)
    assert not (tmp_path / "out").exists()  # no file, and no empty folder either


def _marked_processes(mark):
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if mark.encode() in f.read():
                        found.append(int(pid))
            except OSError:
                pass
    return found


def test_sigterm_during_measure_removes_the_temporary_folder_and_every_worker(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    (tmp_path / "t.csv").write_text("name,rows,dim,pooling_factor\n" + "".join(f"t{i},20000,32,8\n" for i in range(6)))
    mark = f"NEUROSHARD_TEST_MARK={uuid.uuid4().hex}"
    env = {**os.environ, "TMPDIR": str(tmp), mark.split("=")[0]: mark.split("=")[1]}
    proc = subprocess.Popen([sys.executable, str(ROOT / "tools/shard_tables.py"), "--tables", str(tmp_path / "t.csv"),
                             "--alg", "dim_greedy", "--ndevices", "2", "--max_mem", "1", "--measure", "--device", "cpu",
                             "--warmup_iter", "1", "--num_iter", "100000", "--out", str(tmp_path / "plan.json")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and not (list(tmp.glob("neuroshard-measure-*")) and
                                          len(_marked_processes(mark)) >= 3):  # parent + 2 ranks running
        time.sleep(0.3)
    assert list(tmp.glob("neuroshard-measure-*")), "measuring never started"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    deadline = time.time() + 60  # the parent has exited; its ranks' exits are not instant: wait for the event
    while _marked_processes(mark) and time.time() < deadline:
        time.sleep(0.2)
    # importing TorchRec makes torch's own inductor cache folder in TMPDIR (kept by design, empty): not ours
    ours = [p for p in tmp.iterdir() if not p.name.startswith("torchinductor_")]
    assert ours == [], "a temporary folder was left behind"
    assert _marked_processes(mark) == [], "a worker outlived the run"
    assert not (tmp_path / "plan.json").exists()
