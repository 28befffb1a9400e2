"""tools/shard_tables.py --sharding_types: a table list planned by NeuroShardPlanner over TorchRec's sharding types;
plan.json and the TorchRec plan carry row-wise blocks and replicas; bad flags are one line before any work."""
import json
import re

import numpy as np
import pytest

pytest.importorskip("torchrec")

from neuroshard.sharding.plan_file import read_plan_file  # noqa: E402
from neuroshard.sharding.torchrec_export import load_torchrec_plan, read_torchrec_plan  # noqa: E402

from analytic_models import save_hand_models  # noqa: E402
from conftest import refused, run_here  # noqa: E402

SCRIPT = "tools/shard_tables.py"
# "user.id" (4 columns: no column split) is too large for one rank's 1.1 MB left after the reservation; "geo" and
# "cat" have fewer rows than the global batch: replicated
TABLES = "name,rows,dim,pooling_factor\nuser.id,80000,4,1\nitem,2000,32,2\ncat,40,16,3.5\ngeo,20,8,1\n"
TYPES = "data_parallel,table_wise,column_wise,row_wise"


def _args(tmp_path, *more):
    models = save_hand_models(tmp_path / "models", 2, {"batch_size": 64})
    (tmp_path / "t.csv").write_text(TABLES)
    return ("--tables", tmp_path / "t.csv", "--ndevices", 2, "--max_mem", 0.0012, "--out", tmp_path / "plan.json",
            "--compute_model", models / "compute.pt", "--fw_comm_model", models / "comm_2_fw.pt",
            "--bw_comm_model", models / "comm_2_bw.pt", *more)


def test_row_wise_and_replicated_tables_reach_plan_json_and_torchrec(tmp_path, capsys):
    proc = run_here(capsys, SCRIPT, *_args(tmp_path, "--sharding_types", TYPES, "--torchrec_plan", tmp_path / "tr.json"))
    assert proc.returncode == 0, proc.stderr
    rec = json.loads((tmp_path / "plan.json").read_text())
    kinds = {t["name"]: t["sharding_type"] for t in rec["tables"]}
    # the hand models rate every table row-wise cheapest (one row-wise group; a replica group's all-reduce is a
    # collective of its own): the search's plan is TorchRec's too
    assert set(kinds.values()) == {"row_wise"} and "neuroshard" in rec["chosen"].split("/"), (kinds, rec["chosen"])
    assert rec["sharding_types"] == TYPES.split(",") and rec["predicted"]["cost_ms"] > 0
    user = next(t for t in rec["tables"] if t["name"] == "user.id")
    assert user["module_name"] == "user_id"
    assert [(s["row_offset"], s["rows"], s["rank"]) for s in user["shards"]] == [(0, 40000, 0), (40000, 40000, 1)]
    assert "user.id  " in proc.stdout and "row_wise" in proc.stdout and "predicted step" in proc.stdout
    assert "WARNING" not in proc.stderr, proc.stderr  # TorchRec's planner logs nothing a user needs here
    # both files read back as the same spec; TorchRec takes it, row blocks included
    spec = read_plan_file(tmp_path / "plan.json")
    assert [t["shards"] for t in spec["tables"]] == [t["shards"] for t in read_torchrec_plan(tmp_path / "tr.json")
                                                     ["tables"]]
    plan = load_torchrec_plan(tmp_path / "tr.json", device_type="cpu")
    assert plan.plan[""]["user_id"].sharding_type == "row_wise"
    assert plan.plan[""]["geo"].sharding_type == "row_wise"
    # the emulated engine's item of the plan is the same read from plan.json and from TorchRec's plan
    from neuroshard.hardware.engine import StepShard, spec_step_item
    from neuroshard.sharding.planner.incumbent import parameter_specs

    names = [t["module_name"] for t in spec["tables"]]
    theirs = parameter_specs(plan, {("", t["module_name"]): (t["rows"], t["dim"]) for t in spec["tables"]})[""]
    theirs = {**theirs, "tables": sorted(theirs["tables"], key=lambda t: names.index(t["name"]))}
    pooling = [1.0, 2.0, 3.5, 1.0]

    def share(t, lo, rows):
        return rows / spec["tables"][t]["rows"]

    item = spec_step_item(spec, 2, [10, 11, 12, 13], pooling, share)
    assert item == spec_step_item(theirs, 2, [10, 11, 12, 13], pooling, share)
    for r in (0, 1):
        assert StepShard(10, 4, 2, 0.5, 40000 * r, 40000) in item.devices[r]
        assert StepShard(13, 8, 2, 0.5, 10 * r, 10) in item.devices[r]
    # --alg plan: refuses such a plan rather than misread it
    refused(capsys, SCRIPT, *_args(tmp_path / "again", "--alg", f"plan:{tmp_path / 'plan.json'}"),
            untouched=[tmp_path], quiet=False, match=re.escape(f"error: {tmp_path}/plan.json: table 'user.id' is "
                                                              "row_wise") + ".*load_torchrec_plan.*")


