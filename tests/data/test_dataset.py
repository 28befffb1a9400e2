"""Raw format I/O, processing, synthetic statistics and bad input of tools/gen_dlrm_data.py."""
import gzip
import re

import numpy as np
import pytest
import torch

from neuroshard.core.errors import UserError
from neuroshard.data.dataset import DLRMDataset, process_raw
from neuroshard.data.raw import load_raw, save_raw
from neuroshard.data.synthetic import PUBLISHED_REUSE_UNIQUE_SHARE, SyntheticConfig, generate_synthetic_raw
from neuroshard.data.features import table_data_features

from conftest import refused, run_script


@pytest.mark.parametrize("name", ["raw.pt", "raw.pt.gz"])
def test_raw_round_trip_and_processing(small_raw, tmp_path, name):
    path = save_raw(tmp_path / name, *small_raw)
    if name.endswith(".gz"):
        assert gzip.open(path).read(2)  # really gzip
    indices, offsets, lengths = load_raw(path)
    for a, b in zip((indices, offsets, lengths), small_raw):
        assert torch.equal(a, b)
    ds = process_raw(indices, offsets, lengths, tmp_path / "out", source={"data": str(path)}, progress=False)
    T, B = lengths.shape
    assert (ds.num_tables, ds.batch_size) == (T, B)
    for t in (0, 7, T - 1):
        ids = indices[offsets[t * B]: offsets[(t + 1) * B]].numpy()
        assert np.allclose(ds.features[t], table_data_features(ids, lengths[t].numpy()))
        got_ids, got_off = ds.table_bags(t, batch_size=10)
        want = indices[offsets[t * B]: offsets[t * B + 10]]
        assert torch.equal(got_ids, want) and got_off[0] == 0 and got_off[-1] == want.numel()
        assert torch.equal(got_off[1:] - got_off[:-1], lengths[t, :10])


def test_script_processes_real_format_file(small_raw, tmp_path):
    raw = save_raw(tmp_path / "raw.pt.gz", *small_raw)
    proc = run_script("tools/gen_dlrm_data.py", "--data", raw, "--out_dir", tmp_path / "ds")
    assert proc.returncode == 0, proc.stderr
    assert "total-variation distance" in proc.stdout
    assert DLRMDataset.load(tmp_path / "ds").num_tables == small_raw[2].shape[0]


def test_synthetic_statistics_at_defaults():
    """856 tables at batch 4096 follow the published statistics (DESIGN.md §2.1)."""
    indices, offsets, lengths = generate_synthetic_raw(SyntheticConfig(), progress=False)
    T, B = lengths.shape
    assert (T, B) == (856, 4096)
    pf = lengths.double().mean(dim=1).numpy()
    assert abs(pf.mean() - 15.81) / 15.81 < 0.10
    assert (pf <= 1).sum() >= 20
    per_bin = np.zeros(17)
    rows = np.zeros(T)
    for t in range(T):
        ids = indices[offsets[t * B]: offsets[(t + 1) * B]].numpy()
        f = table_data_features(ids, lengths[t].numpy())
        rows[t] = f[0]
        per_bin += f[2:] * (np.unique(ids).size if ids.size else 0)
    hist = per_bin / per_bin.sum()
    assert 0.5 * np.abs(hist - PUBLISHED_REUSE_UNIQUE_SHARE).sum() < 0.10
    assert np.log10(rows.max() / rows.min()) >= 4


def test_synthetic_is_seeded():
    a = generate_synthetic_raw(SyntheticConfig(num_tables=5, batch_size=64, seed=1), progress=False)
    b = generate_synthetic_raw(SyntheticConfig(num_tables=5, batch_size=64, seed=1), progress=False)
    c = generate_synthetic_raw(SyntheticConfig(num_tables=5, batch_size=64, seed=2), progress=False)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])


def _bad_file_cases(small_raw, tmp_path):
    indices, offsets, lengths = small_raw
    B = lengths.shape[1]
    torch.save([1, 2, 3], tmp_path / "list.pt")
    bad_off = offsets.clone()
    bad_off[3 * B + 5:] += 1  # table 3 gets one lookup more than its lengths say
    torch.save((indices, bad_off, lengths), tmp_path / "offsets.pt")
    neg = indices.clone()
    t = 5
    neg[offsets[t * B]] = -4
    torch.save((neg, offsets, lengths), tmp_path / "neg.pt")
    (tmp_path / "garbage.pt").write_bytes(b"not a torch file")
    neg_len = lengths.clone()
    neg_len[2, 0], neg_len[2, 1] = -1, lengths[2, 1] + lengths[2, 0] + 1  # offsets stay consistent
    neg_off = torch.zeros_like(offsets)
    neg_off[1:] = torch.cumsum(neg_len.reshape(-1), 0)
    torch.save((indices, neg_off, neg_len), tmp_path / "neglen.pt")
    torch.save((indices.double(), offsets, lengths), tmp_path / "float.pt")
    empty = torch.zeros(0, B, dtype=torch.int64)
    torch.save((torch.zeros(0, dtype=torch.int64), torch.zeros(1, dtype=torch.int64), empty), tmp_path / "empty.pt")
    # each file's whole error line: {} is the file, .* torch's own words
    return [("list.pt", "{}: expected a tuple (indices, offsets, lengths) of three tensors, got list; pass a DLRM "
                        "dataset file such as fbgemm_t856_bs65536.pt"),
            ("offsets.pt", "{}: offsets are inconsistent with lengths in table 3; offsets must be the prefix sums of "
                           "lengths, table by table"),
            ("neg.pt", "{}: negative ids in table 5; ids must be row numbers >= 0"),
            ("garbage.pt", "{} is not a torch.save'd DLRM dataset (not a file torch saved (.*))"),
            ("missing.pt", "--data file not found: {}; download fbgemm_t856_bs65536.pt or use --synthetic"),
            ("neglen.pt", "{}: negative lengths in table 2; lengths count lookups and must be >= 0"),
            ("float.pt", "{}: indices must be an integer tensor, got torch.float64; ids, offsets and lengths are whole "
                         "numbers"),
            ("empty.pt", "{}: the dataset has no tables or no samples (lengths (0, 256)); pass a dataset with at least "
                         "one table and one sample")]


