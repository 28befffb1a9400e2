"""tools/shard_tables.py end to end: a table list in, a complete plan within memory out, the reports,
TorchRec export, a clear message without models, and --measure on real hardware."""
import json

import numpy as np
import pytest

from neuroshard.core.types import Cluster
from neuroshard.data.table_list import load_table_list
from neuroshard.sharding.plan import ShardingPlan, Shard, check_complete, fits_memory

from analytic_models import save_hand_models
from conftest import assert_clean_error, run_script

TABLES = """name,rows,dim,pooling_factor
user_id,20000,64,1
item_id,50000,128,1
category,1000,16,3.5
history,30000,64,25
tags,2000,32,8
geo,500,8,1
"""


def _plan_from_record(rec, tl):
    shards, device_of = [], []
    for t, table in enumerate(rec["tables"]):
        for s in table["shards"]:
            shards.append(Shard(t, s["col_offset"], s["width"]))
            device_of.append(s["rank"])
    return ShardingPlan(rec["ndevices"], shards, device_of)


@pytest.mark.parametrize("alg", ["neuroshard", "size_lookup_greedy", "torchrec"])
def test_plan_is_complete_fits_memory_and_is_reported(tmp_path, alg):
    if alg == "torchrec":
        pytest.importorskip("torchrec")
    (tmp_path / "t.csv").write_text(TABLES)
    models = save_hand_models(tmp_path / "models", 2)
    mem = 0.025
    proc = run_script("tools/shard_tables.py", "--tables", tmp_path / "t.csv", "--ndevices", 2, "--max_mem", mem,
                      "--alg", alg, "--out", tmp_path / "plan.json", "--torchrec_plan", tmp_path / "tr.json",
                      "--compute_model", models / "compute.pt", "--fw_comm_model", models / "comm_2_fw.pt",
                      "--bw_comm_model", models / "comm_2_bw.pt")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "published DLRM reuse histogram" in out
    assert "memory (GB)" in out and "compute (ms)" in out and " *" in out and "columns@device" in out
    rec = json.loads((tmp_path / "plan.json").read_text())
    tl = load_table_list(tmp_path / "t.csv")
    plan = _plan_from_record(rec, tl)
    check_complete(tl.task, plan)
    assert fits_memory(tl.task, plan, Cluster(2, mem))
    assert rec["predicted"]["cost_ms"] > 0 and rec["provenance"]["versions"]["torch"]
    tr = json.loads((tmp_path / "tr.json").read_text())
    assert [t["name"] for t in tr["tables"]] == tl.names


def test_missing_models_say_how_to_get_them(tmp_path):
    (tmp_path / "t.csv").write_text(TABLES)
    proc = run_script("tools/shard_tables.py", "--tables", tmp_path / "t.csv", "--compute_model", tmp_path / "no.pt",
                      "--out", tmp_path / "plan.json")
    assert_clean_error(proc, "cost models not found", "make reproduce")
    assert not (tmp_path / "plan.json").exists()


def test_no_plan_within_memory_is_one_line(tmp_path):
    (tmp_path / "t.csv").write_text(TABLES)
    proc = run_script("tools/shard_tables.py", "--tables", tmp_path / "t.csv", "--ndevices", 2, "--max_mem", 0.01,
                      "--alg", "dim_greedy", "--out", tmp_path / "plan.json")
    assert_clean_error(proc, "found no plan")


def test_measure_compares_with_the_heuristics(tmp_path):
    (tmp_path / "t.csv").write_text(TABLES)
    models = save_hand_models(tmp_path / "models", 2, {"batch_size": 256})
    proc = run_script("tools/shard_tables.py", "--tables", tmp_path / "t.csv", "--ndevices", 2, "--max_mem", 0.025,
                      "--out", tmp_path / "plan.json", "--measure", "--warmup_iter", 1, "--num_iter", 3,
                      "--compute_model", models / "compute.pt", "--fw_comm_model", models / "comm_2_fw.pt",
                      "--bw_comm_model", models / "comm_2_bw.pt")
    assert proc.returncode == 0, proc.stderr
    rec = json.loads((tmp_path / "plan.json").read_text())
    assert set(rec["measured"]) >= {"neuroshard", "size_lookup_greedy"}
    assert all(v > 0 for v in rec["measured"].values())
    assert "vs best heuristic" in proc.stdout and "batch 256" in proc.stdout