def test_table_column_wise_tables_reach_plan_json_and_torchrec(tmp_path, capsys):
    """--sharding_types table_column_wise on one host: every table is handed out table_column_wise (whole ones as one
    column block) in both files, which TorchRec takes as such."""
    proc = run_here(capsys, SCRIPT, *_args(tmp_path, "--sharding_types", "table_column_wise", "--max_mem", "0.01",
                                           "--torchrec_plan", tmp_path / "tr.json"))
    assert proc.returncode == 0, proc.stderr
    rec = json.loads((tmp_path / "plan.json").read_text())
    assert {t["sharding_type"] for t in rec["tables"]} == {"table_column_wise"}, rec["tables"]
    plan = load_torchrec_plan(tmp_path / "tr.json", device_type="cpu")
    assert {n: ps.sharding_type for n, ps in plan.plan[""].items()} == {t["module_name"]: t["sharding_type"]
                                                                       for t in rec["tables"]}


@pytest.mark.parametrize("more, line", [
    (("--sharding_types", "row_wise,sideways"), "--sharding_types: unknown type 'sideways'; name one or more of "
                                                "data_parallel, table_wise, column_wise, row_wise, table_row_wise, "
                                                "table_column_wise, grid_shard, comma-separated, e.g. "
                                                "--sharding_types data_parallel,table_wise,column_wise,row_wise"),
    (("--sharding_types", "row_wise,row_wise"), "--sharding_types: a type named twice; name one or more of .*"),
    (("--sharding_types", TYPES, "--alg", "dim_greedy"), "--sharding_types plans with NeuroShardPlanner (--alg "
                                                         "neuroshard); drop --alg dim_greedy or drop --sharding_types"),
    (("--sharding_types", TYPES, "--measure", "--measure_engine", "torchrec", "--measure_top", "4"),
     "--measure_top has no effect with --sharding_types (--measure measures NeuroShard's plan and TorchRec's in a "
     "fixed number of rounds); drop --measure_top"),
    (("--sharding_types", TYPES, "--mp_keep", "0.1"), "--sharding_types plans TorchRec's own step, which has no "
                                                      "DCT-MP all-to-all; drop --mp_keep or drop --sharding_types"),
])
def test_bad_sharding_types_flags_are_one_line_before_any_work(tmp_path, capsys, more, line):
    args = _args(tmp_path, *more)
    refused(capsys, SCRIPT, *args, untouched=[tmp_path], match="error: " + (line if ".*" in line else re.escape(line)))


# with room for every table on one rank, NeuroShard's plan (table-wise) is not TorchRec's (its own placement)
OTHER_PLAN = ("--sharding_types", "data_parallel,table_wise,row_wise", "--max_mem", 0.01)


@pytest.mark.parametrize("engine", ["torchrec", "emulated"])
def test_measure_runs_both_plans_in_either_engine_and_writes_the_faster(tmp_path, capsys, engine):
    """--measure: NeuroShard's plan and TorchRec's are measured on 2 gloo ranks in interleaved rounds, as
    DistributedModelParallel steps (--measure_engine torchrec) or as the step cost prices them on emulated devices
    (the default); plan.json records both and holds the one that measured faster."""
    from neuroshard.planning.all_types import MEASURE_ROUNDS

    proc = run_here(capsys, SCRIPT, *_args(tmp_path, *OTHER_PLAN, "--measure", "--measure_engine", engine,
                                           "--warmup_iter", 1, "--num_iter", 2))
    assert proc.returncode == 0, proc.stderr
    rec = json.loads((tmp_path / "plan.json").read_text())
    m = rec["measured"]
    assert m["engine"] == engine and m["rounds"] == MEASURE_ROUNDS and not m["same_plan"]
    assert len(m["neuroshard_ms"]) == len(m["torchrec_ms"]) == MEASURE_ROUNDS
    assert m["neuroshard_ms"] != m["torchrec_ms"]
    assert min(m["neuroshard_ms"] + m["torchrec_ms"]) > 0 and m["ratio_lo"] <= m["ratio"] <= m["ratio_hi"]
    assert "measured step: the plan handed out" in proc.stdout
    assert rec["alg"] == ("torchrec" if m["ratio"] > 1 else "neuroshard"), (rec["alg"], m["ratio"])
    assert any(n.startswith("note: --measure: ") for n in rec["notes"])


