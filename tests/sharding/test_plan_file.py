"""--alg plan:FILE: a plan the user already has (plan.json or a TorchRec spec) is applied, scored and
measured like any algorithm's plan; a file that is not a complete plan for the task gets one line."""
import json
import re

import numpy as np
import pytest

from neuroshard.core.config import ShardTablesConfig
from neuroshard.core.errors import UserError
from neuroshard.core.costs import Cluster
from neuroshard.data.table_list import load_table_list
from neuroshard.planning.shard_tables import shard_tables
from neuroshard.sharding.plan import Placement, apply_splits, check_complete
from neuroshard.sharding.plan_file import PlanFileSharder, read_plan_file
from neuroshard.sharding.registry import algs_file_tag, expand_algs, make_sharder
from neuroshard.sharding.torchrec_export import plan_spec

from analytic_models import analytic_simulator
from conftest import refused

TABLES = "name,rows,dim,pooling_factor\nuser_id,20000,64,1\nitem_id,50000,128,1\ncategory,1000,16,3.5\n" \
         "history,30000,64,25\ntags,2000,32,8\ngeo,500,8,1\n"


def _placed(plan: Placement) -> set:
    return {(s.table, s.col_start, s.dim, d) for s, d in zip(plan.shards, plan.device_of)}


@pytest.fixture()
def tables(tmp_path):
    (tmp_path / "t.csv").write_text(TABLES)
    return tmp_path / "t.csv", load_table_list(tmp_path / "t.csv")


@pytest.mark.parametrize("alg", ["size_lookup_greedy", "dim_greedy"])
def test_plan_json_and_torchrec_spec_give_back_the_same_plan(tables, tmp_path, alg):
    path, tl = tables
    cfg = ShardTablesConfig(tables=str(path), ndevices=2, max_mem=0.025, alg=alg, out=str(tmp_path / "plan.json"),
                            torchrec_plan=str(tmp_path / "tr.json"), models=_no_models(tmp_path))
    made = shard_tables(cfg)["plan"]
    for f in ("plan.json", "tr.json"):
        got = make_sharder(f"plan:{tmp_path / f}")(tl.task, Cluster(2, 0.025))
        check_complete(tl.task, got)
        assert _placed(got) == _placed(made)
        assert apply_splits(tl.task.dims, got.splits) == got.shards


def _no_models(tmp_path):
    from neuroshard.core.config import CostModelFiles

    return CostModelFiles(str(tmp_path / "none.pt"), str(tmp_path / "none_fw.pt"), str(tmp_path / "none_bw.pt"))


def test_unequal_column_shards_and_the_simulated_cost_survive_the_round_trip(tables, tmp_path):
    _, tl = tables
    # item_id (128) -> 64 + 32 + 32 on three devices, history (64) -> 32 + 32: a NeuroShard-shaped plan
    shards = apply_splits(tl.task.dims, [1, 6, 3])
    plan = Placement(3, shards, [0, 1, 2, 0, 1, 2, 2, 0, 1][: len(shards)], [1, 6, 3])
    check_complete(tl.task, plan)
    (tmp_path / "p.json").write_text(json.dumps(plan_spec(tl.names, tl.rows, tl.task.dims, plan)))
    got = PlanFileSharder(tmp_path / "p.json")(tl.task, Cluster(3, 1.0))
    assert _placed(got) == _placed(plan)
    sim = analytic_simulator(3)
    assert sim.plan_cost(tl.task, got).cost_ms == pytest.approx(sim.plan_cost(tl.task, plan).cost_ms)


def test_a_plan_for_other_tables_or_devices_is_refused(tables, tmp_path):
    path, tl = tables
    shard_tables(ShardTablesConfig(tables=str(path), ndevices=2, max_mem=1.0, alg="dim_greedy",
                                   out=str(tmp_path / "plan.json"), models=_no_models(tmp_path)))
    sharder = PlanFileSharder(tmp_path / "plan.json")
    with pytest.raises(UserError, match="plan for 2 devices, this run has 3"):
        sharder(tl.task, Cluster(3, 1.0))
    other = load_table_list(path)
    other.task.dims[2] = 32
    with pytest.raises(UserError, match=r"differ first at table 2 \(rows, dim\): plan \(1000, 16\), task \(1000, 32\)"):
        sharder(other.task, Cluster(2, 1.0))


