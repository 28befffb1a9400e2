"""Artifacts: plain-data pickles that cannot run code, atomic writes, append-only locked logs."""
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from neuroshard.core.artifacts import (RecordLog, frame, atomic_write_pickle, decode, encode, load_pickle, load_torch,
                                       read_record_log)
from neuroshard.core.errors import UserError

from conftest import MarkerPayload, hostile_objects


def test_plain_data_arrays_and_tensors_round_trip(tmp_path):
    obj = {"a": [1, 2.5, "x", (3, None)], "arr": np.arange(6, dtype=np.float32).reshape(2, 3),
           "t": torch.arange(4), "s": {1, 2}, "np_scalar": np.float64(1.5), "b": b"\x00\x01"}
    atomic_write_pickle(tmp_path / "ok.pkl", obj)
    back = load_pickle(tmp_path / "ok.pkl")
    assert back["a"] == obj["a"] and back["s"] == {1, 2} and back["b"] == b"\x00\x01"
    assert np.array_equal(back["arr"], obj["arr"]) and back["arr"].dtype == np.float32
    assert torch.equal(back["t"], obj["t"]) and back["np_scalar"] == 1.5
    # the stored pickle references no global at all
    raw = (tmp_path / "ok.pkl").read_bytes()
    assert b"numpy" not in raw and b"torch" not in raw


def test_object_arrays_are_never_stored_or_loaded():
    with pytest.raises(TypeError):
        encode(np.array([object()], dtype=object))
    with pytest.raises(pickle.UnpicklingError):
        decode({"__ndarray__": ("|O", (1,), b"\x00" * 8)})


@pytest.mark.parametrize("which", range(3))
def test_hostile_pickle_runs_no_code(tmp_path, which):
    marker = tmp_path / "marker"
    with open(tmp_path / "bad.pkl", "wb") as f:
        pickle.dump(hostile_objects(marker)[which], f)
    with pytest.raises(UserError, match="not a safe neuroshard"):
        load_pickle(tmp_path / "bad.pkl")
    assert not marker.exists()


def test_hostile_torch_file_runs_no_code(tmp_path):
    marker = tmp_path / "marker"
    torch.save({"kind": "compute_cost_model", "state_dict": MarkerPayload(marker)}, tmp_path / "m.pt")
    with pytest.raises(UserError, match="not a loadable"):
        load_torch(tmp_path / "m.pt", "cost model")
    assert not marker.exists()


def test_written_files_get_the_mode_open_would_give(tmp_path):
    """Not mkstemp's 0600: a results folder stays readable by the people the umask allows."""
    from neuroshard.core.artifacts import atomic_write_text

    old = os.umask(0o027)
    try:
        atomic_write_text(tmp_path / "a.md", "x")
        with open(tmp_path / "b.md", "w") as f:
            f.write("x")
    finally:
        os.umask(old)
    assert (tmp_path / "a.md").stat().st_mode & 0o777 == (tmp_path / "b.md").stat().st_mode & 0o777 == 0o640


