"""Every numeric argument of every step is range-checked before any file is touched: one clear
`error:` line naming the argument, exit 2, and nothing written. In-process (conftest.refused): each script's
main as `python SCRIPT ARGV` runs it."""
import re

import numpy as np
import pytest

from neuroshard.data.tasks import save_tasks

from conftest import refused

CASES = {
    "collect_compute_cost_data.py": [
        ("--data_size", "0", "--data_size must be >= 1 and <= 1e+07, got 0"),
        ("--workers", "0", "--workers must be >= 1 and <= 1024, got 0"),
        ("--max_tables", "0", "--max_tables must be >= 1 and <= 1000, got 0"),
        ("--max_mem", "-1", "--max_mem must be a finite number > 0 and <= 1e+06, got -1"),
        ("--max_mem", "nan", "--max_mem must be a finite number > 0 and <= 1e+06, got nan"),
        ("--max_mem", "1e308", "--max_mem must be a finite number > 0 and <= 1e+06, got 1e+308"),
        ("--num_iter", "0", "--num_iter must be >= 1 and <= 100000, got 0"),
        ("--warmup_iter", "-1", "--warmup_iter must be >= 0 and <= 100000, got -1"),
        ("--max_dim", "7", "--max_dim must be one of 4, 8, 16, 32, 64, 128, got 7"),
        ("--batch_size", "0", "--batch_size must be >= 1 and <= 256, got 0"),
        ("--batch_size", "100000", "--batch_size must be >= 1 and <= 256, got 100000"),
        ("--seed", "-1", "--seed must be >= 0, got -1"),
    ],
    "collect_comm_cost_data.py": [
        ("--ndevices", "1", "--ndevices must be >= 2 and <= 1024, got 1"),
        ("--data_size", "0", "--data_size must be >= 1 and <= 1e+07, got 0"),
        ("--sleep_range", "5,1", "--sleep_range must satisfy 0 <= lo <= hi, got 5.0,1.0"),
        ("--sleep_range", "-1,2", "argument --sleep_range: expected one argument; write a value that starts with '-' "
                                  "as --flag=VALUE (e.g. --sleep_range=-5,2) (see collect_comm_cost_data.py --help)"),
        ("--batch_size", "1001", "--batch_size 1001 is not divisible by 4 ranks; use a multiple of 4"),
        ("--num_iter", "0", "--num_iter must be >= 1 and <= 100000, got 0"),
        ("--T_range", "9,3", "--T_range must satisfy 1 <= lo < hi, got 9,3"),
        ("--max_dim", "0", "--max_dim must be >= 4 and <= 128, got 0"),
        ("--mp_keep", "0", "--mp_keep must be a finite number > 0 and <= 1, got 0"),
    ],
    "train_compute_cost_model.py": [
        ("--epochs", "0", "--epochs must be >= 1 and <= 1e+06, got 0"),
        ("--lr", "0", "--lr must be a finite number > 0 and <= 10, got 0"),
        ("--train_ratio", "1.2", "--train_ratio must be a finite number > 0 and < 1, got 1.2"),
        ("--batch_size", "0", "--batch_size must be >= 1 and <= 1.67772e+07, got 0"),
        ("--num_samples", "3", "--num_samples must be >= 10, got 3"),
        ("--valid_ratio", "0.5", "--train_ratio + --valid_ratio must be < 1 (the rest is the test split)"),
        ("--input_transform", "sqrt", "unknown compute-model input transform 'sqrt' (--input_transform takes raw, "
                                      "log)"),
    ],
    "train_comm_cost_model.py": [
        ("--ndevices", "1", "--ndevices must be >= 2 and <= 4096, got 1"),
        ("--epochs", "-2", "--epochs must be >= 1 and <= 1e+06, got -2"),
        ("--lr", "inf", "--lr must be a finite number > 0 and <= 10, got inf"),
        ("--mp_keep", "nan", "--mp_keep must be a finite number > 0 and <= 1, got nan"),
    ],
    "eval_simulator.py": [
        ("--ndevices", "0", "--ndevices must be >= 2, got 0: the simulator's communication cost models exist for 2 or "
                            "more devices (train_comm_cost_model.py --ndevices N, N >= 2)"),
        ("--max_mem", "0", "--max_mem must be a finite number > 0 and <= 1e+06, got 0"),
        ("--max_mem", "1e308", "--max_mem must be a finite number > 0 and <= 1e+06, got 1e+308"),
        ("--beam_width", "0", "--beam_width must be >= 1 and <= 100, got 0"),
        ("--grid_steps", "0", "--grid_steps must be >= 1 and <= 1000, got 0"),
        ("--max_splits", "-1", "--max_splits must be >= 0 and <= 1000, got -1"),
        ("--threshold_range", "0.5,1", "--threshold_range must start at >= 1.0 (a dim-sum cap below the mean cannot "
                                       "place every table), got 0.5,1"),
        ("--num_candidates", "0", "--num_candidates must be >= 1 and <= 1000, got 0"),
        ("--risk_lambda", "-1", "--risk_lambda must be a finite number >= 0 and <= 10, got -1"),
        ("--risk_lambda", "nan", "--risk_lambda must be a finite number >= 0 and <= 10, got nan"),
        ("--seed", "-1", "--seed must be >= 0, got -1"),
        ("--alg", "a,,b", "--alg has an empty entry: 'a,,b'"),
        ("--alg", "nope", "unknown --alg 'nope'; choose one of random, dim_greedy, size_greedy, lookup_greedy, "
                          "size_lookup_greedy, neuroshard, neuroshard_risk, torchrec, all, or plan:FILE"),
        ("--alg", "plan:", "unknown --alg 'plan:'; choose one of random, dim_greedy, size_greedy, lookup_greedy, "
                           "size_lookup_greedy, neuroshard, neuroshard_risk, torchrec, all, or plan:FILE"),
        ("--threshold_range", "1,inf", "--threshold_range must be finite numbers with 0 <= lo <= hi, got 1.0,inf "
                                       "(not finite)"),
        ("--mp_keep", "-1", "--mp_keep must be a finite number > 0 and <= 1, got -1"),
    ],
    "tools/train_dlrm.py": [
        ("--steps", "0", "--steps must be >= 1 and <= 1e+07, got 0"),
        ("--batch_size", "130", "--batch_size 130 is not divisible by 4 ranks"),
        ("--dp_keep", "0", "--dp_keep sets DCT-DP, which --dct none does not run; pass --dct dp (or both), or drop "
                           "--dp_keep"),  # its range: test_benchmark_args (dct.py)
        ("--mp_keep", "2", "--mp_keep sets DCT-MP, which --dct none does not run; pass --dct mp (or both), or drop "
                           "--mp_keep"),
        ("--dp_refresh", "0", "--dp_refresh must be >= 1 and <= 1e+07, got 0"),
        ("--ndevices", "1", "--ndevices must be >= 2 and <= 64, got 1"),
        ("--emb_dim", "6", "--emb_dim must be a multiple of 4, got 6"),
        ("--mp_scope", "all", "--mp_scope must be one of rank, table, sign, sign2, got 'all'"),
        ("--dp_adam_freeze_after", "-1", "--dp_adam_freeze_after must be >= 0 and <= 1000, got -1"),
        ("--dp_adam_floor", "0", "--dp_adam_floor must be a finite number > 0 and <= 1, got 0"),
    ],
    "tools/shard_tables.py": [
        ("--ndevices", "0", "--ndevices must be >= 1 and <= 4096, got 0"),
        ("--max_mem", "-1", "--max_mem must be a finite number > 0 and <= 1e+06, got -1"),
        ("--max_mem", "1e308", "--max_mem must be a finite number > 0 and <= 1e+06, got 1e+308"),
        ("--beam_width", "0", "--beam_width must be >= 1 and <= 100, got 0"),
        ("--alg", "all", "--alg takes one algorithm here, got 'all'"),
        ("--gpu_devices", "0,0", "--gpu_devices must list distinct GPU ids >= 0, got (0, 0)"),
        ("--mp_keep", "0", "--mp_keep must be a finite number > 0 and <= 1, got 0"),
        ("--min_gain", "1", "--min_gain must be a finite number >= 0 and < 1, got 1"),
        ("--min_gain", "-0.1", "--min_gain must be a finite number >= 0 and < 1, got -0.1"),
        ("--calibrate_dmp", "20", "--calibrate_dmp fits the step cost of calibrated models: pass --calibrate too, "
                                  "e.g. --calibrate --calibrate_dmp"),
        ("--calibrate_dmp", "x", "argument --calibrate_dmp: invalid int value: 'x' (see shard_tables.py --help)"),
        ("--min_gain", "0.1", "--min_gain applies to --alg neuroshard (the plan it hands out against TorchRec's); "
                              "with --alg dim_greedy drop it"),
        ("--min_gain", "0.05", "--min_gain applies to --alg neuroshard (the plan it hands out against TorchRec's); "
                               "with --alg dim_greedy drop it"),
        ("--measure_engine", "torchrec", "--measure_engine torchrec chooses how --measure measures; add --measure or "
                                         "drop --measure_engine"),
        ("--out", "", "--out is empty; name the file to write, e.g. --out plan.json"),
        ("--out", "somewhere/", "--out somewhere/ ends in '/', which names a folder; name the file to write, e.g. "
                                "--out somewhere/plan.json"),
        ("--torchrec_plan", "", "--torchrec_plan is empty; name the file to write, e.g. --torchrec_plan plan.json"),
    ],
    "eval.py": [
        ("--num_iter", "0", "--num_iter must be >= 1 and <= 100000, got 0"),
        ("--warmup_iter", "-1", "--warmup_iter must be >= 0 and <= 100000, got -1"),
        ("--batch_size", "0", "--batch_size must be >= 1 and <= 256, got 0"),
        ("--ndevices", "1", "--ndevices must be >= 2 (an all-to-all needs peers)"),
        ("--max_mem", "-3", "--max_mem must be a finite number > 0 and <= 1e+06, got -3"),
        ("--gpu_devices", "a,b", "--gpu_devices must be comma-separated integers such as 0,1,2,3, got 'a,b'"),
        ("--mp_keep", "1.5", "--mp_keep must be a finite number > 0 and <= 1, got 1.5"),
        ("--plan_ratios", "", "--plan_ratios is empty; name a file, or leave the flag out for its default"),
        ("--plan_ratios_out", " ", "--plan_ratios_out is empty; name a file, or leave the flag out for its default"),
        ("--ratio_tasks", "", "--ratio_tasks is empty; name a file, or leave the flag out for its default"),
        ("--plan_ratios", "r.json", "--plan_ratios needs the cost models the plans are rated with (models/compute.pt, "
                                     "models/comm_4_fw.pt, models/comm_4_bw.pt); train them first (make reproduce "
                                     "does), or leave the flag out"),
        ("--plan_ratios_out", "r.json", "--plan_ratios_out needs the cost models the plans are rated with (models/compute.pt, "
                                     "models/comm_4_fw.pt, models/comm_4_bw.pt); train them first (make reproduce "
                                     "does), or leave the flag out"),
    ],
}


