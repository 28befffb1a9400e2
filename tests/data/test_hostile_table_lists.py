"""Hostile and careless table lists (--tables, --ids): each gets one line naming the entry and the
problem, nothing crashes, and a pooling factor far outside the cost models' training range warns."""
import json

import pytest
import torch

from neuroshard.core.errors import UserError
from neuroshard.data.raw import max_rows_any_device, save_raw, validate_raw
from neuroshard.data.table_list import MAX_NAME_CHARS, load_table_list, tables_from_ids

H = "name,rows,dim,pooling_factor\n"
BINS = "name,rows,dim,pooling_factor," + ",".join(f"bin_{j}" for j in range(17)) + "\n"
CSV = [
    (b"name,rows,dim,pooling_factor\nus\xe9r,10,8,1\n", "line 2: not UTF-8 text (byte 0xe9)"),
    (b"\xff\xfe" + "name,rows\n".encode("utf-16-le"), "line 1: not UTF-8"),
    ((H + "x,0,8,1\n").encode(), "line 2: rows must be a whole number from 1"),
    ((H + "x,10.5,8,1\n").encode(), "line 2: rows must be a whole number"),
    ((H + "x,1e15,8,1\n").encode(), "line 2: rows must be a whole number from 1 to"),
    ((H + "x,1e999,8,1\n").encode(), "line 2: rows must be finite"),
    ((H + "x,nan,8,1\n").encode(), "line 2: rows must be finite"),
    ((H + "x,10,0,1\n").encode(), "line 2: dim must be a multiple of 4"),
    ((H + "x,10,8192,1\n").encode(), "line 2: dim must be a multiple of 4 between 4 and 4096"),
    ((H + "x,10,6,1\n").encode(), "line 2: dim must be a multiple of 4"),
    ((H + "x,10,8,inf\n").encode(), "line 2: pooling_factor must be finite"),
    ((H + "x,10,8,1e7\n").encode(), "line 2: pooling_factor must be from 0 to 1e+06"),
    ((H + ",10,8,1\n").encode(), "line 2: missing name"),
    ((H + "  ,10,8,1\n").encode(), "line 2: missing name"),
    ((H + "x,10,8,1\n x ,10,8,1\n").encode(), "line 3: duplicate table name 'x'"),
    ((H + '"a\nb",10,8,1\n').encode(), "line 3: table name 'a\\nb' must be one line"),
    ((H + "a\tb,10,8,1\n").encode(), "line 2: table name 'a\\tb' must be one line"),
    ((H + "x" * (MAX_NAME_CHARS + 1) + ",10,8,1\n").encode(), f"at most {MAX_NAME_CHARS} characters"),
    ((H + "x,10,8,1,extra\n").encode(), "line 2: more fields than the header"),
    ((H + "x,10,8,1\0\n").encode(), "line 2: pooling_factor must be a number, got '1\\x00'"),
    ((H + "x," + "9" * 200_000 + ",8,1\n").encode(), "near line 2: not a CSV line (field larger than field limit"),
    ((H + "x,10,8\n").encode(), "line 2: missing pooling_factor"),
    (b"", "empty table list"),
    (b"rows,dim\n", "header lacks column 'name'"),
    (b"name,rows,dim,pooling_factor,name\nx,10,8,1,y\n", "the header names column 'name' more than once"),
    (b"Name, rows ,dim,pooling_factor\nx,10,8,1\n", "header lacks column 'name' (it has 'Name': column names are "
                                                    "lower case)"),
    ((BINS + "x,10,8,1," + ",".join(["0"] * 17) + "\n").encode(), "line 2: bin_0..bin_16 must be shares that sum to "
                                                                 "1, got sum 0.000 (all zero: only a table without"),
    ((BINS + "x,10,8,1,-0.5,1.5," + ",".join(["0"] * 15) + "\n").encode(),
     "line 2: bin_0..bin_16 must be shares in [0, 1], got bin_0 = -0.5, bin_1 = 1.5"),
    ((BINS + "x,10,8,1,0.5,1," + ",".join(["0"] * 15) + "\n").encode(), "got sum 1.500"),
]


@pytest.mark.parametrize("data,fragment", CSV, ids=range(len(CSV)))
def test_hostile_csv_rows_get_one_line(tmp_path, data, fragment):
    (tmp_path / "t.csv").write_bytes(data)
    with pytest.raises(UserError) as e:
        load_table_list(tmp_path / "t.csv", max_mem_gb=4.0)
    assert fragment in str(e.value) and str(tmp_path / "t.csv") in str(e.value)
    assert "\n" not in str(e.value) and len(str(e.value)) < 400


