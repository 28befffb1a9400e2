"""Hostile and careless TorchRec plan files (load_torchrec_plan): every category gets one line naming
the entry before TorchRec sees it; names TorchRec cannot take (a dot) are mapped to legal module names
while the user's names stay in the files."""
import copy
import re
import json

import pytest

pytest.importorskip("torchrec")

from neuroshard.core.errors import UserError  # noqa: E402
from neuroshard.sharding.torchrec_export import load_torchrec_plan, module_names  # noqa: E402

GOOD = {"kind": "neuroshard.torchrec_plan", "world_size": 2, "tables": [
    {"name": "a", "rows": 50, "dim": 16, "shards": [{"col_offset": 0, "width": 8, "rank": 0},
                                                   {"col_offset": 8, "width": 8, "rank": 1}]},
    {"name": "b", "rows": 30, "dim": 8, "shards": [{"col_offset": 0, "width": 8, "rank": 1}]}]}


def _with(path, **change):
    """GOOD with one entry changed: keys 'world_size', 'tables', 't0', 't0.shards.0' name where."""
    spec = copy.deepcopy(GOOD)
    for where, value in change.items():
        parts = where.split("__")
        obj = spec
        for p in parts[:-1]:
            obj = obj[int(p)] if isinstance(obj, list) else obj[p]
        key = parts[-1]
        if isinstance(obj, list):
            obj[int(key)] = value
        else:
            obj[key] = value
    path.write_text(json.dumps(spec))
    return path


CASES = [
    ({"kind": "other"}, "is not a neuroshard TorchRec plan"),
    ({"world_size": 0}, "world_size 0 outside 1..1024"),
    ({"world_size": 10**30}, "world_size 1000000000000000000000000000000 outside 1..1024"),
    ({"world_size": 2.0}, "world_size 2.0 outside"),
    ({"world_size": True}, "world_size True outside"),
    ({"tables": []}, "a plan needs 1 to"),
    ({"tables__0": "a"}, "table 0: expected an object"),
    ({"tables__0__name": ""}, "table 0: name must be one line"),
    ({"tables__0__name": 7}, "table 0: name must be one line"),
    ({"tables__0__name": "a\nb"}, "table 0: name must be one line"),
    ({"tables__1__name": "a"}, "table 1: duplicate table name 'a' (also table 0)"),
    ({"tables__0__rows": 0}, "table 0 ('a'): rows 0 outside 1.."),
    ({"tables__0__rows": 10**15}, "table 0 ('a'): rows 1000000000000000 outside"),
    ({"tables__0__rows": "50"}, "rows '50' outside"),
    ({"tables__0__rows": 50.5}, "rows 50.5 outside"),
    ({"tables__0__dim": 0}, "dim 0 outside 1..4096"),
    ({"tables__0__dim": 10**12}, "dim 1000000000000 outside 1..4096"),
    ({"tables__0__dim": None}, "dim None outside"),
    ({"tables__0__shards": []}, "shards must be a list of 1 to 16"),
    ({"tables__0__shards": "all"}, "shards must be a list"),
    ({"tables__0__shards__0__rank": 2}, "rank 2 outside 0..1"),
    ({"tables__0__shards__0__rank": -1}, "rank -1 outside"),
    ({"tables__0__shards__0__rank": 0.5}, "rank 0.5 outside"),
    ({"tables__0__shards__0__col_offset": 4}, "columns not covered exactly once (column 0)"),
    ({"tables__0__shards__0__width": 12}, "columns not covered exactly once (column 8)"),
    ({"tables__0__shards__1__width": 4}, "columns not covered exactly once (column 12)"),
    ({"tables__0__shards__1__col_offset": 99}, "col_offset 99 outside 0..15"),
    ({"tables__0__shards__1__width": 10**9}, "width 1000000000 outside"),
    ({"tables__0__sharding_type": "row_wise"}, "row_offset None outside"),  # a row-wise entry needs its row blocks
    ({"tables__0__sharding_type": "row_wise", "tables__0__shards__0__row_offset": 0, "tables__0__shards__0__rows": 5,
      "tables__0__shards__1__row_offset": 5, "tables__0__shards__1__rows": 5},
     "row block 0 must be rows 0..25 of every column on rank 0 (TorchRec's row-wise cut)"),
    ({"tables__0__sharding_type": 5}, "sharding_type must be table_wise (one shard), column_wise, table_column_wise, "
                                      "row_wise, table_row_wise or data_parallel, got 5"),
    ({"tables__0__sharding_type": "table_row_wise"}, "table 0 ('a'): row_offset None outside"),
    ({"tables__0__sharding_type": "data_parallel"}, "a data_parallel table needs a whole shard on every rank"),
    ({"tables__0__sharding_type": "table_wise"}, "sharding_type must be table_wise (one shard)"),  # a split table
]


@pytest.mark.parametrize("change,fragment", CASES, ids=range(len(CASES)))
def test_bad_plan_entries_get_one_line(tmp_path, change, fragment):
    path = _with(tmp_path / "p.json", **change)
    with pytest.raises(UserError) as e:
        load_torchrec_plan(path)
    assert fragment in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_device_type_torchrec_cannot_place_is_one_line(tmp_path):
    path = _with(tmp_path / "p.json")
    for bad in ("tpu", "", None):
        with pytest.raises(UserError, match="device_type must be 'cpu' or 'cuda'"):
            load_torchrec_plan(path, device_type=bad)


