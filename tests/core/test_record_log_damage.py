"""Record logs under damage: symlinks and hard links are never written through, every flipped byte
is refused with one line (never read as an empty log or a shorter one), a cut last frame is dropped,
--salvage keeps exactly the good records, and a full disk keeps every earlier record."""
import os

import numpy as np
import pytest

from neuroshard.core import artifacts
from neuroshard.core.artifacts import (RecordLog, atomic_torch_save, atomic_write_pickle, atomic_write_text,
                                       load_pickle, read_record_log)
from neuroshard.core.errors import UserError

from conftest import disk_full


def _log(path, n=3):
    with RecordLog(path, "k", {"a": 1}, ("a",)) as log:
        for i in range(n):
            log.append({"index": i, "x": np.full(3, float(i))})
    return path.read_bytes()


def _frame_starts(data):
    starts, pos = [], 0
    while pos < len(data):
        starts.append(pos)
        pos = artifacts.record_log._frame_at(data, pos)
    return starts


def _flip(path, data, pos, mask=0x40):
    b = bytearray(data)
    b[pos] ^= mask
    path.write_bytes(bytes(b))


def test_a_symlinked_log_is_refused_and_its_target_untouched(tmp_path):
    victim = tmp_path / "thesis.tex"
    victim.write_text("years of work")
    (tmp_path / "out.pkl").symlink_to(victim)
    with pytest.raises(UserError, match="symbolic link .*never writes through a link"):
        RecordLog(tmp_path / "out.pkl", "k", {}, ())
    assert victim.read_text() == "years of work"
    dangling = tmp_path / "d.pkl"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(UserError, match="symbolic link"):
        RecordLog(dangling, "k", {}, ())
    assert not (tmp_path / "nowhere").exists()


def test_a_hard_linked_log_is_refused(tmp_path):
    victim = tmp_path / "notes.txt"
    victim.write_text("keep")
    os.link(victim, tmp_path / "out.pkl")
    with pytest.raises(UserError, match="other hard link"):
        RecordLog(tmp_path / "out.pkl", "k", {}, ())
    assert victim.read_text() == "keep"