T = {"rows": 10, "dim": 8, "pooling_factor": 1}
JSON = [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('[{"name": "x", "rows": 1' + "0" * 5000 + ', "dim": 8, "pooling_factor": 1}]', "not a usable table list"),
    ('[{"name": "x", "rows": 1e999, "dim": 8, "pooling_factor": 1}]', "table 1: rows must be finite"),
    (json.dumps([{"name": "x", **T, "rows": True}]), "table 1: rows must be a number, got True"),
    (json.dumps([{"name": "x", **T, "dim": [8]}]), "table 1: dim must be a number, got [8]"),
    (json.dumps([{"name": "x", **T, "dim": {"a": {"b": 1}}}]), "table 1: dim must be a number"),
    (json.dumps([{"name": 5, **T}]), "table 1: name must be text, got int 5"),
    (json.dumps([{"name": ["x"], **T}]), "table 1: name must be text, got list"),
    (json.dumps([{"name": None, **T}]), "table 1: missing name"),
    (json.dumps([{"name": "a\nb", **T}]), "table 1: table name 'a\\nb' must be one line"),
    (json.dumps([{"name": "x", **T}, {"name": "x", **T}]), "table 2: duplicate table name 'x'"),
    (json.dumps([{"name": "x", **T, "rows": 2.5}]), "table 1: rows must be a whole number"),
    (json.dumps([{"name": "x", **T, "rows": 0}]), "table 1: rows must be a whole number from 1"),
    (json.dumps([{"name": "x", **T, "pooling_factor": -3}]), "table 1: pooling_factor must be from 0"),
    (json.dumps("tables"), "expected a JSON list of tables"),
    (json.dumps({"tables": {"x": 1}}), "expected a JSON list of tables"),
    (json.dumps([[1, 2]]), "expected a JSON list of tables"),
    (json.dumps([]), "no tables"),
]


@pytest.mark.parametrize("text,fragment", JSON, ids=range(len(JSON)))
def test_hostile_json_tables_get_one_line(tmp_path, text, fragment):
    (tmp_path / "t.json").write_text(text)
    with pytest.raises(UserError) as e:
        load_table_list(tmp_path / "t.json", max_mem_gb=4.0)
    assert fragment in str(e.value) and "\n" not in str(e.value) and len(str(e.value)) < 400


def test_names_with_dots_and_unicode_are_kept(tmp_path):
    (tmp_path / "t.json").write_text(json.dumps([{"name": "user.id", **T}, {"name": "géo", **T}]))
    assert load_table_list(tmp_path / "t.json").names == ["user.id", "géo"]


def test_columns_that_are_not_read_are_named_in_a_warning(tmp_path, capsys):
    """A misspelt bin column (bin_O) or an extra column would otherwise be dropped without a word."""
    (tmp_path / "t.csv").write_text("name,rows,dim,pooling_factor,bin_O,owner\nx,10,8,1,0.5,me\n")
    tl = load_table_list(tmp_path / "t.csv", max_mem_gb=4.0)
    assert tl.defaulted_reuse == ["x"]
    assert ("warning: column(s) 'bin_O', 'owner' are not read (a table list has name, rows, dim, pooling_factor and "
            "optionally bin_0..bin_16)") in capsys.readouterr().err
    (tmp_path / "t.json").write_text(json.dumps([{"name": "x", "rows": 10, "dim": 8, "pooling_factor": 1}]))
    load_table_list(tmp_path / "t.json", max_mem_gb=4.0)
    assert "not read" not in capsys.readouterr().err


def test_a_pooling_factor_outside_the_training_range_warns_with_the_range(tmp_path, capsys):
    (tmp_path / "t.csv").write_text(H + "seq,1000,64,100000\nok,10,8,3\n")
    tl = load_table_list(tmp_path / "t.csv", max_mem_gb=4.0)
    assert tl.task.pooling_factors.tolist() == [1e5, 3.0]
    err = capsys.readouterr().err
    assert "warning: 1 table(s) have pooling factors far outside the 0..200" in err and "seq (100000)" in err


def test_ids_and_dims_that_are_hostile(small_raw, tmp_path):
    save_raw(tmp_path / "ids.pt", *small_raw)
    from neuroshard.core.cli import int_list

    for dims, fragment in [("64,abc", "--dims must be comma-separated integers"),
                           ("9" * 5000, "--dims must be comma-separated integers"),
                           ("0", "dim must be a multiple of 4"), ("", "--dims must be comma-separated"),
                           ("64,64", "--dims gives 2 dims but"), ("1" + "0" * 30, "dim must be a multiple of 4")]:
        with pytest.raises(UserError, match=fragment) as e:
            tables_from_ids(tmp_path / "ids.pt", list(int_list(dims, "--dims")))
        assert len(str(e.value)) < 300  # a 5000-digit value is not echoed whole


def test_a_raw_id_no_device_can_hold_is_refused_with_the_numbers():
    lengths = torch.tensor([[1, 1], [1, 0]])
    offsets = torch.tensor([0, 1, 2, 3, 3])
    ok = validate_raw((torch.tensor([0, 5, 3]), offsets, lengths))
    assert ok[0].tolist() == [0, 5, 3]
    with pytest.raises(UserError, match=r"table 1 has id 1099511627776, so 1,099,511,627,777 rows: 16,384 GB even as "
                                        r"a 4-column shard, more than any device holds \(192 GB"):
        validate_raw((torch.tensor([0, 5, 2**40]), offsets, lengths))
    with pytest.raises(UserError, match="table 0 has id"):
        validate_raw((torch.tensor([0, max_rows_any_device(), 1]), offsets, lengths))


def test_a_table_without_lookups_may_have_no_reuse(tmp_path):
    (tmp_path / "t.csv").write_text(BINS + "x,10,8,0," + ",".join(["0"] * 17) + "\n")
    assert load_table_list(tmp_path / "t.csv").task.data_features[0, 2:].sum() == 0
