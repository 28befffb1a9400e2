"""tools/shard_tables.py under hostile input and faults (issue 39), run in-process: outputs that collide or cannot
be written and a second run on one --out stop before any work with one line; a calibration whose save fails
is kept (saved elsewhere, or its measurements in the plan) and the plan is still written; costs that cannot be
true are never printed or written; a calibration is reused for what it measured, replaced with a note, and
refused when edited; fix lines name commands that work."""
import functools
import json
import os
import re
import tempfile

import numpy as np
import pytest
import torch

import neuroshard.planning.calibrate as cal_mod
import neuroshard.planning.calibrated_models as cm
import neuroshard.planning.calibration_file as cal_file
import neuroshard.planning.shard_tables as pt
from neuroshard.core.artifacts import OutputLock
from neuroshard.core.errors import UserError, write_error
from neuroshard.core.costs import Cluster, Cost
from neuroshard.data.table_list import load_table_list
from neuroshard.planning.calibration_file import (calibration_inputs, check_reference, find_calibration,
                                                  save_calibration)
from neuroshard.hardware.backends import resolve_hardware
from neuroshard.sharding.simulator import Simulator

from analytic_models import save_hand_models
from conftest import disk_full, no_space, refused, run_in_process, tree

TABLES = """name,rows,dim,pooling_factor
user,18000,64,6
item,25000,64,1
city,900,16,1
history,2500,32,18
day,400,8,1
tags,7000,32,3
"""

pytestmark = pytest.mark.filterwarnings("ignore::scipy.stats.ConstantInputWarning")  # hand models' flat predictions

SCRIPT = "tools/shard_tables.py"
CALIBRATE = ("--calibrate", 15, "--calibrate_comm", 15)


def run(capsys, *argv) -> tuple[int, str, str]:
    """tools/shard_tables.py ARGV in this process (conftest.run_in_process): (exit code, stdout, stderr)."""
    return run_in_process(capsys, SCRIPT, *argv)


@pytest.fixture
def setup(tmp_path):
    (tmp_path / "t.csv").write_text(TABLES)
    models = save_hand_models(tmp_path / "models", 2, {"batch_size": 256, "device": "cpu"})
    args = ["--tables", tmp_path / "t.csv", "--ndevices", 2, "--max_mem", 0.02, "--device", "cpu",
            "--compute_model", models / "compute.pt", "--fw_comm_model", models / "comm_2_fw.pt",
            "--bw_comm_model", models / "comm_2_bw.pt"]
    return tmp_path, [str(a) for a in args]


@pytest.fixture
def fake_measuring(monkeypatch):
    """Calibration measures nothing: a shard costs 0.5 ms + 1 ms per 32 columns, an all-to-all grows with its dims."""
    calls = []

    def shards(ds, hw, batch_size, shards, warmup, iters):
        calls.append(len(shards))
        return np.array([0.5 + sum(d for d in dims) / 32.0 for _, dims in shards])

    def layouts(layouts, N, batch_size, device, warmup, iters, mp_keep=None):
        dims = np.array([d for d, _ in layouts], np.float64)
        return 0.5 + dims / 64.0, 0.4 + dims / 80.0

    monkeypatch.setattr(cm, "CalibrationConfig", functools.partial(cal_mod.CalibrationConfig, steps=20))
    monkeypatch.setattr(cal_mod, "measure_shards", shards)
    monkeypatch.setattr(cal_mod, "measure_layouts", layouts)
    return calls