HOSTILE = {
    "not_utf8.json": (b"\xff\xfe{\x00", "not UTF-8"),
    "deep.json": (b"[" * 100_000 + b"]" * 100_000, "not a usable plan file \\(nested too deeply\\)"),
    "garbage.json": (b"{not json", "not valid JSON"),
    "huge_int.json": (b'{"kind": "neuroshard.torchrec_plan", "world_size": ' + b"9" * 5000 + b', "tables": []}',
                      "not a usable plan file"),
    "other_kind.json": (json.dumps({"kind": "something.else", "tables": []}).encode(), "not a neuroshard TorchRec plan"),
    "uncovered.json": (json.dumps({"kind": "neuroshard.torchrec_plan", "world_size": 2, "tables": [
        {"name": "a", "rows": 10, "dim": 8, "shards": [{"col_offset": 0, "width": 4, "rank": 0}]}]}).encode(),
        "columns not covered exactly once"),
    "bad_rank.json": (json.dumps({"kind": "neuroshard.plan", "ndevices": 2, "tables": [
        {"name": "a", "rows": 10, "dim": 8, "shards": [{"col_offset": 0, "width": 8, "rank": 5}]}]}).encode(),
        "rank 5 outside 0..1"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_plan_files_get_one_clear_error(tmp_path, name):
    data, fragment = HOSTILE[name]
    (tmp_path / name).write_bytes(data)
    with pytest.raises(UserError, match=fragment):
        read_plan_file(tmp_path / name)


def test_script_refuses_a_bad_plan_file_without_writing(tables, tmp_path, capsys):
    path, _ = tables
    (tmp_path / "bad.json").write_bytes(HOSTILE["uncovered.json"][0])
    refused(capsys, "tools/shard_tables.py", "--tables", path, "--alg", f"plan:{tmp_path / 'bad.json'}",
            "--ndevices", 2, "--out", tmp_path / "plan.json", untouched=[tmp_path], quiet=False, match=re.escape(
                f"error: {tmp_path}/bad.json table 0 ('a'): columns not covered exactly once (column 4)"))
    refused(capsys, "tools/shard_tables.py", "--tables", path, "--alg", f"plan:{tmp_path / 'missing.json'}",
            "--ndevices", 2, "--out", tmp_path / "plan.json", untouched=[tmp_path], quiet=False, match=re.escape(
                f"error: plan file not found: {tmp_path}/missing.json; pass a plan.json or a --torchrec_plan file "
                "(tools/shard_tables.py --out or --torchrec_plan)"))


def test_alg_names_expand_and_plan_files_make_safe_file_names():
    assert expand_algs(["dim_greedy", "plan:x/y.json", "dim_greedy"]) == ["dim_greedy", "plan:x/y.json"]
    assert "neuroshard" in expand_algs(["all"])
    for bad in (["plan:"], ["nope"], []):
        with pytest.raises(UserError):
            expand_algs(bad)
    assert algs_file_tag(["neuroshard", "plan:../a b/cur.json"]) == "neuroshard+plan-cur"
    assert np.all([c.isalnum() or c in "_.+-" for c in algs_file_tag(["plan:/tmp/x;rm -rf.json"])])


def test_each_plan_format_is_read_back_by_its_one_reader(tables, tmp_path):
    """Every plan format's reader is the inverse of its writer: plan.json (`plan_record`, `read_plan_file`), the
    TorchRec spec file (`write_torchrec_plan`, `read_torchrec_plan`) and a plan's plain data (`to_dict`,
    `Placement.from_dict`, as evaluation rows and a calibration's step-fit plans store it)."""
    from neuroshard.core.artifacts import write_json
    from neuroshard.sharding.plan_file import plan_record
    from neuroshard.sharding.torchrec_export import read_torchrec_plan, write_torchrec_plan

    _, tl = tables
    plan = Placement(3, apply_splits(tl.task.dims, [1, 6]), [0, 1, 2, 0, 1, 2, 2, 0], [1, 6])
    spec = plan_spec(tl.names, tl.rows, tl.task.dims, plan)
    record = plan_record(spec, tl.task.pooling_factors, alg="mine", chosen="mine", ndevices=None, max_mem_gb=1.0)
    assert list(record)[:5] == ["kind", "alg", "chosen", "ndevices", "max_mem_gb"] and record["ndevices"] == 3
    assert [t["pooling_factor"] for t in record["tables"]] == [float(x) for x in tl.task.pooling_factors]
    write_json(tmp_path / "plan.json", record)
    assert read_plan_file(tmp_path / "plan.json") == spec
    write_torchrec_plan(tmp_path / "tr.json", spec, alg="mine")
    assert read_torchrec_plan(tmp_path / "tr.json") == spec == read_plan_file(tmp_path / "tr.json")
    again = Placement.from_dict(json.loads(json.dumps(plan.to_dict())), tl.task.dims, 3)
    assert _placed(again) == _placed(plan) and again.to_dict() == plan.to_dict()


def test_rank_shard_lists_are_checked_as_the_drift_reference_needs():
    from neuroshard.core.errors import PlanError
    from neuroshard.sharding.plan import check_rank_shards

    rows, dims, cluster = [1000, 2000], [64, 12], Cluster(2, 1.0)
    check_rank_shards([[[0, 64], [1, 12]], [[0, 32]]], rows, cluster, dims)
    check_rank_shards([[[0, 48]], [[1, 8]]], rows, cluster)  # without the tables' dims: any multiple of 4
    for bad in ([[[0, 64]]],                       # one rank of two
                [[[0, 64]], []],                  # a rank without shards
                [[[0, 48]], [[1, 12]]],           # 48 is no halving of 64
                [[[0, 64]], [[2, 8]]],            # no table 2
                [[[0, 64]], [[True, 8]]],         # not whole numbers
                [[[0, 64]], [[1, 12, 0]]],        # not [table, dim]
                [[[0, 64]], 5],                   # not a list
                [[[0, 64]], [[1, 6]]]):           # not a multiple of 4
        with pytest.raises(PlanError):
            check_rank_shards(bad, rows, cluster, dims)
    with pytest.raises(PlanError, match="over a rank's memory"):
        check_rank_shards([[[0, 64]], [[1, 12]]], [10**7, 10], Cluster(2, 1.0), dims)


def test_a_plan_with_row_wise_or_data_parallel_tables_is_refused_not_misread(tables, tmp_path, capsys):
    """NeuroShardPlanner's export may hold row-wise and data-parallel tables: one shard of every column per rank.
    Read as column slices they would be whole tables on their last rank; `--alg plan:` refuses them in one line,
    before any work, and writes nothing."""
    from neuroshard.sharding.planner.row_wise import row_blocks

    path, tl = tables
    spec = plan_spec(tl.names, tl.rows, tl.task.dims, Placement(2, apply_splits(tl.task.dims, []), [0, 1, 0, 1, 0, 1]))
    spec["tables"][0].update(sharding_type="row_wise", shards=[
        {"col_offset": 0, "width": 64, "rank": r, "row_offset": o, "rows": n}
        for r, (o, n) in enumerate(row_blocks(20000, 2))])
    spec["tables"][5].update(sharding_type="data_parallel",
                             shards=[{"col_offset": 0, "width": 8, "rank": r} for r in range(2)])
    (tmp_path / "rw.json").write_text(json.dumps(spec))
    assert read_plan_file(tmp_path / "rw.json")["tables"][0]["sharding_type"] == "row_wise"  # a valid spec
    line = (f"{tmp_path}/rw.json: table 'user_id' is row_wise (2 such table(s), as NeuroShardPlanner plans them); "
            "--alg plan: places whole tables and column shards only; run this plan in TorchRec's own step "
            "(neuroshard.sharding.torchrec_export.load_torchrec_plan, then DistributedModelParallel)")
    _refused_in_one_line(capsys, path, tmp_path / "rw.json", line)


def _refused_in_one_line(capsys, tables_csv, plan_file, line: str) -> None:
    """`PlanFileSharder` and `shard_tables --alg plan:` refuse `plan_file` with exactly `line`, writing nothing."""
    with pytest.raises(UserError, match="^" + re.escape(line) + "$"):
        PlanFileSharder(plan_file)
    refused(capsys, "tools/shard_tables.py", "--tables", tables_csv, "--alg", f"plan:{plan_file}",
            "--ndevices", 2, "--out", plan_file.parent / "plan.json", untouched=[plan_file.parent], quiet=False,
            match=re.escape(f"error: {line}"))


def test_a_plan_with_table_column_wise_tables_is_refused_not_mispriced(tables, tmp_path, capsys):
    """A table_column_wise table's column slices read back as a task's column shards would be priced and measured in
    the column-wise group, whose collectives are not its own: `--alg plan:` refuses it in one line and writes
    nothing; the same plan with the type column_wise is taken."""
    path, tl = tables
    spec = plan_spec(tl.names, tl.rows, tl.task.dims, Placement(2, apply_splits(tl.task.dims, [1]), [0, 1, 0, 1, 0, 1, 0]))
    assert [len(t["shards"]) for t in spec["tables"]][1] == 2  # item_id in two column shards
    (tmp_path / "cw.json").write_text(json.dumps(spec))
    check_complete(tl.task, PlanFileSharder(tmp_path / "cw.json")(tl.task, Cluster(2, 1.0)))
    spec["tables"][1]["sharding_type"] = "table_column_wise"
    (tmp_path / "twcw.json").write_text(json.dumps(spec))
    assert read_plan_file(tmp_path / "twcw.json")["tables"][1]["sharding_type"] == "table_column_wise"  # valid
    line = (f"{tmp_path}/twcw.json: table 'item_id' is table_column_wise (1 such table(s)); --alg plan: prices and "
            "measures column shards as column_wise, whose collectives are not table_column_wise's; run this plan in "
            "TorchRec's own step (neuroshard.sharding.torchrec_export.load_torchrec_plan, then "
            "DistributedModelParallel) or plan these tables with --sharding_types")
    _refused_in_one_line(capsys, path, tmp_path / "twcw.json", line)
