"""Export to TorchRec: the plan TorchRec builds covers every column once on the right ranks, and
DistributedModelParallel shards a real EmbeddingBagCollection with it on 2 gloo ranks, giving the
unsharded module's pooled outputs."""
import json

import numpy as np
import pytest

pytest.importorskip("torchrec")

from neuroshard.core.errors import UserError  # noqa: E402
from neuroshard.hardware.launch import run_processes  # noqa: E402
from neuroshard.sharding.plan import Placement, apply_splits  # noqa: E402
from neuroshard.sharding.torchrec_export import (load_torchrec_plan, plan_spec, to_torchrec_plan,  # noqa: E402
                                                 write_torchrec_plan)

import torchrec_workers  # noqa: E402


def _spec():
    # table a (dim 16): halves of 8 and two quarters of 4 -> uneven shards on ranks 0, 1, 0;
    # table b (dim 8) whole on rank 1; table c (dim 32): two halves, both on rank 1
    dims = np.array([16, 8, 32])
    shards = apply_splits(dims, [0, 3, 2])
    by_shard = {(s.table, s.col_start): s for s in shards}
    want = {(0, 0): 0, (0, 8): 1, (0, 12): 0, (1, 0): 1, (2, 0): 1, (2, 16): 1}
    plan = Placement(2, shards, [want[(s.table, s.col_start)] for s in shards], [0, 3, 2])
    assert set(by_shard) == set(want)
    return plan_spec(["a", "b", "c"], [50, 30, 20], dims, plan)


def test_plan_covers_every_column_once_on_the_right_ranks():
    spec = _spec()
    tr_plan = to_torchrec_plan(spec)
    module_plan = tr_plan.plan[""]
    assert set(module_plan) == {"a", "b", "c"}
    for t in spec["tables"]:
        ps = module_plan[t["name"]]
        owner = np.full(t["dim"], -1)
        for m in ps.sharding_spec.shards:
            r0, c0 = m.shard_offsets
            rs, cs = m.shard_sizes
            assert r0 == 0 and rs == t["rows"]
            assert (owner[c0:c0 + cs] == -1).all(), "a column placed twice"
            owner[c0:c0 + cs] = m.placement.rank()
        want = np.concatenate([[s["rank"]] * s["width"] for s in t["shards"]])
        assert owner.tolist() == want.tolist(), t["name"]
    assert module_plan["b"].sharding_type == "table_wise" and module_plan["a"].sharding_type == "column_wise"


def test_plan_file_round_trip_and_bad_files(tmp_path):
    write_torchrec_plan(tmp_path / "p.json", _spec())
    plan = load_torchrec_plan(tmp_path / "p.json").plan[""]
    assert set(plan) == {"a", "b", "c"}
    # the kernel the plans are handed out and measured on, unless the caller names another
    assert {p.compute_kernel for p in plan.values()} == {"fused"}
    assert {p.compute_kernel for p in load_torchrec_plan(tmp_path / "p.json", compute_kernel=None).plan[""].values()
            } == {"dense"}
    with pytest.raises(UserError, match="load_torchrec_plan: compute_kernel must be 'fused', 'dense' or None, got "
                                        "'fused_uvm'"):
        load_torchrec_plan(tmp_path / "p.json", compute_kernel="fused_uvm")
    with pytest.raises(UserError, match="load_torchrec_plan: module_path must be a string"):
        load_torchrec_plan(tmp_path / "p.json", module_path=None)
    assert {str(m.placement) for p in load_torchrec_plan(tmp_path / "p.json", local_size=1).plan[""].values()
            for m in p.sharding_spec.shards} == {"rank:0/cuda:0", "rank:1/cuda:0"}  # two hosts of one GPU
    bad = json.loads((tmp_path / "p.json").read_text())
    bad["tables"][0]["shards"][0]["rank"] = 5
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(UserError, match="rank 5 outside"):
        load_torchrec_plan(tmp_path / "bad.json")
    bad["tables"][0]["shards"][0].update(rank=0, width=4)
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(UserError, match="not covered exactly once"):
        load_torchrec_plan(tmp_path / "bad.json")


