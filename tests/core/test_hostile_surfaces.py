"""The shared readers, writer and record log under hostile input (issue 39): a folder, FIFO or device given as an
input file is named as such (never "not found", never a read that does not end); a record log of the older,
unchecksummed format is salvaged record by record or refused with one line naming --salvage; a file set aside
never replaces an earlier one; torch archives that cannot be written give one line, not a traceback; outputs are
checked for collisions and writability before any work, and locked for the run."""
import os
import pickle
import signal

import numpy as np
import pytest

from neuroshard.core import artifacts
from neuroshard.core.artifacts import (OutputLock, RecordLog, atomic_torch_save, check_input_file, check_outputs,
                                       encode, fresh_path, load_pickle, load_torch, read_record_log)
from neuroshard.core.errors import UserError
from neuroshard.data.raw import load_raw
from neuroshard.data.table_list import load_table_list
from neuroshard.sharding.plan_file import read_plan_file
from neuroshard.sharding.torchrec_export import load_torchrec_plan

from conftest import MarkerPayload, disk_full


# ----------------------------------------------------------------------------- inputs that are not files

def _not_files(tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return {"a folder": (folder, "is a folder, not a file"), "a FIFO": (fifo, "is a FIFO (named pipe)"),
            "a device": ("/dev/zero", "is a character device")}


READERS = {
    "pickle": lambda p: load_pickle(p, "task file"),
    "torch": lambda p: load_torch(p, "cost model (compute)"),
    "record log": lambda p: read_record_log(p, "k", "cost data file"),
    "table list": lambda p: load_table_list(p),
    "raw ids": lambda p: load_raw(p, "--ids"),
    "plan file": read_plan_file,
    "TorchRec plan": load_torchrec_plan,
}


@pytest.mark.parametrize("reader", list(READERS))
def test_an_input_that_is_not_a_file_is_named_for_what_it_is(tmp_path, reader):
    for kind, (path, words) in _not_files(tmp_path).items():
        with pytest.raises(UserError) as e:
            READERS[reader](path)  # a FIFO with no writer or /dev/zero would block or never end if read
        msg = str(e.value)
        assert words in msg and str(path) in msg and "not found" not in msg, (kind, msg)
        assert "\n" not in msg
    with pytest.raises(UserError, match="not found"):
        READERS[reader](tmp_path / "nothing")


def test_check_input_file_names_an_unreadable_file(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads every file")
    p = tmp_path / "secret.csv"
    p.write_text("x")
    p.chmod(0)
    with pytest.raises(UserError, match="not readable .*permission denied"):
        check_input_file(p, "--tables file")


@pytest.mark.parametrize("path", [None, 5, ["a.json"]])
def test_check_input_file_names_what_is_not_a_path(path):
    with pytest.raises(UserError, match=r"^plan file: expected a path, got \w+; "):
        check_input_file(path, "plan file")


# ----------------------------------------------------------------------------- older, unchecksummed logs

def _legacy_log(path, n=5):
    """A format-2 log as earlier releases wrote it: the header and each record one plain pickle after another.
    Returns the byte offsets where each object starts."""
    objs = [{"kind": "k", "format_version": 2, "meta": {"a": 1}}] + [{"index": i, "x": np.full(4, float(i))}
                                                                     for i in range(n)]
    parts = [pickle.dumps(encode(o), protocol=pickle.HIGHEST_PROTOCOL) for o in objs]
    path.write_bytes(b"".join(parts))
    return [sum(len(p) for p in parts[:i]) for i in range(len(parts))], parts


def _damage(path, at):
    b = bytearray(path.read_bytes())
    b[at] = ord(b"\xff"[0:1])  # not an opcode: the record cannot load
    path.write_bytes(bytes(b))


def test_an_older_log_damaged_in_the_middle_is_refused_naming_salvage(tmp_path):
    path = tmp_path / "compute_cost_data.pkl"
    starts, _ = _legacy_log(path)
    _damage(path, starts[2] + 2)  # record #2 (index 1); records 2, 3 and 4 follow it
    before = path.read_bytes()
    for reader in (lambda: read_record_log(path, "k", "cost data file"),
                   lambda: RecordLog(path, "k", {"a": 1}, ("a",), "cost data file")):
        with pytest.raises(UserError) as e:
            reader()
        msg = str(e.value)
        assert "record #2" in msg and "older, unchecksummed" in msg and "--salvage" in msg, msg
        assert "keep the 4 good record(s)" in msg and "cut by an interrupted write" not in msg
    assert path.read_bytes() == before  # refused: nothing rewritten


def test_an_older_log_is_salvaged_record_by_record(tmp_path, capsys):
    path = tmp_path / "compute_cost_data.pkl"
    starts, _ = _legacy_log(path)
    _damage(path, starts[2] + 2)
    meta, recs = read_record_log(path, "k", "cost data file", salvage=True)  # a trainer with --salvage
    assert [r["index"] for r in recs] == [0, 2, 3, 4] and meta == {"a": 1}
    assert "--salvage dropped 1 damaged record(s), using the 4 good ones" in capsys.readouterr().err
    with RecordLog(path, "k", {"a": 1}, ("a",), "cost data file", salvage=True) as log:  # a collector
        assert [r["index"] for r in log.records] == [0, 2, 3, 4]
    assert path.read_bytes()[:4] == artifacts.FRAME_MAGIC  # rewritten as checksummed frames
    assert [r["index"] for r in read_record_log(path, "k", "cost data file")[1]] == [0, 2, 3, 4]


def test_an_older_log_cut_short_drops_only_its_last_record_and_says_so(tmp_path, capsys):
    path = tmp_path / "compute_cost_data.pkl"
    _legacy_log(path)
    path.write_bytes(path.read_bytes()[:-9])
    meta, recs = read_record_log(path, "k", "cost data file")
    assert [r["index"] for r in recs] == [0, 1, 2, 3]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a last record cut by an interrupted write is left out; using the 4" in err


def test_an_older_log_whose_last_record_is_damaged_not_cut_is_refused(tmp_path):
    path = tmp_path / "compute_cost_data.pkl"
    starts, _ = _legacy_log(path)
    _damage(path, starts[-1] + 2)
    with pytest.raises(UserError, match="record #5 .*older, unchecksummed log is damaged; rerun with --salvage"):
        read_record_log(path, "k", "cost data file")


def test_an_older_log_asking_for_code_is_refused_as_unsafe(tmp_path):
    path = tmp_path / "compute_cost_data.pkl"
    _, parts = _legacy_log(path)
    marker = tmp_path / "ran"
    path.write_bytes(b"".join(parts[:3]) + pickle.dumps(MarkerPayload(marker)) + b"".join(parts[3:]))
    with pytest.raises(UserError, match="not a safe neuroshard"):
        read_record_log(path, "k", "cost data file", salvage=True)
    assert not marker.exists()


# ----------------------------------------------------------------------------- set-aside files

def test_a_file_set_aside_never_replaces_an_earlier_one(tmp_path):
    log = tmp_path / "e.progress.pkl"
    assert fresh_path(log, ".bad") == tmp_path / "e.progress.pkl.bad"
    (tmp_path / "e.progress.pkl.bad").write_text("first")
    (tmp_path / "e.progress.pkl.bad.1").write_text("second")
    assert fresh_path(log, ".bad") == tmp_path / "e.progress.pkl.bad.2"


def test_eval_progress_log_set_aside_twice_keeps_both(tmp_path, capsys):
    from neuroshard.experiments.evaluate import EVAL_PROGRESS_KIND, _open_progress

    settings = {"batch_size": 8, "ndevices": 2}
    path = tmp_path / "e.csv.progress.pkl"
    good = {"alg": "dim_greedy", "task": 0, "plan": {"splits": [0, 1]}, "compute_ms": [1.0, 2.0],
            "fw_ms": [0.5, 0.5], "bw_ms": [0.25, 0.25], "round_costs": [3.1]}
    for round_ in range(2):
        with RecordLog(path, EVAL_PROGRESS_KIND, settings, tuple(settings), "eval progress log") as log:
            log.append({**good, "task": "bad"})
        _open_progress(path, settings, 2, salvage=False).close()
    err = capsys.readouterr().err
    assert f"as {path}.bad," in err and f"as {path}.bad.1," in err
    assert (tmp_path / "e.csv.progress.pkl.bad").is_file() and (tmp_path / "e.csv.progress.pkl.bad.1").is_file()


# ----------------------------------------------------------------------------- torch archives and a full disk

def test_a_torch_archive_on_a_full_disk_is_one_line_and_leaves_the_old_file(tmp_path, monkeypatch):
    import torch

    path = tmp_path / "plan.calibration.pt"
    atomic_torch_save(path, {"w": torch.zeros(3)})
    before = path.read_bytes()

    disk_full(monkeypatch)
    with pytest.raises(UserError, match=r"^disk full while writing .*plan.calibration.pt; the previous file"):
        atomic_torch_save(path, {"w": torch.ones(1000)})
    monkeypatch.undo()
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["plan.calibration.pt"]


# ----------------------------------------------------------------------------- outputs

def test_outputs_that_collide_or_replace_an_input_are_refused_before_work(tmp_path):
    (tmp_path / "t.csv").write_text("x")
    with pytest.raises(UserError, match="--out and --torchrec_plan both name .*p.json; one would replace the other"):
        check_outputs({"--out": tmp_path / "p.json", "--torchrec_plan": tmp_path / "sub/../p.json"})
    os.link(tmp_path / "t.csv", tmp_path / "hard.csv")
    with pytest.raises(UserError, match="--out .*hard.csv is also the input --tables; writing it would replace"):
        check_outputs({"--out": tmp_path / "hard.csv"}, {"--tables": tmp_path / "t.csv"})
    assert sorted(os.listdir(tmp_path)) == ["hard.csv", "t.csv"]


def test_outputs_that_cannot_be_written_are_refused_before_work(tmp_path):
    (tmp_path / "a_file").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    cases = {tmp_path / "a_file" / "plan.json": "a_file is a file, not a folder", tmp_path: "is a folder",
             tmp_path / "fifo": "is a FIFO (named pipe), not a file to write"}
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        cases[ro / "plan.json"] = "cannot write there (Permission denied)"
    for path, words in cases.items():
        with pytest.raises(UserError) as e:
            check_outputs({"--out": path})
        assert words in str(e.value) and "choose another --out" in str(e.value), str(e.value)
    assert not any(p.name.startswith(".") for p in tmp_path.rglob("*"))  # no probe left behind


def test_a_second_run_on_the_same_output_stops_with_one_line(tmp_path):
    out = tmp_path / "plan.json"
    with OutputLock([("--out", out)]):
        assert (tmp_path / ".plan.json.lock").read_text() == str(os.getpid())
        with pytest.raises(UserError, match=rf"--out .*plan.json is being written by another run \(pid {os.getpid()}\)"
                                            "; wait for it to finish or choose another --out"):
            OutputLock([("--out", out)])
    assert not (tmp_path / ".plan.json.lock").exists()  # released and removed
    (tmp_path / ".plan.json.lock").write_text("12345")  # left by a killed run: its lock died with it
    with OutputLock([("--out", out)]):
        pass
    assert os.listdir(tmp_path) == []


def test_a_lock_file_that_is_a_fifo_is_one_line(tmp_path):
    """A FIFO planted where the lock goes: one line naming it (it crashed at ftruncate), and it is left as it is."""
    os.mkfifo(tmp_path / ".plan.json.lock")
    with pytest.raises(UserError, match=r"--out .*plan.json: its lock .*\.plan\.json\.lock is not a plain file; "
                                        "remove it, or choose another --out"):
        OutputLock([("--out", tmp_path / "plan.json")])
    assert os.listdir(tmp_path) == [".plan.json.lock"]


def test_a_path_holding_newlines_or_escapes_stays_one_error_line(tmp_path, capsys):
    """A file name may hold a newline, a carriage return or a terminal escape: the error naming it is still one
    line on stderr (they are written as escapes), and the script exits 2; argparse's errors too."""
    from neuroshard.core.cli import ArgumentParser, run_main

    evil = tmp_path / "a\nerror: forged line\r\x1b[2Kb.csv"

    def main(argv):
        raise UserError(f"{evil}: not a results file; choose another")

    before = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as e:
            run_main(main)
    finally:
        signal.signal(signal.SIGTERM, before)  # run_main installs its own handler
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("error: ")
    assert "a\\nerror: forged line\\r\\x1b[2Kb.csv: not a results file" in err
    parser = ArgumentParser(prog="x.py")
    parser.add_argument("--mode", choices=("a", "b"))
    with pytest.raises(SystemExit):
        parser.parse_args(["--mode", "c\nd"])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "c\\nd" in err