def test_a_ratio_that_is_not_above_one_keeps_the_plan_handed_out_and_placements_are_checked():
    """`measured_faster` writes TorchRec's plan only where the paired ratio is above 1: a NaN ratio (no finite pair
    of rounds) keeps the plan handed out. `placement_rank` reads "rank:R/device" and refuses any other text."""
    from neuroshard.planning.all_types import measured_faster, paired_record
    from neuroshard.sharding.torchrec_export import placement_rank

    theirs = {"torchrec": True, "tables": [{"name": "a", "rows": 8, "dim": 4, "sharding_type": "table_wise",
                                            "compute_kernel": "fused", "ranks": [1], "shards": [
                                                {"offsets": [0, 0], "sizes": [8, 4], "placement": "rank:1/cpu"}]}]}
    for mine, torchrec, kept in [([2.0, 2.0, 2.0], [1.0, 1.0, 1.0], False), ([1.0, 1.0, 1.0], [2.0, 2.0, 2.0], True),
                                 ([np.nan] * 3, [1.0] * 3, True)]:
        record = paired_record(np.array(mine), np.array(torchrec), False)
        assert record["rounds"] == 3 and set(record) == {"rounds", "ratio", "ratio_lo", "ratio_hi", "same_plan"}
        spec, line = measured_faster(theirs, record, 2, "cpu", {"a": "a"})
        assert (spec is None) == kept, line
        if not kept:
            assert spec["tables"][0]["shards"] == [{"col_offset": 0, "width": 4, "rank": 1}]
    assert placement_rank("rank:3/cuda:1") == 3 and placement_rank("rank:0/cpu") == 0
    for bad in ("garbage", "rank:-1/cpu", "rank:1/cuda", 5, None, "rank:1/cpu:0"):
        with pytest.raises(ValueError, match="not a shard placement"):
            placement_rank(bad)


def test_measure_writes_torchrecs_plan_where_it_measured_faster(tmp_path, capsys, monkeypatch):
    """Where TorchRec's plan measures faster (here its measured steps are kept and the handed-out plan's doubled),
    plan.json and the TorchRec plan file hold TorchRec's plan, as DistributedModelParallel runs it, with no
    predicted cost, and the run says why."""
    from neuroshard.hardware.dmp_step import same_plan
    from neuroshard.planning import all_types

    real, seen = all_types.measure_specs, []

    def theirs_faster(*args, **kwargs):
        seen.append(args[5])
        mine, theirs = real(*args, **kwargs)
        return [mine * 2.0, theirs]

    monkeypatch.setattr(all_types, "measure_specs", theirs_faster)
    proc = run_here(capsys, SCRIPT, *_args(tmp_path, *OTHER_PLAN, "--measure", "--warmup_iter", 1, "--num_iter", 2,
                                           "--torchrec_plan", tmp_path / "tr.json"))
    assert proc.returncode == 0, proc.stderr
    rec = json.loads((tmp_path / "plan.json").read_text())
    assert rec["alg"] == rec["chosen"] == "torchrec" and rec["predicted"] is None and rec["measured"]["ratio"] > 1
    [(ours, theirs)] = seen
    written = read_plan_file(tmp_path / "plan.json")
    assert same_plan(written, theirs, 2) and not same_plan(written, ours, 2)
    assert same_plan(read_torchrec_plan(tmp_path / "tr.json"), theirs, 2)
    assert [t["name"] for t in written["tables"]] == ["user.id", "item", "cat", "geo"]
    assert "note: --measure: TorchRec's plan is written, as it measured faster" in proc.stdout
    assert "written plan: TorchRec's (measured faster)" in proc.stdout
    assert any("TorchRec's plan is written" in n for n in rec["notes"])


