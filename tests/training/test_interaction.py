"""DCT-MP's effect on the dot interaction (training/interaction.py), on MovieLens-100K at the initial weights."""
import pytest

from neuroshard.training.interaction import mp_interaction_fidelity
from neuroshard.training.train import TrainConfig

pytest.importorskip("recbole", reason="MovieLens-100K ships in the recbole wheel")


@pytest.fixture(scope="module")
def movielens():
    from neuroshard.training.data import load_movielens

    return load_movielens()


def test_nothing_dropped_keeps_the_interaction(movielens):
    r = mp_interaction_fidelity(movielens, TrainConfig(ndevices=4, mp_keep=1.0), num_samples=1000)
    assert r["samples"] == 1000 and r["kept_per_sample"] == r["widths"]
    for kind in ("z_table", "table_table"):
        assert r[kind]["median_corr"] > 0.9999 and r[kind]["rel_error"] < 2e-3  # fp16 values only
        assert r[kind]["zero_share"] == 0.0
    assert r["z_table"]["pairs"] == 8 and r["table_table"]["pairs"] == 28  # 8 tables: 8 + 8 * 7 / 2


def test_one_entry_a_rank_zeroes_every_dot_of_two_tables_on_one_rank(movielens):
    """tiny on 4 ranks: 8 tables of 16 columns, 32 a rank, so keep 0.05 sends one entry a sample: two tables
    on one rank never both have an entry, and their dot product is exactly 0 in every sample."""
    cfg = TrainConfig(ndevices=4, mp_keep=0.05)
    r = mp_interaction_fidelity(movielens, cfg, num_samples=1000)
    assert r["kept_per_sample"] == [1, 1, 1, 1] and r["widths"] == [32, 32, 32, 32]
    same_rank_pairs = 4 / 28  # one pair on each rank, as the 32 columns a rank are two whole tables
    assert r["table_table"]["zero_share"] >= same_rank_pairs
    assert r["table_table"]["zero_share"] > 0.9 and r["table_table"]["rel_error"] > 0.9
    assert 0 < r["z_table"]["zero_share"] < 1
