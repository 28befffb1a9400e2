"""benchmarks/winners_curse.py (issue 63's diagnosis): bad flags are one line before any work; on the tiny
pipeline's run, each test task gets NeuroShard's plan, distinct neighbours of it within memory and the greedy
control, all measured on 2 gloo ranks, and the report pairs them over tasks."""
import csv
import re

import numpy as np
import pytest

from neuroshard.core.costs import Cluster
from neuroshard.core.file_names import DATASET_DIR, MODELS_DIR, TASKS_DIR, tasks_path
from neuroshard.data.dataset import DLRMDataset
from neuroshard.data.tasks import load_tasks
from neuroshard.sharding.plan import fits_memory
from neuroshard.sharding.registry import make_sharder, shard_task
from neuroshard.sharding.search import SearchParams
from neuroshard.sharding.simulator import Simulator

from conftest import TINY, load_script, refused, run_in_process

wc = load_script("benchmarks/winners_curse.py")


@pytest.mark.parametrize("args,line", [
    (["--rounds", "1"], "--rounds must be >= 2 and <= 1000, got 1"),
    (["--neighbours", "0"], "--neighbours must be >= 1 and <= 100, got 0"),
    (["--max_mem", "inf"], "--max_mem must be .*, got inf"),
    (["--ndevices", "1"], "--ndevices must be >= 2 and <= 64, got 1"),
])
def test_bad_flags_are_one_line_before_any_work(capsys, tmp_path, args, line):
    refused(capsys, wc, "--work_dir", tmp_path, *args, "--out_csv", tmp_path / "o.csv", match=f"error: {line}",
            untouched=[tmp_path])


def test_an_out_csv_that_is_a_folder_is_refused_first(capsys, tmp_path):
    refused(capsys, wc, "--work_dir", tmp_path, "--out_csv", tmp_path, match=re.escape(
        f"error: --out_csv {tmp_path} is a folder; name a file to write"), untouched=[tmp_path])


def test_neighbours_are_distinct_moves_of_the_plan_within_memory(tiny_pipeline):
    ds = DLRMDataset.load(tiny_pipeline.work / DATASET_DIR)
    task = load_tasks(tasks_path(tiny_pipeline.work / TASKS_DIR, "test"), ds)[0]
    sim = Simulator.from_files(tiny_pipeline.work / MODELS_DIR, 2)
    cluster = Cluster(2, TINY.max_mem)
    plan = shard_task(make_sharder("neuroshard", 0, sim, SearchParams(), ds.batch_size), task, cluster).plan
    near = wc.neighbours(plan, task, cluster, 3, 1, np.random.default_rng(0))
    assert near and len({tuple(p.device_of) for p in near}) == len(near)
    for p in near:
        assert p.shards == plan.shards and fits_memory(task, p, cluster)
        assert sum(a != b for a, b in zip(p.device_of, plan.device_of)) == 1  # one shard moved


def test_a_run_measures_every_kind_of_plan_and_pairs_them(tiny_pipeline, capsys, tmp_path):
    out = tmp_path / "wc.csv"
    code, stdout, err = run_in_process(capsys, wc, "--work_dir", tiny_pipeline.work, "--ndevices", 2, "--max_mem",
                                       TINY.max_mem, "--rounds", 2, "--neighbours", 2, "--num_iter", 2,
                                       "--warmup_iter", 0, "--out_csv", out)
    assert code == 0, err
    rows = list(csv.DictReader(out.open()))
    # the tiny run's models may extrapolate below 0 for some plans: those are left out, with a note, never written
    assert rows or "plans left out" in stdout, stdout
    by_task = {}
    for r in rows:
        by_task.setdefault(r["task"], set()).add(r["plan"])
        assert float(r["measured_ms"]) > 0 and float(r["simulated_ms"]) > 0
        assert np.isclose(float(r["sim_over_meas"]), float(r["simulated_ms"]) / float(r["measured_ms"]))
    assert all("selected" in kinds for kinds in by_task.values())  # a task is measured only with its selected plan
    paired = [t for t, kinds in by_task.items() if "neighbour0" in kinds]
    if len(paired) >= 2:
        assert re.search(r"selected / neighbours .*paired over \d+ tasks\): \d\.\d{3} \[", stdout), stdout
    else:
        assert "too few to pair" in stdout, stdout