def test_a_key_a_plan_entry_does_not_have_is_refused_where_it_would_change_the_plan(tmp_path):
    """A misspelt sharding_type would read as table-wise, a row block's keys on a table-wise shard, a shard's
    placement or a plan-wide kernel would be dropped: each is refused in one line naming the key and where it is."""
    write_torchrec_plan(tmp_path / "p.json", _spec())
    good = json.loads((tmp_path / "p.json").read_text())
    for change, match in [(lambda p: p["tables"][1].update(sharding_typ="row_wise"), r"table 1 \('b'\): unknown key "
                           r"'sharding_typ' \(a table holds name, module_name, rows, dim, sharding_type, shards\)"),
                          (lambda p: p["tables"][1]["shards"][0].update(row_offset=10, rows=5),
                           r"table 1 \('b'\): unknown key 'row_offset' \(a table_wise or column_wise shard holds "
                           r"col_offset, width, rank\)"),
                          (lambda p: p["tables"][0]["shards"][0].update(placement="rank:1/cuda:1"),
                           "unknown key 'placement'"),
                          (lambda p: p.update(compute_kernel="dense"), r"bad\.json: unknown key 'compute_kernel' \(a plan "
                           "holds kind, world_size, tables, provenance\)")]:
        bad = json.loads(json.dumps(good))
        change(bad)
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(UserError, match=match):
            load_torchrec_plan(tmp_path / "bad.json")


def test_torchrec_device_indices_stay_within_a_host():
    """Rank r's device is cuda:(r % local_size), and torch keeps a device index in 8 signed bits: a plan of more
    than 128 ranks on one CUDA host is refused in one line (it wrapped to cuda:-56 or the wrong GPU), placed per
    host with `local_size`, and on CPU ranks it needs none. A table named like a module attribute ("training")
    gets a module name TorchRec can add."""
    from neuroshard.sharding.torchrec_export import module_names

    spec = {"kind": "neuroshard.torchrec_plan", "world_size": 300, "tables": [
        {"name": "training", "rows": 10, "dim": 8, "shards": [{"col_offset": 0, "width": 8, "rank": 299}]}]}

    def placements(plan):
        return [str(m.placement) for ps in plan.plan[""].values() for m in ps.sharding_spec.shards]

    with pytest.raises(UserError, match=r"^300 ranks on one host would be CUDA devices 0..299, past torch's device "
                                        r"index 127; pass local_size"):
        to_torchrec_plan(spec)
    assert placements(to_torchrec_plan(spec, local_size=8)) == ["rank:299/cuda:3"]
    assert placements(to_torchrec_plan(spec, device_type="cpu")) == ["rank:299/cpu"]
    assert list(to_torchrec_plan(spec, device_type="cpu").plan[""]) == ["training_2"]
    for bad in (0, 301, True, 8.0):
        with pytest.raises(UserError, match=r"local_size .* must be a whole number of ranks per host, 1..300"):
            to_torchrec_plan(spec, local_size=bad)
    assert module_names(["training", "forward", "a.b", "a_b", ""]) == ["training_2", "forward_2", "a_b_2", "a_b", "table"]


def test_a_plan_file_with_a_key_given_twice_is_refused(tmp_path):
    """JSON keeps the last of two equal keys without a word; a plan (or table list) file holding one is refused."""
    write_torchrec_plan(tmp_path / "p.json", _spec())
    text = (tmp_path / "p.json").read_text()
    (tmp_path / "dup.json").write_text(text.replace('"rank": 0', '"rank": 1, "rank": 0', 1))
    with pytest.raises(UserError, match=r"dup.json: key 'rank' appears twice in one object .*; rewrite it with"):
        load_torchrec_plan(tmp_path / "dup.json")