def test_measure_measures_torchrecs_own_plan_once(tmp_path, capsys):
    """Where the plan handed out is TorchRec's own (here every table row-wise), --measure measures it once: ratio 1."""
    proc = run_here(capsys, SCRIPT, *_args(tmp_path, "--sharding_types", TYPES, "--measure", "--warmup_iter", 1,
                                           "--num_iter", 2))
    assert proc.returncode == 0, proc.stderr
    m = json.loads((tmp_path / "plan.json").read_text())["measured"]
    assert m["same_plan"] and m["neuroshard_ms"] == m["torchrec_ms"] and m["ratio"] == m["ratio_lo"] == 1.0
    assert "(one plan)" in proc.stdout and "TorchRec's own, written as it is" in proc.stdout


def test_ids_reach_the_planner(tmp_path, capsys):
    """--ids with --sharding_types: the tables come from the ids and NeuroShardPlanner gets each table's ids of a
    batch (its notes list the row blocks' shares of the lookups, measured from them)."""
    import torch

    from neuroshard.data.raw import save_raw
    from neuroshard.data.synthetic import synthesize_tables

    raw = synthesize_tables([80000, 2000, 40, 20], [1, 2, 3, 1], [[0.0]] * 4, 128, seed=1, progress=False)
    indices, offsets, lengths = raw  # table 3 read by no sample of the batch: the published histogram, a note
    keep = torch.ones(len(indices), dtype=torch.bool)
    keep[offsets[3 * 128]: offsets[4 * 128]] = False
    lengths = lengths.clone()
    lengths[3] = 0
    indices = indices[keep]
    offsets = torch.cat([torch.zeros(1, dtype=offsets.dtype), torch.cumsum(lengths.reshape(-1), 0)]).to(offsets.dtype)
    save_raw(tmp_path / "ids.pt", indices, offsets, lengths)
    args = list(_args(tmp_path, "--sharding_types", TYPES))
    i = args.index("--tables")
    args[i:i + 2] = ["--ids", tmp_path / "ids.pt", "--dims", "4,32,16,8"]
    proc = run_here(capsys, SCRIPT, *args)
    assert proc.returncode == 0, proc.stderr
    assert "the row blocks' shares of their table's lookups, from the ids given: table_0 " in proc.stdout
    kinds = {t["name"]: t["sharding_type"] for t in json.loads((tmp_path / "plan.json").read_text())["tables"]}
    assert kinds["table_0"] == "row_wise", kinds
    assert "note: --ids: 1 table(s) have no lookups in the first 64 samples; their reuse histograms are the " \
        "published DLRM one (table_3)" in proc.stdout


def test_the_plan_is_named_as_handed_out_and_a_table_too_large_for_a_device_goes_row_wise(tmp_path, capsys):
    """Where the comparison hands out TorchRec's or a heuristic's plan, plan.json and the printed heading name it
    (not NeuroShard's). A table larger than one device, which the search alone refuses, is planned row-wise when
    --sharding_types allows it."""
    proc = run_here(capsys, SCRIPT, *_args(tmp_path, "--sharding_types", TYPES, "--max_mem", 0.01))
    assert proc.returncode == 0, proc.stderr
    rec = json.loads((tmp_path / "plan.json").read_text())
    handed = next(n for n in rec["notes"] if "plan handed out" in n)
    assert (rec["chosen"] == "neuroshard" and "plan handed out: NeuroShard's" in handed) or \
        f"plan handed out: {rec['chosen']}'s" in handed, (rec["chosen"], handed)
    assert f"({rec['chosen']}'s plan, handed out by NeuroShardPlanner" in proc.stdout
    # 0.0011 GB a rank: "user.id" (1.2 MB) fits no device whole; only row-wise allowed, it is cut into row blocks
    proc = run_here(capsys, SCRIPT, *_args(tmp_path / "rw", "--sharding_types", "row_wise", "--max_mem", 0.0011))
    assert proc.returncode == 0, proc.stderr
    kinds = {t["sharding_type"] for t in json.loads((tmp_path / "rw" / "plan.json").read_text())["tables"]}
    assert kinds == {"row_wise"}
    refused(capsys, SCRIPT, *_args(tmp_path / "tw", "--max_mem", 0.0011), untouched=[tmp_path / "tw" / "x"],
            match=re.escape("error: ") + r".*table 'user\.id' \(0\.001192 GB\) does not fit a device of 0\.0011 GB "
                                         r"even split into column shards of 4; raise --max_mem or shrink the table")


