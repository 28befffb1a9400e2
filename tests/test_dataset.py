"""Raw format I/O, processing, synthetic statistics and bad input of tools/gen_dlrm_data.py."""
import gzip

import numpy as np
import pytest
import torch

from neuroshard.dataset import (PUBLISHED_REUSE_UNIQUE_SHARE, DLRMDataset, SyntheticConfig, generate_synthetic_raw,
                                load_raw, process_raw, save_raw)
from neuroshard.tables import table_data_features

from conftest import assert_clean_error, files_under, run_script


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
    return [("list.pt", "tuple (indices, offsets, lengths)"), ("offsets.pt", "table 3"),
            ("neg.pt", "negative ids in table 5"), ("garbage.pt", "not a torch.save'd"),
            ("missing.pt", "not found")]


def test_bad_input_gets_one_clear_line(small_raw, tmp_path):
    for name, fragment in _bad_file_cases(small_raw, tmp_path):
        out = tmp_path / f"out_{name}"
        proc = run_script("tools/gen_dlrm_data.py", "--data", tmp_path / name, "--out_dir", out)
        assert_clean_error(proc, fragment)
        assert files_under(out) == []


def test_unwritable_output_folder(small_raw, tmp_path):
    raw = save_raw(tmp_path / "raw.pt", *small_raw)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = run_script("tools/gen_dlrm_data.py", "--data", raw, "--out_dir", blocker / "sub")
    assert_clean_error(proc, "cannot write")


def test_processed_folder_check(tmp_path):
    with pytest.raises(Exception, match="not a processed DLRM dataset"):
        DLRMDataset.load(tmp_path)