def _base(script, ds, tmp_path):
    out = tmp_path / "out"
    if script.startswith("collect_compute"):
        return ["--dataset_dir", ds.path, "--out_dir", out]
    if script.startswith("collect_comm"):
        return ["--out_dir", out, "--batch_size", "512"]
    if script.startswith("train_compute"):
        return ["--data_dir", out, "--dataset_dir", ds.path, "--out_path", out / "m.pt"]
    if script == "tools/train_dlrm.py":
        return ["--results_csv", out / "dct.csv"]
    if script == "tools/shard_tables.py":
        (tmp_path / "t.csv").write_text("name,rows,dim,pooling_factor\nx,10,8,1\n")
        return ["--tables", tmp_path / "t.csv", "--out", out / "plan.json", "--alg", "dim_greedy"]
    if script.startswith("train_comm"):
        return ["--data_dir", out, "--fw_out_path", out / "fw.pt", "--bw_out_path", out / "bw.pt"]
    save_tasks(tmp_path / "t.pkl", [{"table_ids": np.arange(6), "dims": np.full(6, 8)}], ds)
    return ["--data_dir", ds.path, "--task_path", tmp_path / "t.pkl", "--results_csv", out / "r.csv",
            "--alg", "dim_greedy"]


@pytest.mark.parametrize("script,arg,value,line", [(s, *case) for s, cases in CASES.items() for case in cases])
def test_bad_number_is_refused_before_any_file(small_dataset, tmp_path, capsys, script, arg, value, line):
    base = _base(script, small_dataset, tmp_path)
    refused(capsys, script, *base, arg, value, match=re.escape(f"error: {line}"), untouched=[tmp_path])


