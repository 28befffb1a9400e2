"""Table features computed by hand (DESIGN.md §2.2)."""
import numpy as np

from neuroshard.data.features import dim_choices, reuse_bin, table_data_features, table_size_gb, with_dim


def test_reuse_bins_at_boundaries():
    counts = np.array([1, 2, 3, 4, 5, 8, 9, 16, 17, 32768, 32769, 40000])
    assert reuse_bin(counts).tolist() == [0, 1, 2, 2, 3, 3, 4, 4, 5, 15, 16, 16]


def test_table_without_lookups():
    f = table_data_features(np.array([], dtype=np.int64), np.zeros(8, dtype=np.int64))
    assert f[0] == 100          # row 1, raised to 100
    assert f[1] == 0.0          # pooling factor
    assert np.all(f[2:] == 0)   # all bins zero


def test_single_lookups_go_to_bin_0():
    ids = np.array([5, 7, 250, 3])
    lengths = np.array([1, 1, 0, 2])
    f = table_data_features(ids, lengths)
    assert f[0] == 251                       # max id + 1 > 100
    assert f[1] == 1.0                       # (1+1+0+2)/4
    assert f[2] == 1.0 and np.all(f[3:] == 0)


def test_one_id_read_40000_times_is_bin_16():
    ids = np.full(40000, 9)
    lengths = np.full(1000, 40)
    f = table_data_features(ids, lengths)
    assert f[0] == 100 and f[1] == 40.0
    assert f[2 + 16] == 1.0 and f[2:2 + 16].sum() == 0


def test_mixed_counts_by_hand():
    # id 0 once, id 1 twice, id 2 three times, id 3 five times -> bins 0, 1, 2, 3 each 1/4
    ids = np.array([0, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3])
    lengths = np.array([3, 3, 5])
    f = table_data_features(ids, lengths)
    assert f[1] == 11 / 3
    assert np.allclose(f[2:6], 0.25) and f[6:].sum() == 0


def test_with_dim_and_sizes():
    full = with_dim(np.ones((2, 19)), [4, 128])
    assert full.shape == (2, 20) and full[:, 0].tolist() == [4, 128]
    assert table_size_gb(2**28, 4) == 4.0
    assert dim_choices(128) == [128, 64, 32, 16, 8, 4]
    assert dim_choices(48) == [48, 24, 12]
