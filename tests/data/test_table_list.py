"""A user's table list: parsed by hand-checked rules, every bad row answered with one line naming it."""
import json
import re

import numpy as np
import pytest

from neuroshard.core.errors import UserError
from neuroshard.data.raw import save_raw
from neuroshard.data.table_list import DEFAULT_REUSE_HISTOGRAM, load_table_list, tables_from_ids

from conftest import refused

GOOD = "name,rows,dim,pooling_factor\nuser,1000,64,1\nitem,50,16,2.5\n"


def test_csv_and_json_give_the_same_task(tmp_path):
    (tmp_path / "t.csv").write_text(GOOD)
    (tmp_path / "t.json").write_text(json.dumps([{"name": "user", "rows": 1000, "dim": 64, "pooling_factor": 1},
                                                 {"name": "item", "rows": 50, "dim": 16, "pooling_factor": 2.5}]))
    a, b = load_table_list(tmp_path / "t.csv"), load_table_list(tmp_path / "t.json")
    for tl in (a, b):
        assert tl.names == ["user", "item"] and tl.rows.tolist() == [1000, 50]
        assert tl.task.dims.tolist() == [64, 16]
        assert tl.task.data_features[:, 0].tolist() == [1000, 100]    # row feature = max(100, rows)
        assert tl.task.data_features[:, 1].tolist() == [1.0, 2.5]
        assert np.allclose(tl.task.data_features[:, 2:], DEFAULT_REUSE_HISTOGRAM)
        assert tl.defaulted_reuse == ["user", "item"]
        assert tl.task.sizes_gb() == pytest.approx([1000 * 64 * 4 / 2**30, 50 * 16 * 4 / 2**30])
    assert DEFAULT_REUSE_HISTOGRAM.sum() == pytest.approx(1.0)


def test_given_reuse_histogram_is_kept(tmp_path):
    bins = ",".join(f"bin_{j}" for j in range(17))
    hist = [0.5, 0.5] + [0] * 15
    (tmp_path / "t.csv").write_text(f"name,rows,dim,pooling_factor,{bins}\nx,10,8,1,{','.join(map(str, hist))}\n")
    tl = load_table_list(tmp_path / "t.csv")
    assert tl.task.data_features[0, 2:].tolist() == hist and tl.defaulted_reuse == []


BAD = [
    ("name,rows,dim\nx,10,8\n", "lacks column 'pooling_factor'"),
    ("name,rows,dim,pooling_factor\nx,10,8,\n", "line 2: missing pooling_factor"),
    ("name,rows,dim,pooling_factor\nx,10,8,1\ny,-5,8,1\n", "line 3: rows must be a whole number from 1 to"),
    ("name,rows,dim,pooling_factor\nx,10,8,1\ny,10,10,1\n", "line 3: dim must be a multiple of 4"),
    ("name,rows,dim,pooling_factor\nx,10,8,1\nx,20,8,1\n", "line 3: duplicate table name 'x'"),
    ("name,rows,dim,pooling_factor\nx,10,8,abc\n", "line 2: pooling_factor must be a number"),
    ("name,rows,dim,pooling_factor\nx,10,8,-1\n", "line 2: pooling_factor must be from 0 to"),
    ("name,rows,dim,pooling_factor\nbig,1000000000,4,1\n", "line 2: table 'big'"),
    ("name,rows,dim,pooling_factor,bin_0\nx,10,8,1,0.5\n", "line 2: reuse histogram incomplete"),
    ("name,rows,dim,pooling_factor\n", "no tables"),
]


@pytest.mark.parametrize("text,fragment", BAD)
def test_bad_rows_are_named(tmp_path, text, fragment):
    (tmp_path / "t.csv").write_text(text)
    with pytest.raises(UserError, match=fragment.replace("(", r"\(")):
        load_table_list(tmp_path / "t.csv", max_mem_gb=1.0)


def test_bad_json(tmp_path):
    (tmp_path / "t.json").write_text('[{"name": "x", "rows": 10, "dim": 8}]')
    with pytest.raises(UserError, match="table 1: missing pooling_factor"):
        load_table_list(tmp_path / "t.json")
    (tmp_path / "t.json").write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        load_table_list(tmp_path / "t.json")


def test_splittable_table_larger_than_a_device_is_allowed(tmp_path):
    # 1.0 GB at dim 128 on 0.6 GB devices: fits once split into halves
    (tmp_path / "t.csv").write_text(f"name,rows,dim,pooling_factor\nx,{2**30 // 512},128,1\n")
    assert load_table_list(tmp_path / "t.csv", max_mem_gb=0.6).names == ["x"]


def test_tables_from_real_ids(small_raw, tmp_path):
    from neuroshard.data.features import table_data_features

    save_raw(tmp_path / "ids.pt", *small_raw)
    tl = tables_from_ids(tmp_path / "ids.pt", [32])
    indices, offsets, lengths = (x.numpy() for x in small_raw)
    B = lengths.shape[1]
    want = table_data_features(indices[offsets[3 * B]: offsets[4 * B]], lengths[3])
    assert np.allclose(tl.task.data_features[3], want) and tl.task.dims.tolist() == [32] * 24
    with pytest.raises(UserError, match="gives 2 dims but"):
        tables_from_ids(tmp_path / "ids.pt", [32, 64])


def test_script_refuses_bad_rows_without_writing(tmp_path, capsys):
    (tmp_path / "t.csv").write_text(BAD[3][0])
    refused(capsys, "tools/shard_tables.py", "--tables", tmp_path / "t.csv", "--alg", "dim_greedy",
            "--out", tmp_path / "out" / "plan.json", untouched=[tmp_path],
            match=re.escape(f"error: {tmp_path}/t.csv line 3: dim must be a multiple of 4 between 4 and 4096, got "
                            "'10'"))