def _no_work(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("work started before the outputs were checked")

    monkeypatch.setattr(pt, "load_table_list", refuse)
    monkeypatch.setattr(cm, "calibrate", refuse)


# ----------------------------------------------------------------------------- outputs, before any work

def test_outputs_that_collide_are_refused_before_any_work(setup, capsys, monkeypatch):
    tmp, args = setup
    _no_work(monkeypatch)
    both = "; one would replace the other: give each its own file"
    replaces = "; writing it would replace what this run reads: choose another"
    cases = [(["--out", tmp / "p.json", "--torchrec_plan", tmp / "p.calibration.pt", "--calibrate", 15],
              f"--torchrec_plan and the calibration file beside --out both name {tmp}/p.calibration.pt{both}"),
             (["--out", tmp / "p.json", "--torchrec_plan", tmp / "p.json"],
              f"--out and --torchrec_plan both name {tmp}/p.json{both}"),
             (["--out", tmp / "t.csv"], f"--out {tmp}/t.csv is also the input --tables{replaces} --out"),
             (["--out", tmp / "p.json", "--torchrec_plan", tmp / "models/compute.pt"],
              f"--torchrec_plan {tmp}/models/compute.pt is also the input --compute_model{replaces} --torchrec_plan")]
    for extra, line in cases:
        refused(capsys, SCRIPT, *args, *extra, match=re.escape(f"error: {line}"), untouched=[tmp])


def test_outputs_that_cannot_be_written_are_refused_before_any_work(setup, capsys, monkeypatch):
    tmp, args = setup
    _no_work(monkeypatch)
    (tmp / "p.calibration.pt").mkdir()
    os.mkfifo(tmp / "fifo.json")
    cases = [(["--out", tmp / "p.json", "--calibrate", 15],
              f"the calibration file beside --out {tmp}/p.calibration.pt is a folder; move it away or choose another "
              "--out"),
             (["--out", tmp / "t.csv" / "p.json"],
              f"--out {tmp}/t.csv/p.json: {tmp}/t.csv is a file, not a folder; choose another --out"),
             (["--out", tmp / "models"], f"--out {tmp}/models is a folder; choose another --out"),
             (["--out", tmp / "fifo.json"],
              f"--out {tmp}/fifo.json is a FIFO (named pipe), not a file to write; choose another --out"),
             (["--out", "/proc/neuroshard/p.json"],
              "--out /proc/neuroshard/p.json: cannot write there (No such file or directory); choose another --out")]
    for extra, line in cases:
        refused(capsys, SCRIPT, *args, *extra, match=re.escape(f"error: {line}"), untouched=[tmp])


def test_a_plan_file_replaces_only_a_plan_file(setup, capsys, monkeypatch):
    """--out named as a calibration file, or naming another kind of file already there: refused before any work,
    whether or not --calibrate is given; an older plan is replaced as before."""
    tmp, args = setup
    assert run(capsys, *args, "--alg", "dim_greedy", "--out", tmp / "plan.json", "--torchrec_plan", tmp / "tr.json")[0] == 0
    (tmp / "plan.calibration.pt").write_bytes(b"PK calibration")
    (tmp / "notes.json").write_text('{"kind": "mine"}')
    _no_work(monkeypatch)
    before = tree(tmp)
    cases = [(["--out", tmp / "plan.calibration.pt"], "--out {0}/plan.calibration.pt is the name of the calibration "
                                                      "file of the plan {0}/plan.json (--calibrate saves it there)"),
             (["--out", tmp / "new.calibration.pt"], "e.g. --out {0}/new.json"),
             (["--out", tmp / "p.json", "--torchrec_plan", tmp / "plan.calibration.pt"], "--torchrec_plan {0}/plan"),
             (["--out", tmp / "notes.json"], "--out {0}/notes.json exists and is not a neuroshard.plan file"),
             (["--out", tmp / "p.json", "--torchrec_plan", tmp / "plan.json"],
              "--torchrec_plan {0}/plan.json exists and is not a neuroshard.torchrec_plan file")]
    for extra, words in cases:
        refused(capsys, SCRIPT, *args, "--alg", "dim_greedy", *extra, untouched=[tmp],
                match=f"error: .*{re.escape(words.format(tmp))}.*")
    assert tree(tmp) == before
    monkeypatch.undo()
    (tmp / "plan.calibration.pt").unlink()
    code, out, err = run(capsys, *args, "--alg", "dim_greedy", "--out", tmp / "plan.json", "--torchrec_plan",
                         tmp / "tr.json")
    assert code == 0, err


@pytest.mark.parametrize("extra,words", [
    (["--calibrate_comm", 15], "--calibrate_comm has no effect without --calibrate; add --calibrate or drop"),
    (["--no_race"], "--no_race has no effect without --measure"),
    (["--measure_budget_s", 30], "--measure_budget_s has no effect without --measure"),
    (["--measure_top", 4], "--measure_top has no effect without --measure"),
    (["--dims", 8], "--dims has no effect without --ids; add --ids or drop --dims")])
def test_a_flag_without_the_flag_it_needs_is_refused(setup, capsys, monkeypatch, extra, words):
    tmp, args = setup
    _no_work(monkeypatch)
    refused(capsys, SCRIPT, *args, *extra, "--out", tmp / "p.json", untouched=[tmp],
            match=f"error: {re.escape(words)}.*")


def test_a_second_run_on_the_same_out_stops_with_one_line(setup, capsys):
    tmp, args = setup
    with OutputLock([("--out", tmp / "p.json")]):  # the first run, still running
        refused(capsys, SCRIPT, *args, "--alg", "dim_greedy", "--out", tmp / "p.json", untouched=[tmp],
                match=re.escape(f"error: --out {tmp}/p.json is being written by another run (pid {os.getpid()}); "
                                "wait for it to finish or choose another --out"))
    code, out, err = run_in_process(capsys, SCRIPT, *args, "--alg", "dim_greedy", "--out", tmp / "p.json")  # runs
    assert code == 0 and (tmp / "p.json").is_file() and not (tmp / ".p.json.lock").exists()


@pytest.mark.parametrize("writes_ok", [0, 1])  # a disk full at the lock, or at the plan after it
def test_a_full_disk_is_one_line_and_leaves_no_lock(setup, capsys, monkeypatch, writes_ok):
    tmp, args = setup
    assert run(capsys, *args, "--alg", "dim_greedy", "--out", tmp / "p.json")[0] == 0
    before = tree(tmp)
    disk_full(monkeypatch, writes_ok)
    refused(capsys, SCRIPT, *args, "--alg", "dim_greedy", "--out", tmp / "p.json", untouched=[tmp], quiet=False,
            match="error: .*disk full.*free some space.*")
    monkeypatch.undo()
    assert tree(tmp) == before and not list(tmp.glob(".*"))


@pytest.mark.parametrize("payload", ["MarkerPayload", "TorchBytesPayload"])
@pytest.mark.parametrize("gz", [False, True])
def test_a_hostile_ids_file_runs_nothing_and_the_line_gives_no_unsafe_advice(setup, capsys, payload, gz):
    """A pickle payload as --ids: refused without running it, and the line never repeats torch's advice to load
    it again with weights_only=False (as cost-model files are refused)."""
    import gzip
    import io

    import conftest

    tmp, args = setup
    marker = tmp / "ran"
    buf = io.BytesIO()
    torch.save(getattr(conftest, payload)(marker), buf)
    ids = tmp / ("ids.pt.gz" if gz else "ids.pt")
    ids.write_bytes(gzip.compress(buf.getvalue()) if gz else buf.getvalue())
    refused(capsys, SCRIPT, "--ids", ids, "--dims", 8, *args[2:], "--alg", "dim_greedy", "--out", tmp / "p.json",
            untouched=[tmp], match=f"error: .*{re.escape(f'{ids} is not a torch.save' + chr(39) + 'd DLRM dataset')} "
                                   r"\(it holds objects other than tensors(?!.*weights_only)(?!.*trust the source).*")
    assert not marker.exists()


def test_a_measure_of_one_round_writes_strict_json(setup, capsys, monkeypatch):
    """One round gives no interval (NaN): plan.json holds null there, never a NaN literal strict readers refuse."""
    from neuroshard.planning.measure import summarize

    tmp, args = setup

    def one_round(tl, cluster, cands, hw, batch, mcfg, ids=None, **kw):
        for i, c in enumerate(cands):
            c.round_ms = [1.0 + i]
        return summarize(cands, 0.1, mcfg, log=lambda *_: None)

    monkeypatch.setattr(pt, "measure_candidates", one_round)
    code, out, err = run(capsys, *args, "--out", tmp / "p.json", "--measure")
    assert code == 0, err
    text = (tmp / "p.json").read_text()
    rec = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in plan.json"))
    assert rec["measured"]["candidates"] and "null" in text


# ----------------------------------------------------------------------------- fix lines

def test_fix_lines_name_commands_that_work(setup, capsys):
    tmp, args = setup
    refused(capsys, SCRIPT, "--tables", tmp / "t.csv", "--ndevices", 2, "--mp_keep", 0.25, "--compute_model",
            tmp / "models/compute.pt", "--out", tmp / "p.json", untouched=[tmp], cwd=tmp, match=re.escape(
                "error: cost models not found: models/comm_2_mp0.25_fw.pt, models/comm_2_mp0.25_bw.pt; train them "
                "with steps 3-4: python collect_compute_cost_data.py && python train_compute_cost_model.py && python "
                "collect_comm_cost_data.py --ndevices 2 --mp_keep 0.25 && python train_comm_cost_model.py --ndevices 2 "
                "--mp_keep 0.25; or pass --compute_model/--fw_comm_model/--bw_comm_model"))
    no_plan = "found no plan within 2 x 0.001 GB for 0.011 GB of tables; raise --max_mem or add devices"
    refused(capsys, SCRIPT, *args, "--max_mem", 0.001, "--out", tmp / "p.json", untouched=[tmp], quiet=False,
            match=re.escape(f"error: --alg neuroshard {no_plan}"))
    refused(capsys, SCRIPT, *args, "--max_mem", 0.001, "--alg", "dim_greedy", "--out", tmp / "p.json",
            untouched=[tmp], quiet=False,
            match=re.escape(f"error: --alg dim_greedy {no_plan}, or try --alg neuroshard"))
    # a plan of the user's own that does not fit: how much it needs, not another --alg
    assert run(capsys, *args, "--alg", "dim_greedy", "--out", tmp / "mine.json")[0] == 0
    refused(capsys, SCRIPT, *args, "--max_mem", 0.006, "--alg", f"plan:{tmp}/mine.json", "--out", tmp / "p.json",
            untouched=[tmp], quiet=False,
            match=f"error: (?!.*--alg neuroshard).*{re.escape(f'the plan in {tmp}/mine.json needs ')}.*"
                  "raise --max_mem to at least.*")


# ----------------------------------------------------------------------------- costs that cannot be true

# where it is found: the first candidate compared (dim_greedy's), or, for a negative part the comparison allows
# (the device's total is above 0), the plan handed out
@pytest.mark.parametrize("bad,why,plan", [(1e30, "1e+30 ms, more than 1e+06 ms", "dim_greedy"),
                                          (-0.016, "-0.016 ms, a negative cost", "size_lookup_greedy"),
                                          (float("nan"), "nan ms", "dim_greedy")])
def test_predicted_costs_that_cannot_be_true_are_never_written(setup, capsys, monkeypatch, bad, why, plan):
    tmp, args = setup
    real = Simulator.plan_cost

    def plan_cost(self, task, plan, cluster=None):
        c = real(self, task, plan, cluster)
        return Cost(np.full_like(c.compute_ms, bad), c.fw_ms, c.bw_ms)

    monkeypatch.setattr(Simulator, "plan_cost", plan_cost)
    out = refused(capsys, SCRIPT, *args, "--out", tmp / "p.json", untouched=[tmp], quiet=False, match=re.escape(
        f"error: the cost models predict a compute cost that cannot be true ({why}) for {plan}'s plan; retrain them on "
        "more cost data or fine-tune them to these tables (--calibrate K); or plan without cost models (e.g. --alg "
        "size_lookup_greedy)"))
    assert "per device" not in out


# ----------------------------------------------------------------------------- calibration files

def test_a_failed_calibration_save_keeps_the_calibration_and_writes_the_plan(setup, capsys, monkeypatch,
                                                                             fake_measuring):
    tmp, args = setup
    spare_dir = tmp / "spare"
    spare_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spare_dir))
    real = cm.save_calibration

    def disk_full_beside_out(path, sim, report):
        if path.parent == tmp:
            raise write_error(no_space(), path)
        return real(path, sim, report)

    monkeypatch.setattr(cm, "save_calibration", disk_full_beside_out)
    code, out, err = run_in_process(capsys, SCRIPT, *args, "--out", tmp / "p.json", *CALIBRATE)
    assert code == 0, err
    spare = spare_dir / "neuroshard-p.calibration.pt"
    warn = [l for l in err.splitlines() if l.startswith("warning:")]
    assert warn == [f"warning: could not save the calibration to {tmp}/p.calibration.pt (disk full); saved it to "
                    f"{spare} instead and planned with it: move it back (mv {spare} {tmp}/p.calibration.pt) and later "
                    "runs reuse it"], err
    rec = json.loads((tmp / "p.json").read_text())
    assert rec["calibration"]["saved_to"] == str(spare) and len(rec["calibration"]["measured"]["compute_ms"]) == 15
    os.replace(spare, tmp / "p.calibration.pt")  # as the line says: later runs reuse it
    code, out, err = run_in_process(capsys, SCRIPT, *args, "--out", tmp / "p2.json")
    assert code == 0 and "reusing the calibrated cost models" not in out  # beside p2.json: not this one
    os.replace(tmp / "p.calibration.pt", tmp / "p2.calibration.pt")
    code, out, err = run_in_process(capsys, SCRIPT, *args, "--out", tmp / "p2.json")
    assert code == 0 and "reusing the calibrated cost models" in out, out + err

    # no space anywhere: the plan still holds every measurement
    monkeypatch.setattr(cm, "save_calibration", lambda path, sim, report: (_ for _ in ()).throw(
        write_error(no_space(), path)))
    code, out, err = run_in_process(capsys, SCRIPT, *args, "--out", tmp / "p3.json", *CALIBRATE)
    assert code == 0, err
    warn = [l for l in err.splitlines() if l.startswith("warning:")]
    assert len(warn) == 1 and "nor to" in warn[0] and f"go into {tmp}/p3.json (calibration.measured)" in warn[0]
    rec = json.loads((tmp / "p3.json").read_text())
    assert rec["calibration"]["saved_to"] is None and len(rec["calibration"]["measured"]["shards"]) == 15
    assert not (tmp / "p3.calibration.pt").exists() and not list(tmp.glob(".*.tmp"))


