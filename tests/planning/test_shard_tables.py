"""tools/shard_tables.py end to end: a table list in, a complete plan within memory out, the reports,
TorchRec export, a clear message without models, and --measure on real hardware."""
import json
import re

import numpy as np

import pytest

from neuroshard.core.costs import Cluster
from neuroshard.data.table_list import load_table_list
from neuroshard.sharding.plan import Placement, Shard, check_complete, fits_memory

from analytic_models import save_hand_models
from conftest import refused, run_here

SCRIPT = "tools/shard_tables.py"
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
    return Placement(rec["ndevices"], shards, device_of)


@pytest.mark.parametrize("alg", ["neuroshard", "size_lookup_greedy", "torchrec"])
def test_plan_is_complete_fits_memory_and_is_reported(tmp_path, alg, capsys):
    if alg == "torchrec":
        pytest.importorskip("torchrec")
    (tmp_path / "t.csv").write_text(TABLES)
    models = save_hand_models(tmp_path / "models", 2)
    mem = 0.025
    proc = run_here(capsys, SCRIPT, "--tables", tmp_path / "t.csv", "--ndevices", 2, "--max_mem", mem,
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
    assert "beyond the comm cost data" not in out  # hand models record no training data range
    if alg == "neuroshard":  # a forward model whose comm data held dim sums up to 1 per device: one note
        from neuroshard.models.cost_models import CommCostModel

        fw = CommCostModel.load(models / "comm_2_fw.pt")
        fw.meta["training_input_max"] = [1.0, 1.0, 1e6, 1e6]
        fw.save(models / "fw_small.pt")
        proc = run_here(capsys, SCRIPT, "--tables", tmp_path / "t.csv", "--ndevices", 2, "--max_mem", mem,
                          "--out", tmp_path / "plan2.json", "--compute_model", models / "compute.pt",
                          "--fw_comm_model", models / "fw_small.pt", "--bw_comm_model", models / "comm_2_bw.pt")
        assert proc.returncode == 0, proc.stderr
        notes = [l for l in proc.stdout.splitlines() if "beyond the comm cost data" in l]
        assert len(notes) == 1 and "(the comm data: at most 1)" in notes[0] and "straggler" not in notes[0], notes


def test_input_distribution_model_beside_the_backward_one_prices_the_step(tmp_path, capsys):
    """Without comm_<N>_input.pt the step cost says the backward model prices the input distribution; with one
    beside the backward model (or named) the plan's step cost carries its fixed part; a named missing one is
    refused in one line."""
    from analytic_models import hand_comm_model

    (tmp_path / "t.csv").write_text(TABLES)
    models = save_hand_models(tmp_path / "models", 2)
    base = ["tools/shard_tables.py", "--tables", tmp_path / "t.csv", "--ndevices", 2, "--max_mem", 0.025,
            "--compute_model", models / "compute.pt", "--fw_comm_model", models / "comm_2_fw.pt",
            "--bw_comm_model", models / "comm_2_bw.pt"]
    without = run_here(capsys, *base, "--out", tmp_path / "a.json")
    assert without.returncode == 0, without.stderr
    assert "no input-distribution model" in without.stdout
    hand_comm_model(2, "input").save(models / "comm_2_input.pt")  # 5 ms fixed + 0.01 ms per own word
    beside = run_here(capsys, *base, "--out", tmp_path / "b.json")
    assert beside.returncode == 0, beside.stderr
    assert "no input-distribution model" not in beside.stdout
    cost = [json.loads((tmp_path / f"{n}.json").read_text())["predicted"]["cost_ms"] for n in "ab"]
    assert cost[1] > cost[0] + 4.0  # the 5 ms fixed part, less the backward model's price of the same words
    paper = run_here(capsys, *base, "--out", tmp_path / "c.json", "--cost", "paper")
    assert paper.returncode == 0, paper.stderr
    assert "no input-distribution model" not in paper.stdout  # the paper's cost has no input distribution
    # a plan written over the input-distribution model it reads: refused, the model kept
    refused(capsys, *base, "--out", models / "comm_2_input.pt", untouched=[tmp_path],
            match=re.escape(f"error: --out {models}/comm_2_input.pt is also the input --input_comm_model; writing it "
                            "would replace what this run reads: choose another --out"))
    refused(capsys, *base, "--out", tmp_path / "d.json", "--input_comm_model", tmp_path / "no.pt", untouched=[tmp_path],
            match=re.escape(f"error: input-distribution model not found: {tmp_path}/no.pt; make it with "
                            "collect_comm_cost_data.py --input_dist --ndevices 2 && train_comm_cost_model.py "
                            "--input_dist --ndevices 2"))


def test_missing_models_say_how_to_get_them(tmp_path, capsys):
    (tmp_path / "t.csv").write_text(TABLES)
    refused(capsys, "tools/shard_tables.py", "--tables", tmp_path / "t.csv", "--compute_model", tmp_path / "no.pt",
            "--out", tmp_path / "plan.json", untouched=[tmp_path], cwd=tmp_path, match=re.escape(  # no models/ there
                f"error: cost models not found: {tmp_path}/no.pt, models/comm_4_fw.pt, models/comm_4_bw.pt; train them "
                "with `make reproduce` (4 devices) or steps 3-4: python collect_compute_cost_data.py && python "
                "train_compute_cost_model.py && python collect_comm_cost_data.py --ndevices 4 && python "
                "train_comm_cost_model.py --ndevices 4; or pass --compute_model/--fw_comm_model/--bw_comm_model"))


def test_no_plan_within_memory_is_one_line(tmp_path, capsys):
    (tmp_path / "t.csv").write_text(TABLES)
    refused(capsys, "tools/shard_tables.py", "--tables", tmp_path / "t.csv", "--ndevices", 2, "--max_mem", 0.01,
            "--alg", "dim_greedy", "--out", tmp_path / "plan.json", untouched=[tmp_path], quiet=False,
            match=re.escape("error: --alg dim_greedy found no plan within 2 x 0.01 GB for 0.036 GB of tables; raise "
                            "--max_mem or add devices, or try --alg neuroshard"))


def test_calibrate_then_measure_writes_the_measured_best_and_is_reused(tmp_path, capsys):
    (tmp_path / "t.csv").write_text(TABLES)
    models = save_hand_models(tmp_path / "models", 2, {"batch_size": 256, "device": "cpu"})
    for k in (1, 2):  # ensemble members that agree with the models: each candidate's stated interval is its cost
        save_hand_models(tmp_path / f"models/ensemble/b{k}", 2, {"batch_size": 256, "device": "cpu"})
    model_args = ["--compute_model", models / "compute.pt", "--fw_comm_model", models / "comm_2_fw.pt",
                  "--bw_comm_model", models / "comm_2_bw.pt"]
    proc = run_here(capsys, SCRIPT, "--tables", tmp_path / "t.csv", "--ndevices", 2, "--max_mem", 0.025,
                      "--out", tmp_path / "plan.json", "--calibrate", 15, "--calibrate_comm", 15, "--measure",
                      "--measure_budget_s", 6, "--warmup_iter", 1, "--num_iter", 2, "--device", "cpu", *model_args)
    assert proc.returncode == 0, proc.stderr
    assert "held-out MAPE" in proc.stdout and (tmp_path / "plan.calibration.pt").is_file()
    rec = json.loads((tmp_path / "plan.json").read_text())
    m = rec["measured"]
    names = [n for c in m["candidates"] for n in c["names"]]
    assert {"neuroshard#1", "neuroshard#2", "neuroshard#3", "size_lookup_greedy"} <= set(names)
    assert m["rounds"] >= 1 and all(c["measured_ms"] > 0 for c in m["candidates"])
    rated = [c for c in m["candidates"] if c["simulated_ms"] is not None]
    assert rated and all(np.allclose(c["predicted_90_ms"], c["simulated_ms"]) for c in rated)
    assert "predicted 90%" in proc.stdout
    # racing (the default) may drop slower candidates; the best is among those measured in every round
    assert m["race"] is True
    # the step cost (the default) is measured as it prices plans: per group, input distribution and both all-to-alls
    assert m["measured_cost"] == "step" and "as the step cost prices them" in proc.stdout
    full = [c for c in m["candidates"] if c["rounds"] == m["rounds"]]
    assert all((np.asarray(c["measured_parts_ms"])[:, 1:] > 0).all() for c in full)
    best = min(full, key=lambda c: c["measured_ms"])
    assert best["names"] == m["best"] and rec["alg"] in ("neuroshard", "/".join(m["best"]))
    ratios = [c["ratio_to_best"] for c in full]  # candidates measured in every round; two rounds (see test_measure)
    assert all(x >= 1.0 for x in ratios) if m["rounds"] >= 2 else all(x is None for x in ratios), (m["rounds"], ratios)  # strict JSON: null, not NaN
    for c in m["candidates"]:
        assert len(c["round_ms"]) == m["rounds"] and sum(x is not None for x in c["round_ms"]) == c["rounds"]
    # the verdict printed is the one recorded: told apart, or written as never measured worse
    said = "is the measured best:" if m["separated"] else "the top plans cannot be told apart"
    assert said in proc.stdout and ("cannot be told apart" in proc.stdout) != m["separated"], proc.stdout
    # where the written plan's step goes: from its own measured parts, and said in one line
    parts = np.asarray(next(c for c in m["candidates"] if c["names"] == m["best"])["measured_parts_ms"])
    assert np.isclose(m["step"]["step_ms"], parts.sum(axis=1).max())
    assert 0.0 <= m["step"]["balance_headroom"] <= 1.0 - m["step"]["comm_share"]
    assert f"where {'/'.join(m['best'])}'s step goes" in proc.stdout
    assert rec["calibration"]["compute"]["samples"]["held_out"] == 5
    # the drift reference (the 5 held-out shards in groups of 2 ranks: 3 groups) was measured in every round
    assert len(rec["calibration"]["reference"]) == 3
    d = m["drift"]
    assert d["rounds"] == m["rounds"] and d["groups"] == 3
    for k in ("compute", "comm"):  # one round (a busy machine spends the budget on it) has no interval: null
        assert (0 < d[k]["ci_lo"] <= d[k]["ratio"] <= d[k]["ci_hi"]) if m["rounds"] >= 2 else \
            (d[k]["ratio"] > 0 and d[k]["ci_lo"] is None and d[k]["ci_hi"] is None), (m["rounds"], d)
    assert all(c["simulated_drift_ms"] > 0 for c in m["candidates"])
    assert "machine drift since calibrating" in proc.stdout and "drift-corrected" in proc.stdout
    tl = load_table_list(tmp_path / "t.csv")
    plan = _plan_from_record(rec, tl)
    check_complete(tl.task, plan)
    assert fits_memory(tl.task, plan, Cluster(2, 0.025))
    # a later run on the same tables and hardware reuses the calibration without measuring
    again = run_here(capsys, SCRIPT, "--tables", tmp_path / "t.csv", "--ndevices", 2, "--max_mem", 0.025,
                       "--out", tmp_path / "plan.json", "--device", "cpu", *model_args)
    assert again.returncode == 0, again.stderr
    assert "reusing the calibrated cost models" in again.stdout
    other = run_here(capsys, SCRIPT, "--tables", tmp_path / "t.csv", "--ndevices", 2, "--max_mem", 0.05,
                       "--out", tmp_path / "plan.json", "--device", "cpu", *model_args)
    assert other.returncode == 0 and "calibrated for other tables" in other.stdout


def test_calibrate_alone_takes_the_default_k_and_a_given_k_wins():
    from neuroshard.core.cli import config_from_args, step_parser
    from neuroshard.core.config import DEFAULT_CALIBRATE_K, ShardTablesConfig

    p = step_parser(ShardTablesConfig)

    def parsed(*argv):
        return config_from_args(ShardTablesConfig, p.parse_args(["--tables", "t.csv", *argv]))

    assert parsed().calibrate is None
    assert parsed("--calibrate").calibrate == DEFAULT_CALIBRATE_K == 120
    c = parsed("--calibrate", "--measure")
    assert (c.calibrate, c.measure, c.no_race) == (120, True, False)
    assert parsed("--measure", "--no_race").no_race
    assert parsed("--calibrate", "40").calibrate == 40
    with pytest.raises(SystemExit):
        parsed("--calibrate", "many")


def test_measure_in_torchrecs_own_step_writes_its_measured_best(tmp_path, capsys):
    """--measure_engine torchrec: every candidate measured as DistributedModelParallel training steps on 2 gloo
    ranks; the written plan is the one measured fastest there, and the record says which engine measured it."""
    pytest.importorskip("torchrec")
    (tmp_path / "t.csv").write_text(TABLES)
    models = save_hand_models(tmp_path / "models", 2, {"batch_size": 256, "device": "cpu"})
    proc = run_here(capsys, SCRIPT, "--tables", tmp_path / "t.csv", "--ndevices", 2, "--max_mem", 0.025,
                      "--out", tmp_path / "plan.json", "--measure", "--measure_engine", "torchrec",
                      "--measure_budget_s", 6, "--warmup_iter", 1, "--num_iter", 2, "--device", "cpu",
                      "--compute_model", models / "compute.pt", "--fw_comm_model", models / "comm_2_fw.pt",
                      "--bw_comm_model", models / "comm_2_bw.pt")
    assert proc.returncode == 0, proc.stderr
    assert "as TorchRec training steps (DistributedModelParallel)" in proc.stdout
    rec = json.loads((tmp_path / "plan.json").read_text())
    m = rec["measured"]
    assert m["engine"] == "torchrec" and m["rounds"] >= 1 and rec["cost"] == "step"
    full = [c for c in m["candidates"] if c["rounds"] == m["rounds"]]
    best = min(full, key=lambda c: c["measured_ms"])
    assert best["names"] == m["best"] and rec["chosen"] == "/".join(m["best"])
    assert all(c["measured_ms"] > 0 and np.asarray(c["measured_parts_ms"])[:, 1:].sum() == 0 for c in full)
    assert "'s step goes" not in proc.stdout  # a TorchRec step is measured whole: no all-to-all share to give


def test_alg_neuroshard_hands_out_the_plan_its_models_rate_fastest(tmp_path, capsys):
    """--alg neuroshard (step cost, the default): NeuroShard's plan against TorchRec's and the heuristics' by the
    simulated step cost; the written plan is the lowest of the table it prints, or TorchRec's when that lowest is
    less than --min_gain (default 5%) cheaper; with --min_gain 0 the lowest."""
    pytest.importorskip("torchrec")
    (tmp_path / "t.csv").write_text(TABLES)
    models = save_hand_models(tmp_path / "models", 2)
    args = ["tools/shard_tables.py", "--tables", tmp_path / "t.csv", "--ndevices", 2, "--max_mem", 0.025,
            "--compute_model", models / "compute.pt", "--fw_comm_model", models / "comm_2_fw.pt",
            "--bw_comm_model", models / "comm_2_bw.pt"]
    for min_gain in (None, 0.0):
        extra = [] if min_gain is None else ["--min_gain", min_gain]
        proc = run_here(capsys, *args, "--out", tmp_path / f"plan{min_gain}.json", *extra)
        assert proc.returncode == 0, proc.stderr
        table = proc.stdout.split("(simulated step cost, ms):")[1].strip().split("\n\n")[0].splitlines()[2:]
        rated = {row.rsplit(None, 1)[0].strip(): float(row.rsplit(None, 1)[1]) for row in table if row.strip()}
        assert any("neuroshard" in k for k in rated)
        torchrec = next(v for k, v in rated.items() if "torchrec" in k.split("/"))
        fastest = min(rated.values())
        want = torchrec if min_gain is None and fastest > 0.95 * torchrec else fastest
        rec = json.loads((tmp_path / f"plan{min_gain}.json").read_text())
        assert rec["cost"] == "step" and rec["predicted"]["cost_ms"] == pytest.approx(want, abs=2e-3)
        assert any(rec["chosen"] in k.split("/") for k in rated)
        assert "plan handed out: " in proc.stdout
        assert (f"cost models: {models / 'compute.pt'}, {models / 'comm_2_fw.pt'}, {models / 'comm_2_bw.pt'}; "
                "plans scored by the simulated step cost") in proc.stdout
    paper = run_here(capsys, *args, "--out", tmp_path / "paper.json", "--cost", "paper")
    assert paper.returncode == 0 and json.loads((tmp_path / "paper.json").read_text())["cost"] == "paper"
    refused(capsys, *args, "--out", tmp_path / "bad.json", "--measure", "--measure_engine", "torchrec",
            "--mp_keep", "0.05", untouched=[tmp_path],
            match=re.escape("error: --measure_engine torchrec measures TorchRec's own step, which has no DCT-MP "
                            "all-to-all; drop --mp_keep or use --measure_engine emulated"))


def test_a_measured_best_the_models_cannot_price_is_still_written(tmp_path, monkeypatch, capsys):
    """The hand models predict a negative forward all-to-all for size_greedy's plan. When measuring makes it the best,
    the plan and its measurements are written (nothing measured is lost), without a predicted cost, and one warning
    line says why."""
    import neuroshard.planning.shard_tables as pt
    from neuroshard.core.config import CostModelFiles, ShardTablesConfig

    (tmp_path / "t.csv").write_text(TABLES)
    models = save_hand_models(tmp_path / "models", 2, {"batch_size": 256, "device": "cpu"})

    def measured_as_best(tl, cluster, cands, hw, batch, mcfg, ids, calibration=None):
        i = next(i for i, c in enumerate(cands) if "size_greedy" in c.names)
        rows = [{"names": c.names, "measured_ms": 1.0 + (j != i), "measured_parts_ms": [[0.5, 0.2, 0.3]] * 2}
                for j, c in enumerate(cands)]
        return {"best_index": i, "best": cands[i].names, "candidates": rows, "rounds": 1}

    monkeypatch.setattr(pt, "measure_candidates", measured_as_best)
    cfg = ShardTablesConfig(tables=str(tmp_path / "t.csv"), ndevices=2, max_mem=0.025, out=str(tmp_path / "plan.json"),
                            measure=True, models=CostModelFiles(str(models / "compute.pt"), str(models / "comm_2_fw.pt"),
                                                                str(models / "comm_2_bw.pt")))
    cfg.hardware.device = "cpu"
    pt.shard_tables(cfg)
    rec = json.loads((tmp_path / "plan.json").read_text())
    assert rec["chosen"] == "size_greedy" and rec["predicted"] is None and rec["measured"]["best"] == ["size_greedy"]
    err = [l for l in capsys.readouterr().err.splitlines() if l.startswith("warning:")]
    assert len(err) == 1 and "forward all-to-all" in err[0] and "size_greedy" in err[0]
