"""Every numeric argument of every step is range-checked before any file is touched: one clear
`error:` line naming the argument, a non-zero exit, and nothing written."""
import numpy as np
import pytest

from neuroshard.data.tasks import save_tasks

from conftest import assert_clean_error, files_under, run_script

CASES = {
    "collect_compute_cost_data.py": [
        ("--data_size", "0"), ("--workers", "0"), ("--max_tables", "0"), ("--max_mem", "-1"), ("--max_mem", "nan"),
        ("--max_mem", "1e308"),
        ("--num_iter", "0"), ("--warmup_iter", "-1"), ("--max_dim", "7"), ("--batch_size", "0"),
        ("--batch_size", "100000"), ("--seed", "-1")],
    "collect_comm_cost_data.py": [
        ("--ndevices", "1"), ("--data_size", "0"), ("--sleep_range", "5,1"), ("--sleep_range", "-1,2"),
        ("--batch_size", "1001"), ("--num_iter", "0"), ("--T_range", "9,3"), ("--max_dim", "0"), ("--mp_keep", "0")],
    "train_compute_cost_model.py": [
        ("--epochs", "0"), ("--lr", "0"), ("--train_ratio", "1.2"), ("--batch_size", "0"), ("--num_samples", "3"),
        ("--valid_ratio", "0.5"), ("--input_transform", "sqrt")],
    "train_comm_cost_model.py": [("--ndevices", "1"), ("--epochs", "-2"), ("--lr", "inf"), ("--mp_keep", "nan")],
    "eval_simulator.py": [
        ("--ndevices", "0"), ("--max_mem", "0"), ("--max_mem", "1e308"), ("--beam_width", "0"), ("--grid_steps", "0"), ("--max_splits", "-1"),
        ("--threshold_range", "0.5,1"), ("--num_candidates", "0"), ("--seed", "-1"), ("--alg", "a,,b"),
        ("--alg", "nope"), ("--alg", "plan:"), ("--threshold_range", "1,inf"), ("--mp_keep", "-1")],
    "tools/train_dlrm.py": [("--steps", "0"), ("--batch_size", "130"), ("--dp_keep", "0"), ("--mp_keep", "2"),
                            ("--dp_refresh", "0"), ("--ndevices", "1"), ("--emb_dim", "6"), ("--mp_scope", "all"),
                            ("--dp_adam_freeze_after", "-1"), ("--dp_adam_floor", "0")],
    "tools/shard_tables.py": [("--ndevices", "0"), ("--max_mem", "-1"), ("--max_mem", "1e308"), ("--beam_width", "0"), ("--alg", "all"),
                              ("--gpu_devices", "0,0"), ("--mp_keep", "0"), ("--min_gain", "1"), ("--min_gain", "-0.1"),
                              ("--calibrate_dmp", "20"), ("--calibrate_dmp", "x"), ("--min_gain", "0.1"),
                              ("--min_gain", "0.05"),
                              ("--measure_engine", "torchrec"), ("--out", ""), ("--out", "somewhere/"),
                              ("--torchrec_plan", "")],
    "eval.py": [("--num_iter", "0"), ("--warmup_iter", "-1"), ("--batch_size", "0"), ("--ndevices", "1"),
                ("--max_mem", "-3"), ("--gpu_devices", "a,b"), ("--mp_keep", "1.5")],
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


@pytest.mark.parametrize("script,arg,value", [(s, a, v) for s, cases in CASES.items() for a, v in cases])
def test_bad_number_is_refused_before_any_file(small_dataset, tmp_path, script, arg, value):
    proc = run_script(script, *_base(script, small_dataset, tmp_path), arg, value)
    assert_clean_error(proc, arg.split("=")[0] if arg != "--batch_size" or script != "collect_comm_cost_data.py"
                       else "--batch_size")
    assert files_under(tmp_path / "out") == []


@pytest.mark.parametrize("script,flag", [("tools/shard_tables.py", "--out"), ("tools/shard_tables.py", "--torchrec_plan"),
                                         ("tools/train_dlrm.py", "--results_csv"), ("eval_simulator.py", "--results_csv"),
                                         ("eval.py", "--results_csv")])
def test_output_path_that_is_a_folder_is_refused_first(small_dataset, tmp_path, script, flag):
    base = [str(a) for a in _base(script, small_dataset, tmp_path)]
    folder = tmp_path / "a_folder"
    folder.mkdir()
    if flag in base:
        base = base[:base.index(flag)] + base[base.index(flag) + 2:]
    proc = run_script(script, *base, flag, folder)
    assert_clean_error(proc, flag, "is a folder")
    assert files_under(tmp_path / "out") == [] and list(folder.iterdir()) == []


def test_mp_keep_without_dct_mp_is_refused(tmp_path):
    """--mp_keep sets DCT-MP; with a --dct mode that does not run it, it would be ignored and still recorded."""
    proc = run_script("tools/train_dlrm.py", "--results_csv", tmp_path / "out" / "dct.csv", "--dct", "dp",
                      "--mp_keep", "0.3")
    assert_clean_error(proc, "--mp_keep sets DCT-MP, which --dct dp does not run; pass --dct mp (or both)")
    assert files_under(tmp_path / "out") == []