def test_a_calibration_for_other_tables_is_replaced_with_a_note(setup, capsys, fake_measuring):
    tmp, args = setup
    assert run_in_process(capsys, SCRIPT, *args, "--out", tmp / "p.json", *CALIBRATE)[0] == 0
    (tmp / "t2.csv").write_text(TABLES.replace("tags,7000", "tags,9000"))
    other = [a if a != str(tmp / "t.csv") else str(tmp / "t2.csv") for a in args]
    code, out, err = run_in_process(capsys, SCRIPT, *other, "--out", tmp / "p.json")
    notes = [l for l in out.splitlines() if l.startswith("note:") and "calibrat" in l]
    assert code == 0 and notes == [f"note: {tmp}/p.calibration.pt was calibrated for other tables, hardware or models "
                                   "(tables differ); not used (pass --calibrate K to replace it)"], out
    code, out, err = run_in_process(capsys, SCRIPT, *other, "--out", tmp / "p.json", *CALIBRATE)
    notes = [l for l in out.splitlines() if l.startswith("note:") and "calibrat" in l]
    assert code == 0 and notes == [f"note: replacing {tmp}/p.calibration.pt, which was calibrated for other tables, "
                                   "hardware or models (tables differ)"], out
    assert fake_measuring == [15, 15]
    code, out, err = run_in_process(capsys, SCRIPT, *other, "--out", tmp / "p.json")
    assert "reusing the calibrated cost models" in out