@pytest.mark.parametrize("script,flag,fix", [
    ("tools/shard_tables.py", "--out", "choose another --out"),
    ("tools/shard_tables.py", "--torchrec_plan", "choose another --torchrec_plan"),
    ("tools/train_dlrm.py", "--results_csv", "name a file to write"),
    ("eval_simulator.py", "--results_csv", "name a file to write"),
    ("eval.py", "--results_csv", "name a file to write"),
    ("eval.py", "--plan_ratios_out", "name a file to write")])
def test_output_path_that_is_a_folder_is_refused_first(small_dataset, tmp_path, capsys, script, flag, fix):
    base = [str(a) for a in _base(script, small_dataset, tmp_path)]
    folder = tmp_path / "a_folder"
    folder.mkdir()
    if flag in base:
        base = base[:base.index(flag)] + base[base.index(flag) + 2:]
    refused(capsys, script, *base, flag, folder, match=re.escape(f"error: {flag} {folder} is a folder; {fix}"),
            untouched=[tmp_path])


def test_mp_keep_without_dct_mp_is_refused(tmp_path, capsys):
    """--mp_keep sets DCT-MP; with a --dct mode that does not run it, it would be ignored and still recorded."""
    refused(capsys, "tools/train_dlrm.py", "--results_csv", tmp_path / "out" / "dct.csv", "--dct", "dp",
            "--mp_keep", "0.3", match=re.escape("error: --mp_keep sets DCT-MP, which --dct dp does not run; pass --dct "
                                                "mp (or both), or drop --mp_keep"), untouched=[tmp_path])