def test_bad_input_gets_one_clear_line_and_overwrites_nothing(small_raw, small_dataset, tmp_path, capsys):
    import shutil

    out = tmp_path / "existing"
    shutil.copytree(small_dataset.path, out)
    for name, line in _bad_file_cases(small_raw, tmp_path):
        match = ".*".join(re.escape(part.format(tmp_path / name)) for part in f"error: {line}".split(".*"))
        refused(capsys, "tools/gen_dlrm_data.py", "--data", tmp_path / name, "--out_dir", out, match=match,
                untouched=[tmp_path], quiet=False)


@pytest.mark.parametrize("args,line", [
    (["--num_tables", "0"], "--num_tables must be >= 1 and <= 100000, got 0"),
    (["--batch_size", "-5"], "--batch_size must be >= 1 and <= 1.04858e+06, got -5"),
    (["--row_scale", "0"], "--row_scale must be a finite number > 0 and <= 1000, got 0"),
    (["--row_scale", "nan"], "--row_scale must be a finite number > 0 and <= 1000, got nan"),
    (["--seed", "-1"], "--seed must be >= 0, got -1")])
def test_bad_synthetic_settings_touch_nothing(tmp_path, capsys, args, line):
    refused(capsys, "tools/gen_dlrm_data.py", "--synthetic", "--out_dir", tmp_path / "out", *args,
            match=re.escape(f"error: {line}"), untouched=[tmp_path])


def test_regenerating_replaces_the_dataset_whole(small_raw, tmp_path):
    first = process_raw(*small_raw, out_dir=tmp_path / "d", source={"source": "a"}, progress=False)
    indices, offsets, lengths = small_raw
    second = process_raw(indices[: int(offsets[5 * lengths.shape[1]])], offsets[: 5 * lengths.shape[1] + 1],
                         lengths[:5], out_dir=tmp_path / "d", source={"source": "b"}, progress=False)
    assert first.num_tables == 24 and second.num_tables == 5
    assert DLRMDataset.load(tmp_path / "d").bags()["offsets"].numel() == 5 * lengths.shape[1] + 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


@pytest.mark.parametrize("source", ["raw", "synthetic"])
def test_unwritable_output_folder_is_refused_before_any_work(small_raw, tmp_path, capsys, source):
    """Before the raw file is loaded or any synthetic id made: nothing printed but the one line."""
    raw = save_raw(tmp_path / "raw.pt", *small_raw)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    args = ["--data", raw] if source == "raw" else ["--synthetic", "--num_tables", "4", "--batch_size", "64"]
    refused(capsys, "tools/gen_dlrm_data.py", *args, "--out_dir", blocker / "sub", untouched=[tmp_path],
            match=re.escape(f"error: cannot write to {blocker}: File exists; choose a writable output folder"))


def test_processed_folder_check(tmp_path):
    with pytest.raises(UserError, match="not a processed DLRM dataset"):
        DLRMDataset.load(tmp_path)


def test_a_folder_of_other_files_is_never_replaced(small_raw, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(UserError, match="other files"):
        process_raw(*small_raw, out_dir=out, source={"source": "t"}, progress=False)
    assert (out / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_popular_rows_first_renumbers_hottest_first_and_keeps_counts():
    """A frequency-ordered vocabulary: the most-read id of each table becomes row 0, the next row 1, the least-read
    its last row; bags and the multiset of access counts stay."""
    import numpy as np

    from neuroshard.data.synthetic import popular_rows_first, synthesize_tables

    indices, offsets, lengths = synthesize_tables([5000, 300], [3.0, 1.0], np.zeros((2, 17)), 256, seed=2,
                                                  progress=False)
    out = popular_rows_first(indices, offsets, lengths, [5000, 300])
    B = lengths.shape[1]
    for t, rows in enumerate([5000, 300]):
        lo, hi = int(offsets[t * B]), int(offsets[(t + 1) * B])
        before = np.unique(indices[lo:hi].numpy(), return_counts=True)[1]
        ids, counts = np.unique(out[lo:hi].numpy(), return_counts=True)
        assert sorted(before) == sorted(counts)
        assert ids[0] == 0 and counts[0] == before.max() and ids.max() == rows - 1
        assert (np.diff(counts[:-1]) <= 0).all()  # hottest first (the last id moved to the last row)
        assert ids[:-1].tolist() == list(range(ids.size - 1))
        pairs = np.unique(np.stack([indices[lo:hi].numpy(), out[lo:hi].numpy()]), axis=1)
        assert pairs.shape[1] == before.size == ids.size  # one new row per old id: a renumbering
    assert out.shape == indices.shape