def test_a_damaged_calibration_is_refused_but_never_blocks_the_run_that_replaces_it(setup, capsys, fake_measuring):
    """One byte flipped in the calibration beside --out: a plain run refuses it in one line that names both fixes;
    --calibrate K replaces it with a note, and the next plain run reuses the new one."""
    tmp, args = setup
    assert run_in_process(capsys, SCRIPT, *args, "--out", tmp / "p.json", *CALIBRATE)[0] == 0
    path = tmp / "p.calibration.pt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    refused(capsys, SCRIPT, *args, "--out", tmp / "p.json", untouched=[tmp], quiet=False,
            match=re.escape(f"error: {path} is damaged (a checksum fails in ") + r"archive/data/\d+" + re.escape(
                "); write it again with the neuroshard step that wrote it (--calibrate K replaces it)"))
    code, out, err = run_in_process(capsys, SCRIPT, *args, "--out", tmp / "p.json", *CALIBRATE)
    assert code == 0 and f"note: replacing {path}, which is not a usable calibration: " in out, err
    assert fake_measuring == [15, 15]
    code, out, err = run_in_process(capsys, SCRIPT, *args, "--out", tmp / "p.json")
    assert code == 0 and "reusing the calibrated cost models" in out


def _calibration(tmp, capsys, args):
    assert run_in_process(capsys, SCRIPT, *args, "--out", tmp / "p.json", *CALIBRATE)[0] == 0
    path = tmp / "p.calibration.pt"
    return path, torch.load(path, weights_only=True)