def test_plan_ratios_out_naming_the_results_file_is_refused(small_dataset, tmp_path, capsys):
    base = [str(a) for a in _base("eval.py", small_dataset, tmp_path)]
    results = base[base.index("--results_csv") + 1]
    refused(capsys, "eval.py", *base, "--plan_ratios_out", results,
            match=re.escape(f"error: --results_csv and --plan_ratios_out both name {results}; one would "
                            "replace the other: give each its own file"), untouched=[tmp_path])
    log = results + ".progress.pkl"
    refused(capsys, "eval.py", *base, "--plan_ratios_out", log,
            match=re.escape(f"error: the results' progress log and --plan_ratios_out both name {log}; one would "
                            "replace the other: give each its own file"), untouched=[tmp_path])
    tasks = base[base.index("--task_path") + 1]
    refused(capsys, "eval.py", *base, "--plan_ratios_out", tasks,
            match=re.escape(f"error: --plan_ratios_out {tasks} is also the input --task_path; writing it would "
                            "replace what this run reads: ") + ".*", untouched=[tmp_path])
    (tmp_path / "r.json").write_text("{}")
    refused(capsys, "eval.py", *base, "--plan_ratios", tmp_path / "r.json", "--plan_ratios_out", tmp_path / "r.json",
            match=re.escape(f"error: --plan_ratios_out {tmp_path / 'r.json'} is also the input --plan_ratios; ")
            + ".*", untouched=[tmp_path])


