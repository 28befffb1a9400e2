"""Table families (DESIGN.md §8): the generator's ids have the requested rows, pooling and skew, the
tables come out in the dataset's feature format, and the collector's mix sampler draws what it says."""
import dataclasses

import numpy as np
import pytest

from neuroshard.core.errors import UserError
from neuroshard.data.families import (FamilyMix, TablePool, build_family_tables, family_of_tables, family_tables,
                                      generate_family_raw, zipf_ids)
from neuroshard.core.cli import shares
from neuroshard.data.features import table_data_features, table_size_gb
from neuroshard.hardware.compute_bench import MixSampler

MIX = FamilyMix(seed=5, batch_size=256, row_scale=1e-3, max_mem_gb=0.01)


def test_zipf_ids_have_requested_rows_and_skew():
    rng = np.random.default_rng(0)
    ids = zipf_ids(rng, 5000, 200_000, 1.1)
    assert ids.min() >= 0 and ids.max() < 5000
    counts = np.sort(np.bincount(ids, minlength=5000))[::-1]
    # rank 1 vs rank 10: ratio 10^a = 12.6 for a = 1.1
    assert 9 < counts[0] / counts[9] < 17
    assert counts[:50].sum() / counts.sum() > 0.5  # top 1% of rows take over half the lookups
    flat = np.bincount(zipf_ids(rng, 5000, 200_000, 0.0), minlength=5000)
    assert flat.max() / flat.mean() < 2  # exponent 0: uniform


def test_family_tables_follow_their_ranges_and_are_seeded():
    tables = family_tables(MIX)
    by = {}
    for t in tables:
        by.setdefault(t.family, []).append(t)
    assert {k: len(v) for k, v in by.items()} == {f.name: f.num_tables for f in MIX.families}
    assert all(t.pooling == 1.0 for t in by["one_hot"])
    assert all(2 <= t.pooling <= 30 for t in by["multi_hot"])
    assert all(50 <= t.pooling <= 500 for t in by["sequence"])
    assert all(3 <= t.rows <= 1000 for t in by["tiny"])
    device_rows_dim16 = MIX.max_mem_gb * 2**30 / 64
    assert all(0.25 * device_rows_dim16 - 1 <= t.rows <= device_rows_dim16 + 1 for t in by["large"])
    assert [dataclasses.astuple(t) for t in family_tables(MIX)] == [dataclasses.astuple(t) for t in tables]
    # more one-hot tables do not change any other family's tables
    fams = list(MIX.families)
    fams[0] = dataclasses.replace(fams[0], num_tables=3)
    other = family_tables(dataclasses.replace(MIX, families=tuple(fams)))
    assert [dataclasses.astuple(t) for t in other if t.family != "one_hot"] == \
        [dataclasses.astuple(t) for t in tables if t.family != "one_hot"]


def test_raw_ids_have_requested_pooling_and_features_format(tmp_path):
    tables = family_tables(MIX)
    indices, offsets, lengths = generate_family_raw(MIX, tables)
    B = MIX.batch_size
    for t, tab in enumerate(tables):
        ids = indices[offsets[t * B]: offsets[(t + 1) * B]].numpy()
        lens = lengths[t].numpy()
        assert ids.size == lens.sum() and (ids.size == 0 or (0 <= ids.min() and ids.max() < tab.rows))
        if tab.family == "one_hot":
            assert (lens == 1).all()
        elif tab.family in ("multi_hot", "sequence"):
            assert abs(lens.mean() / tab.pooling - 1) < 0.15, (tab, lens.mean())
    ds = build_family_tables(MIX, tmp_path / "fam", progress=False)
    assert family_of_tables(ds) == [t.family for t in tables]
    for t in (0, 20, 35, 45):  # one-hot, multi-hot, sequence, tiny: features exactly as step 1 computes them
        ids, off = ds.table_bags(t)
        expect = table_data_features(ids.numpy(), np.diff(off.numpy()))
        np.testing.assert_allclose(ds.features[t], expect)
    assert build_family_tables(MIX, tmp_path / "fam", progress=False).fingerprint == ds.fingerprint  # reused


def test_mix_sampler_draws_each_family_within_memory(small_dataset, tmp_path):
    mix = dataclasses.replace(MIX, batch_size=small_dataset.batch_size)
    fam = build_family_tables(mix, tmp_path / "fam", progress=False)
    caps = {f.name: f.max_tables for f in mix.families}
    sampler = MixSampler(small_dataset, fam, seed=1, max_tables=15, max_mem_gb=mix.max_mem_gb, max_dim=128,
                         shares=mix.sample_share, max_shards=64, caps=caps)
    names = family_of_tables(fam)
    seen = {}
    for i in range(300):
        family, ids, dims = sampler(i)
        seen[family] = seen.get(family, 0) + 1
        assert table_size_gb(sampler.pool.rows[ids], dims).sum() <= mix.max_mem_gb
        if family == "dataset":
            assert (ids < small_dataset.num_tables).all()
        elif family == "many_shards":
            assert 16 <= len(ids) <= 64 and len(set(ids.tolist())) < len(ids)
        else:
            assert all(names[i - small_dataset.num_tables] == family for i in ids)
            assert len(ids) <= caps[family]
    assert set(seen) == set(mix.sample_share)
    assert 0.3 < seen["dataset"] / 300 < 0.5
    assert sampler(17)[0] == sampler(17)[0] and (sampler(17)[1] == sampler(17)[1]).all()
    pool = TablePool([small_dataset, fam])
    a, _ = pool.table_bags(small_dataset.num_tables + 3)
    b, _ = fam.table_bags(3)
    assert (a == b).all()


def test_bad_family_settings_are_refused():
    with pytest.raises(UserError, match="shares must be"):
        FamilyMix(sample_share=dict(shares("dataset=0.5,nope=1", "--family_share"))).check()
    with pytest.raises(UserError, match="name=share"):
        shares("dataset=x", "--family_share")
    with pytest.raises(UserError, match="shares must be"):
        FamilyMix(sample_share={"dataset": -1.0}).check()
    with pytest.raises(UserError, match="shares must be"):
        FamilyMix(sample_share={"dataset": float("nan")}).check()
    assert shares("dataset=1,tiny=0.5", "--family_share") == (("dataset", 1.0), ("tiny", 0.5))