def test_distributed_model_parallel_runs_the_written_plan_file(tmp_path):
    got = {}
    write_torchrec_plan(tmp_path / "p.json", _spec())
    run_processes(torchrec_workers.dmp_matches_unsharded, 2, (_spec(), 6, str(tmp_path / "p.json")),
                  lambda m: got.__setitem__(m[0], m[1:]), group_device="cpu")
    for rank, (err, held) in got.items():
        assert max(err.values()) < 1e-5, (rank, err)
    # each rank holds exactly the columns the plan gives it
    cols = {r: {n: sorted(c for c0, w in pieces for c in range(c0, c0 + w)) for n, pieces in held.items()}
            for r, (_, held) in got.items()}
    assert cols[0] == {"a": [0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14, 15]}
    assert cols[1] == {"a": [8, 9, 10, 11], "b": list(range(8)), "c": list(range(32))}


def test_row_wise_and_data_parallel_entries_are_torchrecs_or_one_line():
    """A row-wise entry (NeuroShardPlanner's) must hold TorchRec's own row blocks, one per rank, and a data-parallel
    one a whole replica on every rank; both become TorchRec's row_wise() and data_parallel() shardings, and anything
    else is one line naming the entry."""
    import copy

    from neuroshard.sharding.torchrec_export import check_spec

    spec = {"kind": "neuroshard.torchrec_plan", "world_size": 2, "tables": [
        {"name": "a", "rows": 11, "dim": 8, "sharding_type": "row_wise",
         "shards": [{"col_offset": 0, "width": 8, "rank": 0, "row_offset": 0, "rows": 6},
                    {"col_offset": 0, "width": 8, "rank": 1, "row_offset": 6, "rows": 5}]},
        {"name": "b", "rows": 10, "dim": 4, "sharding_type": "data_parallel",
         "shards": [{"col_offset": 0, "width": 4, "rank": 0}, {"col_offset": 0, "width": 4, "rank": 1}]}]}
    plan = to_torchrec_plan(copy.deepcopy(spec), device_type="cpu", compute_kernel="fused").plan[""]
    assert plan["a"].sharding_type == "row_wise" and plan["a"].compute_kernel == "fused"
    assert [(m.shard_offsets, m.shard_sizes, m.placement.rank()) for m in plan["a"].sharding_spec.shards] == [
        ([0, 0], [6, 8], 0), ([6, 0], [5, 8], 1)]
    assert plan["b"].sharding_type == "data_parallel" and plan["b"].compute_kernel == "dense"
    for table, shard, change, fragment in [
            (0, 1, {"rows": 6, "row_offset": 5}, "row block 0 must be rows 0..6 of every column on rank 0"),
            (0, 0, {"width": 4}, "row block 0 must be rows 0..6"),
            (0, 1, {"rank": True}, "rank True outside"),
            (1, 1, {"rank": True}, "rank True outside"),
            (1, 0, {"rank": 1}, "a data_parallel table needs a whole shard on every rank, in rank order")]:
        bad = copy.deepcopy(spec)
        bad["tables"][table]["shards"][shard].update(change)
        if table == 0 and "row_offset" in change:
            bad["tables"][0]["shards"][0]["rows"] = 5
        with pytest.raises(UserError, match=fragment):
            check_spec(bad)
    short = copy.deepcopy(spec)
    short["tables"][0]["shards"].pop()
    with pytest.raises(UserError, match=r"a row_wise table needs one shard per rank \(2\)"):
        check_spec(short)


def test_a_table_row_wise_entry_is_torchrecs_on_one_host_only():
    """A table_row_wise entry holds the same row blocks as a row_wise one and becomes TorchRec's
    table_row_wise(host_index=0) sharding with the kernel asked for; a local_size that makes several hosts (where
    TorchRec would cut it over one host's ranks) is one line."""
    import copy

    spec = {"kind": "neuroshard.torchrec_plan", "world_size": 2, "tables": [
        {"name": "a", "rows": 11, "dim": 8, "sharding_type": "table_row_wise",
         "shards": [{"col_offset": 0, "width": 8, "rank": 0, "row_offset": 0, "rows": 6},
                    {"col_offset": 0, "width": 8, "rank": 1, "row_offset": 6, "rows": 5}]}]}
    plan = to_torchrec_plan(copy.deepcopy(spec), device_type="cpu", compute_kernel="fused").plan[""]
    assert plan["a"].sharding_type == "table_row_wise" and plan["a"].compute_kernel == "fused"
    assert [(m.shard_offsets, m.shard_sizes, m.placement.rank()) for m in plan["a"].sharding_spec.shards] == [
        ([0, 0], [6, 8], 0), ([6, 0], [5, 8], 1)]
    with pytest.raises(UserError, match=r"^table 'a' is planned table_row_wise over all 2 ranks, but local_size=1 "
                                        r"makes several hosts; plan it for this topology$"):
        to_torchrec_plan(copy.deepcopy(spec), device_type="cpu", compute_kernel="fused", local_size=1)