def test_plan_ratios_out_that_cannot_be_written_is_refused_before_measuring(small_dataset, tmp_path, capsys):
    base = [str(a) for a in _base("eval.py", small_dataset, tmp_path)]
    (tmp_path / "a_file").write_text("x")
    target = tmp_path / "a_file" / "r.json"
    refused(capsys, "eval.py", *base, "--plan_ratios_out", target,
            match=re.escape(f"error: --plan_ratios_out {target}: {tmp_path / 'a_file'} is a file, not a folder; ")
            + ".*", untouched=[tmp_path])


def test_ratio_tasks_that_cannot_state_these_plans_are_refused(small_dataset, tmp_path, capsys):
    """--ratio_tasks: beside --plan_ratios, naming the tasks under test, with no search in --alg, or naming a file
    the run writes: one line each, before anything is measured or written."""
    base = [str(a) for a in _base("eval.py", small_dataset, tmp_path)]
    tasks = base[base.index("--task_path") + 1]
    save_tasks(tmp_path / "train.pkl", [{"table_ids": np.arange(6), "dims": np.full(6, 16)}], small_dataset)
    (tmp_path / "r.json").write_text("{}")
    refused(capsys, "eval.py", *base, "--ratio_tasks", tmp_path / "train.pkl", "--plan_ratios", tmp_path / "r.json",
            match=re.escape("error: --ratio_tasks and --plan_ratios both say where the stated costs' ratios come "
                            "from; give one of them"), untouched=[tmp_path])
    refused(capsys, "eval.py", *base, "--ratio_tasks", tasks,
            match=re.escape(f"error: --ratio_tasks names the --task_path file ({tasks}): the ratios would be fitted "
                            "on the plans they state; name other tasks (the pipeline's training tasks)"), untouched=[tmp_path])
    refused(capsys, "eval.py", *base, "--ratio_tasks", tmp_path / "train.pkl",
            match=re.escape("error: --ratio_tasks states the searches' plans (neuroshard, neuroshard_risk), and --alg "
                            "names none of them; add one to --alg, or leave out --ratio_tasks"), untouched=[tmp_path])
    refused(capsys, "eval.py", *base[:-1], "neuroshard", "--ratio_tasks", tmp_path / "r.json",
            match=re.escape(f"error: --ratio_tasks: {tmp_path / 'r.json'} is not a readable task file") + ".*",
            untouched=[tmp_path])
    import shutil

    shutil.copy(tasks, tmp_path / "copy.pkl")  # the same tasks under another name: a copy (or a hard link)
    refused(capsys, "eval.py", *base[:-1], "neuroshard", "--ratio_tasks", tmp_path / "copy.pkl",
            match=re.escape(f"error: --ratio_tasks holds the very tasks of --task_path ({tasks}): the ratios would "
                            "be fitted on the plans they state; ") + ".*", untouched=[tmp_path])
    refused(capsys, "eval.py", *base[:-1], "neuroshard", "--ratio_tasks", str(tmp_path / "train.pkl") + "\n",
            match=re.escape("error: --ratio_tasks ") + ".*" + re.escape(": the path holds a control character"
                                                                        " (a newline, a tab, ...); ") + ".*",
            untouched=[tmp_path])
    results = base[base.index("--results_csv") + 1]
    refused(capsys, "eval.py", *base[:-1], "neuroshard", "--ratio_tasks", tmp_path / "train.pkl",
            "--plan_ratios_out", results[:-len(".csv")] + "_ratio_tasks.csv",
            match=re.escape("error: --plan_ratios_out and the --ratio_tasks results both name ") + ".*", untouched=[tmp_path])


@pytest.mark.parametrize("script", ["eval.py", "eval_simulator.py"])
def test_task_path_with_a_control_character_is_refused(small_dataset, tmp_path, capsys, script):
    base = [str(a) for a in _base("eval.py", small_dataset, tmp_path)]
    i = base.index("--task_path") + 1
    base[i] += "\t"
    refused(capsys, script, *base, match=re.escape("error: --task_path ") + ".*" + re.escape(
        ": the path holds a control character (a newline, a tab, ...); rename the file to printable characters"),
        untouched=[tmp_path])