def test_failed_write_keeps_the_old_file(tmp_path):
    atomic_write_pickle(tmp_path / "x.pkl", {"old": 1})
    with pytest.raises(TypeError):
        atomic_write_pickle(tmp_path / "x.pkl", {"new": object()})
    assert load_pickle(tmp_path / "x.pkl") == {"old": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.pkl"]


def test_record_log_appends_resumes_and_drops_a_cut_frame(tmp_path):
    path = tmp_path / "log.pkl"
    with RecordLog(path, "k", {"a": 1}, ("a",)) as log:
        for i in range(3):
            log.append({"index": i, "x": np.full(2, i)})
    size = path.stat().st_size
    with open(path, "ab") as f:  # a kill in the middle of a write: half a frame
        f.write(frame(pickle.dumps({"index": 3}))[:23])
    meta, records = read_record_log(path, "k", "log")
    assert meta == {"a": 1} and [r["index"] for r in records] == [0, 1, 2]
    with RecordLog(path, "k", {"a": 1}, ("a",)) as log:  # reopening drops the cut frame, then appends
        assert path.stat().st_size == size
        log.append({"index": 3, "x": np.full(2, 3)})
    assert [r["index"] for r in read_record_log(path, "k", "log")[1]] == [0, 1, 2, 3]


def test_record_log_refuses_a_second_writer_and_other_settings(tmp_path):
    path = tmp_path / "log.pkl"
    first = RecordLog(path, "k", {"a": 1}, ("a",))
    first.append({"index": 0})
    with pytest.raises(UserError, match="being written by another process"):
        RecordLog(path, "k", {"a": 1}, ("a",))
    first.close()
    with pytest.raises(UserError, match="a=1"):
        RecordLog(path, "k", {"a": 2}, ("a",))
    with RecordLog(path, "k", {"a": 2}, ("a",), restart_on_mismatch=True) as log:
        assert log.records == []
    assert read_record_log(path, "k", "log") == ({"a": 2}, [])


def test_header_only_log_never_blocks_a_corrected_run(tmp_path):
    path = tmp_path / "log.pkl"
    RecordLog(path, "k", {"a": 1}, ("a",)).close()  # a run that failed before its first record
    with RecordLog(path, "k", {"a": 2}, ("a",)) as log:
        log.append({"index": 0})
    assert read_record_log(path, "k", "log")[0] == {"a": 2}


def test_hostile_frame_in_a_record_log_runs_no_code(tmp_path):
    marker = tmp_path / "marker"
    path = tmp_path / "log.pkl"
    with RecordLog(path, "k", {}, ()) as log:
        log.append({"index": 0})
    with open(path, "ab") as f:  # a well-formed frame (checksum right) holding a payload
        f.write(frame(pickle.dumps(MarkerPayload(marker))))
    with pytest.raises(UserError, match="not a safe"):
        read_record_log(path, "k", "log")
    with pytest.raises(UserError, match="not a safe"):
        RecordLog(path, "k", {}, ())
    assert not marker.exists()
    assert os.path.getsize(path) > 0  # refused, not truncated


def test_a_flipped_byte_in_saved_weights_is_refused_not_loaded_as_other_weights(tmp_path):
    """torch.load does not check the zip's CRC-32s: a byte flipped inside a tensor's data loads as another
    number. load_torch checks them first, so a damaged cost model is one clear error; the intact file loads."""
    import struct
    import zipfile

    from neuroshard.models.cost_models import CommCostModel

    path = CommCostModel(4, "fw").save(tmp_path / "fw.pt")
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if "/data/" in i.filename and i.file_size >= 64)
    raw = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
    raw[info.header_offset + 30 + name_len + extra_len + 5] ^= 0x01  # one bit of one stored weight
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(bytes(raw))
    # the flip really is one silent weight change to torch.load itself
    a, b = (torch.load(p, weights_only=True)["state_dict"] for p in (path, damaged))
    assert sum(not torch.equal(a[k], b[k]) for k in a) == 1
    with pytest.raises(UserError, match=r"damaged.pt is damaged \(a checksum fails in .*/data/.*\); write it again"):
        CommCostModel.load(damaged)
    assert torch.equal(load_torch(path, "cost model")["state_dict"]["mlp.0.weight"], a["mlp.0.weight"])


def test_a_results_folder_is_checked_before_any_work(tmp_path):
    from neuroshard.core.artifacts import check_output_dir

    check_output_dir(tmp_path / "a" / "b", "--out_dir")  # writable: made for the check, then removed again
    assert not (tmp_path / "a").exists()  # a run that stops now leaves no empty results folder
    (tmp_path / "keep").mkdir()
    check_output_dir(tmp_path / "keep", "--out_dir")
    assert (tmp_path / "keep").is_dir() and list((tmp_path / "keep").iterdir()) == []  # kept; no probe left
    (tmp_path / "f").write_text("keep me")
    with pytest.raises(UserError, match="--out_dir .*cannot write results there"):
        check_output_dir(tmp_path / "f" / "sub", "--out_dir")  # a file where a folder must be
    assert (tmp_path / "f").read_text() == "keep me"
    with pytest.raises(UserError, match="cannot write results there"):
        check_output_dir(tmp_path / "f", "--out_dir")