def test_reuse_is_decided_by_what_was_measured_not_an_edited_string(setup, capsys, fake_measuring):
    tmp, args = setup
    path, obj = _calibration(tmp, capsys, args)
    tl = load_table_list(tmp / "t.csv")
    hw = resolve_hardware("cpu", "auto").describe()
    paths = [tmp / "models/compute.pt", tmp / "models/comm_2_fw.pt", tmp / "models/comm_2_bw.pt"]
    mine = calibration_inputs(tl.task, hw, 256, 2, 0.02, paths)
    (tmp / "t2.csv").write_text(TABLES.replace("user,18000", "user,21000"))
    theirs = calibration_inputs(load_table_list(tmp / "t2.csv").task, hw, 256, 2, 0.02, paths)
    # the fingerprint string edited to the other task's: still made for these tables, so not reused for those
    obj["report"]["fingerprint"] = cal_file.fingerprint_of(theirs)
    torch.save(obj, path)
    assert find_calibration(path, theirs)[1] == ["tables"]
    # what it was made for edited too: the content no longer matches its digest
    obj["report"]["made_for"] = theirs
    torch.save(obj, path)
    with pytest.raises(UserError, match="was changed after it was saved .*delete it to calibrate again"):
        find_calibration(path, theirs)
    out = refused(capsys, SCRIPT, *args, "--out", tmp / "p.json", untouched=[tmp], quiet=False, match=re.escape(
        f"error: {path} is damaged or was changed after it was saved (what it holds no longer matches its digest, or "
        "it has none); delete it to calibrate again (--calibrate K replaces it)"))
    assert "per device" not in out
    assert find_calibration(tmp / "none.pt", mine) == (None, [])