def test_a_table_column_wise_entry_is_torchrecs_on_one_host_only():
    """A table_column_wise entry holds column blocks as a column_wise one and becomes TorchRec's table_column_wise
    sharding of the same blocks on the same ranks (a whole table one block); its shards are checked as a column_wise
    table's; a local_size that makes several hosts is one line."""
    import copy

    from neuroshard.sharding.torchrec_export import check_spec

    spec = {"kind": "neuroshard.torchrec_plan", "world_size": 2, "tables": [
        {"name": "a", "rows": 11, "dim": 16, "sharding_type": "table_column_wise",
         "shards": [{"col_offset": 0, "width": 8, "rank": 1}, {"col_offset": 8, "width": 4, "rank": 0},
                    {"col_offset": 12, "width": 4, "rank": 1}]},
        {"name": "b", "rows": 5, "dim": 8, "sharding_type": "table_column_wise",
         "shards": [{"col_offset": 0, "width": 8, "rank": 0}]}]}
    plan = to_torchrec_plan(copy.deepcopy(spec), device_type="cpu", compute_kernel="fused").plan[""]
    assert plan["a"].sharding_type == plan["b"].sharding_type == "table_column_wise"
    assert plan["a"].compute_kernel == "fused"
    assert [(m.shard_offsets, m.shard_sizes, m.placement.rank()) for m in plan["a"].sharding_spec.shards] == [
        ([0, 0], [11, 4], 1), ([0, 4], [11, 4], 1), ([0, 8], [11, 4], 0), ([0, 12], [11, 4], 1)]
    assert [(m.shard_offsets, m.shard_sizes, m.placement.rank()) for m in plan["b"].sharding_spec.shards] == [
        ([0, 0], [5, 8], 0)]
    bad = copy.deepcopy(spec)
    bad["tables"][0]["shards"][1]["col_offset"] = 9
    with pytest.raises(UserError, match=r"table 0 \('a'\): columns not covered exactly once \(column 8\)"):
        check_spec(bad)
    # blocks of 2 columns: TorchRec would widen them to 4 and put columns on other ranks than the file names
    narrow = copy.deepcopy(spec)
    narrow["tables"][1]["shards"] = [{"col_offset": c, "width": 2, "rank": r} for c, r in ((0, 1), (2, 0), (4, 1),
                                                                                          (6, 0))]
    with pytest.raises(UserError, match=r"table 1 \('b'\): column shards of 2 columns; TorchRec cuts a table's "
                                        r"column blocks in multiples of 4 columns"):
        check_spec(narrow)
    with pytest.raises(UserError, match=r"^table 'a' is planned table_column_wise over all 2 ranks, but local_size=1 "
                                        r"makes several hosts; plan it for this topology$"):
        to_torchrec_plan(copy.deepcopy(spec), device_type="cpu", compute_kernel="fused", local_size=1)