def test_a_run_that_writes_nothing_leaves_no_folder(tmp_path):
    """The write check and the output lock make the output's folders; a run that stops before writing leaves
    none of them, one that writes keeps its file and folder, and folders that were there stay."""
    from neuroshard.core.artifacts import OutputLock, atomic_write_text, check_writable_file

    out = tmp_path / "new" / "deeper" / "plan.json"
    check_writable_file(out, "--out")
    assert list(tmp_path.iterdir()) == []
    with OutputLock([("--out", out), ("--torchrec_plan", tmp_path / "new" / "other.json")]):
        assert (out.parent / ".plan.json.lock").is_file()
    assert list(tmp_path.iterdir()) == []  # a failed run: nothing left to block or clutter the corrected one
    with OutputLock([("--out", out)]):
        atomic_write_text(out, "{}")
    assert out.read_text() == "{}" and sorted(p.name for p in out.parent.iterdir()) == ["plan.json"]
    (tmp_path / "kept").mkdir()
    with OutputLock([("--out", tmp_path / "kept" / "x.json")]):
        pass
    assert (tmp_path / "kept").is_dir()


def test_an_atomic_write_never_replaces_a_fifo_or_device(tmp_path):
    """Writing an artifact over a FIFO (or /dev/null, as root) would replace the node with a regular file."""
    import stat

    from neuroshard.core.artifacts import atomic_write_text

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="is a FIFO .*, not a file to write"):
        atomic_write_text(fifo, "x")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and [p.name for p in tmp_path.iterdir()] == ["fifo"]
    link = tmp_path / "link"  # a symlink is replaced itself, never written through
    link.symlink_to(fifo)
    atomic_write_text(link, "x")
    assert link.read_text() == "x" and not link.is_symlink() and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_deferred_interrupts_hold_a_signal_that_another_thread_takes():
    """A SIGTERM sent to the process while a critical step runs waits for its end, also when the kernel hands it
    to a thread that does not block it (its Python handler would run in the main thread at once); it is then
    delivered once, and the handler in place before is back."""
    import os
    import signal
    import threading
    import time

    from neuroshard.core.artifacts import deferred_interrupts

    got = []

    def mine(signum, frame):
        got.append(signum)

    before = signal.signal(signal.SIGTERM, mine)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)  # started before the block: SIGTERM is not blocked there
    other.start()
    try:
        with deferred_interrupts():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.3)
            assert got == []
        assert got == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        stop.set()
        other.join()
        signal.signal(signal.SIGTERM, before)


def test_provenance_names_the_cpu_that_made_the_artifact():
    from neuroshard.core.artifacts import cpu_name, provenance

    made = provenance(step="x")
    assert made["step"] == "x" and made["cpu"] == cpu_name() and made["cpu"]
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        models = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                  if line.startswith("model name")]
        assert not models or made["cpu"] == models[0]


def test_provenance_names_the_commit_and_the_code():
    """Every artifact's record names the checkout's commit (marked +dirty where tracked files differ) and the
    code's digest; outside a git checkout the commit is None and the digest still names the code."""
    import subprocess
    from pathlib import Path

    from neuroshard.core.artifacts import provenance, source_digest

    p = provenance(step="x")
    root = Path(__file__).resolve().parents[2]
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    if (root / ".git").exists() and head.returncode == 0:
        assert p["commit"] in (head.stdout.strip(), head.stdout.strip() + "+dirty"), p["commit"]
    else:
        assert p["commit"] is None
    assert p["code"] == source_digest() and len(p["code"]) == 12 and p["step"] == "x"