def _row_wise(name: str, rows: int, blocks, dim: int = 8) -> dict:
    return {"name": name, "rows": rows, "dim": dim, "sharding_type": "row_wise", "shards": [
        {"col_offset": 0, "width": dim, "rank": r, "row_offset": o, "rows": n} for r, (o, n) in enumerate(blocks)]}


def test_a_row_block_of_no_rows_trains_in_distributed_model_parallel(tmp_path):
    """A row-wise table of fewer rows than ranks leaves a rank an empty row block (TorchRec's cut of 1 row on 2
    ranks: blocks of 1 and 0 rows); with it last in the module, FBGEMM's CPU backward reads past its fused kernel's
    table sizes and fails about every second step. The TorchRec step puts such tables first (`empty_blocks_first`):
    20 steps in each of 3 rounds on 2 gloo ranks train."""
    from neuroshard.data.table_list import load_table_list
    from neuroshard.hardware.backends import resolve_hardware
    from neuroshard.hardware.dmp_step import empty_blocks_first
    from neuroshard.planning.all_types import measure_specs
    from neuroshard.planning.user_data import user_tables_dataset

    (tmp_path / "t.csv").write_text("name,rows,dim,pooling_factor\nbig,100,8,2\ntiny,1,8,1\n")
    tl = load_table_list(tmp_path / "t.csv", 1e6)
    ds = user_tables_dataset(tl, 64, 0, tmp_path, None)
    spec = {"kind": "neuroshard.torchrec_plan", "world_size": 2,
            "tables": [_row_wise("big", 100, [(0, 50), (50, 50)]), _row_wise("tiny", 1, [(0, 1), (1, 0)])]}
    moved, ids = empty_blocks_first(spec, [0, 1])
    assert [t["name"] for t in moved["tables"]] == ["tiny", "big"] and ids == (1, 0)
    [steps] = measure_specs(ds.path, resolve_hardware("cpu", "auto"), 64, 1, 20, [spec], 2, 3, "torchrec", [2.0, 1.0])
    assert len(steps) == 3 and min(steps) > 0