def test_calibrated_models_edited_around_the_digest_are_refused(setup, capsys, fake_measuring):
    """The digest covers what was measured, not the weights: a compute bias of 1e30 written into the calibrated
    model is refused by read_calibration (the API) and shard_tables alike, in one line naming the file."""
    from neuroshard.planning.calibration_file import read_calibration

    tmp, args = setup
    path, obj = _calibration(tmp, capsys, args)
    obj["models"]["compute"]["state_dict"]["head.2.bias"] += 1e30
    torch.save(obj, path)
    words = f"{path}: its calibrated cost models predict a compute cost that cannot be true (1e+30 ms"
    with pytest.raises(UserError, match=re.escape(words)):
        read_calibration(path)
    out = refused(capsys, SCRIPT, *args, "--out", tmp / "p.json", quiet=False,
                  match=f"error: .*{re.escape(words)}.*{re.escape('(--calibrate K replaces it)')}.*")
    assert "per device" not in out


@pytest.mark.parametrize("bad", [1e30, float("nan")])
def test_no_candidate_cost_that_cannot_be_true_is_printed(setup, capsys, monkeypatch, bad):
    """Only a heuristic's plan is rated absurdly: the comparison that would print it is refused in one line."""
    tmp, args = setup
    real = Simulator.plan_cost
    calls = []

    def plan_cost(self, task, plan, cluster=None):
        c = real(self, task, plan, cluster)
        calls.append(1)
        return Cost(np.full_like(c.compute_ms, bad), c.fw_ms, c.bw_ms) if len(calls) == 2 else c

    monkeypatch.setattr(Simulator, "plan_cost", plan_cost)
    out = refused(capsys, SCRIPT, *args, "--out", tmp / "p.json", untouched=[tmp], quiet=False,
                  match="error: .*the cost models predict a compute cost that cannot be true.*'s plan;.*")
    assert "simulated ms" not in out


