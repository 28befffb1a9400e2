"""The DCT benchmark scripts refuse bad input in one line (exit 2) before any work, and never mix results
made with other settings into a CSV they resume."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import load_script, refused


@pytest.mark.parametrize("script,args,line", [
    ("dct.py", ["--mp_keep", "nan"], "--mp_keep must be a finite number > 0 and <= 1, got nan"),
    ("dct.py", ["--dp_keep", "0"], "--dp_keep must be a finite number > 0 and <= 1, got 0"),
    ("dct.py", ["--seeds", "0"], "--seeds must be >= 1, got 0"),
    ("dct.py", ["--modes", "none,xx"], "--modes must be from none, dp, mp, both, got 'none,xx'"),
    ("dct.py", ["--dense_opt", "rmsprop"], "--dense_opt must be one of sgd, adam, got 'rmsprop'"),
    ("dct.py", ["--dense_opt", "adam", "--lr", "inf"], "--lr must be a finite number > 0 and <= 10, got inf"),
    ("dct.py", ["--mp_scope", "table,shard"], "--mp_scope must be one of rank, table, sign, sign2, got 'shard'"),
    ("dct.py", ["--mp_scope", "rank,rank"], "--mp_scope must be distinct values separated by commas, got 'rank,rank'"),
    ("dct.py", ["--dp_adam_freeze_after", "50,x"],
     "--dp_adam_freeze_after must be distinct values separated by commas, got '50,x'"),
    ("dct.py", ["--dp_adam_freeze_after", "50"], "--dp_adam_freeze_after 50 needs --dense_opt adam, got 'sgd'"),
    ("dct.py", ["--dense_opt", "adam", "--dp_adam_freeze_after", "-5"],
     "--dp_adam_freeze_after must be >= 0 and <= 1000, got -5"),
    ("dct_network.py", ["--bandwidths", "1,inf"], "--bandwidths must be Gbit/s from 0 (unshaped) to 1000, got '1,inf'"),
    ("dct_network.py", ["--bandwidths", "1,x"], "--bandwidths must be numbers in Gbit/s joined by commas, got '1,x'"),
    ("dct_network.py", ["--dense_opt", "lamb"], "--dense_opt must be one of sgd, adam, got 'lamb'"),
    ("dct_network.py", ["--dp_sync", "yes"], "argument --dp_sync: must be on or off, got 'yes' (see dct_network.py "
                                             "--help)"),
    ("mp_aware_training.py", ["--gbit", "nan"], "--gbit must be a number of Gbit/s from 0 (unshaped) to 1000, got nan"),
    ("mp_aware_training.py", ["--mp_keep", "1"],
     "--mp_keep must be in (0, 1) (1 sends everything: nothing to plan for), got 1"),
    ("mp_aware_training.py", ["--reps", "0"], "--reps must be >= 1, got 0"),
    ("mp_aware_training.py", ["--dense_opt", "adamw"], "--dense_opt must be one of sgd, adam, got 'adamw'"),
])
def test_bad_flags_get_one_line(script, args, line, tmp_path, capsys):
    refused(capsys, f"benchmarks/{script}", *args, "--out_dir", tmp_path, match=re.escape(f"error: {line}"),
            untouched=[tmp_path])


def test_missing_models_are_named_before_any_work(tmp_path, capsys):
    refused(capsys, "benchmarks/mp_aware_training.py", "--out_dir", tmp_path, cwd=tmp_path, untouched=[tmp_path],
            match=re.escape("error: missing cost model models/compute.pt; run the quick pipeline (make reproduce), "
                            "then collect_comm_cost_data.py --ndevices 4 --mp_keep 0.05 and train_comm_cost_model.py "
                            "--ndevices 4 --mp_keep 0.05"))


def test_a_csv_of_other_settings_is_not_resumed(tmp_path, capsys):
    csv = tmp_path / "dct_movielens_tiny.csv"
    text = "dataset,arch,ndevices,steps,batch_size,dense_opt,seed,dct,test_auc\nmovielens,tiny,4,1000,512,sgd,0,none,0.6\n"
    csv.write_text(text)
    refused(capsys, "benchmarks/dct.py", "--steps", "500", "--out_dir", tmp_path, untouched=[tmp_path],
            match=re.escape(f"error: {csv} holds runs made with other settings (steps); pass --fresh to start over, or "
                            "--out_dir for a separate folder"))
    refused(capsys, "benchmarks/dct.py", "--report_only", "--out_dir", tmp_path / "empty", untouched=[tmp_path],
            match=re.escape(f"error: no results in {tmp_path}/empty/{csv.name} yet; run without --report_only first"))


def test_a_resumed_csv_that_is_not_one_gets_one_line(tmp_path, capsys):
    csv = tmp_path / "dct_movielens_tiny.csv"
    csv.write_bytes(bytes(range(256)) * 8)  # not text, not a CSV
    refused(capsys, "benchmarks/dct.py", "--out_dir", tmp_path, untouched=[tmp_path],
            match=re.escape(f"error: --out_dir: {csv} is not a readable CSV (ParserError: ") + ".*"
            + re.escape("); move it away or choose another file"))  # pandas' words in the brackets


@pytest.mark.parametrize("script,name", [("dct.py", "dct_movielens_tiny.csv"), ("dct_network.py", "dct_network.csv")])
def test_report_only_on_a_damaged_csv_gets_one_line(script, name, tmp_path, capsys):
    csv = tmp_path / name
    csv.write_bytes(b"garbage\x00\xff" * 50)
    damaged = f"error: --out_dir: {csv}"
    refused(capsys, f"benchmarks/{script}", "--report_only", "--out_dir", tmp_path, untouched=[tmp_path],
            match=re.escape(f"{damaged} is not a readable CSV (UnicodeDecodeError: ") + ".*"
            + re.escape("); move it away or choose another file"))
    cols = "dataset,arch,ndevices,steps,batch_size,seed,rep,gbit,dct,test_auc,test_logloss,step_ms,loss_curve\n"
    csv.write_text(cols + 'movielens,tiny,4,1000,512,0,0,1,none,0.6,0.6,10,"{""10"": 0.7"\n')  # a cut JSON cell
    refused(capsys, f"benchmarks/{script}", "--report_only", "--out_dir", tmp_path, untouched=[tmp_path],
            match=re.escape(f"{damaged} row 1: loss_curve is not valid JSON; the file is damaged: move it away or pass "
                            "--fresh"))
    for cell, shown in (("fast\nstep", "fast\\nstep"), ("inf", "inf"), ("-Infinity", "-inf")):  # no finite number
        csv.write_text(cols + f'movielens,tiny,4,1000,512,0,0,1,none,0.6,0.6,"{cell}","{{}}"\n')
        refused(capsys, f"benchmarks/{script}", "--report_only", "--out_dir", tmp_path, untouched=[tmp_path],
                match=re.escape(f"{damaged} row 1: step_ms is not a finite number ('{shown}'); the file is damaged: "
                                "move it away or pass --fresh"))


def test_runs_of_other_code_are_not_resumed(tmp_path, capsys):
    """A results CSV is resumed only by the code that made its rows (the `code` column, the source digest):
    rows of other code, or rows that do not say, are refused in one line and the file is kept."""
    from neuroshard.core.artifacts import source_digest
    from neuroshard.core.errors import UserError
    from neuroshard.training.dct_results import runs_done

    csv = tmp_path / "dct_movielens_tiny.csv"
    settings = {"dataset": "movielens", "steps": 1000}
    head = "dataset,steps,seed,dct,test_auc,code\n"
    csv.write_text(head + f"movielens,1000,0,none,0.6,{source_digest()}\nmovielens,1000,0,both,0.6,{source_digest()}\n")
    assert runs_done(csv, False, settings, ("seed", "dct")) == {(0, "none"), (0, "both")}
    for text in (head + "movielens,1000,0,none,0.6,0123456789ab\n",      # made by other code
                 "dataset,steps,seed,dct,test_auc\nmovielens,1000,0,none,0.6\n"):  # made before rows said
        csv.write_text(text)
        with pytest.raises(UserError, match="holds runs made by other neuroshard code .*pass --fresh"):
            runs_done(csv, False, settings, ("seed", "dct"))
        assert csv.read_text() == text
    text = ("dataset,arch,ndevices,steps,batch_size,dense_opt,seed,dct,test_auc,code\n"
            "movielens,tiny,4,1000,512,sgd,0,none,0.6,0123456789ab\n")
    csv.write_text(text)  # the script says so in one line, before any training
    refused(capsys, "benchmarks/dct.py", "--out_dir", tmp_path, untouched=[tmp_path],
            match=re.escape(f"error: {csv} holds runs made by other neuroshard code (source digest 0123456789ab; this "
                            f"code is {source_digest()}); pass --fresh to start over, or --out_dir for a separate "
                            "folder"))


def test_the_source_digest_follows_the_code(tmp_path):
    """The digest is of the package's sources: a copy of them gives the same digest, one changed byte another."""
    import shutil

    import neuroshard
    from neuroshard.core.artifacts import source_digest

    pkg = tmp_path / "neuroshard"
    shutil.copytree(Path(neuroshard.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    digest = lambda: subprocess.run([sys.executable, "-c", "from neuroshard.core.artifacts import source_digest as d; "  # noqa: E731
                                     "print(d())"], capture_output=True, text=True, cwd=tmp_path).stdout.strip()
    assert digest() == source_digest()
    (pkg / "training" / "dct.py").write_text((pkg / "training" / "dct.py").read_text() + "\n# changed\n")
    assert digest() not in ("", source_digest())


@pytest.mark.parametrize("argv, line", [
    (["--ids_order", "sorted"], "--ids_order: unknown order 'sorted'; choose from shuffled, popular_first"),
    (["--ids_order", "popular_first\nx"], r"--ids_order: unknown order 'popular_first\\nx'; choose from shuffled, "
                                          "popular_first"),
    (["--set", "criteo"], "--set: unknown table set 'criteo'; choose from .*"),
    (["--ddr_mb", "nan"], "--ddr_mb must be a finite number > 0 and <= 1e\\+07, got nan"),
    (["--measure_first", "--swap_replicas"], "--measure_first measures the plan shard_tables --measure writes against "
                                             "TorchRec's alone; leave --swap_replicas and --without_row_wise_by_cost "
                                             "out with it"),
])
def test_all_types_step_refuses_bad_flags_before_any_work(capsys, tmp_path, argv, line):
    refused(capsys, "benchmarks/all_types_step.py", *argv, "--out", tmp_path / "r.md", untouched=[tmp_path],
            match=f"error: {line}")


def test_swapped_replicas_differ_from_each_plan_in_the_replicas_alone():
    """`all_types_step.py --swap_replicas`: NeuroShard's export spec gets TorchRec's replicated tables replicated (a
    whole shard on every rank), TorchRec's spec gets them table-wise on NeuroShard's rank; every other entry is left as
    it was; a replicated table NeuroShard split is one line."""
    from neuroshard.core.errors import UserError

    swapped_replicas = load_script("benchmarks/all_types_step.py").swapped_replicas
    ours = {"kind": "neuroshard.torchrec_plan", "world_size": 2, "tables": [
        {"name": "a", "rows": 10, "dim": 8, "sharding_type": "table_wise", "shards": [{"col_offset": 0, "width": 8, "rank": 1}]},
        {"name": "b", "rows": 50, "dim": 16, "sharding_type": "table_wise", "shards": [{"col_offset": 0, "width": 16, "rank": 0}]}]}
    theirs = {"torchrec": True, "tables": [
        {"name": "a", "rows": 10, "dim": 8, "sharding_type": "data_parallel", "compute_kernel": "dense", "ranks": [0, 1],
         "shards": []},
        {"name": "b", "rows": 50, "dim": 16, "sharding_type": "table_wise", "compute_kernel": "fused", "ranks": [1],
         "shards": [{"offsets": [0, 0], "sizes": [50, 16], "placement": "rank:1/cpu"}]}]}
    mine, their = swapped_replicas(ours, theirs)
    assert mine["tables"][0] == {**ours["tables"][0], "sharding_type": "data_parallel",
                                 "shards": [{"col_offset": 0, "width": 8, "rank": 0}, {"col_offset": 0, "width": 8, "rank": 1}]}
    assert their["tables"][0] == {"name": "a", "rows": 10, "dim": 8, "sharding_type": "table_wise",
                                  "compute_kernel": "fused", "ranks": [1],
                                  "shards": [{"offsets": [0, 0], "sizes": [10, 8], "placement": "rank:1/cpu"}]}
    assert (mine["tables"][1], their["tables"][1]) == (ours["tables"][1], theirs["tables"][1])
    assert ours["tables"][0]["sharding_type"] == "table_wise"  # the planners' own specs untouched
    ours["tables"][0].update(sharding_type="column_wise", shards=[{"col_offset": 0, "width": 4, "rank": 0},
                                                                  {"col_offset": 4, "width": 4, "rank": 1}])
    with pytest.raises(UserError, match="^--swap_replicas: NeuroShard does not hold every table TorchRec replicates "
                                        "whole; leave --swap_replicas out for these tables$"):
        swapped_replicas(ours, theirs)