def test_tables_that_leave_more_ranks_an_empty_block_go_first_and_a_kernel_of_none_is_refused(tmp_path):
    """TorchRec's cut leaves empty row blocks on the last ranks (6 rows on 4 ranks: 2, 2, 2, 0; 1 row: 1, 0, 0, 0).
    `empty_blocks_first` puts the table empty on more ranks first, so on every rank the tables empty there precede
    those with rows, in either spec form (export spec, TorchRec's `parameter_specs`). Where a rank holds only empty
    blocks of a sharding type, FBGEMM's CPU operator cannot run its kernel in any order: the TorchRec step refuses
    the plan in one line before any rank starts, naming the rank and tables, and runs it on CUDA ranks."""
    from neuroshard.data.table_list import load_table_list
    from neuroshard.core.errors import UserError
    from neuroshard.hardware.backends import Hardware, resolve_hardware
    from neuroshard.hardware.dmp_step import DMPStep, TorchRecItem, empty_blocks_first
    from neuroshard.hardware.engine import EngineSettings
    from neuroshard.planning.all_types import measure_specs
    from neuroshard.planning.user_data import user_tables_dataset
    from neuroshard.sharding.torchrec_export import empty_kernels, empty_row_blocks

    six, one = _row_wise("six", 6, [(0, 2), (2, 2), (4, 2), (6, 0)]), _row_wise("one", 1, [(0, 1), (1, 0), (1, 0), (1, 0)])
    big = _row_wise("big", 100, [(0, 25), (25, 25), (50, 25), (75, 25)])
    spec = {"kind": "neuroshard.torchrec_plan", "world_size": 4, "tables": [big, six, one]}
    assert empty_row_blocks(spec) == {"six": 1, "one": 3} and empty_kernels(spec) == {}
    moved, ids = empty_blocks_first(spec, [0, 1, 2])
    assert [t["name"] for t in moved["tables"]] == ["one", "six", "big"] and ids == (2, 1, 0)
    for rank in range(4):  # on each rank the blocks of no rows come before every block with rows
        rows = [t["shards"][rank]["rows"] for t in moved["tables"]]
        assert rows == sorted(rows, key=bool), (rank, rows)
    torchrec_form = {"torchrec": True, "tables": [  # the same two small tables as TorchRec's planner writes them
        {"name": t["name"], "rows": t["rows"], "dim": 8, "sharding_type": "row_wise", "shards": [
            {"offsets": [s["row_offset"], 0], "sizes": [s["rows"], 8], "placement": f"rank:{s['rank']}/cpu"}
            for s in t["shards"]]} for t in (six, one)]}
    assert empty_row_blocks(torchrec_form) == {"six": 1, "one": 3}
    assert empty_kernels(torchrec_form) == {3: ["six", "one"]}

    small = {"kind": "neuroshard.torchrec_plan", "world_size": 4, "tables": [six, one]}
    (tmp_path / "t.csv").write_text("name,rows,dim,pooling_factor\nsix,6,8,1\none,1,8,1\n")
    ds = user_tables_dataset(load_table_list(tmp_path / "t.csv", 1e6), 64, 0, tmp_path, None)
    with pytest.raises(UserError, match=r"^this plan leaves rank 3 only row blocks of no rows of six, one \(fewer "
                                        r"rows than ranks\), .* place these tables table_wise or data_parallel$"):
        measure_specs(ds.path, resolve_hardware("cpu", "auto"), 64, 1, 2, [small], 4, 1, "torchrec", [1.0, 1.0])
    cuda = EngineSettings(str(ds.path), Hardware("cuda", "fbgemm"), 64, 1, 2, step=DMPStep)
    DMPStep.check_items([TorchRecItem.of(small, [0, 1])], cuda)  # FBGEMM's CUDA operator runs it: no refusal


def test_the_planner_names_tables_that_leave_a_rank_an_empty_row_block(tmp_path, capsys):
    """On CPU ranks the notes name a handed-out row-wise table of fewer rows than ranks to fill (here 1 row on 2
    ranks), and say to list it first: FBGEMM's CPU backward fails at random where it ends a rank's fused kernel."""
    models = save_hand_models(tmp_path / "models", 2, {"batch_size": 64})
    (tmp_path / "t.csv").write_text("name,rows,dim,pooling_factor\nbig,100,8,2\ntiny,1,8,1\n")
    proc = run_here(capsys, SCRIPT, "--tables", tmp_path / "t.csv", "--ndevices", 2, "--max_mem", 0.01, "--out",
                    tmp_path / "plan.json", "--compute_model", models / "compute.pt", "--fw_comm_model",
                    models / "comm_2_fw.pt", "--bw_comm_model", models / "comm_2_bw.pt", "--sharding_types", "row_wise")
    assert proc.returncode == 0, proc.stderr
    rec = json.loads((tmp_path / "plan.json").read_text())
    tiny = next(t for t in rec["tables"] if t["name"] == "tiny")
    assert [s["rows"] for s in tiny["shards"]] == [1, 0]
    [note] = [n for n in rec["notes"] if "row block of no rows" in n]
    assert note.startswith("note: tiny leave(s) a rank") and "list these tables first" in note
    assert not [n for n in rec["notes"] if "holds only row blocks" in n]  # rank 1 holds big's rows too
    (tmp_path / "t.csv").write_text("name,rows,dim,pooling_factor\ntiny,1,8,1\nsmall,1,8,2\n")
    proc = run_here(capsys, SCRIPT, "--tables", tmp_path / "t.csv", "--ndevices", 2, "--max_mem", 0.01, "--out",
                    tmp_path / "plan.json", "--compute_model", models / "compute.pt", "--fw_comm_model",
                    models / "comm_2_fw.pt", "--bw_comm_model", models / "comm_2_bw.pt", "--sharding_types", "row_wise")
    assert proc.returncode == 0, proc.stderr
    [note] = [n for n in json.loads((tmp_path / "plan.json").read_text())["notes"] if "holds only row blocks" in n]
    assert note.startswith("note: rank 1 holds only row blocks of no rows of tiny, small") and "table_wise" in note