def test_a_grid_shard_entry_is_torchrecs_on_one_host_only():
    """A grid_shard entry holds the row blocks of a row_wise one (checked alike) and becomes TorchRec's grid_shard of
    its column blocks (TorchRec's width: 128 of 256 columns), each row-wise over the host's ranks: every rank its rows
    of every column; a local_size that makes several hosts is one line."""
    import copy

    from neuroshard.sharding.torchrec_export import check_spec

    spec = {"kind": "neuroshard.torchrec_plan", "world_size": 2, "tables": [
        {"name": "g", "rows": 11, "dim": 256, "sharding_type": "grid_shard",
         "shards": [{"col_offset": 0, "width": 256, "rank": 0, "row_offset": 0, "rows": 6},
                    {"col_offset": 0, "width": 256, "rank": 1, "row_offset": 6, "rows": 5}]}]}
    plan = to_torchrec_plan(copy.deepcopy(spec), device_type="cpu", compute_kernel="fused").plan[""]
    assert plan["g"].sharding_type == "grid_shard" and plan["g"].compute_kernel == "fused"
    assert [(m.shard_offsets, m.shard_sizes, m.placement.rank()) for m in plan["g"].sharding_spec.shards] == [
        ([0, 0], [6, 128], 0), ([6, 0], [5, 128], 1), ([0, 128], [6, 128], 0), ([6, 128], [5, 128], 1)]
    bad = copy.deepcopy(spec)
    bad["tables"][0]["shards"][1]["rank"] = 0
    with pytest.raises(UserError, match="row block 1 must be rows 6..11 of every column on rank 1"):
        check_spec(bad)
    with pytest.raises(UserError, match=r"^table 'g' is planned grid_shard over all 2 ranks, but local_size=1 "
                                        r"makes several hosts; plan it for this topology$"):
        to_torchrec_plan(copy.deepcopy(spec), device_type="cpu", compute_kernel="fused", local_size=1)


def test_a_torchrec_plan_of_every_type_the_spec_holds_reads_back_as_the_same_plan():
    """`spec_of_torchrec`: a TorchRec plan's `parameter_specs` tables (table-wise, column-wise, table-column-wise,
    row-wise, table-row-wise, data-parallel) become an export spec that runs as the same plan in
    DistributedModelParallel (`same_plan`); a grid_shard table is not one the spec can hold (None), and a plan on
    another kernel is told apart by `same_plan`."""
    import copy

    from neuroshard.hardware.dmp_step import same_plan
    from neuroshard.sharding.planner.incumbent import parameter_specs
    from neuroshard.sharding.torchrec_export import check_spec, spec_of_torchrec

    spec = {"kind": "neuroshard.torchrec_plan", "world_size": 2, "tables": [
        {"name": "tw", "rows": 30, "dim": 8, "sharding_type": "table_wise",
         "shards": [{"col_offset": 0, "width": 8, "rank": 1}]},
        {"name": "cw", "rows": 20, "dim": 16, "sharding_type": "column_wise",
         "shards": [{"col_offset": 0, "width": 8, "rank": 1}, {"col_offset": 8, "width": 8, "rank": 0}]},
        {"name": "twcw", "rows": 20, "dim": 16, "sharding_type": "table_column_wise",
         "shards": [{"col_offset": 0, "width": 8, "rank": 0}, {"col_offset": 8, "width": 8, "rank": 1}]},
        *({"name": kind, "rows": 11, "dim": 8, "sharding_type": kind,
           "shards": [{"col_offset": 0, "width": 8, "rank": 0, "row_offset": 0, "rows": 6},
                      {"col_offset": 0, "width": 8, "rank": 1, "row_offset": 6, "rows": 5}]}
          for kind in ("row_wise", "table_row_wise")),
        {"name": "dp", "rows": 10, "dim": 4, "sharding_type": "data_parallel",
         "shards": [{"col_offset": 0, "width": 4, "rank": 0}, {"col_offset": 0, "width": 4, "rank": 1}]}]}
    plan = to_torchrec_plan(copy.deepcopy(spec), device_type="cpu", compute_kernel="fused")
    shapes = {("", t["name"]): (t["rows"], t["dim"]) for t in spec["tables"]}
    theirs = parameter_specs(plan, shapes)[""]
    back = spec_of_torchrec(theirs["tables"], 2)
    assert same_plan(back, theirs, 2)
    assert [t["shards"] for t in check_spec(copy.deepcopy(back))["tables"]] == [t["shards"] for t in spec["tables"]]
    # the same shards on TorchRec's dense kernel are another plan
    dense = {**theirs, "tables": [{**t, "compute_kernel": "dense"} for t in theirs["tables"]]}
    assert not same_plan(spec_of_torchrec(dense["tables"], 2), dense, 2)
    grid = {**theirs, "tables": [{**theirs["tables"][0], "sharding_type": "grid_shard"}]}
    assert spec_of_torchrec(grid["tables"], 2) is None