def test_a_drift_reference_must_be_what_calibration_measured(setup, capsys, fake_measuring):
    tmp, args = setup
    path, obj = _calibration(tmp, capsys, args)
    report = obj["report"]
    tl = load_table_list(tmp / "t.csv")
    cluster = Cluster(2, 0.02)
    check_reference(report["reference"], tl.rows, cluster, "f", tl.task.dims, report["measured"])
    first = report["reference"][0]
    (t, d), rest = first["devices"][0][0], first["devices"][0][1:]
    for bad in ({**first, "compute_ms": [v * 3 for v in first["compute_ms"]]},  # a false drift of x3
                {**first, "devices": [[[t, d - 2], *rest], first["devices"][1]]},  # not a multiple of 4
                {**first, "devices": [[[t, d * 2], *rest], first["devices"][1]]} if d * 2 > tl.task.dims[t] else None,
                {**first, "bw_ms": [1e9, 1.0]}):
        if bad is None:
            continue
        with pytest.raises(UserError, match="damaged drift reference"):
            check_reference([bad], tl.rows, cluster, "f", tl.task.dims, report["measured"])
        # saved by the program itself (so its digest matches): still refused when read, before any planning
        save_calibration(path, Simulator.load(*(tmp / "models" / n for n in ("compute.pt", "comm_2_fw.pt",
                                                                           "comm_2_bw.pt")), num_devices=2),
                         {**report, "reference": [bad, *report["reference"][1:]]})
        refused(capsys, SCRIPT, *args, "--out", tmp / "p.json", untouched=[tmp], quiet=False, match=re.escape(
            f"error: {path} holds a damaged drift reference; delete it to calibrate again (--calibrate K replaces it)"))
    for bad in ({"compute_ms": [-1.0] * 15}, {"input_ms": [[1.0, float("nan")]]}, {"input_ms": [1.0, 2.0]},
                {"input_ms": [[1.0, 2.0, 3.0]]}):
        with pytest.raises(UserError, match="holds damaged measurements"):
            cal_file.check_measured({**report["measured"], **bad}, tl.task, cluster, "f")


def test_eval_simulator_never_writes_a_simulated_cost_that_cannot_be_true(capsys):
    """Non-finite or huge: refused in one line. Negative (a barely trained model, or one asked outside its data):
    written as predicted, since eval_simulator evaluates the simulator as it is, with one warning for the run."""
    from neuroshard.experiments.evaluate import checked_cost, warn_negative

    good = Cost(np.array([1.0, 2.0]), np.array([0.5, 0.5]), np.array([0.2, 0.0]))
    negative = []
    assert checked_cost(good, ["m.pt"], {"task": 3, "alg": "neuroshard"}, negative) is good and negative == []
    for bad in (Cost(np.array([1e30, 1.0]), good.fw_ms, good.bw_ms), Cost(good.compute_ms, np.array([np.nan, 1]),
                                                                          good.bw_ms)):
        with pytest.raises(UserError, match=r"the cost models \(m.pt\) predict a .* cost that cannot be true .*"
                                            "for task 3's neuroshard plan; retrain them"):
            checked_cost(bad, ["m.pt"], {"task": 3, "alg": "neuroshard"}, negative)
    low = Cost(good.compute_ms, np.array([-0.016, 1]), good.bw_ms)
    assert checked_cost(low, ["m.pt"], {"task": 3, "alg": "neuroshard"}, negative) is low
    warn_negative(negative, ["m.pt"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "predict a negative cost for 1 plan(s) (neuroshard task 3)" in err[0]