def test_uneven_shard_widths_are_refused_before_torchrec(tmp_path):
    spec = copy.deepcopy(GOOD)
    spec["tables"][0].update(dim=12, shards=[{"col_offset": 0, "width": 8, "rank": 0},
                                             {"col_offset": 8, "width": 4, "rank": 1}])
    (tmp_path / "ok.json").write_text(json.dumps(spec))  # 8 + 4: blocks of 4 on ranks 0, 0, 1
    assert load_torchrec_plan(tmp_path / "ok.json", device_type="cpu").plan[""]["a"].sharding_type == "column_wise"
    spec["tables"][0].update(dim=20, shards=[{"col_offset": 0, "width": 8, "rank": 0},
                                             {"col_offset": 8, "width": 12, "rank": 1}])
    (tmp_path / "p.json").write_text(json.dumps(spec))
    with pytest.raises(UserError, match=r"shard width 12 is not a multiple of the narrowest \(8\)"):
        load_torchrec_plan(tmp_path / "p.json")


@pytest.mark.parametrize("data,fragment", [
    (b"\xff\xfe{}", "not UTF-8 text"), (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"world_size": 1' + b"0" * 5000 + b"}", "not a usable plan"), (b"{oops", "not valid JSON"),
    (b"", "not valid JSON"), (b"[1, 2]", "is not a neuroshard TorchRec plan")])
def test_unreadable_plan_files_get_one_line(tmp_path, data, fragment):
    (tmp_path / "p.json").write_bytes(data)
    with pytest.raises(UserError, match=fragment):
        load_torchrec_plan(tmp_path / "p.json")


def test_names_with_dots_map_to_legal_module_names():
    assert module_names(["user.id", "user_id", "a.b.c", "x"]) == ["user_id_2", "user_id", "a_b_c", "x"]
    assert module_names(["a.b", "a_b"]) == ["a_b_2", "a_b"]


def test_dotted_names_plan_end_to_end(tmp_path):
    from neuroshard.core.config import ShardTablesConfig
    from neuroshard.planning.shard_tables import shard_tables

    (tmp_path / "t.csv").write_text("name,rows,dim,pooling_factor\nuser.id,1000,16,1\nitem.id,500,8,2\nuser_id,50,8,1\n")
    shard_tables(ShardTablesConfig(tables=str(tmp_path / "t.csv"), ndevices=2, max_mem=1.0, alg="dim_greedy",
                                   out=str(tmp_path / "plan.json"), torchrec_plan=str(tmp_path / "tr.json")))
    written = json.loads((tmp_path / "tr.json").read_text())
    assert [t["name"] for t in written["tables"]] == ["user.id", "item.id", "user_id"]
    assert [t["module_name"] for t in written["tables"]] == ["user_id_2", "item_id", "user_id"]
    assert [t["name"] for t in json.loads((tmp_path / "plan.json").read_text())["tables"]] == \
        ["user.id", "item.id", "user_id"]
    plan = load_torchrec_plan(tmp_path / "tr.json", device_type="cpu").plan[""]
    assert set(plan) == {"user_id_2", "item_id", "user_id"}


@pytest.mark.parametrize("change,fragment", [({"ndevices": "2"}, "ndevices '2' outside 1..1024"),
                                             ({"ndevices": None}, "ndevices None outside 1..1024"),
                                             ({"tables__0__sharding_typ": "row_wise"}, "unknown key 'sharding_typ'"),
                                             ({"tables__0__name": "a\nb"}, "name must be one line"),
                                             ({"tables__0__shards__0__rank": 9}, "rank 9 outside 0..1")])
def test_alg_plan_file_gets_the_same_checks(tmp_path, change, fragment):
    from neuroshard.sharding.plan_file import read_plan_file

    spec = copy.deepcopy(GOOD)
    plan = {"kind": "neuroshard.plan", "ndevices": 2, "tables": spec["tables"]}
    for where, value in change.items():
        parts = where.split("__")
        obj = plan
        for p in parts[:-1]:
            obj = obj[int(p)] if isinstance(obj, list) else obj[p]
        obj[int(parts[-1]) if isinstance(obj, list) else parts[-1]] = value
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    with pytest.raises(UserError, match=re.escape(fragment)):
        read_plan_file(tmp_path / "plan.json")


def test_a_ctrl_c_while_the_plan_files_are_written_waits_until_both_are_whole(tmp_path, monkeypatch, capsys):
    """plan.json and the TorchRec plan are written as one step (`write_plan_outputs`): a Ctrl-C that arrives
    between them is delivered once both are written, and the script's line says so (it said "nothing was
    written" and left plan.json without its TorchRec file, or beside an older one)."""
    import os
    import signal

    from neuroshard.core.cli import run_main
    from neuroshard.sharding import plan_file
    from neuroshard.sharding.torchrec_export import read_torchrec_plan

    real = plan_file.write_json

    def write_then_ctrl_c(path, obj, *args):
        out = real(path, obj, *args)
        os.kill(os.getpid(), signal.SIGINT)
        return out

    monkeypatch.setattr(plan_file, "write_json", write_then_ctrl_c)
    (tmp_path / "tr.json").write_text("an older run's file")
    record = plan_file.plan_record(GOOD, [1.0] * len(GOOD["tables"]), alg="dim_greedy")
    before = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as e:
            run_main(lambda argv: plan_file.write_plan_outputs(tmp_path / "plan.json", record, tmp_path / "tr.json",
                                                               GOOD, alg="dim_greedy"))
    finally:
        signal.signal(signal.SIGTERM, before)  # run_main installs its own handler
    assert e.value.code == 130
    assert capsys.readouterr().err == (f"interrupted: {tmp_path / 'plan.json'} and {tmp_path / 'tr.json'} written "
                                       "in full first\n")
    assert plan_file.read_plan_file(tmp_path / "plan.json")["tables"] == read_torchrec_plan(tmp_path / "tr.json")["tables"]