def test_atomic_writes_replace_a_symlink_never_its_target(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    for i, write in enumerate([lambda p: atomic_write_text(p, "new"), lambda p: atomic_write_pickle(p, {"a": 1}),
                               lambda p: atomic_torch_save(p, {"a": 1})]):
        link = tmp_path / f"link{i}"
        link.symlink_to(victim)
        write(link)
        assert not link.is_symlink() and victim.read_text() == "keep"


def test_every_flipped_byte_is_refused_never_read_as_fewer_records(tmp_path):
    path = tmp_path / "log.pkl"
    data = _log(path)
    starts = _frame_starts(data)
    assert len(starts) == 4
    for pos in range(len(data)):
        for mask in (0x01, 0x80):
            _flip(path, data, pos, mask)
            with pytest.raises(UserError) as e:
                read_record_log(path, "k", "log")
            msg = str(e.value)
            assert str(path) in msg and "\n" not in msg
            frame_no = max(i for i, s in enumerate(starts) if s <= pos)
            if frame_no == 0:
                assert "header" in msg and "damaged" in msg
            else:
                assert f"record #{frame_no} " in msg and "--salvage" in msg
            with pytest.raises(UserError):  # a collector resuming it refuses too, and leaves the file as it was
                RecordLog(path, "k", {"a": 1}, ("a",))
            assert path.stat().st_size == len(data)


def test_a_damaged_header_is_never_taken_for_an_empty_log(tmp_path):
    path = tmp_path / "log.pkl"
    data = _log(path)
    _flip(path, data, 20)
    damaged = path.read_bytes()
    for salvage in (False, True):
        with pytest.raises(UserError, match="header .* is damaged.*mv "):
            RecordLog(path, "k", {"a": 1}, ("a",), restart_on_mismatch=True, salvage=salvage)
    assert path.read_bytes() == damaged


def test_salvage_keeps_exactly_the_good_records(tmp_path, capsys):
    path = tmp_path / "log.pkl"
    data = _log(path, 5)
    starts = _frame_starts(data)
    _flip(path, data, starts[2] + 20)  # record #2 (index 1)
    with pytest.raises(UserError, match=r"record #2 .*keep the 4 good record"):
        read_record_log(path, "k", "log")
    meta, recs = read_record_log(path, "k", "log", salvage=True)
    assert [r["index"] for r in recs] == [0, 2, 3, 4]
    assert "dropped 1 damaged record" in capsys.readouterr().err
    with RecordLog(path, "k", {"a": 1}, ("a",), salvage=True) as log:  # rewritten without it, then resumed
        assert [r["index"] for r in log.records] == [0, 2, 3, 4]
        log.append({"index": 1, "x": np.full(3, 1.0)})
    assert sorted(r["index"] for r in read_record_log(path, "k", "log")[1]) == [0, 1, 2, 3, 4]


def test_a_cut_last_frame_is_dropped_at_every_cut(tmp_path, capsys):
    path = tmp_path / "log.pkl"
    data = _log(path)
    ends = _frame_starts(data)[1:] + [len(data)]
    for cut in range(ends[0], len(data)):
        path.write_bytes(data[:cut])
        whole = sum(e <= cut for e in ends) - 1
        assert [r["index"] for r in read_record_log(path, "k", "log")[1]] == list(range(whole))
    path.write_bytes(data[:ends[0] - 3])  # the header itself cut: a run that died at once starts anew
    with RecordLog(path, "k", {"a": 1}, ("a",)) as log:
        assert log.records == []
    path.write_bytes(data + b"\0" * 64)  # a crash that left zeros after the last frame
    with RecordLog(path, "k", {"a": 1}, ("a",)) as log:
        assert len(log.records) == 3
    assert path.read_bytes() == data


def test_a_flipped_length_on_the_last_frame_is_damage_not_a_cut(tmp_path):
    path = tmp_path / "log.pkl"
    data = _log(path)
    _flip(path, data, _frame_starts(data)[-1] + 9)  # the length's second byte: now runs past the end
    with pytest.raises(UserError, match="record #3 "):
        read_record_log(path, "k", "log")


def test_an_old_format_log_is_read_and_upgraded(tmp_path):
    import pickle

    path = tmp_path / "log.pkl"
    path.write_bytes(b"".join(pickle.dumps(o) for o in [{"kind": "k", "meta": {"a": 1}}, {"index": 0}]))
    assert read_record_log(path, "k", "log")[1] == [{"index": 0}]
    with RecordLog(path, "k", {"a": 1}, ("a",)) as log:
        log.append({"index": 1})
    assert path.read_bytes()[:4] == artifacts.FRAME_MAGIC
    assert [r["index"] for r in read_record_log(path, "k", "log")[1]] == [0, 1]


def test_disk_full_while_appending_keeps_every_earlier_record(tmp_path, monkeypatch):
    path = tmp_path / "log.pkl"
    log = RecordLog(path, "k", {"a": 1}, ("a",))
    log.append({"index": 0})
    size = path.stat().st_size
    disk_full(monkeypatch)
    with pytest.raises(UserError, match=r"disk full while writing .*log.pkl \(the 1 records before it are kept\).*"
                                        "rerun the same command"):
        log.append({"index": 1})
    log.close()
    monkeypatch.undo()
    assert path.stat().st_size == size
    with RecordLog(path, "k", {"a": 1}, ("a",)) as log:
        assert [r["index"] for r in log.records] == [0]


@pytest.mark.parametrize("write", [lambda p: atomic_write_text(p, "new" * 10_000),
                                   lambda p: atomic_write_pickle(p, {"new": 1}),
                                   lambda p: atomic_torch_save(p, {"new": 1})], ids=["text", "pickle", "torch"])
def test_disk_full_while_writing_a_file_keeps_the_old_one(tmp_path, monkeypatch, write):
    path = tmp_path / "x.pkl"
    atomic_write_pickle(path, {"old": 1})
    disk_full(monkeypatch)
    with pytest.raises(UserError, match="disk full while writing .*x.pkl; the previous file .* unchanged"):
        write(path)
    monkeypatch.undo()
    assert load_pickle(path) == {"old": 1} and [p.name for p in tmp_path.iterdir()] == ["x.pkl"]
